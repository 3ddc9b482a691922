"""``Memory``: a store and an embedder used together, the engine's front door.

    from forge import Memory, Unit, Viewer
    mem = Memory.open("team.db")                   # local embedder, SQLite file
    mem.add([Unit("When the door is locked, look for a key first.", kind="rule")])
    for r in mem.recall("the door will not open", viewer=Viewer.admin()):
        print(r.score, r.unit.content, r.reasons)

The store remembers which embedder built it; opening it with another one is refused rather
than silently mixing vector spaces.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import os
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from forge.engine import tickets
from forge.engine.embed import Embedder, open_embedder
from forge.engine.recall import (
    Packed,
    Recalls,
    Reranker,
    Weights,
    approx_tokens,
    pack,
    recall,
)
from forge.errors import ConfigError, DimensionError, ValidationError
from forge.model import Episode, Relation, RelationType, Status, Unit, Viewer
from forge.store import Event, Filter, Store, indexed_text, open_store

__all__ = ["MAX_HOPS", "MAX_QUERY_CHARS", "MAX_RECALL", "Memory"]

#: Most units one recall returns, most graph hops it expands, longest query it takes.
MAX_RECALL = 10_000
MAX_HOPS = 16
MAX_QUERY_CHARS = 100_000


def _count(value: Any, name: str, *, least: int, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{name} must be an integer, got {type(value).__name__}")
    if not least <= value <= most:
        raise ValidationError(f"{name} must be between {least} and {most}, got {value}")
    return value


def _check_query(query: Any) -> None:
    if not isinstance(query, str):
        raise ValidationError(f"a query must be a string, got {type(query).__name__}")
    if len(query) > MAX_QUERY_CHARS:
        raise ValidationError(f"the query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError("the query is not valid Unicode text (it contains a lone surrogate)") from None


class _Gate:
    """At most ``slots`` threads inside at once, admitted in arrival order; re-entrant.

    A recall is mostly Python and numpy under the GIL. With 16 threads recalling at once on
    2 cores, each one's GIL hand-offs waited on the others': 230 recalls/s in-process at
    100k units, against 456/s with two at a time (bench/service.py's store). A plain
    semaphore got 527/s by letting two threads do everything while 14 waited the whole
    run; here a leaving thread hands its slot to the longest waiter.
    """

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._waiting: deque[threading.Lock] = deque()
        self._lock = threading.Lock()
        self._held = threading.local()

    def __enter__(self) -> None:
        depth = getattr(self._held, "depth", 0)
        self._held.depth = depth + 1
        if depth:  # already inside (a reranker that recalls): no second slot
            return
        with self._lock:
            if self._free > 0 and not self._waiting:
                self._free -= 1
                return
            turn = threading.Lock()
            turn.acquire()
            self._waiting.append(turn)
        turn.acquire()  # released by the thread that hands its slot over

    def __exit__(self, *exc: object) -> None:
        self._held.depth -= 1
        if self._held.depth:
            return
        with self._lock:
            if self._waiting:
                self._waiting.popleft().release()
            else:
                self._free += 1


class Memory:
    """Units in, ranked and explained units out.

    ``concurrent_recalls`` bounds how many recalls run at once (default: the number of
    CPUs); more threads than that wait their turn, in order, which is faster on the whole
    than letting them all contend for the GIL (see ``_Gate``).
    """

    def __init__(self, store: Store, embedder: Embedder, *, concurrent_recalls: int | None = None, llm: Any = None) -> None:
        """``llm`` (an LLM or a spec for :func:`forge.llm.open_llm`) is what :meth:`add_messages`
        extracts with; it defaults to the embedded model, opened on first use."""
        self.llm = llm
        self._opened_llm: Any = None
        slots = (os.cpu_count() or 1) if concurrent_recalls is None else concurrent_recalls
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValidationError("concurrent_recalls must be a positive integer")
        self._gate = _Gate(slots)
        recorded = store.settings().get("embedder")
        if recorded and recorded != embedder.name:
            raise ConfigError(
                f"this store was built with embedder {recorded!r}; open it with that embedder, not {embedder.name!r}"
            )
        if store.dim is not None and store.dim != embedder.dim:
            raise DimensionError(store.dim, embedder.dim)
        if not recorded and not store.info.get("readonly"):
            store.set_setting("embedder", embedder.name)
        self.store = store
        self.embedder = embedder
        self._ticket_key: bytes | None = None

    @classmethod
    def open(cls, path: str | Path = ":memory:", *, embedder: str | Embedder | None = None,
             concurrent_recalls: int | None = None, llm: Any = None) -> Memory:
        """Open a store by path/URL; the embedder defaults to the one the store was built with."""
        store = open_store(path)
        try:
            if embedder is None:
                embedder = store.settings().get("embedder") or "local"
            if isinstance(embedder, str):
                embedder = open_embedder(embedder)  # a recorded name ("local:all-MiniLM-L6-v2") reopens that model
            return cls(store, embedder, concurrent_recalls=concurrent_recalls, llm=llm)
        except BaseException:
            store.close()
            raise

    # -- writing --------------------------------------------------------------------------
    def add(
        self, units: Unit | Sequence[Unit], *, vectors: Any = None, actor: str = "", batch_size: int = 256
    ) -> list[str]:
        """Embed and store units in ONE transaction: all of them land, or none do.

        ``vectors`` (one row per unit) are embeddings the caller already computed with
        :meth:`embed_units`, e.g. to search near a unit before deciding to keep it; they are
        stored as given. ``batch_size`` is how many texts go to the embedder at once. An
        error names the unit that caused it (its position and id).
        """
        if isinstance(units, Unit):
            units = [units]
        elif isinstance(units, str | bytes | Mapping) or not isinstance(units, Iterable):
            raise ValidationError(f"add() takes a Unit or a list of Units, not {type(units).__name__}")
        units = list(units)
        for i, u in enumerate(units, 1):
            if not isinstance(u, Unit):
                raise ValidationError(f"unit {i} of {len(units)} is a {type(u).__name__}, not a Unit")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValidationError("batch_size must be a positive integer")
        if not units:
            return []
        if vectors is None:
            vectors = np.concatenate(
                [self.embed_units(units[i : i + batch_size]) for i in range(0, len(units), batch_size)]
            )
        else:
            vectors = np.asarray(vectors, dtype=np.float32)
            if vectors.ndim == 1:
                vectors = vectors.reshape(1, -1)
            if vectors.ndim != 2 or vectors.shape[0] != len(units):
                raise ValidationError(f"add() got {vectors.shape[0] if vectors.ndim else 0} vectors for {len(units)} units")
            if vectors.shape[1] != self.embedder.dim:
                raise DimensionError(self.embedder.dim, vectors.shape[1])
        return self.store.add(units, vectors, actor=actor)

    def update(self, unit: Unit, *, actor: str = "", reembed: bool = True) -> Unit:
        """Replace a unit; ``reembed=False`` keeps its vector (only counts or meta changed)."""
        vec = self.embed_units([unit]) if reembed else None
        return self.store.update(unit, vec, actor=actor)

    def transaction(self) -> AbstractContextManager[None]:
        """``with memory.transaction():`` makes the writes inside commit or fail together.

        Nested blocks are savepoints. Embed before entering when you can
        (:meth:`embed_units`, then ``add(..., vectors=...)``): the block holds the store's
        write lock while it runs.
        """
        return self.store.transaction()

    def claim(self, key: str) -> bool:
        """Record ``key`` once and for all; True only for the call that recorded it (see
        :meth:`forge.store.Store.claim`: inside a transaction it is undone with the rest)."""
        return self.store.claim(key)

    def set_setting(self, key: str, value: str) -> None:
        """Set one of the memory's own settings (a reputation, the embedder's name)."""
        self.store.set_setting(key, value)

    def append_event(
        self, op: str, *, unit_id: str | None = None, actor: str = "", data: Mapping[str, Any] | None = None,
        at: float | None = None,
    ) -> int:
        """Append a record that is not a change (a ledger decision, an audited read); its seq."""
        return self.store.append_event(op, unit_id=unit_id, actor=actor, data=data, at=at)

    def set_status(self, unit_id: str, status: Status | str, *, reason: str, actor: str = "") -> None:
        self.store.set_status(unit_id, Status.parse(status), reason=reason, actor=actor)

    def add_messages(self, messages: Any, *, llm: Any = None, actor: str = "", scope: str = "global", owner: str = "",
                     admit: bool = True) -> Any:
        """Remember a conversation: candidate facts, preferences and rules extracted by the LLM
        (``llm``, else this memory's, else the embedded model) under a JSON-schema grammar, each
        with why and from which turns, then admitted (a known fact merges, a changed one
        supersedes; ``admit=False`` stores as given). ``messages`` are ``{"role", "content"}``
        turns. Returns a :class:`forge.curate.messages.Ingested`: every candidate, with
        admission's decision or why it was skipped."""
        from forge.curate.messages import add_messages
        from forge.llm import open_llm

        if isinstance(llm, str):  # a spec for this call only
            with contextlib.closing(open_llm(llm)) as once:
                return add_messages(self, messages, llm=once, actor=actor, scope=scope, owner=owner, admit_units=admit)
        return add_messages(self, messages, llm=llm or self.get_llm(), actor=actor, scope=scope, owner=owner, admit_units=admit)

    def get_llm(self) -> Any:
        """This memory's LLM: the one it was given, else its spec (or the embedded model) opened once."""
        if self.llm is not None and not isinstance(self.llm, str):
            return self.llm
        if self._opened_llm is None:
            from forge.llm import open_llm

            self._opened_llm = open_llm(self.llm or "local")
        return self._opened_llm

    def erase(self, unit_id: str, *, reason: str, actor: str = "") -> dict[str, Any]:
        """Remove a unit for good (the right to erasure): its content, vector, keyword postings,
        relations and history text, in every backend, leaving one ``erase`` event that says who
        erased which id, when and why. :meth:`set_status` to ``archived`` is the way to forget
        a unit and keep its history; this is for what must not be kept. Returns the
        tombstone's data (kind, scope, owner, reason, how much was removed)."""
        if not isinstance(reason, str) or not reason.strip():
            raise ValidationError("erasing a unit needs a reason (it is kept in the tombstone), e.g. reason='erasure request 12'")
        return self.store.erase(unit_id, actor=actor, reason=reason.strip())

    def relate(self, src: str, dst: str, type: str = "related_to", *, weight: float = 1.0, note: str = "", actor: str = "") -> Relation:
        rel = Relation(src=src, dst=dst, type=type, weight=weight, note=note)  # type: ignore[arg-type]
        self.store.relate(rel, actor=actor)
        return rel

    def record_use(self, unit_ids: Sequence[str], *, success: bool | None, actor: str = "") -> list[Unit]:
        """Units were shown for a decision whose outcome is now known: count it on each unit.

        Every caller that learns an outcome (protocols, agents, the team's procedures, the
        learning door's outcomes) comes here, so use counts and success rates live in one
        place: :class:`~forge.model.Counts` in ``meta``, and ``validation`` becomes its
        :attr:`~forge.model.Counts.rate` (the one credit model; corroboration moves the same
        number), which recall's validation boost reads. A procedure's rho is the same counts.
        ``success=None`` counts a use with no outcome yet. The units are read and updated in
        one transaction: all of them count the use, or none does.
        """
        admin = Viewer.admin()
        out: list[Unit] = []
        with self.store.transaction():
            for unit in self.store.get_many(list(dict.fromkeys(unit_ids)), viewer=admin):
                counts = unit.counts.added(success)
                validation = counts.rate if success is not None else unit.validation
                meta = {**unit.meta, **counts.to_meta()}
                out.append(self.store.update(unit.replace(meta=meta, validation=validation), None, actor=actor))
        return out

    def add_episode(self, episode: Episode, *, actor: str = "") -> str:
        return self.store.add_episode(episode, actor=actor)

    def get_episode(self, episode_id: str) -> Episode:
        """One recorded episode (:class:`~forge.errors.NotFoundError` if none): what a unit's
        provenance trace and a run's idempotent episode replay read."""
        return self.store.get_episode(episode_id)

    def touch(self, ids: Sequence[str], *, at: float | None = None) -> None:
        """Count units as recalled (access count, last access) without a recall: a view that
        filters recall's results (warm-up exposure) touches only the units it kept."""
        self.store.touch(ids, at=at)

    # -- reading --------------------------------------------------------------------------
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vecs = self.embedder.embed(list(texts))
        if vecs.shape[1] != self.embedder.dim:
            raise DimensionError(self.embedder.dim, vecs.shape[1])
        return vecs

    def embed_units(self, units: Sequence[Unit]) -> np.ndarray:
        """The vectors units are stored with: each one's :func:`~forge.store.indexed_text`,
        the same text the keyword index holds. Every write that embeds comes here."""
        return self.embed([indexed_text(u) for u in units])

    def get(self, unit_id: str, *, viewer: Viewer) -> Unit:
        return self.store.get(unit_id, viewer=viewer)

    def get_many(self, ids: Sequence[str], *, viewer: Viewer) -> list[Unit]:
        """The units ``viewer`` may see among ``ids`` (unknown or hidden ones are left out)."""
        return self.store.get_many(ids, viewer=viewer)

    def list(self, *, viewer: Viewer, filter: Filter = Filter(), limit: int = 100, offset: int = 0) -> list[Unit]:
        """Units ``viewer`` may see that pass ``filter``, unranked (no query, no touch)."""
        return self.store.list(viewer=viewer, filter=filter, limit=limit, offset=offset)

    def count(self, *, viewer: Viewer, filter: Filter = Filter()) -> int:
        return self.store.count(viewer=viewer, filter=filter)

    def vector(self, unit_id: str, *, viewer: Viewer) -> np.ndarray | None:
        """The vector ``unit_id`` is stored with (None if it has none or ``viewer`` may not see
        it): consolidation clusters and a run hands units on with it, so nothing is embedded twice."""
        return self.store.vector(unit_id, viewer=viewer)

    def relations(self, unit_id: str, *, viewer: Viewer) -> builtins.list[Relation]:
        """The relations of ``unit_id`` whose both ends ``viewer`` may see (a provenance trace,
        a belief timeline)."""
        return self.store.relations(unit_id, viewer=viewer)

    def neighbors(
        self, ids: Sequence[str], *, viewer: Viewer, types: Iterable[RelationType] = (), filter: Filter = Filter()
    ) -> builtins.list[tuple[str, Relation]]:
        """``(id, relation)`` for every relation of ``types`` touching ``ids``: curation finds
        contradicting pairs without walking unit by unit."""
        return self.store.neighbors(ids, viewer=viewer, types=types, filter=filter)

    @property
    def info(self) -> Mapping[str, Any]:
        """The backend's facts (path, ``readonly``, ``warming``...): what the service's health
        and the learning page show, without reaching into :attr:`store`."""
        return self.store.info

    def nearest(
        self, vector: Any, *, k: int, viewer: Viewer, filter: Filter = Filter(), at_least: float = -1.0
    ) -> builtins.list[tuple[Unit, float]]:
        """The ``k`` units closest to ``vector`` (cosine at least ``at_least``) that ``viewer``
        may see, closest first, with their cosines: the exchange's and consensus's
        duplicate and conflict checks, without recall's fusion or access counting."""
        hits = [h for h in self.store.vector_search(vector, k=k, viewer=viewer, filter=filter) if h.score >= at_least]
        units = {u.id: u for u in self.store.get_many([h.id for h in hits], viewer=viewer)}
        return [(units[h.id], h.score) for h in hits if h.id in units]

    def settings(self) -> dict[str, str]:
        """The memory's own settings (``embedder``, ``reputation/<book>/<agent>``...)."""
        return self.store.settings()

    def events(self, *, viewer: Viewer, **narrow: Any) -> builtins.list[Event]:
        """The event log as ``viewer`` may see it, narrowed as :meth:`forge.store.Store.events` takes."""
        return self.store.events(viewer=viewer, **narrow)

    def recall(
        self,
        query: str,
        *,
        viewer: Viewer,
        k: int = 10,
        filter: Filter = Filter(),
        weights: Weights = Weights(),
        hops: int = 1,
        rerank: Reranker | None = None,
        touch: bool = True,
        min_score: float = 0.0,
    ) -> Recalls:
        """The ``k`` best units for ``query`` as ``viewer``, scored 0-1; none below ``min_score``.

        The list's ``recall_id`` (for an agent viewer) is what :meth:`outcome` takes to credit
        these units once the decision they fed is judged."""
        _check_query(query)
        k = _count(k, "k", least=1, most=MAX_RECALL)
        hops = _count(hops, "hops", least=0, most=MAX_HOPS)
        if not isinstance(viewer, Viewer):
            raise ValidationError(f"viewer must be a Viewer, got {type(viewer).__name__}")
        if not isinstance(filter, Filter):
            raise ValidationError(f"filter must be a Filter, got {type(filter).__name__}")
        with self._gate:
            qv = self.embed([query])[0] if weights.vector > 0 else None
            found = recall(
                self.store,
                query=query,
                query_vector=qv,
                viewer=viewer,
                k=k,
                filter=filter,
                weights=weights,
                hops=hops,
                rerank=rerank,
                touch=touch,
                min_score=min_score,
            )
        out = Recalls(found)
        out.recall_id = self.recall_id(viewer, [r.unit.id for r in found])
        return out

    def context(self, query: str, *, viewer: Viewer, budget: int = 512, k: int = 20, count_tokens: Any = approx_tokens, **kw: Any) -> Packed:
        """Recall for ``query`` and pack the result into a ``budget``-token prompt block; its
        ``recall_id`` names the units shown, for :meth:`outcome`, and ``rules`` their typed
        advice."""
        budget = _count(budget, "budget", least=0, most=10**9)
        packed = pack(self.recall(query, viewer=viewer, k=k, **kw), budget=budget, count_tokens=count_tokens)
        return dataclasses.replace(packed, recall_id=self.recall_id(viewer, [u.id for u in packed.units]))

    def recall_id(self, viewer: Viewer, unit_ids: Sequence[str]) -> str:
        """A signed id naming ``unit_ids`` as shown to ``viewer``'s agent (see
        :mod:`forge.engine.tickets`); empty for a viewer that is no agent, or a read-only
        memory without a signing key."""
        if not viewer.agent or viewer.operator:
            return ""
        key = self._key()
        return tickets.mint(key, agent=viewer.agent, units=list(unit_ids)) if key is not None else ""

    def ticket(self, recall_id: str) -> tickets.Ticket:
        """What a recall id names; :class:`~forge.errors.NotFoundError` for one this memory did
        not issue (forged, altered, or from another memory)."""
        return tickets.read(self._key(), recall_id)

    def _key(self) -> bytes | None:
        if self._ticket_key is None:
            self._ticket_key = tickets.key_of(self.store)
        return self._ticket_key

    # -- learning (the front door; the work lives in forge.learn.online) ---------------------
    def learn(self, trace: Any, outcome: Any = None, *, agent: str, llm: Any = None, **kw: Any) -> Any:
        """Learn from one task an agent did: credit the recalls it names, reflect on it with
        ``llm`` (else this memory's), and store what holds as rules, lessons and procedures.
        See :func:`forge.learn.online.learn`; returns its :class:`~forge.learn.online.Learned`."""
        from forge.learn.online import learn

        return learn(self, trace, outcome, agent=agent, llm=llm if llm is not None else self._llm_or_none(), **kw)

    def outcome(self, recall_id: str, *, agent: str, success: bool | None = None, score: float | None = None) -> Any:
        """Credit the units a recall showed with how the decision they fed turned out (once per
        recall id). See :func:`forge.learn.online.credit`."""
        from forge.learn.online import credit

        return credit(self, recall_id, agent=agent, success=success, score=score)

    def _llm_or_none(self) -> Any:
        return self.get_llm() if self.llm is not None or self._opened_llm is not None else None

    # -- bulk -----------------------------------------------------------------------------
    def export(self, *, viewer: Viewer) -> Iterator[dict[str, Any]]:
        """Export records ``viewer`` may see (``Viewer.admin()`` for a full, lossless dump)."""
        return self.store.export_records(viewer=viewer)

    def import_records(self, records: Iterable[dict[str, Any]], *, actor: str = "import") -> int:
        """Import JSONL records in one transaction; units without vectors are embedded."""
        records = [dict(r) if isinstance(r, Mapping) else r for r in records]
        missing = [r for r in records if isinstance(r, dict) and r.get("record") == "unit" and "vector" not in r]
        if missing and len(missing) == sum(1 for r in records if isinstance(r, dict) and r.get("record") == "unit"):
            import base64

            units = []
            for i, r in enumerate(records, 1):
                if isinstance(r, dict) and r.get("record") == "unit":
                    try:
                        units.append(Unit.from_dict({k: v for k, v in r.items() if k != "record"}))
                    except ValidationError as exc:
                        raise ValidationError(f"record {i}: {exc}") from None
            for r, v in zip(missing, self.embed_units(units), strict=True):
                r["vector"] = base64.b64encode(np.asarray(v, dtype=np.float32).tobytes()).decode()
        return self.store.import_records(records, actor=actor)

    def stats(self) -> dict[str, Any]:
        return self.store.stats()

    def close(self) -> None:
        opened, self._opened_llm = self._opened_llm, None
        if opened is not None:
            opened.close()
        self.store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
