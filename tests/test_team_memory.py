"""Lifelong team memory: the three memories, topologies, consolidation, retrieval, metrics."""

from __future__ import annotations

import json
import math
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from forge.engine.memory import Memory
from forge.engine.recall import approx_tokens
from forge.errors import ConfigError, NotFoundError, ValidationError
from forge.learn.prompt import render_unit
from forge.learn.reflect import Reflection, RuleEdit
from forge.learn.rules import parse as parse_rule
from forge.learn.rules import write as write_rule
from forge.llm.testing import ScriptedLLM
from forge.model import Context, Kind, Scope, Status, Unit, Viewer
from forge.store import Filter
from forge.team import (
    Action,
    Consolidator,
    MemoryLayout,
    Outcome,
    Scoreboard,
    TaskLesson,
    TeamMemory,
    cluster_vectors,
    consolidate,
    rho,
    task_lesson,
)

LOCKS = "Check pg_locks for blocked sessions before blaming the disk."
VACUUM = "Dead tuples pile up when autovacuum is off; run vacuum analyze on the table."
AGENTS = ["planner", "dba", "analyst"]
HOLE = write_rule("You are at row 1, col 0", "down", ["right"])  # a rule as forge.learn.reflect writes it
MOVES = ["left", "down", "right", "up"]


def team(memory: Memory, layout: str = "shared", llm: ScriptedLLM | None = None) -> TeamMemory:
    return TeamMemory(memory, team="red", agents=AGENTS, layout=layout, llm=llm)


def lesson(text: str, diagnosis: str | None = None) -> TaskLesson:
    return TaskLesson((text,), diagnosis, "test")


def record(tm: TeamMemory, task: str, text: str, *, ok: bool, members=None, task_type="locks", **kw):
    members = members or list(tm.agents)
    return tm.record_task(
        task=task,
        outcome=Outcome(success=ok, score=1.0 if ok else 0.0, messages=4),
        actions=[Action(agent=a, text=f"{a} looked at {task}", role=a) for a in members],
        team=members,
        task_type=task_type,
        lesson=lesson(text, None if ok else "it broke"),
        **kw,
    )


def procedure_llm() -> ScriptedLLM:
    return ScriptedLLM(
        lambda req: json.dumps({"title": "Diagnose lock waits", "knowledge": "Query pg_locks, find the blocker, end it."})
    )


# -- the pieces ----------------------------------------------------------------------------


def test_memory_layout_presets_follow_the_paper() -> None:
    assert MemoryLayout.parse("hybrid") == MemoryLayout(episodic="local", procedural="shared", transactive="both")
    assert MemoryLayout.parse("local") == MemoryLayout("local", "local", "local")
    assert MemoryLayout.parse("shared") == MemoryLayout("shared", "shared", "shared")
    custom = MemoryLayout.parse("episodic=shared,procedural=local")
    assert (custom.episodic, custom.procedural, custom.transactive) == ("shared", "local", "local")
    assert str(MemoryLayout.parse("hybrid")) == "hybrid"
    with pytest.raises(ConfigError):
        MemoryLayout.parse("mesh")
    with pytest.raises(ConfigError):
        MemoryLayout(episodic="everyone")


