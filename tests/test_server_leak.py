"""Key B never sees key A's private units: through any endpoint, MCP tool or dashboard page.

Alice owns a private unit and a unit in her group; Bob (another group) calls everything
with those ids and with queries that match them. No response may contain their text or
ids. The test fails if an endpoint exists that it does not call, so new routes join it.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from forge.llm.testing import ScriptedLLM  # noqa: E402
from forge.server.keys import Principal  # noqa: E402
from forge.server.mcp import build_mcp  # noqa: E402
from server_support import make_setup  # noqa: E402

SECRET = "zebra quartz 7431 alice private plan"
GROUP = "walrus 9902 red team runbook"
Q_SECRET = "alice private plan 7431"  # queries that match them without naming the marker words
Q_GROUP = "red team runbook 9902"


@pytest.fixture(params=["sqlite", "postgres"])
def world(request: pytest.FixtureRequest, tmp_path: Path):
    """The same probes over every store backend."""
    from conftest import make_store

    store = None if request.param == "sqlite" else make_store(request.param, tmp_path, request)
    setup = make_setup(tmp_path, store=store, capsule_secret="k", llm=ScriptedLLM())  # extracts nothing, obeys the schema
    with TestClient(setup.app) as c:
        h = setup.h(setup.alice)
        ids = c.post("/v1/units", json={"units": [{"content": SECRET, "scope": "private", "kind": "rule"},
                                                   {"content": GROUP, "scope": "group:red"}]}, headers=h).json()["ids"]
        c.post("/v1/relations", json={"src": ids[0], "dst": ids[1], "type": "supports"}, headers=h)
        c.post(f"/v1/units/{ids[0]}/status", json={"status": "quarantined", "reason": "held for review"}, headers=h)
        c.post(f"/v1/units/{ids[0]}/status", json={"status": "active", "reason": "released"}, headers=setup.h(setup.admin))  # an operator's to release
        rid = c.post("/v1/recall", json={"query": SECRET}, headers=h).json()["recall_id"]
        job = c.post("/v1/learn", json={"trace": {"task": SECRET, "recall_ids": [rid]}, "outcome": {"success": False}}, headers=h).json()["job_id"]
        eid = c.post("/v1/episodes", json={"task": SECRET, "env": "lake"}, headers=h).json()["id"]
        c.post("/v1/units", json={"units": [{"content": "bob's own public note about lakes"}]}, headers=setup.h(setup.bob))
        setup.c, setup.ids, setup.eid, setup.rid, setup.job = c, ids, eid, rid, job  # type: ignore[attr-defined]
        yield setup
    setup.memory.close()


def _clean(text: str, ids: list[str], sent: str = "") -> None:
    """No marker word of Alice's units, and none of their ids unless the request named it."""
    lowered = text.lower()
    for needle in ("zebra", "quartz", "walrus", *(i for i in ids if i not in sent)):
        assert needle.lower() not in lowered, f"leaked {needle!r}: {text[:300]}"


@pytest.mark.slow
def test_no_rest_endpoint_leaks(world) -> None:
    c, ids, eid = world.c, world.ids, world.eid
    h = world.h(world.bob)
    a, g = ids
    calls = [
        ("GET", "/v1/health", None), ("GET", "/v1/whoami", None),
        ("POST", "/v1/units", {"units": [{"content": "probe", "id": a}]}),
        ("GET", "/v1/units", None), ("GET", "/v1/units?status=active&status=quarantined&status=archived", None),
        ("GET", "/v1/units?owner=alice&scope=private", None), ("GET", "/v1/units?scope=group:red", None),
        ("GET", f"/v1/units/{a}", None), ("GET", f"/v1/units/{g}", None),
        ("PATCH", f"/v1/units/{a}", {"content": "overwritten"}), ("PATCH", f"/v1/units/{g}", {"importance": 1.0}),
        ("POST", f"/v1/units/{a}/status", {"status": "archived", "reason": "x"}),
        ("DELETE", f"/v1/units/{a}?reason=x", None), ("DELETE", f"/v1/units/{g}?reason=x", None),
        ("POST", "/v1/messages", {"messages": [{"role": "user", "content": Q_SECRET}], "scope": "group:red"}),
        ("GET", f"/v1/units/{a}/relations", None), ("GET", f"/v1/units/{g}/relations", None),
        ("GET", f"/v1/units/{a}/history", None), ("GET", f"/v1/units/{a}/trace", None),
        ("POST", "/v1/recall", {"query": Q_SECRET, "k": 50, "filter": {"status": ["active", "quarantined", "archived", "superseded"]}}),
        ("POST", "/v1/recall", {"query": Q_GROUP, "k": 50, "filter": {"owner": "alice", "scopes": ["private", "group:red"]}}),
        ("POST", "/v1/context", {"query": Q_SECRET + " " + Q_GROUP, "budget": 2000}),
        ("POST", "/v1/relations", {"src": a, "dst": g}),
        ("POST", "/v1/episodes", {"agent": "alice", "task": "x"}), ("GET", f"/v1/episodes/{eid}", None),
        ("GET", "/v1/export", None), ("POST", "/v1/import", "{}"),
        ("GET", "/v1/stats", None),
        ("GET", "/v1/events", None), ("GET", "/v1/events?actor=alice", None), ("GET", f"/v1/events?unit_id={a}", None),
        ("GET", "/v1/events/stream?max_events=50&timeout_s=1&poll_s=0.05", None),
        ("GET", "/v1/audit/seen?agent=alice", None), ("GET", "/v1/audit/seen?agent=bob", None),
        ("POST", "/v1/capsules", {"unit": {"content": "x"}}),
        ("GET", "/v1/quarantine", None),
        ("GET", "/v1/runs", None), ("GET", "/v1/runs/x", None), ("GET", "/v1/runs/x/report", None),
        # Alice's recall and learning job: Bob can neither credit, learn from, nor read them
        ("POST", "/v1/outcomes", {"recall_id": world.rid, "success": False}),
        ("POST", "/v1/learn", {"trace": {"task": Q_SECRET, "recall_ids": [world.rid]}, "outcome": {"success": False}}),
        ("GET", f"/v1/jobs/{world.job}", None),
    ]
    covered = set()
    for method, path, body in calls:
        kw = {"content": body} if isinstance(body, str) else {"json": body} if body is not None else {}
        r = c.request(method, path, headers=h, **kw)
        assert r.status_code < 500, (method, path, r.text)
        _clean(r.text, ids, path + json.dumps(body))
        covered.add((method, path.split("?")[0].replace(a, "{unit_id}").replace(g, "{unit_id}").replace(eid, "{episode_id}")
                     .replace("/runs/x/report", "/runs/{name}/report").replace("/runs/x", "/runs/{name}").replace(world.job, "{job_id}")))
    spec = c.get("/openapi.json").json()["paths"]
    every = {(m.upper(), p) for p, ops in spec.items() for m in ops}
    assert every - covered == set(), f"endpoints the leak test does not call: {sorted(every - covered)}"
    # Bob's probes changed nothing of Alice's.
    unit = c.get(f"/v1/units/{a}", headers=world.h(world.alice)).json()
    assert unit["content"] == SECRET and unit["status"] == "active"


