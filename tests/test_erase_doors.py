"""Erasure through every door: the library, the CLI, REST and the client (admin), MCP.
The store conformance suite checks that the text is gone from every table and index; here,
that each door erases, answers with the tombstone, and refuses whoever may not erase."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.errors import AccessError, NotFoundError, ValidationError
from forge.model import Unit, Viewer
from forge.store import SQLiteStore

SECRET = "Marigold's passport number is X9931-QZ."


def _gone(mem: Memory, uid: str) -> None:
    with pytest.raises(NotFoundError):
        mem.get(uid, viewer=Viewer.admin())
    assert mem.recall("passport number", viewer=Viewer.admin(), k=5) == [] or all(r.unit.id != uid for r in mem.recall("passport number", viewer=Viewer.admin(), k=5))
    text = "\n".join(json.dumps(r) for r in mem.export(viewer=Viewer.admin()))
    assert "X9931" not in text and "Marigold" not in text
    [tomb] = mem.events(viewer=Viewer.admin(), unit_id=uid)
    assert tomb.op == "erase" and "X9931" not in json.dumps(tomb.data)


def test_library_erase(tmp_path: Path) -> None:
    with Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64)) as mem:
        [uid, other] = mem.add([Unit(SECRET, kind="fact"), Unit("the lobby opens at nine")])
        mem.relate(other, uid, "related_to")
        with pytest.raises(ValidationError, match="reason"):
            mem.erase(uid, reason=" ")
        done = mem.erase(uid, reason="erasure request 12", actor="dpo")
        assert done["kind"] == "fact" and done["removed"]["relations"] == 1 and done["reason"] == "erasure request 12"
        _gone(mem, uid)
        assert mem.events(viewer=Viewer.admin(), unit_id=uid)[0].actor == "dpo"


def test_cli_erase(tmp_path: Path, capsys) -> None:
    from forge.cli import main

    db = str(tmp_path / "c.db")

    def run(*args: str) -> tuple[int, str, str]:
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    _, uid, _ = run("--db", db, "--embedder", "hash", "add", SECRET)
    uid = uid.strip()
    code, _, err = run("--db", db, "erase", uid, "--reason", "request 7")
    assert code == 2 and "--yes" in err  # no terminal to ask on: refused, nothing erased
    code, out, err = run("--db", db, "erase", uid, "--reason", "request 7", "--yes", "--json")
    assert code == 0 and json.loads(out)["erased"] == uid, err
    with Memory.open(db) as mem:
        _gone(mem, uid)
    code, _, err = run("--db", db, "erase", uid, "--reason", "again", "--yes")
    assert code == 2 and "no unit" in err


def test_rest_and_client_erase_for_admins_only(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from forge.client import Client
    from forge.server.testing import running
    from server_support import make_setup

    setup = make_setup(tmp_path)
    with TestClient(setup.app) as c:
        # private: written global, the screen would hold (and redact) a passport number before anyone recalled it
        [uid] = c.post("/v1/units", json={"units": [{"content": SECRET, "scope": "private"}]}, headers=setup.h(setup.alice)).json()["ids"]
        c.post("/v1/recall", json={"query": "passport number", "k": 3}, headers=setup.h(setup.alice))
        r = c.delete(f"/v1/units/{uid}", params={"reason": "mine"}, headers=setup.h(setup.alice))
        assert r.status_code == 403 and "admin" in r.json()["error"]["message"]  # an agent archives; only an admin erases
        assert c.delete(f"/v1/units/{uid}", headers=setup.h(setup.admin)).status_code == 422  # the reason is required
        r = c.delete(f"/v1/units/{uid}", params={"reason": "erasure request 3"}, headers=setup.h(setup.admin))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["erased"] == uid and body["reason"] == "erasure request 3" and body["removed"]["mentions_scrubbed"] >= 1
        assert c.delete(f"/v1/units/{uid}", params={"reason": "x"}, headers=setup.h(setup.admin)).status_code == 404
        assert c.get(f"/v1/units/{uid}", headers=setup.h(setup.admin)).status_code == 404
        assert "X9931" not in c.get("/v1/events", params={"limit": 1000}, headers=setup.h(setup.admin)).text
    _gone(setup.memory, uid)
    setup.memory.close()
    (tmp_path / "b").mkdir()
    served = make_setup(tmp_path / "b")  # an app runs once: another for the client
    with running(served.app) as url, Client(url, served.admin) as admin, Client(url, served.bob) as bob:
        [uid] = admin.add(Unit(SECRET))
        with pytest.raises(AccessError):
            bob.erase(uid, reason="not mine")
        assert admin.erase(uid, reason="request 4")["erased"] == uid
    _gone(served.memory, uid)
    served.memory.close()


def test_mcp_erase(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    from mcp.client.client import Client as MCPClient

    from forge.server.keys import Principal
    from forge.server.mcp import build_mcp
    from forge.server.service import Service

    mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64))
    service = Service(mem)
    [uid] = mem.add(Unit(SECRET))

    async def main() -> None:
        async with MCPClient(build_mcp(service, lambda ctx: Principal("scout", frozenset()))) as agent:
            refused = await agent.call_tool("erase", {"unit_id": uid, "reason": "x"})
            assert refused.is_error and "admin" in refused.content[0].text
        async with MCPClient(build_mcp(service, lambda ctx: Principal.local())) as operator:
            done = await operator.call_tool("erase", {"unit_id": uid, "reason": "erasure request 9"})
            assert not done.is_error, done.content
            assert (done.structured_content or json.loads(done.content[0].text))["erased"] == uid

    anyio.run(main)
    service.close()
    _gone(mem, uid)
    mem.close()
