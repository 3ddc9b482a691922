"""The lifelong team runner: a planner allocates, role agents act, memory learns, runs resume.

    from forge.team.runner import TeamConfig, run_team, resume_team
    result = run_team(TeamConfig(stream="gym", tasks=20, team_size=3, memory="hybrid"), "runs/team")
    result.final["aip"], result.final["ap"]
    resume_team("runs/team")            # after a kill: continues where it stopped

**The team.** ``team_size`` agents ``agent-1..agent-k`` with the roles of :data:`ROLES`;
``agent-1`` (the lead) is also the planner. Each task is one episode of the one agent loop
(:func:`forge.learn.loop.play_episode`) with the team as its policy
(:class:`~forge.team.policy.TeamPolicy`). A task is played in subtasks of
``steps_per_subtask`` env steps. Before each one the planner picks the agent to do it by
constrained choice among the agent ids (:func:`~forge.llm.choose`, so a small model cannot
answer outside the team), reading the transactive "who knows what" block. The chosen agent
acts with one constrained choice among the env's valid actions per step. A violation (a step
below the env's ``tau`` or an action the model could not produce) ends the subtask and the
next is reallocated to someone else. A team of one plans without an LLM call.

**Memory in prompts.** Every memory block is written by :func:`forge.learn.prompt.recollect`
(:meth:`~forge.team.TeamMemory.recollect`), as the reading agent's viewer: procedures first,
then the rules reflection wrote, then past tasks, within ``memory_tokens``; the block is kept
for the agent's whole task (a stable prompt prefix), and the rules naming the current
situation are repeated next to the question at each step. The units shown are recorded per
agent and step, and credited with the task's outcome (:meth:`forge.engine.memory.Memory.record_use`).
A failed task is reflected on by :func:`forge.learn.loop.reflect_on` (the library's reflection,
grounded by replaying the seeded episode); its rules become units of the episodic pools.

**Memory modes, one code path** (:data:`MEMORY_MODES`): ``none`` (nothing read or written),
``raw`` (the newest raw task transcripts, whole, within the token budget), and the
LLMA-Mem layouts ``local``, ``shared``, ``hybrid`` (:class:`~forge.team.TeamMemory`,
consolidation every ``consolidate_every`` tasks).

**Determinism and resume.** Each task's result (actions, scores, tokens, the reflection) is
written to ``RUN/tasks/task-NNNN.json`` *before* memory is updated from it, so the file is
the commit point. Then the memory store is copied to ``RUN/memory.task-NNNN.bak``, the task is
recorded in memory, consolidation runs if due (synchronously, at this task boundary, its
report written to ``RUN/consolidations/after-NNNN.json``), and the copy is deleted. A run
killed anywhere in between resumes from the copy and replays the task from its file (no LLM
call for the task itself), so half-written memory never survives, and what a task sees never
depends on how fast consolidation ran: with a deterministic LLM a resumed run equals an
uninterrupted one.

    RUN/config.json  events.jsonl  memory.db  tasks/task-NNNN.json
    RUN/consolidations/after-NNNN.json  final.json  (memory.task-NNNN.bak while recording)
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from forge.engine.memory import Memory
from forge.engine.recall import approx_tokens
from forge.envs import Env, EnvSpec, StepResult
from forge.envs.situation import situation_of
from forge.errors import ConfigError, ForgeError, NotFoundError, StoreError
from forge.learn.loop import Trajectory, failure_point, play_episode, reflect_on
from forge.learn.prompt import Recollection
from forge.learn.reflect import deleted_rules
from forge.llm import LLM, MeteredLLM, TokenLedger, open_llm
from forge.model import Kind, Viewer
from forge.protocols.runs import RunDir
from forge.store import Filter
from forge.team.consolidate import Consolidator
from forge.team.memories import (
    ACTOR_ROLE,
    TEAM_SECTIONS,
    Action,
    Outcome,
    TaskLesson,
    TeamMemory,
    task_lesson,
)
from forge.team.policy import TeamPolicy
from forge.team.streams import (
    DB_ENV,
    STREAMS,
    TeamTask,
    coordination_score,
    make_stream,
    open_task_env,
    task_score,
)

__all__ = [
    "MEMORY_MODES",
    "ROLES",
    "Hook",
    "TeamConfig",
    "TeamResult",
    "resume_team",
    "team_config",
    "run_team",
    "load_results",
    "sweep",
]

MEMORY_MODES = ("none", "raw", "local", "shared", "hybrid")
ROLES = ("lead", "navigator", "scout", "verifier", "executor", "critic", "analyst")
MAX_TEAM = len(ROLES)

#: Called as ``hook(event, data)`` at task and step boundaries; tests interrupt runs from it.
Hook = Callable[[str, Mapping[str, Any]], None]


@dataclass(frozen=True, slots=True)
class TeamConfig:
    """Everything that defines a team run; written once to ``config.json``."""

    stream: str = "gym"
    tasks: int = 20
    team_size: int = 3
    memory: str = "hybrid"
    consolidate_every: int = 5
    llm: str = "local"
    embedder: str = "hash"
    seed: int = 0
    memory_tokens: int = 300
    steps_per_subtask: int = 4
    max_steps: int | None = None
    envs: tuple[str, ...] = ()  # gym ladder override; empty = GYM_LADDER
    reflect: bool = True  # LLM-written lessons and procedures (False: deterministic fallbacks)
    rule_guard: bool = False  # rules are binding: the actor chooses only among what they leave
    team: str = "team"

    def __post_init__(self) -> None:
        if self.stream not in STREAMS:
            raise ConfigError(f"unknown task stream {self.stream!r}; use one of: {', '.join(STREAMS)}")
        if self.memory not in MEMORY_MODES:
            raise ConfigError(f"unknown memory mode {self.memory!r}; use one of: {', '.join(MEMORY_MODES)}")
        if not 1 <= self.team_size <= MAX_TEAM:
            raise ConfigError(f"team size must be 1 to {MAX_TEAM}, got {self.team_size}")
        for name, low in (("tasks", 1), ("consolidate_every", 1), ("memory_tokens", 16), ("steps_per_subtask", 1)):
            if getattr(self, name) < low:
                raise ConfigError(f"{name} must be at least {low}, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps must be at least 1, got {self.max_steps}")
        object.__setattr__(self, "envs", tuple(self.envs))

    @property
    def agents(self) -> list[str]:
        return [f"agent-{i + 1}" for i in range(self.team_size)]

    def role(self, agent: str) -> str:
        return ROLES[int(agent.rsplit("-", 1)[1]) - 1]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["envs"] = list(self.envs)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TeamConfig:
        known = {f.name for f in fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise ConfigError(f"unknown team config keys: {', '.join(extra)}")
        return cls(**{k: (tuple(v) if k == "envs" else v) for k, v in data.items()})


@dataclass(slots=True)
class TeamResult:
    """A finished run: its directory, config, summary (``final.json``) and per-task results."""

    run_dir: Path
    config: TeamConfig
    final: dict[str, Any]
    results: list[dict[str, Any]] = field(default_factory=list)


# -- run directory --------------------------------------------------------------------------


class _TeamDir(RunDir):
    """A team run's files; JSON I/O and events come from the evolve run directory."""

    def task_path(self, index: int) -> Path:
        return self.path / "tasks" / f"task-{index:04d}.json"

    def consolidation_path(self, after: int) -> Path:
        return self.path / "consolidations" / f"after-{after:04d}.json"

    def snapshot_path(self, index: int) -> Path:
        return self.path / f"memory.task-{index:04d}.bak"

    def snapshots(self) -> list[tuple[int, Path]]:
        """Memory copies left by a run killed while recording a task, oldest first."""
        out = []
        for p in self.path.glob("memory.task-*.bak"):
            m = re.fullmatch(r"memory\.task-(\d{4,})\.bak", p.name)
            if m:
                out.append((int(m.group(1)), p))
        return sorted(out)

    def create(self, config: TeamConfig) -> None:  # type: ignore[override]
        if self.config_path.exists():
            raise ConfigError(f"{self.path} already holds a run; resume it with --resume {self.path} or pick another --run-dir")
        if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
            raise ConfigError(f"{self.path} exists and is not an empty directory; pick another --run-dir")
        (self.path / "tasks").mkdir(parents=True, exist_ok=True)
        self.write_json(self.config_path, {"kind": "forge-team", **config.to_dict()})

    def load_team_config(self) -> TeamConfig:
        if not self.path.is_dir():
            raise NotFoundError(f"no run directory at {self.path}")
        if not self.config_path.is_file():
            raise NotFoundError(f"{self.path} is not a team run: config.json is missing")
        data = self.read_json(self.config_path)
        if not isinstance(data, dict) or data.pop("kind", None) != "forge-team":
            raise StoreError(f"{self.config_path}: not a forge team run config; nothing was changed")
        try:
            return TeamConfig.from_dict(data)
        except (ForgeError, TypeError) as exc:
            raise StoreError(f"{self.config_path}: not a valid team config ({exc}); nothing was changed") from None

    def committed(self, n: int) -> list[dict[str, Any]]:
        """The contiguous committed task results 1..k, validated (a gap or bad file is an error)."""
        out: list[dict[str, Any]] = []
        for i in range(1, n + 1):
            path = self.task_path(i)
            if not path.is_file():
                later = [j for j in range(i + 1, n + 1) if self.task_path(j).is_file()]
                if later:
                    raise StoreError(f"{path} is missing but task {later[0]} is committed; the run directory is damaged")
                break
            data = self.read_json(path)
            if not isinstance(data, dict) or data.get("index") != i or not {"ts", "cs", "tokens"} <= set(data):
                raise StoreError(f"{path}: not a task result of this run; nothing was changed")
            out.append(data)
        return out


