"""Reflection: rule edit ops, validation, fallbacks, caps and eviction order."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from forge.envs import EnvSpec
from forge.errors import ValidationError
from forge.learn.loop import Trajectory, failure_point
from forge.learn.reflect import (
    Reflection,
    RuleEdit,
    Snapshot,
    apply_reflection,
    enforce_caps,
    reflect,
    stall_step,
    validate_rule,
)
from forge.llm.testing import ScriptedLLM
from forge.model import Kind, Rule, Step, Unit

ACTIONS = ("left", "down", "right", "up")
OBS = "Step 2 of 20.\nYou are at row 2, col 0 (rows 0-3), on a frozen (safe) tile. The goal is at row 3, col 3."


def rules(*texts: str, role: str = "actor") -> list[Unit]:
    return [Unit(t, kind=Kind.RULE, scope="private", owner="a", context=_ctx(role), created_at=1000.0 + i) for i, t in enumerate(texts)]


def _ctx(role: str):
    from forge.model import Context

    return Context(role=role)


def texts(units) -> list[str]:
    return [u.content for u in units if u.kind is Kind.RULE]


def snapshot(shown: list[Unit] | None = None, safe: tuple[str, ...] = ("right",)) -> Snapshot:
    steps = tuple(Step(observation=OBS, action="down", reward=r, role="actor") for r in (0.0, 0.0, -1.0))
    return Snapshot(
        env="frozenlake-4x4",
        description="Walk to the goal.",
        valid_actions=ACTIONS,
        roles=("actor",),
        acting_roles=("actor",),
        steps=steps,
        failing=2,
        failing_action="down",
        failing_reward=-1.0,
        failing_observation=OBS,
        tau=-0.5,
        shown={"actor": tuple(shown or ())},
        safe_actions=safe,
        known_names=("read_observation",),
    )


def test_delete_indices_then_add():
    mem = rules("when a, then left", "when b, then down", "when c, then up")
    edit = RuleEdit("actor", delete=(0, 2), add=("when d, then right",))
    applied = apply_reflection(mem, Reflection(edits=(edit,)), owner="a", shown={"actor": mem})
    assert texts(applied.units) == ["when b, then down", "when d, right"]  # rendered from its typed record
    assert [u.content for u, _ in applied.removed] == ["when a, then left", "when c, then up"]
    assert all("deleted" in why for _, why in applied.removed)
    new = applied.added[0]
    assert new.owner == "a" and str(new.scope) == "private" and new.context.role == "actor"
    assert new.provenance.source == "reflection" and new.rule.when == "d"


def test_caps_keep_newest_and_report_evicted_in_order():
    items = rules("r0 left", "r1 left", "r2 left")
    items.append(Unit("e0", kind=Kind.EXAMPLE, context=_ctx("actor"), created_at=1002.5))
    items += [u.replace(created_at=1003.0) for u in rules("r3 left")]
    kept, evicted = enforce_caps(items, rule_cap=2, example_cap=5)
    assert [i.content for i in kept] == ["r2 left", "e0", "r3 left"]
    assert [i.content for i in evicted] == ["r0 left", "r1 left"]
    applied = apply_reflection(items, Reflection(edits=(RuleEdit("actor", add=("when x, then up",)),)), owner="a", rule_cap=2, now=2000.0)
    assert texts(applied.units) == ["r3 left", "when x, up"]
    assert [why for _, why in applied.removed] == ["evicted by the memory cap (newest kept)"] * 3


def test_caps_are_per_role():
    items = rules("a left", role="planner") + rules("b left", role="analyst")
    kept, evicted = enforce_caps(items, rule_cap=1, example_cap=1)
    assert len(kept) == 2 and not evicted


def test_validate_rule_rejects_invented_names_and_actionless_rules():
    assert validate_rule("when at row 2, then do not down", valid_actions=ACTIONS) is None
    assert "invents" in validate_rule("when lost, then call teleport_home() and go up", valid_actions=ACTIONS)
    assert "no valid action" in validate_rule("when lost, then relax", valid_actions=ACTIONS)
    assert validate_rule("use `read_observation` then go up", valid_actions=ACTIONS, known_names=("read_observation",)) is None


def test_reflect_valid_rules_keeps_good_drops_bad():
    reply = json.dumps({"edits": [{"role": "actor", "delete": [7], "add": [
        "When you are at row 2, col 0, on a frozen tile, do not down; go right", "then call jump_now()", "when x, then up"]}]})
    llm = ScriptedLLM([reply])
    out = reflect(llm, snapshot(), representation="rules", style="free")
    assert not out.fallback
    # the model's words become a typed rule, read against the actions valid there
    assert out.edits == (RuleEdit("actor", (), (Rule("you are at row 2, col 0, on a frozen tile", avoid=("down",), prefer=("right",)),)),)
    assert any("index 7" in d for d in out.dropped) and any("jump_now" in d for d in out.dropped)
    assert any("no situation the agent met" in d for d in out.dropped)  # "when x" names nothing it saw


def test_rule_recommending_the_failed_action_is_repaired_and_recorded():
    # the rule the 1.5B model really wrote: it recommends the move that fell into the hole
    reply = json.dumps({"edits": [{"role": "actor", "add": ["when You are at row 2, col 0, on a frozen tile, then down (reward -1)"]}]})
    out = reflect(ScriptedLLM([reply]), snapshot(), representation="rules", style="free")
    assert not out.fallback
    assert tuple(out.edits[0].texts) == ("when you are at row 2, col 0, on a frozen tile, do not down; right was safe there",)
    assert out.repaired and "recommends the action that failed" in out.repaired[0]


def test_slot_reflection_writes_the_rule_for_the_failing_situation():
    shown = rules(
        "when you are at row 1, col 1, on a frozen tile, do not up",  # another situation: kept
        "when you are at row 2, col 0, on a frozen tile, then down",  # advised what failed here: deleted
    )
    llm = ScriptedLLM([json.dumps({"avoid": "down", "instead": "right"})])
    out = reflect(llm, snapshot(shown), representation="rules")
    assert not out.fallback and not out.dropped
    assert out.edits == (RuleEdit("actor", (1,), ("when you are at row 2, col 0, on a frozen tile, do not down; right was safe there",)),)
    prompt = llm.requests[0].messages[-1].content
    assert "'when you are at row 2, col 0, on a frozen tile, do not <avoid>; <instead> was safe there'" in prompt
    assert "- when you are at row 1, col 1" in prompt
    assert "delete" not in json.dumps(llm.requests[0].json_schema)  # the model is not asked what to delete


def test_slot_reflection_keeps_a_rule_that_forbids_something_even_if_its_safe_list_failed():
    # "down" fell in a hole before; now "left" failed here (a stall): the old rule's "do not
    # down" still holds, so it stays beside the new lesson
    kept = rules("when you are at row 2, col 0, on a frozen tile, do not left; down was safe there")
    out = reflect(ScriptedLLM([json.dumps({"avoid": "down", "instead": "right"})]), snapshot(kept), representation="rules")
    assert out.edits[0].delete == ()


def test_slot_reflection_repairs_a_lesson_that_avoids_the_wrong_action():
    # the model blames "left" (safe) and recommends "down" (the move that fell in): repaired
    out = reflect(ScriptedLLM([json.dumps({"avoid": "left", "instead": "down"})]), snapshot(), representation="rules")
    assert not out.fallback
    assert tuple(out.edits[0].texts) == ("when you are at row 2, col 0, on a frozen tile, do not down; right was safe there",)
    assert out.repaired and "recommends the action that failed" in out.repaired[0]


def test_slot_reflection_that_avoids_and_recommends_one_action_falls_back():
    out = reflect(ScriptedLLM([json.dumps({"avoid": "up", "instead": "up"})]), snapshot(), representation="rules")
    assert out.fallback and "same action" in out.dropped[0]
    assert tuple(out.edits[0].texts) == ("when you are at row 2, col 0, on a frozen tile, do not down; right was safe there",)


def test_unknown_reflection_style():
    with pytest.raises(ValidationError, match="reflection style"):
        reflect(ScriptedLLM(), snapshot(), style="poem")


def test_malformed_reflection_falls_back_to_trajectory_rule():
    llm = ScriptedLLM(["no json here", "still none", "nope"], repeat_last=True)
    out = reflect(llm, snapshot(), representation="rules", retries=1)
    assert out.fallback
    assert tuple(out.edits[0].texts) == ("when you are at row 2, col 0, on a frozen tile, do not down; right was safe there",)
    assert "no valid JSON" in out.error
    applied = apply_reflection([], out, owner="a")
    assert applied.added[0].meta["fallback"] is True and applied.added[0].confidence < 0.5


def test_examples_valid_and_fallback():
    good = json.dumps({"name": "go-right", "description": "avoid the hole", "steps": [{"observation": "at row 2, col 0", "thought": "hole below", "answer": "right"}]})
    out = reflect(ScriptedLLM([good]), snapshot(), representation="examples")
    assert not out.fallback and out.examples[0].steps[0]["answer"] == "right"
    bad = json.dumps({"name": "x", "description": "y", "steps": [{"observation": "you are at row 2, col 0, on a frozen tile", "answer": "down"}]})
    out = reflect(ScriptedLLM([bad], repeat_last=True), snapshot(), representation="examples")
    assert out.fallback
    ex = out.examples[0]
    assert ex.steps[-1]["answer"] == "right"  # the env-checked safe action
    assert [s["answer"] for s in ex.steps[:-1]] == ["down", "down"]


def _named_snapshot() -> Snapshot:
    """A game whose objects have kinds (keycard is a key) and whose rooms have names no kind
    replaces (the Zorkmid room): what an example may and may not carry to another game."""
    obs = "You are in the Zorkmid room. A keycard lies here. Exits: east, west."
    steps = tuple(Step(observation=obs, action="go west", reward=0.0, role="actor") for _ in range(3))
    return dataclasses.replace(
        snapshot(safe=("take keycard",)),
        valid_actions=("go east", "go west", "take keycard"),
        steps=steps,
        failing_action="go west",
        failing_reward=0.0,
        failing_observation=obs,
        reason="stall",
        describe=lambda o: "Zorkmid room, a keycard here" if "Zorkmid" in o else "a key here",
        abstract=lambda t: re.sub(r"\bkeycard\b", "key", t),
        instance_terms=lambda t: re.findall(r"Zorkmid", t),
    )


def test_examples_are_held_to_the_envs_terms():
    """An example is shown on other games: the object it names reads as its kind, a step that
    still names this game's room is dropped with why, and so is a title naming it."""
    written = json.dumps(
        {
            "name": "Zorkmid escape",
            "description": "take the keycard in the Zorkmid room",
            "steps": [
                {"observation": "You are in the Zorkmid room", "thought": "the room", "answer": "go east"},
                {"observation": "a keycard lies here", "thought": "the keycard is the goal", "answer": "take keycard"},
                {"observation": "a keycard lies here", "thought": "as in the Zorkmid room", "answer": "take keycard"},
            ],
        }
    )
    out = reflect(ScriptedLLM([written]), _named_snapshot(), representation="examples")
    assert not out.fallback
    (ex,) = out.examples
    assert [dict(s) for s in ex.steps] == [
        {"thought": "the key is the goal", "tool": "", "observation": "a key lies here", "answer": "take key"},
        {"thought": "", "tool": "", "observation": "a key lies here", "answer": "take key"},  # the thought named the room
    ]
    assert "Zorkmid" not in ex.name + ex.description and "keycard" not in ex.content()
    assert any("example step names what holds in this task only (Zorkmid)" in d for d in out.dropped)
    assert any(d.startswith("example title names what holds in this task only") for d in out.dropped)


