"""Decay, expiry, caps and conflicts over time: the curation pass, its plan and its record.

A unit's life::

    (write) --admission--> ACTIVE --newer validated contradiction--> SUPERSEDED
                             |  ^
      decay, TTL, a cap,     |  |  restore()
      or subsumed by a       v  |
      generalisation ---> ARCHIVED   (kept, exportable, restorable; never deleted)

:func:`plan` reads the store and says what a pass would change and why; :func:`apply`
writes a plan in one transaction (status events carry each reason, and a ``curate`` event
the run's summary); :func:`curate` does both, or only the first with ``dry_run=True``.
Nothing here reads a clock of its own: ``now`` is passed in, so a pass is reproducible.

Strength (:func:`strength`) is what decay and caps rank by::

    last_seen = latest of created_at, last_access (recalled), the last merge into it, restored_at
    half_life = HALF_LIFE_DAYS[kind] * (1 + 0.5 ln(1 + recalls) + ln(1 + successes))
    strength  = 0.5 ** (age_since_last_seen / half_life) * (0.25 + 0.75 (0.6 validation + 0.4 importance))

so a unit fades unless it is used, used successfully it fades slower, and a unit that keeps
failing (low validation) starts lower. ``meta["pinned"]`` exempts a unit from decay, TTL and caps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from forge.curate.changes import Change, all_units
from forge.engine.port import MemoryPort
from forge.errors import UserError, ValidationError
from forge.model import Kind, Relation, RelationType, Status, Unit, Viewer, new_id

__all__ = [
    "DAY",
    "EVICTION_ORDER",
    "HALF_LIFE_DAYS",
    "Belief",
    "CurationPolicy",
    "Plan",
    "Strength",
    "apply",
    "believed_at",
    "curate",
    "last_seen",
    "plan",
    "restore",
    "strength",
    "timeline",
    "valid_from",
]

DAY = 86_400.0
#: How many days an unused unit of each kind takes to lose half its strength.
HALF_LIFE_DAYS: Mapping[str, float] = {
    Kind.EPISODE.value: 14.0,
    Kind.EXAMPLE.value: 30.0,
    Kind.FACT.value: 90.0,
    Kind.LESSON.value: 60.0,
    Kind.RULE.value: 60.0,
    Kind.PROCEDURE.value: 120.0,
    Kind.PREFERENCE.value: 180.0,
    Kind.PROFILE.value: 365.0,
}
#: The order caps evict in, stated once: weakest first, then least recently seen, then id.
EVICTION_ORDER = "lowest strength first, then least recently seen, then unit id"


@dataclass(frozen=True, slots=True)
class Strength:
    """A unit's strength in [0, 1] and the numbers behind it."""

    value: float
    age_days: float
    half_life_days: float
    quality: float

    def explain(self) -> str:
        return (
            f"strength {self.value:.3f} (unseen {self.age_days:.1f} d, half-life {self.half_life_days:.1f} d, "
            f"quality {self.quality:.2f})"
        )


def _int(meta: Mapping[str, Any], key: str) -> int:
    v = meta.get(key, 0)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else 0


def _ts(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) else 0.0


def last_seen(unit: Unit) -> float:
    """When the unit was last written, recalled, merged into (admission) or restored.

    Not ``updated_at``: the store stamps it with its own clock on every write, curation's
    included, so it would make a pass depend on when it runs rather than on ``now``.
    """
    merged = unit.meta.get("merged")
    last_merge = max((_ts(m.get("at")) for m in merged if isinstance(m, Mapping)), default=0.0) if isinstance(merged, list) else 0.0
    return max(unit.created_at, unit.last_access or 0.0, _ts(unit.meta.get("restored_at")), last_merge)


def strength(unit: Unit, *, now: float, half_lives: Mapping[str, float] = HALF_LIFE_DAYS) -> Strength:
    """How much a unit still earns its place (see the module docstring for the formula)."""
    base = float(half_lives.get(unit.kind.value, 60.0))
    recalls = unit.access_count + _int(unit.meta, "uses")
    hl = base * (1.0 + 0.5 * math.log1p(recalls) + math.log1p(_int(unit.meta, "successes")))
    age = max(0.0, now - last_seen(unit)) / DAY
    quality = 0.6 * unit.validation + 0.4 * unit.importance
    value = 0.5 ** (age / hl) * (0.25 + 0.75 * quality)
    return Strength(round(value, 6), round(age, 3), round(hl, 3), round(quality, 4))


