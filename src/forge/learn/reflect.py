"""Reflection: a failed attempt becomes memory artifacts (rule edit ops, corrected examples).

The reflection agent is the acting agents' own LLM (no stronger teacher): it reads a
:class:`Snapshot` (every role's trajectory, the current memory, the failing step) and answers
with JSON. Small models answer badly, so everything it says is parsed tolerantly, retried a
bounded number of times (:func:`forge.llm.structured.complete_json`) and validated: rules that
mention no valid action or invent names are dropped, example steps must answer with valid
actions and, like rules, are written in the env's terms (an object by its kind, no room
name), since they are shown on other tasks. When nothing usable is left, a fallback artifact
is derived from the trajectory itself ("when <situation>, then do not <failing action>"),
marked ``fallback=True`` so runs can report how much of their memory the model really wrote.

:func:`apply_reflection` turns artifacts into engine units (rules, examples) for the agent's
own scope: rule deletions (by shown index) first, then additions, then per-role caps that keep
the newest units; every removed unit is reported so the caller archives it, never deletes it.

Every rule the model writes is held against the trajectory it came from
(:func:`forge.learn.rules.check`): a rule that recommends the action that failed is repaired into
"when X, do not A; B was safe there", and one that names no situation the agent met is
rejected. Both are recorded in the reflection (``repaired``, ``dropped``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from forge.envs.base import Env
from forge.envs.situation import goal_ways, situation_of, summarize_observation
from forge.errors import ForgeError, LLMError, ValidationError
from forge.learn import rules as rulebook
from forge.llm.base import LLM, Message
from forge.llm.structured import complete_json
from forge.model import RULE_META, Context, Kind, Provenance, Rule, Scope, Step, Unit

__all__ = [
    "Alternatives",
    "probe_alternatives",
    "replay_to",
    "safe_alternatives",
    "stall_step",
    "REFLECTION_STYLES",
    "REPRESENTATIONS",
    "Example",
    "Reflection",
    "RuleEdit",
    "Snapshot",
    "apply_reflection",
    "deleted_rules",
    "fallback_reflection",
    "reflect",
    "validate_rule",
]

REPRESENTATIONS = ("rules", "examples", "mixed")
REFLECTION_STYLES = ("slots", "free")
_MAX_RULE_CHARS = 300
_MAX_ADDS = 3  # rules one reflection may add per role; more is a model rambling
_KNOWN = "duplicate rule"  # why a rule the role already holds is dropped


@dataclass(frozen=True, slots=True)
class RuleEdit:
    """Edit ops on one role's rule list: delete by shown index, then append typed rules.

    ``add`` holds :class:`~forge.model.Rule` records; a text given instead (a hand-written
    edit) is read into one here, once, and refused if it is not a "when X, ..." rule."""

    role: str
    delete: tuple[int, ...] = ()
    add: tuple[Rule, ...] = ()

    def __post_init__(self) -> None:
        typed = []
        for item in self.add:
            rule = item if isinstance(item, Rule) else rulebook.to_rule(rulebook.parse(str(item)))
            if rule is None:
                raise ValidationError(f"not a 'when <situation>, ...' rule naming an action: {str(item)[:80]!r}")
            typed.append(rule)
        object.__setattr__(self, "add", tuple(typed))

    @property
    def texts(self) -> list[str]:
        """The added rules in words, as their units hold them."""
        return [r.text() for r in self.add]

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "delete": list(self.delete), "add": self.texts, "rules": [r.to_dict() for r in self.add]}


@dataclass(frozen=True, slots=True)
class Example:
    """A corrected demonstration: steps of thought / tool / observation / answer."""

    role: str
    name: str
    description: str
    steps: tuple[Mapping[str, str], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "name": self.name,
            "description": self.description,
            "steps": [dict(s) for s in self.steps],
        }

    def content(self) -> str:
        """The text stored and embedded for this example."""
        lines = [f"{self.name}: {self.description}"]
        lines += [f"{s.get('observation', '')} -> {s.get('answer', '')}" for s in self.steps]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the reflection agent sees about one failed attempt.

    ``steps`` holds every role's steps in order (``Step.role`` names the role; the acting
    role's steps carry the env reward); ``failing`` is the env step index (0-based) whose
    reward fell below ``tau``. ``safe_actions`` are actions checked by replaying the episode
    not to fail at that point (empty when unknown).
    """

    env: str
    description: str
    valid_actions: tuple[str, ...]
    roles: tuple[str, ...]
    acting_roles: tuple[str, ...]
    steps: tuple[Step, ...]
    failing: int
    failing_action: str
    failing_reward: float
    failing_observation: str
    tau: float
    shown: Mapping[str, tuple[Unit, ...]] = field(default_factory=dict)  # rules shown, per role
    safe_actions: tuple[str, ...] = ()
    won_actions: tuple[str, ...] = ()  # the safe actions that won the episode outright there
    known_names: tuple[str, ...] = ()
    reason: str = "abort"  # "abort": a reward fell below tau; "stall": ended unsuccessful
    episode_return: float = 0.0
    describe: Callable[[str], str] | None = field(default=None, compare=False, repr=False)  # EnvSpec.situation
    abstract: Callable[[str], str] | None = field(default=None, compare=False, repr=False)  # EnvSpec.abstract
    instance_terms: Callable[[str], Sequence[str]] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        trajectory: Any,
        *,
        env: Env,
        failing: int,
        roles: Sequence[str],
        acting_roles: Sequence[str],
        shown: Mapping[str, Sequence[Unit]],
        tau: float,
        stalled: bool,
        safe_actions: Sequence[str] = (),
        won_actions: Sequence[str] = (),
        known_names: Sequence[str] = (),
    ) -> Snapshot:
        """The snapshot of a played ``trajectory`` (steps, actions, rewards, observations)
        failing at step ``failing``."""
        return cls(
            env=env.spec.name,
            description=env.spec.description,
            valid_actions=tuple(env.valid_actions()),
            roles=tuple(roles),
            acting_roles=tuple(acting_roles),
            steps=tuple(trajectory.steps),
            failing=failing,
            failing_action=trajectory.actions[failing],
            failing_reward=trajectory.rewards[failing],
            failing_observation=trajectory.observations[failing],
            tau=tau,
            shown={role: tuple(u for u in units if u.kind is Kind.RULE) for role, units in shown.items()},
            safe_actions=tuple(safe_actions),
            won_actions=tuple(won_actions),
            known_names=tuple(known_names),
            reason="stall" if stalled else "abort",
            episode_return=trajectory.total,
            describe=env.spec.situation,
            abstract=env.spec.abstract,
            instance_terms=env.spec.instance_terms,
        )

    def rules(self, role: str) -> list[str]:
        """The rule texts shown to ``role``, in the order their indexes refer to."""
        return [u.content for u in self.shown.get(role, ())]

    def situation_of(self, observation: str) -> str:
        return self.describe(observation) if self.describe is not None else summarize_observation(observation)

    @property
    def situation(self) -> str:
        return self.situation_of(self.failing_observation)

    def typed(self, text: str) -> Rule | None:
        """A checked rule's text as a typed record, read against this attempt's actions and
        their kinds: where a model's words become data, once."""
        vocabulary = list(self.valid_actions)
        if self.abstract is not None:
            vocabulary = list(dict.fromkeys([*vocabulary, *(self.abstract(a) for a in vocabulary)]))
        return rulebook.to_rule(rulebook.parse(text, vocabulary))

    def check(self, rule: str) -> tuple[str | None, str]:
        """:func:`forge.learn.rules.check` against this attempt: ``(rule to keep or None, why)``."""
        return rulebook.check(
            rule,
            valid_actions=self.valid_actions,
            situations=self.situations,
            failing_situation=self.situation,
            failing_action=self.failing_action,
            safe_actions=self.safe_actions,
            won_actions=self.won_actions,
            abstract=self.abstract,
            instance_terms=self.instance_terms,
        )

    @property
    def situations(self) -> list[str]:
        """Every situation the agent met in this attempt (what a rule may name)."""
        return list(dict.fromkeys(self.situation_of(s.observation) for s in self.steps if s.observation))


