"""The TypeScript client (clients/ts) with the machine's Node.js against a live server: it
builds with tsc, its types are the ones openapi-typescript generates from the server's
OpenAPI schema today (regenerate with `npm run gen` when the API changes), and its own
tests (node --test) pass against the server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from forge.llm.testing import ScriptedLLM  # noqa: E402
from forge.server.testing import running  # noqa: E402
from server_support import make_setup  # noqa: E402

TS = Path(__file__).parents[1] / "clients" / "ts"
NODE, NPM = shutil.which("node"), shutil.which("npm")
if NODE is None or NPM is None:
    if os.environ.get("CI"):
        raise RuntimeError("Node.js is missing: the TypeScript client's tests need node and npm")
    pytest.skip("Node.js is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def built() -> Path:
    """clients/ts with its dev dependencies (npm ci, from package-lock.json) and compiled."""
    if not (TS / "node_modules" / ".bin" / "tsc").exists():
        done = subprocess.run([NPM, "ci", "--no-audit", "--no-fund"], cwd=TS, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    done = subprocess.run([str(TS / "node_modules" / ".bin" / "tsc"), "-p", "."], cwd=TS, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return TS


def test_the_types_are_generated_from_the_servers_schema(built: Path, tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    (tmp_path / "openapi.json").write_text(json.dumps(setup.app.openapi()))
    setup.memory.close()
    out = tmp_path / "schema.ts"
    done = subprocess.run([str(built / "node_modules" / ".bin" / "openapi-typescript"), str(tmp_path / "openapi.json"), "-o", str(out),
                           "--default-non-nullable=false"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.read_text() == (built / "src" / "schema.ts").read_text(), \
        "clients/ts/src/schema.ts is not the server's schema: run `npm run gen` in clients/ts against a running forge serve"


def test_the_typescript_client_against_a_live_server(built: Path, tmp_path: Path) -> None:
    setup = make_setup(tmp_path, llm=ScriptedLLM())
    agent = setup.keys.create(agent="scout", groups=["ops"])
    with running(setup.app) as url:
        env = {**os.environ, "FORGE_URL": url, "FORGE_ADMIN_KEY": setup.admin, "FORGE_AGENT_KEY": agent}
        done = subprocess.run([NODE, "--test", "--test-reporter=tap", "dist/test/"], cwd=built, env=env, capture_output=True,
                              text=True, timeout=300)
    setup.memory.close()
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-4000:]
    assert "# fail 0" in report and "# pass 6" in report, report[-2000:]
