"""The three memories of a lifelong team (LLMA-Mem, arXiv 2604.03295) as units of the engine.

- **episodic**: one :attr:`Kind.EPISODE` unit per task and pool (team, actions, outcome with
  metrics and errors, the task's lessons, a root-cause diagnosis on failure), backed by an
  :class:`~forge.model.Episode` record holding the actions as steps; the rules reflection
  (:mod:`forge.learn.reflect`) wrote about a failure go into the same pools as :attr:`Kind.RULE` units;
- **procedural**: :attr:`Kind.PROCEDURE` units (title, knowledge, success/failure counts,
  source episodes), written by consolidation (:mod:`forge.team.consolidate`); their counts,
  hence ``rho`` and ``validation``, move only through :meth:`forge.engine.memory.Memory.record_use`;
- **transactive**: :attr:`Kind.PROFILE` units, "who knows what": one per agent (specialities by
  task type, per-partner collaboration success, reliability) and one per team pattern (task
  types it suits, average performance, communication overhead).

Each layer has its own place (:class:`MemoryLayout`): ``local`` pools are private units owned
by one agent, ``shared`` pools are ``group:<team>`` units, ``both`` writes and reads the two.
Reads go through :class:`~forge.model.Viewer` objects and scope filters, so isolation is
enforced inside the store's query, not by filtering results afterwards. Prompts are written
by :meth:`TeamMemory.recollect`, i.e. by :func:`forge.learn.prompt.recollect`, the one function that
puts memory into any FORGE prompt.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from forge.engine.memory import Memory
from forge.engine.recall import Weights
from forge.envs.base import EnvSpec
from forge.errors import ConfigError, NotFoundError, ValidationError
from forge.learn.loop import Trajectory, learn_from
from forge.learn.prompt import PROMPT_WEIGHTS, Recollection, recollect
from forge.learn.reflect import Reflection, RuleEdit
from forge.llm.base import LLM
from forge.model import (
    Context,
    Episode,
    Kind,
    Provenance,
    Rule,
    Scope,
    Status,
    Step,
    Unit,
    Viewer,
    derived_id,
)
from forge.store import Filter
from forge.team import lessons

__all__ = [
    "ACTOR_ROLE",
    "EPS",
    "LAYERS",
    "TEAM_SECTIONS",
    "TEAM_WEIGHTS",
    "Action",
    "MemoryLayout",
    "Outcome",
    "Procedure",
    "TaskLesson",
    "TaskRecord",
    "TeamMemory",
    "rho",
    "task_lesson",
]

#: Keeps ``rho`` defined for a procedure nobody has used yet.
EPS = 1e-6
LAYERS = ("episodic", "procedural", "transactive")
_MODES = ("local", "shared", "both")

#: The role name of team rules: every agent acts in the same env, so rules serve them all.
ACTOR_ROLE = "actor"

#: Team prompt sections, hierarchical as in LLMA-Mem: procedures first, then the rules
#: reflection wrote, then past tasks; the planner's "who knows what" last.
TEAM_SECTIONS: dict[str, frozenset[Kind]] = {
    "procedures": frozenset({Kind.PROCEDURE}),
    "rules": frozenset({Kind.RULE, Kind.LESSON}),
    "past tasks": frozenset({Kind.EPISODE}),
    "who knows what": frozenset({Kind.PROFILE}),
}

#: The engine's prompt weights without wall-clock recency: with a half-life of days it cannot
#: tell the tasks of one run apart, and it would make a resumed run's prompts depend on when
#: it was resumed. Order in time is already in the block (units in creation order).
TEAM_WEIGHTS: Weights = replace(PROMPT_WEIGHTS, recency=0.0)

_LAYER_KINDS: dict[str, tuple[Kind, ...]] = {
    "episodic": (Kind.EPISODE, Kind.RULE),
    "procedural": (Kind.PROCEDURE,),
    "transactive": (Kind.PROFILE,),
}

#: Importance of what a layer writes: a procedure generalises several successes, so it
#: outranks one successful episode of equal relevance; a failed episode ranks lowest.
PROCEDURE_IMPORTANCE = 1.0
SUCCESS_IMPORTANCE = 0.8
FAILURE_IMPORTANCE = 0.3


def rho(successes: int, failures: int) -> float:
    """A procedure's success rate ``s / (s + f + eps)`` as in the paper."""
    return successes / (successes + failures + EPS)