@dataclass(frozen=True, slots=True)
class Reflection:
    """Artifacts from one reflection, and how they were obtained."""

    edits: tuple[RuleEdit, ...] = ()
    examples: tuple[Example, ...] = ()
    fallback: bool = False
    dropped: tuple[str, ...] = ()  # why model output was rejected, one line each
    error: str = ""
    repaired: tuple[str, ...] = ()  # rules rewritten because they advised what failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "edits": [e.to_dict() for e in self.edits],
            "examples": [e.to_dict() for e in self.examples],
            "fallback": self.fallback,
            "dropped": list(self.dropped),
            "repaired": list(self.repaired),
            "error": self.error,
        }


# -- validation --------------------------------------------------------------------------------

_CODEY = re.compile(r"`([^`]+)`|\b([a-z]+_[a-z0-9_]+|[a-z]+[A-Z]\w*)\b|\b(\w+)\(")


def _mentions(text: str, word: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(word.lower()) + r"(?!\w)", text.lower()) is not None


def validate_rule(text: str, *, valid_actions: Sequence[str], known_names: Iterable[str] = ()) -> str | None:
    """Why ``text`` is not an acceptable rule, or None when it is.

    A rule must say what to do (name at least one valid action) and may not invent tools or
    names: identifiers written like code (backticks, snake_case, camelCase, ``call(``) must be
    valid actions or known names.
    """
    if not isinstance(text, str) or not text.strip():
        return "empty rule"
    if len(text) > _MAX_RULE_CHARS:
        return f"rule longer than {_MAX_RULE_CHARS} characters"
    if not any(_mentions(text, a) for a in valid_actions):
        return f"rule names no valid action ({', '.join(valid_actions)}): {text[:80]!r}"
    known = {n.lower() for n in (*valid_actions, *known_names)}
    for m in _CODEY.finditer(text):
        name = next(g for g in m.groups() if g)
        if name.lower() not in known:
            return f"rule invents the name {name!r}: {text[:80]!r}"
    return None


