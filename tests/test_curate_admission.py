"""Admission on write: ADD / UPDATE / NOOP decisions, explained, recorded and never lossy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forge.curate import (
    ADD,
    NOOP,
    UPDATE,
    AdmissionPolicy,
    HeuristicImportance,
    ValueChangeDetector,
    admit,
)
from forge.engine.memory import Memory
from forge.errors import ConflictError
from forge.model import Kind, Provenance, RelationType, Status, Unit, Viewer

ADMIN = Viewer.admin()
T0 = 1_767_225_600.0  # 2026-01-01


def fact(text: str, **kw) -> Unit:
    kw.setdefault("created_at", T0)
    return Unit(text, kind=kw.pop("kind", Kind.FACT), **kw)


def test_exact_duplicate_is_a_noop_that_keeps_the_newcomer_s_provenance(memory: Memory) -> None:
    (first,) = admit(memory, fact("The door of room 12 sticks in winter.", owner="a", provenance=Provenance("user", episodes=("e1",))))
    (again,) = admit(memory, fact("the door of room 12   sticks in winter.", owner="a", provenance=Provenance("user", episodes=("e2",))))
    assert first.action == ADD and again.action == NOOP
    assert again.unit_id == first.unit_id and again.existing == first.unit_id and again.incoming != first.unit_id
    assert "same text" in again.reason
    kept = memory.get(first.unit_id, viewer=ADMIN)
    assert kept.provenance.episodes == ("e1", "e2")  # provenance of both
    assert [m["id"] for m in kept.meta["merged"]] == [again.incoming]  # never a silent drop
    assert memory.store.count(viewer=ADMIN) == 1
    events = memory.store.events(viewer=ADMIN, ops=["admit"])
    assert [e.data["action"] for e in events] == [ADD, NOOP] and events[1].data["reason"] == again.reason


def test_near_duplicate_from_another_origin_corroborates_and_keeps_its_wording(memory: Memory) -> None:
    policy = AdmissionPolicy(duplicate_at=0.8)
    text = "Vacuum the orders table when dead tuples pile up after bulk deletes"
    (a,) = admit(memory, fact(text, owner="alice"), policy=policy)
    v0 = memory.get(a.unit_id, viewer=ADMIN).validation
    (b,) = admit(memory, fact(text + " overnight", owner="bob"), policy=policy)
    assert b.action == NOOP and b.similarity is not None and 0.8 <= b.similarity < 1.0
    unit = memory.get(a.unit_id, viewer=ADMIN)
    assert unit.validation > v0 and "corroborated by a new origin (bob)" in b.reason
    assert unit.meta["merged"][0]["content"].endswith("overnight")  # the paraphrase is kept
    (c,) = admit(memory, fact(text + " tonight", owner="bob"), policy=policy)
    assert c.action == NOOP and "already counted" in c.reason
    assert memory.get(a.unit_id, viewer=ADMIN).validation == unit.validation  # bob counts once


def test_a_changed_value_updates_and_the_old_text_stays_as_history(memory: Memory) -> None:
    (old,) = admit(memory, fact("The door code of room 12 is 4411.", owner="ops"))
    (new,) = admit(memory, fact("The door code of room 12 is 9032.", owner="ops", created_at=T0 + 3600))
    assert new.action == UPDATE and new.existing == old.unit_id and "different_value" in new.reason
    was = memory.get(old.unit_id, viewer=ADMIN)
    assert was.status is Status.SUPERSEDED and was.content.endswith("4411.")
    assert was.meta["valid_to"] == T0 + 3600 and was.meta["superseded_by"] == new.unit_id
    now = memory.get(new.unit_id, viewer=ADMIN)
    assert now.status is Status.ACTIVE and now.meta["valid_from"] == T0 + 3600
    rels = memory.store.relations(new.unit_id, viewer=ADMIN)
    assert [(r.src, r.type, r.dst) for r in rels] == [(new.unit_id, RelationType.SUPERSEDES, old.unit_id)]
    [hit] = memory.recall("door code room 12", viewer=ADMIN, k=5)
    assert hit.unit.id == new.unit_id  # the stale value is no longer recalled


def test_a_contradiction_from_a_less_validated_origin_is_added_beside_it(memory: Memory) -> None:
    (old,) = admit(memory, Unit("When the disk is full, then delete old logs first.", kind="rule", owner="a", validation=0.8, created_at=T0))
    (new,) = admit(memory, Unit("When the disk is full, then do not delete old logs first.", kind="rule", owner="b", validation=0.5, created_at=T0 + 5))
    assert new.action == ADD and new.existing == old.unit_id and "contradicts" in new.reason
    assert memory.get(old.unit_id, viewer=ADMIN).status is Status.ACTIVE
    rels = memory.store.relations(new.unit_id, viewer=ADMIN)
    assert [(r.type, r.dst) for r in rels] == [(RelationType.CONTRADICTS, old.unit_id)]


def test_duplicates_within_one_call_are_caught_before_the_index_sees_them(memory: Memory) -> None:
    got = admit(memory, [fact("Backups run at 02:00 UTC."), fact("backups run at 02:00 utc.")])
    assert [d.action for d in got] == [ADD, NOOP] and got[1].unit_id == got[0].unit_id
    assert memory.store.count(viewer=ADMIN) == 1


def test_private_units_of_different_agents_are_never_merged(memory: Memory) -> None:
    a = admit(memory, fact("My locker code is 1234.", scope="private", owner="alice"))
    b = admit(memory, fact("My locker code is 1234.", scope="private", owner="bob"))
    assert a[0].action == ADD and b[0].action == ADD
    assert memory.store.count(viewer=ADMIN) == 2


def test_one_call_is_one_transaction(memory: Memory) -> None:
    memory.add(fact("something else entirely", id="taken"))
    with pytest.raises(ConflictError):
        admit(memory, [fact("A brand new fact about tides."), fact("Another new fact about moons.", id="taken")])
    assert memory.store.count(viewer=ADMIN) == 1
    assert memory.store.events(viewer=ADMIN, ops=["admit"]) == []


def test_importance_is_scored_only_when_left_at_the_default(memory: Memory) -> None:
    failure = Unit("When the build fails on lint, then run ruff before pushing.", kind="lesson", meta={"outcome": {"success": False}, "surprise": 1.0})
    episode = Unit("Pushed, the build went green.", kind="episode", meta={"outcome": {"success": True}})
    chosen = Unit("The staging database is read-only on Fridays.", importance=0.9)
    got = admit(memory, [failure, episode, chosen])
    lesson, ep, kept = (memory.get(d.unit_id, viewer=ADMIN) for d in got)
    assert lesson.importance > ep.importance
    assert kept.importance == 0.9 and got[2].importance is None
    assert any("failure" in w for w in got[0].importance.why)
    imp = HeuristicImportance().score(Unit("x", kind="rule"), novelty=0.0)
    assert imp.score == pytest.approx(0.7)


def test_value_change_detector_tells_values_from_paraphrases() -> None:
    d = ValueChangeDetector()
    assert d.detect(Unit("Alice lives in Paris"), Unit("Alice lives in Rome"), similarity=0.9) is not None
    assert d.detect(Unit("Alice lives in Paris"), Unit("Alice resides in Paris"), similarity=0.9) is None
    assert d.detect(Unit("Alice lives in Paris"), Unit("Alice lives in Paris now"), similarity=0.9) is None
    port = Unit("The port of relay 17 is 8080.")
    assert d.detect(port, Unit("The port of relay 17 is 9090."), similarity=0.9) is not None
    assert d.detect(port, Unit("The port of relay 23 is 4411."), similarity=0.9) is None  # another relay
    assert d.detect(port, Unit("The port of relay 18 is 8080."), similarity=0.9) is None
    assert d.detect(Unit("Ticket 1 is open."), Unit("Ticket 2 is open."), similarity=0.9) is None


def test_memory_admit_is_the_same_gate(memory: Memory) -> None:
    assert [d.action for d in admit(memory, [fact("Tea is at four."), fact("Tea is at four.")])] == [ADD, NOOP]
    assert isinstance(memory.embed(["x"]), np.ndarray)


def test_the_same_words_in_another_context_are_another_memory(memory: Memory) -> None:
    from forge.model import Context

    a = admit(memory, fact("Use port 8080.", context=Context(domain="staging")))
    b = admit(memory, fact("Use port 8080.", context=Context(domain="production")))
    assert a[0].action == ADD and b[0].action == ADD and memory.store.count(viewer=ADMIN) == 2


def test_an_llm_can_score_importance_and_the_heuristic_covers_its_failures(memory: Memory) -> None:
    from forge.curate import LLMImportance
    from forge.llm.testing import ScriptedLLM

    scorer = LLMImportance(ScriptedLLM(['{"importance": 0.95, "reason": "prevents data loss"}']))
    [d] = admit(memory, fact("Backups are not taken on holidays."), policy=AdmissionPolicy(importance=scorer))
    assert memory.get(d.unit_id, viewer=ADMIN).importance == 0.95 and "prevents data loss" in d.importance.why[0]
    broken = LLMImportance(ScriptedLLM(["no idea", "still no idea"]), retries=1)
    got = broken.score(Unit("x", kind="rule"), novelty=0.0)
    assert got.score == pytest.approx(0.7) and "LLM scorer failed" in got.why[-1]


def test_an_agent_can_remember_through_admission(tmp_path: Path) -> None:
    from forge.population.agent import Agent

    with Agent.open("solo", store=tmp_path / "solo.db", admission=AdmissionPolicy()) as a:
        [first] = a.remember(Unit("When the ice cracks, then step back.", kind="rule", importance=0.9))
        [again] = a.remember(Unit("when the ice cracks, then step back.", kind="rule", importance=0.9))
        assert again.id == first.id and again.meta["merges"] == 1  # merged, not a second copy
        assert len(a.broadcaster.outbox) == 1  # and not offered twice
        assert a.memory.store.count(viewer=ADMIN) == 1


def test_a_close_text_with_other_values_is_another_fact(memory: Memory) -> None:
    policy = AdmissionPolicy(duplicate_at=0.5, related_at=0.5)  # as loose as a trained embedder's cosines
    a = admit(memory, fact("The port of relay 17 is 8080."), policy=policy)
    b = admit(memory, fact("The port of relay 23 is 4411."), policy=policy)
    c = admit(memory, fact("FYI The port of relay 17 is 8080."), policy=policy)
    assert [x[0].action for x in (a, b, c)] == [ADD, ADD, NOOP] and c[0].unit_id == a[0].unit_id
