"""Consolidation: episodes -> procedures, every N tasks, and observable.

The team's consolidation is a policy of :mod:`forge.curate.consolidate` (one engine for any
memory: clustering, generalising, source links, one transaction): :class:`ProcedurePolicy`
says what is team-specific. As in LLMA-Mem: cluster the episodes by the similarity of their
lessons (cosine >= 0.72 to the cluster's centroid, one greedy pass in recording order so a run
is reproducible), generalise every cluster that holds a success (at most 5 successful episodes
shown to the LLM) into a procedure whose success/failure counts are seeded from the cluster,
then archive procedures whose source episodes are a strict subset of another procedure's (a
bigger cluster has absorbed them). A procedure is written in the goal's and the situations'
terms, never one game's walk: the model is asked so and its text is held to the envs' names
(:func:`forge.team.lessons.check_procedure`); without a model it is composed from the
lessons' situated parts (:func:`fallback_procedure`). Counts and sources are per task (an
:class:`~forge.model.Episode` record), so the per-agent copies of one task in local pools
count once.

Every run leaves a trail: procedures added, ``derived_from`` relations whose notes say which
cluster and similarity put each episode there, archivals with their reason, all under the
actor ``consolidate:<run id>`` in the store's event log, plus the whole
:class:`ConsolidationReport` stored as an Episode record (``env="forge.team.consolidate"``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from forge.curate.consolidate import Candidate, ClusterPlan, cluster_vectors, generalise
from forge.curate.consolidate import consolidate as curate_consolidate
from forge.engine.port import MemoryPort
from forge.envs.base import EnvSpec
from forge.errors import ValidationError
from forge.model import Context as UnitContext
from forge.model import (
    Episode,
    Kind,
    Provenance,
    Status,
    Unit,
    Viewer,
    derived_id,
)
from forge.store import Filter
from forge.team.lessons import check_procedure, compose
from forge.team.memories import (
    PROCEDURE_IMPORTANCE,
    Procedure,
    TeamMemory,
    _clip,
    _Pool,
    smoothed,
)

__all__ = [
    "CONSOLIDATION_ENV",
    "ClusterReport",
    "ConsolidationReport",
    "Consolidator",
    "ProcedurePolicy",
    "cluster_vectors",
    "consolidate",
]

CONSOLIDATION_ENV = "forge.team.consolidate"

#: Resolves an env's name (an episode's ``context.domain``) to its spec; None when unknown.
SpecOf = Callable[[str], "EnvSpec | None"]


@dataclass(frozen=True, slots=True)
class ClusterReport:
    """One cluster and what became of it: ``action`` is generalised, unchanged or skipped."""

    pool: str
    episodes: tuple[str, ...]  # episode unit ids, recording order
    similarities: tuple[float, ...]  # each member's cosine to the centroid when it joined
    sources: tuple[str, ...]  # distinct Episode record ids (tasks)
    successes: int
    failures: int
    action: str
    reason: str
    procedure: str | None = None
    title: str = ""
    author: str = ""  # "llm" or "fallback"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class ConsolidationReport:
    """What one consolidation run clustered, generalised and pruned, and why."""

    run_id: str
    team: str
    threshold: float
    started_at: float
    finished_at: float = 0.0
    episodes: int = 0
    clusters: list[ClusterReport] = field(default_factory=list)
    pruned: list[dict[str, Any]] = field(default_factory=list)
    record_id: str = ""  # the Episode record holding this report

    @property
    def generalised(self) -> list[ClusterReport]:
        return [c for c in self.clusters if c.action == "generalised"]

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "record_id"}
        d["generalised"] = [c.procedure for c in self.generalised]
        return d


def fallback_procedure(episodes: Sequence[Unit], specs: Sequence[EnvSpec] = ()) -> tuple[str, str, list[str]]:
    """(title, knowledge, dropped) without a model: the most common task type (else the first
    task) as the title; as the knowledge, the episodes' lessons composed part by part
    (:func:`forge.team.lessons.compose`: the situated parts of their record lessons, else the
    lessons whole), after the steps they took. A part that names something of one task only
    to the envs' ``specs``, or lists its episode's moves (a lesson written before lessons were
    situated), is left out, and why is in ``dropped``."""
    types = [str(u.meta.get("task_type") or "") for u in episodes]
    common = max(set(types), key=lambda t: (types.count(t), t)) if types else ""
    title = common or _clip(str(episodes[0].meta.get("task", "procedure")), 60)
    dropped: list[str] = []
    items = []
    for u in episodes:
        kept = []
        for part in u.meta.get("lesson_parts") or u.meta.get("lessons", []):
            text, why = check_procedure(part, specs, [_walk(u)])
            if text is None:
                dropped.append(f"part dropped: {why}")
            else:
                kept.append(text)
        items.append(kept)
    steps = [u.meta.get("lesson_steps") or u.meta.get("outcome", {}).get("metrics", {}).get("steps") for u in episodes]
    knowledge = compose(items, [int(n) for n in steps if n]) if any(items) else ""
    return _clip(title, 120), _clip(knowledge or "Repeat what worked.", 4000), dropped


#: What the model is asked to make of the successes: the next task is another map or game, so
#: a walk or a generated name written into the procedure would mislead the team there.
ASK = (
    "Generalise them into one reusable procedure: a short title and the knowledge that made them work, for "
    "similar future tasks. The next task is a different map or game, with other names and another layout: "
    "write what to do in which kind of situation, in the goal's and the situations' terms (for example "
    "'when the goal's object is in the room, take it'), never the sequence of moves of one game and never "
    "a name or a position that only one game had."
)


class ProcedurePolicy:
    """The team's consolidation as a :class:`~forge.curate.consolidate.ClusterPolicy`.

    Groups are the team's procedural pools: a private pool consolidates the episodes its owner
    can read, the team pool all of the team's episodes. Vectors are the episodes' lessons. A
    cluster without a success is skipped; one whose tasks a procedure already covers (or
    covered, since archived) is unchanged; any other becomes a procedure (a single episode
    too: ``min_size`` is 1). After a pool's procedures land, :meth:`tidy` archives the ones a
    wider procedure absorbed. Writes happen under ``tm.lock``, so a concurrent
    :meth:`TeamMemory.record_use` never resurrects an archived procedure. One instance per run:
    it keeps the run's episode count and prunings.

    ``specs`` resolves an env name (an episode's ``context.domain``) to its
    :class:`~forge.envs.base.EnvSpec`: a model's procedure is held to the envs of its cluster
    (:func:`forge.team.lessons.check_procedure`), repaired when its names can be made kinds,
    refused for the fallback when a name of one game or a move list remains; either way the
    cluster's report says so.
    """

    min_size = 1

    def __init__(
        self, tm: TeamMemory, *, threshold: float = 0.72, max_successes: int = 5, llm: Any = None, retries: int = 1,
        specs: SpecOf | None = None,
    ) -> None:
        if max_successes < 1:
            raise ValidationError("max_successes must be at least 1")
        self.tm = tm
        self.specs = specs
        self.threshold = threshold
        self.max_successes = max_successes
        self.llm = llm
        self.retries = retries
        self.episodes = 0
        self.pruned: list[dict[str, Any]] = []
        self._pools: dict[str, _Pool] = {}
        self._covered: dict[str, tuple[dict[frozenset[str], str], set[str]]] = {}

    def groups(self, memory: MemoryPort) -> list[tuple[str, list[Unit]]]:
        tm, out = self.tm, []
        for pool in tm.pools("procedural"):
            if pool.owner:
                episodes = memory.list(viewer=tm.viewer(pool.owner), filter=tm.layer_filter("episodic", Kind.EPISODE), limit=1_000_000)
            else:
                episodes = _all_episodes(tm)
            self.episodes += len(episodes)
            self._pools[pool.key] = pool
            out.append((pool.key, episodes))
        return out

    def vectors(self, memory: MemoryPort, units: Sequence[Unit]) -> np.ndarray:
        return np.asarray(memory.embed([" ".join(u.meta.get("lessons", [])) or u.content for u in units]))

    def _covers(self, key: str) -> tuple[dict[frozenset[str], str], set[str]]:
        """The pool's active procedures by their set of tasks, and every procedure id it ever had."""
        if key not in self._covered:
            pool = self._pools[key]
            existing = {frozenset(p.sources): p.id for p in _pool_procedures(self.tm, pool) if p.sources}
            self._covered[key] = existing, {p.id for p in _pool_procedures(self.tm, pool, archived=True)}
        return self._covered[key]

    def plan(self, memory: MemoryPort, cluster: Candidate, *, run: str, actor: str, now: float) -> ClusterPlan:
        tm, pool = self.tm, self._pools[cluster.group]
        units = list(cluster.members)
        by_task: dict[str, bool] = {}
        for u in units:
            by_task.setdefault(_task_id(u), bool(u.meta.get("outcome", {}).get("success")))
        s = sum(by_task.values())
        f = len(by_task) - s
        base = dict(pool=pool.key, episodes=tuple(u.id for u in units), similarities=cluster.joined, sources=tuple(by_task), successes=s, failures=f)
        if s == 0:
            return ClusterPlan(ClusterReport(**base, action="skipped", reason="no success in the cluster"))
        existing, known = self._covers(pool.key)
        same = existing.get(frozenset(by_task))
        pid = derived_id("procedure", "procedure", tm.team, pool.key, *sorted({_task_index(u) for u in units}))
        if same is None and pid in known:
            same = pid  # written before (and since archived): never twice
        if same is not None:
            return ClusterPlan(ClusterReport(**base, action="unchanged", reason="a procedure already covers exactly these episodes", procedure=same))
        wins, seen = [], set()
        for u in reversed(units):  # the most recent successes, one per task
            if u.meta.get("outcome", {}).get("success") and _task_id(u) not in seen:
                seen.add(_task_id(u))
                wins.append(u)
        wins = wins[: self.max_successes][::-1]
        shown = "These tasks were solved successfully:\n\n" + "\n\n".join(
            f"Task: {_clip(str(u.meta.get('task', '')), 300)}\nLessons: {' '.join(u.meta.get('lessons', []))}" for u in wins
        )
        specs = self._specs(units)
        title, knowledge, error = generalise(self.llm, shown, ask=ASK, field="knowledge", retries=self.retries)
        notes: list[str] = []
        if title:
            title, knowledge, error, notes = _checked(title, knowledge, specs, [_walk(u) for u in units])
        if title:
            title, knowledge, author = _clip(title, 120), _clip(knowledge, 4000), "llm"
        else:
            title, knowledge, notes = fallback_procedure(wins, specs)
            author = "fallback"
        reason = "; ".join(
            [f"{len(units)} episodes ({s} successful tasks, {f} failed) with lesson cosine >= {self.threshold}"]
            + ([f"fallback text: {error}"] if author == "fallback" else [])
            + notes
        )
        c = ClusterReport(**base, action="generalised", reason=reason, procedure=pid, title=title, author=author)
        with tm.lock:
            created = tm.stamp()
        unit = Unit(
            id=pid,
            content=f"{title}: {knowledge}",
            kind=Kind.PROCEDURE,
            scope=pool.scope,
            owner=pool.owner,
            context=UnitContext(tags=(f"team:{tm.team}", "layer:procedural")),
            validation=smoothed(s, f),
            importance=PROCEDURE_IMPORTANCE,
            provenance=Provenance(source=actor, episodes=c.sources, derived_from=c.episodes),
            created_at=created,
            meta={
                "title": title,
                "knowledge": knowledge,
                "successes": s,
                "failures": f,
                "uses": 0,
                "sources": list(c.sources),
                "consolidation": {"run": run, "cluster": cluster.number, "author": author},
            },
        )
        number = cluster.number
        return ClusterPlan(
            c,
            unit=unit,
            sources=tuple(zip(c.episodes, c.similarities, strict=True)),
            note=lambda _eid, sim: f"consolidation {run}: cluster {number}, lesson cosine to centroid {sim:.2f}",
        )

    def _specs(self, units: Sequence[Unit]) -> list[EnvSpec]:
        """The specs of the envs a cluster's episodes were played in (those the resolver knows)."""
        if self.specs is None:
            return []
        found = (self.specs(env) for env in dict.fromkeys(u.context.domain for u in units if u.context.domain))
        return [spec for spec in found if spec is not None]

    def tidy(self, memory: MemoryPort, group: str, *, run: str, actor: str) -> None:
        self.pruned += _prune(self.tm, self._pools[group], run=run, actor=actor)

    def writing(self) -> AbstractContextManager[Any]:
        return self.tm.lock


def consolidate(
    tm: TeamMemory,
    *,
    threshold: float = 0.72,
    max_successes: int = 5,
    llm: Any = None,
    retries: int = 1,
    specs: SpecOf | None = None,
) -> ConsolidationReport:
    """Run one consolidation over every procedural pool of ``tm`` and return its report:
    :func:`forge.curate.consolidate.consolidate` with a :class:`ProcedurePolicy` (``specs``:
    env name -> its spec, to hold procedure text to).

    LLM calls happen outside ``tm.lock``; the writes (add, relate, archive) happen under it,
    in one transaction.
    """
    policy = ProcedurePolicy(
        tm, threshold=threshold, max_successes=max_successes, llm=llm if llm is not None else tm.llm, retries=retries, specs=specs
    )
    started = time.time()
    done = curate_consolidate(tm.memory, policy=policy)
    report = ConsolidationReport(
        run_id=done.run_id, team=tm.team, threshold=threshold, started_at=started, episodes=policy.episodes,
        clusters=list(done.clusters), pruned=policy.pruned,
    )
    report.finished_at = time.time()
    record = Episode(
        agent="consolidator",
        task=f"consolidate team {tm.team}",
        env=CONSOLIDATION_ENV,
        outcome=report.to_dict(),
        meta={"team": tm.team, "run_id": done.run_id},
    )
    report.record_id = tm.memory.add_episode(record, actor=f"consolidate:{done.run_id}")
    return report


def _walk(u: Unit) -> list[str]:
    """An episode's actions in order: what a procedure must not list back."""
    return [str(a.get("text", "")) for a in u.meta.get("actions", [])]


def _checked(
    title: str, knowledge: str, specs: Sequence[EnvSpec], walks: Sequence[Sequence[str]]
) -> tuple[str, str, str, list[str]]:
    """A model's (title, knowledge) held to the cluster's envs: ``(title, knowledge, "",
    notes)``, repaired where names could be made kinds (said in ``notes``), or ``("", "", why,
    [])`` when refused, for the fallback to speak."""
    notes = []
    out = []
    for text in (title, knowledge):
        kept, why = check_procedure(text, specs, walks)
        if kept is None:
            return "", "", f"the model's procedure was refused: it {why}", []
        if why:
            notes.append(f"model's procedure {why}")
        out.append(kept)
    return out[0], out[1], "", notes


def _task_id(u: Unit) -> str:
    return str(u.meta.get("episode_id") or (u.provenance.episodes[0] if u.provenance.episodes else u.id))


def _all_episodes(tm: TeamMemory) -> list[Unit]:
    """Every episode of the team in every pool: what a shared procedural pool learns from."""
    return tm.memory.list(
        viewer=Viewer.admin(), filter=Filter.make(kinds=[Kind.EPISODE], tags_all=[f"team:{tm.team}"]), limit=1_000_000
    )


def _task_index(u: Unit) -> str:
    return str(u.meta.get("task_index", _task_id(u)))


def _pool_procedures(tm: TeamMemory, pool: _Pool, *, archived: bool = False) -> list[Procedure]:
    f = tm.pool_filter(pool, Kind.PROCEDURE, status=list(Status) if archived else None)
    units = tm.memory.list(viewer=Viewer.admin(), filter=f, limit=1_000_000)
    return [Procedure.of(u) for u in units]


def _prune(tm: TeamMemory, pool: _Pool, *, run: str, actor: str) -> list[dict[str, Any]]:
    """Archive procedures whose sources are a strict subset of another active procedure's."""
    procs = [p for p in _pool_procedures(tm, pool) if p.sources]
    pruned = []
    for p in procs:
        mine = set(p.sources)
        wider = [q for q in procs if q.id != p.id and mine < set(q.sources)]
        if not wider:
            continue
        q = max(wider, key=lambda q: len(q.sources))
        reason = (
            f"consolidation {run}: its {len(mine)} source episodes are a strict subset of "
            f"the {len(q.sources)} of procedure {q.id} ({q.title!r})"
        )
        tm.memory.set_status(p.id, Status.ARCHIVED, reason=reason, actor=actor)
        pruned.append({"procedure": p.id, "pool": pool.key, "subset_of": q.id, "reason": reason})
    return pruned


class Consolidator:
    """Runs :func:`consolidate` every ``every`` tasks, inline or on a background thread.

        cons = Consolidator(tm, every=5, background=True)
        ...after each task: tm.record_task(...); cons.task_done()
        reports = cons.wait()          # before reading results or closing

    One worker thread at most, so runs never overlap; the hot path only pays for submitting.
    In the background, what the next tasks see depends on how fast the run finishes, so the
    team runner consolidates inline at task boundaries (:meth:`run`): a run and its resume
    must see the same procedures. The count starts from the tasks already in the store, so a
    resumed run keeps its rhythm.
    """

    def __init__(
        self,
        tm: TeamMemory,
        *,
        every: int = 5,
        threshold: float = 0.72,
        max_successes: int = 5,
        background: bool = False,
        llm: Any = None,
        specs: SpecOf | None = None,
    ) -> None:
        if every < 1:
            raise ValidationError("consolidation interval 'every' must be at least 1 task")
        self.tm = tm
        self.every = every
        self.threshold = threshold
        self.max_successes = max_successes
        self.background = background
        self.llm = llm
        self.specs = specs
        self.reports: list[ConsolidationReport] = []
        self._since = tm.tasks_recorded % every
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[ConsolidationReport]] = []

    @property
    def due(self) -> bool:
        return self._since >= self.every

    def task_done(self) -> ConsolidationReport | Future[ConsolidationReport] | None:
        """Count one finished task; when ``every`` have passed, consolidate (or schedule it)."""
        self._since += 1
        if not self.due:
            return None
        self._since = 0
        return self.start() if self.background else self.run()

    def run(self) -> ConsolidationReport:
        """Consolidate now, on this thread."""
        report = consolidate(self.tm, threshold=self.threshold, max_successes=self.max_successes, llm=self.llm, specs=self.specs)
        with self._lock:
            self.reports.append(report)
        return report

    def start(self) -> Future[ConsolidationReport]:
        """Schedule a run on the background worker and return its future."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"forge-consolidate-{self.tm.team}")
            fut = self._pool.submit(self.run)
            self._pending.append(fut)
        return fut

    def wait(self) -> list[ConsolidationReport]:
        """Wait for scheduled runs; re-raises the first failure. Returns all reports so far."""
        with self._lock:
            pending, self._pending = self._pending, []
        for fut in pending:
            fut.result()
        return list(self.reports)

    def close(self) -> None:
        """Wait for scheduled runs and stop the worker."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def __enter__(self) -> Consolidator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
