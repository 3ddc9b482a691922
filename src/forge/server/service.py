"""The service core: every verb the REST API, the MCP tools and the dashboard offer.

Each method takes the calling :class:`~forge.server.keys.Principal` first: the viewer (what
it may see) and the actor (who the audit log names) come from it, never from a request
field. Reads are written to the store's event log too (``read``, ``list``, ``recall``,
``context``, ``export``), with the ids returned and, for recall, why each was returned, so
"which memories did agent X see before decision Y" is one query (:meth:`Service.seen`).
Read records are batched (:class:`ReadLog`) so a recall does not pay a write transaction;
writes are audited in their own transaction, as before. The edges are thin: they parse,
call one method here, and render.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from forge.curate import admission
from forge.curate.admission import ADD, Admitted
from forge.engine.memory import Memory
from forge.engine.recall import Packed, Recalled, Recalls
from forge.errors import (
    AccessError,
    BackendError,
    ConfigError,
    ConflictError,
    NotFoundError,
    ValidationError,
)
from forge.model import Episode, Kind, Relation, Scope, Status, Unit, Viewer
from forge.server.keys import Principal
from forge.share.capsule import SYSTEM_META
from forge.store import Filter
from forge.store.base import Event

__all__ = ["SYSTEM_META", "ReadLog", "Service"]

_log = logging.getLogger("forge.server")

#: Unit fields an update may change; the rest (id, owner, scores kept by the engine) may not.
#: What agents act on: doubted advice waits out of recall; other doubted writes are shown with a warning.
ADVICE = frozenset({Kind.RULE, Kind.LESSON, Kind.PROCEDURE})
UPDATABLE = frozenset({"content", "kind", "context", "scope", "confidence", "importance", "meta", "provenance"})
#: Change ops a non-admin sees in a unit's history (reads by other agents are theirs to know).
_CHANGE_OPS = ("add", "update", "status")
#: The validation a unit starts with: an agent's write may not claim more (or less); it is
#: earned by corroboration and outcomes.
START_VALIDATION = next(f.default for f in dataclasses.fields(Unit) if f.name == "validation")


class ReadLog:
    """Read audit records, written in one transaction per batch instead of one per read.

    Over HTTP a recall used to cost a write transaction for its audit record, queued behind
    every other writer (~0.7 ms per recall on bench/service.py's 100k store). Records keep
    their read time and are written within ``delay_s``, when ``max_pending`` accumulate, or
    on :meth:`flush` / :meth:`close`. The price, stated: a crash (not a shutdown) can lose
    up to ``delay_s`` of read records; ``delay_s=0`` writes each at once and loses none.
    Writes are never batched here.
    """

    def __init__(self, store: Any, *, delay_s: float = 0.05, max_pending: int = 512) -> None:
        self.store = store
        self.delay_s = delay_s
        self.max_pending = max_pending
        self._pending: list[tuple[float, str, str | None, str, dict[str, Any], tuple[str, ...]]] = []
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one writer at a time keeps records in read order
        self._timer: threading.Timer | None = None
        self._closed = False

    def record(self, op: str, *, unit_id: str | None = None, actor: str = "", data: Mapping[str, Any] | None = None,
               names: Sequence[str] = ()) -> None:
        """Record a read; ``names``: the units it returned, indexed for their trace."""
        entry = (time.time(), op, unit_id, actor, dict(data or {}), tuple(names))
        with self._lock:
            closed = self._closed or self.delay_s <= 0
            if not closed:
                self._pending.append(entry)
                full = len(self._pending) >= self.max_pending
                if not full and self._timer is None:
                    self._timer = threading.Timer(self.delay_s, self._timed)
                    self._timer.daemon = True
                    self._timer.start()
        if closed:  # unbatched (delay 0), or a late request during shutdown: written at once
            self.store.append_events([(op, unit_id, actor, entry[4], entry[0], entry[5])])
        elif full:
            self.flush()

    def _timed(self) -> None:
        try:
            self.flush()  # it clears the timer first, and puts the batch back if the write fails
        except BackendError as exc:  # the store failed: kept pending, the next flush retries; a bug is raised
            _log.warning("read audit records kept pending, the next flush retries: %s", exc)

    def flush(self) -> None:
        """Write every pending record now, in one transaction (readers of the log call this)."""
        with self._flushing:
            with self._lock:
                batch, self._pending = self._pending, []
                timer, self._timer = self._timer, None
            if timer is not None and timer is not threading.current_thread():
                timer.cancel()
            if not batch:
                return
            try:
                self.store.append_events([(op, unit_id, actor, data, at, names) for at, op, unit_id, actor, data, names in batch])
            except BaseException:
                with self._lock:  # put them back, in order, ahead of newer ones
                    self._pending[:0] = batch
                raise

    def close(self) -> None:
        """Flush and write later records at once (the service is shutting down)."""
        with self._lock:
            self._closed = True
        self.flush()


class Service:
    """One :class:`Memory` served to many principals.

    Call :meth:`close` (or use it as a context manager) before closing the memory, so the
    last read records are written.
    """

    def __init__(
        self,
        memory: Memory,
        *,
        runs_dir: str | os.PathLike[str] | None = None,
        capsule_secret: str | None = None,
        capsule_keyring: Any = None,
        read_audit_delay_s: float = 0.05,
        llm: Any = None,
        screen: Any = None,
    ) -> None:
        """``capsule_keyring`` (a :class:`forge.share.capsule.Keyring` of senders' public keys) or the
        legacy shared ``capsule_secret`` lets agents receive capsules through the service.
        ``read_audit_delay_s`` is how long read records may wait to be written in a batch
        (0: each at once, none lost on a crash, a write transaction per read). ``screen``
        judges an agent's group and global writes (default: the exchange's :class:`Screen`,
        built on the first such write)."""
        self.memory = memory
        self.store = memory.store
        self.llm = llm  # what add_messages extracts with (default: the memory's, else the embedded model)
        self.runs_dir = Path(runs_dir) if runs_dir else None
        if capsule_keyring is None and capsule_secret:
            from forge.share.capsule import Keyring

            capsule_keyring = Keyring.from_secret(capsule_secret)
        self.capsule_keyring = capsule_keyring
        self._exchanges: dict[str, Any] = {}
        self._screen: Any = screen
        self._lock = threading.Lock()
        if not 0 <= read_audit_delay_s <= 60:
            raise ConfigError("the read audit delay must be between 0 and 60 seconds")
        self.reads = ReadLog(self.store, delay_s=read_audit_delay_s)

    def flush(self) -> None:
        """Write pending read records now (the audit queries here call it first)."""
        self.reads.flush()

    def close(self) -> None:
        """Write pending read records; the memory stays open (its owner closes it)."""
        self.reads.close()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- units ----------------------------------------------------------------------------
    def add(self, who: Principal, units: Sequence[Mapping[str, Any]], *, admit: bool = True) -> list[str]:
        """Add units in one transaction; the ids of the units that now hold them (see :meth:`write`)."""
        return [d.unit_id for d in self.write(who, units, admit=admit)]

    def write(self, who: Principal, units: Sequence[Mapping[str, Any]], *, admit: bool = True) -> list[Admitted]:
        """Add units in one transaction, through admission unless ``admit=False``; one decision each.

        An agent writes as itself, into its own groups. Admission (:func:`forge.curate.admit`)
        merges a duplicate into the unit already stored (``noop``), lets a newer contradicting
        statement supersede the old one (``update``), and adds the rest; its candidates are
        units of the same kind, scope and (for private units) owner, so a decision names only
        units the caller could already see. ``admit=False`` stores every unit as given.
        """
        if not units:
            raise ValidationError("no units to add")
        built = [self._own(who, Unit.from_dict(self._defaults(who, u))) for u in units]
        if who.admin:
            return self._write(who, built, admit=admit)
        self._parents_visible(who, built)
        self._ids_free(who, built)
        # Group and global units reach other agents' prompts: the screen judges them first,
        # as the exchange judges a capsule. What it holds is stored quarantined (the writer
        # sees it in its review queue), and goes through no admission: it merges into,
        # and supersedes, nothing until an operator releases it.
        from forge.share.doubt import DOUBT, Doubt

        verdicts = {i: h for i, u in enumerate(built) if u.scope.kind != "private" and (h := self._held(u)) is not None}
        # Advice (a rule, lesson or procedure: what an agent acts on) that only the screen's
        # model doubts waits out of recall, as a capsule's does. Anything else an agent's own
        # key wrote is not held for a doubt: the model doubts about a fifth of honest text it
        # never saw (a LangGraph app's stored items vanished from its own reads), and the
        # writer is known, audited and revocable. It is stored active with the doubt recorded,
        # every prompt that shows it says it is unverified and whose it is, and it starts with
        # the validation the doubt leaves it (0.5 x (1 - p)), so it ranks below what is trusted
        # until outcomes earn it more.
        now = time.time()
        for i, h in list(verdicts.items()):
            if isinstance(h, Doubt) and built[i].kind not in ADVICE:
                u = built[i]
                built[i] = u.replace(validation=min(u.validation, round(0.5 * (1.0 - h.p), 4)),
                                     meta={**u.meta, DOUBT: {**h.record(now), "until": "shown with a warning"}})
                del verdicts[i]
        held = verdicts
        if not held:
            return self._write(who, built, admit=admit)
        with self.memory.transaction():
            passed = self._write(who, [u for i, u in enumerate(built) if i not in held], admit=admit) if len(held) < len(built) else []
            kept = iter(passed)
            out = []
            for i, u in enumerate(built):
                if i in held:
                    uid = self.memory.add([self._quarantined(u, held[i])], actor=who.actor)[0]
                    why = (f"doubted ({held[i]}); advice kept out of recall until an independent origin sends it" if isinstance(held[i], Doubt)
                           else f"held for review ({held[i].reason}: {held[i]}); an operator releases it")
                    out.append(Admitted(ADD, uid, why, uid, held=True))
                else:
                    out.append(next(kept))
            return out

    def _write(self, who: Principal, units: list[Unit], *, admit: bool) -> list[Admitted]:
        if admit:
            return admission.admit(self.memory, units, actor=who.actor)
        ids = self.memory.add(units, actor=who.actor)
        return [Admitted(ADD, uid, "stored as given (admission off)", uid) for uid in ids]

    def _held(self, unit: Unit) -> Any:
        """The screen's verdict on an agent's unit bound for other agents, as the exchange's
        (:func:`forge.share.doubt.sort`): a ``Held`` for review, a ``Doubt`` (only the semantic
        layer doubts it: kept out of recall, not paged to an operator), or None."""
        from forge.share import doubt

        return doubt.sort(self.screen, unit)

    def _quarantined(self, unit: Unit, held: Any) -> Unit:
        from forge.share import doubt
        from forge.share.exchange import redact_tree

        now = time.time()
        if isinstance(held, doubt.Doubt):
            record = {"reason": "doubtful", "review": False, "findings": [held.finding.to_dict()], "redacted": False, "at": now}
            return unit.replace(status=Status.QUARANTINED, meta={**unit.meta, "quarantine": record, doubt.DOUBT: held.record(now)})
        meta = {**unit.meta, "quarantine": held.record(now)}
        if held.redacted:  # no clear copy of a leaked secret in the store
            meta = redact_tree(meta, self.screen)
        return unit.replace(content=held.content, status=Status.QUARANTINED, meta=meta)

    @property
    def screen(self) -> Any:
        """The screen an agent's group and global writes pass (the exchange's default), built once."""
        with self._lock:
            if self._screen is None:
                from forge.share.screen import Screen

                self._screen = Screen()
            return self._screen

    def _ids_free(self, who: Principal, units: Sequence[Unit]) -> None:
        """An agent's unit ids must be free. One held by a unit the agent can see is a 409; one
        held by a unit it cannot see is answered exactly as reading that id is (404, as for any
        id it cannot see), so a write tells an agent nothing about units hidden from it."""
        ids = [u.id for u in units]
        taken = {u.id for u in self.store.get_many(ids, viewer=Viewer.admin())}
        if not taken:
            return
        seen = {u.id for u in self.store.get_many(sorted(taken), viewer=who.viewer)}
        for uid in ids:
            if uid in taken and uid in seen:
                raise ConflictError(f"unit id already exists: {uid}; omit id to have one assigned")
            if uid in taken:
                raise NotFoundError(f"no unit with id {uid}")

    def _defaults(self, who: Principal, data: Mapping[str, Any]) -> dict[str, Any]:
        """The server's stamps on a unit an agent sends: its owner, its source, no system meta.

        ``provenance.source`` is ``api:<agent>`` (a label the caller gave follows it, as
        ``api:<agent>/<label>``); the operator's writes keep the source they give.
        """
        d = dict(data)
        prov = dict(d.get("provenance") or {})
        if who.admin:
            prov.setdefault("source", f"api:{who.agent}")
        else:
            d.setdefault("owner", who.agent)
            _no_system_meta(d.get("meta") or {}, {})
            if d.get("validation", START_VALIDATION) != START_VALIDATION:
                raise ValidationError(f"validation is earned (corroboration by other agents, outcomes), not set by an agent key: "
                                      f"leave it out (every unit starts at {START_VALIDATION})")
            stamp, claimed = f"api:{who.agent}", str(prov.get("source") or "")
            prov["source"] = stamp if claimed in ("", stamp) else f"{stamp}/{claimed}"
        d["provenance"] = prov
        return d

    def _parents_visible(self, who: Principal, units: Sequence[Unit]) -> None:
        """An agent's unit may name as parents only units it can see (same answer for absent ones)."""
        parents = sorted({pid for u in units for pid in u.provenance.derived_from})
        if not parents:
            return
        seen = {u.id for u in self.store.get_many(parents, viewer=who.viewer)}
        unseen = [pid for pid in parents if pid not in seen]
        if unseen:
            raise ValidationError(f"provenance.derived_from names units this key cannot see or that do not exist: "
                                  f"{', '.join(unseen[:5])}; name only units you can read")

    def _own(self, who: Principal, unit: Unit) -> Unit:
        """Refuse an agent writing as someone else or into a group it is not in."""
        if who.admin:
            return unit
        if unit.owner != who.agent:
            raise AccessError(f"agent {who.agent!r} cannot write units owned by {unit.owner!r}")
        if unit.scope.kind == "group" and unit.scope.name not in who.groups:
            raise AccessError(f"agent {who.agent!r} is not in group {unit.scope.name!r}")
        return unit

    def get(self, who: Principal, unit_id: str) -> Unit:
        unit = self.memory.get(unit_id, viewer=who.viewer)
        self.reads.record("read", unit_id=unit.id, actor=who.actor, data={"key": who.key_id})
        return self.shown(who, [unit])[0]

    def shown(self, who: Principal, units: Sequence[Unit]) -> list[Unit]:
        """``units`` as ``who`` may see them: parents it cannot see are not named in their
        provenance (an id alone says that a unit exists, and the ids carry creation times)."""
        units = list(units)
        parents = {pid for u in units for pid in u.provenance.derived_from}
        if who.admin or not parents:
            return units
        visible = {u.id for u in self.store.get_many(sorted(parents), viewer=who.viewer)}
        return [u if visible.issuperset(u.provenance.derived_from) else
                u.replace(provenance=dataclasses.replace(u.provenance, derived_from=tuple(p for p in u.provenance.derived_from if p in visible)))
                for u in units]

    def _shown_recalled(self, who: Principal, results: Sequence[Recalled]) -> list[Recalled]:
        units = self.shown(who, [r.unit for r in results])
        return [r if u is r.unit else dataclasses.replace(r, unit=u) for r, u in zip(results, units, strict=True)]

    def list(self, who: Principal, *, filter: Filter = Filter(), limit: int = 50, offset: int = 0) -> tuple[list[Unit], int]:
        _page(limit, offset)
        units = self.store.list(viewer=who.viewer, filter=filter, limit=limit, offset=offset)
        total = self.store.count(viewer=who.viewer, filter=filter)
        if units:
            self.reads.record("list", actor=who.actor, data={"key": who.key_id, "ids": [u.id for u in units]})
        return self.shown(who, units), total

    def update(self, who: Principal, unit_id: str, changes: Mapping[str, Any]) -> Unit:
        unknown = set(changes) - UPDATABLE
        if unknown:
            raise ValidationError(f"cannot update field(s): {', '.join(sorted(unknown))}; updatable: {', '.join(sorted(UPDATABLE))}")
        unit = self._writable(who, unit_id)
        changes = {k: v for k, v in changes.items() if v is not None}
        if not who.admin:
            if "provenance" in changes:
                raise ValidationError("provenance is recorded by the server; it cannot be changed through an agent key")
            if "meta" in changes:  # the system's keys stay as recorded; the rest is the caller's
                _no_system_meta(changes["meta"], unit.meta)
                changes["meta"] = {**changes["meta"], **{k: v for k, v in unit.meta.items() if k in SYSTEM_META}}
        data = {**unit.to_dict(), **changes}
        new = self._own(who, Unit.from_dict(data))
        if not who.admin and new.scope.kind != "private" and new.status is Status.ACTIVE and (new.text != unit.text or new.scope != unit.scope
                                                                                             or new.meta != unit.meta):
            held = self._held(new)  # what others will read changed: the screen judges it again, as on a write
            if held is not None:
                new = self._quarantined(new, held)
        reembed = new.text != unit.text
        return self.shown(who, [self.memory.update(new, actor=who.actor, reembed=reembed)])[0]

    def set_status(self, who: Principal, unit_id: str, status: str, *, reason: str) -> Unit:
        """Change a unit's status with a reason (archive = forget, quarantine review, ...)."""
        if not reason or not reason.strip():
            raise ValidationError("a status change needs a reason")
        new = Status.parse(status)
        unit = self._writable(who, unit_id)
        held = unit.status is Status.QUARANTINED or ("quarantine" in unit.meta and "released" not in unit.meta)
        if new is Status.ACTIVE and held:
            # The screen held it (a capsule, an agent's group write): the receiver or writer
            # may reject it (archive), but only an operator lets it into recall.
            if not who.admin:
                raise AccessError(f"{unit_id} was held for review by the screen; only an operator (an admin key) can release it")
            with self.memory.transaction():
                released = {"by": who.actor, "key": who.key_id, "at": time.time(), "reason": reason.strip()[:1000], "from": unit.status.value}
                self.memory.update(unit.replace(meta={**unit.meta, "released": released}), actor=who.actor, reembed=False)
                self.memory.set_status(unit_id, new, reason=f"released from quarantine: {reason.strip()}", actor=who.actor)
                self.memory.append_event("release", unit_id=unit_id, actor=who.actor,
                                         data={"key": who.key_id, "reason": reason.strip()[:1000], "quarantine": unit.meta.get("quarantine")})
        else:
            self.memory.set_status(unit_id, new, reason=reason.strip(), actor=who.actor)
        return self.shown(who, [self.store.get(unit_id, viewer=Viewer.admin())])[0]

    def add_messages(self, who: Principal, messages: Any, *, scope: str = "global", admit: bool = True) -> Any:
        """Remember a conversation (:mod:`forge.curate.messages`): candidates extracted by the
        LLM, each with why, written through :meth:`write` (the caller's ownership, groups and
        provenance stamps, admission); the :class:`~forge.curate.messages.Ingested` report."""
        from forge.curate.messages import Ingested, decided, extract, units_of

        llm = self.llm if self.llm is not None else self.memory.get_llm()
        found = extract(messages, llm=llm)
        units = [u.to_dict() for u in units_of(found, source="messages", scope=scope, owner="" if who.admin else who.agent)]
        if not units:
            return Ingested(tuple(found), getattr(llm, "name", ""))
        return Ingested(tuple(decided(found, self.write(who, units, admit=admit))), getattr(llm, "name", ""))

    def erase(self, who: Principal, unit_id: str, *, reason: str) -> dict[str, Any]:
        """Erase a unit for good (admin): see :meth:`forge.engine.memory.Memory.erase`.

        Pending read records are written first, so the recalls that returned it are scrubbed
        with the rest of the log."""
        _admin(who, "erase units (an agent archives its own: status archived)")
        self.flush()
        done = self.memory.erase(unit_id, reason=reason, actor=who.actor)
        return {"erased": unit_id, **done}

    def _writable(self, who: Principal, unit_id: str) -> Unit:
        unit = self.memory.get(unit_id, viewer=who.viewer)  # NotFound for what it cannot see
        if not who.admin and unit.owner != who.agent:
            raise AccessError(f"agent {who.agent!r} can change only its own units; {unit_id} is {unit.owner or 'nobody'}'s")
        return unit

    # -- recall ---------------------------------------------------------------------------
    def recall(self, who: Principal, query: str, *, k: int = 10, filter: Filter = Filter(), hops: int = 1, touch: bool = True,
               min_score: float = 0.0) -> Recalls:
        """The ``k`` best units for ``query`` that ``who`` may see, scored 0-1, none below ``min_score``,
        with the ``recall_id`` an outcome names."""
        _check_query(query, k)
        if not 0 <= hops <= 3:
            raise ValidationError("hops must be between 0 and 3")
        results = self.memory.recall(query, viewer=who.viewer, k=k, filter=filter, hops=hops, touch=touch, min_score=min_score)
        self.reads.record(
            "recall",
            actor=who.actor,
            data={
                "key": who.key_id,
                "query": query[:500],
                "hits": [{"id": r.unit.id, "score": round(r.score, 6), "reasons": r.reasons} for r in results],
            },
            names=[r.unit.id for r in results],
        )
        shown = Recalls(self._shown_recalled(who, results))
        shown.recall_id = results.recall_id  # what an outcome names to credit these units
        return shown

    def context(self, who: Principal, query: str, *, budget: int = 512, k: int = 20, filter: Filter = Filter(), hops: int = 1,
                min_score: float = 0.0) -> Packed:
        if not 1 <= budget <= 100_000:
            raise ValidationError("budget must be between 1 and 100000 tokens")
        _check_query(query, k)
        packed = self.memory.context(query, viewer=who.viewer, budget=budget, k=k, filter=filter, hops=hops, min_score=min_score)
        self.reads.record(
            "context",
            actor=who.actor,
            data={"key": who.key_id, "query": query[:500], "budget": budget, "tokens": packed.tokens,
                  "hits": [{"id": r.unit.id, "reasons": r.reasons} for rs in packed.sections.values() for r in rs]},
            names=[r.unit.id for rs in packed.sections.values() for r in rs],
        )
        if who.admin:
            return packed
        return dataclasses.replace(packed, sections={k: self._shown_recalled(who, rs) for k, rs in packed.sections.items()},
                                   dropped=self._shown_recalled(who, packed.dropped))

    # -- relations and history -------------------------------------------------------------
    def relate(self, who: Principal, src: str, dst: str, type: str = "related_to", *, weight: float = 1.0, note: str = "") -> Relation:
        """Link two units. An agent links only units it may change (its own): every relation
        acts on both ends (all but ``contradicts`` pull one end into recalls of the other,
        and a ``contradicts`` lets a curation pass supersede the older end), so a link to
        another agent's unit would change what that agent recalls and keeps."""
        for end in (src, dst):
            self.memory.get(end, viewer=who.viewer)  # NotFound for what it cannot see, whichever end it is
        for end in (src, dst):
            self._writable(who, end)  # then AccessError for what is not its own
        return self.memory.relate(src, dst, type, weight=weight, note=note, actor=who.actor)

    def relations(self, who: Principal, unit_id: str) -> list[Relation]:
        self.memory.get(unit_id, viewer=who.viewer)
        rels = self.store.relations(unit_id, viewer=who.viewer)
        others = [r.dst if r.src == unit_id else r.src for r in rels]
        visible = {u.id for u in self.store.get_many(others, viewer=who.viewer)}
        return [r for r, o in zip(rels, others, strict=True) if o in visible]

    def history(self, who: Principal, unit_id: str, *, limit: int = 200) -> list[Event]:
        self.memory.get(unit_id, viewer=who.viewer)
        self.flush()
        ops = () if who.admin else _CHANGE_OPS
        return self.store.events(unit_id=unit_id, ops=ops, limit=limit, viewer=who.viewer)

    def trace(self, who: Principal, unit_id: str) -> dict[str, Any]:
        """The provenance chain of a unit as the caller may see it (:func:`forge.curate.trace.trace`).

        Beside curate's keys, ``source``, ``episodes`` and ``derived_from`` (from ``made_by``)
        and ``promotion`` are kept at the top for the dashboard and existing clients; an agent's
        history shows changes only, as in :meth:`history`.
        """
        from forge.curate.trace import trace

        self.get(who, unit_id)  # the access check and the audited read
        self.flush()
        t = trace(self.memory, unit_id, viewer=who.viewer)
        made, meta = t["made_by"], t["unit"]["meta"]
        t.update(
            source=made["source"],
            episodes=made["episodes"],
            derived_from=made["derived_from"],
            promotion={k: meta[k] for k in ("promoted_to", "consensus_of", "witnesses") if k in meta},
        )
        if not who.admin:
            t["history"] = [e for e in t["history"] if e["op"] in _CHANGE_OPS]
            t["derived_from"] = t["made_by"]["derived_from"] = _seen_parents(t["made_by"]["derived_from"])
            t["unit"] = self.shown(who, [Unit.from_dict(t["unit"])])[0].to_dict()
        return t

    # -- episodes -------------------------------------------------------------------------
    def add_episode(self, who: Principal, data: Mapping[str, Any]) -> str:
        d = dict(data)
        if not who.admin:
            if d.get("agent") not in (None, "", who.agent):
                raise AccessError(f"agent {who.agent!r} cannot record episodes of {d['agent']!r}")
            d["agent"] = who.agent
        return self.memory.add_episode(Episode.from_dict(d), actor=who.actor)

    def get_episode(self, who: Principal, episode_id: str) -> Episode:
        ep = self.store.get_episode(episode_id)
        if not who.admin and ep.agent not in ("", who.agent):
            raise NotFoundError(f"no episode with id {episode_id}")
        self.reads.record("read_episode", actor=who.actor, data={"key": who.key_id, "episode": episode_id})
        return ep

    # -- bulk -----------------------------------------------------------------------------
    def export(self, who: Principal) -> Iterator[dict[str, Any]]:
        _admin(who, "export the whole store")
        self.reads.record("export", actor=who.actor, data={"key": who.key_id})
        return self.memory.export(viewer=who.viewer)

    def import_records(self, who: Principal, records: Iterable[Mapping[str, Any]], *, history: bool = False) -> int:
        """Import export records (admin). Audit events and settings (reputations) are history
        the store writes itself: refused unless ``history`` (see :func:`forge.store.records.check_history`)."""
        from forge.store.records import check_history

        _admin(who, "import records")
        rows = []
        for i, r in enumerate(records, 1):
            if not isinstance(r, Mapping):
                raise ValidationError(f"record {i}: a record must be a JSON object")
            rows.append(dict(r))
        check_history(rows, allowed=history, flag="include_history=true")
        return self.memory.import_records(rows, actor=who.actor)

    def stats(self, who: Principal) -> dict[str, Any]:
        if who.admin:
            return self.memory.stats()
        v = who.viewer
        any_status = Filter.make(status=[s.value for s in Status])
        by_kind = {k.value: n for k in Kind if (n := self.store.count(viewer=v, filter=Filter.make(kinds=[k], status=[s.value for s in Status])))}
        by_status = {s.value: n for s in Status if (n := self.store.count(viewer=v, filter=Filter.make(status=[s])))}
        return {"units": self.store.count(viewer=v, filter=any_status), "by_kind": by_kind, "by_status": by_status, "agent": who.agent}

    # -- audit ----------------------------------------------------------------------------
    def events(
        self, who: Principal, *, since_seq: int = 0, unit_id: str | None = None, actor: str | None = None,
        ops: Iterable[str] = (), since: float | None = None, until: float | None = None, limit: int = 100,
        newest_first: bool = False,
    ) -> list[Event]:
        """The audit log; an agent sees only its own entries."""
        _page(limit, 0)
        if not who.admin:
            if actor not in (None, who.actor):
                raise AccessError("an agent key reads only its own audit entries")
            actor = who.actor
        self.flush()
        # An agent's own entries, whole: what it did and was shown (the unit-scoped
        # redaction of store.events is for other agents' changes, not one's own trail).
        return self.store.events(since_seq=since_seq, unit_id=unit_id, actor=actor, ops=ops, since=since, until=until,
                                 limit=limit, newest_first=newest_first, viewer=Viewer.admin())

    def seen(self, who: Principal, agent: str, *, before: float | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """Every unit ``agent`` was shown (recall, context, read) before ``before``, with why."""
        if not who.admin and agent != who.agent:
            raise AccessError("an agent key can trace only what it saw itself")
        self.flush()
        out: dict[str, dict[str, Any]] = {}
        for e in self.store.events(actor=agent, ops=("recall", "context", "read"), until=before, limit=limit,
                                   viewer=Viewer.admin()):  # access checked above: its own trail
            hits = e.data.get("hits") if e.op != "read" else [{"id": e.unit_id, "reasons": ["read by id"]}]
            for h in hits or ():
                entry = out.setdefault(h["id"], {"id": h["id"], "times": 0, "first_seq": e.seq, "reasons": []})
                entry["times"] += 1
                entry["last_seq"], entry["last_ts"] = e.seq, e.ts
                entry["queries"] = [*entry.get("queries", []), e.data.get("query")][-5:] if e.op != "read" else entry.get("queries", [])
                for r in h.get("reasons", []):
                    if r not in entry["reasons"]:
                        entry["reasons"].append(r)
        return list(out.values())

    # -- the receiving side ---------------------------------------------------------------
    def receive(self, who: Principal, capsule: Mapping[str, Any]) -> dict[str, Any]:
        """Judge a capsule through the caller's exchange (verify, screen, dedup, assess, integrate)."""
        if who.admin:
            raise AccessError("capsules are received by an agent; use an agent's key")
        return self.exchange(who.agent, who.groups).receive_raw(dict(capsule)).to_dict()

    def exchange(self, agent: str, groups: Iterable[str] = ()) -> Any:
        if self.capsule_keyring is None:
            raise ConfigError("this server has no capsule keyring; start it with --capsule-keys FILE (or FORGE_CAPSULE_SECRET)")
        from forge.share.exchange import Exchange

        with self._lock:
            ex = self._exchanges.get(agent)
            if ex is None:
                ex = self._exchanges[agent] = Exchange(self.memory, agent, self.capsule_keyring, groups=groups)
            return ex

    def quarantine(self, who: Principal, *, limit: int = 100, offset: int = 0, doubted: bool = False) -> list[Unit]:
        """The review queue: quarantined units an operator should look at. A unit only the
        screen's model doubted waits for a second origin instead (:mod:`forge.share.doubt`)
        and is left out unless ``doubted``; a page may then hold fewer than ``limit``."""
        from forge.share.doubt import review_queue

        f = Filter.make(status=["quarantined"], owner=None if who.admin else who.agent)
        units = self.store.list(viewer=who.viewer, filter=f, limit=limit, offset=offset)
        return self.shown(who, units if doubted else review_queue(units))

    def decisions(self, who: Principal, *, outcomes: Iterable[str] = ("conflict", "resolved"), limit: int = 200) -> list[dict[str, Any]]:
        """Ledger decisions (conflicts and resolutions by default) across every agent's ledger."""
        _admin(who, "read every agent's decisions")
        from forge.share.ledger import ledger_decisions

        wanted = set(outcomes)
        out = [d.to_dict() for d in ledger_decisions(self.store) if not wanted or d.outcome in wanted]
        return sorted(out, key=lambda d: d.get("at", 0), reverse=True)[:limit]

    def reputations(self, who: Principal) -> dict[str, dict[str, float]]:
        """Reputation per book (the judging agent) and per judged agent."""
        _admin(who, "read reputations")
        from forge.share.consensus import Reputation

        books = sorted({k.split("/")[1] for k in self.store.settings() if k.startswith("reputation/")})
        return {b: Reputation(self.store, book=b).all() for b in books}

    def agents(self, who: Principal) -> list[dict[str, Any]]:
        """Agents seen in the audit log with their activity counts."""
        _admin(who, "list agents")
        self.flush()
        counts: dict[str, dict[str, int]] = {}
        for e in self.store.events(limit=100_000, newest_first=True, viewer=Viewer.admin()):
            if e.actor:
                counts.setdefault(e.actor, {}).setdefault(e.op, 0)
                counts[e.actor][e.op] += 1
        return [{"agent": a, "ops": ops, "total": sum(ops.values())} for a, ops in sorted(counts.items())]

    # -- runs -----------------------------------------------------------------------------
    def runs(self, who: Principal) -> list[dict[str, Any]]:
        """Run directories (those with a ``config.json``) under the runs folder, and one level
        deeper: ``forge evolve --quick-demo`` writes ``quick-demo-<stamp>/zero-shot`` and
        ``quick-demo-<stamp>/forge``. A nested run is named by its path, ``parent/child``."""
        if self.runs_dir is None or not self.runs_dir.is_dir():
            return []
        found: list[Path] = []
        for top in sorted(p for p in self.runs_dir.iterdir() if p.is_dir()):
            if (top / "config.json").is_file():
                found.append(top)
            else:  # a folder of runs (not looked into below a run: its checkpoints are not runs)
                with contextlib.suppress(OSError):
                    found.extend(sorted(p for p in top.iterdir() if p.is_dir() and (p / "config.json").is_file()))
        out = []
        for d in found:
            try:
                cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(cfg, dict):
                continue
            out.append({"name": d.relative_to(self.runs_dir).as_posix(), "finished": (d / "final.json").is_file(), "env": cfg.get("env"),
                        "condition": cfg.get("condition"), "representation": cfg.get("representation"), "llm": cfg.get("llm")})
        return out

    def run(self, who: Principal, name: str) -> dict[str, Any]:
        from forge.protocols.report import _summary_row, load_run

        run = load_run(self._run_dir(name))
        return _summary_row(run)

    def run_report(self, who: Principal, name: str) -> str:
        from forge.protocols.report import build_report

        with tempfile.TemporaryDirectory() as tmp:
            paths = build_report([self._run_dir(name)], tmp)
            return paths["html"].read_text(encoding="utf-8")

    def _run_dir(self, name: str) -> Path:
        """The run ``name`` (``run`` or ``parent/run``, as :meth:`runs` lists it), never a path
        outside the runs folder."""
        parts = name.split("/")
        if (self.runs_dir is None or not 1 <= len(parts) <= 2 or any(p in ("", ".", "..") for p in parts)
                or not (self.runs_dir.joinpath(*parts) / "config.json").is_file()):
            raise NotFoundError(f"no run named {name!r}")
        return self.runs_dir.joinpath(*parts)


def _no_system_meta(meta: Any, recorded: Mapping[str, Any]) -> None:
    """Refuse system meta keys an agent sets to other than what was recorded."""
    if not isinstance(meta, Mapping):
        return  # Unit.from_dict says what is wrong with it
    forged = sorted(k for k in meta if k in SYSTEM_META and (k not in recorded or meta[k] != recorded[k]))
    if forged:
        raise ValidationError(f"meta {', '.join(forged)} {'is' if len(forged) == 1 else 'are'} recorded by the server "
                              "(provenance, travel, consensus); leave them out")


def _seen_parents(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A trace's parent tree without the parents its viewer could not see (trace marks them missing)."""
    return [{**n, **({"derived_from": _seen_parents(n["derived_from"])} if "derived_from" in n else {})}
            for n in nodes if not n.get("missing")]


def _admin(who: Principal, what: str) -> None:
    if not who.admin:
        raise AccessError(f"only an admin key can {what}")


def _page(limit: int, offset: int) -> None:
    if not 1 <= limit <= 1000 or offset < 0:
        raise ValidationError("limit must be between 1 and 1000 and offset non-negative")


def _event(e: Event) -> dict[str, Any]:
    return {"seq": e.seq, "ts": e.ts, "op": e.op, "unit_id": e.unit_id, "actor": e.actor, "data": dict(e.data)}


def admission_dict(d: Admitted) -> dict[str, Any]:
    """An admission decision as the REST API and MCP answer it (with its one-line ``summary``)."""
    return {"action": d.action, "summary": d.summary, "unit_id": d.unit_id, "incoming": d.incoming,
            "existing": d.existing, "similarity": d.similarity, "reason": d.reason, "held": d.held}


def event_dict(e: Event) -> dict[str, Any]:
    """An event as JSON-ready data."""
    return _event(e)


def parse_scope(value: str) -> str:
    return str(Scope.parse(value))


def _check_query(query: str, k: int) -> None:
    """The checks recall and context share: a query to search for, and a sane ``k``."""
    if not query.strip():
        raise ValidationError("the query is empty")
    if not 1 <= k <= 200:
        raise ValidationError("k must be between 1 and 200")
