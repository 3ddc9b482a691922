"""What a curation step does to a unit (:class:`Change`) and how a pass reads the store.

Kept apart from the pass itself (:mod:`forge.curate.lifecycle`) so that consolidation, which
the pass calls, can record its changes without importing the pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forge.model import Unit, Viewer
from forge.store.base import Filter

__all__ = ["Change", "all_units"]


@dataclass(frozen=True, slots=True)
class Change:
    """One thing a pass does to one unit, and why: ``op`` is archive or supersede."""

    op: str
    unit_id: str
    cause: str  # ttl | decay | cap | conflict | subsumed
    reason: str
    by: str | None = None  # the winning unit of a conflict, the generalisation that subsumes

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "unit_id": self.unit_id, "cause": self.cause, "reason": self.reason, "by": self.by}



def all_units(store: Any, filter: Filter = Filter(), *, page: int = 50_000) -> list[Unit]:
    """Every unit ``filter`` admits (active ones by default), read in pages: no size limit."""
    out: list[Unit] = []
    while True:
        got = store.list(viewer=Viewer.admin(), filter=filter, limit=page, offset=len(out))
        out += got
        if len(got) < page:
            return out
