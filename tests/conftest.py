"""Shared fixtures: stores over every backend, memories on the hashing embedder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from forge.embed import HashingEmbedder
from forge.memory import Memory
from forge.store import SQLiteStore

BACKENDS = ["sqlite-file", "sqlite-memory"]


def make_store(backend: str, tmp_path: Path):
    if backend == "sqlite-file":
        return SQLiteStore(tmp_path / "m.db")
    if backend == "sqlite-memory":
        return SQLiteStore(":memory:")
    raise ValueError(backend)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteStore]:
    """Every Store backend; the conformance suite runs once per backend."""
    s = make_store(request.param, tmp_path)
    yield s
    s.close()


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    m = Memory(SQLiteStore(tmp_path / "mem.db"), HashingEmbedder(64))
    yield m
    m.close()