# -- memory modes -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Context:
    """One agent's memory for one task: the prompt block, the recollection it came from
    (for the rules of the current situation and the ids shown), and a label for the result."""

    block: str = ""
    recollection: Recollection | None = None
    label: str = "none"

    @property
    def ids(self) -> list[str]:
        return self.recollection.ids if self.recollection is not None else []


class _Mode:
    """What one memory mode reads into prompts and writes after a task (the only difference
    between baselines)."""

    tm: TeamMemory | None = None

    def actor_context(self, agent: str, query: str, budget: int, valid: Sequence[str], abstract: Callable[[str], str] | None = None) -> _Context:
        return _Context()

    def planner_context(self, agent: str, query: str, budget: int) -> str:
        return ""

    def record(self, result: Mapping[str, Any]) -> None:
        return None

    def recorded(self) -> int | None:
        """Tasks the durable memory holds (None: nothing durable to check)."""
        return None


class _RawMode(_Mode):
    """Full raw shared history: the newest transcripts, whole, newest first, within budget."""

    def __init__(self) -> None:
        self.history: list[str] = []

    def actor_context(self, agent: str, query: str, budget: int, valid: Sequence[str], abstract: Callable[[str], str] | None = None) -> _Context:
        lines, used = ["## Past tasks (raw transcripts, newest first)"], 0
        used = approx_tokens(lines[0])
        for text in reversed(self.history):
            cost = approx_tokens(text)
            if used + cost > budget:
                break
            lines.append(text)
            used += cost
        return _Context("\n".join(lines), None, "raw") if len(lines) > 1 else _Context("", None, "raw")

    def record(self, result: Mapping[str, Any]) -> None:
        status = "success" if result["success"] else "failure"
        self.history.append(
            f"Task {result['index']} ({result['text']}): " + "; ".join(result["transcript"]) + f" => {status}, return {result['return']:g}"
        )


