"""The SQL both database backends share, written once.

A :class:`Dialect` says how one database spells what the shared SQL needs: its parameter
mark, a membership test, tag containment, how a unit's row is encoded. The filter compiler
(:meth:`Dialect.where`) turns a :class:`~forge.store.base.Filter` and a
:class:`~forge.model.Viewer` into one SQL condition with it, so both backends admit exactly
the same units. Each backend's dialect lives in the backend's module, beside its quirks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from forge.model import Status, Unit, Viewer
from forge.store.base import Filter
from forge.store.common import row_unit, unit_row

__all__ = ["COLUMNS", "Dialect"]

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
