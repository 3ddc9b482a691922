"""The documented entry points answer: ``/ui`` (the banner's address), ``/docs`` and ``/redoc``
with nothing fetched from a CDN, ``--json`` after any command's name, ``forge serve`` on a
busy port in one line, ``--db``'s FORGE_DB, and ``forge curate`` as one group."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest

from forge.cli import cli, main

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from server_support import make_setup  # noqa: E402

SRC = str(Path(__file__).parents[1] / "src")


@pytest.fixture
def c(tmp_path: Path):
    setup = make_setup(tmp_path)
    with TestClient(setup.app) as client:
        yield client
    setup.memory.close()


@pytest.mark.slow
def test_ui_without_the_slash_is_the_dashboard(c) -> None:
    r = c.get("/ui", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/ui/"  # was a JSON 404


@pytest.mark.slow
def test_docs_and_redoc_are_served_from_the_package(c) -> None:
    for path, asset in (("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")):
        page = c.get(path)
        assert page.status_code == 200 and f"/docs/static/{asset}" in page.text
        assert "cdn." not in page.text and "fonts.googleapis" not in page.text  # FastAPI's default pages load from CDNs
        js = c.get(f"/docs/static/{asset}")
        assert js.status_code == 200 and len(js.content) > 100_000 and "javascript" in js.headers["content-type"]
    assert c.get("/docs/static/swagger-ui.css").status_code == 200


@pytest.mark.slow
def test_docs_without_the_assets_is_a_plain_page_from_the_schema(tmp_path: Path, monkeypatch) -> None:
    from forge.server import docs

    monkeypatch.setattr(docs, "assets", lambda: None)
    setup = make_setup(tmp_path)
    with TestClient(setup.app) as client:
        page = client.get("/docs").text
        assert "/v1/units" in page and "/v1/recall" in page and "<script" not in page and "openapi.json" in page
        assert client.get("/redoc").text == page
    setup.memory.close()


def _run(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_after_the_command_name(capsys, tmp_path: Path) -> None:
    db = str(tmp_path / "m.db")
    code, uid, _ = _run(capsys, "--db", db, "--embedder", "hash", "add", "The build server restarts on Sundays")
    uid = uid.strip()
    assert code == 0
    code, out, err = _run(capsys, "--db", db, "stats", "--json")
    assert code == 0 and json.loads(out)["units"] == 1, err  # was: No such option: --json
    code, out, err = _run(capsys, "--db", db, "trace", uid, "--json")
    assert code == 0 and json.loads(out)["unit"]["id"] == uid, err
    code, out, _ = _run(capsys, "--db", db, "recall", "build server", "--json")
    assert json.loads(out)[0]["id"] == uid
    code, out, _ = _run(capsys, "--db", db, "curate", "timeline", uid, "--json")
    assert json.loads(out)[0]["unit_id"] == uid
    code, out, _ = _run(capsys, "--db", db, "--json", "stats")  # before the name, as before
    assert json.loads(out)["units"] == 1


def test_every_command_takes_json_after_its_name() -> None:
    def leaves(group: click.Group, path: str = "forge"):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from leaves(cmd, f"{path} {name}")
            else:
                yield f"{path} {name}", cmd

    missing = [name for name, cmd in leaves(cli) if not any("--json" in getattr(p, "opts", ()) for p in cmd.params)]
    assert missing == []


def test_curate_is_a_group_and_the_old_invocation_still_runs_a_pass(capsys, tmp_path: Path) -> None:
    db = str(tmp_path / "m.db")
    _run(capsys, "--db", db, "--embedder", "hash", "add", "a fact")
    assert set(cli.commands["curate"].commands) == {"run", "restore", "seed", "timeline"}
    code, out, _ = _run(capsys, "--db", db, "curate", "--help")
    assert code == 0 and "run" in out and "--dry-run" not in out  # the group's help lists subcommands only
    for args in (["curate", "--dry-run"], ["curate", "run", "--dry-run"]):
        code, out, err = _run(capsys, "--db", db, *args)
        assert code == 0 and "dry run: 1 active units scanned" in out, err
    code, out, _ = _run(capsys, "--db", db, "curate", "run", "--dry-run", "--json")
    assert json.loads(out)["scanned"] == 1


def test_db_help_names_forge_db(capsys) -> None:
    code, out, _ = _run(capsys, "--help")
    assert code == 0 and "FORGE_DB" in " ".join(out.split())


@pytest.mark.slow
def test_serve_on_a_busy_port_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": SRC}
        done = subprocess.run([sys.executable, "-m", "forge.cli", "--db", str(tmp_path / "s.db"), "--embedder", "hash", "serve",
                               "--port", str(port), "--no-mcp"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "busy" in lines[0] and f"port {port}" in lines[0], done.stderr
    assert "serving" not in done.stderr + done.stdout


def test_forge_trace_prints_words_not_dict_reprs(capsys, tmp_path: Path) -> None:
    import re

    db = str(tmp_path / "m.db")
    _, uid, _ = _run(capsys, "--db", db, "--embedder", "hash", "add", "The relay port is 8080.", "--tag", "net")
    _run(capsys, "--db", db, "add", "The relay port is 8080.")
    _run(capsys, "--db", db, "add", "The relay port is 9090.")
    code, out, err = _run(capsys, "--db", db, "trace", uid.strip())
    assert code == 0, err
    assert "{'" not in out and "': " not in out and not re.search(r"\b1\d{9}\.\d+", out)  # was str(dict) of each event
    assert "status active → superseded" in out and "merged " in out and re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", out)
