"""Triggers, help requests, rate limits and backpressure."""

from __future__ import annotations

import threading

import pytest

import test_bus_support as support
from fakes import Clock as FakeClock
from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.errors import BusError, ValidationError
from forge.model import Unit
from forge.share.bus import MemoryBus, Network
from forge.share.capsule import Capsule, Keyring
from forge.share.topology import FullMesh, Ring
from forge.share.triggers import (
    Broadcaster,
    ImportanceTrigger,
    Outbox,
    PeriodicSync,
    TokenBucket,
    answer_help,
    help_request,
)
from forge.store import open_store


@pytest.fixture(params=support.BACKENDS)
def bus(request):
    yield from support.make_bus(request.param)


def cap(importance: float, text: str = "x", sender: str = "a") -> Capsule:
    return Capsule.of(Unit(f"unit {text}", owner=sender, importance=importance), sender=sender)


def memory() -> Memory:
    return Memory(open_store(":memory:"), HashingEmbedder(64))


def test_importance_trigger():
    t = ImportanceTrigger(0.7)
    assert t(Unit("a", importance=0.7)) and not t(Unit("a", importance=0.69))
    assert not t(Unit("a", importance=1.0, scope="private", owner="x"))
    with pytest.raises(ValidationError):
        ImportanceTrigger(1.5)


def test_token_bucket_bursts_then_keeps_the_pace():
    clock = FakeClock(1000.0)
    b = TokenBucket(rate=2.0, burst=3, clock=clock)
    assert [b.try_take() for _ in range(4)] == [True, True, True, False]
    assert b.wait_time() == pytest.approx(0.5)
    clock.t += 0.5
    assert b.try_take() and not b.try_take()
    clock.t += 100
    assert sum(b.try_take() for _ in range(10)) == 3  # never more than the burst
    with pytest.raises(ValidationError):
        TokenBucket(rate=0, burst=1)


def test_outbox_sends_most_important_first():
    box = Outbox(capacity=10)
    for imp in (0.2, 0.9, 0.5, 0.9):
        box.put(cap(imp, text=str(imp)))
    got = [box.get().unit.importance for _ in range(4)]
    assert got == [0.9, 0.9, 0.5, 0.2] and box.get() is None


def test_full_outbox_drops_the_least_important_and_says_so():
    dropped = []
    box = Outbox(capacity=2, policy="drop_lowest", on_drop=lambda c, why: dropped.append((c.unit.importance, why)))
    assert box.put(cap(0.5)) and box.put(cap(0.8))
    assert box.put(cap(0.9))  # evicts 0.5
    assert not box.put(cap(0.1))  # the new one is the least important
    assert len(box) == 2
    assert [d[0] for d in dropped] == [0.5, 0.1]
    assert box.dropped == {"outbox full: evicted by a more important capsule": 1, "outbox full: lowest importance": 1}
    assert {box.get().unit.importance, box.get().unit.importance} == {0.8, 0.9}


def test_full_outbox_blocks_until_room_or_times_out():
    box = Outbox(capacity=1, policy="block", timeout_s=30.0)  # generous: the get comes when it comes
    box.put(cap(0.5))
    taken = []
    getter = threading.Timer(0.05, lambda: taken.append(box.get()))
    getter.start()
    assert box.put(cap(0.6))  # a full box takes it only once the get made room: it waited
    getter.join(timeout=30)
    assert [c.unit.importance for c in taken] == [0.5]
    assert len(box) == 1 and box.get().unit.importance == 0.6
    fast = Outbox(capacity=1, policy="block", timeout_s=0.05)
    fast.put(cap(0.5))
    with pytest.raises(BusError, match="outbox full"):
        fast.put(cap(0.9))
    assert fast.dropped["outbox full: timed out"] == 1 and len(fast) == 1
    with pytest.raises(ValidationError):
        Outbox(policy="shrug")