def smoothed(successes: int, failures: int) -> float:
    """The validation :meth:`Memory.record_use` gives these counts: ``(1 + s) / (2 + s + f)``."""
    return (1.0 + successes) / (2.0 + successes + failures)


@dataclass(frozen=True, slots=True)
class MemoryLayout:
    """Where each memory layer lives: ``local`` (per agent), ``shared`` (one team pool) or ``both``.

    The paper's three presets (:meth:`parse`): ``local`` = all local, ``shared`` = all shared,
    ``hybrid`` = local episodic and transactive + shared procedural and transactive, i.e.
    episodic local, procedural shared, transactive both.
    """

    episodic: str = "local"
    procedural: str = "local"
    transactive: str = "local"

    def __post_init__(self) -> None:
        for layer in LAYERS:
            if getattr(self, layer) not in _MODES:
                raise ConfigError(
                    f"{layer} memory layout {getattr(self, layer)!r} is unknown; use local, shared or both"
                )

    @classmethod
    def parse(cls, value: str | MemoryLayout) -> MemoryLayout:
        """``"local"``, ``"shared"``, ``"hybrid"`` or ``"episodic=local,procedural=shared,..."``."""
        if isinstance(value, MemoryLayout):
            return value
        text = str(value).strip()
        if text in _PRESETS:
            return _PRESETS[text]
        layers: dict[str, str] = {}
        for part in text.split(","):
            layer, sep, mode = part.partition("=")
            if not sep or layer.strip() not in LAYERS:
                raise ConfigError(
                    f"unknown memory layout {value!r}; use local, shared, hybrid or "
                    "'episodic=local,procedural=shared,transactive=both'"
                )
            layers[layer.strip()] = mode.strip()
        return cls(**layers)

    def __str__(self) -> str:
        for name, preset in _PRESETS.items():
            if preset == self:
                return name
        return ",".join(f"{layer}={getattr(self, layer)}" for layer in LAYERS)


_PRESETS = {
    "local": MemoryLayout("local", "local", "local"),
    "shared": MemoryLayout("shared", "shared", "shared"),
    "hybrid": MemoryLayout("local", "shared", "both"),
}


