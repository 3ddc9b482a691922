"""The receiving side of broadcast: judge a capsule before it becomes one of our memories.

    exchange = Exchange(memory, "agent-2", keyring)
    decision = exchange.receive(capsule)        # from any transport: the bus hands us Capsules
    decision.outcome, decision.reason           # ('accepted', 'useful'), ('quarantined', 'injection'), ...
    exchange.counts(by="reason")                # {'useful': 12, 'replay': 1, 'injection': 2, ...}

The pipeline, cheapest and most decisive checks first:

1. **verify**: signatures (unsigned, unknown sender, tampered, an origin that did not sign
   what it is said to have written, a capsule addressed to another agent), replay (capsule id already
   seen, remembered across restarts through the ledger), expiry (``ttl``), clock skew, hop
   limit, the agent's own units coming back (echo) and per-sender floods;
2. **screen**: prompt injection, secrets, personal data, oversized or malformed text
   (:mod:`forge.share.screen`); such capsules are stored *quarantined* with their findings, with
   secrets redacted, never silently dropped;
3. **novelty**: the closest active units in local memory; a contradiction goes to
   reconciliation, a near-duplicate becomes a corroboration of the existing unit from that
   origin (counted once per origin: no echo chamber) instead of a copy;
4. **assessment**: a pluggable :class:`Assessor` scores usefulness, scaled by the source's
   reputation;
5. **integrate** with provenance (``broadcast:<sender>``, origin, received scope in meta),
   or reject with the reason. Conflicts found in step 3 are recorded as ``contradicts`` and
   settled by the resolution policy (:mod:`forge.share.consensus`).

Every capsule yields exactly one :class:`~forge.share.ledger.Ruling` in the ledger, listable
with :meth:`Exchange.decisions` and countable per reason with :meth:`Exchange.counts`.
Nothing here knows about a transport.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from forge.engine.port import MemoryPort
from forge.errors import BackendError, ForgeError, NotFoundError, ValidationError
from forge.model import Provenance, Status, Unit, Viewer
from forge.share import doubt
from forge.share.assess import Assessment, Assessor, HeuristicAssessor, LLMAssessor
from forge.share.capsule import SYSTEM_META, Capsule, Keyring, content_hash
from forge.share.conflicts import (
    ConfidencePolicy,
    Conflict,
    Detector,
    HeuristicDetector,
    ResolutionPolicy,
)
from forge.share.consensus import Consensus
from forge.share.ledger import Ledger, Ruling
from forge.share.screen import BLOCKING, Screen
from forge.share.verdict import Held, hold, redact_tree
from forge.store import Filter

__all__ = [
    "Assessment",
    "Assessor",
    "Ruling",
    "Exchange",
    "Held",
    "HeuristicAssessor",
    "LLMAssessor",
    "Limits",
    "hold",
    "redact_tree",
]


# ---------------------------------------------------------------------------------------------
# Exchange


@dataclass(frozen=True, slots=True)
class Limits:
    """Thresholds of the receiving pipeline, in one place.

    ``duplicate_at`` is the cosine above which a unit is the same memory (0.85 suits the
    hashing embedder's paraphrases; trained embedders score paraphrases higher);
    ``related_at`` is where conflict checks start; ``accept_at`` applies to the
    reputation-weighted usefulness ``score * (0.5 + reputation)``.
    """

    duplicate_at: float = 0.85
    related_at: float = 0.5
    accept_at: float = 0.45
    candidates: int = 5
    max_hops: int = 8
    max_skew_s: float = 300.0
    flood_limit: int = 30
    flood_window_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.related_at <= self.duplicate_at <= 1:
            raise ValidationError("limits need 0 < related_at <= duplicate_at <= 1")
        if self.candidates < 1 or self.max_hops < 0 or self.flood_limit < 1 or self.flood_window_s <= 0:
            raise ValidationError("limits need candidates >= 1, max_hops >= 0, flood_limit >= 1, flood_window_s > 0")


_VERIFY_REASONS = {
    "unsigned": "unsigned",
    "bad signature": "tampered",
    "content hash mismatch": "tampered",
    "origin unsigned": "forged_origin",
    "bad origin signature": "forged_origin",
}


def _verify_reason(problem: str) -> str:
    if problem in _VERIFY_REASONS:
        return _VERIFY_REASONS[problem]
    for prefix, reason in (("unknown sender", "unknown_sender"), ("unknown origin", "forged_origin"), ("not addressed", "misdirected")):
        if problem.startswith(prefix):
            return reason
    return "unverified"


@dataclass(slots=True)
class _Stage:
    """What one receive adds to the exchange's memory of the past; kept only on commit."""

    seen: set[str] = field(default_factory=set)
    direct: set[str] = field(default_factory=set)
    counted: set[tuple[str, str]] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class _Verdict:
    """What the checks decided before anything is written: reject, quarantine or store."""

    action: str
    reason: str = ""
    detail: str = ""
    verified: bool = False
    findings: tuple[Any, ...] | list[Any] = ()
    content: str = ""
    redacted: bool = False
    vector: Any = None


class Exchange:
    """One agent's receiving pipeline: ``receive(capsule) -> Ruling``.

    Received units are stored private to this agent (``owner=agent_id``) with their origin
    in ``meta``; consensus promotion is what makes them group knowledge. ``groups`` are the
    receiver's groups (visibility for dedup); the consensus group is added to them.
    Thread-safe: one capsule is judged at a time.
    """

    def __init__(
        self,
        memory: MemoryPort,
        agent_id: str,
        keyring: Keyring,
        *,
        assessor: Assessor | None = None,
        detector: Detector | None = None,
        policy: ResolutionPolicy | None = None,
        screen: Screen | None = None,
        consensus: Consensus | None = None,
        groups: Iterable[str] = (),
        limits: Limits = Limits(),
        block: Iterable[str] = BLOCKING,
        redact: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not agent_id:
            raise ValidationError("an exchange needs the receiving agent's id")
        self.memory = memory
        self.agent_id = agent_id
        self.keyring = keyring
        self.assessor = assessor if assessor is not None else HeuristicAssessor()
        self.detector = detector if detector is not None else HeuristicDetector(min_similarity=limits.related_at)
        self.policy = policy if policy is not None else ConfidencePolicy()
        self.screen = screen if screen is not None else Screen()
        self.consensus = consensus if consensus is not None else Consensus(memory, agent_id=agent_id, clock=clock)
        self.ledger: Ledger = self.consensus.ledger
        self.limits = limits
        self.block = frozenset(block)
        self.redact = redact
        self.clock = clock
        self.actor = f"exchange:{agent_id}"
        group_names = set(groups) | ({self.consensus.group} if self.consensus.group else set())
        self.viewer = Viewer.of(agent_id, group_names)
        self._lock = threading.RLock()
        self._stage: _Stage | None = None  # the receive in progress (under the lock)
        self._recent: dict[str, deque[float]] = {}
        # Rebuilt from the ledger, so replay protection and echo counting survive a restart.
        self._seen = {d.capsule_id for d in self.ledger.list() if d.verified and d.capsule_id}
        self._direct = {d.sender for d in self.ledger.list() if d.verified and d.sender}
        self._counted = {
            (d.origin, d.hash)
            for d in self.ledger.list(outcome=("accepted", "corroborated", "conflict", "merged"))
            if d.hash
        }

    # -- public ---------------------------------------------------------------------------
    def receive(self, capsule: Capsule) -> Ruling:
        """Judge one capsule and act on it; the returned decision is already in the ledger.

        Whatever a capsule holds, a malformed or hostile one becomes a recorded rejection
        (``malformed``: a :class:`ValidationError`), never an exception: a bad message must
        not block an inbox. Any other exception is FORGE's own fault (a bug in a screen, an
        assessor, a policy), not the sender's: it is raised, nothing is recorded against the
        sender, and the capsule stays unseen, so its redelivery is judged afresh. What
        the capsule changes (a stored unit, a corroboration, a promotion) and its ledger
        record are written in one store transaction, and its id counts as seen (replay
        protection) only once that transaction commits. A backend failure (the store or the
        embedder) is recorded as ``error`` and raised: nothing of the capsule was kept, so
        its redelivery is judged afresh (at-least-once delivery stays at-least-once).
        """
        with self._lock:
            if not isinstance(capsule, Capsule):
                return self._record(Ruling("rejected", "malformed", f"expected a Capsule, got {type(capsule).__name__}", agent=self.agent_id))
            self._stage = _Stage()
            try:
                now = self.clock()
                verdict = self._judge(capsule, now)  # no writes: verify, screen, embed
                with self.ledger.staged(), self.memory.transaction():
                    # Durable and shared: a replica of this agent over the same store that
                    # took the capsule first (or is taking it now) makes this one a replay.
                    if capsule.id in self._stage.seen and not self.memory.claim(f"capsule/{self.agent_id}/{capsule.id}"):
                        verdict = _Verdict("reject", reason="replay", detail=f"capsule {capsule.id} was already received")
                    decision = self._act(capsule, verdict, now)
            except BackendError as exc:
                # A store or embedder failure mid-way: say so in the ledger, then let the caller see it.
                with contextlib.suppress(ForgeError):
                    self._record(self._decision(capsule, "rejected", "error", f"{type(exc).__name__}: {exc}"[:300]))
                raise
            except ValidationError as exc:  # malformed or hostile content: recorded, never raised
                return self._record(
                    self._decision(capsule, "rejected", "malformed", f"{type(exc).__name__}: {exc}"[:300])
                )
            finally:
                stage, self._stage = self._stage, None
            self._seen |= stage.seen
            self._direct |= stage.direct
            self._counted |= stage.counted
            return decision

    def receive_raw(self, data: str | bytes | Mapping[str, Any]) -> Ruling:
        """Parse a capsule from JSON (text, bytes or a dict) and receive it; malformed input is recorded."""
        try:
            capsule = Capsule.from_dict(data) if isinstance(data, Mapping) else Capsule.from_json(data)
        except ValidationError as exc:  # from_dict / from_json say every malformed input with it
            with self._lock:
                return self._record(Ruling("rejected", "malformed", f"{exc}"[:300], agent=self.agent_id))
        return self.receive(capsule)

    def decisions(
        self,
        *,
        outcome: str | Iterable[str] | None = None,
        reason: str | None = None,
        sender: str | None = None,
        origin: str | None = None,
        unit_id: str | None = None,
        since: float | None = None,
        limit: int | None = None,
    ) -> list[Ruling]:
        """Decisions oldest first (consensus bookkeeping included), narrowed by the given fields."""
        return self.ledger.list(
            outcome=outcome, reason=reason, sender=sender, origin=origin, unit_id=unit_id, since=since, limit=limit
        )

    def counts(self, *, by: str = "reason", outcome: str | Iterable[str] | None = None) -> dict[str, int]:
        """Decisions counted per ``reason`` (default), ``outcome``, ``sender`` or ``origin``."""
        return self.ledger.counts(by=by, outcome=outcome)

    def quarantined(self, *, limit: int = 100) -> list[Unit]:
        """Units held in quarantine in this agent's store, with findings in ``meta["quarantine"]``."""
        f = Filter.make(status=["quarantined"], owner=self.agent_id)
        return self.memory.list(viewer=self.viewer, filter=f, limit=limit)

    # -- pipeline -------------------------------------------------------------------------
    def _judge(self, capsule: Capsule, now: float) -> _Verdict:
        """Everything decided before writing: verification, screening, the embedding."""
        # The recipient is part of what the sender signed: a capsule lifted from another
        # agent's inbox is "misdirected" here, before it can burn or reuse a capsule id.
        problem = self.keyring.verify(capsule, recipient=self.agent_id)
        if problem is not None:
            return _Verdict("reject", reason=_verify_reason(problem), detail=problem)
        if capsule.id in self._seen:
            return _Verdict("reject", reason="replay", detail=f"capsule {capsule.id} was already received")
        self._stage.seen.add(capsule.id)
        self._stage.direct.add(capsule.sender)
        checks = (
            (capsule.expired(now), "expired", lambda: f"sent {now - capsule.sent_at:.0f}s ago with ttl {capsule.ttl:.0f}s"),
            (capsule.sent_at > now + self.limits.max_skew_s, "from_future", lambda: f"sent_at is {capsule.sent_at - now:.0f}s in the future"),
            (capsule.hops > self.limits.max_hops, "too_many_hops", lambda: f"{capsule.hops} hops > {self.limits.max_hops}"),
            (capsule.origin == self.agent_id, "echo", lambda: "our own unit came back; it is not evidence for itself"),
        )
        for failed, reason, detail in checks:
            if failed:
                return _Verdict("reject", reason=reason, detail=detail(), verified=True)
        outside = self._out_of_scope(capsule)
        if outside:
            return _Verdict("reject", reason="out_of_scope", detail=outside, verified=True)
        if capsule.kind == "help_request":
            return _Verdict("reject", reason="not_memory", detail="a help request is a question for the agent, not a memory", verified=True)
        if self._flooding(capsule.sender, now):
            detail = f"more than {self.limits.flood_limit} capsules in {self.limits.flood_window_s:.0f}s from {capsule.sender}"
            return _Verdict("reject", reason="rate_limited", detail=detail, verified=True)
        held = doubt.sort(self.screen, capsule.unit, block=self.block, redact=self.redact)
        if isinstance(held, Held):
            return _Verdict("quarantine", findings=held.findings, content=held.content, redacted=held.redacted)
        if held is not None:  # a Doubt: stored out of recall until an independent origin sends it too
            return _Verdict("doubt", findings=(held,), vector=self.memory.embed_units([capsule.unit])[0])
        # The unit we would store keeps the capsule unit's content, context and search
        # context, so this is the vector it is stored with (found near, then written).
        vector = self.memory.embed_units([capsule.unit])[0]
        return _Verdict("store", vector=vector)

    def _out_of_scope(self, capsule: Capsule) -> str:
        """Why this receiver may not hold the capsule's unit ('' if it may).

        A group unit (by the capsule's scope or the unit's own) is only for that group's
        members: a sender that sends one to anyone else is mistaken or leaking, and the
        receiver keeps nothing. (A private unit travels only when its owner sends it on
        purpose; the importance trigger and periodic sync never pick one.)
        """
        for scope in dict.fromkeys((capsule.scope, str(capsule.unit.scope))):
            if scope.startswith("group:") and scope[len("group:"):] not in self.viewer.groups:
                return f"the unit is scoped {scope} and {self.agent_id} is not a member"
        return ""

    def _act(self, capsule: Capsule, verdict: _Verdict, now: float) -> Ruling:
        """The writes for a verdict, inside the receive transaction."""
        if verdict.action == "reject":
            return self._reject(capsule, verdict.reason, verdict.detail, verified=verdict.verified)
        if verdict.action == "quarantine":
            return self._quarantine(capsule, verdict, now)
        doubt_ruling = self._doubt(capsule, verdict, now)
        if doubt_ruling is not None:
            return doubt_ruling
        incoming = capsule.unit
        vector = verdict.vector
        conflicts, duplicate, related = self._neighbours(incoming, vector, capsule)
        if duplicate is not None and not conflicts:
            return self._corroborate(capsule, duplicate[0], duplicate[1])

        rep = min(self.consensus.reputation.get(capsule.origin), self.consensus.reputation.get(capsule.sender))
        assessment = self.assessor.assess(incoming, capsule=capsule)
        weighted = max(0.0, min(1.0, assessment.score * (0.5 + rep)))
        if weighted < self.limits.accept_at:
            return self._reject(
                capsule,
                "low_value",
                f"usefulness {assessment.score:.2f} x reputation weight {0.5 + rep:.2f} = {weighted:.2f} < {self.limits.accept_at:.2f} ({assessment.reason})",
                verified=True,
                score=weighted,
            )
        return self._integrate(capsule, vector, assessment, rep, weighted, conflicts, related, now)

    def _flooding(self, sender: str, now: float) -> bool:
        window = self._recent.setdefault(sender, deque())
        while window and window[0] <= now - self.limits.flood_window_s:
            window.popleft()
        window.append(now)
        return len(window) > self.limits.flood_limit

    def _neighbours(
        self, incoming: Unit, vector: Any, capsule: Capsule
    ) -> tuple[list[tuple[Unit, Conflict, float]], tuple[Unit, float] | None, tuple[Unit, float] | None]:
        """Conflicting, duplicate and merely related active units near the incoming one."""
        near = self.memory.nearest(vector, k=self.limits.candidates, viewer=self.viewer, at_least=self.limits.related_at)
        conflicts: list[tuple[Unit, Conflict, float]] = []
        duplicate: tuple[Unit, float] | None = None
        related: tuple[Unit, float] | None = None
        seen: set[str] = set()
        for unit, score in near:
            if "consensus_of" in unit.meta:  # a consensus copy stands for its original
                try:
                    unit = self.memory.get(str(unit.meta["consensus_of"]), viewer=Viewer.admin())
                except NotFoundError:
                    continue
                if unit.status is not Status.ACTIVE:
                    continue
            if unit.id in seen:
                continue
            seen.add(unit.id)
            same_text = unit.kind == incoming.kind and content_hash(unit) == capsule.hash
            conflict = None if same_text else self.detector.detect(unit, incoming, similarity=score)
            if conflict is not None:
                conflicts.append((unit, conflict, score))
            elif same_text or score >= self.limits.duplicate_at:
                if duplicate is None:
                    duplicate = (unit, 1.0 if same_text else score)
            elif related is None:
                related = (unit, score)
        return conflicts, duplicate, related

    # -- outcomes -------------------------------------------------------------------------
    def _decision(self, capsule: Capsule, outcome: str, reason: str, detail: str, **kw: Any) -> Ruling:
        return Ruling(
            outcome,
            reason,
            detail,
            agent=self.agent_id,
            capsule_id=capsule.id,
            sender=capsule.sender,
            origin=capsule.origin,
            hash=capsule.hash,
            **kw,
        )

    def _record(self, decision: Ruling) -> Ruling:
        return self.ledger.record(decision)

    def _reject(self, capsule: Capsule, reason: str, detail: str, *, verified: bool = False, score: float | None = None) -> Ruling:
        return self._record(self._decision(capsule, "rejected", reason, detail, verified=verified, score=score))

    def _via(self, capsule: Capsule) -> str | None:
        """The forwarder whose word the origin rests on, or None if the origin signed to us itself.

        With per-agent Ed25519 keys the origin's own signature proves authorship, so the
        origin stands for itself. With a shared master key (legacy HMAC) a capsule's origin
        is a claim: an origin that never sent us a signed capsule directly is only as
        independent as the sender that names it.
        """
        if self.keyring.scheme == "ed25519":
            return None
        if capsule.origin == capsule.sender or capsule.origin in self._direct or capsule.origin in self._stage.direct:
            return None
        return capsule.sender

    def _meta(self, capsule: Capsule, now: float, **extra: Any) -> dict[str, Any]:
        via = self._via(capsule)
        return {
            **{k: v for k, v in capsule.unit.meta.items() if k not in SYSTEM_META},
            "origin": capsule.origin,
            "sender": capsule.sender,
            "capsule": capsule.id,
            "remote_id": capsule.unit.id,
            "hops": capsule.hops,
            "received_scope": capsule.scope,
            "received_at": now,
            "authored_at": capsule.unit.created_at,
            "hash": capsule.hash,
            "origin_sig": capsule.origin_sig,  # so forwarding this unit later still proves its author
            **({"via": via} if via else {}),
            **extra,
        }

    def _local(self, capsule: Capsule, *, content: str, status: Status, validation: float, meta: dict[str, Any]) -> Unit:
        u = capsule.unit
        return Unit(
            content=content,
            kind=u.kind,
            context=u.context,
            scope="private",
            owner=self.agent_id,
            confidence=max(0.0, min(1.0, capsule.confidence)),
            validation=validation,
            importance=u.importance,
            provenance=Provenance(source=f"broadcast:{capsule.sender}", episodes=u.provenance.episodes),
            status=status,
            meta=meta,
        )

    def _quarantine(self, capsule: Capsule, verdict: _Verdict, now: float) -> Ruling:
        findings = list(verdict.findings)
        categories = list(dict.fromkeys(f.category for f in findings))
        content, redacted = verdict.content, verdict.redacted
        meta = self._meta(
            capsule,
            now,
            quarantine={"reason": categories[0], "findings": [f.to_dict() for f in findings], "redacted": redacted, "at": now},
        )
        if redacted:  # keep no clear copy of a leaked secret anywhere in our store
            meta = redact_tree(meta, self.screen)
        unit = self._local(capsule, content=content, status=Status.QUARANTINED, validation=0.0, meta=meta)
        self.memory.add(unit, actor=self.actor)
        detail = "; ".join(str(f) for f in findings)
        return self._record(self._decision(capsule, "quarantined", categories[0], detail, unit_id=unit.id, verified=True, data={"findings": [f.to_dict() for f in findings]}))

    def _doubt(self, capsule: Capsule, verdict: _Verdict, now: float) -> Ruling | None:
        """The doubt path (:mod:`forge.share.doubt`): a doubted unit of ours that this capsule's
        origin independently confirms is lifted to active and corroborated; a doubtful capsule
        with no such twin is stored quarantined, out of recall and out of the review queue.
        None: a clean capsule with no doubted twin, judged on as usual."""
        channel = self._via(capsule) or capsule.origin
        twin = doubt.corroborating(self.memory, owner=self.agent_id, vector=verdict.vector, channel=channel, at_least=self.limits.duplicate_at)
        if twin is not None:
            doubt.lift(self.memory, twin, witness=capsule.origin, at=now, actor=self.actor)
            return self._corroborate(capsule, twin, 1.0)
        if verdict.action != "doubt":
            return None
        conflicts, duplicate, _ = self._neighbours(capsule.unit, verdict.vector, capsule)
        if duplicate is not None and not conflicts:
            # A doubted rediscovery of a memory we already hold active is support for that
            # one (counted once per origin); its own wording is not kept.
            return self._corroborate(capsule, duplicate[0], duplicate[1])
        why: doubt.Doubt = verdict.findings[0]
        rep = min(self.consensus.reputation.get(capsule.origin), self.consensus.reputation.get(capsule.sender))
        if rep >= doubt.TRUSTED and why.finding.rule == "doubtful":
            return None  # a known peer's word, earned by outcomes, below the block level: judged on usefulness; credit retires what fails
        record = {"reason": "doubtful", "review": False, "findings": [why.finding.to_dict()], "redacted": False, "at": now}
        meta = self._meta(capsule, now, quarantine=record, **{doubt.DOUBT: why.record(now)})
        unit = self._local(capsule, content=capsule.unit.content, status=Status.QUARANTINED, validation=round(0.3 + 0.4 * rep, 4), meta=meta)
        self.memory.add(unit, vectors=verdict.vector, actor=self.actor)
        return self._record(self._decision(capsule, "quarantined", "doubtful", str(why), unit_id=unit.id, verified=True,
                                           data={"findings": [why.finding.to_dict()], "doubt": why.record(now), "review": False}))

    def _corroborate(self, capsule: Capsule, unit: Unit, similarity: float) -> Ruling:
        key = (capsule.origin, capsule.hash)
        if (key in self._counted or key in self._stage.counted) and capsule.origin not in self.consensus.witnesses(unit):
            # This origin's statement of this text was counted before (perhaps on another unit).
            return self._record(
                self._decision(
                    capsule, "merged", "already_counted", f"({capsule.origin}, content hash) was counted before; not again", unit_id=unit.id, verified=True, score=unit.validation
                )
            )
        self._stage.counted.add(key)
        return self.consensus.corroborate(
            unit.id, origin=capsule.origin, via=self._via(capsule), sender=capsule.sender, capsule_id=capsule.id, hash=capsule.hash, similarity=similarity
        )

    def _integrate(
        self,
        capsule: Capsule,
        vector: Any,
        assessment: Assessment,
        rep: float,
        weighted: float,
        conflicts: list[tuple[Unit, Conflict, float]],
        related: tuple[Unit, float] | None,
        now: float,
    ) -> Ruling:
        meta = self._meta(capsule, now, assessment={"score": assessment.score, "weighted": weighted, "reputation": rep, "reason": assessment.reason})
        unit = self._local(capsule, content=capsule.unit.content, status=Status.ACTIVE, validation=round(0.3 + 0.4 * rep, 4), meta=meta)
        self.memory.add(unit, vectors=vector, actor=self.actor)  # embedded in _judge, before the transaction
        self._stage.counted.add((capsule.origin, capsule.hash))
        if not conflicts:
            if related is not None:
                self.memory.relate(unit.id, related[0].id, "related_to", weight=round(related[1], 4), note="received near it", actor=self.actor)
            return self._record(
                self._decision(capsule, "accepted", "useful", f"{assessment.reason}; weighted {weighted:.2f}", unit_id=unit.id, verified=True, score=weighted)
            )
        outcomes = []
        for other, conflict, sim in conflicts:
            current = self.memory.get(unit.id, viewer=Viewer.admin())
            if current.status is not Status.ACTIVE:
                break  # the newcomer already lost to an earlier conflict
            decision, resolution = self.consensus.reconcile(other.id, unit.id, conflict=conflict, policy=self.policy)
            outcomes.append({"with": other.id, "similarity": round(sim, 4), **decision.data, "decision": decision.id})
        status = self.memory.get(unit.id, viewer=Viewer.admin()).status
        verdict = "kept" if status is Status.ACTIVE else status.value
        return self._record(
            self._decision(
                capsule,
                "conflict",
                "contradiction",
                f"contradicts {', '.join(o['with'] for o in outcomes)}; policy {self.policy.name}; newcomer {verdict}",
                unit_id=unit.id,
                related=tuple(o["with"] for o in outcomes),
                verified=True,
                score=weighted,
                data={"resolutions": outcomes, "newcomer": verdict},
            )
        )
