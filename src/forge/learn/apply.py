"""Applying a reflection to an agent's units: deletes, adds, contradiction retirement, caps.

A pure function over units: what to add and what to remove (with why). The one learning
function (:func:`forge.learn.loop.learn_from`) writes the result into memory.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from forge.errors import ValidationError
from forge.learn import rules as rulebook
from forge.learn.artifacts import Reflection, RuleEdit
from forge.model import RULE_META, Context, Kind, Provenance, Rule, Scope, Unit

__all__ = ["Applied", "apply_reflection", "deleted_rules", "enforce_caps"]

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
        made = clock if clock is not None else time.time()
        if clock is not None:
            clock += 1e-3  # keeps creation order, hence the prompt's order, stable
        return Unit(
            content=content,
            kind=kind,
            context=Context(context.domain, context.task, role, context.tags),
            scope=Scope.parse(scope),
            owner=owner,
            confidence=0.3 if reflection.fallback else 0.5,
            provenance=Provenance(source="reflection", episodes=tuple(episodes)),
            meta={"stage": stage, **meta, **flag},
            created_at=made,
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
