"""Acting agents: how one env step's action is chosen from an observation and memory.

Two policies share one contract (:class:`Policy`): a flat single-agent ReAct loop (the
sensible default for small models) and the FORGE paper's hierarchical ReAct agent, where an
analyst reads the observation through tools, an action chooser proposes candidate actions and
a planner must copy one of them. Every role uses the same LLM and differs only in its role
prompt and the memory injected for it. Actions are always picked by constrained choice among
``env.valid_actions()``, so even a 135M model emits a legal move.

Memory reaches a policy only as :class:`~forge.learn.prompt.Recollection` objects, one per role,
written by :func:`forge.learn.prompt.recollect` from engine units. The system prompt (role, task,
memory block) is identical at every step of an episode, so llama.cpp's prefix cache holds;
what changes (the observation, the rules for this exact situation) comes after it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from forge.envs.base import EnvSpec
from forge.envs.situation import situation_of
from forge.errors import ConfigError
from forge.learn.prompt import Recollection, empty
from forge.llm.base import LLM, Message, Request
from forge.llm.structured import choose
from forge.model import Step

__all__ = [
    "ANALYST_TOOLS",
    "ActionChoice",
    "FlatPolicy",
    "HierarchicalPolicy",
    "Policy",
    "Visits",
    "make_policy",
    "strip_map",
]

#: Tools the hierarchical analyst may call; reflection may name them in rules and examples.
ANALYST_TOOLS = ("read_observation", "list_actions", "recent_history")


# -- rendering ---------------------------------------------------------------------------------

def strip_map(observation: str) -> str:
    """The observation without its drawn map ("Map ...:" and the grid lines under it).

    Small models cannot read a character grid, and at ~100 prompt tokens/s on two cores the
    map is a third of every step's cost; the same facts are in the text ("Next to you: ...").
    """
    out: list[str] = []
    skipping = False
    for line in observation.splitlines():
        if line.startswith("Map") and line.rstrip().endswith(":"):
            skipping = True
            continue
        if skipping and (line.startswith("Last step") or not line.strip()):
            skipping = False
        if not skipping:
            out.append(line)
    return "\n".join(out)


# -- policies ----------------------------------------------------------------------------------

Memory = Mapping[str, Recollection]
"""What a policy reads: one recollection per role (a missing role has no memory)."""


@dataclass(frozen=True, slots=True)
class ActionChoice:
    """One env step's choice: the action, what every role did to reach it, and which memory
    units were in front of the model (``shown``) or named this exact situation (``now``)."""

    action: str
    steps: tuple[Step, ...] = ()
    shown: tuple[str, ...] = ()
    now: tuple[str, ...] = ()
    #: Whether the action followed the rules for this situation (None: no rule applied).
    followed: bool | None = None


class Policy(Protocol):
    """Picks one valid action per env step, reading its roles' memory."""

    roles: tuple[str, ...]
    #: Roles whose choice is the env action: corrected examples and fallback rules go to them.
    acting_roles: tuple[str, ...]

    def act(
        self,
        *,
        observation: str,
        valid_actions: Sequence[str],
        history: Sequence[str],
        memory: Memory,
    ) -> ActionChoice: ...


RoleLLM = Callable[[str], LLM]


def _system(role_prompt: str, spec: EnvSpec, memory_block: str, actions: Sequence[str] = ()) -> str:
    """Role, task, the action list and memory: everything that is the same at every step, so
    it forms the prompt prefix llama.cpp keeps cached (an option list after the observation
    would be re-read at every step). Pass ``actions`` only when they do not change from step
    to step (:class:`_Listing`)."""
    text = f"{role_prompt}\nTask ({spec.name}): {spec.description}"
    if actions and not spec.actions_in_description:
        text += f"\n{_actions_line(actions)}"
    return f"{text}\n\n{memory_block}" if memory_block else text


def _actions_line(actions: Sequence[str]) -> str:
    return f"Valid actions: {', '.join(actions)}. Answer with exactly one of them."


class _Listing:
    """Where a policy lists the valid actions: in the static system prompt while they stay
    the same from step to step, after the observation once they have changed (TextWorld's
    admissible commands): a list that changes inside the system prompt would make llama.cpp
    re-read the memory block after it at every step."""

    def __init__(self) -> None:
        self._last: tuple[str, ...] | None = None
        self.varies = False

    def see(self, actions: Sequence[str]) -> None:
        now = tuple(actions)
        self.varies = self.varies or (self._last is not None and now != self._last)
        self._last = now

    def system(self, actions: Sequence[str]) -> Sequence[str]:
        return () if self.varies else actions

    def user(self, spec: EnvSpec, actions: Sequence[str]) -> str:
        return f"\n{_actions_line(actions)}" if self.varies and not spec.actions_in_description else ""


def _choose(llm: LLM, system: str, user: str, options: Sequence[str], *, listed: bool, **kw: Any) -> str:
    """Constrained choice; the options are only restated after the question when the system
    prompt does not list them or the backend cannot enforce them with a grammar."""
    instruct = not listed or "choices" not in getattr(llm, "capabilities", ())
    return choose(llm, [Message("system", system), Message("user", user)], options, fallback=options[0], instruct=instruct, **kw)


