"""The three memories of a lifelong team (LLMA-Mem, arXiv 2604.03295) as units of the engine.

- **episodic**: one :attr:`Kind.EPISODE` unit per task and pool (team, actions, outcome with
  metrics and errors, 1-2 LLM-written lessons, a root-cause diagnosis on failure), backed by
  an :class:`~forge.model.Episode` record holding the actions as steps;
- **procedural**: :attr:`Kind.PROCEDURE` units (title, knowledge, success/failure counts,
  ``rho = s / (s + f + eps)``, source episodes; times viewed is the unit's ``access_count``),
  written by consolidation (:mod:`forge.team.consolidate`) and scored by :meth:`TeamMemory.record_use`;
- **transactive**: :attr:`Kind.PROFILE` units, "who knows what": one per agent (specialities by
  task type, per-partner collaboration success, reliability) and one per team pattern (task
  types it suits, average performance, communication overhead), rendered for the planner by
  :meth:`TeamMemory.render_transactive`.

Each layer has its own topology (:class:`Topology`): ``local`` pools are private units owned
by one agent, ``shared`` pools are ``group:<team>`` units, ``both`` writes and reads the two.
Reads go through :class:`~forge.model.Viewer` objects and scope filters, so isolation is
enforced inside the store's query, not by filtering results afterwards.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from forge.errors import ConfigError, LLMError, NotFoundError, ValidationError
from forge.llm.base import LLM
from forge.llm.structured import complete_json
from forge.memory import Memory
from forge.model import Context, Episode, Kind, Provenance, Scope, Status, Step, Unit, Viewer
from forge.recall import approx_tokens
from forge.store.base import Filter

__all__ = [
    "EPS",
    "LAYERS",
    "Action",
    "Outcome",
    "Procedure",
    "Reflection",
    "TaskRecord",
    "TeamMemory",
    "Topology",
    "rho",
    "write_reflection",
]

#: Keeps ``rho`` defined for a procedure nobody has used yet.
EPS = 1e-6
LAYERS = ("episodic", "procedural", "transactive")
_MODES = ("local", "shared", "both")


def rho(successes: int, failures: int) -> float:
    """A procedure's success rate ``s / (s + f + eps)`` as in the paper."""
    return successes / (successes + failures + EPS)


@dataclass(frozen=True, slots=True)
class Topology:
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
                    f"{layer} topology {getattr(self, layer)!r} is unknown; use local, shared or both"
                )

    @classmethod
    def parse(cls, value: str | Topology) -> Topology:
        """``"local"``, ``"shared"``, ``"hybrid"`` or ``"episodic=local,procedural=shared,..."``."""
        if isinstance(value, Topology):
            return value
        text = str(value).strip()
        if text in _PRESETS:
            return _PRESETS[text]
        layers: dict[str, str] = {}
        for part in text.split(","):
            layer, sep, mode = part.partition("=")
            if not sep or layer.strip() not in LAYERS:
                raise ConfigError(
                    f"unknown topology {value!r}; use local, shared, hybrid or "
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
    "local": Topology("local", "local", "local"),
    "shared": Topology("shared", "shared", "shared"),
    "hybrid": Topology("local", "shared", "both"),
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
class Reflection:
    """Lessons (1-2) and, on failure, a root-cause diagnosis; ``source`` says who wrote them."""

    lessons: tuple[str, ...]
    diagnosis: str | None
    source: str  # "llm" or "fallback"
    error: str = ""  # why the fallback was used


@dataclass(frozen=True, slots=True)
class Procedure:
    """A read-only view of a procedure unit's track record."""

    id: str
    title: str
    knowledge: str
    successes: int
    failures: int
    sources: tuple[str, ...]
    views: int
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
            views=unit.access_count,
            scope=str(unit.scope),
        )


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """What :meth:`TeamMemory.record_task` wrote: episode units per pool, the Episode record,
    the reflections (per agent for local pools, ``"team"`` for the shared one) and profiles."""

    task_index: int
    episode_id: str
    episode_units: tuple[str, ...]
    reflections: Mapping[str, Reflection]
    profile_units: tuple[str, ...]
    procedures_updated: tuple[str, ...]


