"""The lifelong team runner: a planner allocates, role agents act, memory learns, runs resume.

    from forge.team.runner import TeamConfig, run_team, resume_team
    result = run_team(TeamConfig(stream="gym", tasks=20, team_size=3, memory="hybrid"), "runs/team")
    result.final["aip"], result.final["ap"]
    resume_team("runs/team")            # after a kill: continues where it stopped

**The team.** ``team_size`` agents ``agent-1..agent-k`` with the roles of :data:`ROLES`;
``agent-1`` (the lead) is also the planner. A task is played in subtasks of
``steps_per_subtask`` env steps. Before each one the planner picks the agent to do it by
constrained choice among the agent ids (:func:`~forge.llm.choose`, so a small model cannot
answer outside the team), reading the transactive "who knows what" block. The chosen agent
acts with one constrained choice among the env's valid actions per step, its prompt carrying
its own retrieval (:func:`~forge.team.retrieve`) rendered within ``memory_tokens``. A
violation (a step below the env's ``tau`` or an action the model could not produce) ends the
subtask and the next is reallocated to someone else. A team of one plans without an LLM call.

**Memory modes, one code path** (:data:`MEMORY_MODES`): ``none`` (nothing read or written),
``raw`` (the newest raw task transcripts, whole, within the token budget), and the
LLMA-Mem topologies ``local``, ``shared``, ``hybrid`` (:class:`~forge.team.TeamMemory`,
consolidation every ``consolidate_every`` tasks on a background thread).

**Determinism and resume.** Each task's result (actions, scores, tokens, the reflections) is
written to ``RUN/tasks/task-NNNN.json`` *before* memory is updated from it, so the file is
the commit point: on resume a task whose file exists but whose episodes are missing from
``memory.db`` is replayed into memory from the file (no LLM call), and a consolidation that
was due but left no ``RUN/consolidations/after-NNNN.json`` is run again (it skips clusters a
procedure already covers). Background consolidation overlaps the next task's env reset and
first allocation, and is waited for before the first retrieval, so with a deterministic LLM
a resumed run equals an uninterrupted one.

    RUN/config.json  events.jsonl  memory.db  tasks/task-NNNN.json
    RUN/consolidations/after-NNNN.json  final.json
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from forge.envs import Env, EnvSpec
from forge.errors import ConfigError, ForgeError, NotFoundError, StoreError, StructuredOutputError
from forge.llm import LLM, Message, MeteredLLM, TokenLedger, choose, open_llm
from forge.memory import Memory
from forge.model import Kind, Viewer
from forge.protocols.runs import RunDir
from forge.recall import approx_tokens
from forge.store import Filter
from forge.team.consolidate import ConsolidationReport, Consolidator
from forge.team.memories import Action, Outcome, Reflection, TeamMemory, write_reflection
from forge.team.retrieve import retrieve
from forge.team.streams import (
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


class _Mode:
    """What one memory mode reads into prompts and writes after a task (the only difference
    between baselines)."""

    tm: TeamMemory | None = None

    def actor_context(self, task: TeamTask, agent: str, budget: int) -> tuple[str, list[str], str]:
        return "", [], "none"

    def planner_context(self, agent: str, budget: int) -> str:
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

    def actor_context(self, task: TeamTask, agent: str, budget: int) -> tuple[str, list[str], str]:
        lines, used = ["## Past tasks (raw transcripts, newest first)"], 0
        used = approx_tokens(lines[0])
        for text in reversed(self.history):
            cost = approx_tokens(text)
            if used + cost > budget:
                break
            lines.append(text)
            used += cost
        return ("\n".join(lines), [], "raw") if len(lines) > 1 else ("", [], "raw")

    def record(self, result: Mapping[str, Any]) -> None:
        status = "success" if result["success"] else "failure"
        self.history.append(
            f"Task {result['index']} ({result['text']}): " + "; ".join(result["transcript"]) + f" => {status}, return {result['return']:g}"
        )


class _TeamMode(_Mode):
    """LLMA-Mem: hierarchical retrieval for actors, transactive memory for the planner."""

    def __init__(self, tm: TeamMemory) -> None:
        self.tm = self._tm = tm

    def actor_context(self, task: TeamTask, agent: str, budget: int) -> tuple[str, list[str], str]:
        got = retrieve(self._tm, task.text, agent=agent)
        return got.render(budget=budget), got.procedure_ids, got.path

    def planner_context(self, agent: str, budget: int) -> str:
        return self._tm.render_transactive(agent=agent, budget=budget)

    def record(self, result: Mapping[str, Any]) -> None:
        task = TeamTask.from_dict(result["task"])
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
            used_procedures=result["used_procedures"],
            reflections={k: Reflection(tuple(v["lessons"]), v["diagnosis"], v["source"]) for k, v in result["reflections"].items()},
        )

    def recorded(self) -> int | None:
        return self._tm.tasks_recorded


# -- the run ------------------------------------------------------------------------------------


class _Run:
    def __init__(self, run: _TeamDir, config: TeamConfig, llm: LLM, hook: Hook | None, progress: Hook | None) -> None:
        self.run = run
        self.config = config
        self.llm = llm
        self.hooks = [h for h in (hook, progress) if h is not None]
        self.tasks = make_stream(config.stream, config.tasks, seed=config.seed, envs=config.envs or None)
        self.envs: dict[str, Env] = {}
        try:
            self.memory = Memory.open(run.db_path, embedder=config.embedder)
        except ForgeError as exc:
            raise StoreError(f"{run.db_path}: cannot open the run's memory store ({exc}); nothing was changed") from None
        self.cons_ledger = TokenLedger()
        self.cons_seen = (0, 0)
        self.cons: Consolidator | None = None
        self.pending: tuple[int, Future[ConsolidationReport]] | None = None
        self.mode: _Mode
        if config.memory == "none":
            self.mode = _Mode()
        elif config.memory == "raw":
            self.mode = _RawMode()
        else:
            tm = TeamMemory(self.memory, team=config.team, agents=config.agents, topology=config.memory, llm=None)
            self.mode = _TeamMode(tm)

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
        have = self.mode.recorded()
        if have is not None:
            if have == len(done) - 1:  # killed between the commit and the memory update
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
            self.cons = Consolidator(self.mode.tm, every=self.config.consolidate_every, background=True, llm=llm)
            last = len(done) - len(done) % self.config.consolidate_every
            if last and not self.run.consolidation_path(last).is_file():
                self.pending = (last, self.cons.start())
                self.barrier()
        return done

    def barrier(self) -> None:
        """Wait for the background consolidation and commit its report."""
        if self.pending is None:
            return
        after, fut = self.pending
        self.pending = None
        report = fut.result()
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

    def allocate(self, task: TeamTask, spec: EnvSpec, obs: str, n: int, exclude: set[str], ledger: TokenLedger) -> str:
        agents = self.config.agents
        options = [a for a in agents if a not in exclude] or agents
        if len(options) == 1:
            return options[0]
        lead = agents[0]
        roster = ", ".join(f"{a} ({self.config.role(a)})" for a in agents)
        block = self.mode.planner_context(lead, self.config.memory_tokens)
        note = f"\n{', '.join(sorted(exclude))} just failed a subtask; give it to someone else." if exclude else ""
        prompt = [
            Message("system", f"You are {lead}, the lead planner of a team: {roster}. Give each subtask to the agent most likely to do it well."),
            Message(
                "user",
                f"Task: {task.text}\n{spec.description}\n{block}\nSituation:\n{_clip(obs, 400)}\n"
                f"Subtask {n}: the next {self.config.steps_per_subtask} steps.{note}\nWhich agent should do it?",
            ),
        ]
        llm = MeteredLLM(self.llm, ledger, role="planner")
        return choose(llm, prompt, options, retries=1, fallback=options[0])

    def act(self, agent: str, spec: EnvSpec, obs: str, recent: Sequence[str], context: str, valid: Sequence[str], ledger: TokenLedger) -> tuple[str, bool]:
        role = self.config.role(agent)
        system = f"You are {agent}, the {role} of a team of agents. {spec.description}" + (f"\n\n{context}" if context else "")
        user = obs + (f"\nRecent team actions: {'; '.join(recent[-6:])}" if recent else "") + "\nChoose your next action."
        llm = MeteredLLM(self.llm, ledger, role="actor", agent=agent)
        try:
            return choose(llm, [Message("system", system), Message("user", user)], list(valid), retries=1), False
        except StructuredOutputError:
            return valid[0], True

    def play(self, task: TeamTask) -> dict[str, Any]:
        started = time.perf_counter()
        cfg = self.config
        env = self.env(task.env)
        obs = env.reset(seed=task.seed)
        spec = env.spec
        ledger = TokenLedger()
        actions: list[tuple[str, str, str]] = []
        transcript: list[str] = []
        subtasks: list[dict[str, Any]] = []
        violations: list[str] = []
        contexts: dict[str, tuple[str, list[str], str]] = {}
        total, steps, done, messages = 0.0, 0, False, 0
        exclude: set[str] = set()
        while not done and steps < spec.max_steps:
            agent = self.allocate(task, spec, obs, len(subtasks) + 1, exclude, ledger)
            messages += 1
            self.barrier()
            if agent not in contexts:
                contexts[agent] = self.mode.actor_context(task, agent, cfg.memory_tokens)
            sub: dict[str, Any] = {"agent": agent, "start": steps, "steps": 0, "ok": True, "reallocated": bool(exclude), "violation": ""}
            for _ in range(cfg.steps_per_subtask):
                action, fallback = self.act(agent, spec, obs, transcript, contexts[agent][0], env.valid_actions(), ledger)
                res = env.step(action)
                steps += 1
                sub["steps"] += 1
                total += res.reward
                obs, done = res.observation, res.done
                actions.append((agent, cfg.role(agent), action))
                transcript.append(f"{agent}: {action} -> {res.reward:g}")
                self.emit("step", task=task.index, step=steps, agent=agent, action=action, reward=res.reward)
                why = "no valid action produced" if fallback else (f"reward {res.reward:g} < tau {spec.tau:g}" if res.reward < spec.tau else "")
                if why:
                    sub.update(ok=False, violation=why)
                    violations.append(f"step {steps} by {agent}: {why}")
                    break
                if done or steps >= spec.max_steps:
                    break
            subtasks.append(sub)
            exclude = {agent} if not sub["ok"] and len(cfg.agents) > 1 else set()
            messages += int(not sub["ok"] and not done)  # the hand-over
        success = total >= spec.success_return
        acted = list(dict.fromkeys(s["agent"] for s in subtasks))
        members = list(dict.fromkeys([cfg.agents[0], *acted]))
        per_agent = {a: all(s["ok"] for s in subtasks if s["agent"] == a) for a in acted}
        used = sorted({p for a in acted for p in contexts.get(a, ("", [], ""))[1]})
        result: dict[str, Any] = {
            "index": task.index,
            "task": task.to_dict(),
            "text": task.text,
            "env": task.env,
            "return": round(total, 6),
            "success": success,
            "ts": round(task_score(total, spec), 6),
            "cs": round(coordination_score(subtasks), 6),
            "steps": steps,
            "subtasks": subtasks,
            "actions": [list(a) for a in actions],
            "transcript": transcript,
            "violations": violations,
            "messages": messages,
            "members": members,
            "per_agent": per_agent,
            "used_procedures": used,
            "retrieval": {a: contexts[a][2] for a in sorted(contexts)},
        }
        result["reflections"] = self.reflect(task, result, ledger)
        usage = ledger.total()
        result["tokens"] = {
            "in": usage.prompt_tokens,
            "out": usage.completion_tokens,
            "by_role": {str(k): v.total_tokens for k, v in sorted(ledger.by("role").items(), key=lambda kv: str(kv[0]))},
        }
        result["seconds"] = round(time.perf_counter() - started, 3)
        return result

    def reflect(self, task: TeamTask, result: Mapping[str, Any], ledger: TokenLedger) -> dict[str, Any]:
        """Lessons per episodic pool, written now so the result file can replay them."""
        tm = self.mode.tm
        if tm is None:
            return {}
        llm = MeteredLLM(self.llm, ledger, role="reflect") if self.config.reflect else None
        actions = [Action(agent=a, text=t, role=r) for a, r, t in result["actions"]]
        outcome = Outcome(success=result["success"], score=result["ts"], errors=tuple(result["violations"]))
        out = {}
        for pool in tm.pools("episodic", agents=result["members"]):
            mine = [a for a in actions if not pool.owner or a.agent == pool.owner] or actions
            role = self.config.role(pool.owner) if pool.owner else ""
            r = write_reflection(llm, task=task.text, actions=mine, outcome=outcome, role=role)
            out[pool.owner or "team"] = {"lessons": list(r.lessons), "diagnosis": r.diagnosis, "source": r.source}
        return out

    # -- the loop -------------------------------------------------------------------------
    def execute(self, started: float) -> TeamResult:
        done = self.restore()
        results = list(done)
        for task in self.tasks[len(done):]:
            self.emit("task_started", task=task.index, env=task.env, total=len(self.tasks))
            result = self.play(task)
            self.run.write_json(self.run.task_path(task.index), result)  # the commit point
            self.emit("task_committed", task=task.index)
            self.mode.record(result)
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
            if self.cons is not None:
                fut = self.cons.task_done()
                if isinstance(fut, Future):
                    self.pending = (task.index, fut)
        self.barrier()
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
            store = self.memory.store
            for kind in (Kind.EPISODE, Kind.PROCEDURE, Kind.PROFILE):
                counts[kind.value] = store.count(viewer=Viewer.admin(), filter=Filter.make(kinds=[kind]))
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


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


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


def load_results(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The committed task results of a run, in order (for reports and tests)."""
    run = _TeamDir(run_dir)
    return run.committed(run.load_team_config().tasks)