@dataclass(frozen=True, slots=True)
class Action:
    """One thing an agent did during a task (a tool call, an answer, a message)."""

    agent: str
    text: str
    role: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a task ended. ``per_agent`` says which agents' subtasks succeeded (transactive input);
    ``messages`` counts inter-agent messages (the communication overhead of the team pattern)."""

    success: bool
    score: float = 0.0
    metrics: Mapping[str, float] = field(default_factory=dict)
    errors: tuple[str, ...] = ()
    per_agent: Mapping[str, bool] = field(default_factory=dict)
    messages: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.score, bool) or not isinstance(self.score, int | float) or not math.isfinite(self.score):
            raise ValidationError(f"outcome score must be a finite number, got {self.score!r}")
        if not isinstance(self.messages, int) or self.messages < 0:
            raise ValidationError("outcome messages must be a non-negative integer")
        object.__setattr__(self, "errors", tuple(self.errors))

    def to_dict(self) -> dict[str, Any]:
        return {
            "success": self.success,
            "score": self.score,
            "metrics": dict(self.metrics),
            "errors": list(self.errors),
            "per_agent": dict(self.per_agent),
            "messages": self.messages,
        }


@dataclass(frozen=True, slots=True)
class TaskLesson:
    """What a finished task taught, as stored in its episode: lessons, and on failure a
    root-cause diagnosis. ``source`` says who wrote them: ``llm`` or ``fallback`` (reflection
    by :mod:`forge.learn.reflect`) or ``record`` (summarised from the trajectory's situations
    by :mod:`forge.team.lessons`). ``parts`` are a record lesson's situated parts, what
    consolidation composes procedures from; ``steps`` how many steps the task took (memory
    that helps shortens episodes); ``dropped`` the parts left out for naming something of
    this task only, and why."""

    lessons: tuple[str, ...]
    diagnosis: str | None
    source: str
    error: str = ""
    parts: tuple[str, ...] = ()
    steps: int | None = None
    dropped: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("lessons", "parts", "dropped"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "lessons": list(self.lessons), "diagnosis": self.diagnosis, "source": self.source, "error": self.error,
            "parts": list(self.parts), "steps": self.steps, "dropped": list(self.dropped),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskLesson:
        try:
            return cls(
                tuple(data["lessons"]), data.get("diagnosis"), str(data["source"]), str(data.get("error", "")),
                tuple(data.get("parts", ())), data.get("steps"), tuple(data.get("dropped", ())),
            )
        except (KeyError, TypeError):
            raise ValidationError("a task lesson must be {'lessons': [...], 'diagnosis': ..., 'source': ...}") from None


def task_lesson(
    reflection: Reflection | None,
    *,
    task: str,
    actions: Sequence[Action],
    outcome: Outcome,
    diagnosis: str | None = None,
    trajectory: Trajectory | None = None,
    spec: EnvSpec | None = None,
    at: int | None = None,
) -> TaskLesson:
    """The lesson of a task: the rules :mod:`forge.learn.reflect` wrote about its failure, or,
    for a success (or a failure reflection found no rule for), a record of it.

    With the ``trajectory`` and its env's ``spec``, the record is in the goal's and the
    situations' terms (:mod:`forge.team.lessons`): what was done in which kind of situation,
    never the moves of this one map or game, which mislead on the next; a failure's names
    its failing step (``at``, else the first below tau, else the last). Without them (a
    caller with no situations) it names the distinct actions used.
    """
    n = len(trajectory.actions) if trajectory is not None else len(actions)
    if reflection is not None:
        rules = [t for e in reflection.edits for t in e.texts]
        if rules:
            source = "fallback" if reflection.fallback else "llm"
            return TaskLesson(tuple(dict.fromkeys(rules))[:2], diagnosis, source, reflection.error, steps=n)
    head = f"For tasks like '{_clip(task, 80)}'"
    used = _clip("; ".join(dict.fromkeys(a.text for a in actions)) or "no actions", 200)
    steps = lessons.decisions(trajectory.observations, trajectory.actions, trajectory.rewards, spec) if trajectory else []
    error = reflection.error if reflection is not None else ""
    if outcome.success:
        if not steps:
            return TaskLesson((f"{head}, this worked in {_steps(n)}, using: {used}.",), None, "record", steps=n)
        parts, dropped = lessons.general(lessons.success_parts(steps), spec)
        text = f"{head}, this worked (solved in {_steps(n)}): {'; '.join(parts)}." if parts else f"{head}, this worked in {_steps(n)}."
        return TaskLesson((_clip(text, 400),), None, "record", error, tuple(parts), n, tuple(dropped))
    cause = diagnosis or (outcome.errors[0] if outcome.errors else f"score {outcome.score:g} was not enough to succeed")
    if not steps:
        lesson = f"{head}, this failed after {_steps(n)}, using: {used} (failed: {_clip(cause, 120)})."
        return TaskLesson((lesson,), cause, "record", error, steps=n)
    where = at if at is not None else trajectory.failing if trajectory and trajectory.failing is not None else len(steps) - 1
    parts, dropped = lessons.general(lessons.failure_parts(steps, where, tau=spec.tau if spec else None), spec)
    text = f"{head}, this failed after {_steps(n)}: {'; '.join(parts)}." if parts else f"{head}, this failed after {_steps(n)} ({_clip(cause, 120)})."
    return TaskLesson((_clip(text, 400),), cause, "record", error, tuple(parts), n, tuple(dropped))


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


@dataclass(frozen=True, slots=True)
class Procedure:
    """A read-only view of a procedure unit's track record.

    The counts are the unit's ``meta.successes``/``failures``: seeded by consolidation and
    then moved only by :meth:`forge.engine.memory.Memory.record_use`, which also keeps ``validation``
    (what recall boosts) in step with them. ``uses`` counts the tasks it was shown to.
    """

    id: str
    title: str
    knowledge: str
    successes: int
    failures: int
    sources: tuple[str, ...]
    uses: int
    validation: float
    scope: str

    @property
    def rho(self) -> float:
        return rho(self.successes, self.failures)

    @classmethod
    def of(cls, unit: Unit) -> Procedure:
        if unit.kind is not Kind.PROCEDURE:
            raise ValidationError(f"unit {unit.id} is a {unit.kind.value}, not a procedure")
        m = unit.meta
        return cls(
            id=unit.id,
            title=str(m.get("title", "")),
            knowledge=str(m.get("knowledge", unit.content)),
            successes=int(m.get("successes", 0)),
            failures=int(m.get("failures", 0)),
            sources=tuple(m.get("sources", ())),
            uses=int(m.get("uses", 0)),
            validation=unit.validation,
            scope=str(unit.scope),
        )


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """What :meth:`TeamMemory.record_task` wrote: episode and rule units per pool, the
    Episode record, the task's lesson, profiles, and the units credited with its outcome."""

    task_index: int
    episode_id: str
    episode_units: tuple[str, ...]
    rule_units: tuple[str, ...]
    lesson: TaskLesson
    profile_units: tuple[str, ...]
    credited: tuple[str, ...]


