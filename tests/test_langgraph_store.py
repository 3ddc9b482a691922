"""ForgeStore against the behaviours LangGraph's own store tests check (put/get/delete,
search with filters and queries, namespace listing with prefixes, suffixes, wildcards,
depth and pagination, invalid namespaces, async), plus scope mapping and a real graph.

Every test runs three times: over a Memory in this process, over the service through a
Client, and over the service through an AsyncClient (its sync methods driven on one event
loop here, since a ForgeStore over an AsyncClient answers the async ones)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langgraph.store.base import InvalidNamespaceError, PutOp  # noqa: E402

from forge.engine.embed import HashingEmbedder  # noqa: E402
from forge.engine.memory import Memory  # noqa: E402
from forge.errors import ConfigError  # noqa: E402
from forge.integrations.langgraph import ForgeStore  # noqa: E402
from forge.model import Viewer  # noqa: E402
from forge.store import SQLiteStore  # noqa: E402

pytestmark = pytest.mark.slow  # each test runs three ways, two of them against a live server

BACKENDS = ["memory", "client", "async"]


class _Loop:
    """One event loop in a thread, for the AsyncClient-backed stores of a test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


class _Synced:
    """A ForgeStore over an AsyncClient, its async methods called through the sync names."""

    def __init__(self, store: ForgeStore, loop: _Loop) -> None:
        self.inner, self.loop = store, loop

    def __getattr__(self, name: str) -> Any:
        if name in ("put", "get", "search", "delete", "list_namespaces", "batch"):
            method = getattr(self.inner, "a" + name)
            return lambda *a, **kw: self.loop.run(method(*a, **kw))
        return getattr(self.inner, name)


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path: Path):
    """(the Memory behind it, make(agent, groups) -> a store seen as that agent, kind)."""
    mem = Memory(SQLiteStore(tmp_path / "lg.db"), HashingEmbedder(128))
    if request.param == "memory":
        yield mem, lambda agent="langgraph", groups=(): ForgeStore(mem, agent=agent, groups=groups), "memory"
        mem.close()
        return
    pytest.importorskip("fastapi")
    from forge.client import AsyncClient, Client
    from forge.server.app import create_app
    from forge.server.keys import KeyStore
    from forge.server.testing import running

    keys = KeyStore(tmp_path / "lg.keys.json")
    keys.create(admin=True)  # a server with keys: each agent below has its own
    loop = _Loop() if request.param == "async" else None
    clients: list[Any] = []
    with running(create_app(mem, keys=keys, rate=1e6)) as url:
        def make(agent: str = "langgraph", groups: tuple[str, ...] | list[str] = ()) -> Any:
            token = keys.create(agent=agent, groups=list(groups))
            if loop is None:
                clients.append(Client(url, token))
                return ForgeStore(clients[-1])
            clients.append(AsyncClient(url, token))
            return _Synced(ForgeStore(clients[-1]), loop)

        yield mem, make, request.param
        for c in clients:
            if loop is None:
                c.close()
            else:
                loop.run(c.aclose())
    if loop is not None:
        loop.close()
    mem.close()


@pytest.fixture
def mem(backend):
    return backend[0]


@pytest.fixture
def store(backend):
    return backend[1]("planner", ["ops"])


@pytest.mark.slow
def test_put_get_update_delete(store) -> None:
    store.put(("users", "123"), "prefs", {"content": "likes short answers", "lang": "en"})
    item = store.get(("users", "123"), "prefs")
    assert item is not None and item.value == {"content": "likes short answers", "lang": "en"}
    assert item.key == "prefs" and item.namespace == ("users", "123") and item.created_at <= item.updated_at
    store.put(("users", "123"), "prefs", {"content": "likes long answers", "lang": "fr"})
    assert store.get(("users", "123"), "prefs").value["lang"] == "fr"
    assert store.get(("users", "123"), "other") is None
    assert store.get(("users", "999"), "prefs") is None
    store.delete(("users", "123"), "prefs")
    assert store.get(("users", "123"), "prefs") is None
    assert store.search(("users",)) == []
    store.put(("users", "123"), "prefs", {"content": "back again"})
    assert store.get(("users", "123"), "prefs").value == {"content": "back again"}


