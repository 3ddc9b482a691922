"""Acting agents for the evolution protocols, and the prompt memory they read.

Two policies share one contract (:class:`Policy`): a flat single-agent ReAct loop (the
sensible default for small models) and the FORGE paper's hierarchical ReAct agent, where an
analyst reads the observation through tools, an action chooser proposes candidate actions and
a planner must copy one of them. Every role uses the same LLM and differs only in its role
prompt and the memory injected for it. Actions are always picked by constrained choice among
``env.valid_actions()``, so even a 135M model emits a legal move.

:class:`PromptMemory` is one agent instance's memory as the prompt sees it: per role, an
ordered list of rules and examples (oldest first). It is plain data so it can cross process
boundaries; the protocols mirror it into a :class:`~forge.memory.Memory` store for history.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from forge.envs.base import EnvSpec
from forge.errors import ConfigError, ValidationError
from forge.llm.base import LLM, Message, Request
from forge.llm.structured import choose
from forge.model import Step, new_id
from forge.recall import approx_tokens

__all__ = [
    "ANALYST_TOOLS",
    "Decision",
    "FlatPolicy",
    "HierarchicalPolicy",
    "MemoryItem",
    "Policy",
    "PromptMemory",
    "make_policy",
    "render_memory",
    "strip_map",
    "summarize_observation",
]

#: Tools the hierarchical analyst may call; reflection may name them in rules and examples.
ANALYST_TOOLS = ("read_observation", "list_actions", "recent_history")


# -- memory as the prompt sees it --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """One rule or example held by one role of one instance.

    ``id`` is the unit id it is stored under; ``source`` is ``"reflection"`` or
    ``"broadcast:inst-J"``. ``meta`` holds an example's name, description and steps, and
    ``fallback: true`` when the item was derived from the trajectory because the reflection
    output was unusable.
    """

    kind: str  # "rule" | "example"
    role: str
    content: str
    id: str = field(default_factory=new_id)
    source: str = "reflection"
    episodes: tuple[str, ...] = ()
    derived_from: tuple[str, ...] = ()
    stage: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ("rule", "example"):
            raise ValidationError(f"prompt memory holds rules and examples, not {self.kind!r}")
        if not self.content.strip():
            raise ValidationError("a memory item needs content")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["episodes"] = list(self.episodes)
        d["derived_from"] = list(self.derived_from)
        d["meta"] = dict(self.meta)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryItem:
        try:
            return cls(
                kind=data["kind"],
                role=data["role"],
                content=data["content"],
                id=data["id"],
                source=data.get("source", "reflection"),
                episodes=tuple(data.get("episodes", ())),
                derived_from=tuple(data.get("derived_from", ())),
                stage=int(data.get("stage", 0)),
                meta=dict(data.get("meta", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValidationError(f"bad memory item record: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class PromptMemory:
    """An instance's active rules and examples, oldest first. Immutable: edits return a copy."""

    items: tuple[MemoryItem, ...] = ()

    def of(self, role: str, kind: str) -> list[MemoryItem]:
        return [i for i in self.items if i.role == role and i.kind == kind]

    def rules(self, role: str) -> list[str]:
        return [i.content for i in self.of(role, "rule")]

    def with_items(self, items: Iterable[MemoryItem]) -> PromptMemory:
        return PromptMemory(tuple(items))

    def __len__(self) -> int:
        return len(self.items)

    def to_list(self) -> list[dict[str, Any]]:
        return [i.to_dict() for i in self.items]

    @classmethod
    def from_list(cls, records: Iterable[Mapping[str, Any]]) -> PromptMemory:
        return cls(tuple(MemoryItem.from_dict(r) for r in records))

    def contents(self) -> list[tuple[str, str, str]]:
        """(role, kind, content) in order: what decides behaviour, ids and times aside."""
        return [(i.role, i.kind, i.content) for i in self.items]


# -- rendering ---------------------------------------------------------------------------------

_STEP_HEAD = re.compile(r"^\s*Step \d+ of \d+\.(?: The episode is over\.)?\s*", re.IGNORECASE)
_PARENS = re.compile(r"\s*\([^()]*\)")


def summarize_observation(observation: str, *, limit: int = 140) -> str:
    """The situation in one short sentence: what a rule's "when" clause can name.

    Drops a leading "Step N of M." and parenthesised asides, keeps the first sentence.
    Generic on purpose: every env adapter opens its text with where the agent stands.
    """
    text = _STEP_HEAD.sub("", observation.strip())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    first = _PARENS.sub("", lines[0])
    sentence = re.split(r"(?<=[.!?])\s", first, maxsplit=1)[0].rstrip(".!? ")
    return sentence[:limit].rstrip()


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


def _words(text: str) -> set[str]:
    w = re.findall(r"\w+", text.lower())
    return set(w) | {f"{a} {b}" for a, b in zip(w, w[1:], strict=False)}


