"""Rules that can transfer: short ranked safe lists, a "when" focused on what recurs, names
made general or refused, contradictions resolved, and rules that keep failing retired."""

from __future__ import annotations

import json
import re

import pytest

from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.envs.base import EnvSpec, StepResult, check_action
from forge.learn import rules
from forge.learn.loop import RETIRE_AFTER, Trajectory, learn_from, retire_failing
from forge.learn.reflect import (
    Reflection,
    RuleEdit,
    apply_reflection,
    probe_alternatives,
    safe_alternatives,
)
from forge.llm.testing import ScriptedLLM
from forge.model import Kind, Status, Step, Unit, Viewer

ADMIN = Viewer.admin()
GRID = ["left", "down", "right", "up"]
HOSTS = re.compile(r"\b(?:User|Enterprise)\d\b")


def host_roles(text: str) -> str:
    return re.sub(r"\b(User|Enterprise)\d\b", lambda m: f"a {m[1]} host", text)


def test_a_rule_names_at_most_three_safe_actions_in_the_order_given():
    many = [f"restore Host{i}" for i in range(130)]
    rule = rules.write("activity: exploit on an Enterprise host", "sleep", many)
    assert rule.endswith("; restore Host0, restore Host1, restore Host2 were safe there")
    assert len(rule) < 120


def test_focus_keeps_the_failing_and_safe_actions_clauses():
    situation = "left: frozen; down: hole; right: frozen; up: edge; goal: down-right"
    assert rules.focus(situation, "down", ["right"]) == "down: hole; right: frozen"
    # nothing keyed by the action: the whole situation
    assert rules.focus("activity: none; compromised: none", "sleep") == "activity: none; compromised: none"


def test_a_focused_rule_applies_on_another_map_where_its_clauses_recur():
    rule = rules.parse(rules.write("down: hole; right: frozen", "down", ["right"]), GRID)
    elsewhere = "left: edge; down: hole; right: frozen; up: frozen; goal: down"
    assert rules.applies(rule, elsewhere)
    reordered = rules.parse("when right: frozen; down: hole, do not down", GRID)
    assert rules.applies(reordered, elsewhere)  # clauses in another order
    assert not rules.applies(rule, "left: frozen; down: frozen; right: frozen; up: edge; goal: down")


def test_instance_names_are_made_general_or_the_rule_is_refused():
    kept, why = rules.check(
        "when activity: exploit User2, do not sleep; restore User2 was safe there",
        valid_actions=["sleep", "restore a User host"],
        situations=["activity: exploit a User host"],
        failing_situation="activity: exploit a User host",
        failing_action="sleep",
        abstract=host_roles,
        instance_terms=lambda t: HOSTS.findall(t),
    )
    assert kept == "when activity: exploit a User host, do not sleep; restore a User host was safe there"
    assert why.startswith("repaired: names made general")
    kept, why = rules.check(
        "when you are at row 2, col 0, do not down",
        valid_actions=GRID,
        situations=["you are at row 2, col 0"],
        failing_situation="you are at row 2, col 0",
        failing_action="down",
        instance_terms=lambda t: re.findall(r"row \d+, col \d+", t),
    )
    assert kept is None and "row 2, col 0" in why


def test_a_newer_rule_retires_the_one_it_contradicts():
    old = Unit("when activity: none, do not monitor; sleep was safe there", kind=Kind.RULE, owner="a", created_at=1.0)
    other = Unit("when activity: scan, do not sleep; monitor was safe there", kind=Kind.RULE, owner="a", created_at=2.0)
    acts = ["sleep", "monitor", "analyse"]
    reflection = Reflection(edits=(RuleEdit("", add=("when activity: none, do not sleep; monitor was safe there",)),))
    applied = apply_reflection([old, other], reflection, owner="a", valid_actions=acts)
    assert [(u.id, why.split(":")[0]) for u, why in applied.removed] == [(old.id, "contradicted by a newer rule")]
    assert other in applied.units  # another situation: no contradiction
    # without the actions a rule cannot be read, so nothing is judged a contradiction
    assert apply_reflection([old], reflection, owner="a").removed == ()


