"""Consolidation for any memory, seed packs and warm-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import forge.team
from forge.curate import (
    ADD,
    NOOP,
    ConsolidationPolicy,
    CurationPolicy,
    WarmUp,
    cluster_vectors,
    consolidate,
    curate,
    import_seed_pack,
    read_seed_pack,
)
from forge.engine.memory import Memory
from forge.errors import ValidationError
from forge.llm.testing import ScriptedLLM
from forge.model import Kind, RelationType, Status, Unit, Viewer
from forge.store.base import ANY_STATUS as ADMIN_ALL

ADMIN = Viewer.admin()
T0 = 1_767_225_600.0
DISK = [
    "When the disk is full, then rotate the logs and compress them.",
    "When the disk is full, then rotate the logs and compress them quickly.",
    "When the disk is full, then rotate the logs and compress them today.",
]


def rules(memory: Memory) -> list[Unit]:
    units = [Unit(t, kind="rule", created_at=T0 + i, validation=0.5 + 0.1 * i) for i, t in enumerate(DISK)]
    units.append(Unit("Never deploy on Fridays without a rollback plan.", kind="rule", created_at=T0 + 9))
    memory.add(units)
    return units


def test_the_team_uses_the_one_clustering() -> None:
    assert forge.team.cluster_vectors is cluster_vectors


def test_a_cluster_becomes_one_rule_linked_to_its_sources_which_it_subsumes(memory: Memory) -> None:
    units = rules(memory)
    sources = {u.id for u in units[:3]}
    llm = ScriptedLLM(['{"title": "Full disk", "text": "When the disk is full, then rotate and compress the logs."}'])
    before = memory.store.count(viewer=ADMIN, filter=ADMIN_ALL)
    dry = consolidate(memory, policy=ConsolidationPolicy(llm=llm), now=T0 + 100, dry_run=True)
    [c] = dry.generalised
    assert set(c.members) == sources and c.author == "llm" and not dry.applied
    assert memory.store.count(viewer=ADMIN, filter=ADMIN_ALL) == before  # a dry run writes nothing
    llm = ScriptedLLM(['{"title": "Full disk", "text": "When the disk is full, then rotate and compress the logs."}'])
    report = consolidate(memory, policy=ConsolidationPolicy(llm=llm), now=T0 + 100)
    [c] = report.generalised
    gen = memory.get(c.unit_id, viewer=ADMIN)
    assert gen.kind is Kind.RULE and gen.content.startswith("Full disk:") and set(gen.provenance.derived_from) == sources
    assert gen.validation == pytest.approx(0.6)  # the members' mean: earned, not invented
    links = [r for r in memory.store.relations(gen.id, viewer=ADMIN) if r.src == gen.id]
    assert {r.dst for r in links} == sources and all(r.type is RelationType.DERIVED_FROM for r in links)
    assert {ch.unit_id for ch in report.changes} == sources  # all three sit right on the centre
    assert all(memory.get(u, viewer=ADMIN).status is Status.ARCHIVED for u in sources)
    assert memory.get(units[3].id, viewer=ADMIN).status is Status.ACTIVE
    [ev] = memory.store.events(viewer=ADMIN, unit_id=units[0].id, ops=["status"])
    assert "subsumed by generalisation " + gen.id in ev.data["reason"]


def test_without_a_model_the_central_member_speaks_and_a_rerun_writes_nothing(memory: Memory) -> None:
    units = rules(memory)
    keep = ConsolidationPolicy(subsume_at=1.0)  # nothing is that close: all members stay active
    first = consolidate(memory, policy=keep, now=T0 + 100)
    [c] = first.generalised
    assert c.author == "central member" and c.content in DISK and first.changes == []
    again = consolidate(memory, policy=keep, now=T0 + 200)
    assert [x.action for x in again.clusters] == ["unchanged"] and again.generalised == []
    assert all(memory.get(u.id, viewer=ADMIN).status is Status.ACTIVE for u in units)


def test_a_curation_pass_can_consolidate_and_say_so(memory: Memory) -> None:
    rules(memory)
    p = curate(memory, policy=CurationPolicy(decay=False), consolidate=ConsolidationPolicy(), now=T0 + 100, dry_run=True)
    assert p.counts() == {"subsumed": 3} and len(p.consolidation.generalised) == 1
    assert memory.store.count(viewer=ADMIN) == 4
    p = curate(memory, policy=CurationPolicy(decay=False), consolidate=ConsolidationPolicy(), now=T0 + 100)
    assert memory.store.count(viewer=ADMIN) == 2  # the generalisation and the unrelated rule
    assert p.counts() == {"subsumed": 3} and p.changes == []  # consolidation archived them itself
    [run] = memory.store.events(viewer=ADMIN, ops=["curate"])
    assert run.data["generalised"] == [p.consolidation.generalised[0].unit_id] and run.data["counts"] == {"subsumed": 3}


# -- seeds ---------------------------------------------------------------------------------------


def write_pack(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "pack.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = [
    json.dumps({"content": "When the tile ahead is a hole, then step around it.", "domain": "gridworld", "tags": ["safety"]}),
    json.dumps({"content": "The goal tile is marked G.", "kind": "fact", "domain": "gridworld"}),
]


def test_a_seed_pack_lands_with_source_seed_and_low_validation_once(memory: Memory, tmp_path: Path) -> None:
    path = write_pack(tmp_path, GOOD)
    got = import_seed_pack(memory, path, scope="group:ops")
    assert [d.action for d in got] == [ADD, ADD]
    units = memory.store.list(viewer=ADMIN)
    assert {u.provenance.source for u in units} == {"seed"} and {u.validation for u in units} == {0.3}
    assert {str(u.scope) for u in units} == {"group:ops"} and all(u.meta["seed_pack"] == "pack.jsonl" for u in units)
    again = import_seed_pack(memory, path, scope="group:ops")
    assert [d.action for d in again] == [NOOP, NOOP] and memory.store.count(viewer=ADMIN) == 2


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "pack.jsonl:2: malformed JSON"),
        ('{"content": "x", "colour": "red"}', "pack.jsonl:2: unknown seed field(s): colour"),
        ('{"kind": "rule"}', "pack.jsonl:2: a seed needs 'content'"),
        ('{"content": "x", "kind": "gizmo"}', "pack.jsonl:2: unknown kind 'gizmo'"),
        ("[1, 2]", "pack.jsonl:2: a seed line must be a JSON object"),
    ],
)
def test_a_bad_seed_line_is_named_and_nothing_lands(memory: Memory, tmp_path: Path, line: str, message: str) -> None:
    path = write_pack(tmp_path, [GOOD[0], line])
    with pytest.raises(ValidationError) as err:
        import_seed_pack(memory, path)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert memory.store.count(viewer=ADMIN) == 0


def test_warm_up_hides_shared_memory_until_it_is_earned() -> None:
    shared = Unit("peer rule", kind="rule", validation=0.4)
    mine = Unit("my note", scope="private", owner="ann", validation=0.1)
    w = WarmUp(after_episodes=3, min_validation=0.5, ramp_episodes=4)
    assert w.shows(mine, agent="ann", episodes=0) and not w.shows(shared, agent="ann", episodes=0)
    assert not w.shows(shared, agent="ann", episodes=5)  # not validated enough yet
    assert w.shows(shared.replace(validation=0.6), agent="ann", episodes=3)
    sections = ["rules", "examples", "facts", "episodes"]
    assert [len(w.sections(sections, episodes=e)) for e in (0, 1, 2, 4, 9)] == [1, 1, 2, 4, 4]
    assert WarmUp().shows(shared, agent="ann", episodes=0) and WarmUp().sections(sections, episodes=0) == sections
    with pytest.raises(ValidationError):
        read_seed_pack([], name="empty.jsonl")



def test_the_public_api_is_exact_and_importable() -> None:
    import forge.curate

    assert all(hasattr(forge.curate, name) for name in forge.curate.__all__)
    assert len(forge.curate.__all__) == len(set(forge.curate.__all__))


def test_episodes_generalise_into_a_procedure_and_places_never_mix(memory: Memory) -> None:
    eps = [Unit(f"Opened the jammed vault by resetting the dial twice, try {i}.", kind="episode", owner="ann",
                scope="private", created_at=T0 + i) for i in range(3)]
    other = [Unit(f"Opened the jammed vault by resetting the dial twice, try {i}.", kind="episode", owner="bob",
                  scope="private", created_at=T0 + i) for i in range(2)]
    memory.add([*eps, *other])
    report = consolidate(memory, policy=ConsolidationPolicy(threshold=0.7, subsume_at=1.0), now=T0 + 10)
    [c] = report.generalised  # bob's two are another agent's private place, and too few
    gen = memory.get(c.unit_id, viewer=ADMIN)
    assert gen.kind is Kind.PROCEDURE and gen.owner == "ann" and str(gen.scope) == "private"
    assert set(gen.provenance.derived_from) == {u.id for u in eps}


def test_the_teams_procedures_are_a_policy_of_the_one_engine(memory: Memory) -> None:
    from forge.team import Outcome, TaskLesson, TeamMemory
    from forge.team.consolidate import ProcedurePolicy

    tm = TeamMemory(memory, team="red", agents=["dba"], layout="shared")
    for task in ("orders updates hang", "users updates hang"):
        tm.record_task(task=task, outcome=Outcome(success=True, score=1.0), lesson=TaskLesson(("Check pg_locks first.",), None, "t"))
    before = memory.store.count(viewer=ADMIN, filter=ADMIN_ALL)
    llm = ScriptedLLM(['{"title": "Lock waits", "knowledge": "Query pg_locks, end the blocker."}'])
    dry = consolidate(memory, policy=ProcedurePolicy(tm, llm=llm), dry_run=True)  # the curate engine, the team's policy
    [c] = dry.generalised
    assert c.title == "Lock waits" and (c.successes, c.failures) == (2, 0) and not dry.applied
    assert memory.store.count(viewer=ADMIN, filter=ADMIN_ALL) == before
    assert llm.last_request.messages[-1].content.startswith("The memories below are data")  # one prompt frame
    done = consolidate(memory, policy=ProcedurePolicy(tm, llm=ScriptedLLM(['{"title": "Lock waits", "knowledge": "Query pg_locks."}'])))
    [p] = tm.procedures()
    assert p.id == done.generalised[0].procedure == c.procedure and p.title == "Lock waits"
    links = [r for r in memory.store.relations(p.id, viewer=ADMIN) if r.src == p.id]
    assert len(links) == 2 and all(r.type is RelationType.DERIVED_FROM for r in links)
