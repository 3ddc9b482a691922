"""The agent loop: observe, recall, act, record; and on failure, reflect into new units.

Every place that plays episodes (the evolution protocols' workers, :class:`~forge.population.agent.Agent`
and the swarm built on it, the team runner) uses :func:`play_episode` and :func:`reflect_on`,
so memory reaches prompts one way and failures become memory one way.

Memory is recalled once per episode and role (:class:`Recaller`), so the prompt prefix is
stable across steps; each step records which units were shown and which named its exact
situation, and :attr:`Trajectory.used` hands them to :meth:`forge.engine.memory.Memory.record_use`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from forge.curate.exposure import Exposure
from forge.engine.port import MemoryPort, Recalling
from forge.engine.recall import Weights
from forge.envs.base import Env, EnvSpec, StepResult
from forge.envs.situation import situation_of
from forge.errors import ForgeError, NotFoundError, ValidationError
from forge.learn.policy import ANALYST_TOOLS, Policy
from forge.learn.prompt import PROMPT_SECTIONS, PROMPT_WEIGHTS, Recollection, empty, recollect
from forge.learn.reflect import (
    Alternatives,
    Applied,
    Reflection,
    Snapshot,
    apply_reflection,
    fallback_reflection,
    probe_alternatives,
    reflect,
    replay_to,
    stall_step,
)
from forge.llm.base import LLM
from forge.model import Context, Kind, Scope, Status, Step, Unit, Viewer
from forge.store.base import Filter

__all__ = ["Caps", "Recaller", "Trajectory", "failure_point", "learn_from", "play_episode", "reflect_on", "retire_failing"]

RETIRE_AFTER = 6
"""Uses after which a rule that keeps failing is retired (see :func:`retire_failing`)."""
RETIRE_BELOW = 0.15
"""The validation (smoothed success rate) under which it is: 0 of 6 uses gives 0.125."""

RETIRED_KINDS = frozenset({Kind.RULE, Kind.LESSON})
"""What credit retires when it keeps failing: advice an agent acts on (facts are not judged by outcomes)."""

SITUATION_K = 8
"""Rules recalled for each new situation of an episode (beside the episode's first recall)."""

BLAME_BACK = 3
"""How many steps before a dead end reflection may look for the step to blame."""

RecallFn = Callable[[str, str], Recollection]
"""``recall(role, query) -> Recollection``: how a loop asks for memory."""


@dataclass(slots=True)
class Trajectory:
    """One episode as played: every role's steps, env rewards, where it failed, and which
    memory units were shown (``shown``) or named the situation of a step (``now``)."""

    steps: list[Step] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)  # before each action
    rewards: list[float] = field(default_factory=list)
    failing: int | None = None  # first env step index whose reward fell below tau
    aborted: bool = False  # cut off there (play_episode with abort): never a success
    done: bool = False
    recollections: dict[str, Recollection] = field(default_factory=dict)
    now: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return float(sum(self.rewards))

    @property
    def rule_record(self) -> dict[str, int]:
        """Of the acting decisions: how many, how many had a rule for their situation in
        front of the model, and how many of those followed it (what transfer is read from)."""
        acting = [s.info for s in self.steps if "rule_shown" in s.info]
        shown = [i for i in acting if i["rule_shown"] or i.get("rule_followed") is not None]
        return {
            "decisions": len(acting),
            "rule_shown": len(shown),
            "rule_followed": sum(1 for i in shown if i.get("rule_followed")),
        }

    @property
    def used(self) -> list[str]:
        """Units that were in front of the model during this episode, once each."""
        ids = [i for r in self.recollections.values() for i in r.ids]
        return list(dict.fromkeys([*ids, *self.now]))