def test_task_lesson_comes_from_the_library_reflection() -> None:
    failed = Outcome(success=False, errors=("fell into a hole",))
    acts = [Action("dba", "down")]
    refl = Reflection(edits=(RuleEdit("actor", (), (HOLE,)),))
    got = task_lesson(refl, task="cross the lake", actions=acts, outcome=failed, diagnosis="step 2 by dba: down fell")
    assert (got.lessons, got.diagnosis, got.source) == ((HOLE,), "step 2 by dba: down fell", "llm")
    fallback = Reflection(edits=(RuleEdit("actor", (), (HOLE,)),), fallback=True, error="no LLM")
    assert task_lesson(fallback, task="t", actions=acts, outcome=failed).source == "fallback"
    # A reflection with no rule left, and a failure without one: recorded from the outcome.
    empty = task_lesson(Reflection(), task="t", actions=acts, outcome=failed)
    assert empty.source == "record" and empty.diagnosis == "fell into a hole" and "down" in empty.lessons[0]
    won = task_lesson(None, task="t", actions=acts, outcome=Outcome(success=True, score=1.0))
    # Without a trajectory there are no situations to write it in: the actions used, once each.
    assert won.source == "record" and won.diagnosis is None and "this worked in 1 step, using: down." in won.lessons[0]
    assert won.steps == 1 and won.parts == ()
    assert TaskLesson.from_dict(got.to_dict()) == got
    with pytest.raises(ValidationError):
        TaskLesson.from_dict({"nope": 1})


def test_record_task_writes_an_episode_with_the_paper_fields(memory: Memory) -> None:
    tm = team(memory, "shared")
    rec = tm.record_task(
        task="Inserts are slow on table orders",
        outcome=Outcome(success=False, score=0.2, metrics={"latency_ms": 900.0}, errors=("timeout",)),
        actions=[Action("dba", "SELECT * FROM pg_stat_activity", role="dba")],
        team=["planner", "dba"],
        task_type="insert_large_data",
    )
    (uid,) = rec.episode_units
    u = memory.store.get(uid, viewer=Viewer.admin())
    assert u.kind is Kind.EPISODE and str(u.scope) == "group:red"
    m = u.meta
    assert m["team"] == ["planner", "dba"] and m["actions"][0]["text"].startswith("SELECT")
    assert m["outcome"]["metrics"] == {"latency_ms": 900.0} and m["outcome"]["errors"] == ["timeout"]
    assert 1 <= len(m["lessons"]) <= 2 and m["diagnosis"] == "timeout" and u.importance == 0.3
    ep = memory.store.get_episode(rec.episode_id)
    assert ep.steps[0].action.startswith("SELECT") and ep.outcome["success"] is False
    assert tm.tasks_recorded == 1
    with pytest.raises(ValidationError):
        tm.record_task(task="x", outcome=Outcome(success=True), team=["stranger"])
    with pytest.raises(ValidationError):
        Outcome(success=True, score=float("inf"))
    with pytest.raises(NotFoundError):
        tm.record_task(task="x", outcome=Outcome(success=True), used=["no-such-unit"])
    assert tm.tasks_recorded == 1  # refused input wrote nothing
    assert memory.store.count(viewer=Viewer.admin(), filter=Filter.make(kinds=[Kind.EPISODE])) == 1


def test_reflected_rules_become_units_that_name_their_situation(memory: Memory) -> None:
    tm = team(memory, "local")
    first = record(tm, "cross the lake", HOLE, ok=False, members=["dba", "analyst"], rules=[HOLE])
    assert len(first.rule_units) == 2  # one per local pool, like the episode
    rule = memory.store.get(first.rule_units[0], viewer=Viewer.admin())
    assert rule.kind is Kind.RULE and rule.owner == "dba" and rule.context.role == "actor"
    assert rule.rule.when == parse_rule(HOLE).when  # as forge.learn.reflect stores rules
    again = record(tm, "cross the lake again", HOLE, ok=False, members=["dba"], rules=[HOLE])
    assert again.rule_units == ()  # a pool never holds the same rule twice
    got = tm.recollect("dba", "cross the lake", valid_actions=MOVES)
    assert rule.id in got.ids and "## Rules" in got.block
    assert [u.id for u in got.now("You are at row 1, col 0")] == [rule.id]  # repeated at that step
    assert got.now("You are at row 3, col 3") == []
    # A rule reflection deleted is archived, not lost.
    record(tm, "third try", "x" * 12, ok=False, members=["dba"], retire=[rule.id])
    assert memory.store.get(rule.id, viewer=Viewer.admin()).status is Status.ARCHIVED
    assert rule.id not in tm.recollect("dba", "cross the lake", valid_actions=MOVES).ids


