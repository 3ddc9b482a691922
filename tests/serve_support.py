"""A real ``forge serve`` process for the service's fault and leak suites.

It runs in its own session (process group), so one ``killpg`` reaches the supervisor and
every worker; it is ready once each worker has answered ``/v1/health`` on a new connection.
Waiting is on conditions (a process answering, a process gone), with generous deadlines
for a loaded machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

SRC = str(Path(__file__).resolve().parent.parent / "src")
START_TIMEOUT = 240.0  # worker processes importing FastAPI and the MCP SDK on a loaded machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class Server:
    """``forge --db DB serve --workers N ...`` as a subprocess; ``url`` once started."""

    def __init__(self, db: str, keys: Path, log: Path, *, workers: int = 2, extra: tuple[str, ...] = ()) -> None:
        self.db, self.keys, self.log, self.workers, self.extra = db, keys, log, workers, extra
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.pids: set[int] = set()
        self.starts = 0

    def start(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [SRC, os.environ.get("PYTHONPATH", "")] if p)}
        with open(self.log, "a") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "forge.cli", "--db", self.db, "--embedder", "hash:64", "serve", "--port", str(port),
                 "--workers", str(self.workers), "--keys", str(self.keys), "--rate", "1000000", *self.extra],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        self.starts += 1
        self.pids = set()
        deadline = time.monotonic() + START_TIMEOUT
        while len(self.pids) < self.workers:  # until every worker has answered, each on a new connection
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"forge serve did not start (answered: {self.pids}): {self.log.read_text()[-3000:]}")
            try:
                r = httpx.get(f"{self.url}/v1/health", headers={"Connection": "close"}, timeout=30)
                self.pids.add(r.json()["pid"])
            except (httpx.HTTPError, ValueError, KeyError):
                time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the whole process group, then wait until none of it runs."""
        if self.proc is None:
            return
        pids = {*self.pids, self.proc.pid}
        if self.proc.poll() is None or any(alive(p) for p in self.pids):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        deadline = time.monotonic() + 60
        while any(alive(p) for p in pids):
            assert time.monotonic() < deadline, f"processes {pids} outlived SIGKILL"
            time.sleep(0.05)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM, as an operator stops it: a graceful shutdown (SIGKILL if it hangs)."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        finally:
            self.kill()  # whatever is left of the group
