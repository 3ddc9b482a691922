"""The MCP server, driven by the SDK's own client: in-process, over stdio, and mounted over HTTP."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.client import Client as MCPClient  # noqa: E402

from forge.engine.embed import HashingEmbedder  # noqa: E402
from forge.engine.memory import Memory  # noqa: E402
from forge.model import Viewer  # noqa: E402
from forge.server.keys import Principal  # noqa: E402
from forge.server.mcp import build_mcp  # noqa: E402
from forge.server.service import Service  # noqa: E402
from forge.server.testing import running  # noqa: E402
from forge.store import SQLiteStore  # noqa: E402
from server_support import make_setup  # noqa: E402

TOOLS = {"remember", "recall", "context", "relate", "forget", "trace", "stats"}


def _data(result) -> object:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        sc = result.structured_content
        return sc["result"] if isinstance(sc, dict) and set(sc) == {"result"} else sc
    return json.loads(result.content[0].text)


def test_tools_and_resources_in_process(tmp_path: Path) -> None:
    mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64))
    service = Service(mem)
    me = Principal("scout", frozenset({"ops"}))

    async def main() -> None:
        async with MCPClient(build_mcp(service, lambda ctx: me)) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert tools >= TOOLS
            a = _data(await client.call_tool("remember", {"content": "When the ice is thin, step back.", "kind": "rule", "tags": ["safety"]}))["id"]
            b = _data(await client.call_tool("remember", {"content": "Thin ice cracks with a loud sound.", "scope": "group:ops"}))["id"]
            hits = _data(await client.call_tool("recall", {"query": "thin ice", "k": 3}))
            assert {h["id"] for h in hits} == {a, b} and all(h["reasons"] for h in hits)
            block = (await client.call_tool("context", {"query": "thin ice", "budget": 100})).content[0].text
            assert "step back" in block
            assert _data(await client.call_tool("relate", {"src": b, "dst": a, "type": "supports"}))["type"] == "supports"
            trace = _data(await client.call_tool("trace", {"unit_id": a}))
            assert trace["source"] == "api:scout" and trace["history"][0]["op"] == "add"
            assert _data(await client.call_tool("forget", {"unit_id": a, "reason": "wrong lake"}))["status"] == "archived"
            assert [h["id"] for h in _data(await client.call_tool("recall", {"query": "thin ice", "k": 3}))] == [b]
            assert _data(await client.call_tool("stats", {}))["units"] == 2
            bad = await client.call_tool("trace", {"unit_id": "missing"})
            assert bad.is_error and "missing" in bad.content[0].text
            res = await client.read_resource(f"forge://units/{b}")
            assert json.loads(res.contents[0].text)["id"] == b
            listed = json.loads((await client.read_resource("forge://units")).contents[0].text)
            assert [u["id"] for u in listed] == [b]
            assert json.loads((await client.read_resource("forge://runs")).contents[0].text) == []

    anyio.run(main)
    service.close()  # the read records (recall, context, read) are batched
    events = mem.store.events(actor="scout", viewer=Viewer.admin())
    assert {"add", "recall", "context", "relate", "status", "read"} <= {e.op for e in events}
    mem.close()


@pytest.mark.slow
def test_forge_mcp_over_stdio(tmp_path: Path) -> None:
    db = tmp_path / "stdio.db"
    seed = Memory(SQLiteStore(db), HashingEmbedder(64))
    seed.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH", "")] if p)}
    env.pop("FORGE_API_KEY", None)
    params = StdioServerParameters(command=sys.executable, args=["-m", "forge.cli", "--db", str(db), "mcp"], env=env, cwd=str(tmp_path))

    async def main() -> None:
        with anyio.fail_after(120):
            await session_run()

    async def session_run() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            assert {t.name for t in (await session.list_tools()).tools} >= TOOLS
            uid = _data(await session.call_tool("remember", {"content": "Pack a spare rope."}))["id"]
            hits = _data(await session.call_tool("recall", {"query": "rope"}))
            assert hits[0]["id"] == uid

    anyio.run(main)
    mem = Memory(SQLiteStore(db), HashingEmbedder(64))
    assert [e.actor for e in mem.store.events(ops=["add"], viewer=Viewer.admin())] == ["operator"]
    mem.close()


def test_mounted_mcp_over_http_needs_a_key_and_uses_its_agent(tmp_path: Path) -> None:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    setup = make_setup(tmp_path)
    with running(setup.app) as url:
        assert httpx2.post(f"{url}/mcp", json={}).status_code == 401

        async def main() -> None:
            with anyio.fail_after(120):
                await talk()

        async def talk() -> None:
            async with httpx2.AsyncClient(headers=setup.h(setup.alice), timeout=60) as http, \
                    streamable_http_client(f"{url}/mcp", http_client=http) as streams, \
                    ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                uid = _data(await session.call_tool("remember", {"content": "alice's secret plan", "scope": "private"}))["id"]
                assert _data(await session.call_tool("trace", {"unit_id": uid}))["unit"]["owner"] == "alice"

        anyio.run(main)
    assert [e.actor for e in setup.memory.store.events(ops=["add"], viewer=Viewer.admin())] == ["alice"]
    setup.memory.close()
