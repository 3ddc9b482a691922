"""Memory bounds concurrent recalls, admits waiting threads in order, and lets a recall nest."""

from __future__ import annotations

import threading
import time

import pytest

from forge.engine.memory import Memory, _Gate
from forge.errors import ValidationError
from forge.model import Unit, Viewer


def _wait_for(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_the_gate_admits_waiters_in_arrival_order():
    gate = _Gate(1)
    order: list[int] = []
    gate.__enter__()  # the main thread holds the only slot
    threads = []
    for i in range(4):
        def enter(i=i):
            with gate:
                order.append(i)
        t = threading.Thread(target=enter)
        t.start()
        _wait_for(lambda n=i + 1: len(gate._waiting) == n)  # queued before the next one starts
        threads.append(t)
    gate.__exit__(None, None, None)
    for t in threads:
        t.join(30)
    assert order == [0, 1, 2, 3]
    assert gate._free == 1 and not gate._waiting


def test_the_gate_bounds_how_many_are_inside():
    gate = _Gate(2)
    inside, most = [0], [0]
    lock = threading.Lock()

    def work():
        for _ in range(50):
            with gate:
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.0002)
                with lock:
                    inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert most[0] <= 2 and inside[0] == 0 and gate._free == 2


def test_a_recall_inside_a_recall_takes_no_second_slot():
    mem = Memory.open(":memory:", embedder="hash:64", concurrent_recalls=1)
    mem.add([Unit("the ford is flooded"), Unit("take the bridge at the mill")])
    seen = []

    def rerank(query, results):  # a reranker that consults memory again, on the same thread
        seen.append(len(mem.recall("bridge", viewer=Viewer.admin())))
        return list(results)

    assert mem.recall("ford", viewer=Viewer.admin(), rerank=rerank)
    assert seen == [2] and mem._gate._free == 1
    mem.close()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_concurrent_recalls_must_be_a_positive_integer(bad):
    with pytest.raises(ValidationError, match="concurrent_recalls"):
        Memory.open(":memory:", embedder="hash:64", concurrent_recalls=bad)
