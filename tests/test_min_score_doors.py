"""``min_score`` through the served doors (REST recall and context, the client, MCP recall)
and the dashboard's search, which by default no longer lists every unit down to the
least similar one."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from forge.client import Client  # noqa: E402
from forge.model import Unit  # noqa: E402
from forge.server.testing import running  # noqa: E402
from server_support import make_setup  # noqa: E402

FACTS = ["When the ice is thin, step back and test it.", "Thin ice cracks with a booming sound.",
         *(f"Inventory item {i} sits on shelf {i + 3} in the warehouse." for i in range(20))]


@pytest.fixture
def setup(tmp_path: Path):
    s = make_setup(tmp_path)
    s.memory.add([Unit(f) for f in FACTS])
    yield s
    s.memory.close()


def test_rest_recall_and_context_take_min_score(setup) -> None:
    with TestClient(setup.app) as c:
        h = setup.h(setup.admin)
        every = c.post("/v1/recall", json={"query": "thin ice", "k": 25}, headers=h).json()["results"]
        assert len(every) == len(FACTS) and min(r["score"] for r in every) < 0.2
        high = c.post("/v1/recall", json={"query": "thin ice", "k": 25, "min_score": 0.3}, headers=h).json()["results"]
        assert high and all(r["score"] >= 0.3 for r in high) and len(high) < len(every)
        assert {r["unit"]["content"] for r in high} <= set(FACTS[:2])
        packed = c.post("/v1/context", json={"query": "thin ice", "k": 25, "budget": 2000, "min_score": 0.3}, headers=h).json()
        assert "warehouse" not in packed["prompt"] and "step back" in packed["prompt"]
        assert c.post("/v1/recall", json={"query": "x", "min_score": 1.5}, headers=h).status_code == 422


def test_client_recall_takes_min_score(setup) -> None:
    with running(setup.app) as url, Client(url, setup.admin) as mem:
        got = mem.recall("thin ice", k=25, min_score=0.3)
        assert got and all(r.score >= 0.3 for r in got) and len(got) < len(FACTS)
        assert "warehouse" not in mem.context("thin ice", k=25, budget=2000, min_score=0.3).render()


def test_mcp_recall_takes_min_score(setup) -> None:
    pytest.importorskip("mcp")
    from mcp.client.client import Client as MCPClient

    from forge.server.keys import Principal
    from forge.server.mcp import build_mcp
    from forge.server.service import Service

    service = Service(setup.memory)

    async def main() -> list[dict]:
        async with MCPClient(build_mcp(service, lambda ctx: Principal.local())) as client:
            res = await client.call_tool("recall", {"query": "thin ice", "k": 25, "min_score": 0.3})
            assert not res.is_error, res.content
            sc = res.structured_content
            return sc["result"] if isinstance(sc, dict) and "result" in sc else json.loads(res.content[0].text)

    hits = anyio.run(main)
    service.close()
    assert hits and all(h["score"] >= 0.3 for h in hits) and len(hits) < len(FACTS)


def test_dashboard_search_leaves_out_low_scores_by_default(setup) -> None:
    import re

    def scores(html: str) -> list[float]:
        return [float(x) for x in re.findall(r"<td>([01]\.\d{4})<br>", html)]

    with TestClient(setup.app) as c:
        c.cookies.set("forge_key", setup.admin)
        page = c.get("/ui/search", params={"q": "thin ice"}).text
        everything = c.get("/ui/search", params={"q": "thin ice", "min_score": "0"}).text
        assert "step back" in page and "none scored below 0.10" in page
        assert len(scores(everything)) == len(FACTS) and min(scores(everything)) < 0.1  # before: every unit, down to the least similar
        assert scores(page) and min(scores(page)) >= 0.1 and len(scores(page)) < len(FACTS)
        assert "give a number from 0 to 1" in c.get("/ui/search", params={"q": "thin ice", "min_score": "lots"}).text
        assert 'name="min_score"' in c.get("/ui/", params={"q": "thin ice"}).text