# -- consolidation ---------------------------------------------------------------------------


def test_cluster_threshold_is_inclusive_at_072() -> None:
    def at(cos: float) -> list[float]:
        return [cos, math.sqrt(1 - cos * cos)]

    assert len(cluster_vectors(np.array([[1.0, 0.0], at(0.73)]), threshold=0.72)) == 1
    assert len(cluster_vectors(np.array([[1.0, 0.0], at(0.71)]), threshold=0.72)) == 2
    (c,) = cluster_vectors(np.array([[1.0, 0.0], at(0.73)]))
    assert c[1] == (1, pytest.approx(0.73, abs=1e-3))


def test_consolidation_generalises_clusters_with_a_success_and_seeds_counts(memory: Memory) -> None:
    tm = team(memory, "shared")
    record(tm, "orders updates hang", LOCKS, ok=True)
    record(tm, "payments updates hang", LOCKS, ok=False)
    record(tm, "users updates hang", LOCKS, ok=True)
    record(tm, "table bloated", VACUUM, ok=False, task_type="vacuum")
    llm = procedure_llm()
    report = consolidate(tm, llm=llm)
    assert report.episodes == 4 and len(report.clusters) == 2
    gen, skipped = report.clusters
    assert gen.action == "generalised" and (gen.successes, gen.failures) == (2, 1) and gen.author == "llm"
    assert skipped.action == "skipped" and "no success" in skipped.reason
    (p,) = tm.procedures()
    assert p.id == gen.procedure and (p.successes, p.failures) == (2, 1) and p.rho == pytest.approx(2 / 3)
    assert p.title == "Diagnose lock waits" and len(p.sources) == 3 and p.scope == "group:red"
    assert p.validation == pytest.approx(3 / 5)  # what Memory.record_use gives 2 wins, 1 loss
    # The LLM saw the successful episodes only.
    prompt = llm.last_request.messages[-1].content
    assert "orders" in prompt and "users" in prompt and "payments" not in prompt


def test_consolidation_shows_at_most_five_successes_and_falls_back(memory: Memory) -> None:
    tm = team(memory, "shared")
    for i in range(7):
        record(tm, f"task number {i} hangs", LOCKS, ok=True)
    llm = ScriptedLLM(["not json"], repeat_last=True)
    report = consolidate(tm, llm=llm, max_successes=5)
    (c,) = report.clusters
    assert c.successes == 7  # counts are seeded from the whole cluster ...
    assert llm.requests[0].messages[-1].content.count("Task:") == 5  # ... the LLM sees five
    assert c.author == "fallback" and "fallback" in c.reason
    (p,) = tm.procedures()
    assert p.title == "locks" and LOCKS in p.knowledge


COIN = "when in a room with a coin, take coin, as the goal says"
AWAY = "other moves: the way the goal names, in its order, none to the way back"
WALK = ["go west", "go north", "take coin"]


def record_win(tm: TeamMemory, task: str, parts: list[str], steps: int, walk: list[str] = WALK, env: str = "textworld:coin-1"):
    """A success with a record lesson made of these situated parts, as forge.team.lessons writes it."""
    text = f"For tasks like '{task}', this worked (solved in {steps} steps): {'; '.join(parts)}."
    return tm.record_task(
        task=task, outcome=Outcome(success=True, score=1.0), actions=[Action("dba", a) for a in walk], team=["dba"],
        task_type="coin", env=env, lesson=TaskLesson((text,), None, "record", parts=tuple(parts), steps=steps),
    )


