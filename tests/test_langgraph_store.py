"""ForgeStore against the behaviours LangGraph's own store tests check (put/get/delete,
search with filters and queries, namespace listing with prefixes, suffixes, wildcards,
depth and pagination, invalid namespaces, async), plus scope mapping and a real graph."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("langgraph")

from langgraph.store.base import InvalidNamespaceError, PutOp  # noqa: E402

from forge.engine.embed import HashingEmbedder  # noqa: E402
from forge.engine.memory import Memory  # noqa: E402
from forge.integrations.langgraph import ForgeStore  # noqa: E402
from forge.model import Viewer  # noqa: E402
from forge.store import SQLiteStore  # noqa: E402


@pytest.fixture
def mem(tmp_path: Path):
    m = Memory(SQLiteStore(tmp_path / "lg.db"), HashingEmbedder(128))
    yield m
    m.close()


@pytest.fixture
def store(mem):
    return ForgeStore(mem, agent="planner", groups=["ops"])


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


def test_list_namespaces_pagination_and_empty(mem) -> None:
    store = ForgeStore(mem)
    assert store.list_namespaces() == []
    for i in range(20):
        store.put(("namespace", f"sub_{i:02d}"), f"id_{i:02d}", {"data": i})
    assert store.list_namespaces(prefix=("namespace",), limit=5, offset=5) == [("namespace", f"sub_{i:02d}") for i in range(5, 10)]
    assert store.list_namespaces(prefix=("namespace",), limit=5, offset=15) == [("namespace", f"sub_{i:02d}") for i in range(15, 20)]


def test_async_methods(store) -> None:
    async def main() -> None:
        await store.aput(("a",), "k", {"content": "async value"})
        assert (await store.aget(("a",), "k")).value == {"content": "async value"}
        assert (await store.asearch(("a",), query="async"))[0].key == "k"
        assert await store.alist_namespaces() == [("a",)]
        await store.adelete(("a",), "k")
        assert await store.aget(("a",), "k") is None
        with pytest.raises(InvalidNamespaceError):
            await store.aput((), "k", {"x": 1})

    asyncio.run(main())


def test_namespaces_map_to_scopes_and_items_are_forge_units(mem) -> None:
    planner = ForgeStore(mem, agent="planner", groups=["ops"])
    coder = ForgeStore(mem, agent="coder", groups=["ops"])
    outsider = ForgeStore(mem, agent="outsider")
    planner.put(("private", "notes"), "n1", {"content": "my private plan"})
    planner.put(("group", "ops", "runbook"), "r1", {"content": "restart the worker first"})
    planner.put(("shared",), "s1", {"content": "the deploy window is friday"})
    assert coder.get(("private", "notes"), "n1") is None
    assert coder.get(("group", "ops", "runbook"), "r1").value["content"] == "restart the worker first"
    assert outsider.get(("group", "ops", "runbook"), "r1") is None
    assert outsider.get(("shared",), "s1") is not None
    assert {u.scope.kind for u in mem.store.list(viewer=Viewer.admin())} == {"private", "group", "global"}
    hits = mem.recall("restart the worker", viewer=Viewer.of("coder", ["ops"]), k=1)
    assert hits[0].unit.content == "restart the worker first" and hits[0].unit.provenance.source == "langgraph:planner"


def test_a_langgraph_graph_uses_it_as_its_store(mem) -> None:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        user: str
        answer: str

    def remember(state: State, *, store) -> dict:
        store.put(("users", state["user"]), "last", {"content": f"{state['user']} asked about ice"})
        return {}

    def answer(state: State, *, store) -> dict:
        found = store.search(("users", state["user"]), query="ice", limit=1)
        return {"answer": found[0].value["content"] if found else "nothing"}

    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_node("answer", answer)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "answer")
    builder.add_edge("answer", END)
    graph = builder.compile(store=ForgeStore(mem, agent="graph"))
    assert graph.invoke({"user": "ann", "answer": ""})["answer"] == "ann asked about ice"