class Recaller:
    """Recall from a :class:`~forge.engine.memory.Memory` as one agent, for one policy's roles.

    ``exposure`` (:class:`~forge.curate.exposure.Exposure`: warm-up, gradual enablement,
    isolation) hides what the agent may not read yet given ``episodes``, its experience so
    far; the caller keeps ``episodes`` current. Without it, prompts are as they always were.
    ``valid_actions`` may be the env's bound method, read when memory is recalled (after the
    episode's reset), since some envs have no actions before one.
    """

    def __init__(
        self,
        memory: MemoryPort,
        viewer: Viewer,
        *,
        budget: int = 600,
        filter: Filter = Filter(),
        weights: Weights = PROMPT_WEIGHTS,
        valid_actions: Sequence[str] | Callable[[], Sequence[str]] = (),
        exposure: Exposure | None = None,
        episodes: int = 0,
        abstract: Callable[[str], str] | None = None,
    ) -> None:
        self.memory = memory
        self.viewer = viewer
        self.budget = budget
        self.filter = filter
        self.weights = weights
        # An env's bound ``valid_actions`` is read at recall time, after the episode's reset:
        # CAGE-2's actions exist only then (asking before a reset is an error there).
        self.valid_actions = valid_actions if callable(valid_actions) else tuple(valid_actions)
        self.exposure = exposure
        self.episodes = episodes
        self.abstract = abstract  # the env's: rules may name actions by their kind

    def __call__(self, role: str, query: str) -> Recollection:
        memory: Recalling = self.memory
        gated: dict[str, Any] = {}  # only a gated recall names its sections: the default stays recollect's
        if self.exposure is not None and not self.exposure.open:
            memory = self.exposure.view(self.memory, agent=self.viewer.agent or "", episodes=self.episodes)
            gated = {"sections": self.exposure.sections(PROMPT_SECTIONS, episodes=self.episodes)}
        rec = recollect(
            memory,
            viewer=self.viewer,
            query=query,
            role=role,
            budget=self.budget,
            filter=self.filter,
            weights=self.weights,
            valid_actions=self.valid_actions() if callable(self.valid_actions) else self.valid_actions,
            abstract=self.abstract,
            **gated,
        )
        wanted = frozenset({Kind.RULE, Kind.LESSON})
        rules = dataclasses.replace(self.filter, kinds=(self.filter.kinds & wanted) if self.filter.kinds else wanted)

        def lookup(situation: str) -> list[Any]:
            """The engine's hybrid recall for a situation met mid-episode, as this viewer."""
            found = memory.recall(situation, viewer=self.viewer, k=SITUATION_K, filter=rules, weights=self.weights, touch=False)
            return [r for r in found if not r.unit.context.role or r.unit.context.role == role]

        return dataclasses.replace(rec, lookup=lookup)


def no_memory(role: str, query: str) -> Recollection:
    """The recaller of an agent without memory (zero-shot)."""
    return empty(role)


def play_episode(
    env: Env,
    policy: Policy,
    recall: RecallFn | None,
    *,
    seed: int,
    tau: float,
    abort: bool,
    max_steps: int | None = None,
    on_step: Callable[[int, str, StepResult], None] | None = None,
) -> Trajectory:
    """Play one episode from step 0 with ``seed``; with ``abort`` stop at the first reward < tau.

    Memory is recalled once, for the task and the first situation, per role. ``on_step`` is
    told each step's index, action and result as it happens (a team policy ends a subtask on
    a violation; a runner reports progress).
    """
    traj = Trajectory()
    obs = env.reset(seed=seed)
    recall = recall or no_memory
    query = f"{env.spec.name}: {situation_of(obs, env.spec)}"
    traj.recollections = {role: recall(role, query) for role in policy.roles}
    for _ in range(max_steps or env.spec.max_steps):
        situation = situation_of(obs, env.spec)
        choice = policy.act(observation=obs, valid_actions=list(env.valid_actions()), history=traj.actions, memory=traj.recollections)
        result = env.step(choice.action)
        t = len(traj.actions)
        if on_step is not None:
            on_step(t, choice.action, result)
        traj.observations.append(obs)
        traj.actions.append(choice.action)
        traj.rewards.append(float(result.reward))
        traj.now.extend(i for i in choice.now if i not in traj.now)
        for s in choice.steps:
            info: dict[str, Any] = {"t": t}
            reward = 0.0
            if s.role in policy.acting_roles[:1]:
                reward = float(result.reward)
                info.update(
                    event=result.info.get("event", ""), shown=list(choice.shown), now=list(choice.now),
                    situation=situation, rule_shown=bool(choice.now), rule_followed=choice.followed,
                )
            traj.steps.append(Step(observation=s.observation, thought=s.thought, action=s.action, reward=reward, role=s.role, info=info))
        obs = result.observation
        if result.reward < tau and traj.failing is None:
            traj.failing = t
            if abort:
                traj.aborted = True
                break
        if result.done:
            traj.done = True
            break
    return traj