def test_fallback_procedure_composes_the_lessons_parts_most_shared_first(memory: Memory) -> None:
    tm = team(memory, "shared")
    record_win(tm, "coin task (level 0)", [COIN, AWAY], 3)
    record_win(tm, "coin task (level 0)", [COIN], 5, walk=["go east", "go south", "take coin"])
    (c,) = consolidate(tm).clusters
    (p,) = tm.procedures()
    assert c.author == "fallback" and p.title == "coin"
    assert p.knowledge == (
        "Solved 2 times in 3 to 5 steps. When in a room with a coin, take coin, as the goal says. "
        "Other moves: the way the goal names, in its order, none to the way back (1 of 2)."
    )
    episode = memory.store.get(c.episodes[0], viewer=Viewer.admin())
    assert episode.meta["lesson_parts"] == [COIN, AWAY] and episode.meta["lesson_steps"] == 3
    # A lesson written as its walk (before lessons were situated) is left out, and said so.
    tm2 = TeamMemory(memory, team="blue", agents=AGENTS, layout="shared")
    tm2.record_task(task="coin task (level 0)", outcome=Outcome(success=True), actions=[Action("dba", a) for a in WALK],
                    team=["dba"], task_type="coin", lesson=lesson("For tasks like 'coin', this worked: go west; go north; take coin."))
    (old,) = consolidate(tm2).clusters
    assert "part dropped: lists one game's moves ('go west; go north; take coin')" in old.reason
    assert tm2.procedures()[0].knowledge == "Repeat what worked."


def test_a_model_procedure_that_lists_a_walk_is_refused_for_the_composed_one(memory: Memory) -> None:
    tm = team(memory, "shared")
    record_win(tm, "coin task (level 0)", [COIN, AWAY], 3)
    walk = ScriptedLLM([json.dumps({"title": "Coin", "knowledge": "Go West, go north and take coin."})], repeat_last=True)
    (c,) = consolidate(tm, llm=walk).clusters
    ask = walk.requests[0].messages[-1].content
    assert "in the goal's and the situations' terms" in ask and "never the sequence of moves of one game" in ask
    assert c.author == "fallback" and "refused: it lists one game's moves ('Go West, go north and take coin')" in c.reason
    (p,) = tm.procedures()
    assert "go west" not in p.knowledge.lower() and COIN in p.knowledge.lower()
    # Moves named out of the order of any episode's walk are not that walk: kept.
    tm2 = TeamMemory(memory, team="blue", agents=AGENTS, layout="shared")
    record_win(tm2, "coin task (level 0)", [COIN], 3)
    fine = ScriptedLLM([json.dumps({"title": "Coin", "knowledge": "Take coin when it is there; else go west, go north as told."})])
    (ok,) = consolidate(tm2, llm=fine).clusters
    assert ok.author == "llm" and "refused" not in ok.reason, ok.reason


def test_a_model_procedure_is_held_to_the_envs_names(memory: Memory) -> None:
    from forge.envs.base import EnvSpec

    spec = EnvSpec(
        name="textworld:coin-1", description="", max_steps=30, tau=-0.5, theta=1.0, success_return=1.0,
        major_failure_return=-1.0, abstract=lambda t: t.replace("the steam room", "a room"),
        instance_terms=lambda t: [w for w in ("Zork", "steam room") if w in t],
    )
    specs = {spec.name: spec}.get
    tm = team(memory, "shared")
    record_win(tm, "coin task (level 0)", [COIN], 3)
    repaired = ScriptedLLM([json.dumps({"title": "Coin", "knowledge": "Walk to the steam room and take coin."})])
    (c,) = consolidate(tm, llm=repaired, specs=specs).clusters
    assert c.author == "llm" and "model's procedure repaired: names made general" in c.reason
    assert tm.procedures()[0].knowledge == "Walk to a room and take coin."
    record_win(tm, "coin task (level 0)", [COIN], 4)
    named = ScriptedLLM([json.dumps({"title": "Coin", "knowledge": "Ask Zork where the coin lies, then take coin."})])
    report = consolidate(tm, llm=named, specs=specs)
    (c2,) = report.generalised
    assert c2.author == "fallback" and "refused: it names what holds in this task only (Zork)" in c2.reason
    assert "Zork" not in memory.store.get(c2.procedure, viewer=Viewer.admin()).content


