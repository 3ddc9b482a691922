"""What learning, sharing and curation need from a memory: one typed port.

:class:`~forge.engine.memory.Memory` implements it; so can a view that hides part of a
memory (an agent's warm-up exposure) or a test double. Code above the engine takes a
``MemoryPort`` rather than ``Any``, and never reaches into ``memory.store``: the verbs are
here, so there is one write path and one place for transactions.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from forge.model import Episode, Relation, RelationType, Status, Unit, Viewer
from forge.store import Event, Filter

if TYPE_CHECKING:
    from forge.engine.recall import Packed, Recalls, Reranker, Weights
    from forge.engine.tickets import Ticket

__all__ = ["MemoryPort", "Recalling"]


@runtime_checkable
class Recalling(Protocol):
    """What writing a prompt needs: recall alone. A :class:`MemoryPort` is one, and so is a
    view that hides part of a memory (:class:`~forge.curate.exposure.GatedMemory`)."""

    def recall(
        self, query: str, *, viewer: Viewer, k: int = 10, filter: Filter = ..., weights: Weights = ..., hops: int = 1,
        rerank: Reranker | None = None, touch: bool = True, min_score: float = 0.0,
    ) -> Sequence[Any]: ...


@runtime_checkable
class MemoryPort(Recalling, Protocol):
    """The memory verbs the layers above the engine use (each is a :class:`Memory` method;
    see its docstring for what it does)."""

    @property
    def info(self) -> Mapping[str, Any]: ...

    # -- writing

    def add(self, units: Unit | Sequence[Unit], *, vectors: Any = None, actor: str = "", batch_size: int = 256) -> builtins.list[str]: ...

    def update(self, unit: Unit, *, actor: str = "", reembed: bool = True) -> Unit: ...

    def set_status(self, unit_id: str, status: Status | str, *, reason: str, actor: str = "") -> None: ...

    def relate(self, src: str, dst: str, type: str = "related_to", *, weight: float = 1.0, note: str = "", actor: str = "") -> Relation: ...

    def record_use(self, unit_ids: Sequence[str], *, success: bool | None, actor: str = "") -> builtins.list[Unit]: ...

    def transaction(self) -> AbstractContextManager[None]: ...

    def claim(self, key: str) -> bool: ...

    def settings(self) -> dict[str, str]: ...

    def set_setting(self, key: str, value: str) -> None: ...

    def append_event(
        self, op: str, *, unit_id: str | None = None, actor: str = "", data: Mapping[str, Any] | None = None, at: float | None = None
    ) -> int: ...

    def add_episode(self, episode: Episode, *, actor: str = "") -> str: ...

    def touch(self, ids: Sequence[str], *, at: float | None = None) -> None: ...

    # -- reading
    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_units(self, units: Sequence[Unit]) -> np.ndarray: ...

    def get(self, unit_id: str, *, viewer: Viewer) -> Unit: ...

    def get_many(self, ids: Sequence[str], *, viewer: Viewer) -> builtins.list[Unit]: ...

    def list(self, *, viewer: Viewer, filter: Filter = ..., limit: int = 100, offset: int = 0) -> builtins.list[Unit]: ...

    def count(self, *, viewer: Viewer, filter: Filter = ...) -> int: ...

    def vector(self, unit_id: str, *, viewer: Viewer) -> np.ndarray | None: ...

    def nearest(
        self, vector: Any, *, k: int, viewer: Viewer, filter: Filter = ..., at_least: float = -1.0
    ) -> builtins.list[tuple[Unit, float]]: ...

    def relations(self, unit_id: str, *, viewer: Viewer) -> builtins.list[Relation]: ...

    def neighbors(
        self, ids: Sequence[str], *, viewer: Viewer, types: Iterable[RelationType] = (), filter: Filter = ...
    ) -> builtins.list[tuple[str, Relation]]: ...

    def get_episode(self, episode_id: str) -> Episode: ...

    def events(self, *, viewer: Viewer, **narrow: Any) -> builtins.list[Event]: ...

    def recall(
        self, query: str, *, viewer: Viewer, k: int = 10, filter: Filter = ..., weights: Weights = ..., hops: int = 1,
        rerank: Reranker | None = None, touch: bool = True, min_score: float = 0.0,
    ) -> Recalls: ...

    def context(self, query: str, *, viewer: Viewer, budget: int = 512, k: int = 20, **kw: Any) -> Packed: ...

    def ticket(self, recall_id: str) -> Ticket: ...
