"""What the framework adapters take: a forge ``Memory``, ``Client`` or ``AsyncClient``.

One protocol for the five adapters (they each had a copy). Not a
:class:`~forge.engine.port.MemoryPort`: a client has no transaction, claim or vectors, and an
``AsyncClient``'s verbs return awaitables; where a verb exists on one of them only (a
client's ``admit``), an adapter branches on the type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

__all__ = ["ForgeMemory"]


@runtime_checkable
class ForgeMemory(Protocol):
    """The verbs the adapters call, which Memory, Client and AsyncClient all have."""

    @property
    def recall(self) -> Callable[..., Any]: ...

    @property
    def add(self) -> Callable[..., Any]: ...

    @property
    def add_messages(self) -> Callable[..., Any]: ...

    @property
    def get(self) -> Callable[..., Any]: ...

    @property
    def list(self) -> Callable[..., Any]: ...

    @property
    def set_status(self) -> Callable[..., Any]: ...

    @property
    def update(self) -> Callable[..., Any]: ...

    @property
    def learn(self) -> Callable[..., Any]: ...
