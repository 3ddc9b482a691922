"""The Store port: durable units, relations, episodes and an append-only event log.

Backends (SQLite by default, PostgreSQL + pgvector for scale) implement :class:`Store` and
pass the same conformance suite (tests/test_store_conformance.py). Every read takes a
:class:`~forge.model.Viewer` (search methods a :class:`Filter` too); both are applied
*inside* the backend's query so an agent can never receive a unit it is not allowed to see,
nor a relation, event, vector or export record that gives one away, whatever it asks for.

Writes are atomic one by one; :meth:`Store.transaction` makes several of them one atomic
unit (the exchange writes a received unit and its ledger record together).

Besides units a store keeps two things callers need on every backend: ``settings`` (the
memory's own key/value facts: which embedder built it, reputations) and the event log, where
changes are logged by the store itself and everything else (ledger decisions, audit reads,
consolidation logs) is appended as a typed event with :meth:`Store.append_event`. An
operator's export carries both, so a moved memory keeps its ledger, reputations and embedder.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from forge.errors import ValidationError
from forge.model import Episode, Kind, Relation, RelationType, Status, Unit, Viewer

__all__ = ["ANY_STATUS", "CHANGE_OPS", "MAX_RESULTS", "SEARCH_CONTEXT", "SPEAKER", "Event", "Filter", "Hit", "Store", "indexed_text"]

#: Most results one read may ask for (``k``, ``limit``): a bigger number is a mistake, and
#: SQLite cannot take one past 2**63 at all.
MAX_RESULTS = 1_000_000


#: Event ops the store writes itself for its changes. They describe the store they happened in,
#: so they cannot be appended by callers and do not travel in an export (the import that
#: carries a memory elsewhere is itself one such event there).
CHANGE_OPS = frozenset({"add", "update", "status", "relate", "episode", "import"})


def check_event_op(op: Any) -> str:
    """Validate the op of an appended event (a backend calls this before writing)."""
    if not isinstance(op, str) or not op.strip() or len(op) > 64:
        raise ValidationError("an event needs an op: a short non-empty string")
    if op in CHANGE_OPS:
        raise ValidationError(f"{op!r} events are written by the store for its own changes; use another op")
    return op


def check_setting(key: Any, value: Any) -> tuple[str, str]:
    """Validate one setting (a backend calls this before writing)."""
    if not isinstance(key, str) or not key or len(key) > 512:
        raise ValidationError("a setting key must be a non-empty string of at most 512 characters")
    if not isinstance(value, str):
        raise ValidationError(f"setting {key!r}: the value must be a string, got {type(value).__name__}")
    return key, value


#: ``Unit.meta`` key for text indexed with a unit (embedded and keyword-searched) but not
#: part of its content: the previous turn of a conversation, the session date, a title.
SEARCH_CONTEXT = "search_context"

#: ``Unit.meta`` key for who said or wrote what a unit records (a conversation's speaker),
#: when that is not its owner: recall prefers units by someone the query names
#: (:attr:`forge.engine.recall.Weights.attribution`).
SPEAKER = "speaker"


def indexed_text(unit: Unit) -> str:
    """What a store indexes and an embedder embeds for ``unit``: its text plus its search context.

    Measured on LoCoMo (bench/locomo.py --sweep-context): the previous turn as context lifts
    both signals, because a reply ("Yes, last Tuesday!") rarely repeats what it answers.
    """
    extra = unit.meta.get(SEARCH_CONTEXT) if isinstance(unit.meta, Mapping) else None
    return f"{unit.text} {extra}" if isinstance(extra, str) and extra.strip() else unit.text


@dataclass(frozen=True, slots=True)
class Filter:
    """Which units a search may return. Empty fields mean "any".

    ``status`` defaults to active units only: quarantined, archived and superseded units are
    kept for history but never recalled unless asked for.
    """

    kinds: frozenset[Kind] = frozenset()
    status: frozenset[Status] = frozenset({Status.ACTIVE})
    tags_all: frozenset[str] = frozenset()  # every one of these tags
    tags_any: frozenset[str] = frozenset()  # at least one of these tags
    domain: str | None = None
    task: str | None = None
    role: str | None = None
    owner: str | None = None
    scopes: frozenset[str] = frozenset()  # e.g. {"global", "group:red"}; narrows, never widens
    since: float | None = None  # created_at >= since
    until: float | None = None  # created_at < until

    @classmethod
    def make(
        cls,
        *,
        kinds: Iterable[str | Kind] = (),
        status: Iterable[str | Status] | None = None,
        tags_all: Iterable[str] = (),
        tags_any: Iterable[str] = (),
        domain: str | None = None,
        task: str | None = None,
        role: str | None = None,
        owner: str | None = None,
        scopes: Iterable[str] = (),
        since: float | None = None,
        until: float | None = None,
    ) -> Filter:
        """Build a filter from loose values (strings from a CLI or JSON), validating them."""
        if since is not None and until is not None and since >= until:
            raise ValidationError("filter 'since' must be earlier than 'until'")
        return cls(
            kinds=frozenset(Kind.parse(k) for k in kinds),
            status=frozenset(Status.parse(s) for s in status)
            if status is not None
            else frozenset({Status.ACTIVE}),
            tags_all=frozenset(tags_all),
            tags_any=frozenset(tags_any),
            domain=domain,
            task=task,
            role=role,
            owner=owner,
            scopes=frozenset(scopes),
            since=since,
            until=until,
        )


ANY_STATUS = Filter(status=frozenset(Status))


@dataclass(frozen=True, slots=True)
class Hit:
    """A search result from one signal: the unit id and that signal's raw score."""

    id: str
    score: float


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of the append-only change log."""

    seq: int
    ts: float
    op: str
    unit_id: str | None
    actor: str
    data: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Store(Protocol):
    """Durable memory. Every write is atomic: it happens whole or not at all."""

    @property
    def dim(self) -> int | None:
        """Embedding dimension fixed at creation (None until the first vector)."""
        ...

    @property
    def info(self) -> Mapping[str, Any]:
        """Backend facts and capability flags (e.g. ``{"backend": "sqlite", "ann": "usearch"}``)."""
        ...

    def settings(self) -> dict[str, str]:
        """The memory's own settings (``embedder``, ``reputation/<book>/<agent>``...), not the
        backend's bookkeeping (schema version, counters)."""
        ...

    def set_setting(self, key: str, value: str) -> None:
        """Set one setting; inside :meth:`transaction` it commits or rolls back with the rest."""
        ...

    def claim(self, key: str) -> bool:
        """Record ``key`` once and for all: True for the one call that recorded it, False
        when it was recorded before. Inside :meth:`transaction` the claim is undone with
        the rest, and a concurrent claim of the same key waits for that transaction to end,
        so replicas of one receiver act on a message exactly once (the exchange claims
        each capsule id)."""
        ...

    def transaction(self) -> AbstractContextManager[None]:
        """``with store.transaction():`` makes the writes inside one atomic unit.

        Nested blocks are savepoints (an inner failure undoes only the inner block);
        side effects outside the database wait for the outermost commit.
        """
        ...

    # -- units ------------------------------------------------------------------------
    def add(
        self, units: Sequence[Unit], vectors: np.ndarray | None = None, *, actor: str = ""
    ) -> list[str]: ...

    def get(self, unit_id: str, *, viewer: Viewer) -> Unit: ...

    def get_many(self, ids: Sequence[str], *, viewer: Viewer) -> list[Unit]: ...

    def update(self, unit: Unit, vector: np.ndarray | None = None, *, actor: str = "") -> Unit: ...

    def set_status(self, unit_id: str, status: Status, *, reason: str, actor: str = "") -> None: ...

    def erase(self, unit_id: str, *, actor: str = "", reason: str = "") -> dict[str, Any]:
        """Remove a unit's content, vector, keyword postings, relations and history text,
        leaving one ``erase`` event (who, which id, when, why); the tombstone's data
        (:mod:`forge.store.erase`). Archiving keeps a unit; this does not."""
        ...

    def list(
        self, *, viewer: Viewer, filter: Filter = Filter(), limit: int = 100, offset: int = 0
    ) -> list[Unit]: ...

    def count(self, *, viewer: Viewer, filter: Filter = Filter()) -> int: ...

    def vector(self, unit_id: str, *, viewer: Viewer) -> np.ndarray | None: ...

    # -- search (scope + filter enforced inside) --------------------------------------
    def vector_search(
        self, query: np.ndarray, *, k: int, viewer: Viewer, filter: Filter = Filter()
    ) -> builtins.list[Hit]: ...

    def keyword_search(
        self, query: str, *, k: int, viewer: Viewer, filter: Filter = Filter()
    ) -> builtins.list[Hit]: ...

    def neighbors(
        self,
        ids: Sequence[str],
        *,
        viewer: Viewer,
        types: Iterable[RelationType] = (),
        filter: Filter = Filter(),
    ) -> builtins.list[tuple[str, Relation]]: ...

    def touch(self, ids: Sequence[str], *, at: float | None = None) -> None:
        """Record that units were recalled (access count, last access)."""
        ...

    # -- relations, episodes, events --------------------------------------------------
    def relate(self, relation: Relation, *, actor: str = "") -> None: ...

    def relations(self, unit_id: str, *, viewer: Viewer) -> builtins.list[Relation]:
        """Relations of a unit whose both ends ``viewer`` may see."""
        ...

    def add_episode(self, episode: Episode, *, actor: str = "") -> str: ...

    def get_episode(self, episode_id: str) -> Episode: ...

    def events(
        self,
        *,
        viewer: Viewer,
        since_seq: int = 0,
        unit_id: str | None = None,
        limit: int = 1000,
        actor: str | None = None,
        ops: Iterable[str] = (),
        since: float | None = None,
        until: float | None = None,
        newest_first: bool = False,
        naming: str | None = None,
    ) -> builtins.list[Event]:
        """The event log as ``viewer`` may see it (values it could not see then are hidden),
        oldest first (or newest first), narrowed by any of the given fields; ``naming``: only
        events appended with that unit among their ``names`` (:meth:`append_events`), read
        through an index (a recall that returned it)."""
        ...

    def append_event(
        self, op: str, *, unit_id: str | None = None, actor: str = "", data: Mapping[str, Any] | None = None,
        at: float | None = None,
    ) -> int:
        """Append one event that is not a change (a read, a recall, a ledger decision) and
        return its seq. ``op`` may not be one of :data:`CHANGE_OPS`. ``at`` is when it
        happened (default now): a batched audit record keeps its read time.

        The service's audit trail and the exchange's ledger use it. Events without a
        ``unit_id`` are the operator's: an agent's :meth:`events` never shows them.
        """
        ...

    def append_events(self, events: Sequence[tuple[Any, ...]]) -> None:
        """Append many such events, ``(op, unit_id, actor, data, at)`` each, in one transaction
        (the service's batched read records); a sixth item, the ids of the units the event
        names (a recall's results), indexes it for :meth:`events`' ``naming``."""
        ...

    # -- bulk ---------------------------------------------------------------------------
    def export_records(self, *, viewer: Viewer) -> Iterator[dict[str, Any]]:
        """Every unit, relation and episode ``viewer`` may see; the operator also gets the
        settings and the appended events (records ``setting`` and ``event``)."""
        ...

    def import_records(self, records: Iterable[dict[str, Any]], *, actor: str = "import") -> int:
        """Import export records in ONE transaction: all land or none do.

        Imported settings fill keys the store lacks; a key it has keeps its value, except that
        vectors from another embedder than the store's are refused.
        """
        ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...