def test_rules_that_keep_failing_are_retired():
    with Memory.open(":memory:", embedder=HashingEmbedder(dim=32)) as mem:
        bad = Unit("when activity: none, do not sleep", kind=Kind.RULE, owner="a")
        good = Unit("when activity: none, do not monitor", kind=Kind.RULE, owner="a")
        mem.add([bad, good])
        for n in range(RETIRE_AFTER):
            retired = retire_failing(mem, mem.record_use([bad.id], success=False), actor="a")
            assert [u.id for u in retired] == ([bad.id] if n == RETIRE_AFTER - 1 else [])
            mem.record_use([good.id], success=n % 2 == 0)
        assert mem.get(bad.id, viewer=ADMIN).status is Status.ARCHIVED
        assert mem.get(good.id, viewer=ADMIN).status is Status.ACTIVE
        events = [e for e in mem.store.events(unit_id=bad.id, viewer=ADMIN) if e.op == "status"]
        assert events[-1].data["reason"] == f"retired: 0 of {RETIRE_AFTER} uses succeeded"


class _Ladder:
    """An env where every action is safe but they differ in reward: the probe ranks them."""

    spec = EnvSpec(name="ladder", description="", max_steps=3, tau=-1.0, theta=0, success_return=1, major_failure_return=-1)
    rewards = {"a": -0.5, "b": 0.5, "c": 0.0, "d": 0.2, "bad": -2.0}

    def reset(self, *, seed: int) -> str:
        self.t = 0
        return "step 0"

    def valid_actions(self):
        return list(self.rewards)

    def step(self, action: str) -> StepResult:
        self.t += 1
        return StepResult(f"step {self.t} after {action}", self.rewards[action], False)

    def close(self) -> None: ...


def test_safe_alternatives_come_best_first():
    assert safe_alternatives(_Ladder(), seed=0, prefix=[], failed="bad", tau=-1.0) == ("b", "d", "c", "a")


class _Corridor:
    """Rooms alike in kinds: walking on along the goal's way reads like a room already seen,
    walking back reads new (its clause says "the goal's way, back")."""

    spec = EnvSpec(name="corridor", description="", max_steps=3, tau=-1.0, theta=0, success_return=1, major_failure_return=-1)
    here = "in a room; exits north, south, west; go west: the goal's way; go south: the way back"
    after = {"go west": here, "go south": "in a room; exits north; go north: the goal's way, back", "go north": "in a room; exits south"}

    def reset(self, *, seed: int) -> str:
        return self.here

    def valid_actions(self):
        return ["go north", "go south", "go west"]

    def step(self, action: str) -> StepResult:
        return StepResult(self.after[action], -0.01, False)

    def close(self) -> None: ...


def test_the_goals_way_is_named_safe_first_even_where_it_reads_like_a_room_seen():
    got = safe_alternatives(_Corridor(), seed=0, prefix=[], failed="go north", tau=-1.0, must_move=True, seen={_Corridor.here})
    # before: ("go south",) alone, the way back, the only move to "new ground" (west read as
    # a bump: the room it reaches is described alike); the reflection then wrote "do not go
    # north; go south was safe there" and sent agents back
    assert got == ("go west", "go south")


def test_learn_from_retires_a_contradicted_rule_in_memory():
    with Memory.open(":memory:", embedder=HashingEmbedder(dim=32)) as mem:
        old = Unit("when activity: none, do not monitor; sleep was safe there", kind=Kind.RULE, owner="a")
        mem.add([old])
        reflection = Reflection(edits=(RuleEdit("", add=("when activity: none, do not sleep; monitor was safe there",)),))
        learn_from(mem, reflection, owner="a", actor="a", shown={}, valid_actions=["sleep", "monitor"])
        assert mem.get(old.id, viewer=ADMIN).status is Status.ARCHIVED


@pytest.mark.parametrize("text", ["when x, do not y", "not a rule"])
def test_clauses_of_plain_text_are_one_clause(text):
    assert len(rules.clauses(text)) == 1


