"""FORGE memory for CrewAI: a storage backend for crewai's unified ``Memory``, and a learning trace, over a Memory or a Client.

    from crewai import Agent, Crew, Task
    from forge.integrations.crewai import ForgeStorage
    storage = ForgeStorage(Memory.open("team.db"))               # or ForgeStorage(Client(url, key))
    crew = Crew(agents=[...], tasks=[...], memory=storage.crew_memory(llm=my_llm))

``ForgeStorage`` implements crewai's ``StorageBackend`` protocol
(``crewai.memory.storage.backend``), the place crewai takes a custom store:
``crewai.Memory(storage=..., embedder=...)``. ``storage.crew_memory(...)`` builds that
Memory with the storage's embedder and any of crewai's Memory settings. Then:

- **a crewai record is a FORGE unit** (kind ``fact`` unless told), tagged ``crewai``; its
  crewai scope path and categories are tags (``crewai:/ops``, ``crewai-category:incidents``),
  its metadata, source and privacy flag are kept in ``meta["crewai"]``;
- **writes go through admission** within their crewai scope (``admit=False`` stores them
  as given): a record that repeats one already stored is merged into it (one unit, its
  validation corroborated) and the record takes that unit's id; a newer record that
  contradicts one supersedes it. ``last_admissions`` holds the latest save's decisions;
- **search is FORGE's hybrid recall** of the query's text (vector, keyword, graph), inside
  the scope prefix and categories crewai asks for, in FORGE's order. Each hit's score is its
  cosine to the query under FORGE's embedder, clipped to 0-1 (``scores="cosine"``): crewai
  weighs it with recency and importance and compares it with absolute thresholds (a save
  whose best match reaches ``consolidation_threshold``, 0.85, asks crewai's LLM to
  consolidate). ``scores="fused"`` gives FORGE's fused 0-1 recall score instead, which is
  relative to the query's candidates (1.0 is the best by every signal), so crewai would
  consolidate nearly every save. crewai hands a storage only query vectors: the storage's
  ``embedder`` (a hashing embedder, no model, no network) remembers which text each vector
  it made stands for, so give crewai's Memory ``embedder=storage.embedder`` (``crew_memory``
  does); FORGE embeds with its own embedder;
- **delete and reset archive** (FORGE never erases here: history stays), and only units
  this storage's door wrote (tag ``crewai``); other FORGE units are not crewai records.

**Learning**: ``ForgeCrewTrace`` records a crew's run through crewai's own callbacks
(``Agent(step_callback=rec.step_callback)`` or the Crew's, and ``Crew(task_callback=rec.task_callback)``):
each tool the agent used, with its input and what it returned, and each task's output (the
first task's description is the trace's task, the last output its answer).
``rec.report(memory, success=..., score=..., feedback=...)`` sends it with its outcome to
FORGE's learning entry (``POST /v1/learn`` over a client, as a job; :meth:`forge.Memory.learn`
over a memory, as ``agent``). crewai hands a step callback the steps of its text (ReAct)
loop; with an LLM that calls tools natively, crewai 1.15 passes only the final answers.
crewai warns that a bound method callback is not saved in its checkpoints: a recorder is
one run's, and a run restored from a checkpoint is not recorded.

crewai itself still asks its LLM to extract memories from a task's result and to infer
scope, categories and importance (``Memory(llm=...)``), and sends telemetry unless
``CREWAI_DISABLE_TELEMETRY=true`` (or ``OTEL_SDK_DISABLED=true``); FORGE sends nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
from crewai.agents.parser import AgentAction, AgentFinish
from crewai.memory.storage.backend import StorageBackend
from crewai.memory.types import MemoryRecord, ScopeInfo
from crewai.tasks.task_output import TaskOutput
from pydantic import BaseModel

from forge.curate.admission import ADD, NOOP, Admitted
from forge.engine.embed import HashingEmbedder
from forge.errors import ConfigError, NotFoundError
from forge.integrations._learn import Reporting, TraceRecorder
from forge.integrations._port import ForgeMemory
from forge.model import MAX_TAGS, Context, Provenance, Status, Unit, Viewer
from forge.store import Filter

__all__ = ["ForgeCrewTrace", "ForgeStorage"]

MARK = "crewai"  # tag on every unit this door writes
_CATEGORY = "crewai-category:"
_PAGE = 1000
_REMEMBERED = 4096  # query texts the embedder keeps, most recent first


def _path(scope: str | None) -> str:
    """A crewai scope path, normalised: leading slash, no trailing one; ``/`` is the root."""
    parts = [p for p in (scope or "/").strip().split("/") if p]
    return "/" + "/".join(parts)


def _scope_tags(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    return [f"{MARK}:/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _under(path: str, prefix: str | None) -> bool:
    prefix = _path(prefix)
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


def _naive_utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC).replace(tzinfo=None)  # crewai's datetimes are naive UTC


def _epoch(dt: datetime) -> float:
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


class _Embedder:
    """The vectors crewai sees: hashing-embedder stand-ins that name their text to the storage.

    crewai embeds a query, then hands the storage the vector; FORGE recalls by the text, so
    each vector made here remembers its text (the last few thousand)."""

    def __init__(self, dim: int = 256) -> None:
        self._hash = HashingEmbedder(dim)
        self._texts: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, input: Sequence[str]) -> list[list[float]]:
        texts = [str(t) for t in input]
        vecs = self._hash.embed(texts) if texts else np.zeros((0, self._hash.dim), dtype=np.float32)
        with self._lock:
            for text, vec in zip(texts, vecs, strict=True):
                key = vec.tobytes()
                self._texts[key] = text
                self._texts.move_to_end(key)
            while len(self._texts) > _REMEMBERED:
                self._texts.popitem(last=False)
        return [v.tolist() for v in vecs]

    def __deepcopy__(self, memo: dict[int, Any]) -> _Embedder:
        return self  # copies of crewai's Memory share what their vectors stand for

    def text_of(self, vector: Sequence[float]) -> str | None:
        key = np.asarray(vector, dtype=np.float32).tobytes()
        with self._lock:
            return self._texts.get(key)


class _Local:
    """A :class:`forge.Memory` in this process; admission by :func:`forge.curate.admit`."""

    def __init__(self, memory: ForgeMemory, viewer: Viewer | None, actor: str) -> None:
        self.memory, self.viewer, self.actor = memory, viewer or Viewer.admin(), actor

    def write(self, units: list[Unit], admit: bool) -> list[Admitted]:
        if admit:
            from forge.curate.admission import admit as admit_units

            return admit_units(self.memory, units, actor=self.actor)
        return [Admitted(ADD, uid, "stored as given (admission off)", uid) for uid in self.memory.add(units, actor=self.actor)]

    def get(self, unit_id: str) -> Unit | None:
        found = self.memory.get_many([unit_id], viewer=self.viewer)
        return found[0] if found else None

    def page(self, f: Filter, limit: int, offset: int) -> list[Unit]:
        return self.memory.list(viewer=self.viewer, filter=f, limit=limit, offset=offset)

    def recall(self, query: str, k: int, f: Filter, min_score: float) -> list[Any]:
        return self.memory.recall(query, viewer=self.viewer, k=k, filter=f, min_score=min_score)

    def update(self, unit: Unit, reembed: bool) -> None:
        self.memory.update(unit, actor=self.actor, reembed=reembed)

    def archive(self, unit_id: str, reason: str) -> None:
        self.memory.set_status(unit_id, Status.ARCHIVED, reason=reason, actor=self.actor)


class _Remote(_Local):
    """A :class:`forge.client.Client`: the service admits, and the key is the viewer."""

    def __init__(self, client: Any, actor: str) -> None:
        self.memory, self.actor = client, actor

    def write(self, units: list[Unit], admit: bool) -> list[Admitted]:
        if admit:
            return self.memory.admit(units, actor=self.actor)
        return [Admitted(ADD, uid, "stored as given (admission off)", uid) for uid in self.memory.add(units, actor=self.actor, admit=False)]

    def get(self, unit_id: str) -> Unit | None:
        try:
            return self.memory.get(unit_id)
        except NotFoundError:
            return None

    def page(self, f: Filter, limit: int, offset: int) -> list[Unit]:
        return self.memory.list(filter=f, limit=limit, offset=offset)

    def recall(self, query: str, k: int, f: Filter, min_score: float) -> list[Any]:
        return self.memory.recall(query, k=min(k, 200), filter=f, min_score=min_score)

    def update(self, unit: Unit, reembed: bool) -> None:
        self.memory.update(unit, actor=self.actor, reembed=reembed)


class ForgeStorage(StorageBackend):
    """crewai's ``StorageBackend`` over a :class:`forge.Memory` or a :class:`forge.client.Client`
    (see the module docstring).

    ``scope`` and ``owner`` are the FORGE scope the units are written in (who may see them:
    ``global``, ``group:NAME``, ``private`` with an owner); crewai's own scope paths live in
    tags. Over a memory, ``viewer`` reads (default: the operator's); over a client, the key.
    """

    def __init__(self, memory: ForgeMemory, *, viewer: Viewer | None = None, scope: str = "global", owner: str = "",
                 kind: str = "fact", actor: str = "crewai", admit: bool = True, scores: str = "cosine",
                 embedder_dim: int = 256) -> None:
        from forge.client import AsyncClient, Client

        if isinstance(memory, AsyncClient):
            raise ConfigError("crewai's storage calls are blocking: give ForgeStorage a Client, not an AsyncClient")
        if scores not in ("cosine", "fused"):
            raise ConfigError(f"scores must be 'cosine' or 'fused', not {scores!r}")
        self.memory = memory
        self.scope, self.owner, self.kind, self.admit, self.scores = scope, owner, kind, admit, scores
        self.embedder = _Embedder(embedder_dim)
        self.last_admissions: list[Admitted] = []
        self._backend = _Remote(memory, actor) if isinstance(memory, Client) else _Local(memory, viewer, actor)

    def __deepcopy__(self, memo: dict[int, Any]) -> ForgeStorage:
        return self  # a handle on one store: copies of crewai's Memory share it

    def crew_memory(self, **kwargs: Any) -> Any:
        """crewai's ``Memory`` over this storage and its embedder; ``kwargs`` are Memory's own
        (``llm=``, ``root_scope=``, ``recency_weight=``...)."""
        from crewai.memory.unified_memory import Memory as CrewMemory

        return CrewMemory(storage=self, embedder=self.embedder, **kwargs)

    # -- records and units ---------------------------------------------------------------
    def _unit(self, record: MemoryRecord, *, base: Unit | None = None) -> Unit:
        path = _path(record.scope)
        categories = list(dict.fromkeys(str(c) for c in record.categories or []))
        tags = (MARK, *_scope_tags(path), *(_CATEGORY + c for c in categories))
        if len(tags) > MAX_TAGS:
            raise ConfigError(f"a crewai record with scope {path!r} and {len(categories)} categories needs {len(tags)} "
                              f"tags; a FORGE unit holds {MAX_TAGS}: use a shallower scope or fewer categories")
        meta = {MARK: {"scope": path, "categories": categories, "metadata": dict(record.metadata or {}),
                       "source": record.source, "private": bool(record.private)}}
        context = Context(task=f"{MARK}:{path}", tags=tags)  # admission compares within one crewai scope
        if base is not None:
            return base.replace(content=record.content, context=context, importance=float(record.importance),
                                meta={**base.meta, **meta})
        return Unit(record.content, kind=self.kind, id=record.id, context=context, scope=self.scope,  # type: ignore[arg-type]
                    owner=self.owner, importance=float(record.importance), created_at=_epoch(record.created_at),
                    provenance=Provenance(source=f"{MARK}:{record.source}" if record.source else MARK), meta=meta)

    @staticmethod
    def _record(unit: Unit) -> MemoryRecord:
        c = unit.meta.get(MARK) or {}
        return MemoryRecord(
            id=unit.id, content=unit.content, scope=c.get("scope", "/"), categories=list(c.get("categories", [])),
            metadata=dict(c.get("metadata", {})), importance=unit.importance, created_at=_naive_utc(unit.created_at),
            last_accessed=_naive_utc(unit.last_access or unit.updated_at or unit.created_at), source=c.get("source"),
            private=bool(c.get("private", False)),
        )

    @staticmethod
    def _filter(scope_prefix: str | None, categories: Iterable[str] | None = None) -> Filter:
        """Active units of this door under ``scope_prefix`` (each carries a tag per prefix of its
        path), in any of ``categories``."""
        tags = [MARK, *_scope_tags(_path(scope_prefix))[-1:]]
        return Filter.make(tags_all=tags, tags_any=[_CATEGORY + c for c in categories or []])

    def _mine(self, unit: Unit | None) -> bool:
        return unit is not None and MARK in unit.context.tags and MARK in unit.meta

    def _all(self, scope_prefix: str | None) -> list[Unit]:
        """Every active unit this door wrote under ``scope_prefix``, oldest first."""
        f = self._filter(scope_prefix)
        out: list[Unit] = []
        while True:
            page = self._backend.page(f, _PAGE, len(out))
            out += page
            if len(page) < _PAGE:
                return out

    # -- StorageBackend ------------------------------------------------------------------
    def save(self, records: list[MemoryRecord]) -> None:
        """Admit ``records`` (one decision each, in ``last_admissions``); a record merged into
        a unit already stored takes that unit's id."""
        records = list(records)
        if not records:
            self.last_admissions = []
            return
        decisions = self._backend.write([self._unit(r) for r in records], self.admit)
        for record, d in zip(records, decisions, strict=True):
            if d.action == NOOP:
                record.id = d.unit_id  # what crewai returns from remember(): the memory that holds it
        self.last_admissions = decisions

    def search(self, query_embedding: list[float], scope_prefix: str | None = None, categories: list[str] | None = None,
               metadata_filter: dict[str, Any] | None = None, limit: int = 10, min_score: float = 0.0) -> list[tuple[MemoryRecord, float]]:
        """FORGE's recall of the text ``query_embedding`` stands for, as (record, score 0-1), best first."""
        query = self.embedder.text_of(query_embedding)
        if query is None:
            raise ConfigError("ForgeStorage recalls by text and did not make this query vector: build crewai's Memory "
                              "with embedder=storage.embedder (storage.crew_memory(...) does)")
        k = max(1, min(int(limit) * (4 if metadata_filter else 1), 200))
        fused = self.scores == "fused"
        hits = self._backend.recall(query, k, self._filter(scope_prefix, categories), float(min_score) if fused else 0.0)
        out = []
        for r in hits:
            if not self._mine(r.unit):
                continue
            score = float(r.score) if fused else min(1.0, max(0.0, float(r.why.get("vector", {}).get("similarity", 0.0))))
            record = self._record(r.unit)
            if score < min_score or (metadata_filter and any(record.metadata.get(key) != v for key, v in metadata_filter.items())):
                continue
            out.append((record, score))
        return out[:limit]

    def delete(self, scope_prefix: str | None = None, categories: list[str] | None = None, record_ids: list[str] | None = None,
               older_than: datetime | None = None, metadata_filter: dict[str, Any] | None = None) -> int:
        """Archive the matching records (FORGE keeps their history); how many."""
        if record_ids is not None:
            found = [self._backend.get(i) for i in dict.fromkeys(record_ids)]
            units = [u for u in found if u is not None and self._mine(u) and u.status is Status.ACTIVE
                     and _under(u.meta[MARK]["scope"], scope_prefix)]
        else:
            units = self._all(scope_prefix)
        cutoff = _epoch(older_than) if older_than is not None else None
        gone = 0
        for u in units:
            record = self._record(u)
            if categories and not set(categories) & set(record.categories):
                continue
            if cutoff is not None and u.created_at >= cutoff:
                continue
            if metadata_filter and any(record.metadata.get(key) != v for key, v in metadata_filter.items()):
                continue
            self._backend.archive(u.id, "deleted through crewai")
            gone += 1
        return gone

    def update(self, record: MemoryRecord) -> None:
        """Replace the record's unit in place (crewai's consolidation rewrote it)."""
        unit = self._backend.get(record.id)
        if not self._mine(unit):
            raise ValueError(f"Record not found: {record.id}")
        assert unit is not None
        changed = self._unit(record, base=unit)
        self._backend.update(changed, reembed=changed.text != unit.text)

    def get_record(self, record_id: str) -> MemoryRecord | None:
        unit = self._backend.get(record_id)
        return self._record(unit) if self._mine(unit) and unit is not None and unit.status is Status.ACTIVE else None

    def list_records(self, scope_prefix: str | None = None, limit: int = 200, offset: int = 0) -> list[MemoryRecord]:
        units = sorted(self._all(scope_prefix), key=lambda u: (-u.created_at, u.id))
        return [self._record(u) for u in units[offset : offset + limit]]

    def get_scope_info(self, scope: str) -> ScopeInfo:
        path = _path(scope)
        units = self._all(path)
        cats = sorted({c for u in units for c in u.meta[MARK].get("categories", [])})
        times = [u.created_at for u in units]
        return ScopeInfo(path=path, record_count=len(units), categories=cats,
                         oldest_record=_naive_utc(min(times)) if times else None,
                         newest_record=_naive_utc(max(times)) if times else None,
                         child_scopes=self._children(path, units))

    @staticmethod
    def _children(parent: str, units: list[Unit]) -> list[str]:
        depth = len([p for p in parent.split("/") if p])
        kids = set()
        for u in units:
            parts = [p for p in u.meta[MARK]["scope"].split("/") if p]
            if len(parts) > depth:
                kids.add("/" + "/".join(parts[: depth + 1]))
        return sorted(kids)

    def list_scopes(self, parent: str = "/") -> list[str]:
        path = _path(parent)
        return self._children(path, self._all(path))

    def list_categories(self, scope_prefix: str | None = None) -> dict[str, int]:
        counts: dict[str, int] = {}
        for u in self._all(scope_prefix):
            for c in u.meta[MARK].get("categories", []):
                counts[c] = counts.get(c, 0) + 1
        return counts

    def count(self, scope_prefix: str | None = None) -> int:
        return len(self._all(scope_prefix))

    def reset(self, scope_prefix: str | None = None) -> None:
        for u in self._all(scope_prefix):
            self._backend.archive(u.id, "reset through crewai")

    async def asave(self, records: list[MemoryRecord]) -> None:
        await asyncio.to_thread(self.save, records)

    async def asearch(self, query_embedding: list[float], scope_prefix: str | None = None, categories: list[str] | None = None,
                      metadata_filter: dict[str, Any] | None = None, limit: int = 10, min_score: float = 0.0) -> list[tuple[MemoryRecord, float]]:
        return await asyncio.to_thread(self.search, query_embedding, scope_prefix, categories, metadata_filter, limit, min_score)

    async def adelete(self, scope_prefix: str | None = None, categories: list[str] | None = None, record_ids: list[str] | None = None,
                      older_than: datetime | None = None, metadata_filter: dict[str, Any] | None = None) -> int:
        return await asyncio.to_thread(self.delete, scope_prefix, categories, record_ids, older_than, metadata_filter)


# -- learning -------------------------------------------------------------------------------


class ForgeCrewTrace(Reporting):
    """A crew's run as a learning trace, from crewai's step and task callbacks (see the module
    docstring); one recorder is one run: ``reset()`` it, or make a new one, for the next."""

    def __init__(self, *, task: str = "", kind: str = "") -> None:
        self.recorder = TraceRecorder(task=task, kind=kind)

    def reset(self, task: str = "") -> None:
        self.recorder.reset(task)

    def step_callback(self, step: Any) -> None:
        """crewai's ``step_callback``: a tool the agent used (its input, what it returned), or an answer."""
        if isinstance(step, AgentAction):
            self.recorder.message("assistant", step.thought)
            self.recorder.tool(step.tool, step.tool_input)
            self.recorder.observation(step.result or "", tool=step.tool)
        elif isinstance(step, AgentFinish):
            out = step.output.model_dump_json() if isinstance(step.output, BaseModel) else step.output
            self.recorder.message("assistant", out)

    def task_callback(self, output: TaskOutput) -> None:
        """crewai's ``task_callback``: a task's output (the first task is the trace's task, the last output its answer)."""
        if not self.recorder.task:
            self.recorder.task = output.description
        self.recorder.finish(output.raw)
