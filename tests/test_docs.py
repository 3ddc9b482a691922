"""The docs are tested like code: the site builds strictly, and every example runs as pasted.

- ``mkdocs build --strict`` succeeds with no warning, and the built pages fetch nothing from
  the network (no web fonts, no CDN scripts).
- Every ```python block in README.md and docs/**/*.md runs in a fresh directory, with
  ``HF_HUB_OFFLINE=1``, real LLMs forbidden and the hashing embedder in place of the local
  model (so ``Memory.open("team.db")`` works as pasted, in milliseconds).
- Every ```bash / ```console / ```shell block that runs ``forge`` runs under
  ``bash -euo pipefail`` against a fresh directory (so a fresh ``forge.db``), with
  ``forge`` meaning ``forge --embedder hash``. The two set-up commands are not run here
  (.ci/run runs the second one).
- An HTML comment right before a block says what it needs:
  ``<!-- docs-test: skip (why) -->`` (a model, a long run, a server of its own),
  ``<!-- docs-test: server -->`` (a ``forge serve`` this test starts: ``FORGE_URL`` and an
  agent key for scout in group ops in ``FORGE_API_KEY``), ``<!-- docs-test: redis -->`` (runs
  when Redis answers on 127.0.0.1:6379).
- Every ``forge.x.y`` named in inline code resolves to a module or attribute, so a move of a
  module cannot leave the docs pointing at the old path.
- The architecture page's picture is drawn at build time from tests/test_architecture.py's
  import graph (docs/_hooks/architecture.py), and shows every package.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from test_architecture import LAYERS

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: README's two set-up commands: shown, not run here (the second is .ci/run's own line).
SETUP = (
    "python3 -m venv .venv && CMAKE_ARGS=-DLLAVA_BUILD=OFF .venv/bin/pip install -e '.[local,gym,report]' && .venv/bin/forge evolve --quick-demo",
    "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/pytest",
)
SHELLS = {"bash", "sh", "shell", "console"}
MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<what>skip|server|redis)\b\s*(?P<why>.*?)\s*-->")
FORGE_COMMAND = re.compile(r"(?:^|[\s;&|(`]|\$\()(?:\.venv/bin/)?forge(?:\s|$)", re.M)
BLOCK_TIMEOUT = 120


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    marker: str  # "", "skip", "server" or "redis"
    why: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, with the docs-test marker just before each."""
    out: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)(`{3,})\s*([\w+-]*)", lines[i])
        if not fence:
            i += 1
            continue
        indent, ticks, lang = fence.groups()
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(ticks):
            body.append(lines[i])
            i += 1
        i += 1
        before = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        m = MARKER.search(before)
        if "docs-test" in before and not m:
            raise AssertionError(f"{page.name}:{start + 1}: unknown docs-test marker {before.strip()!r}")
        code = textwrap.dedent("\n".join(body)) + "\n"
        out.append(Block(page, start + 1, lang.lower(), code, m["what"] if m else "", m["why"] if m else ""))
    return out


ALL = [b for page in PAGES for b in blocks(page)]
PYTHON = [b for b in ALL if b.lang in ("python", "py")]
SHELL = [
    b for b in ALL
    if b.lang in SHELLS and b.code.strip() not in SETUP and (FORGE_COMMAND.search(b.code) or b.marker in ("server", "redis"))
]


# -- running examples ---------------------------------------------------------------------

#: Runs a Python snippet as a user would, with the local embedder swapped for hashing (so no
#: model loads) and real LLMs forbidden (a snippet that needs one must be marked skip).
PRELUDE = """\
import runpy, sys
import forge.engine.embed as embed
embed._open_local = lambda arg, **kw: embed.HashingEmbedder(384)
from forge.llm import forbid_real_llms
forbid_real_llms().__enter__()
sys.argv = ["snippet.py"]
runpy.run_path("snippet.py", run_name="__main__")
"""

#: ``forge`` on the PATH of shell examples: the real CLI, with the hashing embedder.
SHIM = """\
#!/bin/sh
exec "{python}" -c 'import sys; from forge.cli import main; main(["--embedder", "hash", *sys.argv[1:]])' "$@"
"""


def _env(tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    shims = tmp / ".shims"
    shims.mkdir(exist_ok=True)
    shim = shims / "forge"
    shim.write_text(SHIM.format(python=sys.executable))
    shim.chmod(0o755)
    venv_bin = tmp / ".venv" / "bin"  # a block may say .venv/bin/forge, as README does
    venv_bin.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        (venv_bin / "forge").symlink_to(shim)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PATH=f"{shims}{os.pathsep}{env.get('PATH', '')}")
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update(extra or {})
    return env


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], block: Block) -> None:
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.id}: still running after {BLOCK_TIMEOUT} s (mark it <!-- docs-test: skip (why) -->?)")
    if done.returncode != 0:
        pytest.fail(f"{block.id}: exit {done.returncode}\n--- code\n{block.code}--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")


@contextlib.contextmanager
def _needs(block: Block, tmp: Path) -> Iterator[dict[str, str]]:
    """What the block's marker asks for, as environment variables for it."""
    if block.marker == "skip":
        pytest.skip(f"{block.id}: {block.why or 'marked skip'}")
    if block.marker == "redis":
        pytest.importorskip("redis")
        try:
            socket.create_connection(("127.0.0.1", 6379), timeout=1).close()
        except OSError:
            pytest.skip(f"{block.id}: needs Redis on 127.0.0.1:6379")
        yield {}
        return
    if block.marker != "server":
        yield {}
        return
    pytest.importorskip("fastapi")
    from forge.engine.embed import HashingEmbedder
    from forge.engine.memory import Memory
    from forge.server.app import create_app
    from forge.server.keys import KeyStore
    from forge.server.testing import running
    from forge.store import SQLiteStore

    (tmp / "server").mkdir()
    mem = Memory(SQLiteStore(tmp / "server" / "team.db"), HashingEmbedder(64))
    try:
        keys = KeyStore(tmp / "server" / "team.db.keys.json")
        key = keys.create(agent="scout", groups=["ops"])
        with running(create_app(mem, keys=keys)) as url:
            yield {"FORGE_URL": url, "FORGE_API_KEY": key}
    finally:
        mem.close()


@pytest.mark.slow
@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_example_runs_as_pasted(block: Block, tmp_path: Path) -> None:
    with _needs(block, tmp_path) as extra:
        work = tmp_path / "work"
        work.mkdir()
        (work / "snippet.py").write_text(block.code)
        _run([sys.executable, "-c", PRELUDE], cwd=work, env=_env(tmp_path, extra), block=block)


@pytest.mark.slow
@pytest.mark.parametrize("block", SHELL, ids=[b.id for b in SHELL])
def test_shell_example_runs_as_pasted(block: Block, tmp_path: Path) -> None:
    if block.marker == "server" and "curl" in block.code and not any(
        (Path(p) / "curl").exists() for p in os.environ.get("PATH", "").split(os.pathsep)
    ):
        pytest.skip("curl is not installed")
    with _needs(block, tmp_path) as extra:
        code = block.code
        if block.lang == "console":  # only the prompted lines are commands
            code = "\n".join(ln[2:] for ln in code.splitlines() if ln.startswith("$ ")) + "\n"
        work = tmp_path / "work"
        work.mkdir()
        _run(["bash", "-euo", "pipefail", "-c", code], cwd=work, env=_env(tmp_path, extra), block=block)


def test_json_examples_parse() -> None:
    for block in (b for b in ALL if b.lang == "json"):
        try:
            json.loads(block.code)
        except ValueError as exc:
            pytest.fail(f"{block.id}: {exc}")


def test_every_example_is_collected() -> None:
    """The collector sees what a reader sees: the quick starts, the CLI, the service."""
    ids = {b.id.split(":")[0] for b in PYTHON + SHELL}
    assert {"README.md", "docs/engine/index.md", "docs/service/client.md", "docs/curation.md"} <= ids
    assert len(PYTHON) >= 10 and len(SHELL) >= 8


# -- the site -----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_site_builds_strictly_and_offline(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "WARNING" not in log, log
    fetches = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.I)
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert not fetches.search(text), f"{page.relative_to(site)} loads something from the network"
        assert "fonts.googleapis" not in text and "mermaid" not in text.lower()
    for page in PAGES[1:]:
        built = site / page.relative_to(ROOT / "docs").with_suffix("")
        assert (built / "index.html").exists() or page.name == "index.md", page
    svg = (site / "img" / "architecture.svg").read_text()
    for package in set().union(*LAYERS) - {"__init__"}:
        assert f">{package}</text>" in svg, f"the architecture picture lacks {package}"
    assert "architecture.svg" in (site / "architecture" / "index.html").read_text()
    assert not (site / "_hooks").exists()


# -- README as a front page ---------------------------------------------------------------


def test_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    first = [b.code.strip() for b in blocks(ROOT / "README.md")[:2]]
    assert first == list(SETUP), "README's first two blocks are the set-up commands, as they were"
    assert SETUP[1] in (ROOT / ".ci" / "run").read_text(), ".ci/run runs README's second command verbatim"
    for target in re.findall(r"\]\((?!https?://|#)([^)#\s]+)", readme):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


# -- names in the docs --------------------------------------------------------------------

TOP = {p.stem for p in (ROOT / "src" / "forge").iterdir() if (p.suffix == ".py" or p.is_dir()) and not p.name.startswith("_")}
TOP |= set(importlib.import_module("forge").__all__)  # forge.Memory, forge.Recalled, ...
DOTTED = re.compile(r"(?<![\w./-])forge(?:\.[A-Za-z_]\w*)+")
#: ``Class.attr`` named in inline code: the class each short name means.
CLASSES = {
    "Memory": "forge.engine.memory.Memory", "Agent": "forge.population.agent.Agent",
    "Keyring": "forge.share.capsule.Keyring", "Exchange": "forge.share.exchange.Exchange",
    "Consensus": "forge.share.consensus.Consensus", "Store": "forge.store.base.Store",
    "Weights": "forge.engine.recall.Weights", "Filter": "forge.store.base.Filter",
    "Client": "forge.client.Client", "EnvSpec": "forge.envs.base.EnvSpec",
}


def _resolve(name: str) -> bool:
    """Whether ``name`` is a module or attribute; True too where it needs an extra not installed."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name and not exc.name.startswith("forge"):
                return True  # e.g. forge.server.app without fastapi: cannot tell here
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _inline_code() -> Iterator[tuple[Path, str]]:
    for page in PAGES:
        text = re.sub(r"^(\s*)(`{3,}).*?^\s*\2", "", page.read_text(), flags=re.M | re.S)
        for span in re.findall(r"`([^`\n]+)`", text):
            yield page, span


def test_every_forge_path_in_the_docs_exists() -> None:
    missing, checked = [], 0
    for page, span in _inline_code():
        names = [n for n in DOTTED.findall(span) if n.split(".")[1] in TOP]
        names += [f"{CLASSES[c]}.{a}" for c, a in re.findall(r"(?<![\w.])([A-Z]\w+)\.([a-z_]\w*)", span) if c in CLASSES]
        missing += [f"{page.relative_to(ROOT)}: {name}" for name in names if not _resolve(name)]
        checked += len(names)
    assert missing == []
    assert checked > 100  # the pattern still finds the names
