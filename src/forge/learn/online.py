"""Learning for a user's own agent: from its trace and outcome, with no environment to replay.

    with Memory.open("team.db") as mem:
        ctx = mem.context("customer asks for a refund", viewer=Viewer.of("bot-1"))
        ...                                   # the agent acts, with ctx.render() in its prompt
        mem.outcome(ctx.recall_id, agent="bot-1", success=False)            # credit only
        mem.learn(trace, Outcome(success=False, feedback="..."), agent="bot-1")   # and reflect

Two verbs, one credit model, one learning function:

- :func:`credit` moves the counts of the units a recall showed (once per recall id, across
  processes and restarts), the authors' reputations, and retires rules that keep failing
  with the protocols' thresholds (:func:`forge.learn.loop.retire_failing`);
- :func:`learn` credits the trace's recalls, reflects on the trace with the LLM (or, without
  one, on what the trace itself says: failed tool calls, the feedback), refuses rules that
  name what belongs to this one case (ids, e-mail addresses, paths, timestamps, numbers),
  and stores what holds through :func:`forge.learn.loop.learn_from`, the function every
  learner uses (caps, contradiction retirement, archived reasons); a success is kept as a
  procedure. What it stored goes to ``peers`` (their exchanges judge it: signature, screen,
  dedup, corroboration, conflicts) when the caller names them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from forge.curate.admission import admit
from forge.engine.port import MemoryPort
from forge.errors import AccessError, ConflictError, LLMError, ValidationError
from forge.learn.loop import Caps, learn_from, retire_failing
from forge.learn.reflect import Reflection, RuleEdit
from forge.learn.trace import Outcome, Trace
from forge.llm.base import LLM, Message
from forge.llm.structured import complete_json
from forge.model import Context, Kind, Provenance, Rule, Scope, Unit, Viewer
from forge.share.consensus import Reputation

__all__ = ["Credited", "Learned", "credit", "instance_terms", "learn"]


_MAX_RULES = 3


@dataclass(frozen=True, slots=True)
class Credited:
    """What one outcome did: the units it counted on, and the ones it retired."""

    recall_id: str
    success: bool | None
    credited: tuple[str, ...] = ()
    retired: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"recall_id": self.recall_id, "success": self.success, "credited": list(self.credited), "retired": list(self.retired)}


@dataclass(frozen=True, slots=True)
class Learned:
    """What :func:`learn` did: units stored, recalls credited, rules retired, what peers
    made of it, and why anything the reflection proposed was dropped."""

    learned: tuple[Unit, ...] = ()
    credited: tuple[str, ...] = ()
    retired: tuple[str, ...] = ()
    shared: tuple[Mapping[str, Any], ...] = ()
    dropped: tuple[str, ...] = ()
    reflected_by: str = ""  # "llm", or "trace" when no LLM was usable

    def to_dict(self) -> dict[str, Any]:
        return {
            "learned": [{"id": u.id, "kind": u.kind.value, "content": u.content, "rule": u.rule.to_dict() if u.rule else None} for u in self.learned],
            "credited": list(self.credited),
            "retired": list(self.retired),
            "shared": [dict(s) for s in self.shared],
            "dropped": list(self.dropped),
            "reflected_by": self.reflected_by,
        }


# -- credit ------------------------------------------------------------------------------------


def credit(memory: MemoryPort, recall_id: str, *, agent: str, success: bool | None = None, score: float | None = None) -> Credited:
    """Credit the units recall ``recall_id`` showed ``agent`` with the outcome, once.

    :class:`~forge.errors.NotFoundError` for an id this memory never issued,
    :class:`~forge.errors.AccessError` for another agent's recall, and
    :class:`~forge.errors.ConflictError` when an outcome for it was already recorded; in
    each case nothing moves.
    """
    outcome = Outcome(success=success, score=score)
    ticket = _ticket(memory, recall_id, agent)
    with memory.transaction():
        if not memory.claim(f"outcome/{ticket.digest}"):
            raise ConflictError("an outcome for this recall_id was already recorded; each recall is credited once")
        return _credit(memory, recall_id, ticket.units, agent=agent, won=outcome.succeeded)


def _ticket(memory: MemoryPort, recall_id: str, agent: str) -> Any:
    ticket = memory.ticket(recall_id)
    if ticket.agent != agent:
        raise AccessError("that recall_id belongs to another agent's recall; report an outcome with the key that recalled")
    return ticket


def _credit(memory: MemoryPort, recall_id: str, units: Sequence[str], *, agent: str, won: bool | None) -> Credited:
    actor = f"agent:{agent}"
    updated = memory.record_use(units, success=won, actor=actor)
    retired = retire_failing(memory, updated, actor=actor) if won is not None else []
    if won is not None:
        # the crediting agent's own book, which its exchange weighs its peers' capsules by:
        # an author whose rules keep helping is believed more (the online champion)
        book = Reputation(memory, book=agent)
        for author in sorted({_author(u) for u in updated} - {"", agent}):
            book.record(author, success=won)
    return Credited(recall_id, won, tuple(u.id for u in updated), tuple(u.id for u in retired))


def _author(unit: Unit) -> str:
    """Who a unit's credit goes to: its origin when it was received, else its owner."""
    origin = unit.meta.get("origin")
    return origin if isinstance(origin, str) and origin else unit.owner