def failure_point(traj: Trajectory, *, spec: EnvSpec, reflect_on_stall: bool) -> tuple[int, bool] | None:
    """Where to reflect: ``(step, stalled)`` for the first step below tau, or, in an
    unsuccessful episode that never fell (a stall), for the first step back to a situation
    already seen (:func:`~forge.learn.reflect.stall_step`); None after a success.

    A stall is read in the env's own situations (``spec.situation``), never left to the
    caller: the team runner passed none, so the observation's summary stood in, the goal's
    way was not recognised, and every failed TextWorld task was blamed on its first step
    along the goal's route."""
    if traj.failing is not None:
        return traj.failing, False
    if reflect_on_stall and traj.actions and not spec.succeeded(traj.total, aborted=traj.aborted):
        return stall_step(traj.observations, traj.actions, situation=spec.situation), True
    return None


def reflect_on(
    traj: Trajectory,
    *,
    env: Env,
    roles: Sequence[str],
    acting_roles: Sequence[str],
    llm: LLM | None,
    seed: int,
    tau: float,
    at: int,
    stalled: bool,
    representation: str = "rules",
    probe_alternatives: bool = True,
    style: str = "slots",
) -> Reflection:
    """Reflect on the attempt failing at step ``at``: ground the failure by replaying the
    seeded episode (which other actions were safe), then ask ``llm``; no LLM, or one that
    fails outright, gives the trajectory-derived fallback, recorded as such."""
    probe = Alternatives()
    if probe_alternatives:
        at, probe = _blame(traj, env=env, seed=seed, tau=tau, at=at, stalled=stalled)
    shown: Mapping[str, Sequence[Any]] = {role: r.shown for role, r in traj.recollections.items()}
    _replay(env, seed=seed, actions=traj.actions[:at])
    snapshot = Snapshot.of(
        traj, env=env, failing=at, roles=roles, acting_roles=acting_roles,
        shown=shown, tau=tau, stalled=stalled, safe_actions=probe.safe, won_actions=probe.won, known_names=ANALYST_TOOLS,
    )
    if llm is None:
        return fallback_reflection(snapshot, representation=representation, error="no LLM")
    try:
        return reflect(llm, snapshot, representation=representation, style=style)
    except ForgeError as exc:  # anything the LLM layer raises: keep learning anyway
        return fallback_reflection(snapshot, representation=representation, error=str(exc))