def _history_line(history: Sequence[str]) -> str:
    return f"\nYour previous actions: {', '.join(history[-4:])}." if history else ""


@dataclass(slots=True)
class _Sampling:
    """Per-instance sampling, so a population's members differ; recorded by the caller."""

    temperature: float = 0.0
    seed: int | None = None
    calls: int = field(default=0)

    def next_seed(self) -> int | None:
        self.calls += 1
        return None if self.seed is None else (self.seed * 1_000_003 + self.calls) % (2**31 - 1)


@dataclass(slots=True)
class Visits:
    """Where this episode has stood (the env's ``place``) and what it did there, so that a
    return can be told from a new place that reads alike (:meth:`Recollection.offered`).

    It follows the loop's own record: ``history`` is the episode's actions so far, so a
    new episode (or one joined midway) starts a new trail. An env without ``place`` tracks
    nothing, and every step is a first visit.
    """

    place: Callable[[str], str] | None
    _trail: list[tuple[str, str]] = field(default_factory=list)
    _here: str = ""

    def tried(self, observation: str, history: Sequence[str]) -> tuple[str, ...]:
        """What this episode already did where ``observation`` stands, oldest first."""
        if self.place is None:
            return ()
        if [a for _, a in self._trail] != list(history):
            # another episode, or steps this policy did not choose: their places are unknown
            self._trail = [("", a) for a in history]
        self._here = self.place(observation)
        if not self._here:
            return ()
        return tuple(dict.fromkeys(a for p, a in self._trail if p == self._here))

    def took(self, action: str) -> None:
        """Record the action chosen where the last :meth:`tried` stood."""
        if self.place is not None:
            self._trail.append((self._here, action))


def _recollection(memory: Memory, role: str, valid_actions: Sequence[str]) -> Recollection:
    """``role``'s memory read against the actions valid at this step (:meth:`Recollection.here`)."""
    return (memory.get(role) or empty(role)).here(valid_actions)