# -- reflection ---------------------------------------------------------------------------

_REFLECTION_SCHEMA = {
    "type": "object",
    "properties": {
        "lessons": {
            "type": "array",
            "items": {"type": "string", "minLength": 8},
            "minItems": 1,
            "maxItems": 2,
        },
        "diagnosis": {"type": "string"},
    },
    "required": ["lessons", "diagnosis"],
}


def write_reflection(
    llm: LLM | None,
    *,
    task: str,
    actions: Sequence[Action],
    outcome: Outcome,
    role: str = "",
    retries: int = 1,
) -> Reflection:
    """Ask ``llm`` for 1-2 lessons and (on failure) a root cause; fall back deterministically.

    The fallback keeps the loop going with a weak or absent model: a lesson built from the
    task, outcome and last actions, and the first error as the diagnosis. It is used when
    ``llm`` is None, fails, or answers with nothing usable.
    """
    error = "no LLM configured"
    if llm is not None:
        shown = "\n".join(f"- {a.agent}{f' ({a.role})' if a.role else ''}: {a.text}" for a in actions[-20:])
        prompt = (
            f"Task: {task}\nActions:\n{shown or '- (none)'}\n"
            f"Outcome: {'success' if outcome.success else 'failure'} (score {outcome.score:g})\n"
            + (f"Errors: {'; '.join(outcome.errors)}\n" if outcome.errors else "")
            + (f"You are the {role}. " if role else "")
            + "Write 1-2 short, reusable lessons for similar future tasks."
            + (" Also give the root cause of the failure as 'diagnosis'." if not outcome.success else " Set 'diagnosis' to an empty string.")
        )
        try:
            value = complete_json(llm, prompt, schema=_REFLECTION_SCHEMA, retries=retries)
        except LLMError as exc:
            error = f"LLM failed: {exc}"
        else:
            lessons = tuple(dict.fromkeys(s.strip() for s in value["lessons"] if s.strip()))
            diagnosis = value["diagnosis"].strip() or None
            if lessons and (outcome.success or diagnosis):
                return Reflection(lessons[:2], None if outcome.success else diagnosis, "llm")
            error = "LLM gave no usable lesson" if not lessons else "LLM gave no diagnosis for a failure"
    return _fallback_reflection(task=task, actions=actions, outcome=outcome, error=error)


def _fallback_reflection(*, task: str, actions: Sequence[Action], outcome: Outcome, error: str) -> Reflection:
    steps = "; ".join(a.text for a in actions[-3:]) or "no actions"
    if outcome.success:
        lesson = f"For tasks like '{_clip(task, 80)}', this worked: {_clip(steps, 200)}."
        return Reflection((lesson,), None, "fallback", error)
    cause = outcome.errors[0] if outcome.errors else f"score {outcome.score:g} was not enough to succeed"
    lesson = f"For tasks like '{_clip(task, 80)}', avoid repeating: {_clip(steps, 200)} (failed: {_clip(cause, 120)})."
    return Reflection((lesson,), cause, "fallback", error)


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


# -- the team's memory --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Pool:
    scope: Scope
    owner: str  # the agent for a private pool, "" for the team pool

    @property
    def key(self) -> str:
        return f"private:{self.owner}" if self.scope.kind == "private" else str(self.scope)