# -- what transfers ----------------------------------------------------------------------------

_INSTANCE = [
    (re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"), "an e-mail address"),
    (re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE), "a URL"),
    (re.compile(r"(?:^|[\s'\"(])(?:~|\.{1,2})?/[\w.-]+(?:/[\w.-]+)+"), "a path"),
    (re.compile(r"\b[A-Za-z]:\\[\w\\. -]+"), "a path"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2})?)?"), "a timestamp"),
    (re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b"), "a time of day"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE), "an id"),
    (re.compile(r"\b(?=[A-Za-z_-]*\d)(?=\w*[A-Za-z])[\w-]{5,}\b"), "an id"),
    (re.compile(r"\b\d[\d,.]{2,}\b|#\d+"), "a number"),
]


def instance_terms(text: str, trace: Trace | None = None) -> list[str]:
    """What ``text`` names that belongs to one case, each as ``"kind: term"``: e-mail
    addresses, URLs, paths, timestamps, ids (mixed letters and digits, UUIDs), numbers of
    three or more digits, and argument values of the trace's tool calls (an order number, a
    customer's name). A rule may name tools, error kinds and the task's vocabulary: what
    recurs in the next task."""
    found = [f"{what}: {m.group().strip()}" for pattern, what in _INSTANCE for m in pattern.finditer(text)]
    if trace is not None:
        low = text.lower()
        for step in trace.steps:
            for value in step.args.values():
                if isinstance(value, str | int | float) and not isinstance(value, bool):
                    v = str(value).strip()
                    if len(v) >= 3 and re.search(r"(?<![\w-])" + re.escape(v.lower()) + r"(?![\w-])", low):
                        found.append(f"an argument of this case: {v[:40]}")
    return list(dict.fromkeys(found))


def _checked(rule: Rule, trace: Trace) -> str:
    """Why ``rule`` cannot be kept ('' when it can)."""
    terms = instance_terms(" ".join([rule.when, *rule.avoid, *rule.prefer]), trace)
    if terms:
        return f"names what belongs to this one case ({'; '.join(terms[:3])}): {rule.text()[:80]!r}"
    if len(rule.when.split()) < 2:
        return f"its 'when' names no situation an agent could recognise: {rule.when!r}"
    return ""


# -- reflection ----------------------------------------------------------------------------

_SYSTEM = "You turn one task an agent did into short rules that help on the next tasks of the same kind."


def _render(trace: Trace, outcome: Outcome, limit: int = 24) -> str:
    lines = [f"Task ({trace.kind or 'unnamed kind'}): {trace.task[:400]}"]
    for s in trace.steps[-limit:]:
        if s.type == "tool":
            args = ", ".join(f"{k}={str(v)[:40]}" for k, v in list(s.args.items())[:6])
            lines.append(f"- tool {s.tool}({args})" + (f" -> ERROR {s.error[:160]}" if s.error else f" -> {s.content[:160]}"))
        else:
            lines.append(f"- {s.type}{f' ({s.role})' if s.role else ''}: {s.content[:200]}")
    if trace.answer:
        lines.append(f"Final answer: {trace.answer[:300]}")
    verdict = {True: "SUCCEEDED", False: "FAILED", None: "outcome unknown"}[outcome.succeeded]
    lines.append(f"Outcome: {verdict}" + (f" (score {outcome.score:g})" if outcome.score is not None else ""))
    if outcome.feedback:
        lines.append(f"Feedback: {outcome.feedback[:600]}")
    return "\n".join(lines)


