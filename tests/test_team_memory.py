"""Lifelong team memory: the three memories, topologies, consolidation, retrieval, metrics."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from forge.errors import ConfigError, NotFoundError, ValidationError
from forge.llm.testing import ScriptedLLM
from forge.memory import Memory
from forge.model import Kind, Status, Viewer
from forge.store import Filter
from forge.team import (
    Action,
    Consolidator,
    Outcome,
    Reflection,
    RetrievalConfig,
    Scoreboard,
    TeamMemory,
    Topology,
    cluster_vectors,
    consolidate,
    retrieve,
    rho,
    write_reflection,
)

LOCKS = "Check pg_locks for blocked sessions before blaming the disk."
VACUUM = "Dead tuples pile up when autovacuum is off; run vacuum analyze on the table."
AGENTS = ["planner", "dba", "analyst"]


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    m = Memory.open(tmp_path / "team.db", embedder="hash")
    yield m
    m.close()


def team(memory: Memory, topology: str = "shared", llm: ScriptedLLM | None = None) -> TeamMemory:
    return TeamMemory(memory, team="red", agents=AGENTS, topology=topology, llm=llm)


def lesson(text: str, diagnosis: str | None = None) -> Reflection:
    return Reflection((text,), diagnosis, "test")


def record(tm: TeamMemory, task: str, text: str, *, ok: bool, members=None, task_type="locks", **kw):
    members = members or list(tm.agents)
    refl = {who: lesson(text, None if ok else "it broke") for who in [*members, "team"]}
    return tm.record_task(
        task=task,
        outcome=Outcome(success=ok, score=1.0 if ok else 0.0, messages=4),
        actions=[Action(agent=a, text=f"{a} looked at {task}", role=a) for a in members],
        team=members,
        task_type=task_type,
        reflections=refl,
        **kw,
    )


def procedure_llm() -> ScriptedLLM:
    return ScriptedLLM(
        lambda req: json.dumps({"title": "Diagnose lock waits", "knowledge": "Query pg_locks, find the blocker, end it."})
    )


# -- the pieces ----------------------------------------------------------------------------


def test_topology_presets_follow_the_paper() -> None:
    assert Topology.parse("hybrid") == Topology(episodic="local", procedural="shared", transactive="both")
    assert Topology.parse("local") == Topology("local", "local", "local")
    assert Topology.parse("shared") == Topology("shared", "shared", "shared")
    custom = Topology.parse("episodic=shared,procedural=local")
    assert (custom.episodic, custom.procedural, custom.transactive) == ("shared", "local", "local")
    assert str(Topology.parse("hybrid")) == "hybrid"
    with pytest.raises(ConfigError):
        Topology.parse("mesh")
    with pytest.raises(ConfigError):
        Topology(episodic="everyone")


def test_reflection_from_llm_and_deterministic_fallback() -> None:
    failed = Outcome(success=False, errors=("deadlock detected",))
    good = ScriptedLLM(['{"lessons": ["Look for lock waits first."], "diagnosis": "a long transaction held the lock"}'])
    r = write_reflection(good, task="slow updates", actions=[Action("dba", "ran EXPLAIN")], outcome=failed)
    assert (r.source, r.lessons, r.diagnosis) == ("llm", ("Look for lock waits first.",), "a long transaction held the lock")

    junk = ScriptedLLM(["no idea"], repeat_last=True)
    r = write_reflection(junk, task="slow updates", actions=[Action("dba", "ran EXPLAIN")], outcome=failed)
    assert r.source == "fallback" and "LLM failed" in r.error
    assert r.diagnosis == "deadlock detected" and "ran EXPLAIN" in r.lessons[0]

    # A failure reflection without a diagnosis is unusable too.
    nodiag = ScriptedLLM(['{"lessons": ["Look for lock waits first."], "diagnosis": ""}'])
    assert write_reflection(nodiag, task="t", actions=[], outcome=failed).source == "fallback"

    r = write_reflection(None, task="t", actions=[], outcome=Outcome(success=True, score=1.0))
    assert r.source == "fallback" and r.diagnosis is None and len(r.lessons) == 1


def test_record_task_writes_an_episode_with_the_paper_fields(memory: Memory) -> None:
    tm = team(memory, "shared", llm=ScriptedLLM(repeat_last=True))  # obeys the schema: an 'xxxxxxxx' lesson
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
    assert 1 <= len(m["lessons"]) <= 2 and m["diagnosis"] and u.importance == 0.3
    ep = memory.store.get_episode(rec.episode_id)
    assert ep.steps[0].action.startswith("SELECT") and ep.outcome["success"] is False
    assert tm.tasks_recorded == 1
    with pytest.raises(ValidationError):
        tm.record_task(task="x", outcome=Outcome(success=True), team=["stranger"])
    with pytest.raises(ValidationError):
        Outcome(success=True, score=float("inf"))
    assert tm.tasks_recorded == 1  # refused input wrote nothing


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


def test_record_use_updates_counts_and_rho(memory: Memory) -> None:
    tm = team(memory, "shared")
    record(tm, "orders updates hang", LOCKS, ok=True)
    pid = consolidate(tm).generalised[0].procedure
    tm.record_use([pid], success=False)
    tm.record_use([pid], success=False)
    (p,) = tm.procedures()
    assert (p.successes, p.failures) == (1, 2) and p.rho == pytest.approx(rho(1, 2))
    assert rho(0, 0) == 0.0 and rho(3, 0) == pytest.approx(1.0, abs=1e-6)
    record(tm, "users updates hang", LOCKS, ok=True, used_procedures=[pid])
    assert tm.procedures()[0].successes == 2
    with pytest.raises(NotFoundError):
        tm.record_use([pid, "nope"], success=True)
    assert tm.procedures()[0].successes == 2  # nothing half-written


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


# -- retrieval -----------------------------------------------------------------------------------


def test_retrieval_prefers_procedures_that_pass_both_thresholds(memory: Memory) -> None:
    tm = team(memory, "shared")
    record(tm, "orders updates hang", LOCKS, ok=True)
    pid = consolidate(tm).generalised[0].procedure
    got = retrieve(tm, LOCKS, agent="dba")
    assert got.path == "procedures" and got.procedure_ids == [pid]
    assert got.items[0].parts["cosine"] >= 0.5 and "passed" in got.reason
    assert memory.store.get(pid, viewer=Viewer.admin()).access_count == 1  # times viewed

    tm.record_use([pid], success=False)
    tm.record_use([pid], success=False)  # rho 1/3 < 0.5
    got = retrieve(tm, LOCKS, agent="dba")
    assert got.path == "episodes" and "rho 0.33 < min_rho 0.5" in got.rejected[0]["reason"]
    assert "fell back" in got.reason
    strict = retrieve(tm, LOCKS, agent="dba", config=RetrievalConfig(min_rho=0.1, relevance=0.999))
    assert strict.path == "episodes" and "< relevance 0.999" in strict.rejected[0]["reason"]
    lax = retrieve(tm, LOCKS, agent="dba", config=RetrievalConfig(min_rho=0.3))
    assert lax.path == "procedures"


def test_episode_fallback_scores_recency_cosine_importance(memory: Memory) -> None:
    tm = team(memory, "shared")
    assert retrieve(tm, "anything", agent="dba").path == "none"
    record(tm, "old success", LOCKS, ok=True)
    record(tm, "new failure", LOCKS, ok=False)
    cfg = RetrievalConfig(half_life=1.0)
    got = retrieve(tm, LOCKS, agent="dba", config=cfg)
    assert got.path == "episodes" and "no procedures" in got.reason
    for s in got.items:
        p = s.parts
        assert s.score == pytest.approx(0.2 * p["recency"] + 0.4 * p["cosine"] + 0.4 * p["importance"])
    by_task = {s.unit.meta["task"]: s.parts for s in got.items}
    assert by_task["old success"]["importance"] == 1.0 and by_task["new failure"]["importance"] == 0.3
    assert by_task["new failure"]["recency"] == 1.0 and by_task["old success"]["recency"] == 0.5
    assert got.items[0].unit.meta["task"] == "old success"  # 0.2*0.5+0.4 > 0.2*1+0.12
    block = got.render(budget=200)
    assert block.startswith("## Similar past tasks") and "Root cause: it broke" in block
    tiny = got.render(budget=30)
    assert tiny.count("\n- ") < block.count("\n- ")


# -- topologies --------------------------------------------------------------------------------


def test_local_agents_never_read_each_others_episodes(memory: Memory) -> None:
    tm = team(memory, "local")
    rec = record(tm, "orders updates hang", LOCKS, ok=True, members=["dba"])
    (uid,) = rec.episode_units
    assert memory.store.get(uid, viewer=Viewer.admin()).owner == "dba"
    eps = Filter.make(kinds=[Kind.EPISODE])
    assert [u.id for u in memory.store.list(viewer=tm.viewer("dba"), filter=eps)] == [uid]
    assert memory.store.list(viewer=tm.viewer("analyst"), filter=eps) == []
    assert memory.recall(LOCKS, viewer=tm.viewer("analyst")) == []
    assert retrieve(tm, LOCKS, agent="analyst").path == "none"
    assert retrieve(tm, LOCKS, agent="dba").path == "episodes"
    # Local procedures: the dba's consolidation is the dba's alone.
    report = consolidate(tm)
    (pid,) = [c.procedure for c in report.generalised]
    assert memory.store.get(pid, viewer=Viewer.admin()).owner == "dba"
    assert tm.procedures(agent="analyst") == [] and len(tm.procedures(agent="dba")) == 1


def test_each_local_agent_reflects_on_its_own_part(memory: Memory) -> None:
    tm = team(memory, "local", llm=ScriptedLLM(repeat_last=True))
    rec = tm.record_task(
        task="t", outcome=Outcome(success=True), team=["dba", "analyst"],
        actions=[Action("dba", "ran vacuum"), Action("analyst", "read the logs")],
    )
    assert set(rec.reflections) == {"dba", "analyst"} and len(rec.episode_units) == 2
    prompts = [r.messages[-1].content for r in tm.llm.requests]
    assert "ran vacuum" in prompts[0] and "read the logs" not in prompts[0]


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
    # Episodic stays local: the planner (no episodes of its own) falls back to nothing.
    weak = RetrievalConfig(relevance=1.01)
    assert retrieve(tm, LOCKS, agent="planner", config=weak).path == "none"
    # Transactive is both: own notes plus team notes, never another agent's own notes.
    scopes = {(str(u.scope), u.owner) for u in tm.profiles(agent="analyst")}
    assert ("group:red", "") in scopes and ("private", "analyst") in scopes
    assert all(owner in ("", "analyst") for _, owner in scopes)
    assert "[own notes]" in tm.render_transactive(agent="analyst")
    assert "[own notes]" not in tm.render_transactive(agent="planner")  # it took part in nothing


def test_shared_topology_is_one_pool(memory: Memory) -> None:
    tm = team(memory, "shared")
    rec = record(tm, "orders updates hang", LOCKS, ok=True, members=["dba"])
    assert len(rec.episode_units) == 1
    for agent in AGENTS:
        assert retrieve(tm, LOCKS, agent=agent).path == "episodes"
    other = TeamMemory(memory, team="blue", agents=["dba"], topology="shared")
    assert retrieve(other, LOCKS, agent="dba").path == "none"  # another team's pool is invisible


# -- transactive -------------------------------------------------------------------------------


def test_transactive_profiles_render_who_knows_what(memory: Memory) -> None:
    tm = team(memory, "shared")
    for i, ok in enumerate([True, True, False]):
        tm.record_task(
            task=f"locks {i}",
            outcome=Outcome(success=ok, score=0.9 if ok else 0.1, per_agent={"dba": True, "analyst": ok}, messages=6),
            actions=[Action("dba", "x", role="database expert"), Action("analyst", "y")],
            team=["dba", "analyst"],
            task_type="lock_contention",
            reflections={"team": lesson(LOCKS, None if ok else "why")},
        )
    text = tm.render_transactive(agent="planner")
    assert text.startswith("## Who knows what (team red)")
    assert "dba (database expert): reliability 1.00 (3/3 subtasks); good at: lock_contention 3/3" in text
    assert "analyst: reliability 0.67 (2/3 subtasks)" in text and "with partners: dba 2/3" in text
    assert "analyst+dba: suits lock_contention (avg 0.63 over 3)" in text and "overhead 6.0 messages/task" in text
    short = tm.render_transactive(agent="planner", budget=40)
    assert len(short) < len(text) and short.startswith("## Who knows what")
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