def test_a_rule_may_name_an_action_by_its_kind_and_it_stands_for_every_action_of_that_kind():
    from forge.engine.recall import Recalled
    from forge.envs.cyborg import cage2_abstract, cage2_instance_terms
    from forge.learn.prompt import Recollection, _rules_in

    actions = ["sleep", "monitor", "restore User1", "restore User2", "restore Enterprise0"]
    situation = cage2_abstract("Activity: exploit User2; compromised: User2 user")
    kept, why = rules.check(
        "when Activity: exploit User2; compromised: User2 user, do not sleep; restore User2 was safe there",
        valid_actions=actions, situations=[situation], failing_situation=situation, failing_action="sleep",
        safe_actions=["restore User2"], abstract=cage2_abstract, instance_terms=cage2_instance_terms,
    )
    assert kept is not None and "User2" not in kept and "restore a User host" in kept, why
    unit = Unit(kept, kind=Kind.RULE)
    vocab = [*actions, *{cage2_abstract(a) for a in actions}]
    rec = Recollection(role="actor", valid_actions=tuple(actions), _parsed=tuple(_rules_in([Recalled(unit, 1.0, {})], vocab)), kind_of=cage2_abstract)
    assert rec.forbidden(situation) == {"sleep"}
    assert rec.advised(situation) == {"restore User1", "restore User2"}  # every User host, not the Enterprise one
    assert rec.offered(situation) == ["restore User1", "restore User2"]
    assert rec.verdict(situation, "restore User1") is True and rec.verdict(situation, "sleep") is False


def test_a_kind_that_stands_for_both_the_failed_and_the_safe_action_stays_forbidden_only():
    """Seen in a CAGE-2 Reflexion run: "do not restore User1; restore User2 was safe there",
    made general, read "do not restore a User host; restore a User host was safe there". The
    kind failed there, so the rule keeps forbidding it and stops calling it safe, reflected
    or repaired; other safe actions stay."""
    from forge.envs.cyborg import cage2_abstract, cage2_instance_terms

    actions = ["sleep", "monitor", "restore User1", "restore User2", "restore Enterprise0"]
    situation = cage2_abstract("Activity: exploit Enterprise0; compromised: Enterprise0 user")
    common = dict(valid_actions=actions, situations=[situation], failing_situation=situation,
                  abstract=cage2_abstract, instance_terms=cage2_instance_terms)
    kept, why = rules.check(
        f"when {situation}, do not restore User1; restore User2, restore Enterprise0 were safe there",
        failing_action="restore User1", safe_actions=["restore User2", "restore Enterprise0"], **common,
    )
    assert kept == f"when {situation}, do not restore a User host; restore an Enterprise host was safe there", why
    kept, why = rules.check(  # the repair path: the reflector forgot what failed
        f"when {situation}, do not sleep", failing_action="restore User1", safe_actions=["restore User2", "monitor"], **common,
    )
    assert kept is not None and "do not restore a User host; monitor was safe there" in kept, why
    parsed = rules.parse(kept, list(dict.fromkeys([*actions, *(cage2_abstract(a) for a in actions)])))
    assert parsed.avoid == ("restore a User host",) and parsed.prefer == ("monitor",)


def test_a_rule_that_copies_the_whole_situation_is_narrowed_to_its_actions_clauses():
    situation = "on the start tile; left: edge; down: hole; right: frozen; up: edge; goal: down-right at distance 6"
    kept, why = rules.check(
        f"when {situation}, do not down; right was safe there", valid_actions=GRID, situations=[situation],
        failing_situation=situation, failing_action="down", safe_actions=["right"],
    )
    assert kept == "when down: hole; right: frozen, do not down; right was safe there" and "narrowed" in why
    # a rule already naming part of the situation is left as written
    kept, why = rules.check("when down: hole, do not down", valid_actions=GRID, situations=[situation], failing_situation=situation, failing_action="down")
    assert kept == "when down: hole, do not down" and why == ""


