"""The Bus contract, run against the in-process bus and the real Redis server alike."""

from __future__ import annotations

import threading
import time

import pytest

import test_bus_support as support
from fakes import mismatches
from forge.errors import BusError, ConfigError, ValidationError
from forge.model import Unit
from forge.share.bus import Bus, BusMessage, MemoryBus, Subscription, open_bus
from forge.share.capsule import Capsule


@pytest.fixture(params=support.BACKENDS)
def bus(request):
    yield from support.make_bus(request.param)


def payloads(msgs: list[BusMessage]) -> list[bytes]:
    return [m.payload for m in msgs]


def test_implements_the_port(bus):
    assert mismatches(bus, Bus) == []
    sub = bus.subscribe("t", consumer="a")
    assert mismatches(sub, Subscription) == []
    assert (sub.topic, sub.group, sub.consumer) == ("t", "a", "a")  # the group defaults to the consumer
    other = bus.subscribe("t", consumer="b", group="g")
    assert (other.topic, other.group, other.consumer) == ("t", "g", "b")


def test_publish_then_read_in_order(bus):
    sub = bus.subscribe("t", consumer="a")
    ids = [bus.publish("t", f"m{i}".encode()) for i in range(5)]
    assert len(set(ids)) == 5
    got = sub.read(count=10)
    assert [m.id for m in got] == ids
    assert payloads(got) == [f"m{i}".encode() for i in range(5)]
    assert sub.read(count=10) == []


def test_publish_many_keeps_order_and_count_limits_batches(bus):
    sub = bus.subscribe("t", consumer="a")
    ids = bus.publish_many("t", [b"a", b"b", b"c"])
    assert bus.publish_many("t", []) == []
    first = sub.read(count=2)
    assert [m.id for m in first] == ids[:2]
    assert payloads(sub.read(count=2)) == [b"c"]


def test_publish_to_fans_out_one_message(bus):
    subs = [bus.subscribe(f"inbox.{a}", consumer=a) for a in "xyz"]
    ids = bus.publish_to(["inbox.x", "inbox.y", "inbox.z"], b"hi")
    assert len(ids) == 3 and bus.publish_to([], b"hi") == []
    assert [payloads(s.read()) for s in subs] == [[b"hi"]] * 3
    with pytest.raises(ValidationError):
        bus.publish_to(["ok", "not ok"], b"x")


def test_capsule_payload_is_its_json(bus):
    c = Capsule.of(Unit("lock the door", owner="a1"), sender="a1")
    sub = bus.subscribe("t", consumer="b")
    bus.publish("t", c)
    (m,) = sub.read()
    assert Capsule.from_json(m.payload) == c


def test_every_consumer_group_sees_every_message(bus):
    a, b = bus.subscribe("t", consumer="a"), bus.subscribe("t", consumer="b")
    bus.publish_many("t", [b"1", b"2"])
    assert payloads(a.read()) == payloads(b.read()) == [b"1", b"2"]


def test_a_shared_group_splits_messages_between_consumers(bus):
    a = bus.subscribe("t", consumer="a", group="workers")
    b = bus.subscribe("t", consumer="b", group="workers")
    bus.publish_many("t", [b"1", b"2", b"3", b"4"])
    got = payloads(a.read(count=2)) + payloads(b.read(count=10))
    assert sorted(got) == [b"1", b"2", b"3", b"4"]


def test_ack_clears_pending(bus):
    sub = bus.subscribe("t", consumer="a")
    bus.publish_many("t", [b"1", b"2", b"3"])
    got = sub.read()
    assert sub.pending() == 3
    assert sub.ack([got[0].id, got[1].id]) == 2
    assert sub.ack([got[0].id]) == 0  # already acked
    assert sub.pending() == 1


def test_a_consumer_that_comes_back_replays_its_unacked_messages_first(bus):
    sub = bus.subscribe("t", consumer="a")
    bus.publish_many("t", [b"1", b"2", b"3"])
    got = sub.read()
    sub.ack([got[0].id])
    sub.close()  # "crashes" with 2 and 3 unacked
    bus.publish("t", b"4")
    again = bus.subscribe("t", consumer="a")
    assert payloads(again.read(count=10)) == [b"2", b"3"]  # pending replay first
    assert payloads(again.read(count=10)) == [b"4"]  # then new
    assert again.read(count=10) == []


def test_replay_walks_past_unacked_messages_instead_of_looping(bus):
    sub = bus.subscribe("t", consumer="a")
    bus.publish_many("t", [b"1", b"2", b"3"])
    sub.read()
    again = bus.subscribe("t", consumer="a")
    assert payloads(again.read(count=2)) == [b"1", b"2"]
    assert payloads(again.read(count=2)) == [b"3"]
    assert again.read(count=2) == []
    assert again.pending() == 3  # still owed acks


