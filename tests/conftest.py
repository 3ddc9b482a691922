"""Shared fixtures: stores over every backend, memories on the hashing embedder, and no real
LLM unless a test asks for one (``@pytest.mark.real_llm``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import pg_support
from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.llm.base import forbid_real_llms
from forge.store import SQLiteStore, Store

BACKENDS = ["sqlite-file", "sqlite-memory", "postgres"]


@pytest.fixture(autouse=True)
def _real_llms_forbidden(request: pytest.FixtureRequest) -> Iterator[None]:
    """Constructing a real LLM (llama.cpp, an HTTP endpoint) raises inside every test, so a
    forgotten ``open_llm("local")`` fails loudly instead of loading a model or calling an API.
    A test that means to run one says so with ``@pytest.mark.real_llm``. Module- and
    session-scoped fixtures are set up before this guard and open their own
    (``with forbid_real_llms():``) where they run agents."""
    if request.node.get_closest_marker("real_llm") is not None:
        yield
        return
    with forbid_real_llms():
        yield


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
def make_memory(tmp_path: Path) -> Iterator[Callable[..., Memory]]:
    """Memories on the hashing embedder, each closed after the test: ``make_memory()`` one in
    a new SQLite file under ``tmp_path``, ``make_memory(path)`` one at ``path`` (``":memory:"``
    for none); ``dim`` is the embedder's width (256, as ``embedder="hash"``)."""
    opened: list[Memory] = []

    def make(path: str | Path | None = None, *, dim: int = 256) -> Memory:
        m = Memory(SQLiteStore(tmp_path / f"memory-{len(opened)}.db" if path is None else path), HashingEmbedder(dim))
        opened.append(m)
        return m

    yield make
    for m in opened:
        m.close()


@pytest.fixture
def memory(make_memory: Callable[..., Memory]) -> Memory:
    """A memory in a SQLite file on the hashing embedder: the one most tests need."""
    return make_memory()