def test_a_rule_whose_when_starts_lower_case_keeps_its_cage2_situation():
    """rules.write lower-cases a situation's first letter ("when activity: none; ..."), and
    the host-state parser read "activity:" as a host: every such rule was made general into
    "Activity: activity: on a host; compromised: none", matched no situation the agent met,
    and was dropped (every stalled attempt of a CAGE-2 run lost its reflection)."""
    from forge.envs.cyborg import cage2_abstract, cage2_instance_terms, parse_cage2_situation

    assert parse_cage2_situation("activity: exploit User2; compromised: User2 user") == {"User2": ("exploit", "user")}
    actions = ["sleep", "monitor", "restore User1", "restore User2"]
    for raw in ("Activity: none; compromised: none", "Activity: exploit User2; compromised: User2 user"):
        situation = cage2_abstract(raw)
        kept, why = rules.check(
            rules.write(situation, "sleep", ["monitor"]), valid_actions=actions, situations=[situation],
            failing_situation=situation, failing_action="sleep", safe_actions=["monitor"],
            abstract=cage2_abstract, instance_terms=cage2_instance_terms,
        )
        assert kept is not None and "activity: activity" not in kept.lower(), why
        assert rules.applies(rules.parse(kept, [*actions, *{cage2_abstract(a) for a in actions} - set(actions)]), situation)


class _TwoRooms:
    """Each room has its own commands, as TextWorld's: a hall, and north of it a room with a coin."""

    spec = EnvSpec(name="two-rooms", description="", max_steps=3, tau=-1.0, theta=0, success_return=1, major_failure_return=-1)
    actions = {"hall": ["go north", "wait"], "coin room": ["go south", "look", "take coin"]}

    def reset(self, *, seed: int) -> str:
        self.room = "hall"
        return self.room

    def valid_actions(self):
        return self.actions[self.room]

    def step(self, action: str) -> StepResult:
        check_action(action, valid=self.valid_actions(), env="two-rooms")
        self.room = {"go north": "coin room", "go south": "hall"}.get(action, self.room)
        won = action == "take coin"
        return StepResult(f"{self.room}, carrying a coin" if won else self.room, 2.0 if won else -0.01, won)

    def close(self) -> None: ...


def test_safe_alternatives_try_the_actions_of_the_failing_step_wherever_the_env_was_left():
    env = _TwoRooms()
    env.reset(seed=0)  # left in the hall, as a probe of an earlier step leaves it
    # before: the hall's commands were tried in the coin room, each refused, so nothing was safe
    assert safe_alternatives(env, seed=0, prefix=["go north"], failed="look", tau=-1.0, must_move=True) == ("take coin", "go south")


def test_an_alternative_that_won_is_what_the_rule_says_to_do_instead():
    from forge.learn.loop import reflect_on  # noqa: PLC0415

    env = _TwoRooms()
    probe = probe_alternatives(env, seed=0, prefix=["go north"], failed="look", tau=-1.0, must_move=True)
    assert probe.won == ("take coin",) and probe.safe[0] == "take coin"
    traj = Trajectory(
        actions=["go north", "look", "look"], observations=["hall", "coin room", "coin room"], rewards=[-0.01] * 3,
        steps=[Step(observation=o, thought="", action=a, role="actor") for o, a in (("hall", "go north"), ("coin room", "look"), ("coin room", "look"))],
    )
    # the 1.5B's answer in a coin room of the TextWorld stream: move on, where taking the coin won
    llm = ScriptedLLM([json.dumps({"avoid": "look", "instead": "go south"})])
    out = reflect_on(traj, env=env, roles=("actor",), acting_roles=("actor",), llm=llm, seed=0, tau=-1.0, at=1, stalled=True)
    (rule,) = out.edits[0].texts
    assert rule.endswith("do not look; take coin was safe there"), rule
    # the model's "go south" was repaired (here already as not safe; rules.check's win repair is
    # tested on its own below), and the repair is recorded
    assert any("repaired" in r and "go south" in r for r in out.repaired), out.repaired


