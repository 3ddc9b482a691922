"""The service's learning door: outcomes at once, learning as durable jobs, sharing with peers.

- ``outcome`` credits the units a recall showed (cheap, on the request path);
- ``submit`` validates a trace and its outcome, stores the job in a queue and answers at
  once; a worker thread reflects (an LLM call takes seconds), stores what holds through the
  one learning function, and hands it to the agent's peers, whose exchanges judge it;
- ``job`` says how a job stands and, when done, what was learned and where it went.

The queue is huey (a small, well-kept task queue with an embedded SQLite backend and a Redis
one, so no broker is needed on one machine): ``SqliteHuey`` in a file beside the store by
default. A job's record (its payload and state) lives in huey's key-value store from the
moment it is acknowledged, so a server killed with ``kill -9`` loses none: at start, every
job not yet done is queued again, and the learning claims the job's id in the same
transaction as its writes, so a job that ran before the crash writes nothing twice.

Peers are the agents that share a group with the learner (the service's keys say who): the
learner's units travel to them as signed capsules through each peer's
:class:`~forge.share.exchange.Exchange` (signature, screen, dedup, corroboration,
conflicts), exactly as broadcast between processes does.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from forge.engine.port import MemoryPort
from forge.errors import ConfigError, ConflictError, ForgeError, NotFoundError
from forge.learn.online import credit, learn
from forge.learn.trace import Outcome, Trace
from forge.model import Unit, new_id
from forge.server.keys import KeyStore, Principal

__all__ = ["Learning", "Peer", "peers_from"]

log = logging.getLogger(__name__)

Peer = tuple[str, frozenset[str]]
"""An agent that may receive what another learns: its id and its groups."""

_PREFIX = "forge-job:"
_DOOR_SECRET = "learn/door-secret"


class Learning:
    """Outcomes, learning jobs and sharing for one :class:`~forge.server.service.Service`.

    ``queue`` is where jobs wait: a path for huey's SQLite backend (default: beside the
    store, or a temporary file for an in-memory store), or a ``redis://`` URL. ``peers``
    says which agents a principal's learning reaches (default: none). ``llm`` reflects
    (default: the service's; without one, rules come from the trace itself).
    """

    def __init__(
        self,
        service: Any,
        *,
        queue: str | os.PathLike[str] | None = None,
        peers: Callable[[Principal], Iterable[Peer]] | None = None,
        llm: Any = None,
    ) -> None:
        try:
            from huey import RedisHuey, SqliteHuey
        except ImportError as exc:  # pragma: no cover - huey is in the server extra
            raise ConfigError("the learning door needs huey: pip install 'forge-memory[server]'") from exc
        self.service = service
        self.memory = service.memory
        self.peers = peers or (lambda who: ())
        self.llm = llm
        where = str(queue) if queue is not None else _beside(self.memory)
        if where.startswith("redis://"):
            self.huey = RedisHuey("forge-learning", url=where, results=True)
        else:
            self.huey = SqliteHuey("forge-learning", filename=where, results=True, fsync=True)
        self._task = self.huey.task(name="forge.learn")(self._run)
        self._worker: threading.Thread | None = None
        self._stopping = threading.Event()
        self._exchanges: dict[str, Any] = {}
        self._lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Queue again every acknowledged job that is not done (a crash's), then run the
        worker thread."""
        waiting = {t.args[0] for t in self.huey.pending() if t.args}
        for key, record in self._records():
            if record.get("status") in ("queued", "running") and record["job_id"] not in waiting:
                self._task(record["job_id"])
                log.info("learning job %s queued again after a restart", key)
        self._stopping.clear()
        self._worker = threading.Thread(target=self._work, name="forge-learning", daemon=True)
        self._worker.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Let the job in hand finish (its writes are one transaction), then stop; queued
        jobs stay queued for the next start."""
        self._stopping.set()
        if self._worker is not None:
            self._worker.join(timeout)
            self._worker = None

    def _work(self) -> None:
        # huey's own consumer installs signal handlers, which would take uvicorn's: the
        # service runs huey's dequeue and execute on a thread of its own instead
        idle = 0.02
        while not self._stopping.is_set():
            task = self.huey.dequeue()
            if task is None:
                self._stopping.wait(idle)
                idle = min(idle * 2, 0.5)
                continue
            idle = 0.02
            self.huey.execute(task)

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until no job is queued or running (tests, a clean shutdown)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not any(r.get("status") in ("queued", "running") for _, r in self._records()):
                return
            time.sleep(0.05)
        raise TimeoutError("learning jobs still running")

    # -- the verbs ------------------------------------------------------------------------
    def outcome(self, who: Principal, recall_id: str, *, success: bool | None = None, score: float | None = None,
                feedback: str = "") -> dict[str, Any]:
        """Credit the units a recall showed ``who`` (once per recall id)."""
        Outcome(success=success, score=score, feedback=feedback)  # one-line errors before anything moves
        done = credit(self.memory, recall_id, agent=who.agent, success=success, score=score)
        return done.to_dict()

    def submit(self, who: Principal, trace: Mapping[str, Any], outcome: Mapping[str, Any] | None) -> dict[str, Any]:
        """Validate and queue a learning job; its id and where to ask how it stands."""
        t = Trace.from_dict(trace)
        o = Outcome.from_dict(outcome)
        for rid in t.recall_ids:  # a foreign or another agent's recall: refused now, not in the job
            ticket = self.memory.ticket(rid)
            if ticket.agent != who.agent:
                from forge.errors import AccessError

                raise AccessError("a recall_id in the trace belongs to another agent's recall")
        job_id = new_id()
        record = {"job_id": job_id, "agent": who.agent, "groups": sorted(who.groups), "status": "queued",
                  "trace": t.to_dict(), "outcome": o.to_dict(), "at": time.time(), "result": None, "error": ""}
        self.huey.put(_PREFIX + job_id, record)  # acknowledged only once it is stored
        self._task(job_id)
        return {"job_id": job_id, "status": "queued", "url": f"/v1/jobs/{job_id}"}

    def job(self, who: Principal, job_id: str) -> dict[str, Any]:
        record = self.huey.get(_PREFIX + str(job_id), peek=True)
        if record is None or (record["agent"] != who.agent and not who.admin):
            raise NotFoundError(f"no learning job {str(job_id)[:40]!r} for this key")
        return {k: record[k] for k in ("job_id", "status", "result", "error")}

    # -- the worker -----------------------------------------------------------------------
    def _run(self, job_id: str) -> None:
        key = _PREFIX + job_id
        record = self.huey.get(key, peek=True)
        if record is None or record["status"] == "done":
            return
        self.huey.put(key, {**record, "status": "running"})
        try:
            learned = learn(
                self.memory, Trace.from_dict(record["trace"]), Outcome.from_dict(record["outcome"]), agent=record["agent"],
                llm=self._llm(), share=lambda units: self._share(record["agent"], frozenset(record["groups"]), units),
                once=job_id,
            )
            result: dict[str, Any] | None = learned.to_dict()
            status, error = "done", ""
        except ConflictError:  # it ran before a crash: its writes are in memory
            result, status, error = None, "done", "ran before a restart; what it learned is in memory"
        except ForgeError as exc:  # the user's input or a backend: said in the job, not raised in a thread
            result, status, error = None, "failed", str(exc)
        except BaseException as exc:
            # FORGE's own bug: the job says so instead of hanging at "running", and the
            # exception goes on to huey, which logs its traceback
            self.huey.put(key, {**record, "status": "failed", "result": None, "error": f"internal error: {type(exc).__name__}"})
            raise
        self.huey.put(key, {**record, "status": status, "result": result, "error": error})

    def _llm(self) -> Any:
        """What reflects: this door's LLM, else the service's, else the memory's (``forge serve
        --llm`` sets the memory's); None reflects on the trace alone."""
        for llm in (self.llm, self.service.llm):
            if llm is not None:
                return llm
        return self.memory.get_llm() if self.memory.llm is not None else None

    def _share(self, agent: str, groups: frozenset[str], units: Sequence[Unit]) -> list[dict[str, Any]]:
        peers = [(a, g) for a, g in self.peers(Principal(agent=agent, groups=groups)) if a != agent]
        if not peers or not units:
            return []
        from forge.share.capsule import Capsule

        keyring = self._keyring()
        out = []
        for unit in units:
            for peer, peer_groups in peers:
                # addressed to the one peer and signed so: a copy lifted from another inbox is refused
                capsule = keyring.sign(Capsule.of(unit, sender=agent).addressed([peer]))
                ruling = self._exchange(peer, peer_groups).receive(capsule)
                out.append({"agent": peer, "unit": unit.id, "outcome": ruling.outcome, "reason": ruling.reason, "copy": ruling.unit_id})
        return out

    def _keyring(self) -> Any:
        from forge.share.capsule import Keyring

        secret = self.memory.settings().get(_DOOR_SECRET)
        if secret is None:
            self.memory.set_setting(_DOOR_SECRET, os.urandom(32).hex())
            secret = self.memory.settings()[_DOOR_SECRET]
        return Keyring.from_secret(bytes.fromhex(secret))

    def _exchange(self, agent: str, groups: frozenset[str]) -> Any:
        from forge.share.exchange import Exchange

        with self._lock:
            ex = self._exchanges.get(agent)
            if ex is None:
                ex = self._exchanges[agent] = Exchange(self.memory, agent, self._keyring(), groups=groups)
            return ex

    def _records(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for key, value in self.huey.storage.result_items().items():
            if isinstance(key, str) and key.startswith(_PREFIX):
                out.append((key, self.huey.serializer.deserialize(value)))
        return out


def peers_from(keys: KeyStore | None) -> Callable[[Principal], list[Peer]] | None:
    """Who an agent's learning reaches: the agents holding a live key in one of its groups
    (none without keys)."""
    if keys is None:
        return None

    def peers(who: Principal) -> list[Peer]:
        out: dict[str, set[str]] = {}
        for k in keys.list(include_revoked=False):
            if not k.admin and k.agent != who.agent and set(k.groups) & set(who.groups):
                out.setdefault(k.agent, set()).update(k.groups)
        return [(a, frozenset(g)) for a, g in sorted(out.items())]

    return peers


def _beside(memory: MemoryPort) -> str:
    """The queue's file: beside a SQLite store's file, else a temporary one."""
    path = memory.info.get("path")
    if path and str(path) != ":memory:":
        return str(Path(str(path)).with_name(Path(str(path)).name + ".jobs"))
    import tempfile

    fd, name = tempfile.mkstemp(prefix="forge-jobs-", suffix=".db")
    os.close(fd)
    return name
