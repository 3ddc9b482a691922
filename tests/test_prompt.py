"""One path to the prompt: engine recall, scores that move what is shown, stable blocks."""

from __future__ import annotations

from forge.engine.memory import Memory
from forge.learn.prompt import recollect
from forge.model import Context, Kind, Unit, Viewer

Q = "You are at row 2, col 0, on a frozen tile. Walk to the goal."


def _mem(*units: Unit) -> Memory:
    mem = Memory.open(":memory:", embedder="hash")
    mem.add(list(units))
    return mem


def test_sections_in_fixed_order_and_viewer_scopes_enforced():
    units = [
        Unit("when you are at row 2, col 0, on a frozen tile, do not down", kind=Kind.RULE, owner="a", scope="private"),
        Unit("when you are at row 2, col 0, on a frozen tile, do not left", kind=Kind.RULE, owner="b", scope="private"),
        Unit("The goal is at row 3, col 3", kind=Kind.FACT),
        Unit("walk right along row 0, then down", kind=Kind.PROCEDURE, meta={"successes": 3, "failures": 1}),
    ]
    with _mem(*units) as mem:
        rec = recollect(mem, viewer=Viewer.of("a"), query=Q, role="actor")
        assert rec.block.index("## Rules") < rec.block.index("## Procedures") < rec.block.index("## Facts")
        assert "do not down" in rec.block and "do not left" not in rec.block  # b's private rule
        assert "(worked 3 of 4 times)" in rec.block
        assert set(rec.ids) == {units[0].id, units[2].id, units[3].id}


def test_other_roles_units_are_left_out():
    mine = Unit("when you are at row 2, col 0, on a frozen tile, do not down", kind=Kind.RULE, context=Context(role="planner"))
    theirs = Unit("when you are at row 2, col 0, on a frozen tile, do not up", kind=Kind.RULE, context=Context(role="analyst"))
    with _mem(mine, theirs) as mem:
        assert recollect(mem, viewer=Viewer.of("a"), query=Q, role="planner").ids == [mine.id]


def test_outcomes_recorded_by_record_use_move_what_a_small_budget_shows():
    a = Unit("when you are at row 2, col 0, on a frozen tile, do not down; right was safe there", kind=Kind.RULE)
    b = Unit("when you are at row 2, col 0, on a frozen tile, do not down; up was safe there", kind=Kind.RULE)
    with _mem(a, b) as mem:
        budget = 45  # room for one of the two (37 tokens each, header included)
        before = recollect(mem, viewer=Viewer.of("x"), query=Q, budget=budget).ids
        loser = before[0]
        for _ in range(4):
            mem.record_use([loser], success=False)
        after = recollect(mem, viewer=Viewer.of("x"), query=Q, budget=budget).ids
        assert len(before) == 1 and len(after) == 1 and after != before
        unit = mem.get(loser, viewer=Viewer.admin())
        assert unit.meta["uses"] == 4 and unit.meta["failures"] == 4 and unit.validation == 1 / 6


def test_block_is_byte_stable_whatever_the_query_order():
    units = [Unit(f"when you are at row {r}, col 0, on a frozen tile, do not down", kind=Kind.RULE, created_at=100.0 + r) for r in range(3)]
    with _mem(*units) as mem:
        one = recollect(mem, viewer=Viewer.of("x"), query="row 0", budget=1000).block
        two = recollect(mem, viewer=Viewer.of("x"), query="row 2 col 0", budget=1000).block
        assert one == two


def test_now_picks_the_rules_for_this_situation_even_beyond_the_budget():
    filler = [Unit(f"when you are at row 3, col {c}, on a frozen tile, do not up; left was safe there", kind=Kind.RULE) for c in range(6)]
    target = Unit("when you are at row 2, col 0, on a frozen tile, do not down; right was safe there", kind=Kind.RULE)
    with _mem(*filler, target) as mem:
        rec = recollect(mem, viewer=Viewer.of("x"), query=Q, budget=20, valid_actions=("left", "down", "right", "up"))
        text, ids = rec.now_text("You are at row 2, col 0, on a frozen tile")
        assert ids == [target.id] and "do not down" in text
        # the rule names what was safe there: that is what the prompt offers
        assert text.endswith("Failed here before: down. Choose one of: right.")
        assert rec.forbidden("You are at row 2, col 0, on a frozen tile") == {"down"}
        assert rec.now("You are at row 1, col 1, on a frozen tile") == []


def test_now_offers_every_other_action_when_no_rule_names_a_safe_one():
    rule = Unit("when you are at row 2, col 0, on a frozen tile, do not down", kind=Kind.RULE)
    with _mem(rule) as mem:
        rec = recollect(mem, viewer=Viewer.of("x"), query=Q, budget=200, valid_actions=("left", "down", "right", "up"))
        text, _ = rec.now_text("You are at row 2, col 0, on a frozen tile")
        assert text.endswith("Failed here before: down. Choose one of: left, right, up.")
        assert rec.advised("You are at row 2, col 0, on a frozen tile") == set()


def test_rules_are_read_against_the_actions_valid_at_each_step():
    """TextWorld's commands change from room to room, but a recollection is made once per
    episode, with the first room's. The rules were parsed against those, so a rule about an
    exit the first room lacks forbade nothing, and "Choose one of" offered the first room's
    commands in every room."""
    first = ("go north", "go south", "inventory", "look")
    here = ("go east", "go north", "go south", "inventory", "look")
    situation = "in a room; exits north, south, east; go north: the way back; carrying nothing"
    back = Unit("when go north: the way back, do not go north", kind=Kind.RULE)
    east = Unit("when exits north, south, east, do not go east; go south was safe there", kind=Kind.RULE)
    with _mem(back, east) as mem:
        rec = recollect(mem, viewer=Viewer.of("x"), query="a room", budget=400, valid_actions=first)
        now = rec.here(here)
        assert now.forbidden(situation) == {"go north", "go east"}
        text, ids = now.now_text(situation)
        assert set(ids) == {back.id, east.id}
        assert text.endswith("Failed here before: go east, go north. Choose one of: go south.")
        assert now.verdict(situation, "go south") is True and now.verdict(situation, "go east") is False
        assert rec.here(first) is rec and now.block == rec.block and now.ids == rec.ids