_SECTION_OF = {kind: name for name, kinds in TEAM_SECTIONS.items() for kind in kinds}


class _TeamMode(_Mode):
    """LLMA-Mem: actors read procedures, rules and past tasks; the planner "who knows what";
    both through :meth:`TeamMemory.recollect`."""

    def __init__(self, tm: TeamMemory) -> None:
        self.tm = self._tm = tm

    def actor_context(self, agent: str, query: str, budget: int, valid: Sequence[str], abstract: Callable[[str], str] | None = None) -> _Context:
        rec = self._tm.recollect(agent, query, budget=budget, valid_actions=valid, abstract=abstract)
        label = "+".join(dict.fromkeys(_SECTION_OF[u.kind] for u in rec.shown)) or "none"
        return _Context(rec.block, rec, label)

    def planner_context(self, agent: str, query: str, budget: int) -> str:
        return self._tm.recollect(agent, query, layers=("transactive",), budget=budget, role="planner").block

    def record(self, result: Mapping[str, Any]) -> None:
        task = TeamTask.from_dict(result["task"])
        reflection = result.get("reflection") or {}
        self._tm.record_task(
            task=result["text"],
            outcome=Outcome(
                success=result["success"],
                score=result["ts"],
                metrics={"return": result["return"], "cs": result["cs"], "steps": result["steps"]},
                errors=tuple(result["violations"]),
                per_agent=result["per_agent"],
                messages=result["messages"],
            ),
            actions=[Action(agent=a, text=t, role=r) for a, r, t in result["actions"]],
            team=result["members"],
            task_type=task.task_type,
            env=task.env,
            lesson=TaskLesson.from_dict(result["lesson"]) if result.get("lesson") else None,
            rules=reflection.get("rules", ()),
            retire=reflection.get("retire", ()),
            used=result.get("used", ()),
        )

    def recorded(self) -> int | None:
        return self._tm.tasks_recorded