def test_fallback_example_leaves_out_what_names_the_game():
    """The trajectory's own situations name the room: the lead-in goes, the correction stays
    (in kinds), and the title names no step number of this attempt."""
    out = reflect(ScriptedLLM(["not json"], repeat_last=True), _named_snapshot(), representation="examples", retries=0)
    assert out.fallback
    snap = _named_snapshot()
    only_kinds = dataclasses.replace(snap, describe=lambda o: "a keycard here")
    (ex,) = reflect(ScriptedLLM(["not json"], repeat_last=True), only_kinds, representation="examples", retries=0).examples
    assert out.examples == ()  # the failing situation itself names the room: nothing transfers
    assert [s["answer"] for s in ex.steps] == ["go west", "go west", "take key"]
    assert {s["observation"] for s in ex.steps} == {"a key here"}
    assert ex.name == "avoid-go-west" and "step" not in ex.description


def test_the_same_demonstration_is_not_added_twice():
    """A second reflection on the same failure writes the same steps under another title: the
    memory keeps one, so it does not take two places in the prompt."""
    first = json.dumps({"name": "go-right", "description": "avoid the hole", "steps": [{"observation": "a hole below", "thought": "hole", "answer": "right"}]})
    again = json.dumps({"name": "Right, not down", "description": "again", "steps": [{"observation": "A hole  below", "thought": "careful", "answer": "right"}]})
    mem = list(apply_reflection([], reflect(ScriptedLLM([first]), snapshot(), representation="examples"), owner="a").units)
    applied = apply_reflection(mem, reflect(ScriptedLLM([again]), snapshot(), representation="examples"), owner="a")
    assert applied.added == () and [u.kind for u in applied.units] == [Kind.EXAMPLE]
    other_role = reflect(ScriptedLLM([again]), dataclasses.replace(snapshot(), acting_roles=("scout",), roles=("scout",)), representation="examples")
    assert len(apply_reflection(mem, other_role, owner="a").added) == 1  # another role's memory is its own


