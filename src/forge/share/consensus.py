"""Consensus: corroboration, reputation, promotion and conflict resolution among agents.

What a population believes should rest on independent evidence, not on who shouts most:

- **corroboration** raises a unit's ``validation`` each time a *distinct* origin asserts the
  same thing, with diminishing returns (one credit model, :class:`forge.model.Counts`); an origin that
  already counted, echoes included, adds nothing, and origins we only know from one
  forwarder's word count once for that forwarder (no invented witnesses);
- **reputation** per source agent is a Beta(successes, failures) estimate moved by the
  outcomes of tasks that used its units (:meth:`Consensus.record_outcome`);
- **promotion** copies a unit that is validated enough and corroborated by at least ``m``
  independent origins into the group's consensus knowledge (scope ``group:<name>``, tag
  ``consensus``), linked ``derived_from`` the original;
- **conflicts** between similar units are found by a :class:`~forge.share.conflicts.Detector`,
  recorded as ``contradicts`` relations and settled by a
  :class:`~forge.share.conflicts.ResolutionPolicy` (:mod:`forge.share.conflicts`).

Every decision is a :class:`~forge.share.ledger.Ruling` in a :class:`~forge.share.ledger.Ledger`.
Reputations are settings of the memory (``reputation/<book>/<agent>``): they survive a restart and
travel in an operator's export. They are not PROFILE units on purpose: a reputation is the
receiver's private accounting, not a memory to recall into prompts or embed, and it changes
on every outcome.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

from forge.engine.port import MemoryPort
from forge.errors import NotFoundError, ValidationError
from forge.model import Context, Provenance, Scope, Status, Unit, Viewer, origin_of
from forge.share.conflicts import Conflict, Detector, Resolution, ResolutionPolicy
from forge.share.ledger import Ledger, Records, Ruling
from forge.store import Filter

__all__ = ["Consensus", "Reputation"]


# ---------------------------------------------------------------------------------------------
# Reputation


class Reputation:
    """Per-agent trust as a Beta estimate: ``(successes + prior) / (total + 2 * prior)``.

    Starts every agent at 0.5 and moves with evidence; a few outcomes move it a little,
    many move it a lot, so one lucky or unlucky task does not decide an agent's standing.
    Kept as settings of ``records`` (a Memory or a Store) when given, else in memory only.
    """

    def __init__(self, records: Records | None = None, *, book: str = "default", prior: float = 1.0) -> None:
        if prior <= 0:
            raise ValidationError("reputation prior must be positive")
        self.prior = prior
        self._prefix = f"reputation/{book}/"
        self._records = records
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[float, float]] = {}
        if records is not None:
            for k, v in records.settings().items():
                if k.startswith(self._prefix):
                    d = json.loads(v)
                    self._counts[k[len(self._prefix) :]] = (float(d["success"]), float(d["failure"]))

    def get(self, agent: str) -> float:
        s, f = self._counts.get(agent, (0.0, 0.0))
        return (s + self.prior) / (s + f + 2 * self.prior)

    def counts(self, agent: str) -> tuple[float, float]:
        """(successes, failures) recorded for ``agent``."""
        return self._counts.get(agent, (0.0, 0.0))

    def record(self, agent: str, *, success: bool, weight: float = 1.0) -> float:
        if weight < 0:
            raise ValidationError("an outcome weight cannot be negative")
        with self._lock:
            s, f = self._counts.get(agent, (0.0, 0.0))
            s, f = (s + weight, f) if success else (s, f + weight)
            self._counts[agent] = (s, f)
            if self._records is not None:
                self._records.set_setting(self._prefix + agent, json.dumps({"success": s, "failure": f}))
        return self.get(agent)

    def set(self, agent: str, *, successes: float, failures: float) -> None:
        """Seed an agent's record (e.g. from an operator's prior knowledge)."""
        if successes < 0 or failures < 0:
            raise ValidationError("reputation counts cannot be negative")
        with self._lock:
            self._counts[agent] = (float(successes), float(failures))
            if self._records is not None:
                self._records.set_setting(self._prefix + agent, json.dumps({"success": successes, "failure": failures}))

    def all(self) -> dict[str, float]:
        return {a: self.get(a) for a in sorted(self._counts)}



# ---------------------------------------------------------------------------------------------
# Consensus


class Consensus:
    """Corroboration, reputation, promotion and reconciliation over one agent's memory.

    ``gain`` is how far one corroboration from an average-reputation origin moves
    validation towards 1; ``promote_at`` and ``min_corroborations`` (distinct origins
    besides the author) decide promotion into ``group:<group>``.
    """

    def __init__(
        self,
        memory: MemoryPort,
        *,
        agent_id: str,
        group: str = "population",
        gain: float = 0.3,
        promote_at: float = 0.75,
        min_corroborations: int = 2,
        reputation: Reputation | None = None,
        ledger: Ledger | None = None,
        clock: Any = time.time,
    ) -> None:
        if not agent_id:
            raise ValidationError("consensus needs the id of the agent whose memory it keeps")
        if not 0 < gain < 1 or not 0 < promote_at <= 1 or min_corroborations < 0:
            raise ValidationError("consensus needs 0 < gain < 1, 0 < promote_at <= 1 and min_corroborations >= 0")
        self.memory = memory
        self.agent_id = agent_id
        self.group = group
        self.gain = gain
        self.promote_at = promote_at
        self.min_corroborations = min_corroborations
        self.reputation = reputation if reputation is not None else Reputation(memory, book=agent_id)
        self.ledger = ledger if ledger is not None else Ledger(memory, name=agent_id)
        self.clock = clock
        self.actor = f"consensus:{agent_id}"
        self.viewer = Viewer.of(agent_id, [group] if group else [])

    # -- reading --------------------------------------------------------------------------
    def _get(self, unit_id: str) -> Unit:
        return self.memory.get(unit_id, viewer=Viewer.admin())

    def witnesses(self, unit: Unit) -> list[str]:
        """Distinct origins that asserted this unit: its author first, then corroborators."""
        corr = unit.meta.get("corroboration") or {}
        out = [origin_of(unit, default=self.agent_id)]
        out += [o for o in corr.get("origins", []) if o not in out]
        return out

    def channels(self, unit: Unit) -> list[str]:
        """Distinct channels the witnesses reached us through: an origin we can authenticate
        is its own channel, an origin we only have a forwarder's word for is that forwarder's."""
        corr = unit.meta.get("corroboration") or {}
        out = [str(unit.meta.get("via") or origin_of(unit, default=self.agent_id))]
        out += [c for c in corr.get("channels", []) if c not in out]
        return out

    def corroborations(self, unit: Unit) -> int:
        """Independent corroborations: distinct channels besides the author's."""
        return len(self.channels(unit)) - 1

    def decisions(self, **filters: Any) -> list[Ruling]:
        return self.ledger.list(**filters)

    def counts(self, *, by: str = "reason") -> dict[str, int]:
        return self.ledger.counts(by=by)

    # -- corroboration --------------------------------------------------------------------
    def corroborate(
        self,
        unit_id: str,
        *,
        origin: str,
        via: str | None = None,
        sender: str = "",
        capsule_id: str = "",
        hash: str = "",
        similarity: float = 1.0,
    ) -> Ruling:
        """Count ``origin`` as independent support for a unit, once; raise its validation.

        ``via`` names the forwarder when the origin cannot be authenticated (it never
        signed anything to us itself): then the witness is only as independent as that
        forwarder, so one insider inventing origins counts once, not once per invention.
        The step is ``gain`` scaled by reputation (0.5 -> x1, 0.1 -> x0.2, capped at x1.5),
        applied to the distance left to 1, so each further witness adds less. An origin
        or channel already counted (the author, an earlier corroborator) adds nothing.
        """
        with self.ledger.staged(), self.memory.transaction():
            return self._corroborate(unit_id, origin=origin, via=via, sender=sender, capsule_id=capsule_id, hash=hash, similarity=similarity)

    def _corroborate(
        self, unit_id: str, *, origin: str, via: str | None, sender: str, capsule_id: str, hash: str, similarity: float
    ) -> Ruling:
        unit = self._get(unit_id)
        base: dict[str, Any] = {"agent": self.agent_id, "capsule_id": capsule_id, "sender": sender, "origin": origin, "hash": hash, "unit_id": unit.id, "verified": True}
        witnesses = self.witnesses(unit)
        if origin in witnesses:
            who = "the author" if origin == witnesses[0] else "an earlier corroborator"
            return self.ledger.record(
                Ruling("merged", "already_counted", f"{origin} is {who} of {unit.id}; not counted twice", score=unit.validation, **base)
            )
        corr = dict(unit.meta.get("corroboration") or {})
        origins = [*corr.get("origins", []), origin]
        channel = via or origin
        if channel in self.channels(unit):
            corr.update(origins=origins)  # remembered, so its echoes are recognised, but not counted
            self.memory.update(unit.replace(meta={**unit.meta, "corroboration": corr}), actor=self.actor, reembed=False)
            return self.ledger.record(
                Ruling(
                    "merged", "same_channel",
                    f"{origin} reached us only through {channel}, which already counted for {unit.id}",
                    score=unit.validation, **base,
                )
            )
        rep = self.reputation.get(origin) if via is None else min(self.reputation.get(origin), self.reputation.get(via))
        # one credit model (forge.model.Counts): a witness of average reputation weighs what
        # ``gain`` says, as successes do; outcomes and corroboration move the same validation
        counts = unit.counts.supported(2.0 * self.gain / (1.0 - self.gain) * min(1.5, rep / 0.5))
        validation = counts.rate
        channels = [*corr.get("channels", []), channel]
        corr.update(origins=origins, channels=channels, count=len(channels), last=self.clock())
        unit = self.memory.update(
            unit.replace(validation=min(1.0, validation), meta={**unit.meta, **counts.to_meta(), "corroboration": corr}),
            actor=self.actor,
            reembed=False,
        )
        decision = self.ledger.record(
            Ruling(
                "corroborated",
                "independent_origin",
                f"{origin} corroborates {unit.id} (similarity {similarity:.2f}"
                + (f", via {via}" if via else "")
                + f"); {len(channels)} corroboration(s), validation {validation:.2f}",
                score=unit.validation,
                data={"similarity": similarity, "corroborations": len(channels), "reputation": rep, "via": via},
                **base,
            )
        )
        self.maybe_promote(unit.id)
        return decision

    # -- promotion ------------------------------------------------------------------------
    def ready(self, unit: Unit) -> bool:
        return (
            bool(self.group)
            and unit.status is Status.ACTIVE
            and "consensus_of" not in unit.meta
            and "promoted_to" not in unit.meta
            and unit.validation >= self.promote_at
            and self.corroborations(unit) >= self.min_corroborations
        )

    def maybe_promote(self, unit_id: str) -> Ruling | None:
        """Promote the unit if it qualifies; None if it does not (or already was)."""
        unit = self._get(unit_id)
        return self._promote(unit) if self.ready(unit) else None

    def promote_ready(self, *, limit: int = 1000) -> list[Ruling]:
        """Promote every qualifying unit (e.g. after reputations changed)."""
        f = Filter.make(status=["active"])
        return [self._promote(u) for u in self.memory.list(viewer=Viewer.admin(), filter=f, limit=limit) if self.ready(u)]

    def _promote(self, unit: Unit) -> Ruling:
        """Copy, link, mark and record in one transaction: a promotion happens whole or not."""
        with self.ledger.staged(), self.memory.transaction():
            return self._promote_now(unit)

    def _promote_now(self, unit: Unit) -> Ruling:
        witnesses = self.witnesses(unit)
        copy = Unit(
            content=unit.content,
            kind=unit.kind,
            context=Context(unit.context.domain, unit.context.task, unit.context.role, (*unit.context.tags, "consensus")),
            scope=Scope("group", self.group),
            owner=self.agent_id,
            confidence=unit.confidence,
            validation=unit.validation,
            importance=unit.importance,
            provenance=Provenance(source=f"consensus:{self.group}", episodes=unit.provenance.episodes, derived_from=(unit.id,)),
            meta={"consensus_of": unit.id, "origin": witnesses[0], "witnesses": witnesses, "promoted_at": self.clock()},
        )
        self.memory.add(copy, actor=self.actor)
        self.memory.relate(copy.id, unit.id, "derived_from", note="consensus promotion", actor=self.actor)
        self.memory.update(unit.replace(meta={**unit.meta, "promoted_to": copy.id}), actor=self.actor, reembed=False)
        return self.ledger.record(
            Ruling(
                "promoted",
                "consensus",
                f"{unit.id} promoted to group:{self.group} as {copy.id}: validation {unit.validation:.2f}, "
                f"{len(witnesses) - 1} independent corroborations ({', '.join(witnesses)})",
                agent=self.agent_id,
                origin=witnesses[0],
                unit_id=unit.id,
                related=(copy.id,),
                score=unit.validation,
            )
        )

    # -- outcomes and reputation ----------------------------------------------------------
    def record_outcome(self, unit_ids: Sequence[str], *, success: bool, weight: float = 1.0) -> dict[str, float]:
        """Credit (or blame) the agents whose units a task used; return their new reputations.

        The author of each unit gets full weight, its corroborators half (they vouched for
        it); each agent is counted once per task however many of its units were used. The
        units' own validation is not written here: :meth:`forge.engine.memory.Memory.record_use`
        is the one credit model's writer. The receiving agent itself is not rated.
        """
        credit: dict[str, float] = {}
        used: list[str] = []
        for uid in dict.fromkeys(unit_ids):
            try:
                unit = self._get(uid)
            except NotFoundError:
                continue
            if "consensus_of" in unit.meta:  # a consensus copy speaks for its original
                with contextlib.suppress(NotFoundError):
                    unit = self._get(str(unit.meta["consensus_of"]))
            used.append(unit.id)
            witnesses = self.witnesses(unit)
            for i, agent in enumerate(witnesses):
                if agent != self.agent_id:
                    credit[agent] = max(credit.get(agent, 0.0), 1.0 if i == 0 else 0.5)
        reps = {agent: self.reputation.record(agent, success=success, weight=w * weight) for agent, w in sorted(credit.items())}
        self.ledger.record(
            Ruling(
                "outcome",
                "success" if success else "failure",
                f"task {'succeeded' if success else 'failed'} using {len(used)} unit(s); "
                + ", ".join(f"{a} -> {r:.2f}" for a, r in reps.items()),
                agent=self.agent_id,
                related=tuple(used),
                data={"reputation": reps},
            )
        )
        return reps

    # -- conflicts ------------------------------------------------------------------------
    def find_conflicts(
        self, unit: Unit, *, detector: Detector, k: int = 5, min_similarity: float = 0.5, vector: Any = None
    ) -> list[tuple[Unit, Conflict, float]]:
        """Active units similar to ``unit`` that contradict it, most similar first."""
        if vector is None:
            vector = self.memory.embed_units([unit])[0]
        out: list[tuple[Unit, Conflict, float]] = []
        for other, score in self.memory.nearest(vector, k=k + 1, viewer=self.viewer, at_least=min_similarity):
            if other.id == unit.id or "consensus_of" in other.meta:
                continue
            conflict = detector.detect(other, unit, similarity=score)
            if conflict is not None:
                out.append((other, conflict, score))
        return out

    def reconcile(self, a_id: str, b_id: str, *, conflict: Conflict, policy: ResolutionPolicy) -> tuple[Ruling, Resolution]:
        """Record that ``b`` contradicts ``a`` and apply ``policy``'s resolution, in full view.

        The relations, status changes and the decision are written in one transaction.
        """
        with self.ledger.staged(), self.memory.transaction():
            return self._reconcile(a_id, b_id, conflict=conflict, policy=policy)

    def _reconcile(self, a_id: str, b_id: str, *, conflict: Conflict, policy: ResolutionPolicy) -> tuple[Ruling, Resolution]:
        a, b = self._get(a_id), self._get(b_id)
        self.memory.relate(b.id, a.id, "contradicts", weight=conflict.score, note=f"{conflict.kind}: {conflict.reason}"[:300], actor=self.actor)
        resolution = policy.resolve(a, b, conflict=conflict, consensus=self)
        superseded: list[str] = []
        if resolution.action == "supersede":
            winner, loser = (a, b) if resolution.winner == a.id else (b, a)
            if resolution.winner not in (a.id, b.id):
                raise ValidationError(f"policy {policy.name!r} named a winner that is neither unit: {resolution.winner}")
            self.memory.relate(winner.id, loser.id, "supersedes", note=resolution.reason[:300], actor=self.actor)
            superseded = [loser.id]
            copy = loser.meta.get("promoted_to")
            if copy:  # a consensus copy falls with its original
                superseded.append(str(copy))
            for uid in superseded:
                with contextlib.suppress(NotFoundError):
                    self.memory.set_status(
                        uid, Status.SUPERSEDED, reason=f"lost conflict with {winner.id}: {resolution.reason}"[:500], actor=self.actor
                    )
        elif resolution.action == "split":
            for unit in (a, b):
                tags = resolution.tags.get(unit.id, ())
                cond = resolution.conditions.get(unit.id, "")
                ctx = Context(unit.context.domain, unit.context.task, unit.context.role, (*unit.context.tags, *tags))
                meta = {**unit.meta, "holds_when": cond} if cond else dict(unit.meta)
                self.memory.update(unit.replace(context=ctx, meta=meta), actor=self.actor)
        decision = self.ledger.record(
            Ruling(
                "resolved",
                f"{policy.name}:{resolution.action}",
                f"{b.id} contradicts {a.id} ({conflict.kind}: {conflict.reason}); {resolution.reason}",
                agent=self.agent_id,
                origin=origin_of(b, default=self.agent_id),
                unit_id=b.id,
                related=(a.id,),
                data={
                    "conflict": conflict.kind,
                    "policy": policy.name,
                    "action": resolution.action,
                    "winner": resolution.winner,
                    "superseded": superseded,
                    "conditions": dict(resolution.conditions),
                    "transcript": list(resolution.transcript),
                },
            )
        )
        return decision, resolution