def _example_text(item: MemoryItem) -> str:
    meta = item.meta
    steps = meta.get("steps") or []
    lines = [f"Example {meta.get('name') or 'demo'}: {meta.get('description') or ''}".rstrip()]
    for s in steps:
        obs = s.get("observation", "")
        tool = f" [tool {s['tool']}]" if s.get("tool") else ""
        thought = f" ({s['thought']})" if s.get("thought") else ""
        lines.append(f"  {obs}{tool}{thought} -> {s.get('answer', '')}")
    return "\n".join(lines)


def render_memory(
    memory: PromptMemory,
    role: str,
    *,
    budget: int,
    situation: str = "",
    count_tokens: Callable[[str], int] = approx_tokens,
) -> str:
    """A "## Rules" and "## Examples" block for ``role`` within ``budget`` tokens.

    When everything does not fit, items whose words overlap ``situation`` most win, newest
    first on ties, because a population's memory grows past a small model's context long
    before it stops being useful. Shown rules keep their index, which rule edits refer to.
    """
    rules = list(enumerate(memory.of(role, "rule")))
    examples = list(enumerate(memory.of(role, "example")))
    if not rules and not examples:
        return ""
    want = _words(situation)

    def rank(pairs: list[tuple[int, MemoryItem]]) -> list[tuple[int, MemoryItem]]:
        return sorted(pairs, key=lambda p: (-len(want & _words(p[1].content)), -p[0]))

    used = 0
    chosen_rules: list[tuple[int, str]] = []
    for idx, item in rank(rules):
        line = f"[{idx}] {item.content}"
        cost = count_tokens(line)
        if used + cost > budget:
            continue
        chosen_rules.append((idx, line))
        used += cost
    chosen_examples: list[tuple[int, str]] = []
    for idx, item in rank(examples):
        text = _example_text(item)
        cost = count_tokens(text)
        if used + cost > budget:
            continue
        chosen_examples.append((idx, text))
        used += cost
    parts = []
    if chosen_rules:
        parts.append("## Rules\n" + "\n".join(line for _, line in sorted(chosen_rules)))
    if chosen_examples:
        parts.append("## Examples\n" + "\n".join(t for _, t in sorted(chosen_examples)))
    return "\n\n".join(parts)


_DONT = re.compile(r"^when (?P<when>.+?),? then (?:do not|don't|never|avoid) (?:move |go |take |choose )?(?P<action>[\w-]+)", re.IGNORECASE)


def forbidden_actions(memory: PromptMemory, role: str, situation: str, valid: Sequence[str]) -> set[str]:
    """Actions a rule "when <situation>, then do not <action>" forbids in exactly this situation.

    Used only when a policy is built with ``rule_guard=True``: a practical aid for models too
    small to follow their own rules, off by default to stay with the paper's prompt-only memory.
    """
    norm = " ".join(situation.lower().split())
    out: set[str] = set()
    lowered = {v.lower(): v for v in valid}
    for rule in memory.rules(role):
        m = _DONT.match(rule.strip())
        if m and " ".join(m["when"].lower().split()).rstrip(".") == norm and m["action"].lower() in lowered:
            out.add(lowered[m["action"].lower()])
    return out


# -- policies ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    """One env step's decision: the action and what every role did to reach it."""

    action: str
    steps: tuple[Step, ...] = ()


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
        memory: PromptMemory,
    ) -> Decision: ...


RoleLLM = Callable[[str], LLM]


def _system(role_prompt: str, spec: EnvSpec, memory_block: str) -> str:
    text = f"{role_prompt}\nTask ({spec.name}): {spec.description}"
    return f"{text}\n\n{memory_block}" if memory_block else text


def _history_line(history: Sequence[str]) -> str:
    return f"\nYour previous actions: {', '.join(history[-4:])}." if history else ""


class FlatPolicy:
    """Single-agent ReAct: one prompt, one constrained choice per step (optionally a thought).

    ``think=True`` first asks for a one-sentence thought (ReAct's reasoning trace); off by
    default because it costs ~40 generated tokens a step and small models gain nothing.
    """

    roles = ("actor",)
    acting_roles = ("actor",)

    def __init__(
        self,
        *,
        llm: RoleLLM,
        spec: EnvSpec,
        memory_tokens: int = 600,
        think: bool = False,
        rule_guard: bool = False,
        show_map: bool = False,
    ) -> None:
        self._llm = llm
        self.spec = spec
        self.memory_tokens = memory_tokens
        self.think = think
        self.rule_guard = rule_guard
        self.show_map = show_map

    def act(
        self,
        *,
        observation: str,
        valid_actions: Sequence[str],
        history: Sequence[str],
        memory: PromptMemory,
    ) -> Decision:
        llm = self._llm("actor")
        situation = summarize_observation(observation)
        block = render_memory(memory, "actor", budget=self.memory_tokens, situation=situation)
        system = _system("You are an agent acting in an environment.", self.spec, block)
        shown = observation if self.show_map else strip_map(observation)
        user = f"{shown}{_history_line(history)}"
        thought = ""
        if self.think:
            thought = llm.complete(
                _request([Message("system", system), Message("user", user + "\nThink in one sentence about the best next action.")], 40)
            ).text.strip()
            user += f"\nThought: {thought}"
        options = list(valid_actions)
        if self.rule_guard:
            banned = forbidden_actions(memory, "actor", situation, options)
            options = [o for o in options if o not in banned] or list(valid_actions)
        action = choose(
            llm,
            [Message("system", system), Message("user", user + "\nWhich action next?")],
            options,
            fallback=options[0],
        )
        return Decision(action, (Step(observation=observation, thought=thought, action=action, role="actor"),))