def test_the_rule_check_holds_every_rule_to_what_won_the_episode_there():
    """Every reflection style goes through rules.check, so a proven win is enforced there, not
    only in the slots prompt: the edits style let "do not take coin" through where it won."""
    room = "in a room with a coin"
    common = dict(valid_actions=["go south", "look", "take coin"], situations=[room], failing_situation=room,
                  failing_action="look", safe_actions=["take coin", "go south"], won_actions=["take coin"])
    kept, why = rules.check(rules.write(room, "look", ["go south"]), **common)
    assert kept == rules.write(room, "look", ["take coin"]) and "won the episode" in why
    # (a rule that forbids only another action is rewritten to forbid the failing one first)
    kept, why = rules.check(rules._compose(room, ["look", "take coin"], ["go south"]), **common)
    assert kept is None and "forbids what won the episode from there (take coin)" in why
    kept, why = rules.check(rules.write(room, "look", ["take coin"]), **common)
    assert kept == rules.write(room, "look", ["take coin"]) and why == ""
    # elsewhere than the failing situation a win proves nothing
    other = "in a room with a key"
    kept, _ = rules.check(rules.write(other, "look", ["go south"]), **{**common, "situations": [room, other]})
    assert kept == rules.write(other, "look", ["go south"])


def test_abstraction_leaves_the_rule_templates_own_words_alone():
    """A TextWorld game with a safe in it made "safe" a container's name, and the repaired rule
    read "do not go north; go east was a container there". Its instance-name check then found
    the game's "safe" in the template's words and refused every rule of that game (treasure-2,
    run seed 0: three reflections in a row)."""

    def abstract(text: str) -> str:
        return re.sub(r"\b(?:a )?safe\b", "a container", text)

    def instance_terms(text: str) -> list[str]:
        return re.findall(r"\bsafe\b", text)

    room = "in a room with a container"
    for names in (None, instance_terms):
        kept, why = rules.check(
            "when in a room with a safe, do not go north; go east was safe there",
            valid_actions=["go north", "go east", "open safe"], situations=[room], failing_situation=room,
            failing_action="go north", safe_actions=["go east"], abstract=abstract, instance_terms=names,
        )
        assert kept == "when in a room with a container, do not go north; go east was safe there", why
    kept, why = rules.check(
        "when in a room with a container, do not open safe; go east was safe there",
        valid_actions=["go north", "go east", "open safe"], situations=[room], failing_situation=room,
        failing_action="open safe", safe_actions=["go east"], instance_terms=instance_terms,
    )
    assert kept is None and "names what holds in this task only (safe)" in why  # the game's safe, not the template's


TW = ["go north", "go south", "go east", "go west", "take coin"]


def test_a_rule_binds_to_a_situation_whose_keyed_clauses_recur_under_other_actions():
    """The coin-1 rule learned where the goal's way went east held on no held-out game whose
    goal went north, where the same walk back paced the episode to its step limit."""
    learned = rules.parse("when go east: the goal's way; go south: the way back, do not go south; go east was safe there", TW)
    there = "in a room; exits north, east; go north: the goal's way; go east: the way back; goal: take a coin"
    bound = rules.bind(learned, there)
    assert bound == rules.ParsedRule("go north: the goal's way; go east: the way back", ("go east",), ("go north",))
    assert rules.render(bound) == "when go north: the goal's way; go east: the way back, do not go east; go north was safe there"
    assert rules.bind(learned, "in a room; go east: the goal's way; go south: the way back") is learned  # as it is
    # FrozenLake's tiles are the same whichever way they lie
    hole = rules.parse("when down: hole; right: frozen, do not down; right was safe there", GRID)
    assert rules.bind(hole, "on a frozen tile; left: hole; down: frozen; right: frozen; up: edge") == rules.ParsedRule(
        "left: hole; right: frozen", ("left",), ("right",))
    # two clauses say "hole": which one the rule meant is not known, so it binds to neither
    assert rules.bind(hole, "on a frozen tile; left: hole; down: frozen; right: hole; up: edge") is None
    # a clause keyed by what the rule does not act on is never swapped (a host's state, the goal)
    state = rules.parse("when compromised: an Enterprise host, do not sleep", ["sleep", "monitor"])
    assert rules.bind(state, "scanned: an Enterprise host") is None
    # an action the rule names unswapped that a swap lands on is dropped, not said twice
    back = rules.parse("when go south: the way back, do not go south; go north was safe there", TW)
    assert rules.bind(back, "in a room; go north: the way back") == rules.ParsedRule("go north: the way back", ("go north",), ())


