"""Admission through every served door: the same fact posted twice is one unit, and each
answer says what was done (added / merged into X / updated X). Before, REST, the client,
MCP's remember and LangGraph's put stored it again, and recall's top 3 were the same fact
three times."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import anyio
import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from forge.client import AsyncClient, Client  # noqa: E402
from forge.model import Status, Unit, Viewer  # noqa: E402
from forge.server.testing import running  # noqa: E402
from server_support import make_setup  # noqa: E402

FACT = "The build server restarts on Sundays"


def _active(mem) -> list[Unit]:
    return [u for u in mem.list(viewer=Viewer.admin(), limit=100) if u.status is Status.ACTIVE]


@pytest.fixture
def setup(tmp_path: Path):
    s = make_setup(tmp_path)
    yield s
    s.memory.close()


@pytest.mark.slow
def test_rest_admits_by_default_and_says_what_it_did(setup) -> None:
    with TestClient(setup.app) as c:
        first = c.post("/v1/units", json={"units": [{"content": FACT}]}, headers=setup.h(setup.alice)).json()
        second = c.post("/v1/units", json={"units": [{"content": FACT}]}, headers=setup.h(setup.alice)).json()
        assert first["admission"][0]["action"] == "add" and first["admission"][0]["summary"] == "added"
        uid = first["ids"][0]
        assert second["ids"] == [uid]
        assert second["admission"][0]["action"] == "noop" and second["admission"][0]["summary"] == f"merged into {uid}"
        assert [u.content for u in _active(setup.memory)] == [FACT]
        hits = c.post("/v1/recall", json={"query": "build server restarts", "k": 3}, headers=setup.h(setup.alice)).json()["results"]
        assert [h["unit"]["content"] for h in hits].count(FACT) == 1

        # A newer value for the same statement updates it: the old one is superseded, not lost.
        third = c.post("/v1/units", json={"units": [{"content": "The build server restarts on Mondays"}]}, headers=setup.h(setup.alice)).json()
        d = third["admission"][0]
        assert d["action"] == "update" and d["existing"] == uid and d["summary"].startswith(f"updated {uid}")
        assert setup.memory.get(uid, viewer=Viewer.admin()).status is Status.SUPERSEDED

        # The opt-out stores as given.
        off = c.post("/v1/units", json={"units": [{"content": "raw note"}, {"content": "raw note"}], "admit": False},
                     headers=setup.h(setup.admin)).json()
        assert len(set(off["ids"])) == 2 and {d["action"] for d in off["admission"]} == {"add"}
        assert "admission off" in off["admission"][0]["reason"]
        spec = c.get("/openapi.json").json()
        assert "admit" in spec["components"]["schemas"]["AddIn"]["properties"]
        assert "admission" in spec["components"]["schemas"]["AddOut"]["properties"]


def test_client_and_async_client_admit(setup) -> None:
    with running(setup.app) as url:
        with Client(url, setup.bob) as mem:
            [a] = mem.add(Unit(FACT))
            [b] = mem.add(Unit(FACT))
            assert a == b
            [d] = mem.admit(Unit(FACT.lower()))
            assert d.action == "noop" and d.unit_id == a and d.summary == f"merged into {a}"
            assert [r.unit.id for r in mem.recall("build server", k=3)] == [a]
            assert len(set(mem.add([Unit("twice"), Unit("twice")], admit=False))) == 2

        async def main() -> None:
            async with AsyncClient(url, setup.bob) as amem:
                assert await amem.add(Unit(FACT)) == [a]
                [d] = await amem.admit(Unit(FACT))
                assert d.action == "noop" and d.existing == a

        asyncio.run(main())
    assert sum(u.content == FACT for u in _active(setup.memory)) == 1


def test_mcp_remember_admits(setup) -> None:
    pytest.importorskip("mcp")
    from mcp.client.client import Client as MCPClient

    from forge.server.keys import Principal
    from forge.server.mcp import build_mcp
    from forge.server.service import Service

    service = Service(setup.memory)
    me = Principal("scout", frozenset())

    def data(result):
        assert not result.is_error, result.content
        sc = result.structured_content
        return sc if sc is not None else json.loads(result.content[0].text)

    async def main() -> None:
        async with MCPClient(build_mcp(service, lambda ctx: me)) as client:
            first = data(await client.call_tool("remember", {"content": FACT}))
            second = data(await client.call_tool("remember", {"content": FACT}))
            assert first["action"] == "add" and first["summary"] == "added"
            assert second["id"] == first["id"] and second["action"] == "noop" and second["summary"] == f"merged into {first['id']}"
            raw = data(await client.call_tool("remember", {"content": FACT, "admit": False}))
            assert raw["id"] != first["id"]

    anyio.run(main)
    service.close()
    assert sum(u.content == FACT for u in _active(setup.memory)) == 2  # one admitted, one stored as given


def test_langgraph_put_admits_and_the_second_key_names_the_same_unit(setup) -> None:
    pytest.importorskip("langgraph")
    from forge.integrations.langgraph import ForgeStore

    store = ForgeStore(setup.memory, agent="planner")
    store.put(("ops",), "a", {"content": FACT, "source": "wiki"})
    assert store.last_admission.action == "add"
    store.put(("ops",), "b", {"content": FACT, "source": "chat"})
    assert store.last_admission.action == "noop" and store.last_admission.summary.startswith("merged into")
    assert [u.content for u in _active(setup.memory)] == [FACT]
    assert store.get(("ops",), "b").value == {"content": FACT, "source": "chat"}  # each key keeps its value
    assert store.get(("ops",), "a").value["source"] == "wiki"
    assert [i.key for i in store.search(("ops",), query="build server", limit=5)] == ["a"]  # the memory once
    assert sorted(i.key for i in store.search(("ops",), limit=5)) == ["a", "b"]  # a listing names every key
    store.put(("other",), "c", {"content": FACT})  # another namespace is another memory
    assert len(_active(setup.memory)) == 2

    store.delete(("ops",), "a")  # the merged key lives on
    assert store.get(("ops",), "a") is None and store.get(("ops",), "b").value["source"] == "chat"
    store.put(("ops",), "a", {"content": FACT, "source": "again"})  # and merges back
    assert store.last_admission.action == "noop" and store.get(("ops",), "a").value["source"] == "again"
    store.put(("ops",), "b", {"content": "The deploy window is Friday"})  # a key that changes moves out
    assert store.get(("ops",), "b").value["content"] == "The deploy window is Friday"
    assert store.get(("ops",), "a").value["content"] == FACT
    assert len(_active(setup.memory)) == 3

    raw = ForgeStore(setup.memory, agent="planner", admit=False)
    raw.put(("raw",), "x", {"content": FACT})
    raw.put(("raw",), "y", {"content": FACT})
    assert len(_active(setup.memory)) == 5


def test_cli_add_admits_by_default(tmp_path: Path, capsys) -> None:
    from forge.cli import main

    db = str(tmp_path / "cli.db")

    def add(*extra: str) -> tuple[str, str]:
        main(["--db", db, "--embedder", "hash", "add", FACT, *extra])  # exits only on an error
        out = capsys.readouterr()
        return out.out.strip(), out.err

    first, said = add()
    assert said.startswith("added")
    second, said = add()
    assert second == first and said.startswith(f"merged into {first}")
    third, _ = add("--no-admit")
    assert third != first


@pytest.mark.slow
def test_langgraph_put_over_the_service_admits_too(setup) -> None:
    pytest.importorskip("langgraph")
    from forge.integrations.langgraph import ForgeStore

    with running(setup.app) as url, Client(url, setup.alice) as alice, Client(url, setup.bob) as bob:
        mine = ForgeStore(alice)
        assert mine.agent == "alice" and mine.groups == {"red"}  # from the key
        mine.put(("ops",), "a", {"content": FACT})
        mine.put(("ops",), "b", {"content": FACT, "n": 2})
        assert mine.last_admission.action == "noop"
        assert mine.get(("ops",), "b").value == {"content": FACT, "n": 2} and mine.get(("ops",), "a").value == {"content": FACT}
        assert [u.content for u in _active(setup.memory)] == [FACT]
        # Another agent's duplicate corroborates alice's unit on the server, but bob may not
        # rename alice's unit: his key keeps a unit of its own.
        theirs = ForgeStore(bob)
        theirs.put(("ops",), "c", {"content": FACT})
        assert theirs.get(("ops",), "c").value == {"content": FACT}
        assert sum(u.content == FACT for u in _active(setup.memory)) == 2