def _clean_rule(text: str) -> str:
    text = " ".join(str(text).split()).strip(" -*\"'")
    return text[:1].lower() + text[1:] if text[:5].lower() == "when " else text


# -- prompts -----------------------------------------------------------------------------------


def _trajectory(snapshot: Snapshot, limit: int = 8) -> str:
    acting = [s for s in snapshot.steps if s.role in snapshot.acting_roles[:1] or (not s.role)]
    lines = []
    start = max(0, snapshot.failing - limit + 1)
    for t, s in enumerate(acting[start : snapshot.failing + 1], start):
        lines.append(f"step {t}: {snapshot.situation_of(s.observation)} -> {s.action} (reward {s.reward:g})")
    others = [s for s in snapshot.steps if s.role and s.role not in snapshot.acting_roles[:1]]
    for s in others[-3:]:
        lines.append(f"{s.role}: {s.action} {s.thought}".strip())
    return "\n".join(lines)


def _head(snapshot: Snapshot) -> str:
    safe = f"\nActions that were safe there: {', '.join(snapshot.safe_actions)}." if snapshot.safe_actions else ""
    if snapshot.reason == "stall":
        what = f"got nowhere (the attempt ended unsuccessful with return {snapshot.episode_return:g}, going in circles from here)"
    else:
        what = f"got reward {snapshot.failing_reward:g} (below {snapshot.tau:g})"
    return (
        f"Task ({snapshot.env}): {snapshot.description}\n"
        f"Valid actions: {', '.join(snapshot.valid_actions)}.\n"
        f"Trajectory:\n{_trajectory(snapshot)}\n"
        f"The attempt failed at step {snapshot.failing}: in the situation "
        f"'{snapshot.situation}' the action "
        f"'{snapshot.failing_action}' {what}.{safe}"
    )


def _rules_listing(snapshot: Snapshot) -> str:
    parts = []
    for role in snapshot.roles:
        rules = snapshot.rules(role)
        shown = "\n".join(f"  [{i}] {r}" for i, r in enumerate(rules)) or "  (none)"
        parts.append(f"Rules of {role}:\n{shown}")
    return "\n".join(parts)


def _rules_schema(roles: Sequence[str]) -> dict[str, Any]:
    # Length and count bounds double as the grammar's bounds on local models, which otherwise
    # ramble inside a string until max_tokens cuts the JSON off.
    return {
        "type": "object",
        "properties": {
            "edits": {
                "type": "array",
                "maxItems": max(3, len(roles)),
                "items": {
                    "type": "object",
                    "properties": {
                        "role": {"type": "string", "enum": list(roles)},
                        "delete": {"type": "array", "items": {"type": "integer"}, "maxItems": 5},
                        "add": {"type": "array", "items": {"type": "string", "maxLength": 160}, "maxItems": _MAX_ADDS},
                    },
                    "required": ["role", "add"],
                },
            }
        },
        "required": ["edits"],
    }


def _example_schema(actions: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "description": {"type": "string", "maxLength": 120},
            "steps": {
                "type": "array",
                "minItems": 1,
                "maxItems": 4,
                "items": {
                    "type": "object",
                    "properties": {
                        "thought": {"type": "string", "maxLength": 60},
                        "tool": {"type": "string", "maxLength": 20},
                        "observation": {"type": "string", "maxLength": 80},
                        "answer": {"type": "string", "enum": list(actions)},
                    },
                    "required": ["observation", "answer"],
                },
            },
        },
        "required": ["name", "description", "steps"],
    }


_SYSTEM = "You are the reflection agent. You study a failed attempt and write memory that prevents the failure next time. Never invent actions, tools or names."


# -- reflection --------------------------------------------------------------------------------


def reflect(
    llm: LLM,
    snapshot: Snapshot,
    *,
    representation: str = "rules",
    retries: int = 1,
    max_tokens: int = 200,
    style: str = "slots",
) -> Reflection:
    """Ask ``llm`` for artifacts of ``representation``; fall back to derived ones if unusable.

    ``style`` says how rules are asked for: ``"slots"`` (default) has the model fill in the
    rule for the failing situation (what to avoid, what to do instead, which shown rules to
    delete) under a grammar, so even a 1.5B model answers in ~15 tokens with a rule that names
    a situation it can recognise; ``"free"`` asks for free-text rule edits (the paper's way,
    better with large models, ~10x the tokens, and often rejected on small ones).
    """
    if representation not in REPRESENTATIONS:
        raise ValidationError(f"unknown representation {representation!r}; expected one of: {', '.join(REPRESENTATIONS)}")
    if style not in REFLECTION_STYLES:
        raise ValidationError(f"unknown reflection style {style!r}; expected one of: {', '.join(REFLECTION_STYLES)}")
    edits: list[RuleEdit] = []
    examples: list[Example] = []
    dropped: list[str] = []
    errors: list[str] = []
    repaired: list[str] = []
    fallback = False
    if representation in ("rules", "mixed"):
        ask = _ask_rule_slots if style == "slots" and snapshot.situation else _ask_rules
        got, why, err, fixed = ask(llm, snapshot, retries=retries, max_tokens=max_tokens)
        repaired += fixed
        dropped += why
        if err:
            errors.append(err)
        if got:
            edits += got
        elif why and not err and all(_KNOWN in d for d in why):
            pass  # a valid lesson the agent already holds (it failed despite it): nothing to add, nothing failed
        else:
            edits += _fallback_rules(snapshot)
            fallback = True
    if representation in ("examples", "mixed"):
        got_ex, why, err = _ask_example(llm, snapshot, retries=retries, max_tokens=max_tokens)
        dropped += why
        if err:
            errors.append(err)
        if got_ex is not None:
            examples.append(got_ex)
        else:
            examples += _fallback_examples(snapshot)
            fallback = True
    return Reflection(tuple(edits), tuple(examples), fallback, tuple(dropped), "; ".join(errors), tuple(repaired))