class FlatPolicy:
    """Single-agent ReAct: one prompt, one constrained choice per step (optionally a thought).

    ``think=True`` first asks for a one-sentence thought (ReAct's reasoning trace); off by
    default because it costs ~40 generated tokens a step and small models gain nothing.
    ``temperature``/``seed`` make instances of a population differ reproducibly.
    """

    roles: tuple[str, ...] = ("actor",)
    acting_roles: tuple[str, ...] = ("actor",)

    def __init__(
        self,
        *,
        llm: RoleLLM,
        spec: EnvSpec,
        think: bool = False,
        rule_guard: bool = False,
        show_map: bool = False,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self._llm = llm
        self.spec = spec
        self.think = think
        self.rule_guard = rule_guard
        self.show_map = show_map
        self.sampling = _Sampling(temperature, seed)
        self._listing = _Listing()
        self.visits = Visits(spec.place)

    def act(
        self,
        *,
        observation: str,
        valid_actions: Sequence[str],
        history: Sequence[str],
        memory: Memory,
    ) -> ActionChoice:
        llm = self._llm("actor")
        rec = _recollection(memory, "actor", valid_actions)
        situation = situation_of(observation, self.spec)
        tried = self.visits.tried(observation, history)
        self._listing.see(valid_actions)
        system = _system("You are an agent acting in an environment.", self.spec, rec.block, self._listing.system(valid_actions))
        shown = observation if self.show_map else strip_map(observation)
        now_text, now_ids = rec.now_text(situation, tried=tried)
        user = f"{shown}{_history_line(history)}" + (f"\n\n{now_text}" if now_text else "") + self._listing.user(self.spec, valid_actions)
        thought = ""
        if self.think:
            thought = llm.complete(
                _request([Message("system", system), Message("user", user + "\nThink in one sentence about the best next action.")], 40)
            ).text.strip()
            user += f"\nThought: {thought}"
        options = list(valid_actions)
        if self.rule_guard:
            options = rec.offered(situation, options, tried=tried)
        action = _choose(
            llm, system, user + "\nWhich action next?", options, listed=options == list(valid_actions),
            temperature=self.sampling.temperature, seed=self.sampling.next_seed(),
        )
        self.visits.took(action)
        step = Step(observation=observation, thought=thought, action=action, role="actor")
        return ActionChoice(action, (step,), tuple(rec.ids), tuple(now_ids), rec.verdict(situation, action))


class HierarchicalPolicy:
    """The paper's hierarchical ReAct agent: analyst -> action chooser -> planner.

    The analyst calls one tool (read the observation, list the actions, recall recent history)
    and writes a short note; the action chooser proposes ``proposals`` distinct actions; the
    planner must copy one of them (enforced by constrained choice over the proposals).
    """

    roles: tuple[str, ...] = ("planner", "action_chooser", "analyst")
    acting_roles: tuple[str, ...] = ("planner", "action_chooser")

    def __init__(
        self,
        *,
        llm: RoleLLM,
        spec: EnvSpec,
        proposals: int = 2,
        note_tokens: int = 40,
        rule_guard: bool = False,
        show_map: bool = False,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self._llm = llm
        self.spec = spec
        self.proposals = max(1, proposals)
        self.note_tokens = note_tokens
        self.rule_guard = rule_guard
        self.show_map = show_map
        self.sampling = _Sampling(temperature, seed)
        self._listing = _Listing()
        self.visits = Visits(spec.place)

    def act(
        self,
        *,
        observation: str,
        valid_actions: Sequence[str],
        history: Sequence[str],
        memory: Memory,
    ) -> ActionChoice:
        situation = situation_of(observation, self.spec)
        tried = self.visits.tried(observation, history)
        self._listing.see(valid_actions)
        full, observation = observation, (observation if self.show_map else strip_map(observation))
        steps: list[Step] = []
        shown: list[str] = []
        now: list[str] = []

        def prompt(role: str, text: str, actions: Sequence[str] = ()) -> tuple[str, str]:
            rec = _recollection(memory, role, valid_actions)
            shown.extend(rec.ids)
            now_text, ids = rec.now_text(situation, tried=tried)
            now.extend(ids)
            return _system(text, self.spec, rec.block, actions), (f"\n\n{now_text}" if now_text else "")

        # analyst: one tool call, one short note
        analyst = self._llm("analyst")
        a_sys, a_now = prompt("analyst", "You are the analyst: you read the situation with a tool and report what matters.")
        tool = choose(analyst, [Message("system", a_sys), Message("user", f"Which tool do you call?{a_now}")], ANALYST_TOOLS, fallback=ANALYST_TOOLS[0])
        tool_out = {
            "read_observation": observation,
            "list_actions": ", ".join(valid_actions),
            "recent_history": ", ".join(history[-6:]) or "no actions yet",
        }[tool]
        note = analyst.complete(
            _request(
                [Message("system", a_sys), Message("user", f"Tool {tool} returned:\n{tool_out}\nIn one sentence, what matters for the next action?")],
                self.note_tokens,
            )
        ).text.strip()
        steps.append(Step(observation=tool_out[:400], thought=note, action=f"tool:{tool}", role="analyst"))

        # action chooser: distinct proposals
        chooser = self._llm("action_chooser")
        # the valid actions go in the chooser's static system prompt (or the task text), not
        # after the observation: CAGE-2's 145 were ~1,300 tokens re-read for every proposal
        c_sys, c_now = prompt("action_chooser", "You are the action chooser: you propose good next actions.", self._listing.system(valid_actions))
        c_now += self._listing.user(self.spec, valid_actions)
        options = list(valid_actions)
        if self.rule_guard:
            for role in ("action_chooser", "planner"):
                options = _recollection(memory, role, valid_actions).offered(situation, options, tried=tried)
        proposed: list[str] = []
        for _ in range(min(self.proposals, len(options))):
            left = [o for o in options if o not in proposed]
            user = f"{observation}{_history_line(history)}\nAnalyst: {note}{c_now}\nPropose the best next action" + (f" other than {', '.join(proposed)}." if proposed else ".")
            proposed.append(_choose(
                chooser, c_sys, user, left, listed=options == list(valid_actions),
                temperature=self.sampling.temperature, seed=self.sampling.next_seed(),
            ))
        steps.append(Step(observation=situation, action=", ".join(proposed), role="action_chooser"))

        # planner: must copy one proposal
        planner = self._llm("planner")
        p_sys, p_now = prompt("planner", "You are the planner: you pick the next action from the proposals.")
        user = f"{observation}{_history_line(history)}\nAnalyst: {note}{p_now}\nProposed actions: {', '.join(proposed)}. Pick one."
        action = choose(planner, [Message("system", p_sys), Message("user", user)], proposed, fallback=proposed[0], temperature=self.sampling.temperature, seed=self.sampling.next_seed())
        steps.append(Step(observation=full, thought=note, action=action, role="planner"))
        self.visits.took(action)
        followed = _recollection(memory, "planner", valid_actions).verdict(situation, action)
        return ActionChoice(action, tuple(steps), tuple(dict.fromkeys(shown)), tuple(dict.fromkeys(now)), followed)


def _request(messages: list[Message], max_tokens: int) -> Request:
    return Request(messages=messages, max_tokens=max_tokens, temperature=0.0)


POLICIES = ("flat", "hierarchical")


def make_policy(
    name: str,
    *,
    llm: RoleLLM,
    spec: EnvSpec,
    rule_guard: bool = False,
    show_map: bool = False,
    temperature: float = 0.0,
    seed: int | None = None,
) -> Policy:
    """``"flat"`` or ``"hierarchical"``; unknown names are a ConfigError."""
    if name == "flat":
        return FlatPolicy(llm=llm, spec=spec, rule_guard=rule_guard, show_map=show_map, temperature=temperature, seed=seed)
    if name == "hierarchical":
        return HierarchicalPolicy(llm=llm, spec=spec, rule_guard=rule_guard, show_map=show_map, temperature=temperature, seed=seed)
    raise ConfigError(f"unknown policy {name!r}; expected one of: {', '.join(POLICIES)}")