_SCHEMA = {
    "type": "object",
    "properties": {
        "rules": {
            "type": "array",
            "maxItems": _MAX_RULES,
            "items": {
                "type": "object",
                "properties": {
                    "when": {"type": "string"},
                    "avoid": {"type": "string"},
                    "prefer": {"type": "string"},
                },
                "required": ["when", "avoid", "prefer"],
            },
        },
    },
    "required": ["rules"],
}


def _ask(llm: LLM, trace: Trace, outcome: Outcome) -> list[Rule]:
    prompt = (
        f"{_render(trace, outcome)}\n\n"
        "Write up to 3 rules for the next tasks of this kind. 'when': the situation, in words that recur "
        "(the task's kind, the tool, the error kind), never ids, names, numbers, paths or dates of this case. "
        "'avoid': what not to do there ('' if nothing). 'prefer': what to do instead ('' if nothing). "
        'Reply with JSON: {"rules": [{"when": ..., "avoid": ..., "prefer": ...}]}'
    )
    data = complete_json(llm, [Message("system", _SYSTEM), Message("user", prompt)], schema=_SCHEMA, retries=1, max_tokens=240)
    out = []
    for r in data.get("rules") or []:
        if not isinstance(r, Mapping):
            continue
        avoid, prefer = str(r.get("avoid") or "").strip(), str(r.get("prefer") or "").strip()
        try:
            out.append(Rule(when=str(r.get("when") or ""), avoid=(avoid,) if avoid else (), prefer=(prefer,) if prefer else ()))
        except ValidationError:
            continue
    return out


def _error_kind(error: str) -> str:
    """An error's kind in recurring words: its exception or code name, else its first words
    without the case's particulars."""
    named = re.match(r"\s*([A-Za-z][A-Za-z_.]*[A-Za-z])\s*:", error) or re.search(
        r"\b([A-Z][A-Za-z]+(?:Error|Exception|Timeout)|[a-z]+(?:_[a-z]+)+|[A-Z_]{4,})\b", error
    )
    if named:
        return named.group(1)
    words = [w for w in re.findall(r"[A-Za-z]+", error.lower()) if len(w) > 2][:5]
    return " ".join(words) or "an error"


def _from_trace(trace: Trace, outcome: Outcome) -> list[Rule]:
    """Rules the trace itself supports, for when no LLM is usable: a tool call that failed
    says not to call it that way again in that situation, and what was done after it (the
    next tool that worked) is preferred."""
    kind = trace.kind or "this kind of task"
    rules: list[Rule] = []
    for i, step in enumerate(trace.steps):
        if step.type != "tool" or not step.error.strip():
            continue
        after = next((s.tool for s in trace.steps[i + 1 :] if s.type == "tool" and not s.error and s.tool != step.tool), "")
        try:
            rules.append(Rule(
                when=f"{kind}: {step.tool} fails with {_error_kind(step.error)}",
                avoid=(f"retry {step.tool} unchanged",),
                prefer=(after,) if after else (),
            ))
        except ValidationError:
            continue
    return rules[:_MAX_RULES]


# -- learning ----------------------------------------------------------------------------------


