"""Durable memory behind one port; ``open_store`` picks a backend from a URL.

    open_store("sqlite:///path/to/memory.db")   # the embedded default
    open_store("memory.db")                       # same: a bare path is SQLite
    open_store(":memory:")                        # throw-away, for tests
    open_store("postgresql://forge@db/memory")    # PostgreSQL + pgvector, for many writers
    open_store("postgresql://forge@db/memory?schema=team_red")  # another memory there
"""

from __future__ import annotations

from pathlib import Path

from forge.errors import ConfigError
from forge.store.base import (
    ANY_STATUS,
    SEARCH_CONTEXT,
    SPEAKER,
    Event,
    Filter,
    Hit,
    Store,
    indexed_text,
)
from forge.store.sqlite import SQLiteStore

__all__ = ["ANY_STATUS", "SEARCH_CONTEXT", "SPEAKER", "Event", "Filter", "Hit", "SQLiteStore", "Store", "indexed_text", "open_store"]


def open_store(url: str | Path, *, create: bool = True) -> Store:
    """Open (or create) a store. Backends other than SQLite are imported lazily."""
    text = str(url)
    if text == ":memory:" or text == "sqlite://":
        return SQLiteStore(":memory:")
    if text.startswith("sqlite:///"):
        return SQLiteStore(text[len("sqlite:///") :], create=create)
    if "://" not in text:
        return SQLiteStore(text, create=create)
    scheme = text.split("://", 1)[0]
    if scheme in ("postgresql", "postgres"):
        from forge.store.postgres import PostgresStore

        return PostgresStore(text, create=create)
    raise ConfigError(
        f"unknown store URL scheme {scheme!r}; expected a file path, sqlite:///PATH or postgresql://HOST/DB"
    )