def test_mixed_gives_both_kinds():
    llm = ScriptedLLM(["garbage"], repeat_last=True)
    out = reflect(llm, snapshot(), representation="mixed", retries=0)
    assert out.edits and out.examples and out.fallback


def test_unknown_representation():
    with pytest.raises(ValidationError):
        reflect(ScriptedLLM(), snapshot(), representation="poems")


def test_fallback_rule_not_duplicated():
    first = reflect(ScriptedLLM(["x"], repeat_last=True), snapshot(), retries=0)
    mem = list(apply_reflection([], first, owner="a").units)
    again = reflect(ScriptedLLM(["x"], repeat_last=True), snapshot(mem), retries=0)
    assert again.fallback and again.edits == ()


def test_a_lesson_the_agent_already_holds_is_not_a_fallback():
    held = rules("when you are at row 2, col 0, on a frozen tile, do not down; right was safe there")
    out = reflect(ScriptedLLM([json.dumps({"avoid": "down", "instead": "right"})]), snapshot(held), representation="rules")
    assert not out.fallback and out.edits == ()
    assert out.dropped and "duplicate rule" in out.dropped[0]


def test_a_stall_is_blamed_on_the_step_that_undid_progress() -> None:
    """CliffWalking: up from the start, down back to it, then bumps. The step down from row 2
    undid the climb; the repeated bumps at the start only follow from it."""
    where = ["row 3, col 0", "row 2, col 0", "row 3, col 0", "row 3, col 0", "row 3, col 0"]
    assert stall_step(where, ["up", "down", "down", "down", "down"], situation=str) == 1


