"""The team as one policy for the one agent loop (:func:`forge.learn.loop.play_episode`).

A task is played in subtasks of ``steps_per_subtask`` env steps. Before each one the lead
(``agents[0]``) picks who does it, by constrained choice among the agent ids, reading the
transactive "who knows what" block; a team of one plans without an LLM call. The chosen agent
acts with one constrained choice among the env's valid actions per step, its memory block in
the system prompt for the whole task (a stable prefix) and the rules for the current
situation repeated next to the question. A violation (a step below the env's ``tau``, or an
action the model could not produce) ends the subtask, and the next goes to someone else.
With ``rule_guard`` the rules are binding: the actor chooses only among the actions they leave
(:meth:`~forge.learn.prompt.Recollection.offered`). The 1.5B model picks the first listed
option of a database-diagnosis step in 160 of 160 decisions, with a rule against it shown
right before the question in 152; told is not enough there.

The loop tells the policy each step's outcome through :meth:`TeamPolicy.observe` (its
``on_step``); what the team did (who acted when, subtasks, hand-overs) is kept here for the
runner's task record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from forge.envs.base import EnvSpec, StepResult
from forge.envs.situation import situation_of
from forge.errors import StructuredOutputError
from forge.learn.policy import ActionChoice, Visits
from forge.learn.prompt import Recollection, empty
from forge.llm import LLM, Message, MeteredLLM, TokenLedger, choose
from forge.model import Step
from forge.team.memories import ACTOR_ROLE

__all__ = ["TeamPolicy"]


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


@dataclass(slots=True)
class _Subtask:
    agent: str
    start: int
    steps: int = 0
    ok: bool = True
    reallocated: bool = False
    violation: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"agent": self.agent, "start": self.start, "steps": self.steps, "ok": self.ok, "reallocated": self.reallocated, "violation": self.violation}


@dataclass(slots=True)
class TeamPolicy:
    """Planner allocation, then the allocated actor; one instance per task.

    ``roles`` are the agents: the loop recalls one memory per agent, as that agent's viewer.
    ``role_of`` names an agent's team role (lead, navigator, ...), ``task`` the task's text,
    ``who_knows`` the planner's transactive block. Tokens are metered into ``ledger``.
    """

    llm: LLM
    ledger: TokenLedger
    agents: tuple[str, ...]
    role_of: Callable[[str], str]
    spec: EnvSpec
    task: str
    steps_per_subtask: int
    who_knows: str = ""
    acting_roles: tuple[str, ...] = (ACTOR_ROLE,)
    rule_guard: bool = False
    actions: list[tuple[str, str, str]] = field(default_factory=list)  # (agent, team role, action)
    transcript: list[str] = field(default_factory=list)
    subtasks: list[_Subtask] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    now_ids: list[list[str]] = field(default_factory=list)  # per step: the rules repeated for it
    messages: int = 0
    _fallback: bool = False
    _visits: Visits | None = None

    @property
    def roles(self) -> tuple[str, ...]:
        return self.agents

    @property
    def current(self) -> _Subtask | None:
        return self.subtasks[-1] if self.subtasks else None

    def act(self, *, observation: str, valid_actions: Sequence[str], history: Sequence[str], memory: Mapping[str, Recollection]) -> ActionChoice:
        sub = self.current
        if sub is None or not sub.ok or sub.steps >= self.steps_per_subtask:
            sub = self._start_subtask(observation)
        agent = sub.agent
        rec = (memory.get(agent) or empty(ACTOR_ROLE)).here(valid_actions)
        situation = situation_of(observation, self.spec)
        if self._visits is None:
            self._visits = Visits(self.spec.place)
        tried = self._visits.tried(observation, history)
        action, now = self._choose(agent, observation, situation, rec, valid_actions, tried)
        self._visits.took(action)
        self.now_ids.append(now)
        step = Step(observation=observation, thought="", action=action, role=ACTOR_ROLE, info={"agent": agent})
        followed = rec.verdict(situation, action)
        return ActionChoice(action, steps=(step,), shown=tuple(rec.ids), now=tuple(now), followed=followed)

    def observe(self, t: int, action: str, result: StepResult) -> None:
        """The loop's ``on_step``: count the step, and end the subtask on a violation."""
        sub = self.subtasks[-1]
        sub.steps += 1
        self.actions.append((sub.agent, self.role_of(sub.agent), action))
        self.transcript.append(f"{sub.agent}: {action} -> {result.reward:g}")
        why = "no valid action produced" if self._fallback else (
            f"reward {result.reward:g} < tau {self.spec.tau:g}" if result.reward < self.spec.tau else ""
        )
        if why:
            sub.ok, sub.violation = False, why
            self.violations.append(f"step {t + 1} by {sub.agent}: {why}")
            if not result.done:
                self.messages += 1  # the hand-over

    # -- planner and actor ----------------------------------------------------------------
    def _start_subtask(self, observation: str) -> _Subtask:
        last = self.current
        exclude = {last.agent} if last is not None and not last.ok and len(self.agents) > 1 else set()
        agent = self._allocate(observation, exclude)
        self.messages += 1
        sub = _Subtask(agent=agent, start=len(self.actions), reallocated=bool(exclude))
        self.subtasks.append(sub)
        return sub

    def _allocate(self, observation: str, exclude: set[str]) -> str:
        options = [a for a in self.agents if a not in exclude] or list(self.agents)
        if len(options) == 1:
            return options[0]
        lead = self.agents[0]
        roster = ", ".join(f"{a} ({self.role_of(a)})" for a in self.agents)
        note = f"\n{', '.join(sorted(exclude))} just failed a subtask; give it to someone else." if exclude else ""
        prompt = [
            Message("system", f"You are {lead}, the lead planner of a team: {roster}. Give each subtask to the agent most likely to do it well."),
            Message(
                "user",
                f"Task: {self.task}\n{self.spec.description}\n{self.who_knows}\nSituation:\n{_clip(observation, 400)}\n"
                f"Subtask {len(self.subtasks) + 1}: the next {self.steps_per_subtask} steps.{note}\nWhich agent should do it?",
            ),
        ]
        return choose(MeteredLLM(self.llm, self.ledger, role="planner"), prompt, options, retries=1, fallback=options[0])

    def _choose(self, agent: str, observation: str, situation: str, rec: Recollection, valid: Sequence[str], tried: Sequence[str] = ()) -> tuple[str, list[str]]:
        """One constrained choice: the memory block stays in the system prompt for the whole
        task, the rules for this exact situation come right before the question."""
        system = f"You are {agent}, the {self.role_of(agent)} of a team of agents. {self.spec.description}" + (f"\n\n{rec.block}" if rec.block else "")
        now, now_ids = rec.now_text(situation, tried=tried)
        options = rec.offered(situation, list(valid), tried=tried) if self.rule_guard else list(valid)
        recent = self.transcript
        user = (
            observation
            + (f"\nRecent team actions: {'; '.join(recent[-6:])}" if recent else "")
            + (f"\n{now}" if now else "")
            + "\nChoose your next action."
        )
        llm = MeteredLLM(self.llm, self.ledger, role="actor", agent=agent)
        self._fallback = False
        try:
            return choose(llm, [Message("system", system), Message("user", user)], options, retries=1), now_ids
        except StructuredOutputError:
            self._fallback = True
            return options[0], now_ids
