"""The SQL both database backends share, written once.

A :class:`Dialect` says how one database spells what the shared SQL needs: its parameter
mark, a membership test, tag containment, how a unit's row is encoded. The filter compiler
(:meth:`Dialect.where`) turns a :class:`~forge.store.base.Filter` and a
:class:`~forge.model.Viewer` into one SQL condition with it, so both backends admit exactly
the same units. Each backend's dialect lives in the backend's module, beside its quirks.

:class:`SQLStore` is the rest of a store that reads the same on both: get, list, count,
relations, neighbours, episodes, the event log (and what a viewer may see of it), settings,
claims, the writes around each backend's own insert, export and import. A backend
subclasses it and fills in the hooks where its database differs (how it inserts a batch,
where a vector lives, what a savepoint looks like, which text it cannot hold).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar, Self

import numpy as np

from forge.errors import ConflictError, DimensionError, NotFoundError, ValidationError
from forge.model import Episode, Relation, RelationType, Status, Unit, Viewer
from forge.store.base import ANY_STATUS, CHANGE_OPS, Event, Filter, check_event_op, check_setting
from forge.store.common import (
    check_vectors,
    count_arg,
    diff,
    int_arg,
    query_words,
    redact_events,
    row_unit,
    unit_row,
)
from forge.store.records import (
    ImportBatch,
    event_record,
    parse_records,
    setting_record,
    vector_field,
)

__all__ = ["COLUMNS", "Dialect", "Duplicate", "SQLStore"]

#: The ``units`` columns a unit is read from, in the order of :func:`forge.store.common.unit_row`.
COLUMNS = (
    "id, kind, content, domain, task, role, tags, scope, owner, confidence, validation, "
    "importance, access_count, last_access, created_at, updated_at, provenance, status, meta"
)


class Dialect:
    """How one database spells the shared SQL. Subclasses set the attributes and override
    the methods whose spelling differs; the rest is common to SQLite and PostgreSQL."""

    #: The parameter placeholder.
    mark = "?"
    #: A condition that is always true.
    true = "1"
    #: Put before a visibility column to keep the planner off its index (SQLite: unary +).
    unindexed = ""
    #: The owner an agent-less viewer is compared with: one no unit has.
    nobody: str | None = None

    def marks(self, n: int) -> str:
        """``n`` placeholders, comma-separated."""
        return ", ".join([self.mark] * n)

    def in_(self, expr: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``expr`` is one of ``values`` (text), as SQL and its parameters."""
        return f"{expr} IN ({','.join([self.mark] * len(values))})", list(values)

    def tags_all(self, p: str, tags: Sequence[str], kinds: Sequence[str] = ()) -> tuple[str, list[Any]]:
        """The unit (columns prefixed ``p``) has every one of ``tags``. ``kinds`` are the
        filter's kinds (tested on their own as well), for a tag index that holds the kind too."""
        raise NotImplementedError

    def tags_any(self, p: str, tags: Sequence[str], kinds: Sequence[str] = ()) -> tuple[str, list[Any]]:
        """The unit (columns prefixed ``p``) has at least one of ``tags``; ``kinds`` as for :meth:`tags_all`."""
        raise NotImplementedError

    def encode_tags(self, tags: list[str]) -> Any:
        """A unit's tags as the ``tags`` column holds them."""
        raise NotImplementedError

    def decode_tags(self, value: Any) -> Sequence[str]:
        """The ``tags`` column's value as a list of tags."""
        return tuple(value)

    def clean_text(self, text: str) -> str:
        """The indexed text as the database can hold it."""
        return text

    def unit_row(self, unit: Unit) -> tuple[Any, ...]:
        """``unit`` as the ``units`` columns :data:`COLUMNS` names, then ``search_text``."""
        return unit_row(unit, tags=self.encode_tags, text=self.clean_text)

    def row_unit(self, row: Sequence[Any]) -> Unit:
        """The unit of a row read as :data:`COLUMNS`."""
        return row_unit(row, tags=self.decode_tags)

    def visible(self, p: str, viewer: Viewer) -> tuple[str, list[Any]]:
        """What a (non-operator) ``viewer`` may see: global units, its own private ones and
        its groups' (the rule of :func:`forge.store.common.sees`)."""
        c = f"{self.unindexed}{p}"
        sql = f"({c}scope = 'global' OR ({c}scope = 'private' AND {c}owner = {self.mark})"
        params: list[Any] = [viewer.agent or self.nobody]
        groups = sorted(f"group:{g}" for g in viewer.groups)
        if groups:
            member, values = self.in_(f"{c}scope", groups)
            sql += f" OR {member}"
            params.extend(values)
        return sql + ")", params

    def where(self, viewer: Viewer, f: Filter, *, alias: str = "") -> tuple[str, list[Any]]:
        """SQL for scope visibility plus the filter; the viewer clause is never optional."""
        p = f"{alias}." if alias else ""
        m = self.mark
        clauses: list[str] = []
        params: list[Any] = []

        def add(sql: str, values: Sequence[Any]) -> None:
            clauses.append(sql)
            params.extend(values)

        if not viewer.operator:
            add(*self.visible(p, viewer))
        if f.status and len(f.status) < len(Status):
            add(*self.in_(f"{p}status", sorted(s.value for s in f.status)))
        kinds = sorted(k.value for k in f.kinds)
        if kinds:
            add(*self.in_(f"{p}kind", kinds))
        for col in ("domain", "task", "role", "owner"):
            value = getattr(f, col)
            if value is not None:
                add(f"{p}{col} = {m}", [value])
        if f.scopes:
            add(*self.in_(f"{p}scope", sorted(f.scopes)))
        if f.tags_all:
            add(*self.tags_all(p, sorted(f.tags_all), kinds))
        if f.tags_any:
            add(*self.tags_any(p, sorted(f.tags_any), kinds))
        if f.since is not None:
            add(f"{p}created_at >= {m}", [f.since])
        if f.until is not None:
            add(f"{p}created_at < {m}", [f.until])
        return (" AND ".join(clauses) or self.true), params