def test_a_bump_is_blamed_where_it_happens() -> None:
    where = ["row 0, col 0", "row 1, col 0", "row 1, col 0", "row 1, col 0"]
    assert stall_step(where, ["down", "left", "left", "left"], situation=str) == 1


def test_without_a_return_the_last_step_is_blamed() -> None:
    assert stall_step(["a", "b", "c"], ["x", "y", "z"], situation=str) == 2


def test_safe_alternatives_name_moves_that_change_the_situation_not_bumps():
    pytest.importorskip("gymnasium", reason="gymnasium is an optional extra: pip install '.[envs]'")
    from forge.envs import make_env
    from forge.learn.reflect import safe_alternatives

    env = make_env("frozenlake-4x4")
    # down, down reaches row 2, col 0; down again falls into the hole at row 3, col 0.
    # left there bumps the edge: safe, but it is no advice, so it is not named.
    assert safe_alternatives(env, seed=0, prefix=["down", "down"], failed="down", tau=-0.5) == ("right", "up")
    # at the start, "up" and "left" both bump; only "down" and "right" move
    assert safe_alternatives(env, seed=0, prefix=[], failed="left", tau=-0.5) == ("down", "right")
    assert safe_alternatives(env, seed=0, prefix=[], failed="left", tau=-0.5, must_move=True) == ("down", "right")
    # in a stall, moves to situations the episode has not seen come first
    start = env.reset(seed=0)
    seen = {env.spec.situation(start), env.spec.situation(env.step("down").observation)}  # the start, row 1, col 0
    assert safe_alternatives(env, seed=0, prefix=["down"], failed="left", tau=-0.5, must_move=True, seen=seen) == ("down",)
    assert safe_alternatives(env, seed=0, prefix=["down"], failed="left", tau=-0.5, must_move=True) == ("down", "up")


def test_a_stall_is_not_blamed_on_the_goals_way():
    # corridor rooms alike in kinds: the move along the route reaches a situation "seen" before
    corridor = "in a room; exits north, south; go north: the goal's way; go south: the way back"
    start = "in a room; exits north; go north: the goal's way"
    where = [start, corridor, corridor, "in a room; exits south, east; go south: the goal's way, back", corridor]
    assert stall_step(where, ["go north", "go north", "go east", "go south"], situation=str) == 2
    # without the env's word for the goal's way, the same walk is blamed at the first repeat
    plain = [w.replace("the goal's way", "an exit") for w in where]
    assert stall_step(plain, ["go north", "go north", "go east", "go south"], situation=str) == 1


def test_a_stall_is_read_in_the_envs_own_situations():
    # TextWorld opens every observation with the same goal line, so a generic summary reads
    # every room as the first: the team runner, which passed no situation, blamed each failed
    # game on its first step along the goal's route ("when go south: the goal's way, go south
    # (the task was not solved from there)")
    corridor = "in a room; exits north, south; go north: the goal's way; go south: the way back"
    start = "in a room; exits north; go north: the goal's way"
    where = [start, corridor, corridor, "in a room; exits south, east; go south: the goal's way, back", corridor]
    observations = [f"Goal: take the coin.\n{w}" for w in where[:4]]
    spec = EnvSpec(
        name="corridors", description="", max_steps=4, tau=-1.0, theta=0.0, success_return=1.0,
        major_failure_return=-1.0, situation=lambda o: o.splitlines()[1],
    )
    traj = Trajectory(actions=["go north", "go north", "go east", "go south"], observations=observations, rewards=[0.0] * 4)
    assert failure_point(traj, spec=spec, reflect_on_stall=True) == (2, True)