# -- the memory copy that makes recording a task all-or-nothing -------------------------------


def _copy_db(src: Path, dst: Path) -> None:
    """A consistent copy of the SQLite file ``src`` (its WAL included), written atomically."""
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    with closing(sqlite3.connect(str(src))) as a, closing(sqlite3.connect(str(tmp))) as b:
        a.backup(b)
    os.replace(tmp, dst)


def _restore_db(copy: Path, db: Path) -> None:
    """Put ``copy`` back as the store ``db``. Its WAL and the derived vector index go first:
    a stale WAL would be replayed onto the copy, and the index is rebuilt from the file."""
    for suffix in ("-wal", "-shm", ".usearch", ".usearch.json", ".usearch.tmp", ".usearch.json.tmp"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)
    _copy_db(copy, db)


# -- the run ------------------------------------------------------------------------------------


class _Run:
    def __init__(self, run: _TeamDir, config: TeamConfig, llm: LLM, hook: Hook | None, progress: Hook | None) -> None:
        self.run = run
        self.config = config
        self.llm = llm
        self.hooks = [h for h in (hook, progress) if h is not None]
        self.tasks = make_stream(config.stream, config.tasks, seed=config.seed, envs=config.envs or None)
        self.envs: dict[str, Env] = {}
        self.durable = config.memory not in ("none", "raw")
        self.recovered = self._recover() if self.durable else None
        try:
            self.memory = Memory.open(run.db_path, embedder=config.embedder)
        except ForgeError as exc:
            raise StoreError(f"{run.db_path}: cannot open the run's memory store ({exc}); nothing was changed") from None
        self.cons_ledger = TokenLedger()
        self.cons_seen = (0, 0)
        self.cons: Consolidator | None = None
        self.mode: _Mode
        if config.memory == "none":
            self.mode = _Mode()
        elif config.memory == "raw":
            self.mode = _RawMode()
        else:
            tm = TeamMemory(self.memory, team=config.team, agents=config.agents, layout=config.memory, llm=None)
            self.mode = _TeamMode(tm)

    def _recover(self) -> int | None:
        """Put back the memory copy of a task whose recording was interrupted; its index."""
        snaps = self.run.snapshots()
        if not snaps:
            return None
        index, path = snaps[-1]
        _restore_db(path, self.run.db_path)
        self.run.consolidation_path(index).unlink(missing_ok=True)  # redone from the restored memory
        for _, older in snaps[:-1]:
            older.unlink()
        return index

    def emit(self, event: str, **data: Any) -> None:
        if event in ("task_done", "consolidated", "run_done"):
            self.run.event(event, **data)
        for h in self.hooks:
            h(event, data)

    def close(self) -> None:
        try:
            if self.cons is not None:
                self.cons.close()
        finally:
            for env in self.envs.values():
                env.close()
            self.memory.close()

    # -- restore ------------------------------------------------------------------------
    def restore(self) -> list[dict[str, Any]]:
        done = self.run.committed(self.config.tasks)
        if self.recovered is not None and self.recovered != len(done):
            raise StoreError(
                f"{self.run.snapshot_path(self.recovered)} belongs to task {self.recovered} but {len(done)} tasks are "
                "committed; the run directory is inconsistent"
            )
        have = self.mode.recorded()
        if have is not None:
            if have == len(done) - 1:  # killed between the commit and the end of the memory update
                self.mode.record(done[-1])
                self.run.event("replayed", task=len(done))
            elif have != len(done):
                raise StoreError(
                    f"{self.run.db_path} holds {have} tasks but {len(done)} task results are committed; "
                    "the run directory is inconsistent"
                )
        else:
            for r in done:
                self.mode.record(r)
        if self.mode.tm is not None:
            llm = MeteredLLM(self.llm, self.cons_ledger, role="consolidate") if self.config.reflect else None
            self.cons = Consolidator(self.mode.tm, every=self.config.consolidate_every, llm=llm, specs=self.spec_of)
            last = len(done) - len(done) % self.config.consolidate_every
            if last and not self.run.consolidation_path(last).is_file():
                self.consolidate(last)
        if self.recovered is not None:
            self.run.snapshot_path(self.recovered).unlink(missing_ok=True)
        return done

    def consolidate(self, after: int) -> None:
        """Consolidate now, at this task boundary, and commit the report: every later task
        sees the same procedures however long consolidation took."""
        assert self.cons is not None
        self.emit("consolidating", after=after)
        report = self.cons.run()
        usage = self.cons_ledger.total()
        data = report.to_dict()
        data["tokens"] = {"in": usage.prompt_tokens - self.cons_seen[0], "out": usage.completion_tokens - self.cons_seen[1]}
        self.cons_seen = (usage.prompt_tokens, usage.completion_tokens)
        self.run.write_json(self.run.consolidation_path(after), data)
        self.emit(
            "consolidated",
            after=after,
            procedures=len(report.generalised),
            pruned=len(report.pruned),
            clusters=len(report.clusters),
        )

    # -- one task -----------------------------------------------------------------------
    def env(self, name: str) -> Env:
        if name not in self.envs:
            self.envs[name] = open_task_env(name, max_steps=self.config.max_steps)
        return self.envs[name]

    def spec_of(self, name: str) -> EnvSpec | None:
        """The spec of the env ``name``, which consolidation holds procedure text to; None for
        an env that cannot be opened here (its lessons were checked when they were written)."""
        try:
            return self.env(name).spec
        except ForgeError:
            return None

    def play(self, task: TeamTask) -> dict[str, Any]:
        """Play one task through the one agent loop with the team as its policy."""
        started = time.perf_counter()
        cfg = self.config
        env = self.env(task.env)
        spec = env.spec
        ledger = TokenLedger()
        who_knows = self.mode.planner_context(cfg.agents[0], task.text, cfg.memory_tokens) if len(cfg.agents) > 1 else ""
        policy = TeamPolicy(
            llm=self.llm, ledger=ledger, agents=tuple(cfg.agents), role_of=cfg.role, spec=spec,
            task=task.text, steps_per_subtask=cfg.steps_per_subtask, who_knows=who_knows, rule_guard=cfg.rule_guard,
        )
        contexts: dict[str, _Context] = {}

        def recall(agent: str, query: str) -> Recollection:
            # every member's memory for the task, as that member's viewer (after the reset)
            contexts[agent] = self.mode.actor_context(agent, f"{task.text}\n{query}", cfg.memory_tokens, env.valid_actions(), spec.abstract)
            return contexts[agent].recollection or Recollection(role=ACTOR_ROLE, block=contexts[agent].block)

        def on_step(t: int, action: str, result: StepResult) -> None:
            policy.observe(t, action, result)
            self.emit("step", task=task.index, step=t + 1, agent=policy.actions[-1][0], action=action, reward=result.reward)

        traj = play_episode(env, policy, recall, seed=task.seed, tau=spec.tau, abort=False, on_step=on_step)
        total = traj.total
        subtasks = [s.to_dict() for s in policy.subtasks]
        success = spec.succeeded(total, aborted=traj.aborted)
        acted = list(dict.fromkeys(s["agent"] for s in subtasks))
        members = list(dict.fromkeys([cfg.agents[0], *acted]))
        per_agent = {a: all(s["ok"] for s in subtasks if s["agent"] == a) for a in acted}
        shown = {a: contexts[a].ids for a in acted if a in contexts}
        used = list(dict.fromkeys([*(i for a in acted for i in shown.get(a, [])), *(i for ids in policy.now_ids for i in ids)]))
        result: dict[str, Any] = {
            "index": task.index,
            "task": task.to_dict(),
            "text": task.text,
            "env": task.env,
            "return": round(total, 6),
            "success": success,
            "ts": round(task_score(total, spec), 6),
            "cs": round(coordination_score(subtasks), 6),
            "steps": len(traj.actions),
            "subtasks": subtasks,
            "actions": [list(a) for a in policy.actions],
            "transcript": policy.transcript,
            "violations": policy.violations,
            "messages": policy.messages,
            "members": members,
            "per_agent": per_agent,
            "retrieval": {a: contexts[a].label for a in sorted(contexts) if a in acted},
            "shown": shown,  # unit ids in each acting agent's memory block
            "now": policy.now_ids,  # per step: the rules repeated for that exact situation
            "used": used,  # credited with the outcome (Memory.record_use)
            "rules": traj.rule_record,  # decisions with a rule for their situation, and followed
        }
        result.update(self.reflect(task, env, traj, result, contexts, ledger))
        usage = ledger.total()
        result["tokens"] = {
            "in": usage.prompt_tokens,
            "out": usage.completion_tokens,
            "by_role": {str(k): v.total_tokens for k, v in sorted(ledger.by("role").items(), key=lambda kv: str(kv[0]))},
        }
        result["seconds"] = round(time.perf_counter() - started, 3)
        return result

    def reflect(
        self, task: TeamTask, env: Env, traj: Trajectory, result: Mapping[str, Any], contexts: Mapping[str, _Context], ledger: TokenLedger
    ) -> dict[str, Any]:
        """The task's lesson, written now so the result file can replay it: on failure the
        library's reflection (:func:`forge.learn.loop.reflect_on`) on the team's trajectory, seen
        as the agent whose step failed; on success (or a failure reflection wrote no rule for)
        a record of it in the situations' terms (:func:`~forge.team.memories.task_lesson`)."""
        if self.mode.tm is None:
            return {"lesson": None, "reflection": None}
        actions = [Action(agent=a, text=t, role=r) for a, r, t in result["actions"]]
        outcome = Outcome(success=result["success"], score=result["ts"], errors=tuple(result["violations"]))
        point = failure_point(traj, spec=env.spec, reflect_on_stall=True)
        if point is None:
            lesson = task_lesson(None, task=task.text, actions=actions, outcome=outcome, trajectory=traj, spec=env.spec)
            return {"lesson": lesson.to_dict(), "reflection": None}
        at, stalled = point
        agent = result["actions"][at][0]
        rec = contexts[agent].recollection if agent in contexts else None
        if rec is not None:
            traj.recollections = {ACTOR_ROLE: rec}
        llm = MeteredLLM(self.llm, ledger, role="reflect") if self.config.reflect else None
        reflection = reflect_on(
            traj,
            env=env,
            roles=(ACTOR_ROLE,),
            acting_roles=(ACTOR_ROLE,),
            llm=llm,
            seed=task.seed,
            tau=env.spec.tau,
            at=at,
            stalled=stalled,
            probe_alternatives=task.env != DB_ENV,  # replaying a diagnosis rebuilds a database per action
        )
        what = "went in circles from there" if stalled else f"got reward {traj.rewards[at]:g} (below tau {env.spec.tau:g})"
        act = env.spec.abstract(traj.actions[at]) if env.spec.abstract is not None else traj.actions[at]
        # in the situation's terms, as the lesson: the diagnosis is recalled on other games too
        diagnosis = f"step {at + 1} by {agent}: {act} in '{situation_of(traj.observations[at], env.spec)}' {what}"
        shown = {ACTOR_ROLE: rec.shown if rec is not None else ()}
        retire = [u.id for e in reflection.edits for u in deleted_rules(shown, e)]
        lesson = task_lesson(
            reflection, task=task.text, actions=actions, outcome=outcome, diagnosis=diagnosis, trajectory=traj, spec=env.spec, at=at
        )
        data = reflection.to_dict()
        data.update(rules=[r.to_dict() for e in reflection.edits for r in e.add], retire=retire, step=at, agent=agent)
        return {"lesson": lesson.to_dict(), "reflection": data}

    # -- the loop -------------------------------------------------------------------------
    def execute(self, started: float) -> TeamResult:
        done = self.restore()
        results = list(done)
        every = self.config.consolidate_every
        for task in self.tasks[len(done):]:
            self.emit("task_started", task=task.index, env=task.env, total=len(self.tasks))
            result = self.play(task)
            self.run.write_json(self.run.task_path(task.index), result)  # the commit point
            snapshot = self.run.snapshot_path(task.index)
            if self.durable:
                _copy_db(self.run.db_path, snapshot)  # memory before this task: all or nothing
            self.emit("task_committed", task=task.index)
            self.mode.record(result)
            if self.cons is not None and task.index % every == 0:
                self.consolidate(task.index)
            snapshot.unlink(missing_ok=True)
            results.append(result)
            j = [(r["ts"] + r["cs"]) / 2 for r in results]
            self.emit(
                "task_done",
                task=task.index,
                total=len(self.tasks),
                env=task.env,
                ts=result["ts"],
                cs=result["cs"],
                ap=sum(j) / len(j),
                tokens=result["tokens"]["in"] + result["tokens"]["out"],
            )
        final = self.summarise(results)
        final["wall_seconds"] = round(time.perf_counter() - started, 3)
        self.run.write_json(self.run.final_path, final)
        self.emit("run_done", aip=final["aip"], ap=final["ap"])
        return TeamResult(self.run.path, self.config, final, results)

    def summarise(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        from forge.team import Scoreboard

        board = Scoreboard()
        for r in results:
            board.add(ts=r["ts"], cs=r["cs"], tokens_in=r["tokens"]["in"], tokens_out=r["tokens"]["out"])
        n = len(results) or 1
        cons = []
        cons_dir = self.run.path / "consolidations"
        if cons_dir.is_dir():
            cons = [self.run.read_json(p) for p in sorted(cons_dir.glob("after-*.json"))]
        counts: dict[str, int] = {}
        if self.mode.tm is not None:
            for kind in (Kind.EPISODE, Kind.PROCEDURE, Kind.PROFILE):
                counts[kind.value] = self.memory.count(viewer=Viewer.admin(), filter=Filter.make(kinds=[kind]))
        return {
            "config": self.config.to_dict(),
            "tasks": len(results),
            "aip": board.aip,
            "ap": board.ap,
            "ts_mean": sum(s.ts for s in board.history) / n,
            "cs_mean": sum(s.cs for s in board.history) / n,
            "success_rate": sum(1 for r in results if r["success"]) / n,
            "curve": [s.ap for s in board.history],
            "j": [s.j for s in board.history],
            "envs": [r["env"] for r in results],
            "tokens": {
                "in": board.tokens_in,
                "out": board.tokens_out,
                "per_task": (board.tokens_in + board.tokens_out) / n,
                "consolidation": sum(c.get("tokens", {}).get("in", 0) + c.get("tokens", {}).get("out", 0) for c in cons),
            },
            "consolidations": len(cons),
            "procedures_generalised": sum(len(c.get("generalised", [])) for c in cons),
            "memory_units": counts,
        }


def _build(config: TeamConfig, llm: LLM | None) -> LLM:
    return llm if llm is not None else open_llm(config.llm)


def run_team(
    config: TeamConfig,
    run_dir: str | os.PathLike[str],
    *,
    llm: LLM | None = None,
    hook: Hook | None = None,
    progress: Hook | None = None,
) -> TeamResult:
    """Run ``config`` from scratch into ``run_dir`` (empty or absent).

    ``llm`` overrides ``config.llm`` (tests pass a ScriptedLLM). ``hook`` and ``progress``
    receive ``(event, data)`` for task_started, step, task_committed, task_done, consolidated
    and run_done; an exception from ``hook`` stops the run, which :func:`resume_team` continues.
    """
    make_stream(config.stream, 1, seed=config.seed, envs=config.envs or None)  # fail before writing
    if config.stream == "db":
        open_task_env("postgres-diagnosis").close()  # unreachable server: one line, nothing written
    run = _TeamDir(run_dir)
    run.create(config)
    run.event("run_started", config=config.to_dict())
    return _drive(run, config, llm=llm, hook=hook, progress=progress)


def resume_team(
    run_dir: str | os.PathLike[str],
    *,
    llm: LLM | None = None,
    hook: Hook | None = None,
    progress: Hook | None = None,
) -> TeamResult:
    """Continue the run in ``run_dir`` where it stopped; a finished run returns its result.

    A missing or corrupt run directory raises a one-line :class:`~forge.errors.ForgeError`
    and changes nothing.
    """
    run = _TeamDir(run_dir)
    config = run.load_team_config()
    results = run.committed(config.tasks)
    if run.final_path.exists():
        final = run.read_json(run.final_path)
        if not isinstance(final, dict):
            raise StoreError(f"{run.final_path}: not a run summary; nothing was changed")
        return TeamResult(run.path, config, final, results)
    if not run.db_path.is_file():
        raise StoreError(f"{run.db_path} is missing; the run directory is damaged and cannot be resumed")
    run.event("resumed", committed=len(results))
    return _drive(run, config, llm=llm, hook=hook, progress=progress)


def _drive(run: _TeamDir, config: TeamConfig, *, llm: LLM | None, hook: Hook | None, progress: Hook | None) -> TeamResult:
    started = time.perf_counter()
    model = _build(config, llm)
    state = _Run(run, config, model, hook, progress)
    try:
        return state.execute(started)
    finally:
        state.close()
        if llm is None:
            model.close()


def sweep(
    base: TeamConfig,
    out_dir: str | os.PathLike[str],
    *,
    sizes: Sequence[int] = (1, 3, 5, 7),
    lengths: Sequence[int] | None = None,
    llm: LLM | None = None,
    progress: Hook | None = None,
) -> dict[str, Any]:
    """Team size x stream length: one run per cell under ``out_dir/runs``, then the report.

    Cells already finished are reused and interrupted ones resumed, so a sweep can be rerun.
    Returns the report's summary with the written paths under ``"paths"``.
    """
    from forge.team.report import build_team_report

    out = Path(out_dir)
    dirs = []
    for n in lengths or (base.tasks,):
        for k in sizes:
            cfg = TeamConfig.from_dict({**base.to_dict(), "team_size": k, "tasks": n})
            d = out / "runs" / f"size-{k}-tasks-{n}"
            if (d / "config.json").is_file():
                resume_team(d, llm=llm, progress=progress)
            else:
                run_team(cfg, d, llm=llm, progress=progress)
            dirs.append(d)
    summary, paths = build_team_report(dirs, out)
    summary["paths"] = {k: str(v) for k, v in paths.items()}
    return summary


def team_config(run_dir: str | os.PathLike[str]) -> TeamConfig:
    """The config a kept run was started with; a missing or damaged one is a one-line
    :class:`~forge.errors.ForgeError` (benches compare it before resuming)."""
    return _TeamDir(run_dir).load_team_config()


def load_results(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The committed task results of a run, in order (for reports and tests)."""
    run = _TeamDir(run_dir)
    return run.committed(run.load_team_config().tasks)