class HierarchicalPolicy:
    """The paper's hierarchical ReAct agent: analyst -> action chooser -> planner.

    The analyst calls one tool (read the observation, list the actions, recall recent history)
    and writes a short note; the action chooser proposes ``proposals`` distinct actions; the
    planner must copy one of them (enforced by constrained choice over the proposals).
    """

    roles = ("planner", "action_chooser", "analyst")
    acting_roles = ("planner", "action_chooser")

    def __init__(
        self,
        *,
        llm: RoleLLM,
        spec: EnvSpec,
        memory_tokens: int = 600,
        proposals: int = 2,
        note_tokens: int = 40,
        rule_guard: bool = False,
        show_map: bool = False,
    ) -> None:
        self._llm = llm
        self.spec = spec
        self.memory_tokens = memory_tokens
        self.proposals = max(1, proposals)
        self.note_tokens = note_tokens
        self.rule_guard = rule_guard
        self.show_map = show_map

    def _prompt(self, role: str, prompt: str, memory: PromptMemory, situation: str) -> str:
        block = render_memory(memory, role, budget=self.memory_tokens // 2, situation=situation)
        return _system(prompt, self.spec, block)

    def act(
        self,
        *,
        observation: str,
        valid_actions: Sequence[str],
        history: Sequence[str],
        memory: PromptMemory,
    ) -> Decision:
        situation = summarize_observation(observation)
        full, observation = observation, (observation if self.show_map else strip_map(observation))
        steps: list[Step] = []

        # analyst: one tool call, one short note
        analyst = self._llm("analyst")
        a_sys = self._prompt("analyst", "You are the analyst: you read the situation with a tool and report what matters.", memory, situation)
        tool = choose(analyst, [Message("system", a_sys), Message("user", "Which tool do you call?")], ANALYST_TOOLS, fallback=ANALYST_TOOLS[0])
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
        c_sys = self._prompt("action_chooser", "You are the action chooser: you propose good next actions.", memory, situation)
        options = list(valid_actions)
        if self.rule_guard:
            banned = forbidden_actions(memory, "action_chooser", situation, options) | forbidden_actions(memory, "planner", situation, options)
            options = [o for o in options if o not in banned] or list(valid_actions)
        proposed: list[str] = []
        for _ in range(min(self.proposals, len(options))):
            left = [o for o in options if o not in proposed]
            user = f"{observation}{_history_line(history)}\nAnalyst: {note}\nPropose the best next action" + (f" other than {', '.join(proposed)}." if proposed else ".")
            proposed.append(choose(chooser, [Message("system", c_sys), Message("user", user)], left, fallback=left[0]))
        steps.append(Step(observation=situation, action=", ".join(proposed), role="action_chooser"))

        # planner: must copy one proposal
        planner = self._llm("planner")
        p_sys = self._prompt("planner", "You are the planner: you pick the next action from the proposals.", memory, situation)
        user = f"{observation}{_history_line(history)}\nAnalyst: {note}\nProposed actions: {', '.join(proposed)}. Pick one."
        action = choose(planner, [Message("system", p_sys), Message("user", user)], proposed, fallback=proposed[0])
        steps.append(Step(observation=full, thought=note, action=action, role="planner"))
        return Decision(action, tuple(steps))


def _request(messages: list[Message], max_tokens: int) -> Request:
    return Request(messages=messages, max_tokens=max_tokens, temperature=0.0)


POLICIES = ("flat", "hierarchical")


def make_policy(
    name: str,
    *,
    llm: RoleLLM,
    spec: EnvSpec,
    memory_tokens: int = 600,
    rule_guard: bool = False,
    show_map: bool = False,
) -> Policy:
    """``"flat"`` or ``"hierarchical"``; unknown names are a ConfigError."""
    if name == "flat":
        return FlatPolicy(llm=llm, spec=spec, memory_tokens=memory_tokens, rule_guard=rule_guard, show_map=show_map)
    if name == "hierarchical":
        return HierarchicalPolicy(llm=llm, spec=spec, memory_tokens=memory_tokens, rule_guard=rule_guard, show_map=show_map)
    raise ConfigError(f"unknown policy {name!r}; expected one of: {', '.join(POLICIES)}")


def retag(item: MemoryItem, **changes: Any) -> MemoryItem:
    """A copy of ``item`` with ``changes`` (validated)."""
    return replace(item, **changes)