def test_pruning_archives_strict_subsets_with_the_reason(memory: Memory) -> None:
    tm = team(memory, "shared")
    record(tm, "orders updates hang", LOCKS, ok=True)
    record(tm, "users updates hang", LOCKS, ok=True)
    first = consolidate(tm).generalised[0].procedure
    again = consolidate(tm)
    assert [c.action for c in again.clusters] == ["unchanged"] and not again.pruned
    record(tm, "payments updates hang", LOCKS, ok=False)
    third = consolidate(tm)
    (newer,) = third.generalised
    assert (newer.successes, newer.failures) == (2, 1)
    (pruned,) = third.pruned
    assert pruned["procedure"] == first and pruned["subset_of"] == newer.procedure
    old = memory.store.get(first, viewer=Viewer.admin())
    assert old.status is Status.ARCHIVED  # archived, not deleted
    assert [p.id for p in tm.procedures()] == [newer.procedure]
    assert len(tm.procedures(include_archived=True)) == 2
    status = [e for e in memory.store.events(unit_id=first, viewer=Viewer.admin()) if e.op == "status"]
    assert "strict subset" in status[-1].data["reason"]


def test_consolidation_is_observable_in_the_event_log(memory: Memory) -> None:
    tm = team(memory, "shared")
    a = record(tm, "orders updates hang", LOCKS, ok=True)
    report = consolidate(tm)
    pid = report.generalised[0].procedure
    mine = [e for e in memory.store.events(viewer=Viewer.admin()) if e.actor == f"consolidate:{report.run_id}"]
    ops = [e.op for e in mine]
    assert ops[0] == "add" and mine[0].unit_id == pid and "relate" in ops and ops[-1] == "episode"
    (rel,) = [r for r in memory.store.relations(pid, viewer=Viewer.admin()) if r.type.value == "derived_from"]
    assert rel.dst == a.episode_units[0] and "cluster 0" in rel.note
    stored = memory.store.get_episode(report.record_id)
    assert stored.outcome["generalised"] == [pid] and stored.outcome["clusters"][0]["action"] == "generalised"