@pytest.mark.slow
def test_invalid_namespaces_are_refused(store) -> None:
    doc = {"foo": "bar"}
    for ns in [(), ("the", "thing.about"), ("some", "fun", ""), ("langgraph", "foo")]:
        with pytest.raises(InvalidNamespaceError):
            store.put(ns, "foo", doc)
    store.put(("foo", "langgraph", "foo"), "bar", doc)
    assert store.get(("foo", "langgraph", "foo"), "bar").value == doc
    assert store.search(("foo", "langgraph", "foo"))[0].value == doc
    store.batch([PutOp(("langgraph", "foo"), "bar", doc)])  # past the public API, as LangGraph allows
    assert store.get(("langgraph", "foo"), "bar").value == doc


@pytest.mark.slow
def test_search_filters_pagination_and_query(store) -> None:
    for i in range(12):
        store.put(("docs", "team" if i % 2 else "solo"), f"d{i}", {"text": f"document number {i} about ice", "n": i, "kind": "even" if i % 2 == 0 else "odd"})
    store.put(("elsewhere",), "x", {"text": "document about ice elsewhere", "n": 1})
    assert len(store.search(("docs",), limit=100)) == 12
    assert len(store.search(("docs", "team"), limit=100)) == 6
    assert [i.value["n"] for i in store.search(("docs",), filter={"kind": "even"}, limit=100)] == [0, 2, 4, 6, 8, 10]
    assert [i.value["n"] for i in store.search(("docs",), filter={"n": {"$gte": 9}}, limit=100)] == [9, 10, 11]
    assert [i.value["n"] for i in store.search(("docs",), filter={"n": {"$gt": 3, "$lt": 6}}, limit=100)] == [4, 5]
    assert [i.value["n"] for i in store.search(("docs",), filter={"n": {"$ne": 0}, "kind": "even"}, limit=100)] == [2, 4, 6, 8, 10]
    page1 = store.search(("docs",), limit=5)
    page2 = store.search(("docs",), limit=5, offset=5)
    assert len(page1) == 5 and len(page2) == 5 and not {i.key for i in page1} & {i.key for i in page2}
    hits = store.search(("docs",), query="document number 7 about ice", limit=3)
    assert hits[0].key == "d7" and hits[0].score is not None and hits[0].score > 0
    assert all(h.namespace[0] == "docs" for h in hits)
    assert store.search(("docs",), query="ice", filter={"kind": "odd"}, limit=20)
    assert all(h.value["kind"] == "odd" for h in store.search(("docs",), query="ice", filter={"kind": "odd"}, limit=20))
    assert len(store.search((), limit=100)) == 13


