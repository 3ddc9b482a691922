"""Read audit records are batched: a recall costs no write transaction, and no record is
lost on a clean shutdown, reordered, or dated at its write time instead of its read time."""

from __future__ import annotations

import threading
import time

import pytest

from forge.engine.memory import Memory
from forge.errors import ConfigError, StoreError
from forge.model import Viewer
from forge.server.keys import Principal
from forge.server.service import ReadLog, Service

ALICE = Principal("alice", frozenset({"red"}))


def _ops(memory: Memory, op: str) -> list:
    return memory.store.events(ops=[op], viewer=Viewer.admin())


def test_recalls_are_written_in_one_batch_with_their_read_times(memory: Memory) -> None:
    service = Service(memory)
    service.reads.delay_s = 60.0  # nothing written by the timer during the test
    service.add(ALICE, [{"content": "when the ice is thin, step back", "kind": "rule"}])
    before = time.time()
    for _ in range(20):
        service.recall(ALICE, "thin ice", k=3)
    assert _ops(memory, "recall") == []  # pending, not yet a transaction each
    commits: list[int] = []
    real = memory.store.append_events

    def counted(events):  # type: ignore[no-untyped-def]
        commits.append(len(events))
        return real(events)

    memory.store.append_events = counted  # type: ignore[method-assign]
    service.flush()
    del memory.store.append_events
    recalls = _ops(memory, "recall")
    assert len(recalls) == 20 and commits == [20]  # one transaction, one statement
    assert all(before <= e.ts <= time.time() for e in recalls)
    assert [e.ts for e in recalls] == sorted(e.ts for e in recalls)
    assert all(e.actor == "alice" and e.data["hits"] for e in recalls)


def test_the_timer_writes_pending_reads_without_a_flush(memory: Memory) -> None:
    service = Service(memory)
    service.reads.delay_s = 0.01
    [uid] = service.add(ALICE, [{"content": "a fact"}])
    service.get(ALICE, uid)
    deadline = time.monotonic() + 30
    while not _ops(memory, "read") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [e.unit_id for e in _ops(memory, "read")] == [uid]


def test_audit_queries_see_reads_made_just_before(memory: Memory) -> None:
    service = Service(memory)
    service.reads.delay_s = 60.0
    [uid] = service.add(ALICE, [{"content": "a fact about ice"}])
    service.recall(ALICE, "ice")
    assert [e.op for e in service.events(ALICE)] == ["add", "admit", "recall"]
    assert [s["id"] for s in service.seen(ALICE, "alice")] == [uid]


def test_a_full_batch_is_written_at_once(memory: Memory) -> None:
    log = ReadLog(memory.store, delay_s=60.0, max_pending=5)
    for i in range(12):
        log.record("read", actor="alice", data={"i": i})
    assert [e.data["i"] for e in _ops(memory, "read")] == list(range(10))
    log.close()
    assert [e.data["i"] for e in _ops(memory, "read")] == list(range(12))


def test_close_writes_the_rest_and_later_reads_at_once(memory: Memory) -> None:
    with Service(memory) as service:
        service.reads.delay_s = 60.0
        [uid] = service.add(ALICE, [{"content": "a fact"}])
        service.get(ALICE, uid)
    assert len(_ops(memory, "read")) == 1
    service.get(ALICE, uid)  # a request that arrives during shutdown is not dropped
    assert len(_ops(memory, "read")) == 2


def test_a_failed_write_keeps_the_records_in_order(memory: Memory, monkeypatch) -> None:
    log = ReadLog(memory.store, delay_s=60.0)
    log.record("read", data={"i": 0})
    log.record("read", data={"i": 1})

    def broken(events):  # type: ignore[no-untyped-def]
        raise StoreError("disk full")

    monkeypatch.setattr(memory.store, "append_events", broken)
    with pytest.raises(StoreError):
        log.flush()
    monkeypatch.undo()
    log.record("read", data={"i": 2})
    log.flush()
    assert [e.data["i"] for e in _ops(memory, "read")] == [0, 1, 2]


def test_reads_from_many_threads_are_all_recorded(memory: Memory) -> None:
    service = Service(memory)
    service.reads.max_pending = 7  # flushes race with records and the timer
    service.reads.delay_s = 0.001
    [uid] = service.add(ALICE, [{"content": "a shared fact"}])

    def reader() -> None:
        for _ in range(50):
            service.get(ALICE, uid)

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    service.close()
    assert len(_ops(memory, "read")) == 400



def test_a_zero_delay_writes_each_read_at_once(memory: Memory) -> None:
    service = Service(memory, read_audit_delay_s=0)
    [uid] = service.add(ALICE, [{"content": "a fact"}])
    service.get(ALICE, uid)
    assert len(_ops(memory, "read")) == 1


@pytest.mark.parametrize("delay", [-1, 61, float("nan")])
def test_a_read_audit_delay_out_of_range_is_refused(memory: Memory, delay: float) -> None:
    with pytest.raises(ConfigError, match="read audit delay"):
        Service(memory, read_audit_delay_s=delay)


def test_a_units_trace_reads_the_recalls_that_returned_it_through_their_index(memory: Memory) -> None:
    service = Service(memory)
    service.reads.delay_s = 60.0
    [ice] = service.add(ALICE, [{"content": "when the ice is thin, step back", "kind": "rule"}])
    service.add(ALICE, [{"content": "in thick fog, stop and listen", "kind": "rule"}])
    for _ in range(3):
        service.recall(ALICE, "thin ice", k=1)
    for _ in range(4):
        service.recall(ALICE, "thick fog", k=1)
    asked: list[dict] = []
    real = memory.store.events

    def spy(**kw):  # type: ignore[no-untyped-def]
        asked.append(kw)
        return real(**kw)

    memory.store.events = spy  # type: ignore[method-assign]
    t = service.trace(Principal("root", admin=True), ice)
    del memory.store.events
    assert [r["query"] for r in t["use"]["audited_recalls"]] == ["thin ice"] * 3
    assert all(kw.get("naming") == ice for kw in asked if "recall" in kw.get("ops", ()))  # never every recall