def _ask_rules(llm: LLM, snapshot: Snapshot, *, retries: int, max_tokens: int) -> tuple[list[RuleEdit], list[str], str, list[str]]:
    prompt = (
        f"{_head(snapshot)}\n\n{_rules_listing(snapshot)}\n\n"
        "Write rule edits. Each added rule copies a situation exactly as written above and says what to avoid "
        "and what to do instead, e.g. "
        f"'{rulebook.write(snapshot.situation, snapshot.failing_action, snapshot.safe_actions[:1] or [_alternative(snapshot)])}'. "
        "Delete (by index) rules that caused the failure."
    )
    try:
        data = complete_json(
            llm,
            [Message("system", _SYSTEM), Message("user", prompt)],
            schema=_rules_schema(snapshot.roles),
            retries=retries,
            max_tokens=max_tokens,
        )
    except LLMError as exc:
        return [], [], str(exc), []
    dropped: list[str] = []
    repaired: list[str] = []
    merged: dict[str, tuple[set[int], list[str]]] = {}
    known = (*snapshot.known_names, *snapshot.roles)
    for edit in data.get("edits") or []:
        if not isinstance(edit, Mapping):
            dropped.append("edit is not an object")
            continue
        role = edit.get("role")
        if role not in snapshot.roles:
            dropped.append(f"unknown role {role!r}")
            continue
        n = len(snapshot.rules(role))
        deletes, adds = merged.setdefault(role, (set(), []))
        for idx in edit.get("delete") or []:
            if isinstance(idx, int) and not isinstance(idx, bool) and 0 <= idx < n:
                deletes.add(idx)
            else:
                dropped.append(f"{role}: no rule at index {idx!r}")
        existing = {r.lower() for r in snapshot.rules(role)}
        for text in (edit.get("add") or [])[:_MAX_ADDS]:
            rule = _clean_rule(text) if isinstance(text, str) else ""
            why = validate_rule(rule, valid_actions=snapshot.valid_actions, known_names=known)
            if why is None:
                checked, note = snapshot.check(rule)
                if checked is None:
                    why = note
                else:
                    if note:
                        repaired.append(f"{role}: {note}")
                    rule = checked
            if why is None and (rule.lower() in existing or rule.lower() in {a.lower() for a in adds}):
                why = f"{_KNOWN} {rule[:60]!r}"
            if why:
                dropped.append(f"{role}: {why}")
            else:
                adds.append(rule)
    edits = []
    for role, (d, a) in merged.items():
        typed = [r for r in map(snapshot.typed, a) if r is not None]
        if typed:
            edits.append(RuleEdit(role, tuple(sorted(d)), tuple(typed)))
    return edits, dropped, "", repaired


def _ask_rule_slots(llm: LLM, snapshot: Snapshot, *, retries: int, max_tokens: int) -> tuple[list[RuleEdit], list[str], str, list[str]]:
    """The rule for the failing situation, with the model choosing its slots (see :func:`reflect`).

    The model picks what to avoid and what to do instead. Which shown rules to delete is not
    asked: a 1.5B model filled a "delete" slot by reflex and threw away the very rules that
    had kept it out of holes. The rules deleted are those that advised the failing action in
    the failing situation, which the trajectory proves wrong.
    """
    actions = list(snapshot.valid_actions)
    first = snapshot.acting_roles[0]
    shown = snapshot.rules(first)
    schema = {
        "type": "object",
        "properties": {"avoid": {"type": "string", "enum": actions}, "instead": {"type": "string", "enum": actions}},
        "required": ["avoid", "instead"],
    }
    listing = "\n".join(f"- {r}" for r in shown)
    prompt = (
        f"{_head(snapshot)}\n\n"
        + (f"Rules the agent was shown:\n{listing}\n\n" if shown else "")
        + f"Complete the lesson: '{rulebook.write(snapshot.situation, '<avoid>', ['<instead>'])}'.\n"
        "avoid: the action to avoid in that situation. instead: the action to take there instead."
        ' Reply with JSON: {"avoid": ..., "instead": ...}'
    )
    try:
        data = complete_json(
            llm,
            [Message("system", _SYSTEM), Message("user", prompt)],
            schema=schema,
            retries=retries,
            max_tokens=min(max_tokens, 40),
            instruct="json_schema" not in llm.capabilities,
        )
    except LLMError as exc:
        return [], [], str(exc), []
    avoid, instead = data.get("avoid"), data.get("instead")
    repaired: list[str] = []
    if avoid == instead:
        return [], [f"{first}: avoids and recommends the same action ({avoid!r})"], "", []
    checked, note = snapshot.check(rulebook.write(snapshot.situation, str(avoid), [str(instead)]))
    if checked is None:
        return [], [f"{first}: {note}"], "", []
    repaired += [f"{first}: {note}"] if note else []
    dropped: list[str] = []
    edits = []
    for role in snapshot.acting_roles:
        if checked.lower() in {r.lower() for r in snapshot.rules(role)}:
            dropped.append(f"{role}: {_KNOWN} {checked[:60]!r}")
            continue
        if (rule := snapshot.typed(checked)) is not None:
            edits.append(RuleEdit(role, _proven_wrong(snapshot, role), (rule,)))
    return edits, dropped, "", repaired


