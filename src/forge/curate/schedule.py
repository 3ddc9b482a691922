"""Curation on a schedule: the memory service runs a pass every N seconds, off the request path.

    sched = CurationSchedule(memory, every_s=3600, policy=CurationPolicy(cap_per_kind={"episode": 10_000}))
    sched.start()        # a daemon thread; the first pass after every_s
    ...
    sched.stop()         # waits for a pass in progress to finish

A failed pass does not stop the schedule or the service: its one-line reason is kept in
``errors`` and written to the event log as a ``curate_failed`` event, and the next pass runs
on time. :meth:`run_once` is the pass itself, callable with an explicit ``now`` (tests, cron).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from forge.curate.lifecycle import CurationPolicy, Plan, curate
from forge.engine.port import MemoryPort
from forge.errors import ForgeError, ValidationError

__all__ = ["CurationSchedule"]


class CurationSchedule:
    """Runs :func:`forge.curate.curate` every ``every_s`` seconds on one background thread."""

    def __init__(
        self,
        memory: MemoryPort,
        *,
        every_s: float,
        policy: CurationPolicy | None = None,
        consolidate: Any = None,
        clock: Callable[[], float] = time.time,
        actor: str = "curate:schedule",
        keep_errors: int = 20,
    ) -> None:
        if isinstance(every_s, bool) or not isinstance(every_s, int | float) or not every_s > 0:
            raise ValidationError(f"a curation schedule needs every_s > 0 seconds, got {every_s!r}")
        self.memory = memory
        self.every_s = float(every_s)
        self.policy = policy or CurationPolicy()
        self.consolidate = consolidate
        self.clock = clock
        self.actor = actor
        self.keep_errors = keep_errors
        self.runs = 0
        self.last: Plan | None = None
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run_once(self, *, now: float | None = None) -> Plan | None:
        """One pass now; returns its plan, or None when it failed (the reason is in ``errors``)."""
        try:
            plan = curate(self.memory, policy=self.policy, consolidate=self.consolidate, now=self.clock() if now is None else now, actor=self.actor)
        except Exception as exc:  # noqa: BLE001 - a failed pass must not end the schedule
            what = str(exc) if isinstance(exc, ForgeError) else f"{type(exc).__name__}: {exc}"
            self.errors = [*self.errors, " ".join(what.split())[:300]][-self.keep_errors :]
            with contextlib.suppress(Exception):  # the store itself may be what failed
                self.memory.append_event("curate_failed", actor=self.actor, data={"error": self.errors[-1]})
            return None
        self.runs += 1
        self.last = plan
        return plan

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.run_once()

    def start(self) -> CurationSchedule:
        if self.running:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="forge-curate", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, timeout: float | None = None) -> None:
        """Stop the schedule; a pass in progress finishes first (within ``timeout``, if given)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> CurationSchedule:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
