"""Rules as text: parsing, matching a situation, and checking a rule against its trajectory."""

from __future__ import annotations

from forge.learn import rules

ACTIONS = ("left", "down", "right", "up")
HERE = "You are at row 2, col 0, on a frozen tile"


def test_parse_finds_situation_forbidden_and_advised_actions():
    p = rules.parse("when you are at row 2, col 0, on a frozen tile, do not down; right was safe there", ACTIONS)
    assert p == rules.ParsedRule(when="you are at row 2, col 0, on a frozen tile", avoid=("down",), prefer=("right",))
    assert rules.parse("If lost, never go left, move up", ACTIONS) == rules.ParsedRule("lost", ("left",), ("up",))
    assert rules.parse("always go right", ACTIONS) is None


def test_applies_to_the_same_situation_only():
    p = rules.parse(rules.write(HERE, "down", ["right"]), ACTIONS)
    assert rules.applies(p, HERE + ".")
    assert not rules.applies(p, "You are at row 2, col 1, on a frozen tile")


def test_write_says_what_to_avoid_and_what_was_safe():
    assert rules.write(HERE, "down", ["right", "up"]) == "when you are at row 2, col 0, on a frozen tile, do not down; right, up were safe there"


def test_check_repairs_a_rule_that_recommends_the_failed_action():
    kept, why = rules.check("when You are at row 2, col 0, on a frozen tile, then down (reward -1)", valid_actions=ACTIONS,
                            situations=[HERE], failing_situation=HERE, failing_action="down", safe_actions=("right",))
    assert kept == rules.write(HERE, "down", ["right"]) and "recommends the action that failed" in why


def test_check_repairs_advice_of_an_action_the_replay_showed_unsafe():
    kept, why = rules.check(f"when {HERE}, then go left", valid_actions=ACTIONS, situations=[HERE],
                            failing_situation=HERE, failing_action="down", safe_actions=("right",))
    assert kept == rules.write(HERE, "down", ["right"]) and "not safe" in why


def test_check_rejects_situations_the_agent_never_met():
    kept, why = rules.check("when near a hole, then go right", valid_actions=ACTIONS, situations=[HERE],
                            failing_situation=HERE, failing_action="down")
    assert kept is None and "no situation the agent met" in why


def test_check_keeps_good_rules_unchanged():
    good = f"when {HERE.lower()}, do not down; go right"
    assert rules.check(good, valid_actions=ACTIONS, situations=[HERE], failing_situation=HERE,
                       failing_action="down", safe_actions=("right",)) == (good, "")
    elsewhere = "when you are at row 0, col 0, on a start tile, then go down"
    assert rules.check(elsewhere, valid_actions=ACTIONS, situations=[HERE, "You are at row 0, col 0, on a start tile"],
                       failing_situation=HERE, failing_action="down") == (elsewhere, "")


def test_multi_word_actions_are_read_whole() -> None:
    """Hanoi's "A to C" (and CAGE-2's "Restore User1"): a negation once caught only the first
    word, so the rule guard and "Failed here before" never saw what a rule forbade."""
    acts = ["A to B", "A to C", "B to A", "B to C", "C to A", "C to B"]
    rule = "when towers A: 3, B: 1, C: 2, do not A to B; B to A, B to C, C to A were safe there"
    parsed = rules.parse(rule, acts)
    assert parsed == rules.ParsedRule(when="towers A: 3, B: 1, C: 2", avoid=("A to B",), prefer=("B to A", "B to C", "C to A"))
    assert rules.forbidden_in([rule], "towers A: 3, B: 1, C: 2", acts) == {"A to B"}
    assert rules.forbidden_in([rule], "towers A: 3 2, B: 1, C: empty", acts) == set()
    longer = rules.parse("when hosts are hot, never Restore User1; Analyse User1 was safe there",
                   ["Restore User1", "Restore User10", "Analyse User1"])
    assert longer is not None and longer.avoid == ("Restore User1",)


def test_an_action_that_starts_with_a_verb_is_forbidden_not_advised() -> None:
    """TextWorld's commands start with the verbs a negation may carry ("do not go north"). The
    parser took "go" for the negation's verb, found no action "north", and read the rule as
    advising "go north": every TextWorld movement rule meant its opposite to the prompt, the
    rule guard and the followed count."""
    acts = ["go north", "go south", "go east", "take coin", "look"]
    rule = "when go north: the way back, do not go north; go south, go east were safe there"
    assert rules.parse(rule, acts) == rules.ParsedRule(when="go north: the way back", avoid=("go north",), prefer=("go south", "go east"))
    assert rules.parse("when in a room with a coin, never take coin", acts).avoid == ("take coin",)
    # the negation's own verb is still read past when the action is the word after it
    assert rules.parse("when lost, do not move left; up was safe there", ACTIONS) == rules.ParsedRule("lost", ("left",), ("up",))
    assert rules.forbidden_in([rule], "in a room; exits north, east; go north: the way back", acts) == {"go north"}


