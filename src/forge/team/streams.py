"""Task streams for lifelong teams, and their objective scores.

A stream is a fixed, seeded list of :class:`TeamTask` so a run (and its resume) replays the
same tasks in the same order:

- ``gym``: gymnasium toy-text tasks of rising difficulty. The stream is cut into equal blocks,
  one per rung of :data:`GYM_LADDER` (frozenlake-4x4 -> slippery -> cliffwalking -> taxi ->
  frozenlake-8x8 -> slippery), so early tasks are easy and every rung repeats, which is what
  gives memory something to reuse. ``envs=`` replaces the ladder (tests use frozenlake only).
- ``db``: PostgreSQL root-cause diagnosis (:mod:`forge.envs.postgres`), the anomalies balanced
  in blocks of five and difficulty rising over the stream; it needs psycopg and a server.
- ``textworld``: distinct generated TextWorld games (coin collector and treasure hunter, levels
  1 and 2, in rising blocks), every one from the held-out seeds no learning run trains on: a
  stream of new tasks, as LLMA-Mem measures, where only what generalises can help.
- ``frozenlake``: random FrozenLake maps (4x4, then 5x5), each a held-out map never trained on.

Scores, both in [0, 1]:

- **TS** (:func:`task_score`): the episode's return mapped linearly from the env's
  ``major_failure_return`` (0) to its ``success_return`` (1), clipped. For the database stream
  that is accuracy-like: a right answer scores 1, a wrong one 0, running out of steps ~0.56.
- **CS** (:func:`coordination_score`): the share of subtasks the planner allocated that were
  finished by the allocated agent with no protocol violation. A violation is a step whose
  reward is below the env's ``tau`` (a real mistake: a hole, the cliff, an illegal pickup, a
  wrong diagnosis) or an action the agent could not produce (the constrained choice failed and
  a default was played); the rest of a violated subtask is reallocated to another agent. So
  CS measures how well work was divided and handed over, TS how well the task went.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from forge.envs import Env, EnvSpec, available_envs, make_env
from forge.errors import ConfigError, ValidationError

__all__ = [
    "DB_ENV",
    "FROZENLAKE_LADDER",
    "GYM_LADDER",
    "STREAMS",
    "TEXTWORLD_LADDER",
    "TeamTask",
    "coordination_score",
    "db_stream",
    "gym_stream",
    "held_out_stream",
    "make_stream",
    "open_task_env",
    "task_score",
]

STREAMS = ("gym", "db", "textworld", "frozenlake")
TEXTWORLD_LADDER: tuple[str, ...] = ("textworld:coin-1", "textworld:treasure-1", "textworld:coin-2", "textworld:treasure-2")
FROZENLAKE_LADDER: tuple[str, ...] = ("frozenlake-random-4x4", "frozenlake-random-5x5")
DB_ENV = "postgres-diagnosis"
GYM_LADDER: tuple[str, ...] = (
    "frozenlake-4x4",
    "frozenlake-4x4-slippery",
    "cliffwalking",
    "taxi",
    "frozenlake-8x8",
    "frozenlake-8x8-slippery",
)


@dataclass(frozen=True, slots=True)
class TeamTask:
    """One task of a stream: which env, which seed, what type (for transactive memory)."""

    index: int  # 1-based position in the stream
    env: str
    seed: int
    task_type: str
    difficulty: int = 0

    @property
    def text(self) -> str:
        """The task as agents and retrieval see it: never the hidden answer, and never the seed,
        which names this one instance and nothing a later task shares."""
        return f"{self.task_type} task (level {self.difficulty}) in {self.env}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TeamTask:
        return cls(**data)


def gym_stream(n: int, *, seed: int, envs: Sequence[str] | None = None) -> list[TeamTask]:
    """``n`` tasks climbing ``envs`` (default :data:`GYM_LADDER`) in equal blocks, seeded."""
    ladder = tuple(envs or GYM_LADDER)
    if n < 0:
        raise ValidationError(f"a stream needs n >= 0 tasks, got {n}")
    known = set(available_envs())
    for name in ladder:
        if name not in known or name.startswith("cyborg"):
            raise ConfigError(f"unknown gym stream env {name!r}; use some of: {', '.join(GYM_LADDER)}")
    rng = random.Random(f"forge-team-gym:{seed}")
    out = []
    for i in range(n):
        rung = min(len(ladder) - 1, i * len(ladder) // max(n, 1))
        out.append(TeamTask(i + 1, ladder[rung], rng.randrange(2**31), ladder[rung], rung))
    return out


def db_stream(n: int, *, seed: int) -> list[TeamTask]:
    """``n`` diagnosis tasks from :func:`forge.envs.postgres.diagnosis_stream` (no server needed
    to list them; playing them needs one)."""
    try:
        from forge.envs.postgres import diagnosis_stream
    except ImportError as exc:  # pragma: no cover - the module ships with forge
        raise ConfigError(f"the database stream is unavailable: {exc}") from None
    return [TeamTask(t.index + 1, DB_ENV, t.seed, "db-diagnosis", t.difficulty) for t in diagnosis_stream(n, seed=seed)]


def held_out_stream(n: int, *, seed: int, ladder: Sequence[str]) -> list[TeamTask]:
    """``n`` distinct held-out tasks climbing ``ladder`` in equal blocks: each task's seed is
    one of its env's held-out seeds (:func:`forge.envs.seed_split`), none used twice, taken in
    an order the stream's ``seed`` shuffles."""
    from forge.envs import seed_split

    if n < 0:
        raise ValidationError(f"a stream needs n >= 0 tasks, got {n}")
    rng = random.Random(f"forge-team-held-out:{seed}")
    pools: dict[str, list[int]] = {}
    out = []
    for i in range(n):
        rung = min(len(ladder) - 1, i * len(ladder) // max(n, 1))
        env = ladder[rung]
        if env not in pools:
            pool = list(seed_split(env, train=1, held_out=max(n, 10))[1])
            rng.shuffle(pool)
            pools[env] = pool
        out.append(TeamTask(i + 1, env, pools[env].pop(), env.split(":", 1)[-1].rsplit("-", 1)[0], rung))
    return out


def make_stream(name: str, n: int, *, seed: int, envs: Sequence[str] | None = None) -> list[TeamTask]:
    """The stream called ``name`` (one of :data:`STREAMS`); ``envs`` replaces a ladder."""
    if name == "gym":
        return gym_stream(n, seed=seed, envs=envs)
    if name == "db":
        return db_stream(n, seed=seed)
    if name == "textworld":
        return held_out_stream(n, seed=seed, ladder=tuple(envs or TEXTWORLD_LADDER))
    if name == "frozenlake":
        return held_out_stream(n, seed=seed, ladder=tuple(envs or FROZENLAKE_LADDER))
    raise ConfigError(f"unknown task stream {name!r}; use one of: {', '.join(STREAMS)}")


def open_task_env(name: str, *, max_steps: int | None = None, dsn: str | None = None) -> Env:
    """Build the env a task names; the database env checks its server here (one-line error)."""
    if name == DB_ENV:
        from forge.envs.postgres import PostgresDiagnosisEnv

        kwargs: dict[str, Any] = {"dsn": dsn}
        if max_steps is not None:
            kwargs["max_steps"] = max(2, max_steps)
        return PostgresDiagnosisEnv(**kwargs)
    return make_env(name, **({"max_steps": max_steps} if max_steps is not None else {}))


def task_score(total_return: float, spec: EnvSpec) -> float:
    """TS: the return mapped from major failure (0) to success (1), clipped to [0, 1]."""
    lo, hi = spec.major_failure_return, spec.success_return
    if hi <= lo:
        return 1.0 if total_return >= hi else 0.0
    return max(0.0, min(1.0, (total_return - lo) / (hi - lo)))


def coordination_score(subtasks: Sequence[dict[str, Any]]) -> float:
    """CS: the share of allocated subtasks completed by their agent without a violation or a
    reallocation (1.0 when the task needed no subtask, e.g. it ended before any step)."""
    if not subtasks:
        return 1.0
    return sum(1 for s in subtasks if s.get("ok")) / len(subtasks)
