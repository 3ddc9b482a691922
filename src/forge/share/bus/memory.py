"""The in-process bus: Redis Streams semantics without a server.

Each topic is an append-only log with consumer groups; each group has a delivery cursor
and a pending list (message -> owning consumer, delivery time, delivery count). It is the
embedded default and the test double: the conformance suite runs the same tests against
it and against Redis.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from forge.errors import BusError, ValidationError
from forge.share.bus.base import BusMessage, check_name, check_start, encode
from forge.share.capsule import Capsule

__all__ = ["MemoryBus", "MemorySubscription"]

_Key = tuple[int, int]


def _fmt(key: _Key) -> str:
    return f"{key[0]}-{key[1]}"


def _parse(mid: str) -> _Key | None:
    ms, sep, seq = str(mid).partition("-")
    if not sep or not ms.isdigit() or not seq.isdigit():
        return None
    return (int(ms), int(seq))


@dataclass(slots=True)
class _Pending:
    consumer: str
    delivered_at: float
    deliveries: int = 1


@dataclass(slots=True)
class _Group:
    last: _Key
    pending: dict[_Key, _Pending] = field(default_factory=dict)


@dataclass(slots=True)
class _Topic:
    keys: list[_Key] = field(default_factory=list)
    payloads: dict[_Key, bytes] = field(default_factory=dict)
    groups: dict[str, _Group] = field(default_factory=dict)


class MemoryBus:
    """Thread-safe in-process topics. ``maxlen`` trims the oldest entries (exactly)."""

    def __init__(self, *, maxlen: int | None = None) -> None:
        if maxlen is not None and maxlen < 1:
            raise ValidationError("maxlen must be at least 1 (or None for unbounded)")
        self.maxlen = maxlen
        self._topics: dict[str, _Topic] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._last: _Key = (0, 0)

    # -- internals (called with the lock held) -------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise BusError("the bus is closed; open a new one")

    def _next_key(self) -> _Key:
        ms = time.time_ns() // 1_000_000
        key = (ms, 0) if ms > self._last[0] else (self._last[0], self._last[1] + 1)
        self._last = key
        return key

    def _topic(self, name: str) -> _Topic:
        t = self._topics.get(name)
        if t is None:
            t = self._topics[name] = _Topic()
        return t

    def _append(self, topic: str, payloads: list[bytes]) -> list[str]:
        self._check_open()
        t = self._topic(topic)
        ids = []
        for p in payloads:
            key = self._next_key()
            t.keys.append(key)
            t.payloads[key] = p
            ids.append(_fmt(key))
        if self.maxlen is not None and len(t.keys) > self.maxlen:
            drop = len(t.keys) - self.maxlen
            for key in t.keys[:drop]:
                del t.payloads[key]
            del t.keys[:drop]
        self._cond.notify_all()
        return ids

    # -- the port -------------------------------------------------------------------------
    def publish(self, topic: str, message: Capsule | bytes) -> str:
        check_name(topic, "topic")
        payload = encode(message)
        with self._cond:
            return self._append(topic, [payload])[0]

    def publish_many(self, topic: str, messages: Sequence[Capsule | bytes]) -> list[str]:
        check_name(topic, "topic")
        payloads = [encode(m) for m in messages]
        with self._cond:
            return self._append(topic, payloads)

    def publish_to(self, topics: Sequence[str], message: Capsule | bytes) -> list[str]:
        for t in topics:
            check_name(t, "topic")
        payload = encode(message)
        with self._cond:
            return [self._append(t, [payload])[0] for t in topics]

    def subscribe(
        self, topic: str, *, consumer: str, group: str | None = None, start: str = "earliest"
    ) -> MemorySubscription:
        check_name(topic, "topic")
        check_name(consumer, "consumer")
        group = check_name(group or consumer, "group")
        check_start(start)
        with self._cond:
            self._check_open()
            t = self._topic(topic)
            if group not in t.groups:
                t.groups[group] = _Group(last=(0, 0) if start == "earliest" else self._last)
        return MemorySubscription(self, topic, group, consumer)

    def topics(self) -> list[str]:
        with self._cond:
            return sorted(self._topics)

    def length(self, topic: str) -> int:
        """Entries retained in ``topic`` (acked or not)."""
        with self._cond:
            t = self._topics.get(topic)
            return len(t.keys) if t else 0

    def trim_acked(self, topic: str) -> int:
        """Drop entries every group has read and acked; returns how many were removed."""
        with self._cond:
            t = self._topics.get(topic)
            if t is None or not t.groups:
                return 0
            floors = [min(g.pending) if g.pending else (g.last[0], g.last[1] + 1) for g in t.groups.values()]
            cut = bisect.bisect_left(t.keys, min(floors))
            for key in t.keys[:cut]:
                del t.payloads[key]
            del t.keys[:cut]
            return cut

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __enter__(self) -> MemoryBus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MemorySubscription:
    """A consumer's cursor: replays its own pending messages first, then reads new ones."""

    def __init__(self, bus: MemoryBus, topic: str, group: str, consumer: str) -> None:
        self._bus = bus
        self.topic = topic
        self.group = group
        self.consumer = consumer
        self._replaying = True
        self._cursor: _Key = (0, 0)
        self._closed = False
        self.trimmed = 0  # pending messages found trimmed away by maxlen (dropped, counted)

    def _group(self) -> tuple[_Topic, _Group]:
        self._bus._check_open()
        if self._closed:
            raise BusError(f"subscription {self.consumer!r} on {self.topic!r} is closed")
        t = self._bus._topic(self.topic)
        g = t.groups.get(self.group)
        if g is None:  # someone deleted it; recreate like the Redis backend does
            g = t.groups[self.group] = _Group(last=(0, 0))
        return t, g

    def _replay(self, t: _Topic, g: _Group, count: int) -> list[BusMessage]:
        now = time.monotonic()
        mine = sorted(k for k, p in g.pending.items() if p.consumer == self.consumer and k > self._cursor)
        out: list[BusMessage] = []
        for key in mine:
            if len(out) >= count:
                break
            self._cursor = key
            payload = t.payloads.get(key)
            if payload is None:  # trimmed away by maxlen before it was acked
                del g.pending[key]
                self.trimmed += 1
                continue
            p = g.pending[key]
            p.deliveries += 1
            p.delivered_at = now
            out.append(BusMessage(_fmt(key), payload))
        return out

    def _new(self, t: _Topic, g: _Group, count: int) -> list[BusMessage]:
        i = bisect.bisect_right(t.keys, g.last)
        keys = t.keys[i : i + count]
        now = time.monotonic()
        for key in keys:
            g.pending[key] = _Pending(self.consumer, now)
        if keys:
            g.last = keys[-1]
        return [BusMessage(_fmt(k), t.payloads[k]) for k in keys]

    def read(self, *, count: int = 64, block_ms: int = 0) -> list[BusMessage]:
        if count < 1:
            raise ValidationError("count must be at least 1")
        deadline = time.monotonic() + max(block_ms, 0) / 1000
        with self._bus._cond:
            t, g = self._group()
            if self._replaying:
                out = self._replay(t, g, count)
                if out:
                    return out
                self._replaying = False
            while True:
                out = self._new(t, g, count)
                left = deadline - time.monotonic()
                if out or left <= 0:
                    return out
                self._bus._cond.wait(left)
                t, g = self._group()

    def ack(self, ids: Iterable[str]) -> int:
        with self._bus._cond:
            _, g = self._group()
            n = 0
            for mid in ids:
                key = _parse(mid)
                if key is not None and g.pending.pop(key, None) is not None:
                    n += 1
            return n

    def claim(self, *, min_idle_ms: int, count: int = 100) -> list[BusMessage]:
        now = time.monotonic()
        out: list[BusMessage] = []
        with self._bus._cond:
            t, g = self._group()
            for key in sorted(g.pending):
                if len(out) >= count:
                    break
                p = g.pending[key]
                if (now - p.delivered_at) * 1000 < min_idle_ms:
                    continue
                payload = t.payloads.get(key)
                if payload is None:
                    del g.pending[key]
                    self.trimmed += 1
                    continue
                p.consumer = self.consumer
                p.delivered_at = now
                p.deliveries += 1
                out.append(BusMessage(_fmt(key), payload))
        return out

    def pending(self) -> int:
        with self._bus._cond:
            _, g = self._group()
            return sum(1 for p in g.pending.values() if p.consumer == self.consumer)

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> MemorySubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