def learn(
    memory: MemoryPort,
    trace: Trace | Mapping[str, Any],
    outcome: Outcome | Mapping[str, Any] | None = None,
    *,
    agent: str,
    llm: LLM | None = None,
    scope: Scope | str = "private",
    caps: Caps = Caps(),
    share: Callable[[Sequence[Unit]], Sequence[Mapping[str, Any]]] | None = None,
    once: str = "",
) -> Learned:
    """Learn from one task ``agent`` did: credit its recalls, reflect, check, store, share.

    Everything is validated before anything is written: a malformed trace, or a recall id
    this memory never issued or that belongs to another agent, raises with nothing moved. A
    recall already credited (an outcome was reported for it) is not counted again. Rules
    are stored through :func:`forge.learn.loop.learn_from` (owned by ``agent`` in ``scope``,
    capped, contradicted ones retired); a success is kept as a procedure, feedback as a
    lesson. ``share`` hands the stored units to the agent's peers and returns what each
    peer's exchange decided. ``once`` names this learning (a job id): claimed in the same
    transaction as its writes, so a job run again after a crash writes nothing twice
    (:class:`~forge.errors.ConflictError` when it already ran).
    """
    trace = trace if isinstance(trace, Trace) else Trace.from_dict(trace)
    outcome = outcome if isinstance(outcome, Outcome) else Outcome.from_dict(outcome)
    Viewer.of(agent)  # a named agent learns
    tickets = [(rid, _ticket(memory, rid, agent)) for rid in trace.recall_ids]
    won = outcome.succeeded
    dropped: list[str] = []

    proposed: list[Rule] = []
    reflected_by = "trace"
    if won is not True and llm is not None:
        try:
            proposed = _ask(llm, trace, outcome)
            reflected_by = "llm"
        except LLMError as exc:
            dropped.append(f"reflection: the LLM failed ({str(exc)[:120]}); rules come from the trace")
    if not proposed and won is not True:
        proposed = _from_trace(trace, outcome)
    rules = []
    for rule in proposed:
        if why := _checked(rule, trace):
            dropped.append(why)
        else:
            rules.append(rule)

    context = Context(domain=trace.kind, task=trace.kind, tags=("learned",))
    # what the dashboard shows a learned unit came from: the job and how it went, never the
    # task's own text or feedback (a copy travels to peers; the case's particulars stay here)
    origin = {"job": once, "kind": trace.kind, "success": won, "score": outcome.score, "recalls": len(trace.recall_ids)}
    others = _others(trace, outcome, agent=agent, scope=scope, context=context, dropped=dropped)
    credited: list[str] = []
    retired: list[str] = []
    stored: list[Unit] = []
    with memory.transaction():
        if once and not memory.claim(f"learn/{once}"):
            raise ConflictError(f"learning {once!r} already ran; its writes are in memory")
        for rid, ticket in tickets:
            if not memory.claim(f"outcome/{ticket.digest}"):
                dropped.append(f"recall {rid[:16]}...: already credited")
                continue
            done = _credit(memory, rid, ticket.units, agent=agent, won=won)
            credited += done.credited
            retired += done.retired
        if rules:
            applied = learn_from(
                memory, Reflection(edits=(RuleEdit("", (), tuple(rules)),)), owner=agent, actor=f"agent:{agent}",
                shown={}, context=context, scope=scope, caps=caps,
                add=lambda units: _admitted(memory, [_from(u, origin) for u in units], agent),
            )
            stored += applied.added
            retired += [u.id for u, _ in applied.removed]
        if others:
            stored += _admitted(memory, [_from(u, origin) for u in others], agent)
    shared = tuple(share(stored)) if share is not None and stored else ()
    return Learned(tuple(stored), tuple(dict.fromkeys(credited)), tuple(dict.fromkeys(retired)), shared, tuple(dropped), reflected_by)


def _others(trace: Trace, outcome: Outcome, *, agent: str, scope: Scope | str, context: Context, dropped: list[str]) -> list[Unit]:
    """A success as a procedure (the tools in the order that worked), and feedback as a
    lesson, each only when it names nothing of this one case."""
    out = []
    kind = trace.kind or "tasks like this"
    if outcome.succeeded is True and trace.tools:
        text = f"For {kind}: {' -> '.join(trace.tools)} worked."
        out.append((Kind.PROCEDURE, text, {"steps": trace.tools}))
    if outcome.feedback.strip():
        text = f"For {kind}: {' '.join(outcome.feedback.split())[:400]}"
        out.append((Kind.LESSON, text, {}))
    units = []
    for kind_, text, meta in out:
        terms = instance_terms(text, trace)
        if terms:
            dropped.append(f"{kind_.value} names what belongs to this one case ({'; '.join(terms[:3])}): {text[:80]!r}")
            continue
        units.append(Unit(text, kind=kind_, owner=agent, scope=Scope.parse(scope), context=context,
                          provenance=Provenance(source=f"learned:{agent}"), meta=meta))
    return units


def _from(unit: Unit, origin: Mapping[str, Any]) -> Unit:
    return unit.replace(meta={**unit.meta, "learned_from": dict(origin)})


def _admitted(memory: MemoryPort, units: Sequence[Unit], agent: str) -> list[Unit]:
    """Store ``units`` through admission (a known rule merges instead of repeating); the
    units that now hold them."""
    decisions = admit(memory, list(units), actor=f"agent:{agent}")
    ids = list(dict.fromkeys(d.unit_id for d in decisions))
    found = {u.id: u for u in memory.get_many(ids, viewer=Viewer.admin())}
    return [found[i] for i in ids if i in found]

