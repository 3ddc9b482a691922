"""What learning, sharing and curation need from a memory: one typed port.

:class:`~forge.engine.memory.Memory` implements it; so can a view that hides part of a
memory (an agent's warm-up exposure) or a test double. Code above the engine takes a
``MemoryPort`` rather than ``Any``, and never reaches into ``memory.store``: the verbs are
here, so there is one write path and one place for transactions.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from forge.model import Relation, Status, Unit, Viewer
from forge.store import Filter

if TYPE_CHECKING:
    from forge.engine.recall import Packed, Recalls
    from forge.engine.tickets import Ticket

__all__ = ["MemoryPort"]


@runtime_checkable
class MemoryPort(Protocol):
    """The memory verbs the layers above the engine use."""

    def add(self, units: Unit | Sequence[Unit], *, vectors: Any = None, actor: str = "", batch_size: int = 256) -> list[str]: ...

    def update(self, unit: Unit, *, actor: str = "", reembed: bool = True) -> Unit: ...

    def set_status(self, unit_id: str, status: Status | str, *, reason: str, actor: str = "") -> None: ...

    def relate(self, src: str, dst: str, type: str = "related_to", *, weight: float = 1.0, note: str = "", actor: str = "") -> Relation: ...

    def record_use(self, unit_ids: Sequence[str], *, success: bool | None, actor: str = "") -> list[Unit]: ...

    def transaction(self) -> AbstractContextManager[None]: ...

    def claim(self, key: str) -> bool: ...

    def settings(self) -> dict[str, str]: ...

    def set_setting(self, key: str, value: str) -> None: ...

    def get(self, unit_id: str, *, viewer: Viewer) -> Unit: ...

    def get_many(self, ids: Sequence[str], *, viewer: Viewer) -> list[Unit]: ...

    def list(self, *, viewer: Viewer, filter: Filter = ..., limit: int = 100, offset: int = 0) -> list[Unit]: ...

    def count(self, *, viewer: Viewer, filter: Filter = ...) -> int: ...

    def recall(self, query: str, *, viewer: Viewer, k: int = 10, **kw: Any) -> Recalls: ...

    def context(self, query: str, *, viewer: Viewer, budget: int = 512, k: int = 20, **kw: Any) -> Packed: ...

    def ticket(self, recall_id: str) -> Ticket: ...
