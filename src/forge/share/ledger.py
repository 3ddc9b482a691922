"""The ledger: the receiving side's audit of what it decided about each capsule and unit, and why.

Every decision of the exchange (accepted, quarantined, rejected, ...) and of consensus
(corroborated, promoted, resolved, ...) is a :class:`Ruling` appended to a :class:`Ledger` and
can be listed and counted per outcome or reason. Each ruling is an appended event of the
memory (op ``decision``, actor the ledger's name; no unit, so only the operator sees it): it
survives a restart, commits with the memory's transaction and travels in an operator's export.
Without :class:`Records` the ledger lives in memory only (``Ledger.durable`` says which).
Ledgers written before rulings were events, as ``ledger/<name>/<id>`` settings, are still read.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from forge.errors import ValidationError
from forge.model import Viewer, new_id

__all__ = ["DECISION_OP", "OUTCOMES", "Ledger", "Records", "Ruling", "ledger_decisions"]

#: Every outcome a decision can have. Exchange outcomes first, then consensus bookkeeping.
OUTCOMES = (
    "accepted",
    "merged",
    "corroborated",
    "quarantined",
    "rejected",
    "conflict",
    "promoted",
    "resolved",
    "outcome",
)


class Records(Protocol):
    """Where rulings and reputations persist: the settings and event verbs of a
    :class:`~forge.engine.memory.Memory` (what consensus and the exchange pass) or of a bare
    ``Store`` of :mod:`forge.store` (the service and tracing read ledgers from one)."""

    def settings(self) -> dict[str, str]: ...

    def set_setting(self, key: str, value: str) -> None: ...

    def events(self, *, viewer: Viewer, **narrow: Any) -> list[Any]: ...

    def append_event(self, op: str, *, actor: str = "", data: Mapping[str, Any] | None = None) -> int: ...


@dataclass(frozen=True, slots=True)
class Ruling:
    """One thing the receiving side decided, with the reason, so it can be audited later.

    ``reason`` is a short code to count by (``"unsigned"``, ``"injection"``, ``"echo"``);
    ``detail`` says it in words. ``verified`` marks capsules whose signature checked out:
    only those burn their capsule id against replay (an unsigned forgery must not be able
    to block the real capsule by using its id first).
    """

    outcome: str
    reason: str
    detail: str = ""
    agent: str = ""
    capsule_id: str = ""
    sender: str = ""
    origin: str = ""
    hash: str = ""
    unit_id: str = ""
    related: tuple[str, ...] = ()
    score: float | None = None
    verified: bool = False
    data: Mapping[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)
    id: str = field(default_factory=new_id)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValidationError(f"unknown decision outcome {self.outcome!r}; expected one of {OUTCOMES}")
        object.__setattr__(self, "related", tuple(self.related))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": self.at,
            "outcome": self.outcome,
            "reason": self.reason,
            "detail": self.detail,
            "agent": self.agent,
            "capsule_id": self.capsule_id,
            "sender": self.sender,
            "origin": self.origin,
            "hash": self.hash,
            "unit_id": self.unit_id,
            "related": list(self.related),
            "score": self.score,
            "verified": self.verified,
            "data": dict(self.data),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Ruling:
        known = {k: data[k] for k in _DECISION_FIELDS if k in data}
        known["related"] = tuple(known.get("related") or ())
        return cls(**known)


_DECISION_FIELDS = (
    "outcome", "reason", "detail", "agent", "capsule_id", "sender", "origin", "hash",
    "unit_id", "related", "score", "verified", "data", "at", "id",
)


#: The event op of a ledger decision.
DECISION_OP = "decision"


def ledger_decisions(records: Records, *, name: str | None = None) -> list[Ruling]:
    """Every decision in the ledgers kept in ``records`` (or ``name``'s), oldest first."""
    legacy = f"ledger/{name}/" if name else "ledger/"
    rows = sorted((k, v) for k, v in records.settings().items() if k.startswith(legacy))
    out = [Ruling.from_dict(json.loads(v)) for _, v in rows]
    seq = 0
    while True:
        page = records.events(viewer=Viewer.admin(), ops=(DECISION_OP,), actor=name, since_seq=seq, limit=10_000)
        out.extend(Ruling.from_dict(e.data) for e in page)
        if len(page) < 10_000:
            return out
        seq = page[-1].seq


class Ledger:
    """Append-only list of decisions, persisted as events of ``records`` when given.

    Decisions are loaded once at start and appended in memory and in the event log, whose
    order is the commit order, so two processes writing one ledger never collide.
    """

    def __init__(self, records: Records | None = None, *, name: str) -> None:
        if not name or "/" in name:
            raise ValidationError("a ledger needs a name without '/', e.g. the agent id")
        self.name = name
        self._records = records
        self._lock = threading.Lock()
        self._local = threading.local()  # this thread's staged decisions (see staged())
        self._items: list[Ruling] = ledger_decisions(records, name=name) if records is not None else []

    @staticmethod
    def names(records: Records) -> list[str]:
        """The ledgers kept in ``records`` (one per receiving agent), sorted."""
        names = {k.split("/", 2)[1] for k in records.settings() if k.startswith("ledger/") and k.count("/") >= 2}
        seq = 0
        while True:
            page = records.events(viewer=Viewer.admin(), ops=(DECISION_OP,), since_seq=seq, limit=10_000)
            names.update(e.actor for e in page)
            if len(page) < 10_000:
                return sorted(names)
            seq = page[-1].seq

    @contextlib.contextmanager
    def staged(self) -> Iterator[None]:
        """Decisions recorded inside the block are listed only if it ends without an error.

        Wrap a memory's transaction in it: the decisions' durable copies are written in the
        transaction, and the in-memory list must not show what a rollback took back.
        """
        outer = getattr(self._local, "stage", None)
        stage: list[Ruling] = []
        self._local.stage = stage
        try:
            yield
        finally:
            self._local.stage = outer
        if outer is not None:
            outer.extend(stage)
        else:
            with self._lock:
                self._items.extend(stage)

    @property
    def durable(self) -> bool:
        """True when decisions survive a restart (there are records to keep them)."""
        return self._records is not None

    def record(self, decision: Ruling) -> Ruling:
        with self._lock:
            if self._records is not None:
                self._records.append_event(DECISION_OP, actor=self.name, data=decision.to_dict())
            stage = getattr(self._local, "stage", None)
            (stage if stage is not None else self._items).append(decision)
        return decision

    def list(
        self,
        *,
        outcome: str | Iterable[str] | None = None,
        reason: str | None = None,
        sender: str | None = None,
        origin: str | None = None,
        unit_id: str | None = None,
        since: float | None = None,
        limit: int | None = None,
    ) -> list[Ruling]:
        """Decisions oldest first, narrowed by any of the given fields; ``limit`` keeps the newest."""
        outcomes = {outcome} if isinstance(outcome, str) else set(outcome) if outcome else None
        with self._lock:
            items = list(self._items)
        out = [
            d
            for d in items
            if (outcomes is None or d.outcome in outcomes)
            and (reason is None or d.reason == reason)
            and (sender is None or d.sender == sender)
            and (origin is None or d.origin == origin)
            and (unit_id is None or d.unit_id == unit_id or unit_id in d.related)
            and (since is None or d.at >= since)
        ]
        return out[-limit:] if limit else out

    def counts(self, *, by: str = "reason", outcome: str | Iterable[str] | None = None) -> dict[str, int]:
        """How many decisions per ``reason``, ``outcome``, ``sender`` or ``origin``."""
        if by not in ("reason", "outcome", "sender", "origin"):
            raise ValidationError("counts(by=...) takes reason, outcome, sender or origin")
        return dict(Counter(getattr(d, by) for d in self.list(outcome=outcome)))

    def __len__(self) -> int:
        return len(self._items)