def _proven_wrong(snapshot: Snapshot, role: str) -> tuple[int, ...]:
    """Indexes of ``role``'s shown rules that only advised the failing action where it failed.

    A rule that forbids something ("do not down; left was safe there") is kept even when its
    safe list names the failing action: what it forbids still holds, and the new rule adds
    the lesson beside it (deleting it put a 1.5B agent back into the hole it had learned to avoid).
    """
    out = []
    for i, unit in enumerate(snapshot.shown.get(role, ())):
        parsed = unit.rule or rulebook.parse(unit.content, snapshot.valid_actions)
        if parsed is not None and not parsed.avoid and snapshot.failing_action in parsed.prefer and rulebook.applies(parsed, snapshot.situation):
            out.append(i)
    return tuple(out)


def _ask_example(llm: LLM, snapshot: Snapshot, *, retries: int, max_tokens: int) -> tuple[Example | None, list[str], str]:
    role = snapshot.acting_roles[0]
    prompt = (
        f"{_head(snapshot)}\n\n"
        "Write a corrected demonstration of this episode: a name, a description, and the steps "
        "(observation, thought, answer = the action to take) that avoid the failure."
    )
    try:
        data = complete_json(
            llm,
            [Message("system", _SYSTEM), Message("user", prompt)],
            schema=_example_schema(snapshot.valid_actions),
            retries=retries,
            max_tokens=max_tokens + 160,  # a demonstration is longer than a rule edit
        )
    except LLMError as exc:
        return None, [], str(exc)
    dropped: list[str] = []
    failing_situation = _general(snapshot, snapshot.situation)[0].lower()
    known = {n.lower() for n in snapshot.known_names}
    steps: list[dict[str, str]] = []
    for s in (data.get("steps") or [])[:8]:
        if not isinstance(s, Mapping):
            dropped.append("example step is not an object")
            continue
        answer = str(s.get("answer", ""))
        if answer not in snapshot.valid_actions:
            dropped.append(f"example answer {answer!r} is not a valid action")
            continue
        tool = str(s.get("tool") or "").strip()
        if tool and tool.lower() not in known:
            dropped.append(f"example invents the tool {tool!r}")
            tool = ""
        raw = {"thought": str(s.get("thought", "")), "tool": tool, "observation": str(s.get("observation", "")), "answer": answer}
        step, why = _general_step(snapshot, raw)
        if why:
            dropped.append(f"example step {why}")
            continue
        if answer == snapshot.failing_action and step["observation"].lower() == failing_situation:
            dropped.append("example repeats the failing action in the failing situation")
            continue
        steps.append(step)
    name, why_name = _general(snapshot, " ".join(str(data.get("name", "")).split())[:60])
    description, why_description = _general(snapshot, " ".join(str(data.get("description", "")).split())[:200])
    if why_name or why_description:  # the demonstration itself may still transfer: only its title goes
        dropped.append(f"example title {why_name or why_description}")
        name, description = f"instead of {_general(snapshot, snapshot.failing_action)[0]}", ""
    if not steps or not name:
        dropped.append("example has no usable steps" if not steps else "example has no name")
        return None, dropped, ""
    return Example(role, name, description, tuple(steps)), dropped, ""


def _general(snapshot: Snapshot, text: str) -> tuple[str, str]:
    """``text`` in the env's terms (``abstract``), and why it still cannot leave its task
    ("" when it can): an example is shown on other tasks, so it is held to what a rule is."""
    text = " ".join(text.split())
    if snapshot.abstract is not None and text:
        text = snapshot.abstract(text)
    why = rulebook.instance_reason(text, snapshot.instance_terms) if snapshot.instance_terms is not None and text else ""
    return text, why


