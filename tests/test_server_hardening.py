"""Regression tests for issue 25 (hardening, second round): each failed before its fix.

A unit page that crashed for everyone (and reset the connection), agent keys named like the
operator, provenance and consensus written by the caller, DNS rebinding of a server without
keys, bodies read before the key was checked and without a cap, the dashboard's headers
and origin checks, 405 where 404 was answered, and what a viewer learns of unseen parents.
"""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from forge.model import Provenance, Unit  # noqa: E402
from forge.server.testing import running  # noqa: E402
from server_support import make_setup  # noqa: E402


@pytest.fixture
def s(tmp_path: Path):
    setup = make_setup(tmp_path)
    with TestClient(setup.app, raise_server_exceptions=False) as client:
        setup.c = client  # type: ignore[attr-defined]
        yield setup
    setup.memory.close()


def _add(s, token: str, **unit) -> str:
    r = s.c.post("/v1/units", json={"units": [unit]}, headers=s.h(token))
    assert r.status_code == 201, r.text
    return r.json()["ids"][0]


def _conn(url: str) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=30)


def _get(conn: http.client.HTTPConnection, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    conn.request("GET", path, headers=headers)
    r = conn.getresponse()
    return r.status, r.read()


# -- 1. a unit page that failed for every viewer -------------------------------------------
def test_a_unit_derived_from_a_missing_parent_renders_for_everyone(s) -> None:
    """Imported or legacy units may name parents that are gone: the page says so, no 500."""
    s.memory.add(Unit("an orphan rule", id="u-orphan", provenance=Provenance(derived_from=("nope",))), actor="import")
    assert s.c.get("/v1/units/u-orphan", headers=s.h(s.admin)).status_code == 200
    admin = s.c.get("/ui/units/u-orphan", headers=s.h(s.admin))
    assert admin.status_code == 200, admin.text[:300]
    assert "nope" in admin.text and "no longer in the store" in admin.text
    agent = s.c.get("/ui/units/u-orphan", headers=s.h(s.bob))
    assert agent.status_code == 200 and "an orphan rule" in agent.text
    assert "nope" not in agent.text  # an agent is not told the ids of parents it cannot see


def test_an_internal_error_keeps_the_keep_alive_connection(tmp_path: Path, monkeypatch) -> None:
    """A 500 is answered as JSON and the next request on the same connection still works."""
    setup = make_setup(tmp_path)

    def boom(*a, **k):
        raise RuntimeError("a bug")

    monkeypatch.setattr(setup.app.state.service, "stats", boom)
    with running(setup.app) as url:
        conn = _conn(url)
        status, body = _get(conn, "/v1/stats", setup.h(setup.admin))
        assert status == 500 and json.loads(body)["error"]["code"] == "internal"
        status, body = _get(conn, "/v1/whoami", setup.h(setup.admin))
        assert status == 200 and json.loads(body)["admin"] is True
        conn.close()
    setup.memory.close()


# -- 2. an agent key named like the operator -------------------------------------------------
@pytest.mark.parametrize("agent", ["admin", "Admin", "operator", "cli", "exchange:alice", "api:bob", " bob", "a b"])
def test_reserved_or_malformed_agent_ids_get_no_key(tmp_path: Path, agent: str) -> None:
    from forge.errors import ValidationError
    from forge.server.keys import KeyStore

    keys = KeyStore(tmp_path / "k.keys.json")
    with pytest.raises(ValidationError, match="agent id"):
        keys.create(agent=agent)
    assert keys.list() == []


def test_a_key_file_entry_named_admin_is_refused_by_the_running_server(s) -> None:
    """A key written before the check (or by hand) authenticates nobody: it would read the
    operator's audit trail, which the audit log names 'admin'."""

    token = s.keys.create(agent="mallory")
    raw = json.loads(s.keys.path.read_text())
    raw["keys"][token.split("_")[1]]["agent"] = "admin"
    s.keys.path.write_text(json.dumps(raw))
    s.c.post("/v1/recall", json={"query": "the operator's secret query"}, headers=s.h(s.admin))
    assert s.c.get("/v1/events", headers=s.h(token)).status_code == 401
    assert s.c.get("/v1/audit/seen", params={"agent": "admin"}, headers=s.h(token)).status_code == 401


def test_keys_create_refuses_an_agent_named_admin_in_one_line(tmp_path: Path, capsys) -> None:
    from forge.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["--db", str(tmp_path / "k.db"), "keys", "create", "--agent", "admin"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "reserved" in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_an_admin_looking_through_an_agents_eyes_does_not_write_to_its_trail(s) -> None:
    s.c.get("/ui/", params={"q": "the operator's secret query", "agent": "bob"}, headers=s.h(s.admin))
    mine = s.c.get("/v1/events", headers=s.h(s.bob)).json()["events"]
    assert not any("secret" in json.dumps(e) for e in mine)
    admin_view = s.c.get("/v1/events", params={"actor": "admin as bob"}, headers=s.h(s.admin)).json()["events"]
    assert [e["op"] for e in admin_view] == ["recall"]


# -- 3. provenance and consensus stamped by the server ----------------------------------------
FORGED = {"origin": "alice", "consensus_of": ["alice", "carol"], "promoted_to": "group:red", "witnesses": ["alice", "carol"]}


@pytest.mark.parametrize("key", sorted(FORGED))
def test_an_agent_cannot_post_system_meta(s, key: str) -> None:
    r = s.c.post("/v1/units", json={"units": [{"content": "a forged consensus rule", "meta": {key: FORGED[key]}}]}, headers=s.h(s.bob))
    assert r.status_code == 422 and key in r.json()["error"]["message"]


def test_an_agent_cannot_claim_another_source_and_the_trace_shows_its_own(s) -> None:
    uid = _add(s, s.bob, content="a rule bob wrote", provenance={"source": "api:alice"})
    t = s.c.get(f"/v1/units/{uid}/trace", headers=s.h(s.bob)).json()
    assert t["source"] == "api:bob/api:alice" and t["made_by"]["origin"] == "bob" and t["promotion"] == {}
    plain = _add(s, s.bob, content="another rule bob wrote")
    assert s.c.get(f"/v1/units/{plain}", headers=s.h(s.bob)).json()["provenance"]["source"] == "api:bob"


def test_an_agent_cannot_patch_system_meta_but_keeps_what_was_recorded(s) -> None:
    [uid] = s.memory.add(Unit("a received rule", owner="bob", meta={"origin": "alice", "hops": 1}), actor="exchange:bob")
    r = s.c.patch(f"/v1/units/{uid}", json={"meta": {"origin": "bob"}}, headers=s.h(s.bob))
    assert r.status_code == 422 and "origin" in r.json()["error"]["message"]
    r = s.c.patch(f"/v1/units/{uid}", json={"meta": {"promoted_to": "x", "note": "mine"}}, headers=s.h(s.bob))
    assert r.status_code == 422
    r = s.c.patch(f"/v1/units/{uid}", json={"meta": {"note": "mine"}}, headers=s.h(s.bob))  # absent: kept as recorded
    assert r.status_code == 200 and r.json()["meta"] == {"origin": "alice", "hops": 1, "note": "mine"}
    r = s.c.patch(f"/v1/units/{uid}", json={"meta": {"origin": "alice", "hops": 1, "note": "again"}}, headers=s.h(s.bob))
    assert r.status_code == 200  # a client sending back what it read is not forging


def test_an_agent_may_derive_only_from_units_it_can_see(s) -> None:
    secret = _add(s, s.alice, content="alice's private parent", scope="private")
    public = _add(s, s.alice, content="a public parent")
    for parents in (["nope"], [secret]):
        r = s.c.post("/v1/units", json={"units": [{"content": "x", "provenance": {"derived_from": parents}}]}, headers=s.h(s.bob))
        assert r.status_code == 422 and "cannot see or that do not exist" in r.json()["error"]["message"]
    child = _add(s, s.bob, content="a child", provenance={"derived_from": [public]})
    assert s.c.get(f"/v1/units/{child}", headers=s.h(s.bob)).json()["provenance"]["derived_from"] == [public]


def test_parents_a_viewer_cannot_see_are_not_named_anywhere(s) -> None:
    secret = _add(s, s.alice, content="alice's private parent", scope="private")
    [child] = s.memory.add(Unit("a global lesson about lakes", provenance=Provenance(derived_from=(secret,))), actor="curate")
    assert s.c.get(f"/v1/units/{child}", headers=s.h(s.alice)).json()["provenance"]["derived_from"] == [secret]
    bodies = [
        s.c.get(f"/v1/units/{child}", headers=s.h(s.bob)),
        s.c.get("/v1/units", headers=s.h(s.bob)),
        s.c.post("/v1/recall", json={"query": "global lesson about lakes"}, headers=s.h(s.bob)),
        s.c.post("/v1/context", json={"query": "global lesson about lakes"}, headers=s.h(s.bob)),
        s.c.get(f"/v1/units/{child}/trace", headers=s.h(s.bob)),
        s.c.get(f"/ui/units/{child}", headers=s.h(s.bob)),
    ]
    for r in bodies:
        assert r.status_code == 200, r.text
        assert child in r.text and secret not in r.text, r.request.url


# -- 4. DNS rebinding of a server without keys ----------------------------------------------
@pytest.fixture
def local(tmp_path: Path):
    from forge.engine.embed import HashingEmbedder
    from forge.engine.memory import Memory
    from forge.server.app import create_app
    from forge.server.keys import KeyStore
    from forge.store import SQLiteStore

    mem = Memory(SQLiteStore(tmp_path / "l.db"), HashingEmbedder(64))
    mem.add(Unit("the operator's private runbook"), actor="seed")
    app = create_app(mem, keys=KeyStore(tmp_path / "l.db.keys.json"), host="127.0.0.1")
    with running(app) as url:
        yield url
    mem.close()


@pytest.mark.parametrize("path", ["/v1/export", "/v1/stats", "/ui/", "/mcp", "/v1/health"])
def test_a_server_without_keys_refuses_foreign_host_names(local: str, path: str) -> None:
    conn = _conn(local)
    status, body = _get(conn, path, {"Host": "evil.example:8792", "Accept": "application/json, text/event-stream"})
    assert status == 421, body[:200]
    assert b"runbook" not in body and json.loads(body)["error"]["code"] == "misdirected"
    conn.close()


@pytest.mark.parametrize("host", ["127.0.0.1:1234", "localhost", "LOCALHOST:80", "[::1]:8792"])
def test_a_server_without_keys_answers_loopback_names(local: str, host: str) -> None:
    conn = _conn(local)
    status, body = _get(conn, "/v1/export", {"Host": host})
    assert status == 200 and b"runbook" in body
    conn.close()


def test_a_server_with_keys_answers_any_host_name_but_wants_a_key(s) -> None:
    r = s.c.get("/v1/stats", headers={"Host": "memory.example.org"})
    assert r.status_code == 401
    assert s.c.get("/v1/stats", headers={"Host": "memory.example.org", **s.h(s.admin)}).status_code == 200


# -- 5. the key before the body, and a cap on bodies -----------------------------------------
def _post_headers_only(url: str, headers: dict[str, str], length: int) -> bytes:
    """Send a POST's headers declaring ``length`` body bytes, send none, and read the answer's head."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        lines = ["POST /v1/units HTTP/1.1", f"Host: {host}", "Content-Type: application/json", f"Content-Length: {length}",
                 *(f"{k}: {v}" for k, v in headers.items())]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_an_unauthenticated_huge_post_is_refused_before_its_body(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    with running(setup.app) as url:
        head = _post_headers_only(url, {}, 300 * 2**20)  # the body never comes: an answer proves it was not awaited
        assert head.startswith(b"HTTP/1.1 401")
        head = _post_headers_only(url, setup.h(setup.bob), 300 * 2**20)
        assert head.startswith(b"HTTP/1.1 413")
    setup.memory.close()


def test_bodies_over_the_cap_are_413_in_the_one_error_shape(tmp_path: Path) -> None:
    setup = make_setup(tmp_path, max_body=1000)
    with TestClient(setup.app) as c:
        big = json.dumps({"units": [{"content": "x" * 2000}]})
        r = c.post("/v1/units", content=big, headers={**setup.h(setup.bob), "content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large" and "--max-body-mb" in r.json()["error"]["message"]

        def chunks():  # no Content-Length: counted as it arrives
            yield big[:800].encode()
            yield big[800:].encode()

        r = c.post("/v1/units", content=chunks(), headers={**setup.h(setup.bob), "content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
        small = c.post("/v1/units", json={"units": [{"content": "a short rule"}]}, headers=setup.h(setup.bob))
        assert small.status_code == 201
        r = c.post("/ui/login", data={"key": "k" * 2000})
        assert r.status_code == 413
        r = c.post("/v1/import", content=b"{}\n" * 1000, headers={**setup.h(setup.bob), "content-type": "application/x-ndjson"})
        assert r.status_code == 403  # an agent's import is refused before its body
    assert setup.memory.store.count(viewer=__import__("forge").Viewer.admin()) == 1
    setup.memory.close()


def test_the_body_cap_is_a_positive_number_of_bytes(tmp_path: Path) -> None:
    from forge.errors import ConfigError

    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="max_body"):
            make_setup(tmp_path, max_body=bad)


# -- 9. lesser ------------------------------------------------------------------------------
def test_delete_on_the_units_collection_is_405_with_allow(s) -> None:
    r = s.c.delete("/v1/units", headers=s.h(s.bob))
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}
    assert s.c.delete("/v1/nothing-here", headers=s.h(s.bob)).status_code == 404


def test_dashboard_pages_carry_csp_frame_and_nosniff_headers(s) -> None:
    for path in ("/ui/login", "/ui/", "/ui/static/htmx.min.js"):
        r = s.c.get(path, headers=s.h(s.admin))
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "'unsafe-inline'" not in csp
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
    api = s.c.get("/v1/health")
    assert api.headers["x-content-type-options"] == "nosniff" and "content-security-policy" not in api.headers
    assert "<style>" not in s.c.get("/ui/login").text  # the styles are a file the CSP allows


@pytest.mark.parametrize("path", ["/ui/login", "/ui/logout"])
def test_sign_in_and_out_refuse_cross_origin_posts(s, path: str) -> None:
    form = {"key": s.alice} if path == "/ui/login" else {}
    for foreign in ({"Origin": "https://evil.example"}, {"Referer": "https://evil.example/page"}, {"Origin": "null"}):
        r = s.c.post(path, data=form, headers=foreign, follow_redirects=False)
        assert r.status_code == 403 and "set-cookie" not in r.headers, foreign
    for own in ({"Origin": "http://testserver"}, {"Referer": "http://testserver/ui/login"}, {}):
        r = s.c.post(path, data=form, headers=own, follow_redirects=False)
        assert r.status_code == 303 and "forge_key" in r.headers["set-cookie"], own
