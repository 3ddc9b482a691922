"""Long CLI work shows a rich progress bar on a terminal: forge import (1,500 units ran 19.5 s
silently), export, curate and seed packs. Off a terminal, work that lasts prints lines instead
(tests/test_progress_lines.py) and short work prints nothing."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).parents[1] / "src")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _on_a_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``forge ARGS`` with standard error on a pseudo-terminal; its exit code and what it showed there."""
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "forge.cli", *args], stdout=subprocess.DEVNULL, stderr=follower, cwd=cwd, env=env)
    os.close(follower)
    shown = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            proc.kill()
            raise AssertionError("forge did not finish")
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower closed: the process is done
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return proc.wait(timeout=60), ANSI.sub("", shown.decode("utf-8", "replace"))


def _plain(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forge.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": SRC}, timeout=300)


@pytest.mark.slow
def test_import_export_curate_and_seed_show_progress_on_a_terminal_only(tmp_path: Path) -> None:
    lines = [json.dumps({"record": "unit", "id": f"u{i}", "content": f"warehouse item {i} sits on shelf {i % 40}"}) for i in range(600)]
    (tmp_path / "units.jsonl").write_text("\n".join(lines) + "\n")
    db = ["--db", str(tmp_path / "m.db"), "--embedder", "hash"]

    code, shown = _on_a_terminal([*db, "import", "units.jsonl"], tmp_path)
    assert code == 0, shown
    assert "embedding units" in shown and re.search(r"\b\d+/600\b", shown) and "writing 600 records" in shown, shown[-500:]

    code, shown = _on_a_terminal([*db, "export", "dump.jsonl"], tmp_path)
    assert code == 0 and "exporting units" in shown and re.search(r"\b\d+/600\b", shown), shown[-500:]
    assert sum(1 for line in (tmp_path / "dump.jsonl").read_text().splitlines() if '"unit"' in line) == 600

    (tmp_path / "pack.jsonl").write_text("\n".join(json.dumps({"content": f"When tile {i} is a hole, then step around it.", "kind": "rule"})
                                                   for i in range(100)) + "\n")
    code, shown = _on_a_terminal([*db, "curate", "seed", "pack.jsonl"], tmp_path)
    assert code == 0 and "embedding seeds" in shown and re.search(r"\b\d+/100\b", shown), shown[-500:]

    code, shown = _on_a_terminal([*db, "curate", "--dry-run"], tmp_path)
    assert code == 0 and "curation pass" in shown, shown[-500:]

    # Not a terminal and short work: the output is the data and the report, with no progress in it.
    done = _plain([*db, "export", "-"], tmp_path)
    assert done.returncode == 0 and "exporting" not in done.stderr and done.stderr == ""
    assert all(json.loads(line) for line in done.stdout.splitlines())
    done = _plain(["--db", str(tmp_path / "m2.db"), "--embedder", "hash", "import", "units.jsonl"], tmp_path)
    assert done.returncode == 0 and done.stderr == "" and done.stdout.strip() == "imported 600 records"
