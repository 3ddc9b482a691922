"""The LLM port: one small contract every backend implements.

A backend only has to turn messages into a :class:`Completion`. Structured output,
constrained choice, retries and token accounting are built on top of that contract (see
``forge.llm.structured`` and ``forge.llm.accounting``), so a new backend gets them for free
and may advertise native support (grammars, JSON schema) through :attr:`LLM.capabilities`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from forge.errors import UserError

__all__ = ["LLM", "Completion", "Message", "Request", "check_real_llm_allowed", "forbid_real_llms"]

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class Request:
    """What to generate. ``json_schema`` and ``choices`` are constraints a backend applies
    natively when its capabilities say so; otherwise the structured layer enforces them by
    parsing and retrying."""

    messages: Sequence[Message]
    max_tokens: int = 256
    temperature: float = 0.0
    stop: Sequence[str] = ()
    json_schema: Mapping[str, Any] | None = None
    choices: Sequence[str] | None = None
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    model: str = ""
    seconds: float = 0.0
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@runtime_checkable
class LLM(Protocol):
    """A chat model. ``capabilities`` may contain ``"json_schema"`` and ``"choices"``."""

    name: str
    capabilities: frozenset[str]

    def complete(self, request: Request) -> Completion: ...

    def count_tokens(self, text: str) -> int: ...

    def close(self) -> None: ...


# The guard lives here, beside the port, so real backends can check it without importing the
# test doubles. A counter (not a ContextVar) so threads started inside the block see it too.
_forbid_lock = threading.Lock()
_forbid_depth = 0


@contextmanager
def forbid_real_llms() -> Iterator[None]:
    """Make constructing a real backend (llama.cpp, HTTP) raise inside the block.

    Unit tests wrap themselves in it so a forgotten ``open_llm("local")`` fails loudly
    instead of loading a model or calling an API. Usable as a decorator too.
    """
    global _forbid_depth
    with _forbid_lock:
        _forbid_depth += 1
    try:
        yield
    finally:
        with _forbid_lock:
            _forbid_depth -= 1


def check_real_llm_allowed(what: str) -> None:
    """Raise :class:`~forge.errors.UserError` if real backends are forbidden right now."""
    if _forbid_depth > 0:
        raise UserError(
            f"{what} is a real LLM and real LLMs are forbidden here (forbid_real_llms); "
            "use forge.llm.testing.ScriptedLLM in unit tests"
        )