def _general_step(snapshot: Snapshot, step: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """One demonstration step with every field in the env's terms ("take keycard" reads "take
    a key", as a rule would), or why its observation or answer still names this task only (a
    thought that does is left out: it is commentary)."""
    limits = {"thought": 200, "tool": 60, "observation": 300, "answer": 200}
    out: dict[str, str] = {}
    for key, limit in limits.items():
        text, why = _general(snapshot, step.get(key, ""))
        if why and key == "thought":
            text = ""
        elif why:
            return {}, why
        out[key] = text[:limit]
    return out, ""


# -- fallbacks ---------------------------------------------------------------------------------


def _alternative(snapshot: Snapshot) -> str:
    for a in (*snapshot.safe_actions, *snapshot.valid_actions):
        if a != snapshot.failing_action:
            return a
    return snapshot.failing_action


def _fallback_rules(snapshot: Snapshot) -> list[RuleEdit]:
    situation = snapshot.situation or f"at step {snapshot.failing}"
    rule = rulebook.write(rulebook.focus(situation, snapshot.failing_action, snapshot.safe_actions), snapshot.failing_action, snapshot.safe_actions)
    kept, _ = snapshot.check(rule)
    if kept is None:  # the env's situation itself names instance-only terms: nothing transfers
        return []
    typed = snapshot.typed(kept)
    if typed is None:
        return []
    edits = []
    for role in snapshot.acting_roles:
        if typed.text().lower() not in {r.lower() for r in snapshot.rules(role)}:
            edits.append(RuleEdit(role, (), (typed,)))
    return edits


def _fallback_examples(snapshot: Snapshot) -> list[Example]:
    acting = [s for s in snapshot.steps if s.role == snapshot.acting_roles[0] or not s.role]
    start = max(0, snapshot.failing - 4)
    raw = [{"thought": "", "tool": "", "observation": snapshot.situation_of(s.observation), "answer": s.action} for s in acting[start : snapshot.failing]]
    alt = _alternative(snapshot)
    raw.append(
        {
            "thought": f"{snapshot.failing_action} failed here" + (" (it went in circles)" if snapshot.reason == "stall" else f" (reward {snapshot.failing_reward:g})"),
            "tool": "",
            "observation": snapshot.situation,
            "answer": alt,
        }
    )
    general = [_general_step(snapshot, s) for s in raw]
    if general[-1][1]:  # the correction itself names this task only: nothing transfers
        return []
    steps = [s for s, why in general if not why]  # a lead-in step naming this task is left out
    bad, good = _general(snapshot, snapshot.failing_action)[0], steps[-1]["answer"]
    name = f"avoid-{bad.replace(' ', '-')}"
    description = f"the same start, with {good} instead of {bad}"
    return [Example(role, name, description, tuple(steps)) for role in snapshot.acting_roles]


def fallback_reflection(snapshot: Snapshot, *, representation: str, error: str = "") -> Reflection:
    """Artifacts derived from the trajectory alone, for when the reflection LLM is unusable."""
    edits = _fallback_rules(snapshot) if representation in ("rules", "mixed") else []
    examples = _fallback_examples(snapshot) if representation in ("examples", "mixed") else []
    return Reflection(tuple(edits), tuple(examples), True, (), error)


# -- applying ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Applied:
    """The units after a reflection, and what changed: added units, removed units + why."""

    units: tuple[Unit, ...]
    added: tuple[Unit, ...] = ()
    removed: tuple[tuple[Unit, str], ...] = field(default_factory=tuple)


def apply_reflection(
    units: Sequence[Unit],
    reflection: Reflection,
    *,
    owner: str,
    shown: Mapping[str, Sequence[Unit]] | None = None,
    scope: Scope | str = "private",
    context: Context = Context(),
    rule_cap: int = 100,
    example_cap: int = 50,
    episodes: Sequence[str] = (),
    stage: int = 0,
    now: float | None = None,
    valid_actions: Sequence[str] = (),
) -> Applied:
    """Apply rule edits (deletes by shown index, then adds) and examples to an agent's units.

    ``units`` are the agent's active units; new ones are owned by ``owner`` in ``scope``,
    with ``context`` (its role set per edit) and provenance ``reflection`` from ``episodes``.
    Caps keep the newest units per (role, kind); the deleted and the evicted come back in
    ``removed`` with a reason so the caller archives them rather than losing them. With
    ``valid_actions``, an active rule of the same role that a new rule contradicts (the same
    situation, one advising what the other forbids) is removed too. An example whose steps
    the role already holds is not added again.
    """
    items = list(units)
    added: list[Unit] = []
    removed: list[tuple[Unit, str]] = []
    flag = {"fallback": True} if reflection.fallback else {}
    shown = shown or {}
    clock = now

    def make(kind: Kind, role: str, content: str, meta: Mapping[str, Any]) -> Unit:
        nonlocal clock
        extra = {"created_at": clock} if clock is not None else {}
        if clock is not None:
            clock += 1e-3  # keeps creation order, hence the prompt's order, stable
        return Unit(
            content=content,
            kind=kind,
            context=Context(context.domain, context.task, role, context.tags),
            scope=scope,  # type: ignore[arg-type]
            owner=owner,
            confidence=0.3 if reflection.fallback else 0.5,
            provenance=Provenance(source="reflection", episodes=tuple(episodes)),
            meta={"stage": stage, **meta, **flag},
            **extra,
        )

    for edit in reflection.edits:
        doomed = {u.id: u for u in deleted_rules(shown, edit)}
        gone = {u.id for u, _ in removed}
        # A shown unit the caller did not pass in ``units`` (one received from a peer, or a
        # caller that passes none) is still the one the edit deletes.
        for unit in [*items, *(u for u in doomed.values() if u.id not in {i.id for i in items})]:
            if unit.id in doomed and unit.id not in gone:
                removed.append((unit, "deleted by a reflection rule edit"))
                gone.add(unit.id)
        items = [u for u in items if u.id not in doomed]
        for rule in edit.add:
            text = rule.text()
            new = make(Kind.RULE, edit.role, text, {RULE_META: rule.to_dict()})
            # One memory must not hold two rules for one situation where one advises what the
            # other forbids: the newer was grounded in a later failure, so the older goes.
            clash = _contradicted(items, rule, role=edit.role, valid_actions=valid_actions)
            for old in clash:
                removed.append((old, f"contradicted by a newer rule: {text[:80]}"))
            items = [u for u in items if u.id not in {o.id for o in clash}]
            items.append(new)
            added.append(new)
    demos = {(u.context.role, _demo_key(u.meta.get("steps") or ())) for u in items if u.kind is Kind.EXAMPLE}
    for ex in reflection.examples:
        key = (ex.role, _demo_key(ex.steps))
        if key in demos:  # the same steps again teach nothing and take a second place in the prompt
            continue
        demos.add(key)
        new = make(Kind.EXAMPLE, ex.role, ex.content(), {"name": ex.name, "description": ex.description, "steps": [dict(s) for s in ex.steps]})
        items.append(new)
        added.append(new)
    items, evicted = enforce_caps(items, rule_cap=rule_cap, example_cap=example_cap)
    removed += [(u, "evicted by the memory cap (newest kept)") for u in evicted]
    return Applied(tuple(items), tuple(added), tuple(removed))


def _demo_key(steps: Iterable[Mapping[str, str]]) -> tuple[tuple[str, str], ...]:
    """What makes two demonstrations the same: their (observation, answer) steps, in order,
    case and spacing aside (thoughts and titles vary between reflections on one failure)."""
    return tuple((" ".join(str(s.get("observation", "")).lower().split()), " ".join(str(s.get("answer", "")).lower().split())) for s in steps if isinstance(s, Mapping))


def _contradicted(units: Sequence[Unit], rule: Rule, *, role: str, valid_actions: Sequence[str] = ()) -> list[Unit]:
    """The active rules of ``role`` that ``rule`` contradicts: the same situation, one advising
    what the other forbids. Read from their typed records; a unit stored before rules were
    typed is read against ``valid_actions`` when the caller knows them."""
    out = []
    for u in units:
        if u.kind is Kind.RULE and u.context.role == role:
            old = u.rule or (rulebook.parse(u.content, valid_actions) if valid_actions else None)
            if old is not None and rulebook.contradicts(rule, old):
                out.append(u)
    return out


def deleted_rules(shown: Mapping[str, Sequence[Unit]], edit: RuleEdit) -> list[Unit]:
    """The units a rule edit's ``delete`` indexes name: they count the RULE units shown to the
    edit's role, in the order shown (:meth:`Snapshot.of` numbers only rules), never lessons or
    examples shown beside them."""
    rules = [u for u in shown.get(edit.role, ()) if u.kind is Kind.RULE]
    return [rules[i] for i in dict.fromkeys(edit.delete) if 0 <= i < len(rules)]


def enforce_caps(units: Sequence[Unit], *, rule_cap: int, example_cap: int) -> tuple[list[Unit], list[Unit]]:
    """Keep the newest ``cap`` rules/examples per role; return (kept, evicted), order preserved.
    Units of other kinds are not capped here (curation's business)."""
    if rule_cap < 0 or example_cap < 0:
        raise ValidationError("memory caps must be zero or more")
    caps = {Kind.RULE: rule_cap, Kind.EXAMPLE: example_cap}
    seen: dict[tuple[str, Kind], int] = {}
    keep_ids: set[str] = set()
    for unit in sorted(units, key=lambda u: (u.created_at, u.id), reverse=True):
        if unit.kind not in caps:
            keep_ids.add(unit.id)
            continue
        key = (unit.context.role, unit.kind)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= caps[unit.kind]:
            keep_ids.add(unit.id)
    kept = [u for u in units if u.id in keep_ids]
    evicted = [u for u in units if u.id not in keep_ids]
    return kept, evicted


# -- grounding a failure in the environment --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Alternatives:
    """What the probes of a failing step found: ``safe``, best first (see
    :func:`probe_alternatives`), and ``won``, those among them that won the episode outright."""

    safe: tuple[str, ...] = ()
    won: tuple[str, ...] = ()


def safe_alternatives(
    env: Env, *, seed: int, prefix: Sequence[str], failed: str, tau: float, must_move: bool = False,
    seen: Collection[str] = (),
) -> tuple[str, ...]:
    """The actions that were safe at the failing step, best first (:func:`probe_alternatives`)."""
    return probe_alternatives(env, seed=seed, prefix=prefix, failed=failed, tau=tau, must_move=must_move, seen=seen).safe


def probe_alternatives(
    env: Env, *, seed: int, prefix: Sequence[str], failed: str, tau: float, must_move: bool = False,
    seen: Collection[str] = (),
) -> Alternatives:
    """Replay the seeded episode up to the failing step and try every other action there.

    Environments are seeded, so this is the exact counterfactual; it costs env steps, no
    tokens, and gives reflection (and its fallback) a grounded "what would have been safe".
    Actions that change the situation come first: when any does, an action that leaves it
    as it was (a bump into an edge) is not named. "left was safe there" for a bump at a
    wall reads as advice, and the 1.5B model, primed by four such rules, pressed left at the
    start tile for a whole episode. ``must_move`` (for stalls) never names a no-op, and
    ``seen`` (the situations of a stalled episode) puts moves to new ground first (but a move
    the situation keys as the goal's way comes before all, new ground or not): after
    shuttling between row 0, cols 1-3, "left" at col 2 is safe but leads back. Within each
    group, actions with the better step reward come first (Python's sort is stable, so ties
    keep the env's order), since a rule names at most :data:`forge.learn.rules.MAX_SAFE`.
    An action that won the episode outright comes before everything.
    """
    new: list[tuple[float, str]] = []
    safe: list[tuple[float, str]] = []
    still: list[tuple[float, str]] = []
    try:
        # the actions valid at the failing step, not wherever the env was left (after the
        # episode, or after the probes of the step after this one when blame walks back): in
        # TextWorld another room's commands were tried here, and the room's own never were
        before, total = replay_to(env, seed=seed, prefix=prefix)
        valid = list(env.valid_actions())
    except ForgeError:
        return Alternatives()
    won: list[str] = []
    here = situation_of(before, env.spec)
    ahead = goal_ways(here)  # the moves the env keys as the goal's way where the step failed
    for action in valid:
        if action == failed:
            continue
        try:
            replay_to(env, seed=seed, prefix=prefix)
            result = env.step(action)
            after = situation_of(result.observation, env.spec)
            if result.done and env.spec.succeeded(total + result.reward):
                won.append(action)
            if result.reward >= tau:
                if after == here:
                    still.append((result.reward, action))
                else:
                    (safe if after in seen else new).append((result.reward, action))
        except ForgeError:
            continue
    # The goal's way first, whether or not it leads to new ground (coin-2's corridor rooms
    # read alike, so walking on looked like a bump or a room seen, and the way back new), then
    # the best step reward, then the env's order: a rule names only the first few, and the
    # prompt offers what it names
    onward = [ra for ra in new + safe + still if _move(ra[1]) in ahead or ra[1] in won]
    best = onward + [ra for ra in (new or safe or ([] if must_move else still)) if ra not in onward]
    ranked = sorted(best, key=lambda ra: (ra[1] not in won, ra not in onward, -ra[0]))
    return Alternatives(tuple(a for _, a in ranked), tuple(won))


def replay_to(env: Env, *, seed: int, prefix: Sequence[str]) -> tuple[str, float]:
    """Reset the seeded episode and play ``prefix``; the observation there and the return so far."""
    observation, total = env.reset(seed=seed), 0.0
    for a in prefix:
        result = env.step(a)
        observation, total = result.observation, total + result.reward
    return observation, total


def stall_step(observations: Sequence[str], actions: Sequence[str], *, situation: Callable[[str], str] | None = None) -> int:
    """Where an unsuccessful episode that never fell below tau went wrong.

    The first step that led back to a situation already seen undid progress (a bump into a
    wall, or a step back to where the agent came from): that is the step to blame. Blaming
    the first repeated (situation, action) pair instead, as this did before, blamed the bump
    at the start of CliffWalking and never the step down that undid the climb. A move the
    situation keys as the goal's way is never blamed. Without a return, the last step off the
    goal's way (else the last step).
    """
    sit = [(situation or summarize_observation)(obs) for obs in observations]
    for t in range(len(actions) - 1):
        # a move the env keys as the goal's way is progress even when the next room reads
        # like one seen before (coin-2's corridor rooms are alike in kinds): blaming it gave
        # "when go north: the goal's way, do not go north"
        if sit[t + 1] in sit[: t + 1] and not _goal_way(actions[t], sit[t]):
            return t
    # the last step off the goal's way (a detour walked back is no return to a seen room)
    return next((t for t in range(len(actions) - 1, -1, -1) if not _goal_way(actions[t], sit[t])), len(actions) - 1)


def _goal_way(action: str, situation: str) -> bool:
    return _move(action) in goal_ways(situation)


def _move(action: str) -> str:
    """An action as :func:`~forge.envs.situation.goal_ways` keys it."""
    return " ".join(action.lower().split())