class Duplicate(ConflictError):
    """A unique key refused a row: what a backend's :meth:`SQLStore._savepoint` raises, for
    the shared code to say which row it was."""


#: An event as it is written: (ts, op, unit id, actor, data).
EventRow = tuple[float, str, str | None, str, Mapping[str, Any]]
#: Units kept decoded by :meth:`SQLStore._decoded` (a few MB).
DECODED_MAX = 4096


class SQLStore(ABC):
    """What a :class:`~forge.store.base.Store` on SQL does the same on every database: reads,
    the event log, export and import, written once over :attr:`dialect` and a few hooks.

    A backend sets :attr:`dialect` and the table facts below, and implements the hooks
    (``_q``, ``_tx``, and the writes whose SQL is its own). Its quirks stay in those hooks.
    """

    dialect: ClassVar[Dialect]
    #: The column that numbers rows of ``units`` and ``relations`` in insertion order.
    _KEY: ClassVar[str]
    #: The SQL expression of a unit's stored vector, decoded by :meth:`_vector_value`.
    _VECTOR: ClassVar[str]
    #: The table of the memory's settings, and the keys in it that are the backend's own.
    _SETTINGS: ClassVar[str]
    _INTERNAL_KEYS: ClassVar[frozenset[str]] = frozenset()
    #: What a read of the row an update rewrites ends with (a row lock, where there is one).
    _LOCK_ROW: ClassVar[str] = ""
    _dim: int | None

    # -- hooks ----------------------------------------------------------------------------
    @abstractmethod
    def _q(self, sql: str, params: Sequence[Any] = (), *, viewer: Viewer | None = None) -> list[tuple[Any, ...]]:
        """Rows of one read; ``viewer`` is who reads (a backend may check it a second time)."""

    @abstractmethod
    def _tx(self) -> AbstractContextManager[Any]:
        """One write transaction (a savepoint when nested), undone whole on any error; it
        yields the connection to write on."""

    @abstractmethod
    def _savepoint(self, db: Any) -> AbstractContextManager[None]:
        """Around one statement that may hit a unique key: when it does, the statement is
        undone alone and :class:`Duplicate` raised."""

    @abstractmethod
    def _fix_dim(self, db: Any, vectors: np.ndarray | None) -> None:
        """Inside a write: the first vectors fix the memory's dimension."""

    @abstractmethod
    def _insert_units(
        self, db: Any, units: list[Unit], vectors: np.ndarray | None, *, actor: str, now: float, log: bool = True
    ) -> None:
        """Insert new units (and their vectors); log an ``add`` event for each unless told not to."""

    @abstractmethod
    def _vector_sets(self, db: Any, vector: np.ndarray) -> tuple[str, list[Any]]:
        """The SET clause (starting with a comma) that stores ``vector`` in an update, and its parameters."""

    @abstractmethod
    def _log_many(self, db: Any, events: Sequence[EventRow]) -> None:
        """Append events inside a write."""

    @abstractmethod
    def _stats_extra(self) -> dict[str, Any]:
        """The backend's own lines of :meth:`stats`."""

    def _check_text(self, value: str, what: str) -> None:
        """Refuse text the database cannot hold (default: it holds any)."""
        return

    def _wrote(self, vectors: np.ndarray | None) -> None:
        """Inside a write transaction that stored ``vectors`` (default: nothing to do)."""
        return

    def _after_update(self, db: Any, unit: Unit) -> None:
        """Inside an update, after the unit's row was rewritten (default: nothing to do)."""
        return

    def _importing(self, matrix: np.ndarray | None) -> AbstractContextManager[None]:
        """What an import of ``matrix`` runs inside (default: nothing)."""
        return contextlib.nullcontext()

    def _current_dim(self) -> int | None:
        """The dimension to check a vector query against."""
        return self._dim

    @abstractmethod
    def _vector_value(self, raw: Any) -> np.ndarray:
        """A vector as :attr:`_VECTOR` reads it, as float32."""

    def _id_batches(self, ids: Iterable[str]) -> Iterator[list[str]]:
        """``ids`` in batches of what one statement may take (default: all at once)."""
        yield list(ids)

    def _touched(self, unit: Unit) -> Unit:
        """``unit`` with access statistics not yet written (default: none wait)."""
        return unit

    # -- facts ----------------------------------------------------------------------------
    @property
    def dim(self) -> int | None:
        return self._dim

    def settings(self) -> dict[str, str]:
        return {k: v for k, v in self._q(f"SELECT key, value FROM {self._SETTINGS}") if k not in self._INTERNAL_KEYS}

    def set_setting(self, key: str, value: str) -> None:
        key, value = check_setting(key, value)
        if key in self._INTERNAL_KEYS:
            raise ValidationError(f"{key!r} is the store's own bookkeeping, not a setting")
        self._check_text(key, "a setting key")
        self._check_text(value, "a setting value")
        with self._tx() as db:
            db.execute(
                f"INSERT INTO {self._SETTINGS} VALUES ({self.dialect.marks(2)}) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def claim(self, key: str) -> bool:
        key, _ = check_setting(key, "")
        self._check_text(key, "a claim key")
        with self._tx() as db:
            # A concurrent insert of the same key waits on this one's transaction (unique key).
            inserted: int = db.execute(
                f"INSERT INTO claims VALUES ({self.dialect.marks(2)}) ON CONFLICT (key) DO NOTHING", (key, time.time())
            ).rowcount
            return inserted == 1

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group several writes into one atomic transaction: all of them land, or none.

        Writes made inside (``add``, ``update``, ``relate``, settings...) join it; nested
        ``transaction()`` blocks are savepoints, so an inner block that fails is undone
        alone and the outer one may go on. Other threads of this process wait until it
        ends; other processes see it all at once on commit. Side effects outside the
        database (SQLite's vector index, PostgreSQL's background indexer) wait for the
        outermost commit.
        """
        with self._tx():
            yield

    def stats(self) -> dict[str, Any]:
        by = {col: dict(self._q(f"SELECT {col}, count(*) FROM units GROUP BY {col} ORDER BY {col}"))
              for col in ("kind", "status", "scope")}
        return {
            "units": sum(by["kind"].values()),
            "by_kind": by["kind"],
            "by_status": by["status"],
            "by_scope": by["scope"],
            **{table: self._q(f"SELECT count(*) FROM {table}")[0][0] for table in ("relations", "episodes", "events")},
            "dim": self._dim,
            **self._stats_extra(),
        }

    # -- writes ---------------------------------------------------------------------------
    def add(self, units: Sequence[Unit], vectors: np.ndarray | None = None, *, actor: str = "") -> list[str]:
        units = list(units)
        if not units:
            return []
        vectors = check_vectors(vectors, len(units), self._dim)
        ids = [u.id for u in units]
        if len(set(ids)) != len(ids):
            raise ValidationError("duplicate unit ids in one batch")
        now = time.time()
        with self._tx() as db:
            self._fix_dim(db, vectors)
            self._insert_units(db, units, vectors, actor=actor, now=now)
            self._wrote(vectors)
        return ids

    def _duplicate(self, db: Any, ids: list[str]) -> ConflictError:
        """The error for a batch of units whose insert a taken id refused (and undid)."""
        existing = self._existing(db, ids)
        first = next((i for i, uid in enumerate(ids) if uid in existing), None)
        where = f"unit {first + 1} of {len(ids)}, id {ids[first]}" if first is not None else "unknown unit"
        return ConflictError(f"unit id already exists: {where}")

    def _existing(self, db: Any, ids: Iterable[str]) -> set[str]:
        """Which of ``ids`` name units, read inside a write."""
        found: set[str] = set()
        for batch in self._id_batches(ids):
            if batch:
                member, mp = self.dialect.in_("id", batch)
                found.update(r[0] for r in db.execute(f"SELECT id FROM units WHERE {member}", mp))
        return found

    def update(self, unit: Unit, vector: np.ndarray | None = None, *, actor: str = "") -> Unit:
        vectors = check_vectors(vector, 1, self._dim)
        now = time.time()
        d, m = self.dialect, self.dialect.mark
        with self._tx() as db:
            old = db.execute(f"SELECT {COLUMNS} FROM units WHERE id = {m}{self._LOCK_ROW}", (unit.id,)).fetchone()
            if old is None:
                raise NotFoundError(f"no unit with id {unit.id}")
            before = d.row_unit(old)
            unit = unit.replace(updated_at=now)
            self._fix_dim(db, vectors)
            sets = ", ".join(f"{c.strip()} = {m}" for c in COLUMNS.split(",")[1:]) + f", search_text = {m}"
            params = list(d.unit_row(unit)[1:])
            if vectors is not None:
                more, values = self._vector_sets(db, vectors[0])
                sets += more
                params += values
            db.execute(f"UPDATE units SET {sets} WHERE id = {m}", (*params, unit.id))
            self._after_update(db, unit)
            self._log(db, "update", unit.id, actor, diff(before.to_dict(), unit.to_dict()), at=now)
            self._wrote(vectors)
        return unit

    def set_status(self, unit_id: str, status: Status, *, reason: str, actor: str = "") -> None:
        status = Status.parse(status)
        now = time.time()
        m = self.dialect.mark
        with self._tx() as db:
            row = db.execute(f"SELECT status FROM units WHERE id = {m}{self._LOCK_ROW}", (unit_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no unit with id {unit_id}")
            db.execute(f"UPDATE units SET status = {m}, updated_at = {m} WHERE id = {m}", (status.value, now, unit_id))
            self._log(db, "status", unit_id, actor, {"from": row[0], "to": status.value, "reason": reason}, at=now)

    def relate(self, relation: Relation, *, actor: str = "") -> None:
        with self._tx() as db:
            found = self._existing(db, [relation.src, relation.dst])
            missing = [i for i in (relation.src, relation.dst) if i not in found]
            if missing:
                raise NotFoundError(f"cannot relate: no unit with id {missing[0]}")
            self._upsert_relation(db, relation)
            self._log(db, "relate", relation.src, actor, relation.to_dict())

    def _upsert_relation(self, db: Any, rel: Relation) -> None:
        self._check_text(rel.note, "a relation note")
        db.execute(
            f"INSERT INTO relations (src, dst, type, weight, created_at, note) VALUES ({self.dialect.marks(6)}) "
            "ON CONFLICT (src, dst, type) DO UPDATE SET weight = excluded.weight, "
            "created_at = excluded.created_at, note = excluded.note",
            (rel.src, rel.dst, rel.type.value, rel.weight, rel.created_at, rel.note),
        )

    def add_episode(self, episode: Episode, *, actor: str = "") -> str:
        with self._tx() as db:
            self._insert_episode(db, episode)
            self._log(db, "episode", None, actor, {"episode": episode.id, "steps": len(episode.steps)})
        return episode.id

    def _insert_episode(self, db: Any, ep: Episode) -> None:
        for value, name in ((ep.id, "episode id"), (ep.agent, "agent"), (ep.task, "task"), (ep.env, "env")):
            self._check_text(value, name)
        try:
            with self._savepoint(db):
                db.execute(
                    f"INSERT INTO episodes VALUES ({self.dialect.marks(6)})",
                    (ep.id, ep.agent, ep.task, ep.env, ep.created_at, json.dumps(ep.to_dict())),
                )
        except Duplicate:
            raise ConflictError(f"episode id already exists: {ep.id}") from None

    # -- the event log --------------------------------------------------------------------
    def append_event(
        self, op: str, *, unit_id: str | None = None, actor: str = "", data: Mapping[str, Any] | None = None,
        at: float | None = None,
    ) -> int:
        op = check_event_op(op)
        with self._tx() as db:
            return self._log(db, op, unit_id, actor, data or {}, at=at)

    log_event = append_event  # the older name, kept for callers written before append_event

    def append_events(self, events: Sequence[tuple[Any, ...]]) -> None:
        """Append many events that are not changes, ``(op, unit_id, actor, data, at)`` each, in one
        transaction: a batch of audit records costs ~15-30 us each where one :meth:`append_event`
        apiece (a savepoint and an INSERT) cost ~70-130 us. A sixth item names the units the
        event is about (a recall's results): ``event_units`` indexes them, so the recalls of one
        unit are found without reading every recall (:func:`forge.curate.trace.trace`)."""
        rows: list[EventRow] = []
        names: list[tuple[str, ...]] = []
        for event in events:
            op, unit_id, actor, data, at = event[:5]
            op = check_event_op(op)
            for value, what in ((op, "an event op"), (actor, "an event actor"), (unit_id or "", "an event unit id")):
                self._check_text(value, what)
            named = tuple(dict.fromkeys(n for n in (event[5] if len(event) > 5 else ()) if isinstance(n, str) and n))
            for n in named:
                self._check_text(n, "a named unit id")
            rows.append((float(at), op, unit_id, actor, data or {}))
            names.append(named)
        if not rows:
            return
        with self._tx() as db:
            if not any(names):
                self._log_many(db, rows)
                return
            refs: list[tuple[str, int]] = []
            for (at, op, unit_id, actor, data), named in zip(rows, names, strict=True):
                seq = self._log(db, op, unit_id, actor, data, at=at)
                refs.extend((n, seq) for n in named)
            with contextlib.closing(db.cursor()) as cur:
                cur.executemany(f"INSERT INTO event_units (unit_id, seq) VALUES ({self.dialect.marks(2)}) "
                                "ON CONFLICT DO NOTHING", refs)

    def _naming(self) -> str:
        """The clause that keeps events naming one unit (its parameter follows)."""
        return f"e.seq IN (SELECT seq FROM event_units WHERE unit_id = {self.dialect.mark})"

    def _log(self, db: Any, op: str, unit_id: str | None, actor: str, data: Mapping[str, Any], *, at: float | None = None) -> int:
        """Append one event inside a write; its seq."""
        for value, what in ((op, "an event op"), (actor, "an event actor"), (unit_id or "", "an event unit id")):
            self._check_text(value, what)
        seq: int = db.execute(
            f"INSERT INTO events (ts, op, unit_id, actor, data) VALUES ({self.dialect.marks(5)}) RETURNING seq",
            (time.time() if at is None else float(at), op, unit_id, actor, json.dumps(dict(data), default=str)),
        ).fetchall()[0][0]
        return seq

    # -- reads ----------------------------------------------------------------------------
    def get(self, unit_id: str, *, viewer: Viewer) -> Unit:
        units = self.get_many([unit_id], viewer=viewer)
        if not units:
            raise NotFoundError(f"no unit with id {unit_id}")
        return units[0]

    def get_many(self, ids: Sequence[str], *, viewer: Viewer) -> list[Unit]:
        if not ids:
            return []
        where, params = self.dialect.where(viewer, ANY_STATUS)
        out: dict[str, Unit] = {}
        for batch in self._id_batches(ids):
            member, mp = self.dialect.in_("id", batch)
            for r in self._q(f"SELECT {COLUMNS} FROM units WHERE {member} AND {where}", (*mp, *params), viewer=viewer):
                out[r[0]] = self._touched(self._decoded(r))
        return [out[i] for i in ids if i in out]

    def _decoded(self, row: Sequence[Any]) -> Unit:
        """The unit of ``row``, decoded once per version of it: the last units decoded are
        kept by id with their row, and a row read again unchanged (every column equal, so
        any write makes it another version) gives back the same frozen unit. Recall reads
        the same units again and again; rebuilding one took ~13 us of a ~20 us read."""
        cache: dict[str, tuple[Sequence[Any], Unit]] | None = getattr(self, "_units_decoded", None)
        if cache is None:
            cache = {}
            self._units_decoded = cache
        kept = cache.get(row[0])
        if kept is not None and kept[0] == row:
            return kept[1]
        unit = self.dialect.row_unit(row)
        if len(cache) >= DECODED_MAX:
            with contextlib.suppress(RuntimeError, StopIteration, KeyError):  # another thread changed it meanwhile
                del cache[next(iter(cache))]  # the oldest
        cache[row[0]] = (row, unit)
        return unit

    def list(self, *, viewer: Viewer, filter: Filter = Filter(), limit: int = 100, offset: int = 0) -> list[Unit]:
        limit, offset = count_arg(limit, "limit"), int_arg(offset, "offset")
        if offset < 0:
            raise ValidationError("offset cannot be negative")
        where, params = self.dialect.where(viewer, filter)
        m = self.dialect.mark
        rows = self._q(
            f"SELECT {COLUMNS} FROM units WHERE {where} ORDER BY created_at, {self._KEY} LIMIT {m} OFFSET {m}",
            (*params, limit, offset), viewer=viewer,
        )
        return [self._touched(self.dialect.row_unit(r)) for r in rows]

    def count(self, *, viewer: Viewer, filter: Filter = Filter()) -> int:
        where, params = self.dialect.where(viewer, filter)
        return int(self._q(f"SELECT count(*) FROM units WHERE {where}", params, viewer=viewer)[0][0])

    def vector(self, unit_id: str, *, viewer: Viewer) -> np.ndarray | None:
        where, params = self.dialect.where(viewer, ANY_STATUS)
        m = self.dialect.mark
        row = self._q(f"SELECT {self._VECTOR} FROM units WHERE id = {m} AND {where}", (unit_id, *params), viewer=viewer)
        if not row:
            raise NotFoundError(f"no unit with id {unit_id}")
        return None if row[0][0] is None else self._vector_value(row[0][0])

    def relations(self, unit_id: str, *, viewer: Viewer) -> builtins.list[Relation]:
        """Relations of a unit whose both ends ``viewer`` may see (none if it may not see the unit)."""
        m = self.dialect.mark
        sql, params = self._relations_sql(viewer, f"(r.src = {m} OR r.dst = {m})", [unit_id, unit_id])
        rows = self._q(f"{sql} ORDER BY r.created_at, r.{self._KEY}", params, viewer=viewer)
        return [Relation(*r) for r in rows]

    def _relations_sql(self, viewer: Viewer, cond: str = "", params: Sequence[Any] = ()) -> tuple[str, builtins.list[Any]]:
        """The relations whose both ends ``viewer`` may see (and that meet ``cond``), as SQL
        and its parameters."""
        sql = "SELECT r.src, r.dst, r.type, r.weight, r.created_at, r.note FROM relations r"
        conds, out = [cond] if cond else [], list(params)
        if not viewer.operator:
            sql += " JOIN units s ON s.id = r.src JOIN units d ON d.id = r.dst"
            for alias in ("s", "d"):
                where, wp = self.dialect.where(viewer, ANY_STATUS, alias=alias)
                conds.append(where)
                out.extend(wp)
        return (f"{sql} WHERE {' AND '.join(conds)}" if conds else sql), out

    def _visible_ids(self, ids: Iterable[str], viewer: Viewer) -> set[str]:
        """Which of ``ids`` name units ``viewer`` may see (any status)."""
        ids = list(dict.fromkeys(ids))
        if viewer.operator:
            return set(ids)
        where, params = self.dialect.where(viewer, ANY_STATUS)
        out: set[str] = set()
        for batch in self._id_batches(ids):
            member, mp = self.dialect.in_("id", batch)
            out.update(r[0] for r in self._q(f"SELECT id FROM units WHERE {member} AND {where}", (*mp, *params), viewer=viewer))
        return out

    def neighbors(
        self,
        ids: Sequence[str],
        *,
        viewer: Viewer,
        types: Iterable[RelationType] = (),
        filter: Filter = Filter(),
    ) -> builtins.list[tuple[str, Relation]]:
        # Seeds the viewer may not see have no neighbours for it: their relations are theirs.
        if not viewer.operator:
            visible = self._visible_ids(ids, viewer)  # one query for all seeds
            ids = [i for i in dict.fromkeys(ids) if i in visible]
        else:
            ids = list(ids)
        if not ids:
            return []
        d = self.dialect
        where, params = d.where(viewer, filter, alias="u")
        (src, sp), (dst, dp) = d.in_("r.src", ids), d.in_("r.dst", ids)
        kinds, kp = d.in_("r.type", [RelationType.parse(t).value for t in types]) if types else ("", [])
        rows = self._q(
            f"SELECT u.id, r.src, r.dst, r.type, r.weight, r.created_at, r.note FROM relations r "
            f"JOIN units u ON u.id = CASE WHEN {src} THEN r.dst ELSE r.src END "
            f"WHERE ({src} OR {dst}){' AND ' + kinds if kinds else ''} AND {where} ORDER BY r.{self._KEY}",
            (*sp, *sp, *dp, *kp, *params), viewer=viewer,
        )
        return [(r[0], Relation(*r[1:])) for r in rows]

    def get_episode(self, episode_id: str) -> Episode:
        row = self._q(f"SELECT body FROM episodes WHERE id = {self.dialect.mark}", (episode_id,))
        if not row:
            raise NotFoundError(f"no episode with id {episode_id}")
        return Episode.from_dict(json.loads(row[0][0]))

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
        """The change log as ``viewer`` may see it, oldest first (or newest first), narrowed
        by any of the given fields (``naming``: see :meth:`append_events`).

        The operator sees every event. An agent sees the events of units it may see now,
        and of each event only what it could see then: a unit that was private to another
        agent before it was shared shows that it changed, not what it said before; an event
        that names a unit the agent may not see (a relation to it) is left out.
        """
        d, m = self.dialect, self.dialect.mark
        limit = count_arg(limit, "limit")
        since_seq = int_arg(since_seq, "since_seq")
        ops = sorted(set(ops))
        narrow = ""
        params: list[Any] = [since_seq]
        for clause, value in (("e.unit_id =", unit_id), ("e.actor =", actor), ("e.ts >=", since), ("e.ts <", until)):
            if value is not None:
                narrow += f" AND {clause} {m}"
                params.append(value)
        if ops:
            member, mp = d.in_("e.op", ops)
            narrow += f" AND {member}"
            params.extend(mp)
        if naming is not None:
            narrow += f" AND {self._naming()}"
            params.append(naming)
        order = "DESC" if newest_first else ""
        if viewer.operator:
            rows = self._q(
                f"SELECT e.seq, e.ts, e.op, e.unit_id, e.actor, e.data FROM events e WHERE e.seq > {m}{narrow} "
                f"ORDER BY e.seq {order} LIMIT {m}",
                (*params, limit), viewer=viewer,
            )
            return [Event(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]
        where, wparams = d.where(viewer, ANY_STATUS, alias="u")
        rows = self._q(
            "SELECT e.seq, e.ts, e.op, e.unit_id, e.actor, e.data, u.scope, u.owner FROM events e "
            f"JOIN units u ON u.id = e.unit_id WHERE e.seq > {m}{narrow} AND {where} ORDER BY e.seq {order} LIMIT {m}",
            (*params, *wparams, limit), viewer=viewer,
        )
        if not rows:
            return []
        # Scope and owner changes after each event, to know what the unit was at that time.
        later: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for batch in self._id_batches(sorted({r[3] for r in rows})):
            member, mp = d.in_("unit_id", batch)
            for seq, uid, data in self._q(
                f"SELECT seq, unit_id, data FROM events WHERE op = 'update' AND seq > {m} AND {member} ORDER BY seq DESC",
                (min(r[0] for r in rows) - 1, *mp), viewer=viewer,
            ):
                change = json.loads(data)
                if "scope" in change or "owner" in change:
                    later.setdefault(uid, []).append((seq, change))
        named = {json.loads(r[5]).get(k) for r in rows if r[2] == "relate" for k in ("src", "dst")}
        visible_named = self._visible_ids([n for n in named if isinstance(n, str)], viewer)
        return redact_events(rows, later, visible_named, viewer)

    # -- search arguments -------------------------------------------------------------------
    def _search_vector(self, query: Any) -> np.ndarray:
        """A vector query as float32, or the error that says what is wrong with it."""
        try:
            vector: np.ndarray = np.asarray(query, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError):
            raise ValidationError("a vector query must be a list of numbers") from None
        if not np.isfinite(vector).all():
            raise ValidationError("the query vector contains NaN or infinite values")
        dim = self._current_dim()
        if dim is not None and vector.shape[0] != dim:
            raise DimensionError(dim, vector.shape[0])
        return vector

    def _search_words(self, query: Any) -> builtins.list[str]:
        """The words a keyword query matches, or the error for a query that is not text."""
        if not isinstance(query, str):
            raise ValidationError(f"a keyword query must be a string, got {type(query).__name__}")
        return query_words(query)

    # -- bulk -----------------------------------------------------------------------------
    def export_records(self, *, viewer: Viewer) -> Iterator[dict[str, Any]]:
        """Every unit (with its vector), relation and episode ``viewer`` may see, as JSON-ready
        records: the operator gets everything (settings and appended events too); an agent
        its visible units, the relations between them, and its own episodes."""
        d, m, key = self.dialect, self.dialect.mark, self._KEY
        where, params = d.where(viewer, ANY_STATUS)
        last = 0
        while rows := self._q(
            f"SELECT {key}, {COLUMNS}, {self._VECTOR} FROM units WHERE {key} > {m} AND {where} ORDER BY {key} LIMIT 1000",
            (last, *params), viewer=viewer,
        ):
            for r in rows:
                rec = {"record": "unit", **self._touched(d.row_unit(r[1:-1])).to_dict()}
                if r[-1] is not None:
                    rec["vector"] = vector_field(self._vector_value(r[-1]))
                yield rec
            last = rows[-1][0]
        rel_sql, rel_params = self._relations_sql(viewer)
        for r in self._q(f"{rel_sql} ORDER BY r.{key}", rel_params, viewer=viewer):
            yield {"record": "relation", **Relation(*r).to_dict()}
        ep_sql, ep_params = "SELECT body FROM episodes", []
        if not viewer.operator:
            ep_sql, ep_params = f"SELECT body FROM episodes WHERE agent = {m}", [viewer.agent or d.nobody]
        for (body,) in self._q(ep_sql + " ORDER BY created_at, id", ep_params):
            yield {"record": "episode", **json.loads(body)}
        if not viewer.operator:
            return
        for k, value in sorted(self.settings().items()):
            yield setting_record(k, value)
        changes, cp = d.in_("op", sorted(CHANGE_OPS))
        last = 0
        while rows := self._q(
            f"SELECT seq, ts, op, unit_id, actor, data FROM events WHERE seq > {m} AND NOT ({changes}) ORDER BY seq LIMIT 1000",
            (last, *cp),
        ):
            for _seq, ts, op, uid, who, data in rows:
                yield event_record(ts, op, uid, who, json.loads(data))
            last = rows[-1][0]

    def import_records(self, records: Iterable[dict[str, Any]], *, actor: str = "import") -> int:
        now = time.time()
        batch = parse_records(records)
        batch.check_embedder(self.settings().get("embedder"))
        matrix = check_vectors(batch.vectors, len(batch.units), self._dim) if batch.vectors is not None else None
        with self._importing(matrix):
            return self._import(batch, matrix, actor=actor, now=now)

    def _import(self, batch: ImportBatch, matrix: np.ndarray | None, *, actor: str, now: float) -> int:
        """Write validated records in one transaction."""
        with self._tx() as db:
            if batch.units:
                self._fix_dim(db, matrix)
                self._insert_units(db, batch.units, matrix, actor=actor, now=now, log=False)
            known = {u.id for u in batch.units}
            found = self._existing(db, sorted({e for rel in batch.relations for e in (rel.src, rel.dst)} - known))
            for rel in batch.relations:
                for end in (rel.src, rel.dst):
                    if end not in known and end not in found:
                        raise NotFoundError(f"relation {rel.src} -> {rel.dst}: no unit with id {end}")
                self._upsert_relation(db, rel)
            for ep in batch.episodes:
                self._insert_episode(db, ep)
            for key, value in batch.settings.items():
                if key not in self._INTERNAL_KEYS:
                    self._check_text(key, "a setting key")
                    self._check_text(value, "a setting value")
                    db.execute(
                        f"INSERT INTO {self._SETTINGS} VALUES ({self.dialect.marks(2)}) ON CONFLICT (key) DO NOTHING",
                        (key, value),
                    )
            for _ts, op, uid, who, _data in batch.events:
                for value in (op, who, uid or ""):
                    self._check_text(value, "an event field")
            self._log_many(db, batch.events)
            self._log(db, "import", None, actor, {
                "units": len(batch.units), "relations": len(batch.relations), "episodes": len(batch.episodes),
                "settings": len(batch.settings), "events": len(batch.events)}, at=now)
            self._wrote(matrix)
        return batch.count

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def close(self) -> None: ...