def test_a_bound_rule_is_shown_as_it_reads_here_and_offers_its_swapped_actions(tmp_path):
    from forge.learn.prompt import recollect  # noqa: PLC0415

    rule = Unit("when go east: the goal's way; go south: the way back, do not go south; go east was safe there",
                kind=Kind.RULE, owner="a", scope="private")
    here = "in a room; exits north, east; go north: the goal's way; go east: the way back; goal: take a coin"
    with Memory.open(tmp_path / "m.db", embedder=HashingEmbedder(dim=64)) as mem:
        mem.add([rule])
        # the room's commands: its way back is north, so "go south", which the rule names, is none
        # of them (coin-1 held-out game 1000: the rule was never shown there)
        rec = recollect(mem, viewer=Viewer.of("a"), query=here, role="actor", valid_actions=["go east", "go north", "take coin"])
        text, ids = rec.now_text(here)
    assert ids == [rule.id]
    assert "- when go north: the goal's way; go east: the way back, do not go east; go north was safe there" in text
    assert rec.offered(here) == ["go north"] and rec.verdict(here, "go east") is False and rec.verdict(here, "go north") is True


ROOM = ("in a room with a key, a supporter; exits north, south, west; go north: the goal's way; go south: the way back; "
        "take a key from a supporter: the goal's object; carrying nothing; goal: take a key from a supporter")


def test_a_rule_against_an_unkeyed_action_keeps_the_goals_clause_that_made_the_alternative_safe():
    """A detour through a plain exit, or a keycard examined in reach, has no clause of its own;
    the rule narrows to the clause that names the safe action as the goal's way or object, so
    it holds in every room where that recurs (TextWorld level 2: two of coin-2's three rules
    named a whole room and never applied on a held-out game)."""
    assert rules.focus(ROOM, "go west", ["go north"]) == "go north: the goal's way"
    assert rules.focus(ROOM, "examine a key", ["take a key from a supporter"]) == "take a key from a supporter: the goal's object"
    assert rules.focus(ROOM, "go west", ["go south"]) == ROOM  # the way back is no reason a move was safe
    assert rules.focus(ROOM, "go west") == ROOM  # no safe action: nothing says why
    acts = ["go north", "go south", "go west", "examine a key", "take a key from a supporter"]
    kept, why = rules.check(f"when {ROOM}, do not go west; go north was safe there", valid_actions=acts, situations=[ROOM],
                            failing_situation=ROOM, failing_action="go west", safe_actions=["go north"])
    assert kept == "when go north: the goal's way, do not go west; go north was safe there", why
    # and it binds in another game's room whose goal's way is east
    there = "in a room; exits east, north, west; go east: the goal's way; go west: the way back; goal: take a coin"
    bound = rules.bind(rules.parse(kept, acts + ["go east"]), there)
    assert bound is not None and bound.avoid == ("go west",) and bound.prefer == ("go east",)


def test_a_rule_repaired_to_recommend_the_win_narrows_to_the_goals_object():
    """treasure-2 at ae24b15: the reflector forbade examining a door in the room where the
    goal's object lay, naming no safe action; the win repair added the take but kept the whole
    room, so the rule applied in no other game. Narrowed to the take's own clause (the goal's
    object), it holds wherever the goal's object is in reach."""
    room = ("in a room with a food, a supporter; exits south, east (an open door), west; take a food from a "
            "supporter: the goal's object; go west: the way back; carrying nothing; goal: take a food from a supporter")
    valid = ["examine door", "go south", "go west", "take a food from a supporter"]
    kept, why = rules.check(rules.write(room, "examine door", []), valid_actions=valid, situations=[room],
                            failing_situation=room, failing_action="examine door",
                            won_actions=["take a food from a supporter"])
    assert kept == ("when take a food from a supporter: the goal's object, do not examine door; "
                    "take a food from a supporter was safe there"), kept
    assert "won the episode" in why
    # and it reads in another game's room where a key is the goal's object, its take swapped in
    other = "in a room with a key, a box; take a key from a box: the goal's object; go east: the way back; carrying nothing"
    parsed = rules.parse(kept, valid)
    bound = rules.bind(parsed, other)
    assert bound is not None and bound.prefer == ("take a key from a box",) and rules.applies(bound, other)