@dataclass(frozen=True, slots=True)
class Caps:
    """How many active rules and examples one learner's memory holds per role (the newest
    are kept; the evicted are archived with the reason, never erased)."""

    rules: int = 100
    examples: int = 50

    def __post_init__(self) -> None:
        for name in ("rules", "examples"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValidationError(f"caps.{name} must be a non-negative integer, got {v!r}")


LEARNED_KINDS = frozenset({Kind.RULE, Kind.EXAMPLE})
"""What a reflection writes and the caps count."""


def learn_from(
    memory: MemoryPort,
    reflection: Reflection,
    *,
    owner: str,
    actor: str,
    shown: Mapping[str, Sequence[Unit]],
    context: Context = Context(),
    scope: Scope | str = "private",
    viewer: Viewer | None = None,
    within: Filter = Filter(),
    caps: Caps = Caps(),
    episodes: Sequence[str] = (),
    stage: int = 0,
    now: float | None = None,
    valid_actions: Sequence[str] = (),
    add: Callable[[list[Unit]], Sequence[Unit]] | None = None,
) -> Applied:
    """Turn a reflection into memory: the one learning function every learner calls (the
    protocols, :class:`~forge.population.agent.Agent`, the team, and ``learn(trace, outcome)``).

    The learner's memory is its own active rules and examples (owned by ``owner``, or as
    ``within`` narrows them: a team pool), as ``viewer`` (default ``owner``) sees them; this
    function reads it itself, so a peer's units are never retired or evicted by it, and
    every caller gets the same semantics: the reflection's deletes (by index among the
    rules ``shown`` to each role) are archived; each new rule retires the active rules it
    contradicts (typed records compared; ``valid_actions`` reads units stored before rules
    were typed); ``caps`` evict the oldest per role; every removal is archived with its
    reason, never erased. New units are owned by ``owner`` in ``scope`` with provenance
    ``reflection`` from ``episodes``; ``add`` stores them when the caller has its own way (an
    agent's admission and broadcast, a team's derived ids), else ``memory.add``. Returns what
    changed, with ``added`` as stored.
    """
    kinds = (within.kinds & LEARNED_KINDS) if within.kinds else LEARNED_KINDS
    mine = within.owner if within.owner is not None else owner
    holding = dataclasses.replace(within, kinds=kinds, owner=mine, status=frozenset({Status.ACTIVE}))
    active = memory.list(viewer=viewer or Viewer.of(owner), filter=holding, limit=1_000_000)
    applied = apply_reflection(
        active, reflection, owner=owner, shown=shown, scope=scope, context=context,
        rule_cap=caps.rules, example_cap=caps.examples, episodes=episodes, stage=stage, now=now,
        valid_actions=valid_actions,
    )
    for unit, why in applied.removed:
        try:
            memory.set_status(unit.id, Status.ARCHIVED, reason=why, actor=actor)
        except NotFoundError:  # already gone (archived by a peer's reconciliation, say)
            continue
    added = list(applied.added)
    if added and add is not None:
        added = list(add(added))
    elif added:
        memory.add(added, actor=actor)
    return Applied(applied.units, tuple(added), applied.removed)


def retire_failing(memory: MemoryPort, units: Sequence[Unit], *, actor: str) -> list[Unit]:
    """Archive the rules among ``units`` (as :meth:`~forge.engine.memory.Memory.record_use`
    returned them) whose outcomes keep failing: at least :data:`RETIRE_AFTER` uses and a
    validation under :data:`RETIRE_BELOW`. A CAGE-2 champion kept, and broadcast, a rule that
    had failed 6 times in 6 uses; the reason recorded says how it fared."""
    retired = []
    for unit in units:
        counts = unit.counts
        uses, wins = counts.uses, counts.successes
        if unit.kind in RETIRED_KINDS and unit.status is Status.ACTIVE and uses >= RETIRE_AFTER and unit.validation < RETIRE_BELOW:
            try:
                memory.set_status(unit.id, Status.ARCHIVED, reason=f"retired: {wins} of {uses} uses succeeded", actor=actor)
            except NotFoundError:
                continue
            retired.append(unit)
    return retired


def _replay(env: Env, *, seed: int, actions: Sequence[str]) -> None:
    """Put ``env`` back in the state of the failing step, so the snapshot offers the actions
    valid there: in TextWorld they change with the state, and after the episode (or the
    probes of :func:`_blame`) the env was somewhere else; a lost game's last state has none.
    A replay that fails leaves the env where it is: reflection still runs, on its fallback."""
    with contextlib.suppress(ForgeError):
        replay_to(env, seed=seed, prefix=actions)


def _blame(traj: Trajectory, *, env: Env, seed: int, tau: float, at: int, stalled: bool) -> tuple[int, Alternatives]:
    """The step to reflect on and what would have been safe there.

    A step with no safe alternative was not a choice: the agent was already in a dead end,
    so the step that led into it is blamed instead (walking back while that holds). On
    frozenlake-4x4 an agent oscillating between row 0, col 2 and the dead end at col 3 was
    told "at col 3, do not left", the only way out; the mistake was "right" at col 2.
    Each step back replays every other action there, so the walk stops after
    :data:`BLAME_BACK` steps (CAGE-2 has 145 actions and a slow simulator).
    """
    seen = {situation_of(o, env.spec) for o in traj.observations} if stalled else set()
    for t in range(at, max(-1, at - BLAME_BACK - 1), -1):
        probe = probe_alternatives(env, seed=seed, prefix=traj.actions[:t], failed=traj.actions[t], tau=tau, must_move=stalled, seen=seen)
        if probe.safe:
            return t, probe
    return at, Alternatives()
