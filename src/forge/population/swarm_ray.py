"""``forge swarm --executor ray``: each agent a Ray actor running :func:`forge.population.member.run_agent`.

The actors run the very loop the process children run; only how they are started, watched
and stopped differs, behind the same four calls (start, poll, reason, stop) as the
process executor, so the parent's board, ``swarm.json`` and exit codes do not change.

The master secret reaches an actor as a constructor argument, with the driver's ``PG*``,
``OPENAI_*`` and ``FORGE_*`` variables (a database password, an API key), so a cluster
node needs none of them set: a ``runtime_env``'s ``env_vars`` are recorded with the job and
shown by Ray's dashboard and state API, and a command line by ``ps``; an actor's
arguments are shown by neither. An actor thread gets no signal, so a stop is an event the
agent checks between episodes; an actor still running after the grace period is killed.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from forge.errors import BackendError, ForgeError, UserError
from forge.population.ray_support import start_ray

__all__ = ["RayActors"]

_FORWARDED = ("PG", "OPENAI_", "FORGE_")  # prefixes of the driver's variables an actor gets
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class _AgentActor:
    """One agent in a Ray worker process; ``run`` and ``stop`` run on two threads."""

    def __init__(self, secret: str, env: Mapping[str, str]) -> None:
        os.environ.update(env)
        self._secret = secret
        self._stop = threading.Event()

    def run(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        from forge.population.member import run_agent

        if not spec.get("db"):  # on another node of a cluster the run directory is not there yet
            Path(spec["dir"]).mkdir(parents=True, exist_ok=True)
        return run_agent(spec, secret=self._secret, stop=self._stop)

    def stop(self) -> None:
        self._stop.set()


def _actor_env(secret_env: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED) and k != secret_env}
    env.update(dict.fromkeys(_ONE_THREAD, "1"))  # one actor per agent: each keeps to one thread
    env.setdefault("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))
    return env


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class RayActors:
    """The agents of one run as Ray actors (one CPU each) on a local Ray or a cluster.

    Exit codes mirror the process children's: 0 finished or stopped, 2 a user error, 1 any
    other error, -9 the actor died or was killed.
    """

    def __init__(self, executor: str, secret: str, *, agents: int, secret_env: str) -> None:
        try:
            self.ray, self._owned = start_ray(executor, agents)
        except ForgeError:
            raise
        except Exception as exc:
            raise BackendError(f"could not start or join Ray ({executor}): {_first_line(exc)}") from None
        self._cls = self.ray.remote(num_cpus=1, max_concurrency=2, max_restarts=0)(_AgentActor)
        self._secret, self._env = secret, _actor_env(secret_env)
        self._actors: dict[str, Any] = {}
        self._runs: dict[str, Any] = {}
        self._codes: dict[str, int | None] = {}
        self._errors: dict[str, str] = {}

    def start(self, aid: str, spec: Mapping[str, Any]) -> None:
        self._actors[aid] = actor = self._cls.remote(self._secret, self._env)
        self._runs[aid] = actor.run.remote(dict(spec))
        self._codes[aid] = None

    def _settle(self, refs: Mapping[Any, str], timeout: float) -> None:
        if not refs:
            return
        ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        for ref in ready:
            aid = refs[ref]
            try:
                self.ray.get(ref)
                self._codes[aid] = 0
            except self.ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None) or exc
                self._codes[aid] = 2 if isinstance(cause, UserError) else 1
                self._errors[aid] = f"{type(cause).__name__}: {_first_line(cause)}"
            except self.ray.exceptions.RayActorError as exc:  # its worker process died
                self._codes[aid] = -9
                self._errors[aid] = f"its actor died ({_first_line(exc)})"

    def _pending(self) -> dict[Any, str]:
        return {self._runs[a]: a for a, c in self._codes.items() if c is None}

    def poll(self) -> dict[str, int | None]:
        self._settle(self._pending(), timeout=0)
        return dict(self._codes)

    def reason(self, aid: str, code: int) -> str:
        return f"{aid} failed: {self._errors.get(aid, f'exit code {code}')}"

    def codes(self) -> dict[str, int | None]:
        return dict(self._codes)

    def stop(self, *, grace_s: float = 10.0) -> None:
        """Ask every running agent to stop, wait up to ``grace_s`` for its cleanup, then kill
        every actor (and shut down a Ray this run started)."""
        pending = self._pending()
        for aid in pending.values():
            with contextlib.suppress(Exception):
                self._actors[aid].stop.remote()
        with contextlib.suppress(Exception):
            self._settle(pending, timeout=grace_s)
        for aid, actor in self._actors.items():
            if self._codes[aid] is None:
                self._codes[aid] = -9
            with contextlib.suppress(Exception):
                self.ray.kill(actor)
        if self._owned:
            self.ray.shutdown()
            self._owned = False
