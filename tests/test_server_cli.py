"""forge keys / audit / serve: thin commands over the service, and a real server process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from click.testing import CliRunner  # noqa: E402

from forge.cli import cli  # noqa: E402
from forge.client import Client  # noqa: E402
from forge.model import Unit  # noqa: E402

SRC = str(Path(__file__).parents[1] / "src")


def _run(*args: str, db: Path) -> object:
    r = CliRunner().invoke(cli, ["--db", str(db), "--embedder", "hash:64", "--json", *args], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_keys_create_list_revoke_and_audit(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    made = _run("keys", "create", "--agent", "scout", "--group", "ops", "--rate", "5", db=db)
    assert made["key"].startswith("fk_") and made["agent"] == "scout" and made["groups"] == ["ops"]
    listed = _run("keys", "list", db=db)
    assert [k["id"] for k in listed] == [made["id"]] and "key" not in listed[0] and "hash" not in listed[0]
    assert made["key"] not in (tmp_path / "k.db.keys.json").read_text()
    revoked = _run("keys", "revoke", made["id"], db=db)
    assert revoked["revoked_at"] is not None
    bad = CliRunner().invoke(cli, ["--db", str(db), "keys", "revoke", "nope"])
    assert bad.exit_code != 0
    _run("add", "When the ice is thin, step back", "--kind", "rule", db=db)
    _run("recall", "thin ice", "--agent", "scout", db=db)
    entries = _run("audit", "--op", "add", db=db)
    assert [e["op"] for e in entries] == ["add"] and entries[0]["actor"] == "cli"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _server(*args: str) -> Iterator[subprocess.Popen]:
    """``python -m forge.cli ARGS`` (a server), killed at the end if it is still running."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [SRC, os.environ.get("PYTHONPATH", "")] if p)}
    proc = subprocess.Popen([sys.executable, "-m", "forge.cli", *args], env=env, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _stop(proc: subprocess.Popen) -> str:
    """SIGTERM, as an operator would: uvicorn shuts down gracefully, then re-raises the signal."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGTERM)
    return err


@pytest.mark.slow
def test_forge_serve_starts_serves_and_shuts_down_gracefully(tmp_path: Path) -> None:
    db = tmp_path / "served.db"
    _run("add", "seed", db=db)
    token = _run("keys", "create", "--agent", "scout", db=db)["key"]
    port = _free_port()
    with _server("--db", str(db), "serve", "--port", str(port), "--runs", str(tmp_path)) as proc:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with Client(url, token, retries=0) as c:
                    me = c.whoami()
                break
            except Exception:  # noqa: BLE001 - not listening yet
                assert proc.poll() is None and time.monotonic() < deadline, "forge serve did not start"
                time.sleep(0.2)
        assert me["agent"] == "scout"
        with Client(url, token) as c:
            [uid] = c.add(Unit("written just before shutdown"))
        err = _stop(proc)
    assert "FORGE serving" in err and "Traceback" not in err
    units = _run("recall", "written just before shutdown", db=db)
    assert uid in [u["id"] for u in units]


@pytest.mark.slow
def test_serve_without_keys_binds_loopback_and_says_so(tmp_path: Path) -> None:
    db = tmp_path / "local.db"
    _run("add", "seed", db=db)
    port = _free_port()
    with _server("--db", str(db), "serve", "--host", "0.0.0.0", "--port", str(port)) as proc:
        deadline = time.monotonic() + 120
        while True:
            try:
                with Client(f"http://127.0.0.1:{port}", retries=0) as c:
                    assert c.whoami()["admin"] is True
                break
            except Exception:  # noqa: BLE001 - not listening yet
                assert proc.poll() is None and time.monotonic() < deadline, "forge serve did not start"
                time.sleep(0.2)
        err = _stop(proc)
    assert "binding to 127.0.0.1 only" in err and "local mode" in err


def test_no_mcp_serves_without_the_mcp_sdk(monkeypatch):
    import builtins

    from forge.errors import ConfigError
    from forge.server.cli import _need_server_extra

    real = builtins.__import__

    def no_mcp(name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if name == "mcp" or name.startswith("mcp."):
            raise ImportError(name=name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mcp)
    _need_server_extra(mcp=False)  # forge serve --no-mcp
    with pytest.raises(ConfigError, match="mcp is missing"):
        _need_server_extra()


@pytest.mark.slow
def test_serve_with_workers_is_one_service_across_processes(tmp_path: Path) -> None:
    """--workers 2: two processes behind one port, one database. Every connection may reach
    either, so a write through one is read through the other, and MCP (stateless here)
    works with each request on a new connection."""
    import anyio
    import httpx
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    db = tmp_path / "workers.db"
    _run("add", "seed", db=db)
    token = _run("keys", "create", "--agent", "scout", db=db)["key"]
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    fresh = {"headers": {"Authorization": f"Bearer {token}", "Connection": "close"}, "timeout": 60}
    with _server("--db", str(db), "serve", "--port", str(port), "--workers", "2", "--no-dashboard") as proc:
        pids: set[int] = set()
        deadline = time.monotonic() + 180
        while len(pids) < 2:  # until both processes have answered
            assert proc.poll() is None and time.monotonic() < deadline, f"saw only {pids}"
            try:
                pids.add(httpx.get(f"{url}/v1/health", **fresh).json()["pid"])
            except httpx.HTTPError:
                time.sleep(0.2)
        [uid] = httpx.post(f"{url}/v1/units", json={"units": [{"content": "the bridge at the ford is out"}]}, **fresh).json()["ids"]
        for _ in range(12):  # each on a new connection, whichever process takes it
            hits = httpx.post(f"{url}/v1/recall", json={"query": "bridge ford", "k": 3}, **fresh).json()["results"]
            assert uid in [h["unit"]["id"] for h in hits]

        async def talk() -> None:
            with anyio.fail_after(120):
                async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60,
                                              limits=httpx2.Limits(max_keepalive_connections=0)) as http, \
                        streamable_http_client(f"{url}/mcp", http_client=http) as streams, \
                        ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    for i in range(4):
                        await session.call_tool("remember", {"content": f"note {i} from MCP"})

        anyio.run(talk)
        err = _stop(proc)
    assert "2 worker processes" in err and "Traceback" not in err
    assert len(_run("recall", "note from MCP", db=db)) >= 4


def test_workers_need_a_shared_database() -> None:
    r = CliRunner().invoke(cli, ["--db", ":memory:", "--embedder", "hash:64", "serve", "--workers", "2"])
    assert r.exit_code != 0 and "needs a database file" in str(r.exception)


@pytest.mark.parametrize("value", ["-1", "60001", "nan"])
def test_a_bad_read_audit_delay_is_one_line_before_anything_opens(tmp_path: Path, value: str) -> None:
    db = tmp_path / "never.db"
    r = CliRunner().invoke(cli, ["--db", str(db), "--embedder", "hash:64", "serve", "--read-audit-ms", value])
    assert r.exit_code != 0 and str(r.exception) == "--read-audit-ms must be between 0 and 60000"
    assert not r.output and not db.exists()


def test_only_one_worker_takes_the_curation_lock(tmp_path: Path) -> None:
    from forge.server import cli as server_cli

    db = str(tmp_path / "c.db")
    try:
        assert [server_cli._take_curation_lock(db), server_cli._take_curation_lock(db)] == [True, False]  # one holder
        assert server_cli._take_curation_lock(f"postgresql://forge@db/{tmp_path.name}") is True  # a URL: its own lock file
    finally:
        while server_cli._held_locks:  # a worker holds them for life; this test process lets go
            server_cli._held_locks.pop().close()
