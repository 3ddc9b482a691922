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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from forge.errors import LLMError, ValidationError
from forge.learn import rules as rulebook
from forge.learn.apply import Applied, apply_reflection, deleted_rules, enforce_caps
from forge.learn.artifacts import (
    REFLECTION_STYLES,
    REPRESENTATIONS,
    Example,
    Reflection,
    RuleEdit,
    Snapshot,
)
from forge.learn.probe import (
    Alternatives,
    probe_alternatives,
    replay_to,
    safe_alternatives,
    stall_step,
)
from forge.llm.base import LLM, Message
from forge.llm.structured import complete_json

__all__ = [
    "Alternatives",
    "Applied",
    "enforce_caps",
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

_MAX_RULE_CHARS = 300
_MAX_ADDS = 3  # rules one reflection may add per role; more is a model rambling
_KNOWN = "duplicate rule"  # why a rule the role already holds is dropped


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
