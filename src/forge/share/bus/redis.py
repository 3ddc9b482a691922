"""Redis Streams backend: one stream per topic, consumer groups, XACK, XAUTOCLAIM.

    bus = open_bus("redis://127.0.0.1:6379/0?prefix=forge:&maxlen=100000")

Each topic is the stream ``<prefix><topic>``; a payload is stored under field ``p``.
Redis errors never leave this module: connection failures are retried a bounded number of
times with exponential backoff, then raised as :class:`~forge.errors.BusError` with a
one-line message. Retrying a publish after a timeout may append the message twice, which
at-least-once delivery allows (receivers dedupe by capsule id).

``maxlen`` (approximate, ``XADD MAXLEN ~``) bounds memory; entries trimmed before every
group acked them are gone, so size it well above the worst backlog or use
:meth:`RedisBus.trim_acked`, which only drops what every group has acknowledged.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from forge.errors import BusError, ConfigError, ValidationError
from forge.share.bus.base import BusMessage, check_name, check_start, encode
from forge.share.capsule import Capsule

__all__ = ["RedisBus", "RedisSubscription"]

T = TypeVar("T")
_FIELD = b"p"


def _import_redis() -> Any:
    try:
        import redis
    except ImportError:
        raise ConfigError(
            "the Redis bus needs redis-py; install it with: pip install 'forge-memory[redis]'"
        ) from None
    return redis


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _messages(entries: Iterable[Any], gone: list[str] | None = None) -> list[BusMessage]:
    out = []
    for mid, fields in entries:
        if not fields or _FIELD not in fields:  # trimmed (maxlen) before it was acked
            if gone is not None:
                gone.append(_s(mid))
            continue
        out.append(BusMessage(_s(mid), bytes(fields[_FIELD])))
    return out


class RedisBus:
    """Topics as Redis streams. Build with :meth:`from_url` or hand it two clients."""

    def __init__(
        self,
        client: Any,
        *,
        reader: Any = None,
        prefix: str = "forge:",
        maxlen: int | None = None,
        retries: int = 3,
        backoff_s: float = 0.05,
        max_block_ms: int = 5_000,
        where: str = "redis",
    ) -> None:
        if maxlen is not None and maxlen < 1:
            raise ValidationError("maxlen must be at least 1 (or None for unbounded)")
        self._redis = _import_redis()
        self._r = client
        self._reader = reader or client  # blocking reads need a longer socket timeout
        self.prefix = prefix
        self.maxlen = maxlen
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_block_ms = max_block_ms
        self.where = where
        self._groups: set[tuple[str, str]] = set()
        self._closed = False
        self.retried = 0  # commands retried after a connection failure (reconnects)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str | None = None,
        maxlen: int | None = None,
        socket_timeout: float | None = None,
        retries: int = 3,
        max_block_ms: int = 5_000,
    ) -> RedisBus:
        """Connect lazily (nothing is sent until the first command)."""
        redis = _import_redis()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        parts = urlsplit(url)
        ours = {"prefix", "maxlen", "socket_timeout"}
        query = dict(parse_qsl(parts.query))
        rest = urlencode({k: v for k, v in query.items() if k not in ours})
        clean = urlunsplit(parts._replace(query=rest))
        try:
            prefix = prefix if prefix is not None else query.get("prefix", "forge:")
            if maxlen is None and "maxlen" in query:
                maxlen = int(query["maxlen"])
            timeout = socket_timeout if socket_timeout is not None else float(query.get("socket_timeout", 2.0))
        except ValueError as exc:
            raise ConfigError(f"bad option in bus URL {url!r}: {exc}") from None
        # redis-py's own retries are switched off: ours are bounded and mapped to BusError.
        common = {"decode_responses": False, "socket_connect_timeout": timeout, "retry": Retry(NoBackoff(), 0)}
        try:
            client = redis.Redis.from_url(clean, socket_timeout=timeout, **common)
            reader = redis.Redis.from_url(clean, socket_timeout=timeout + max_block_ms / 1000, **common)
        except ValueError as exc:
            raise ConfigError(f"bad Redis URL {url!r}: {exc}") from None
        where = parts.netloc.rpartition("@")[2] or parts.path
        return cls(client, reader=reader, prefix=prefix, maxlen=maxlen, retries=retries,
                   max_block_ms=max_block_ms, where=where)

    # -- plumbing ---------------------------------------------------------------------------
    def key(self, topic: str) -> str:
        return f"{self.prefix}{topic}"

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one Redis command; retry connection failures with backoff; map errors."""
        if self._closed:
            raise BusError("the bus is closed; open a new one")
        r = self._redis
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except (r.ConnectionError, r.TimeoutError) as exc:
                if attempt == self.retries:
                    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    raise BusError(
                        f"Redis at {self.where} unreachable while {what} after {attempt + 1} "
                        f"tries ({detail}); is redis-server running?"
                    ) from None
                self.retried += 1
                time.sleep(min(self.backoff_s * 2**attempt, 1.0))
            except r.RedisError as exc:
                raise BusError(f"Redis refused {what}: {exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _ensure_group(self, topic: str, group: str, start: str) -> None:
        if (topic, group) in self._groups:
            return
        r = self._redis

        def create() -> None:
            try:
                self._r.xgroup_create(self.key(topic), group, "0" if start == "earliest" else "$", mkstream=True)
            except r.ResponseError as exc:
                # Error replies start with a code word; BUSYGROUP means it already exists.
                if not str(exc).startswith("BUSYGROUP"):
                    raise

        self._call(f"creating group {group!r} on {topic!r}", create)
        self._groups.add((topic, group))

    def _xadd_kwargs(self) -> dict[str, Any]:
        return {"maxlen": self.maxlen, "approximate": True} if self.maxlen else {}

    # -- the port ---------------------------------------------------------------------------
    def ping(self) -> bool:
        return bool(self._call("pinging", self._r.ping))

    def publish(self, topic: str, message: Capsule | bytes) -> str:
        check_name(topic, "topic")
        payload = encode(message)
        kw = self._xadd_kwargs()
        mid = self._call(f"publishing to {topic!r}", lambda: self._r.xadd(self.key(topic), {_FIELD: payload}, **kw))
        return _s(mid)

    def publish_many(self, topic: str, messages: Sequence[Capsule | bytes]) -> list[str]:
        check_name(topic, "topic")
        payloads = [encode(m) for m in messages]
        if not payloads:
            return []
        kw = self._xadd_kwargs()
        key = self.key(topic)

        def run() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for p in payloads:
                pipe.xadd(key, {_FIELD: p}, **kw)
            return pipe.execute()

        return [_s(m) for m in self._call(f"publishing to {topic!r}", run)]

    def publish_to(self, topics: Sequence[str], message: Capsule | bytes) -> list[str]:
        for t in topics:
            check_name(t, "topic")
        payload = encode(message)
        if not topics:
            return []
        kw = self._xadd_kwargs()

        def run() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for t in topics:
                pipe.xadd(self.key(t), {_FIELD: payload}, **kw)
            return pipe.execute()

        return [_s(m) for m in self._call(f"publishing to {len(topics)} topics", run)]

    def subscribe(
        self, topic: str, *, consumer: str, group: str | None = None, start: str = "earliest"
    ) -> RedisSubscription:
        check_name(topic, "topic")
        check_name(consumer, "consumer")
        group = check_name(group or consumer, "group")
        self._ensure_group(topic, group, check_start(start))
        return RedisSubscription(self, topic, group, consumer)

    def length(self, topic: str) -> int:
        return int(self._call(f"measuring {topic!r}", lambda: self._r.xlen(self.key(topic))))

    def trim_acked(self, topic: str) -> int:
        """Drop entries every group has read and acked; returns how many were removed."""
        key = self.key(topic)

        def run() -> int:
            groups = self._r.xinfo_groups(key)
            if not groups:
                return 0
            floor = None
            for g in groups:
                summary = self._r.xpending(key, g["name"])
                need = summary["min"] if summary["pending"] else None
                if need is None:  # nothing pending: everything up to last-delivered is done
                    ms, seq = _s(g["last-delivered-id"]).split("-")
                    need = f"{ms}-{int(seq) + 1}"
                need = _s(need)
                if floor is None or tuple(map(int, need.split("-"))) < tuple(map(int, floor.split("-"))):
                    floor = need
            return int(self._r.xtrim(key, minid=floor, approximate=False))

        return self._call(f"trimming {topic!r}", run)

    def purge(self) -> int:
        """Delete every stream under this bus's prefix (tests and teardown); returns the count."""

        def run() -> int:
            keys = list(self._r.scan_iter(match=f"{self.prefix}*", count=500))
            return int(self._r.delete(*keys)) if keys else 0

        self._groups.clear()
        return self._call("purging", run)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for c in {id(self._r): self._r, id(self._reader): self._reader}.values():
            with contextlib.suppress(Exception):  # closing a dead connection must not raise
                c.close()

    def __enter__(self) -> RedisBus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisSubscription:
    """XREADGROUP with id ``0`` (own pending, replay) until drained, then ``>`` (new)."""

    def __init__(self, bus: RedisBus, topic: str, group: str, consumer: str) -> None:
        self._bus = bus
        self.topic = topic
        self.group = group
        self.consumer = consumer
        self._key = bus.key(topic)
        self._replaying = True
        self._cursor = "0"
        self._closed = False
        self.trimmed = 0  # pending messages found trimmed away by maxlen (acked, counted)

    def _xread(self, cursor: str, count: int, block_ms: int | None) -> list[BusMessage]:
        bus = self._bus
        r = bus._redis
        streams = {self._key: cursor}

        def xreadgroup() -> Any:
            try:
                return bus._reader.xreadgroup(self.group, self.consumer, streams, count=count, block=block_ms)
            except r.ResponseError as exc:
                if not str(exc).startswith("NOGROUP"):
                    raise
            # The stream or group vanished (deleted, or a server restarted without
            # persistence): recreate it and read again from the start.
            bus._groups.discard((self.topic, self.group))
            bus._r.xgroup_create(self._key, self.group, "0", mkstream=True)
            bus._groups.add((self.topic, self.group))
            return bus._reader.xreadgroup(self.group, self.consumer, streams, count=count, block=block_ms)

        def run() -> list[BusMessage]:
            while True:
                resp = xreadgroup()
                if not resp:
                    return []
                gone: list[str] = []
                out = _messages(resp[0][1], gone)
                if not gone:
                    return out
                # Pending entries whose payload maxlen trimmed away can never be delivered:
                # ack them (counted) so they leave the pending list, then read on.
                bus._r.xack(self._key, self.group, *gone)
                self.trimmed += len(gone)
                if out:
                    return out

        return bus._call(f"reading {self.topic!r}", run)

    def read(self, *, count: int = 64, block_ms: int = 0) -> list[BusMessage]:
        if self._closed:
            raise BusError(f"subscription {self.consumer!r} on {self.topic!r} is closed")
        if count < 1:
            raise ValidationError("count must be at least 1")
        if self._replaying:
            out = self._xread(self._cursor, count, None)
            if out:
                self._cursor = out[-1].id
                return out
            self._replaying = False
        block = min(block_ms, self._bus.max_block_ms) if block_ms > 0 else None
        return self._xread(">", count, block)

    def ack(self, ids: Iterable[str]) -> int:
        ids = list(ids)
        if not ids:
            return 0
        return int(self._bus._call(f"acking on {self.topic!r}", lambda: self._bus._r.xack(self._key, self.group, *ids)))

    def claim(self, *, min_idle_ms: int, count: int = 100) -> list[BusMessage]:
        bus = self._bus

        def run() -> list[BusMessage]:
            out: list[BusMessage] = []
            start = "0-0"
            while len(out) < count:
                nxt, entries, *_ = bus._r.xautoclaim(
                    self._key, self.group, self.consumer, min_idle_ms, start, count=count - len(out)
                )
                out += _messages(entries)
                start = _s(nxt)
                if start == "0-0":
                    break
            return out

        return bus._call(f"claiming on {self.topic!r}", run)

    def pending(self) -> int:
        bus = self._bus

        def run() -> int:
            summary = bus._r.xpending(self._key, self.group)
            return sum(
                int(c["pending"]) for c in summary.get("consumers") or () if _s(c["name"]) == self.consumer
            )

        return bus._call(f"counting pending on {self.topic!r}", run)

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> RedisSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