def test_broadcaster_is_rate_limited_and_loses_nothing_it_accepted(bus):
    clock = FakeClock(1000.0)
    keys = Keyring.from_secret("k")
    net = Network(bus, FullMesh(["a", "b", "c"]), keyring=keys)
    inbox_b = net.inbox("b")
    br = Broadcaster(net, agent="a", bucket=TokenBucket(rate=1.0, burst=2, clock=clock), outbox=Outbox(capacity=50))
    assert not br.offer(Unit("minor", owner="a", importance=0.1))  # below the trigger
    for i in range(5):
        assert br.offer(Unit(f"important {i}", owner="a", importance=0.8 + i / 100))
    assert br.flush() == 2 and br.rate_limited == 1
    clock.t += 1.0
    assert br.flush() == 1
    clock.t += 10
    assert br.flush() == 2 and len(br.outbox) == 0
    got = [d.capsule.unit.content for d in inbox_b.read(count=10)]
    assert sorted(got) == [f"important {i}" for i in range(5)]
    assert got[0] == "important 4"  # most important first


def test_a_failed_send_puts_the_capsule_back():
    class Down:
        def send(self, capsule):
            raise BusError("redis down")

    br = Broadcaster(Down(), agent="a")
    br.offer(Unit("keep me", owner="a", importance=0.9))
    with pytest.raises(BusError):
        br.flush()
    assert len(br.outbox) == 1 and br.outbox.get().unit.content == "keep me"


def test_periodic_sync_batches_own_new_units_since_the_last_sync():
    mem = memory()
    clock = FakeClock(1000.0)
    sync = PeriodicSync(mem, agent="a", interval_s=30, clock=clock)
    mem.add([Unit("first lesson", owner="a", created_at=1.0), Unit("second lesson", owner="a", created_at=2.0)])
    mem.add([Unit("someone else's", owner="b", created_at=1.5), Unit("secret", owner="a", scope="private", created_at=1.6)])
    assert not sync.due()
    clock.t += 30
    assert sync.due()
    assert [u.content for u in sync.collect()] == ["first lesson", "second lesson"]
    assert not sync.due()
    assert sync.collect() == []  # nothing new
    mem.add([Unit("third lesson", owner="a", created_at=2.0), Unit("fourth lesson", owner="a", created_at=5.0)])
    assert sorted(u.content for u in sync.collect()) == ["fourth lesson", "third lesson"]  # same-timestamp unit not lost
    br = Broadcaster(Network(MemoryBus(), FullMesh(["a", "b"]), keyring=Keyring.random()), agent="a")
    assert br.queue([Unit("batch", owner="a", importance=0.1)]) == 1  # batches skip the trigger


def test_help_request_is_answered_from_the_neighbours_memory(bus):
    keys = Keyring.from_secret("k")
    agents = ["asker", "helper", "far"]
    net = Network(bus, Ring(agents, k=1), keyring=keys)
    inboxes = {a: net.inbox(a) for a in agents}
    helper_mem = memory()
    helper_mem.add([
        Unit("when the firewall blocks port 22, open it in the ruleset", owner="helper"),
        Unit("the database index needs rebuilding weekly", owner="helper"),
        Unit("my private ssh firewall notes", owner="helper", scope="private"),
    ])
    asker = Broadcaster(net, agent="asker")
    req = asker.ask_help("the firewall blocks ssh on port 22")
    assert req.kind == "help_request" and req.unit.meta["request"] == "help"

    (delivery,) = inboxes["helper"].read()
    assert delivery.capsule.kind == "help_request"
    replies = answer_help(delivery.capsule, memory=helper_mem, agent="helper", k=2)
    assert replies and all(r.kind == "help_reply" and r.reply_to == req.id for r in replies)
    assert "firewall" in replies[0].unit.content
    assert all(r.unit.scope.kind == "global" for r in replies)  # private units stay home
    Broadcaster(net, agent="helper").reply(delivery.capsule, replies)
    inboxes["helper"].ack([delivery.id])

    answers = [d.capsule for d in inboxes["asker"].read()]
    assert [a.reply_to for a in answers] == [req.id] * len(replies)
    assert answers[0].unit.content == replies[0].unit.content
    assert answer_help(req, memory=helper_mem, agent="asker") == []  # nobody answers itself
    with pytest.raises(ValidationError):
        answer_help(answers[0], memory=helper_mem, agent="helper")


def test_help_request_defaults():
    c = help_request("stuck on the maze", agent="a")
    assert c.ttl == 600.0 and c.unit.owner == "a" and c.sender == "a"