def test_a_subscriber_that_is_down_gets_what_was_sent_meanwhile(bus):
    bus.subscribe("inbox.b", consumer="b").close()  # joined once, then went down
    bus.publish_many("inbox.b", [b"x", b"y"])
    assert payloads(bus.subscribe("inbox.b", consumer="b").read()) == [b"x", b"y"]


def test_start_earliest_reads_history_latest_does_not(bus):
    bus.publish("t", b"old")
    early = bus.subscribe("t", consumer="early")
    late = bus.subscribe("t", consumer="late", start="latest")
    bus.publish("t", b"new")
    assert payloads(early.read()) == [b"old", b"new"]
    assert payloads(late.read()) == [b"new"]


def test_claim_takes_over_a_dead_consumers_pending_messages(bus):
    dead = bus.subscribe("t", consumer="dead", group="workers")
    bus.publish_many("t", [b"1", b"2"])
    assert len(dead.read()) == 2
    alive = bus.subscribe("t", consumer="alive", group="workers")
    assert alive.claim(min_idle_ms=60_000) == []  # not idle long enough yet
    time.sleep(0.06)
    claimed = alive.claim(min_idle_ms=50)
    assert payloads(claimed) == [b"1", b"2"]
    assert alive.pending() == 2 and dead.pending() == 0
    assert alive.ack([m.id for m in claimed]) == 2


def test_blocking_read_wakes_on_publish(bus):
    sub = bus.subscribe("t", consumer="a")
    reading = threading.Event()

    def publish_once_reading() -> None:
        reading.wait(timeout=30)
        time.sleep(0.05)  # let the read start blocking; the test holds however late this lands
        bus.publish("t", b"late")

    writer = threading.Thread(target=publish_once_reading)
    writer.start()
    block_ms = 5_000  # the Redis bus's longest block
    t0 = time.monotonic()
    reading.set()
    got = sub.read(block_ms=block_ms)
    elapsed = time.monotonic() - t0
    writer.join(timeout=30)
    assert payloads(got) == [b"late"]
    assert elapsed < 0.8 * block_ms / 1000  # woken by the publish, not by the block running out


def test_blocking_read_times_out_empty(bus):
    sub = bus.subscribe("t", consumer="a")
    t0 = time.monotonic()
    assert sub.read(block_ms=100) == []
    assert time.monotonic() - t0 >= 0.08  # it waited (the bound below only says it came back)
    assert time.monotonic() - t0 < 30


def test_trim_acked_keeps_what_any_group_still_needs(bus):
    a, b = bus.subscribe("t", consumer="a"), bus.subscribe("t", consumer="b")
    bus.publish_many("t", [b"1", b"2", b"3"])
    got = a.read()
    a.ack([m.id for m in got])
    b_got = b.read(count=1)
    b.ack([b_got[0].id])
    assert bus.trim_acked("t") == 1  # only "1" is done for both groups
    assert bus.length("t") == 2
    assert payloads(b.read()) == [b"2", b"3"]


def test_bad_names_and_payloads_are_refused(bus):
    with pytest.raises(ValidationError):
        bus.publish("has space", b"x")
    with pytest.raises(ValidationError):
        bus.publish("t", "a str")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        bus.subscribe("t", consumer="")
    with pytest.raises(ValidationError):
        bus.subscribe("t", consumer="a", start="middle")
    with pytest.raises(ValidationError):
        bus.subscribe("t", consumer="a").read(count=0)


def test_a_closed_bus_raises_bus_error(bus):
    sub = bus.subscribe("t", consumer="a")
    bus.close()
    with pytest.raises(BusError):
        bus.publish("t", b"x")
    with pytest.raises(BusError):
        sub.read()


def test_concurrent_publishers_lose_nothing(bus):
    sub = bus.subscribe("t", consumer="a")

    def produce(n: int) -> None:
        for i in range(50):
            bus.publish("t", f"{n}:{i}".encode())

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = []
    while batch := sub.read(count=64):
        seen += payloads(batch)
    assert sorted(seen) == sorted(f"{n}:{i}".encode() for n in range(4) for i in range(50))


# -- the factory -----------------------------------------------------------------------------


def test_open_bus_memory_is_the_default():
    with open_bus() as b:
        assert isinstance(b, MemoryBus)


@pytest.mark.parametrize("url", ["nats://x", "127.0.0.1:6379"])
def test_open_bus_rejects_unknown_urls(url):
    with pytest.raises(ConfigError):
        open_bus(url)


def test_memory_maxlen_trims_oldest():
    b = MemoryBus(maxlen=3)
    sub = b.subscribe("t", consumer="a")
    b.publish_many("t", [b"1", b"2", b"3", b"4", b"5"])
    assert b.length("t") == 3
    assert payloads(sub.read()) == [b"3", b"4", b"5"]
    b.publish_many("t", [b"6", b"7", b"8"])  # trims 3-5 while they are still pending
    again = b.subscribe("t", consumer="a")
    assert payloads(again.read()) == [b"6", b"7", b"8"] and again.trimmed == 3
    with pytest.raises(ValidationError):
        MemoryBus(maxlen=0)