def test_a_rule_that_forbids_the_goals_way_is_refused() -> None:
    """coin-2 with the goal's way named: a stall was blamed on a step along the route and the
    reflection wrote "when go north: the goal's way; go south: the way back, do not go north;
    go south was safe there", a rule that sent every later game back the way it came."""
    acts = ["go north", "go south", "go east"]
    here = "in a room; exits north, south; go north: the goal's way; go south: the way back; goal: take a coin"
    bad = "when go north: the goal's way; go south: the way back, do not go north; go south was safe there"
    common = dict(valid_actions=acts, situations=[here], failing_situation=here, safe_actions=["go south"])
    kept, why = rules.check(bad, failing_action="go north", **common)
    assert kept is None and "forbids what the goal names next (go north)" in why
    # the same, after a detour: the goal's way is the way back, and is not to be forbidden either
    back = "in a room; exits south; go south: the goal's way, back; goal: take a coin"
    kept, why = rules.check("when go south: the goal's way, back, do not go south", valid_actions=acts,
                            situations=[back], failing_situation=back, failing_action="go south")
    assert kept is None and "goal" in why
    # forbidding the detour where the goal's way is named is a rule worth keeping
    good = "when go north: the goal's way; go south: the way back, do not go south; go north was safe there"
    kept, why = rules.check(good, failing_action="go south", valid_actions=acts, situations=[here],
                            failing_situation=here, safe_actions=["go north"])
    assert kept == good and why == ""


def test_a_rule_that_forbids_taking_the_goals_object_is_refused() -> None:
    """The TextWorld team stream: with moves in its memory the team walked out of the room
    holding the goal's object. The env keys the take as the goal's object, and no rule may
    forbid it there; elsewhere a rule against a take stands (a wrong object loses the game)."""
    acts = ["go south", "take a key", "take coin"]
    here = "in a room with a key; exits south; take a key: the goal's object; go south: the way back; goal: take a key"
    kept, why = rules.check("when take a key: the goal's object, do not take a key; go south was safe there",
                            valid_actions=acts, situations=[here], failing_situation=here,
                            failing_action="take a key", safe_actions=["go south"])
    assert kept is None and "forbids what the goal names next (take a key)" in why
    other = "in a room with a key; exits south, west; go south: the way back; goal: take a key"
    kept, why = rules.check(f"when {other}, do not take a key; go south was safe there", valid_actions=acts,
                            situations=[other], failing_situation=other, failing_action="take a key", safe_actions=["go south"])
    assert kept is not None and "take a key" in rules.parse(kept, acts).avoid


def test_a_narrowed_rule_drops_the_safe_moves_its_when_does_not_name() -> None:
    """coin-2: "go south" was a plain exit of one room (no clause of its own), yet the rule
    narrowed to the way-back clause advised it, and the prompt offered only "go south"
    wherever the way back was north, also where the goal's way was west."""
    acts = ["go north", "go south", "go west"]
    here = "in a room; exits north, south, west; go west: the goal's way; go north: the way back"
    common = dict(valid_actions=acts, situations=[here], failing_situation=here, failing_action="go north")
    kept, why = rules.check("when go north: the way back, do not go north; go south was safe there", **common)
    assert kept == "when go north: the way back, do not go north" and "drops the safe moves" in why
    # a safe move the narrowed "when" names stays: its clause says why it was safe
    both = "when go north: the way back; go west: the goal's way, do not go north; go west, go south were safe there"
    kept, _ = rules.check(both, **common)
    assert kept == "when go north: the way back; go west: the goal's way, do not go north; go west was safe there"
    # a "when" keyed by what is not a move (CAGE-2's host states) keeps its safe moves
    hosts = "activity: exploit; compromised: a user host"
    rule = f"when {hosts}, do not sleep; monitor was safe there"
    assert rules.check(rule, valid_actions=["sleep", "monitor"], situations=[hosts], failing_situation="elsewhere",
                       failing_action="sleep") == (rule, "")
