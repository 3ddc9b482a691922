"""When to broadcast, and how much: triggers, help requests, rate limits, backpressure.

Three reasons to send:

- **event**: a new unit matters enough (:class:`ImportanceTrigger`) and goes out at once;
- **periodic**: :class:`PeriodicSync` collects an agent's units created since the last
  sync and sends them as one batch every ``interval_s``;
- **help**: an agent stuck on a task sends a ``help_request`` capsule
  (:func:`help_request`); neighbours answer with their best matching units from their own
  memory (:func:`answer_help`), straight back to the asker.

Flow control sits between the triggers and the bus: each agent has a token bucket
(:class:`TokenBucket`) and a bounded, importance-ordered :class:`Outbox`. When the outbox
is full, ``put`` either blocks up to a timeout (then raises :class:`~forge.errors.BusError`)
or drops the least important capsule, counting the reason and telling ``on_drop``:
nothing the outbox accepted disappears without a trace. :class:`Broadcaster` ties it
together for one agent.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from forge.engine.memory import Memory
from forge.errors import BusError, ValidationError
from forge.model import Context, Kind, Unit, Viewer
from forge.share.capsule import Capsule
from forge.store import Filter

__all__ = [
    "Broadcaster",
    "ImportanceTrigger",
    "Outbox",
    "PeriodicSync",
    "TokenBucket",
    "answer_help",
    "help_request",
]

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class ImportanceTrigger:
    """Broadcast a new unit at once when its importance reaches ``threshold``.

    Private units never qualify: they belong to one agent.
    """

    threshold: float = 0.7

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValidationError("importance threshold must be between 0 and 1")

    def __call__(self, unit: Unit) -> bool:
        return unit.scope.kind != "private" and unit.importance >= self.threshold


class PeriodicSync:
    """Batches an agent's own new units: what it created since the last sync, every interval.

    Reads the agent's memory rather than a side list, so units that arrived by any path
    (reflection, import) are included; units received from peers (other owners) are not.
    """

    def __init__(
        self,
        memory: Memory,
        *,
        agent: str,
        interval_s: float,
        groups: Iterable[str] = (),
        clock: Clock = time.time,
        since: float = 0.0,
        limit: int = 500,
    ) -> None:
        if interval_s <= 0:
            raise ValidationError("sync interval must be positive")
        self.memory = memory
        self.agent = agent
        self.interval_s = interval_s
        self.viewer = Viewer.of(agent, groups)
        self.clock = clock
        self.limit = limit
        self._since = since
        self._sent_at_edge: set[str] = set()  # ids already sent whose created_at == _since
        self._last_sync = clock()

    def due(self) -> bool:
        return self.clock() - self._last_sync >= self.interval_s

    def collect(self) -> list[Unit]:
        """The batch since the last call (shareable units only), advancing the watermark."""
        self._last_sync = self.clock()
        flt = Filter(owner=self.agent, since=self._since, scopes=frozenset({"global"}) | {f"group:{g}" for g in self.viewer.groups})
        units = [u for u in self.memory.list(viewer=self.viewer, filter=flt, limit=self.limit) if u.id not in self._sent_at_edge]
        if units:
            edge = max(u.created_at for u in units)
            prev = self._sent_at_edge if edge == self._since else set()
            self._sent_at_edge = prev | {u.id for u in units if u.created_at == edge}
            self._since = edge
        return units


class TokenBucket:
    """``rate`` tokens per second up to ``burst``: a sender may burst, then keeps the pace."""

    def __init__(self, *, rate: float, burst: float, clock: Clock = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValidationError("a token bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = float(burst)
        self.clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def try_take(self, n: float = 1.0) -> bool:
        with self._lock:
            self._refill()
            if self._tokens >= n:
                self._tokens -= n
                return True
            return False

    def wait_time(self, n: float = 1.0) -> float:
        """Seconds until ``n`` tokens are available (0 if they are now)."""
        with self._lock:
            self._refill()
            return max(0.0, (n - self._tokens) / self.rate)


class Outbox:
    """A bounded queue of capsules waiting to be sent, most important first.

    ``policy="block"``: a full outbox makes ``put`` wait up to ``timeout_s`` for room, then
    raise BusError (backpressure reaches the caller). ``policy="drop_lowest"``: the least
    important capsule (the new one, if it is the least) is dropped, counted in
    :attr:`dropped` by reason and passed to ``on_drop``.
    """

    def __init__(
        self,
        *,
        capacity: int = 256,
        policy: str = "drop_lowest",
        timeout_s: float = 1.0,
        on_drop: Callable[[Capsule, str], object] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValidationError("outbox capacity must be at least 1")
        if policy not in ("block", "drop_lowest"):
            raise ValidationError(f"outbox policy must be 'block' or 'drop_lowest', not {policy!r}")
        self.capacity = capacity
        self.policy = policy
        self.timeout_s = timeout_s
        self.on_drop = on_drop
        self.dropped: Counter[str] = Counter()
        self._items: list[tuple[float, int, Capsule]] = []  # sorted by (-importance, seq)
        self._seq = itertools.count()
        self._cond = threading.Condition()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def _drop(self, capsule: Capsule, reason: str) -> None:
        self.dropped[reason] += 1
        if self.on_drop is not None:
            self.on_drop(capsule, reason)

    def put(self, capsule: Capsule) -> bool:
        """Queue a capsule; False if it was dropped (counted) as the least important."""
        item = (-capsule.unit.importance, next(self._seq), capsule)
        with self._cond:
            if len(self._items) >= self.capacity:
                if self.policy == "block":
                    if not self._cond.wait_for(lambda: len(self._items) < self.capacity, self.timeout_s):
                        self.dropped["outbox full: timed out"] += 1
                        raise BusError(
                            f"outbox full ({self.capacity} capsules) for {self.timeout_s}s; "
                            "the bus is not draining, slow the sender or raise the rate limit"
                        )
                else:
                    lowest = self._items[-1]
                    if item[:2] >= lowest[:2]:  # the new one is the least important (or tied, newer)
                        self._drop(capsule, "outbox full: lowest importance")
                        return False
                    self._items.pop()
                    self._drop(lowest[2], "outbox full: evicted by a more important capsule")
            bisect.insort(self._items, item, key=lambda t: t[:2])
            return True

    def get(self) -> Capsule | None:
        """The most important waiting capsule, or None."""
        with self._cond:
            if not self._items:
                return None
            item = self._items.pop(0)
            self._cond.notify_all()
            return item[2]

    def unget(self, capsule: Capsule) -> None:
        """Put back a capsule that could not be sent (keeps its place; ignores capacity)."""
        with self._cond:
            bisect.insort(self._items, (-capsule.unit.importance, -1, capsule), key=lambda t: t[:2])


def help_request(
    problem: str,
    *,
    agent: str,
    context: Context | None = None,
    importance: float = 0.8,
    ttl: float = 600.0,
) -> Capsule:
    """A ``help_request`` capsule: ``agent`` is stuck on ``problem`` and asks its neighbours."""
    unit = Unit(
        problem,
        kind=Kind.EPISODE,
        owner=agent,
        context=context or Context(),
        importance=importance,
        meta={"request": "help"},
    )
    return Capsule.of(unit, sender=agent, ttl=ttl, kind="help_request")


def answer_help(
    request: Capsule,
    *,
    memory: Memory,
    agent: str,
    groups: Iterable[str] = (),
    k: int = 3,
    min_score: float = 0.0,
    ttl: float = 3600.0,
) -> list[Capsule]:
    """``help_reply`` capsules with ``agent``'s best matching global units for a request.

    Only global units are offered: the asker is not known to be in ``agent``'s groups.
    """
    if request.kind != "help_request":
        raise ValidationError(f"capsule {request.id} is a {request.kind!r}, not a help_request")
    if request.sender == agent:
        return []
    hits = memory.recall(
        request.unit.content,
        viewer=Viewer.of(agent, groups),
        k=k,
        filter=Filter(scopes=frozenset({"global"})),
        touch=False,
    )
    return [
        Capsule.of(h.unit, sender=agent, ttl=ttl, kind="help_reply", reply_to=request.id)
        for h in hits
        if h.score >= min_score
    ]


class Broadcaster:
    """One agent's sending side: trigger -> outbox -> token bucket -> network.

    ``network`` is anything with ``send(capsule)`` and ``send_to(capsule, recipients)``
    (see :class:`forge.share.bus.Network`).
    """

    def __init__(
        self,
        network: object,
        *,
        agent: str,
        trigger: Callable[[Unit], bool] | None = None,
        bucket: TokenBucket | None = None,
        outbox: Outbox | None = None,
        ttl: float = 3600.0,
    ) -> None:
        self.network = network
        self.agent = agent
        self.trigger = trigger or ImportanceTrigger()
        self.bucket = bucket or TokenBucket(rate=10.0, burst=20)
        self.outbox = outbox or Outbox()
        self.ttl = ttl
        self.sent = 0
        self.rate_limited = 0  # flushes that stopped because the bucket was empty

    def offer(self, unit: Unit) -> bool:
        """Event-driven: queue ``unit`` if the trigger fires. Returns whether it was queued."""
        if not self.trigger(unit):
            return False
        return self.outbox.put(Capsule.of(unit, sender=self.agent, ttl=self.ttl))

    def queue(self, units: Iterable[Unit]) -> int:
        """Queue units unconditionally (a periodic batch); returns how many were kept."""
        return sum(self.outbox.put(Capsule.of(u, sender=self.agent, ttl=self.ttl)) for u in units)

    def ask_help(self, problem: str, *, context: Context | None = None) -> Capsule:
        """Send a help request to this agent's neighbours now (not rate limited: it is rare)."""
        capsule = help_request(problem, agent=self.agent, context=context)
        self.network.send(capsule)  # type: ignore[attr-defined]
        return capsule

    def reply(self, request: Capsule, replies: Iterable[Capsule]) -> int:
        """Send ``replies`` straight to whoever asked."""
        n = 0
        for c in replies:
            self.network.send_to(c, [request.sender])  # type: ignore[attr-defined]
            n += 1
        return n

    def flush(self, *, limit: int | None = None) -> int:
        """Send queued capsules while the bucket has tokens; returns how many were sent.

        A capsule whose send fails is put back before the error propagates.
        """
        n = 0
        while (limit is None or n < limit) and len(self.outbox):
            if not self.bucket.try_take():
                self.rate_limited += 1
                break
            capsule = self.outbox.get()
            if capsule is None:
                break
            try:
                self.network.send(capsule)  # type: ignore[attr-defined]
            except BaseException:
                self.outbox.unget(capsule)
                raise
            n += 1
        self.sent += n
        return n