# -- the team's memory --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Pool:
    scope: Scope
    owner: str  # the agent for a private pool, "" for the team pool

    @property
    def key(self) -> str:
        return f"private:{self.owner}" if self.scope.kind == "private" else str(self.scope)


class TeamMemory:
    """The three memories of one team, each layer in its layout, over one :class:`Memory`.

    The runner calls :meth:`recollect` for every prompt (actors read procedures, rules and
    past tasks; the planner reads "who knows what"), :meth:`record_task` after every task
    (it writes all three layers and credits the units shown with the outcome), and a
    :class:`forge.team.consolidate.Consolidator` to turn episodes into procedures.
    Writes are serialised by a lock so consolidation may run on another thread.
    """

    def __init__(
        self,
        memory: Memory,
        *,
        team: str,
        agents: Sequence[str],
        layout: str | MemoryLayout = "local",
        llm: LLM | None = None,
        actor: str = "team",
    ) -> None:
        if not team or ":" in team:
            raise ValidationError("a team needs a non-empty name without ':'")
        agents = list(dict.fromkeys(agents))
        if not agents or not all(isinstance(a, str) and a for a in agents):
            raise ValidationError("a team needs at least one agent id")
        self.memory = memory
        self.team = team
        self.agents = tuple(agents)
        self.layout = MemoryLayout.parse(layout)
        self.llm = llm  # consolidation's default model
        self.actor = actor
        self.lock = threading.RLock()
        self._group = Scope("group", team)
        self._tasks = self._count_tasks()
        self._clock = 0.0

    # -- pools and viewers ----------------------------------------------------------------
    def viewer(self, agent: str) -> Viewer:
        """How ``agent`` reads: its own private units and the team group's, nothing else."""
        self._check_agent(agent)
        return Viewer.of(agent, groups=[self.team])

    def read_scopes(self, layer: str) -> frozenset[str]:
        """The scopes a layer is read from; the viewer narrows ``private`` to the reader's own."""
        mode = self._mode(layer)
        return frozenset(
            ({"private"} if mode in ("local", "both") else set())
            | ({str(self._group)} if mode in ("shared", "both") else set())
        )

    def layer_filter(self, layer: str, kind: Kind, *, status: Iterable[Status] | None = None) -> Filter:
        """The store filter for one layer of this team (kind, the layer's scopes, team tag)."""
        return Filter.make(kinds=[kind], scopes=self.read_scopes(layer), tags_all=[f"team:{self.team}"], status=status)

    def prompt_filter(self, layers: Sequence[str]) -> Filter:
        """What a prompt may hold from ``layers``: their kinds, in their scopes, of this team.

        Every layer is written only to its own pools, so the union of the layers' scopes
        reads each layer exactly where it lives.
        """
        kinds = [k for layer in layers for k in _LAYER_KINDS[self._layer(layer)]]
        scopes = frozenset().union(*(self.read_scopes(layer) for layer in layers))
        return Filter.make(kinds=kinds, scopes=scopes, tags_all=[f"team:{self.team}"])

    def pools(self, layer: str, *, agents: Iterable[str] | None = None) -> list[_Pool]:
        """Where a layer's writes for ``agents`` go: their private pools and/or the team pool."""
        mode = self._mode(layer)
        out: list[_Pool] = []
        if mode in ("local", "both"):
            out += [_Pool(Scope("private"), a) for a in (agents if agents is not None else self.agents)]
        if mode in ("shared", "both"):
            out.append(_Pool(self._group, ""))
        return out

    def pool_filter(self, pool: _Pool, kind: Kind, *, status: Iterable[Status] | None = None) -> Filter:
        """Exactly one pool's units of one kind (used with an operator viewer by system jobs)."""
        return Filter.make(
            kinds=[kind],
            scopes=[str(pool.scope)],
            owner=pool.owner if pool.scope.kind == "private" else None,
            tags_all=[f"team:{self.team}"],
            status=status,
        )

    def _layer(self, layer: str) -> str:
        if layer not in LAYERS:
            raise ValidationError(f"unknown memory layer {layer!r}; expected one of {', '.join(LAYERS)}")
        return layer

    def _mode(self, layer: str) -> str:
        return str(getattr(self.layout, self._layer(layer)))

    def _check_agent(self, agent: str) -> None:
        if agent not in self.agents:
            raise ValidationError(f"agent {agent!r} is not in team {self.team!r} ({', '.join(self.agents)})")

    def _count_tasks(self) -> int:
        seen = self.memory.list(
            viewer=Viewer.admin(),
            filter=Filter.make(kinds=[Kind.EPISODE], tags_all=[f"team:{self.team}"]),
            limit=1_000_000,
        )
        return len({u.meta.get("task_index") for u in seen})

    def stamp(self) -> float:
        """A creation time later than every unit this object wrote: units written in one
        batch get distinct, ordered times, so prompt order never depends on clock ties."""
        self._clock = max(time.time(), self._clock + 1e-3)
        return self._clock

    @property
    def tasks_recorded(self) -> int:
        """Tasks recorded so far (recovered from the store on open, so a resumed run continues)."""
        return self._tasks

    # -- prompts ----------------------------------------------------------------------------
    def recollect(
        self,
        agent: str,
        query: str,
        *,
        layers: Sequence[str] = ("procedural", "episodic"),
        budget: int = 300,
        role: str = ACTOR_ROLE,
        valid_actions: Sequence[str] = (),
        abstract: Callable[[str], str] | None = None,
    ) -> Recollection:
        """``agent``'s memory for ``query``, written by :func:`forge.learn.prompt.recollect`.

        Actors read procedures, rules and past tasks (the default ``layers``), the planner
        ``("transactive",)``. Recall ranks by relevance times what a unit has earned
        (validation from outcomes, importance), so a procedure with a better record wins
        the budget; sections put procedures first.
        """
        self._check_agent(agent)
        return recollect(
            self.memory,
            viewer=self.viewer(agent),
            query=query,
            role=role,
            budget=budget,
            filter=self.prompt_filter(layers),
            valid_actions=valid_actions,
            weights=TEAM_WEIGHTS,
            sections=TEAM_SECTIONS,
            abstract=abstract,
        )

    # -- episodic + everything a finished task updates ---------------------------------------
    def record_task(
        self,
        *,
        task: str,
        outcome: Outcome,
        actions: Sequence[Action] = (),
        team: Sequence[str] | None = None,
        task_type: str = "",
        env: str = "",
        lesson: TaskLesson | None = None,
        rules: Sequence[Rule | Mapping[str, Any] | str] = (),
        retire: Sequence[str] = (),
        used: Sequence[str] = (),
    ) -> TaskRecord:
        """Record a finished task in all three memories.

        Writes one episode per episodic pool with ``lesson`` (derived from the outcome when
        None), the ``rules`` reflection wrote as rule units in the same pools (a rule a pool
        already holds is not written twice), archives the ``retire`` rules reflection
        deleted, updates the transactive profiles of every pool, and credits the ``used``
        units (shown to the agents) with the outcome through :meth:`record_use`, all in one
        transaction: a failure part-way leaves nothing of the task written. Unit ids derive
        from the task, so a replayed task writes the same units.
        """
        if not task.strip():
            raise ValidationError("task text is empty")
        members = list(dict.fromkeys(team if team is not None else self.agents))
        for a in members:
            self._check_agent(a)
        for a in actions:
            self._check_agent(a.agent)
        roles = {a.agent: a.role for a in actions if a.role}
        lesson = lesson or task_lesson(None, task=task, actions=actions, outcome=outcome)
        pools = self.pools("episodic", agents=members)
        with self.lock:
            with self.memory.transaction():  # all of the task's writes, or none of them
                self._known(used)
                index = self._tasks + 1
                episode = Episode(
                    agent=",".join(members),
                    task=task,
                    env=env,
                    steps=tuple(Step(action=a.text, role=a.role or a.agent, info={"agent": a.agent}) for a in actions),
                    outcome=outcome.to_dict(),
                    meta={"team": self.team, "task_type": task_type, "task_index": index},
                )
                units = [
                    self._episode_unit(pool, episode, index, task, task_type, members, actions, outcome, lesson)
                    for pool in pools
                ]
                self.memory.add_episode(episode, actor=self.actor)
                ids = self.memory.add(units, actor=self.actor)
                ids += [u.id for u in self._remember_rules(pools, episode, index, env, task_type, rules, retire, lesson)]
                profiles = self._observe(members=members, roles=roles, task_type=task_type, outcome=outcome)
                credited = self.record_use(used, success=outcome.success) if used else []
            self._tasks = index  # counted once committed
        n = len(units)
        return TaskRecord(index, episode.id, tuple(ids[:n]), tuple(ids[n:]), lesson, tuple(profiles), tuple(credited))

    def _episode_unit(
        self,
        pool: _Pool,
        episode: Episode,
        index: int,
        task: str,
        task_type: str,
        members: list[str],
        actions: Sequence[Action],
        outcome: Outcome,
        lesson: TaskLesson,
    ) -> Unit:
        status = "success" if outcome.success else "failure"
        content = f"Task: {_clip(task, 400)}\nOutcome: {status} (score {outcome.score:g})\nLessons: " + " ".join(lesson.lessons)
        if lesson.diagnosis:
            content += f"\nDiagnosis: {lesson.diagnosis}"
        return Unit(
            id=derived_id("episode", "episode", self.team, index, pool.key),  # the kind is hashed too, as ids were
            content=content,
            kind=Kind.EPISODE,
            scope=pool.scope,
            owner=pool.owner,
            context=Context(domain=episode.env, task=task_type, tags=(f"team:{self.team}", "layer:episodic")),
            importance=SUCCESS_IMPORTANCE if outcome.success else FAILURE_IMPORTANCE,
            provenance=Provenance(source=f"team:{self.team}", episodes=(episode.id,)),
            created_at=self.stamp(),
            meta={
                "task": task,
                "task_type": task_type,
                "task_index": index,
                "team": members,
                "actions": [{"agent": a.agent, "role": a.role, "text": a.text} for a in actions],
                "outcome": outcome.to_dict(),
                "lessons": list(lesson.lessons),
                "lesson_parts": list(lesson.parts),  # what consolidation composes procedures from
                "lesson_steps": lesson.steps,
                "lesson_dropped": list(lesson.dropped),
                "diagnosis": lesson.diagnosis,
                "reflection": lesson.source,
                "episode_id": episode.id,
            },
        )

    def _remember_rules(
        self, pools: Sequence[_Pool], episode: Episode, index: int, env: str, task_type: str,
        rules: Sequence[Rule | Mapping[str, Any] | str], retire: Sequence[str], lesson: TaskLesson,
    ) -> list[Unit]:
        """Reflection's rules as units of every episodic pool, and the rules it deleted
        archived, through :func:`forge.learn.loop.learn_from` like every other
        learner. A rule a pool already holds is not written twice; ids derive from the task,
        so a replayed task writes the same units."""
        admin = Viewer.admin()
        deleted = [u for u in self.memory.get_many(list(dict.fromkeys(retire)), viewer=admin) if u.kind is Kind.RULE and u.status is Status.ACTIVE]
        # a run record holds each rule's typed record; one written before rules were typed, its text
        typed = list({r.text(): r for r in (_typed_rule(r) for r in rules) if r is not None}.values())
        out: list[Unit] = []
        for n, pool in enumerate(pools):
            have = {" ".join(u.content.lower().split()) for u in self.memory.list(viewer=admin, filter=self.pool_filter(pool, Kind.RULE), limit=1_000_000)}
            fresh = tuple(r for r in typed if " ".join(r.text().lower().split()) not in have)
            doomed = deleted if n == 0 else []  # the edit's deletions happen once, not per pool
            if not fresh and not doomed:
                continue
            reflection = Reflection(edits=(RuleEdit(ACTOR_ROLE, tuple(range(len(doomed))), fresh),), fallback=lesson.source == "fallback")

            def store(units: list[Unit], pool: _Pool = pool) -> list[Unit]:
                stamped = [
                    u.replace(id=derived_id("rule", "rule", self.team, index, pool.key, i), meta={**u.meta, "task_index": index})
                    for i, u in enumerate(units)
                ]
                self.memory.add(stamped, actor=self.actor)
                self._clock = max([self._clock, *(u.created_at for u in stamped)])
                return stamped

            applied = learn_from(
                self.memory, reflection, owner=pool.owner, actor=self.actor, shown={ACTOR_ROLE: doomed}, scope=pool.scope,
                viewer=admin, within=self.pool_filter(pool, Kind.RULE),
                context=Context(domain=env, task=task_type, tags=(f"team:{self.team}", "layer:episodic")),
                episodes=(episode.id,), now=self.stamp(), add=store,
            )
            out += applied.added
        return out

    def _known(self, unit_ids: Sequence[str]) -> None:
        ids = list(dict.fromkeys(unit_ids))
        found = {u.id for u in self.memory.get_many(ids, viewer=Viewer.admin())}
        missing = [i for i in ids if i not in found]
        if missing:
            raise NotFoundError(f"no memory unit with id {missing[0]}")

    # -- outcome credit ---------------------------------------------------------------------
    def record_use(self, unit_ids: Sequence[str], *, success: bool) -> list[str]:
        """Credit the units shown for a task with its outcome: :meth:`Memory.record_use`.

        That one function moves a procedure's counts (its ``rho``) and every unit's
        ``validation``. Unknown ids raise :class:`NotFoundError` before anything is written.
        """
        ids = list(dict.fromkeys(unit_ids))
        with self.lock:
            self._known(ids)
            self.memory.record_use(ids, success=success, actor=self.actor)
        return ids

    # -- procedural -------------------------------------------------------------------------
    def procedures(self, *, agent: str | None = None, include_archived: bool = False) -> list[Procedure]:
        """Procedures ``agent`` can read (all of the team's when None), oldest first."""
        viewer = self.viewer(agent) if agent is not None else Viewer.admin()
        status = list(Status) if include_archived else None
        f = self.layer_filter("procedural", Kind.PROCEDURE, status=status)
        return [Procedure.of(u) for u in self.memory.list(viewer=viewer, filter=f, limit=100_000)]

    # -- transactive ------------------------------------------------------------------------
    def _observe(self, *, members: list[str], roles: Mapping[str, str], task_type: str, outcome: Outcome) -> list[str]:
        """Update every transactive pool with one task: each member's profile and the pattern."""
        ttype = task_type or "general"
        written: list[str] = []
        for pool in self.pools("transactive", agents=members):
            for agent in members:
                ok = bool(outcome.per_agent.get(agent, outcome.success))

                def bump(meta: dict[str, Any], agent: str = agent, ok: bool = ok) -> None:
                    meta.setdefault("subject", agent)
                    _inc(meta.setdefault("specialities", {}), ttype, ok)
                    if roles.get(agent):
                        meta["role"] = roles[agent]
                    partners = meta.setdefault("partners", {})
                    for other in members:
                        if other != agent:
                            _inc(partners, other, outcome.success)
                    _inc(meta, "subtasks", ok)
                    sub = meta["subtasks"]
                    meta["reliability"] = round(rho(sub["s"], sub["f"]), 6)

                written.append(self._upsert_profile(pool, f"agent:{agent}", bump, _render_agent))
            key = "+".join(sorted(members))

            def bump_pattern(meta: dict[str, Any], key: str = key) -> None:
                meta.setdefault("members", key.split("+"))
                t = meta.setdefault("task_types", {}).setdefault(ttype, {"n": 0, "score": 0.0, "s": 0})
                t["n"] += 1
                t["score"] = round(t["score"] + outcome.score, 6)
                t["s"] += int(outcome.success)
                meta["tasks"] = int(meta.get("tasks", 0)) + 1
                meta["score_sum"] = round(float(meta.get("score_sum", 0.0)) + outcome.score, 6)
                meta["avg_performance"] = round(meta["score_sum"] / meta["tasks"], 6)
                meta["messages"] = int(meta.get("messages", 0)) + outcome.messages
                meta["overhead"] = round(meta["messages"] / meta["tasks"], 6)

            written.append(self._upsert_profile(pool, f"pattern:{key}", bump_pattern, _render_pattern))
        return written

    def _upsert_profile(self, pool: _Pool, subject: str, bump: Any, render: Any) -> str:
        uid = f"profile:{self.team}:{pool.key}:{subject}"[:128]
        try:
            old: Unit | None = self.memory.get(uid, viewer=Viewer.admin())
        except NotFoundError:
            old = None
        meta: dict[str, Any] = _deep(dict(old.meta)) if old else {"profile": subject.split(":", 1)[0]}
        bump(meta)
        content = render(meta)
        if self.layout.transactive == "both":  # the reader sees both pools: say whose notes
            content += " [own notes]" if pool.scope.kind == "private" else " [team notes]"
        if old is None:
            unit = Unit(
                id=uid,
                content=content,
                kind=Kind.PROFILE,
                scope=pool.scope,
                owner=pool.owner,
                context=Context(tags=(f"team:{self.team}", "layer:transactive", subject)),
                created_at=self.stamp(),
                meta=meta,
            )
            self.memory.add(unit, actor=self.actor)
        else:
            self.memory.update(old.replace(content=content, meta=meta), actor=self.actor)
        return uid

    def profiles(self, *, agent: str | None = None) -> list[Unit]:
        """Transactive units ``agent`` can read (the team's all when None)."""
        viewer = self.viewer(agent) if agent is not None else Viewer.admin()
        f = self.layer_filter("transactive", Kind.PROFILE)
        return self.memory.list(viewer=viewer, filter=f, limit=100_000)


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _inc(table: dict[str, Any], key: str, ok: bool) -> None:
    entry = table.setdefault(key, {"s": 0, "f": 0})
    entry["s" if ok else "f"] += 1