def test_no_mcp_tool_or_resource_leaks(world) -> None:
    from mcp.client.client import Client as MCPClient

    a, g = world.ids
    bob = Principal("bob", frozenset({"blue"}))
    server = build_mcp(world.app.state.service, lambda ctx: bob, world.app.state.learning)

    async def main() -> list[str]:
        out = []
        async with MCPClient(server) as client:
            calls = [("recall", {"query": Q_SECRET, "k": 50}), ("recall", {"query": Q_GROUP, "k": 50}),
                     ("context", {"query": Q_SECRET, "budget": 2000}), ("relate", {"src": a, "dst": g}),
                     ("remember_messages", {"messages": [{"role": "user", "content": Q_SECRET}]}),
                     ("forget", {"unit_id": a, "reason": "x"}), ("erase", {"unit_id": a, "reason": "x"}), ("erase", {"unit_id": g, "reason": "x"}),
                     ("trace", {"unit_id": a}), ("trace", {"unit_id": g}),
                     ("stats", {}), ("remember", {"content": "probe", "scope": "group:red"}),
                     ("feedback", {"recall_id": world.rid, "success": False}),
                     ("learn", {"task": Q_SECRET, "recall_ids": [world.rid], "success": False, "wait": 5})]
            assert {n for n, _ in calls} == {t.name for t in (await client.list_tools()).tools}
            for name, args in calls:
                res = await client.call_tool(name, args)
                out.append((json.dumps([c.model_dump() for c in res.content]) + json.dumps(res.structured_content), json.dumps(args)))
            for uri in (f"forge://units/{a}", "forge://units", "forge://units?limit=1000", "forge://runs"):
                try:
                    res = await client.read_resource(uri)
                    out.append((json.dumps([c.model_dump() for c in res.contents]), uri))
                except Exception as exc:  # noqa: BLE001 - an error is fine, its text is checked too
                    out.append((str(exc), uri))
        return out

    for text, sent in anyio.run(main):
        _clean(text, world.ids, sent)


def test_no_dashboard_page_leaks(world) -> None:
    c, ids = world.c, world.ids
    a, g = ids
    c.cookies.set("forge_key", world.bob)
    pages = ["/ui/", f"/ui/?q={Q_SECRET}", f"/ui/search?q={Q_SECRET}&status=active", f"/ui/search?q={Q_GROUP}&agent=alice&groups=red",
             "/ui/search?q=x&status=quarantined", f"/ui/units/{a}", f"/ui/units/{g}", "/ui/quarantine", "/ui/conflicts",
             "/ui/agents", "/ui/runs", "/ui/events", "/ui/events?actor=alice"]
    for path in pages:
        r = c.get(path)
        assert r.status_code < 500, (path, r.text[:300])
        _clean(r.text, ids, path)
    r = c.post(f"/ui/units/{a}/review", data={"decision": "approve", "reason": "x"}, headers={"HX-Request": "true"})
    _clean(r.text, ids, a)
    c.cookies.clear()