@pytest.mark.slow
def test_list_namespaces(store) -> None:
    namespaces = [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f"), ("a", "c", "f"),
                  ("b", "a", "f"), ("users", "123"), ("users", "456", "settings"), ("admin", "users", "789")]
    for i, ns in enumerate(namespaces):
        store.put(ns, f"id_{i}", {"data": f"value_{i:02d}"})
    assert sorted(store.list_namespaces(prefix=("a", "b"))) == [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f")]
    assert sorted(store.list_namespaces(suffix=("f",))) == [("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert sorted(store.list_namespaces(prefix=("a",), suffix=("f",))) == [("a", "b", "f"), ("a", "c", "f")]
    assert sorted(store.list_namespaces(prefix=("a", "b"), max_depth=3)) == [("a", "b", "c"), ("a", "b", "d"), ("a", "b", "f")]
    assert store.list_namespaces(prefix=("a", "b"), limit=2) == [("a", "b", "c"), ("a", "b", "d", "e")]
    assert store.list_namespaces(prefix=("a", "b"), offset=2) == [("a", "b", "d", "i"), ("a", "b", "f")]
    assert sorted(store.list_namespaces(prefix=("a", "*", "f"))) == [("a", "b", "f"), ("a", "c", "f")]
    assert sorted(store.list_namespaces(suffix=("*", "f"))) == [("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert store.list_namespaces(prefix=("nonexistent",)) == []
    assert store.list_namespaces(prefix=("users", "123")) == [("users", "123")]
    assert sorted(store.list_namespaces(max_depth=2)) == [("a", "b"), ("a", "c"), ("admin", "users"), ("b", "a"), ("users", "123"), ("users", "456")]
    assert store.list_namespaces(prefix=("*", "users"), suffix=("*", "settings")) == []


def test_list_namespaces_pagination_and_empty(backend) -> None:
    store = backend[1]()
    assert store.list_namespaces() == []
    for i in range(20):
        store.put(("namespace", f"sub_{i:02d}"), f"id_{i:02d}", {"data": i})
    assert store.list_namespaces(prefix=("namespace",), limit=5, offset=5) == [("namespace", f"sub_{i:02d}") for i in range(5, 10)]
    assert store.list_namespaces(prefix=("namespace",), limit=5, offset=15) == [("namespace", f"sub_{i:02d}") for i in range(15, 20)]


def test_async_methods(backend, store) -> None:
    async def main(store: ForgeStore) -> None:
        await store.aput(("a",), "k", {"content": "async value"})
        assert (await store.aget(("a",), "k")).value == {"content": "async value"}
        assert (await store.asearch(("a",), query="async"))[0].key == "k"
        assert await store.alist_namespaces() == [("a",)]
        await store.adelete(("a",), "k")
        assert await store.aget(("a",), "k") is None
        with pytest.raises(InvalidNamespaceError):
            await store.aput((), "k", {"x": 1})

    if backend[2] == "async":  # its own coroutines, on the loop its client lives on
        store.loop.run(main(store.inner))
        with pytest.raises(ConfigError, match="async methods"):
            store.inner.get(("a",), "k")  # the sync ones say what to use instead
    else:
        asyncio.run(main(store))


@pytest.mark.slow
def test_namespaces_map_to_scopes_and_items_are_forge_units(backend) -> None:
    mem, make, _ = backend
    planner = make("planner", ["ops"])
    coder = make("coder", ["ops"])
    outsider = make("outsider")
    planner.put(("private", "notes"), "n1", {"content": "my private plan"})
    planner.put(("group", "ops", "runbook"), "r1", {"content": "restart the worker first"})
    planner.put(("shared",), "s1", {"content": "the deploy window is friday"})
    assert coder.get(("private", "notes"), "n1") is None
    assert coder.get(("group", "ops", "runbook"), "r1").value["content"] == "restart the worker first"
    assert outsider.get(("group", "ops", "runbook"), "r1") is None
    assert outsider.get(("shared",), "s1") is not None
    assert {u.scope.kind for u in mem.store.list(viewer=Viewer.admin())} == {"private", "group", "global"}
    assert {u.owner for u in mem.store.list(viewer=Viewer.admin())} == {"planner"}
    hits = mem.recall("restart the worker", viewer=Viewer.of("coder", ["ops"]), k=1)
    assert hits[0].unit.content == "restart the worker first"
    assert hits[0].unit.provenance.source.endswith("langgraph:planner")  # over the service: api:planner/langgraph:planner


def test_a_langgraph_graph_uses_it_as_its_store(backend) -> None:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        user: str
        answer: str

    store = backend[1]("graph")
    asynchronous = backend[2] == "async"

    def remember(state: State, *, store) -> dict:
        store.put(("users", state["user"]), "last", {"content": f"{state['user']} asked about ice"})
        return {}

    def answer(state: State, *, store) -> dict:
        found = store.search(("users", state["user"]), query="ice", limit=1)
        return {"answer": found[0].value["content"] if found else "nothing"}

    async def aremember(state: State, *, store) -> dict:
        await store.aput(("users", state["user"]), "last", {"content": f"{state['user']} asked about ice"})
        return {}

    async def aanswer(state: State, *, store) -> dict:
        found = await store.asearch(("users", state["user"]), query="ice", limit=1)
        return {"answer": found[0].value["content"] if found else "nothing"}

    builder = StateGraph(State)
    builder.add_node("remember", aremember if asynchronous else remember)
    builder.add_node("answer", aanswer if asynchronous else answer)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "answer")
    builder.add_edge("answer", END)
    if asynchronous:  # an async graph over an AsyncClient: ainvoke, on the client's loop
        graph = builder.compile(store=store.inner)
        assert store.loop.run(graph.ainvoke({"user": "ann", "answer": ""}))["answer"] == "ann asked about ice"
    else:
        graph = builder.compile(store=store)
        assert graph.invoke({"user": "ann", "answer": ""})["answer"] == "ann asked about ice"
