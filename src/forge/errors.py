"""The one exception tree of FORGE.

Every error FORGE raises on purpose derives from :class:`ForgeError`; third-party
exceptions (sqlite3, httpx, redis, llama.cpp) are mapped to it at the boundary where
they occur. Errors are split by blame:

    ForgeError
    ├── UserError               the caller can fix it: bad input, bad configuration
    │   ├── ValidationError     a value breaks the data model (kind, content, score...)
    │   │   └── ConflictError   an id that must be new already exists
    │   ├── NotFoundError       a unit, episode, run or relation target does not exist
    │   ├── ConfigError         an unknown backend, env, condition or option
    │   ├── AccessError         the caller's key may not do this (not an admin, not the owner)
    │   └── DimensionError      a vector's size does not match the store's
    └── BackendError            something outside the caller's control failed
        ├── StoreError          the database is corrupt, foreign or unreachable
        ├── EmbedError          the embedding backend failed
        ├── LLMError            the language model failed or answered unusably
        │   └── StructuredOutputError   kept answering unparseable output; has ``raw``
        ├── BusError            the broadcast transport failed
        └── EnvError            an environment's backend (a database, a simulator) failed

Messages are one line and say what to do; the CLI prints them as ``error: ...`` and exits
non-zero.
"""

from __future__ import annotations

__all__ = [
    "AccessError",
    "BackendError",
    "BusError",
    "ConfigError",
    "ConflictError",
    "DimensionError",
    "EmbedError",
    "EnvError",
    "ForgeError",
    "LLMError",
    "NotFoundError",
    "StoreError",
    "StructuredOutputError",
    "UserError",
    "ValidationError",
]


class ForgeError(Exception):
    """Root of every error FORGE raises on purpose."""


class UserError(ForgeError):
    """The caller can fix this: bad input or configuration."""


class ValidationError(UserError):
    """A value breaks the data model."""


class ConflictError(ValidationError):
    """An id that must be new (a unit's, an episode's) already exists."""


class NotFoundError(UserError):
    """Something referred to by id does not exist (or is not visible to the caller)."""


class AccessError(UserError):
    """The caller is known but may not do this: an agent key asking for an admin's action."""


class ConfigError(UserError):
    """An unknown backend, environment, condition or option."""


class DimensionError(UserError):
    """A vector's dimension does not match the store's embedding dimension."""

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(
            f"embedding dimension {got} does not match the store's dimension {expected}; "
            "use the embedder the store was created with"
        )
        self.expected = expected
        self.got = got


class BackendError(ForgeError):
    """Something outside the caller's control failed."""


class StoreError(BackendError):
    """The database is corrupt, foreign, locked or unreachable."""


class EmbedError(BackendError):
    """The embedding backend failed."""


class LLMError(BackendError):
    """The language model failed or answered with something unusable."""


class StructuredOutputError(LLMError):
    """The model kept answering with something unusable; ``raw`` holds its last reply."""

    def __init__(self, message: str, *, raw: str, attempts: int, errors: list[str] | tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.raw = raw
        self.attempts = attempts
        self.errors = list(errors)


class BusError(BackendError):
    """The broadcast transport failed."""


class EnvError(BackendError):
    """An environment's backend (a database server, a simulator) failed."""