def _expiry(unit: Unit, policy: CurationPolicy) -> tuple[float, str] | None:
    """(when it expires, which TTL said so), or None: the unit's own TTL wins over its scope's and kind's."""
    meta = unit.meta
    at = meta.get("expires_at")
    if isinstance(at, int | float) and not isinstance(at, bool):
        return float(at), "its expires_at"
    for ttl, what in (
        (meta.get("ttl_s"), "its own ttl_s"),
        (policy.ttl_by_scope.get(str(unit.scope)), f"the TTL of scope {unit.scope}"),
        (policy.ttl_by_kind.get(unit.kind.value), f"the TTL of kind {unit.kind.value}"),
    ):
        if isinstance(ttl, int | float) and not isinstance(ttl, bool) and ttl > 0:
            return unit.created_at + float(ttl), f"{what} ({float(ttl):.0f} s)"
    return None


@dataclass(frozen=True, slots=True)
class CurationPolicy:
    """What one pass may do. Caps are ``None`` (no cap) or the most active units allowed.

    ``cap_per_agent`` counts units by owner, ``cap_per_scope`` by scope, ``cap_per_kind``
    by kind; over a cap the weakest are archived first (:data:`EVICTION_ORDER`).
    A contradiction is settled when the newer side is validated (``validated_at``) and
    better validated than the older one, and both have one owner: a ``contradicts`` link
    between two owners' units never retires either (it is left for an operator).
    """

    archive_below: float = 0.1
    half_lives: Mapping[str, float] = field(default_factory=lambda: dict(HALF_LIFE_DAYS))
    ttl_by_scope: Mapping[str, float] = field(default_factory=dict)
    ttl_by_kind: Mapping[str, float] = field(default_factory=dict)
    cap_per_agent: int | None = None
    cap_per_scope: int | None = None
    cap_per_kind: Mapping[str, int] = field(default_factory=dict)
    validated_at: float = 0.6
    decay: bool = True
    conflicts: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.archive_below < 1:
            raise ValidationError(f"archive_below must be in [0, 1), got {self.archive_below}")
        if not 0 < self.validated_at <= 1:
            raise ValidationError(f"validated_at must be in (0, 1], got {self.validated_at}")
        for kind, days in self.half_lives.items():
            Kind.parse(kind)
            if not isinstance(days, int | float) or not days > 0:
                raise ValidationError(f"the half-life of {kind} must be a positive number of days, got {days!r}")
        for kind in (*self.ttl_by_kind, *self.cap_per_kind):
            Kind.parse(kind)
        for name, cap in (("cap_per_agent", self.cap_per_agent), ("cap_per_scope", self.cap_per_scope), *self.cap_per_kind.items()):
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
                raise ValidationError(f"cap {name} must be a non-negative integer, got {cap!r}")


