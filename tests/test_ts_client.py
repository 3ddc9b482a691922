"""The TypeScript client (clients/ts) with the machine's Node.js against a live server: it
builds with tsc, its types are the ones openapi-typescript generates from the server's
OpenAPI schema today (regenerate with `npm run gen` when the API changes), its own
tests (node --test) pass against the server, and the ```ts examples of the docs type-check
and run as pasted against a server (as tests/test_docs.py runs the Python ones)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from forge.llm.testing import ScriptedLLM  # noqa: E402
from forge.server.testing import running  # noqa: E402
from server_support import make_setup  # noqa: E402

ROOT = Path(__file__).parents[1]
TS = ROOT / "clients" / "ts"
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


@pytest.mark.slow
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
    other = setup.keys.create(agent="ranger", groups=["ops"])
    with running(setup.app) as url:
        env = {**os.environ, "FORGE_URL": url, "FORGE_ADMIN_KEY": setup.admin, "FORGE_AGENT_KEY": agent, "FORGE_OTHER_KEY": other}
        done = subprocess.run([NODE, "--test", "--test-reporter=tap", "dist/test/"], cwd=built, env=env, capture_output=True,
                              text=True, timeout=300)
    setup.memory.close()
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-4000:]
    assert "# fail 0" in report and "# pass 8" in report, report[-2000:]


#: ```ts blocks in the docs; a page that shows one is a TypeScript example a user pastes.
TS_PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "```ts" in p.read_text())
TS_BLOCKS = [(page, m.start(), m["code"]) for page in TS_PAGES
             for m in re.finditer(r"^```ts\n(?P<code>.*?)^```", page.read_text(), flags=re.M | re.S)]


@pytest.mark.slow
@pytest.mark.parametrize("page,at,code", TS_BLOCKS, ids=[f"{p.relative_to(ROOT)}@{at}" for p, at, _ in TS_BLOCKS])
def test_typescript_example_runs_as_pasted(built: Path, tmp_path: Path, page: Path, at: int, code: str) -> None:
    """The example type-checks with the client's declarations (imported by its package name) and
    runs under Node against a server, with FORGE_URL and an agent key in FORGE_API_KEY."""
    pkg = tmp_path / "node_modules" / "@forge-memory"
    pkg.mkdir(parents=True)
    (pkg / "client").symlink_to(built)
    (tmp_path / "package.json").write_text('{"type": "module"}')
    (tmp_path / "snippet.ts").write_text(code)
    done = subprocess.run([str(built / "node_modules" / ".bin" / "tsc"), "--module", "nodenext", "--moduleResolution", "nodenext",
                           "--target", "es2022", "--strict", "--skipLibCheck", "--types", "node", "--typeRoots",
                           str(built / "node_modules" / "@types"), "snippet.ts"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{page.name}: the example does not type-check\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
    setup = make_setup(tmp_path, llm=ScriptedLLM())
    key = setup.keys.create(agent="scout", groups=["ops"])
    with running(setup.app) as url:
        env = {**os.environ, "FORGE_URL": url, "FORGE_API_KEY": key}
        done = subprocess.run([NODE, "snippet.js"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    setup.memory.close()
    assert done.returncode == 0, f"{page.name}: exit {done.returncode}\n--- code\n{code}--- stdout\n{done.stdout[-3000:]}--- stderr\n{done.stderr[-3000:]}"


def test_the_learning_docs_show_typescript() -> None:
    assert any(p.name == "typescript-client.md" for p in TS_PAGES), "docs/learning/typescript-client.md has no ```ts example"