def test_a_task_whose_recording_fails_part_way_leaves_nothing_written(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    tm = team(memory, "hybrid")
    record(tm, "orders updates hang", LOCKS, ok=True)
    pid = consolidate(tm).generalised[0].procedure
    before = list(memory.export(viewer=Viewer.admin()))

    def broken(*args: object, **kw: object) -> None:
        raise RuntimeError("disk gone")  # after the episode, its units and rules, before profiles and credit

    monkeypatch.setattr(TeamMemory, "_observe", broken)
    with pytest.raises(RuntimeError):
        record(tm, "users updates hang", LOCKS, ok=False, rules=[HOLE], used=[pid])
    assert list(memory.export(viewer=Viewer.admin())) == before  # no episode, unit, rule, event or credit
    assert tm.tasks_recorded == 1
    monkeypatch.undo()
    again = record(tm, "users updates hang", LOCKS, ok=False, rules=[HOLE], used=[pid])
    assert again.task_index == 2 and again.rule_units and again.credited == (pid,)


def test_outcome_credit_goes_through_memory_record_use(memory: Memory) -> None:
    tm = team(memory, "shared")
    record(tm, "orders updates hang", LOCKS, ok=True)
    pid = consolidate(tm).generalised[0].procedure
    tm.record_use([pid], success=False)
    tm.record_use([pid], success=False)
    (p,) = tm.procedures()
    assert (p.successes, p.failures, p.uses) == (1, 2, 2) and p.rho == pytest.approx(rho(1, 2))
    assert p.validation == pytest.approx((1 + 1) / (2 + 3))  # the engine's one formula
    assert rho(0, 0) == 0.0 and rho(3, 0) == pytest.approx(1.0, abs=1e-6)
    ep = record(tm, "users updates hang", LOCKS, ok=True, used=[pid])
    assert ep.credited == (pid,) and tm.procedures()[0].successes == 2
    with pytest.raises(NotFoundError):
        tm.record_use([pid, "nope"], success=True)
    assert tm.procedures()[0].successes == 2  # nothing half-written


def test_consolidating_the_same_episodes_again_writes_the_same_procedure(tmp_path: Path) -> None:
    ids = []
    for run in ("a", "b"):
        with Memory.open(tmp_path / f"{run}.db", embedder="hash") as m:
            tm = team(m, "shared")
            record(tm, "orders updates hang", LOCKS, ok=True)
            record(tm, "users updates hang", LOCKS, ok=True)
            ids.append([c.procedure for c in consolidate(tm).generalised])
    assert ids[0] == ids[1] and ids[0][0]  # a resumed run writes (and credits) the same ids


def test_background_consolidator_runs_every_n_tasks(memory: Memory) -> None:
    tm = team(memory, "shared")
    with Consolidator(tm, every=2, background=True) as cons:
        record(tm, "orders updates hang", LOCKS, ok=True)
        assert cons.task_done() is None
        record(tm, "users updates hang", LOCKS, ok=True)
        fut = cons.task_done()
        assert isinstance(fut, Future)
        reports = cons.wait()
    assert len(reports) == 1 and reports[0].generalised and fut.result() is reports[0]
    inline = Consolidator(tm, every=1)
    assert inline.task_done() is not None and len(inline.reports) == 1
    with pytest.raises(ValidationError):
        Consolidator(tm, every=0)


# -- prompts ------------------------------------------------------------------------------------


def procedure(memory: Memory, text: str, *, successes: int, failures: int, created: float) -> str:
    """A consolidated procedure with this track record (the counts record_use moves)."""
    unit = Unit(
        content=text,
        kind=Kind.PROCEDURE,
        scope=Scope("group", "red"),
        created_at=created,
        validation=(1 + successes) / (2 + successes + failures),
        importance=1.0,
        meta={"title": text.split(":")[0], "knowledge": text, "successes": successes, "failures": failures},
        context=Context(tags=("team:red", "layer:procedural")),
    )
    return memory.add(unit)[0]


def room_for(unit: Unit, section: str = "procedures") -> int:
    """A token budget that holds this unit's line and its section header, and no more."""
    return approx_tokens(render_unit(unit)) + approx_tokens(f"## {section}") + 1


def test_prompt_is_written_by_recollect_procedures_first(memory: Memory) -> None:
    tm = team(memory, "shared")
    record(tm, "orders updates hang", LOCKS, ok=True)
    pid = consolidate(tm, llm=procedure_llm()).generalised[0].procedure
    got = tm.recollect("dba", LOCKS)
    assert pid in got.ids and got.block.startswith("## Procedures\n- Diagnose lock waits")
    assert got.block.index("## Procedures") < got.block.index("## Past tasks")
    assert "(worked 1 of 1 times)" in got.block  # the track record, from the counts
    assert tm.recollect("dba", "   ").ids == []


def test_a_better_success_record_wins_the_prompt(memory: Memory) -> None:
    tm = team(memory, "shared")
    good = procedure(memory, "Lock waits: query pg_locks, find the blocker, end it (A).", successes=5, failures=0, created=1.0)
    bad = procedure(memory, "Lock waits: query pg_locks, find the blocker, end it (B).", successes=0, failures=5, created=2.0)
    query = "lock waits pg_locks blocker"
    got = tm.recollect("dba", query)
    assert [r.unit.id for r in got.candidates] == [good, bad]  # ranked by what they earned
    one = room_for(got.shown[0])  # one procedure only: the better record is the one shown
    assert tm.recollect("dba", query, budget=one).ids == [good]
    for _ in range(8):  # outcomes move prompts: the good one keeps failing, the bad one wins
        tm.record_use([good], success=False)
        tm.record_use([bad], success=True)
    assert tm.recollect("dba", query, budget=one).ids == [bad]


# -- layouts ------------------------------------------------------------------------------------


def test_local_agents_never_see_each_others_units(memory: Memory) -> None:
    tm = team(memory, "local")
    rec = record(tm, "orders updates hang", LOCKS, ok=True, members=["dba"], rules=[HOLE])
    (uid,) = rec.episode_units
    assert memory.store.get(uid, viewer=Viewer.admin()).owner == "dba"
    eps = Filter.make(kinds=[Kind.EPISODE])
    assert [u.id for u in memory.store.list(viewer=tm.viewer("dba"), filter=eps)] == [uid]
    assert memory.store.list(viewer=tm.viewer("analyst"), filter=eps) == []
    mine = tm.recollect("dba", LOCKS)
    assert uid in mine.ids and set(rec.rule_units) <= set(mine.ids)
    # Local procedures: the dba's consolidation is the dba's alone.
    report = consolidate(tm)
    (pid,) = [c.procedure for c in report.generalised]
    assert memory.store.get(pid, viewer=Viewer.admin()).owner == "dba"
    assert tm.procedures(agent="analyst") == [] and len(tm.procedures(agent="dba")) == 1
    assert pid in tm.recollect("dba", LOCKS).ids
    # The analyst's prompt holds none of it, whatever it asks for, in any layer.
    for query in (LOCKS, "orders updates hang", HOLE):
        for layers in (("procedural", "episodic"), ("transactive",)):
            theirs = tm.recollect("analyst", query, layers=layers)
            assert theirs.ids == [] and theirs.block == ""


def test_local_pools_each_get_the_tasks_lesson(memory: Memory) -> None:
    tm = team(memory, "local")
    rec = tm.record_task(
        task="t", outcome=Outcome(success=True), team=["dba", "analyst"],
        actions=[Action("dba", "ran vacuum"), Action("analyst", "read the logs")],
    )
    assert len(rec.episode_units) == 2 and rec.lesson.source == "record"
    owners = {memory.store.get(u, viewer=Viewer.admin()).owner for u in rec.episode_units}
    assert owners == {"dba", "analyst"}


def test_hybrid_layers_have_their_own_pools(memory: Memory) -> None:
    tm = team(memory, "hybrid")
    record(tm, "orders updates hang", LOCKS, ok=True, members=["dba", "analyst"])
    record(tm, "users updates hang", LOCKS, ok=True, members=["dba"])
    eps = memory.store.list(viewer=Viewer.admin(), filter=Filter.make(kinds=[Kind.EPISODE]))
    assert {str(u.scope) for u in eps} == {"private"} and len(eps) == 3
    report = consolidate(tm)
    (c,) = report.generalised  # one shared procedure learned from everyone's episodes
    assert c.pool == "group:red" and len(c.sources) == 2 and c.successes == 2  # per task, not per copy
    assert [p.id for p in tm.procedures(agent="planner")] == [c.procedure]
    # Episodic stays local: the planner (no episodes of its own) sees the shared procedure only.
    got = tm.recollect("planner", LOCKS)
    assert got.ids == [c.procedure] and "## Past tasks" not in got.block
    assert "## Past tasks" in tm.recollect("dba", LOCKS).block
    # Transactive is both: own notes plus team notes, never another agent's own notes.
    scopes = {(str(u.scope), u.owner) for u in tm.profiles(agent="analyst")}
    assert ("group:red", "") in scopes and ("private", "analyst") in scopes
    assert all(owner in ("", "analyst") for _, owner in scopes)
    who = tm.recollect("analyst", "locks dba analyst", layers=("transactive",)).block
    assert "[own notes]" in who and "[team notes]" in who
    assert "[own notes]" not in tm.recollect("planner", "locks dba analyst", layers=("transactive",)).block


def test_shared_layout_is_one_pool(memory: Memory) -> None:
    tm = team(memory, "shared")
    rec = record(tm, "orders updates hang", LOCKS, ok=True, members=["dba"])
    assert len(rec.episode_units) == 1
    for agent in AGENTS:
        assert tm.recollect(agent, LOCKS).ids == list(rec.episode_units)
    other = TeamMemory(memory, team="blue", agents=["dba"], layout="shared")
    assert other.recollect("dba", LOCKS).ids == []  # another team's pool is invisible


# -- transactive -------------------------------------------------------------------------------


def test_transactive_profiles_say_who_knows_what(memory: Memory) -> None:
    tm = team(memory, "shared")
    for i, ok in enumerate([True, True, False]):
        tm.record_task(
            task=f"locks {i}",
            outcome=Outcome(success=ok, score=0.9 if ok else 0.1, per_agent={"dba": True, "analyst": ok}, messages=6),
            actions=[Action("dba", "x", role="database expert"), Action("analyst", "y")],
            team=["dba", "analyst"],
            task_type="lock_contention",
            lesson=lesson(LOCKS, None if ok else "why"),
        )
    got = tm.recollect("planner", "lock_contention: who should do it?", layers=("transactive",))
    text = got.block
    assert text.startswith("## Who knows what\n") and len(got.ids) == 3
    assert "dba (database expert): reliability 1.00 (3/3 subtasks); good at: lock_contention 3/3" in text
    assert "analyst: reliability 0.67 (2/3 subtasks)" in text and "with partners: dba 2/3" in text
    assert "analyst+dba: suits lock_contention (avg 0.63 over 3)" in text and "overhead 6.0 messages/task" in text
    assert all(u.kind is Kind.PROFILE for u in got.shown)  # the actors' layers stay out
    budget = max(room_for(u, "who knows what") for u in got.shown)
    short = tm.recollect("planner", "lock_contention: who should do it?", layers=("transactive",), budget=budget)
    assert 0 < len(short.ids) < 3
    profiles = memory.store.list(viewer=Viewer.admin(), filter=Filter.make(kinds=[Kind.PROFILE]))
    assert len(profiles) == 3  # upserted, not appended


def test_task_count_survives_reopening(tmp_path: Path) -> None:
    with Memory.open(tmp_path / "r.db", embedder="hash") as m:
        tm = team(m, "local")
        record(tm, "a", LOCKS, ok=True)
        record(tm, "b", LOCKS, ok=True)
    with Memory.open(tmp_path / "r.db") as m:
        tm = team(m, "local")
        assert tm.tasks_recorded == 2
        assert Consolidator(tm, every=3).task_done() is not None  # third task since the start
        episodes = Filter.make(kinds=[Kind.EPISODE], status=list(Status))
        assert m.store.count(viewer=Viewer.admin(), filter=episodes) == 6  # 2 tasks x 3 local pools


# -- metrics -----------------------------------------------------------------------------------


def test_scoreboard_j_ap_aip_and_tokens() -> None:
    board = Scoreboard()
    s1 = board.add(ts=1.0, cs=0.0, tokens_in=100, tokens_out=10)
    s2 = board.add(ts=1.0, cs=1.0, tokens_in=50, tokens_out=5)
    assert (s1.j, s1.ap) == (0.5, 0.5) and (s2.j, s2.ap) == (1.0, 0.75)
    assert board.ap == 0.75 and board.aip == pytest.approx((0.5 + 0.75) / 2)
    assert (board.tokens_in, board.tokens_out) == (150, 15)
    again = Scoreboard.from_dict(json.loads(json.dumps(board.to_dict())))
    assert again.history == board.history
    assert Scoreboard().aip == 0.0
    with pytest.raises(ValidationError):
        board.add(ts=float("nan"), cs=0.0)
    with pytest.raises(ValidationError):
        board.add(ts=1.0, cs=0.0, tokens_in=-1)
