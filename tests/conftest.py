"""Shared fixtures: stores over every backend, memories on the hashing embedder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import pg_support
from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.store import SQLiteStore, Store

BACKENDS = ["sqlite-file", "sqlite-memory", "postgres"]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pg_support.PgServer]:
    """A PostgreSQL + pgvector server for the whole session (skips when the wheel is missing)."""
    if not pg_support.available():
        pytest.skip(pg_support.MISSING)
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="forge-pg-"))
    try:
        with pg_support.running(tmp) as server:
            yield server
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def make_store(backend: str, tmp_path: Path, request: pytest.FixtureRequest | None = None) -> Store:
    if backend == "sqlite-file":
        return SQLiteStore(tmp_path / "m.db")
    if backend == "sqlite-memory":
        return SQLiteStore(":memory:")
    if backend == "postgres":
        assert request is not None, "a postgres store needs the pg_server fixture"
        from forge.store.postgres import PostgresStore

        server = request.getfixturevalue("pg_server")
        schema = pg_support.new_schema()
        request.addfinalizer(lambda: server.drop(schema))
        return PostgresStore(server.url(schema))
    raise ValueError(backend)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Every Store backend; the conformance suite runs once per backend."""
    s = make_store(request.param, tmp_path, request)
    yield s
    s.close()


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    m = Memory(SQLiteStore(tmp_path / "mem.db"), HashingEmbedder(64))
    yield m
    m.close()