def _deep(meta: dict[str, Any]) -> dict[str, Any]:
    import copy

    return copy.deepcopy(meta)


def _render_agent(meta: Mapping[str, Any]) -> str:
    sub = meta.get("subtasks", {"s": 0, "f": 0})
    specs = sorted(meta.get("specialities", {}).items(), key=lambda kv: (-rho(kv[1]["s"], kv[1]["f"]), -kv[1]["s"], kv[0]))
    partners = sorted(meta.get("partners", {}).items(), key=lambda kv: (-rho(kv[1]["s"], kv[1]["f"]), kv[0]))
    text = f"{meta['subject']}"
    if meta.get("role"):
        text += f" ({meta['role']})"
    text += f": reliability {meta.get('reliability', 0.0):.2f} ({sub['s']}/{sub['s'] + sub['f']} subtasks)"
    if specs:
        text += "; good at: " + ", ".join(f"{k} {v['s']}/{v['s'] + v['f']}" for k, v in specs[:5])
    if partners:
        text += "; with partners: " + ", ".join(f"{k} {v['s']}/{v['s'] + v['f']}" for k, v in partners[:5])
    return text


def _render_pattern(meta: Mapping[str, Any]) -> str:
    types = sorted(
        meta.get("task_types", {}).items(), key=lambda kv: (-kv[1]["score"] / max(kv[1]["n"], 1), kv[0])
    )
    suits = ", ".join(f"{k} (avg {v['score'] / max(v['n'], 1):.2f} over {v['n']})" for k, v in types[:5])
    return (
        f"{'+'.join(meta['members'])}: suits {suits}; average performance "
        f"{meta.get('avg_performance', 0.0):.2f} over {meta.get('tasks', 0)} tasks; "
        f"overhead {meta.get('overhead', 0.0):.1f} messages/task"
    )


def _typed_rule(rule: Rule | Mapping[str, Any] | str) -> Rule | None:
    """A rule as a run record or a caller hands it: its typed record, or (a record written
    before rules were typed) its text read once."""
    if isinstance(rule, Rule):
        return rule
    if isinstance(rule, Mapping):
        return Rule.from_dict(rule)
    try:
        return RuleEdit(ACTOR_ROLE, (), (rule,)).add[0]
    except ValidationError:
        return None