class TeamMemory:
    """The three memories of one team, each layer in its topology, over one :class:`Memory`.

    The runner calls :meth:`record_task` after every task (it writes all three layers and
    scores the procedures the task used), :func:`forge.team.retrieve.retrieve` before an
    agent acts, :meth:`render_transactive` for the planner, and a
    :class:`forge.team.consolidate.Consolidator` to turn episodes into procedures.
    Writes are serialised by a lock so consolidation may run on another thread.
    """

    def __init__(
        self,
        memory: Memory,
        *,
        team: str,
        agents: Sequence[str],
        topology: str | Topology = "local",
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
        self.topology = Topology.parse(topology)
        self.llm = llm
        self.actor = actor
        self.lock = threading.RLock()
        self._group = Scope("group", team)
        self._tasks = self._count_tasks()

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

    def _mode(self, layer: str) -> str:
        if layer not in LAYERS:
            raise ValidationError(f"unknown memory layer {layer!r}; expected one of {', '.join(LAYERS)}")
        return getattr(self.topology, layer)

    def _check_agent(self, agent: str) -> None:
        if agent not in self.agents:
            raise ValidationError(f"agent {agent!r} is not in team {self.team!r} ({', '.join(self.agents)})")

    def _count_tasks(self) -> int:
        seen = self.memory.store.list(
            viewer=Viewer.admin(),
            filter=Filter.make(kinds=[Kind.EPISODE], tags_all=[f"team:{self.team}"]),
            limit=1_000_000,
        )
        return len({u.meta.get("task_index") for u in seen})

    @property
    def tasks_recorded(self) -> int:
        """Tasks recorded so far (recovered from the store on open, so a resumed run continues)."""
        return self._tasks

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
        used_procedures: Sequence[str] = (),
        reflections: Mapping[str, Reflection] | None = None,
    ) -> TaskRecord:
        """Record a finished task in all three memories.

        Writes one episode per episodic pool (each local agent reflects on its own part; the
        shared pool gets one team reflection), updates the transactive profiles of every
        pool, and adds the outcome to the counts of ``used_procedures``. ``reflections``
        (keyed by agent or ``"team"``) skips the LLM, e.g. when resuming.
        """
        if not task.strip():
            raise ValidationError("task text is empty")
        members = list(dict.fromkeys(team if team is not None else self.agents))
        for a in members:
            self._check_agent(a)
        for a in actions:
            self._check_agent(a.agent)
        roles = {a.agent: a.role for a in actions if a.role}
        given = dict(reflections or {})
        pools = self.pools("episodic", agents=members)
        written: dict[str, Reflection] = {}
        for pool in pools:  # LLM calls stay outside the lock: consolidation may be writing
            who = pool.owner or "team"
            written[who] = given.get(who) or write_reflection(
                self.llm,
                task=task,
                actions=[a for a in actions if not pool.owner or a.agent == pool.owner] or list(actions),
                outcome=outcome,
                role=roles.get(pool.owner, "") if pool.owner else "",
            )
        with self.lock:
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
                self._episode_unit(pool, episode, index, task, task_type, members, actions, outcome, written[pool.owner or "team"])
                for pool in pools
            ]
            self.memory.store.add_episode(episode, actor=self.actor)
            vectors = self.memory.embed([u.text for u in units])
            ids = self.memory.store.add(units, vectors, actor=self.actor)
            profiles = self._observe(members=members, roles=roles, task_type=task_type, outcome=outcome)
            updated = self.record_use(used_procedures, success=outcome.success) if used_procedures else []
            self._tasks = index
        return TaskRecord(index, episode.id, tuple(ids), written, tuple(profiles), tuple(updated))

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
        refl: Reflection,
    ) -> Unit:
        status = "success" if outcome.success else "failure"
        content = f"Task: {_clip(task, 400)}\nOutcome: {status} (score {outcome.score:g})\nLessons: " + " ".join(refl.lessons)
        if refl.diagnosis:
            content += f"\nDiagnosis: {refl.diagnosis}"
        return Unit(
            content=content,
            kind=Kind.EPISODE,
            scope=pool.scope,
            owner=pool.owner,
            context=Context(domain=episode.env, task=task_type, tags=(f"team:{self.team}", "layer:episodic")),
            importance=1.0 if outcome.success else 0.3,
            provenance=Provenance(source=f"team:{self.team}", episodes=(episode.id,)),
            meta={
                "task": task,
                "task_type": task_type,
                "task_index": index,
                "team": members,
                "actions": [{"agent": a.agent, "role": a.role, "text": a.text} for a in actions],
                "outcome": outcome.to_dict(),
                "lessons": list(refl.lessons),
                "diagnosis": refl.diagnosis,
                "reflection": refl.source,
                "episode_id": episode.id,
            },
        )

    # -- procedural -------------------------------------------------------------------------
    def procedures(self, *, agent: str | None = None, include_archived: bool = False) -> list[Procedure]:
        """Procedures ``agent`` can read (all of the team's when None), oldest first."""
        viewer = self.viewer(agent) if agent is not None else Viewer.admin()
        status = list(Status) if include_archived else None
        f = self.layer_filter("procedural", Kind.PROCEDURE, status=status)
        return [Procedure.of(u) for u in self.memory.store.list(viewer=viewer, filter=f, limit=100_000)]

    def record_use(self, procedure_ids: Sequence[str], *, success: bool) -> list[str]:
        """Add a task's outcome to the counts of every procedure it used; returns those updated.

        Unknown ids raise :class:`NotFoundError` before anything is written.
        """
        ids = list(dict.fromkeys(procedure_ids))
        with self.lock:
            units = {u.id: u for u in self.memory.store.get_many(ids, viewer=Viewer.admin())}
            missing = [i for i in ids if i not in units or units[i].kind is not Kind.PROCEDURE]
            if missing:
                raise NotFoundError(f"no procedure with id {missing[0]}")
            for i in ids:
                u = units[i]
                s = int(u.meta.get("successes", 0)) + (1 if success else 0)
                f = int(u.meta.get("failures", 0)) + (0 if success else 1)
                meta = {**u.meta, "successes": s, "failures": f, "rho": round(rho(s, f), 6)}
                self.memory.store.update(u.replace(meta=meta, validation=min(1.0, rho(s, f))), actor=self.actor)
        return ids

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
            old: Unit | None = self.memory.store.get(uid, viewer=Viewer.admin())
        except NotFoundError:
            old = None
        meta: dict[str, Any] = _deep(dict(old.meta)) if old else {"profile": subject.split(":", 1)[0]}
        bump(meta)
        content = render(meta)
        if old is None:
            unit = Unit(
                id=uid,
                content=content,
                kind=Kind.PROFILE,
                scope=pool.scope,
                owner=pool.owner,
                context=Context(tags=(f"team:{self.team}", "layer:transactive", subject)),
                meta=meta,
            )
            self.memory.store.add([unit], self.memory.embed([unit.text]), actor=self.actor)
        else:
            new = old.replace(content=content, meta=meta)
            self.memory.store.update(new, self.memory.embed([new.text]), actor=self.actor)
        return uid

    def profiles(self, *, agent: str | None = None) -> list[Unit]:
        """Transactive units ``agent`` can read (the team's all when None)."""
        viewer = self.viewer(agent) if agent is not None else Viewer.admin()
        f = self.layer_filter("transactive", Kind.PROFILE)
        return self.memory.store.list(viewer=viewer, filter=f, limit=100_000)

    def render_transactive(self, *, agent: str, budget: int | None = None) -> str:
        """The "who knows what" block the planner ``agent`` reads to allocate subtasks.

        Lists agent profiles, then team patterns, from the pools ``agent`` may read (in
        ``both`` mode its own notes and the team's, labelled). Lines past ``budget`` tokens
        (:func:`~forge.recall.approx_tokens`) are left out, whole.
        """
        units = self.profiles(agent=agent)
        if not units:
            return ""
        both = self.topology.transactive == "both"
        lines = [f"## Who knows what (team {self.team})"]
        for kind, title in (("agent", "Agents:"), ("pattern", "Team patterns:")):
            chosen = [u for u in units if u.meta.get("profile") == kind]
            if not chosen:
                continue
            lines.append(title)
            for u in sorted(chosen, key=lambda u: (str(u.scope), u.content)):
                label = (" [own notes]" if u.scope.kind == "private" else " [team notes]") if both else ""
                lines.append(f"- {u.content}{label}")
        if budget is None:
            return "\n".join(lines)
        if budget <= 0:
            raise ValidationError("budget must be positive")
        out, used = [], 0
        for line in lines:
            cost = approx_tokens(line)
            if used + cost > budget:
                if line.startswith("-"):
                    continue
                break
            out.append(line)
            used += cost
        return "\n".join(out)


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
