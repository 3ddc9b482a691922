"""The SQL both database backends share, written once.

A :class:`Dialect` says how one database spells what the shared SQL needs: its parameter
mark, a membership test, tag containment, how a unit's row is encoded. The filter compiler
(:meth:`Dialect.where`) turns a :class:`~forge.store.base.Filter` and a
:class:`~forge.model.Viewer` into one SQL condition with it, so both backends admit exactly
the same units. Each backend's dialect lives in the backend's module, beside its quirks.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar, Self

import numpy as np

from forge.errors import NotFoundError, ValidationError
from forge.model import Episode, Relation, RelationType, Status, Unit, Viewer
from forge.store.base import ANY_STATUS, Event, Filter
from forge.store.common import count_arg, int_arg, redact_events, row_unit, unit_row

__all__ = ["COLUMNS", "Dialect", "SQLStore"]

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

    def tags_all(self, p: str, tags: Sequence[str]) -> tuple[str, list[Any]]:
        """The unit (columns prefixed ``p``) has every one of ``tags``."""
        raise NotImplementedError

    def tags_any(self, p: str, tags: Sequence[str]) -> tuple[str, list[Any]]:
        """The unit (columns prefixed ``p``) has at least one of ``tags``."""
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

    def unit_row(self, unit: Unit) -> tuple:
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
        if f.kinds:
            add(*self.in_(f"{p}kind", sorted(k.value for k in f.kinds)))
        for col in ("domain", "task", "role", "owner"):
            value = getattr(f, col)
            if value is not None:
                add(f"{p}{col} = {m}", [value])
        if f.scopes:
            add(*self.in_(f"{p}scope", sorted(f.scopes)))
        if f.tags_all:
            add(*self.tags_all(p, sorted(f.tags_all)))
        if f.tags_any:
            add(*self.tags_any(p, sorted(f.tags_any)))
        if f.since is not None:
            add(f"{p}created_at >= {m}", [f.since])
        if f.until is not None:
            add(f"{p}created_at < {m}", [f.until])
        return (" AND ".join(clauses) or self.true), params


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
    _dim: int | None

    # -- hooks ----------------------------------------------------------------------------
    @abstractmethod
    def _q(self, sql: str, params: Sequence[Any] = (), *, viewer: Viewer | None = None) -> list[tuple]:
        """Rows of one read; ``viewer`` is who reads (a backend may check it a second time)."""

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
                out[r[0]] = self._touched(self.dialect.row_unit(r))
        return [out[i] for i in ids if i in out]

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
        return self._q(f"SELECT count(*) FROM units WHERE {where}", params, viewer=viewer)[0][0]

    def vector(self, unit_id: str, *, viewer: Viewer) -> np.ndarray | None:
        where, params = self.dialect.where(viewer, ANY_STATUS)
        m = self.dialect.mark
        row = self._q(f"SELECT {self._VECTOR} FROM units WHERE id = {m} AND {where}", (unit_id, *params), viewer=viewer)
        if not row:
            raise NotFoundError(f"no unit with id {unit_id}")
        return None if row[0][0] is None else self._vector_value(row[0][0])

    def relations(self, unit_id: str, *, viewer: Viewer) -> list[Relation]:
        """Relations of a unit whose both ends ``viewer`` may see (none if it may not see the unit)."""
        m = self.dialect.mark
        sql, params = self._relations_sql(viewer, f"(r.src = {m} OR r.dst = {m})", [unit_id, unit_id])
        rows = self._q(f"{sql} ORDER BY r.created_at, r.{self._KEY}", params, viewer=viewer)
        return [Relation(*r) for r in rows]

    def _relations_sql(self, viewer: Viewer, cond: str = "", params: Sequence[Any] = ()) -> tuple[str, list[Any]]:
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
    ) -> list[tuple[str, Relation]]:
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
    ) -> list[Event]:
        """The change log as ``viewer`` may see it, oldest first (or newest first), narrowed
        by any of the given fields.

        The operator sees every event. An agent sees the events of units it may see now,
        and of each event only what it could see then: a unit that was private to another
        agent before it was shared shows that it changed, not what it said before; an event
        that names a unit the agent may not see (a relation to it) is left out.
        """
        d, m = self.dialect, self.dialect.mark
        limit = count_arg(limit, "limit")
        since_seq = int_arg(since_seq, "since_seq")
        ops = sorted(set(ops))
        narrow, params = "", [since_seq]
        for clause, value in (("e.unit_id =", unit_id), ("e.actor =", actor), ("e.ts >=", since), ("e.ts <", until)):
            if value is not None:
                narrow += f" AND {clause} {m}"
                params.append(value)
        if ops:
            member, mp = d.in_("e.op", ops)
            narrow += f" AND {member}"
            params.extend(mp)
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def close(self) -> None: ...