@dataclass(slots=True)
class Plan:
    """What a pass would change (in order), over how many units, at which ``now``."""

    run_id: str
    now: float
    scanned: int = 0
    changes: list[Change] = field(default_factory=list)
    applied: bool = False
    consolidation: Any = None  # a forge.curate.consolidate.Consolidation when the pass consolidated

    @property
    def all_changes(self) -> list[Change]:
        """Consolidation's archivals (written by consolidation itself) and this plan's changes."""
        return [*(self.consolidation.changes if self.consolidation is not None else ()), *self.changes]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.all_changes:
            out[c.cause] = out.get(c.cause, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        d = {
            "run_id": self.run_id,
            "now": self.now,
            "scanned": self.scanned,
            "applied": self.applied,
            "counts": self.counts(),
            "changes": [c.to_dict() for c in self.all_changes],
        }
        if self.consolidation is not None:
            d["consolidation"] = self.consolidation.to_dict()
        return d


def _active(memory: MemoryPort) -> list[Unit]:
    return all_units(memory)


def _contradictions(store: MemoryPort, active: Mapping[str, Unit]) -> list[tuple[str, str, str]]:
    """(src, dst, note) of every ``contradicts`` relation between two active units, oldest first."""
    ids = list(active)
    found: dict[tuple[str, str], Relation] = {}
    for i in range(0, len(ids), 2000):  # bounded: SQLite takes a limited number of parameters
        for _, rel in store.neighbors(ids[i : i + 2000], viewer=Viewer.admin(), types=[RelationType.CONTRADICTS]):
            if rel.src in active and rel.dst in active:
                found[(rel.src, rel.dst)] = rel
    rels = sorted(found.values(), key=lambda r: (r.created_at, r.src, r.dst))
    return [(r.src, r.dst, r.note) for r in rels]


def valid_from(unit: Unit) -> float:
    v = unit.meta.get("valid_from")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else unit.created_at


def _clock(now: float | None) -> float:
    if now is None:
        return time.time()
    if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
        raise ValidationError(f"now must be a finite time in epoch seconds, got {now!r}")
    return float(now)


def plan(memory: MemoryPort, *, policy: CurationPolicy | None = None, now: float | None = None) -> Plan:
    """What a pass would change, and why, without changing anything."""
    policy = policy or CurationPolicy()
    now = _clock(now)
    units = _active(memory)
    out = Plan(run_id=new_id(), now=now, scanned=len(units))
    gone: set[str] = set()

    def drop(change: Change) -> None:
        gone.add(change.unit_id)
        out.changes.append(change)

    by_id = {u.id: u for u in units}
    if policy.conflicts:
        for src, dst, note in _contradictions(memory, by_id):
            a, b = by_id[src], by_id[dst]
            if a.id in gone or b.id in gone or a.owner != b.owner:
                continue  # between two owners a contradiction is one writer's claim about another's unit: an operator settles it
            new, old = (a, b) if (valid_from(a), a.id) >= (valid_from(b), b.id) else (b, a)
            if new.validation >= policy.validated_at and new.validation > old.validation:
                drop(
                    Change(
                        "supersede", old.id, "conflict",
                        f"contradicted by newer {new.id} ({note or 'contradicts'}), validated {new.validation:.2f} > {old.validation:.2f}",
                        by=new.id,
                    )
                )
    pinned = {u.id for u in units if u.meta.get("pinned") is True}
    strengths = {u.id: strength(u, now=now, half_lives=policy.half_lives) for u in units}
    for u in units:
        if u.id in gone or u.id in pinned:
            continue
        exp = _expiry(u, policy)
        if exp is not None and now >= exp[0]:
            drop(Change("archive", u.id, "ttl", f"expired {(now - exp[0]) / DAY:.1f} d ago by {exp[1]}"))
        elif policy.decay and strengths[u.id].value < policy.archive_below:
            drop(Change("archive", u.id, "decay", f"{strengths[u.id].explain()} < {policy.archive_below}"))
    caps: list[tuple[str, int | None, Any]] = [
        ("agent", policy.cap_per_agent, lambda u: u.owner or None),
        ("scope", policy.cap_per_scope, lambda u: str(u.scope)),
    ]
    caps += [(f"kind {k}", n, lambda u, k=k: k if u.kind.value == k else None) for k, n in sorted(policy.cap_per_kind.items())]
    for what, cap, key_of in caps:
        if cap is None:
            continue
        groups: dict[str, list[Unit]] = {}
        for u in units:
            key = key_of(u)
            if key is not None and u.id not in gone:
                groups.setdefault(key, []).append(u)
        for key, members in sorted(groups.items()):
            over = len(members) - cap
            if over <= 0:
                continue
            evictable = sorted((u for u in members if u.id not in pinned), key=lambda u: (strengths[u.id].value, last_seen(u), u.id))
            for u in evictable[:over]:
                drop(
                    Change(
                        "archive", u.id, "cap",
                        f"{what} {key} holds {len(members)} > cap {cap}; evicted {EVICTION_ORDER} ({strengths[u.id].explain()})",
                    )
                )
    return out


def apply(memory: MemoryPort, plan: Plan, *, actor: str = "") -> Plan:
    """Write ``plan`` in one transaction; each status event carries its change's reason."""
    actor = actor or f"curate:{plan.run_id}"
    admin = Viewer.admin()
    with memory.transaction():
        for c in plan.changes:
            reason = f"curate {plan.run_id}: {c.cause}: {c.reason}"[:1000]
            if c.op == "supersede" and c.by:
                old, new = memory.get(c.unit_id, viewer=admin), memory.get(c.by, viewer=admin)
                memory.update(old.replace(meta={**old.meta, "valid_to": valid_from(new), "superseded_by": new.id}), actor=actor, reembed=False)
                memory.relate(new.id, old.id, RelationType.SUPERSEDES.value, note=c.reason[:300], actor=actor)
                memory.set_status(c.unit_id, Status.SUPERSEDED, reason=reason, actor=actor)
            else:
                memory.set_status(c.unit_id, Status.ARCHIVED, reason=reason, actor=actor)
        plan.applied = True
        summary = {"run_id": plan.run_id, "now": plan.now, "scanned": plan.scanned, "counts": plan.counts()}
        if plan.consolidation is not None:
            summary["generalised"] = [g["unit_id"] for g in plan.consolidation.to_dict()["generalised"]]
        memory.append_event("curate", actor=actor, data=summary)
    return plan


def curate(
    memory: MemoryPort,
    *,
    policy: CurationPolicy | None = None,
    now: float | None = None,
    dry_run: bool = False,
    consolidate: Any = None,
    actor: str = "",
) -> Plan:
    """One curation pass: consolidate (when ``consolidate`` is a ConsolidationPolicy), then
    settle conflicts, expire, decay and cap. ``dry_run`` only plans: the store is not touched."""
    now = _clock(now)
    cons = None
    if consolidate is not None:
        from forge.curate.consolidate import consolidate as run_consolidation

        cons = run_consolidation(memory, policy=consolidate, now=now, dry_run=dry_run, actor=actor)
    p = plan(memory, policy=policy, now=now)
    p.consolidation = cons
    if cons is not None:  # a unit consolidation archives (or would) is not archived twice
        subsumed = {x.unit_id for x in cons.changes}
        p.changes = [c for c in p.changes if c.unit_id not in subsumed]
    return p if dry_run else apply(memory, p, actor=actor)


def restore(memory: MemoryPort, unit_id: str, *, reason: str = "restored", actor: str = "", now: float | None = None) -> Unit:
    """Bring an archived unit back into recall; its decay clock restarts at ``now``."""
    unit = memory.get(unit_id, viewer=Viewer.admin())
    if unit.status is not Status.ARCHIVED:
        raise UserError(f"unit {unit_id} is {unit.status.value}, not archived; only archived units can be restored")
    now = time.time() if now is None else now
    with memory.transaction():
        memory.set_status(unit_id, Status.ACTIVE, reason=f"restore: {reason}"[:500], actor=actor)
        restored = memory.update(unit.replace(status=Status.ACTIVE, last_access=now, meta={**unit.meta, "restored_at": now}), actor=actor, reembed=False)
    return restored


@dataclass(frozen=True, slots=True)
class Belief:
    """One version of a belief: valid-time (``valid_from``/``valid_to``) beside record-time."""

    unit_id: str
    content: str
    status: str
    valid_from: float
    valid_to: float | None
    recorded_at: float | None  # when the store learned it (its add event)
    retired_at: float | None  # when the store marked it superseded (its status event)
    superseded_by: str | None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def timeline(memory: MemoryPort, unit_id: str) -> list[Belief]:
    """The chain of beliefs ``unit_id`` belongs to (``supersedes`` links both ways), oldest first."""
    admin = Viewer.admin()
    seen: dict[str, Unit] = {}
    todo = [unit_id]
    while todo:
        uid = todo.pop()
        if uid in seen:
            continue
        seen[uid] = memory.get(uid, viewer=admin)
        for r in memory.relations(uid, viewer=admin):
            if r.type is RelationType.SUPERSEDES:
                todo += [x for x in (r.src, r.dst) if x not in seen]
    out = []
    for u in seen.values():
        events = memory.events(viewer=admin, unit_id=u.id, ops=["add", "status"], limit=1000)
        added = next((e.ts for e in events if e.op == "add"), None)
        retired = [e for e in events if e.op == "status" and e.data.get("to") == Status.SUPERSEDED.value]
        vt = u.meta.get("valid_to")
        out.append(
            Belief(
                unit_id=u.id,
                content=u.content,
                status=u.status.value,
                valid_from=valid_from(u),
                valid_to=float(vt) if isinstance(vt, int | float) and not isinstance(vt, bool) else None,
                recorded_at=added,
                retired_at=retired[-1].ts if retired else None,
                superseded_by=str(u.meta["superseded_by"]) if u.meta.get("superseded_by") else None,
                reason=str(retired[-1].data.get("reason", "")) if retired else "",
            )
        )
    return sorted(out, key=lambda b: (b.valid_from, b.unit_id))


def believed_at(beliefs: Sequence[Belief], t: float) -> Belief | None:
    """Which belief of a timeline held at valid time ``t`` (None before the first)."""
    held = [b for b in beliefs if b.valid_from <= t and (b.valid_to is None or t < b.valid_to)]
    return held[-1] if held else None
