"""The FORGE evolution protocol (arXiv 2605.16233) and its baselines, from one code path.

Outer loop, per stage: every active instance plays its stage (up to k attempts, each aborted
at the first step reward below tau and reflected on; then one frozen, greedy checkpoint episode with
return R_i) in a freshly seeded environment. Then, depending on the condition's switches:

- graduation: R_i >= theta freezes the instance for good (no more attempts or changes).
  The paper writes R_i > theta; the env specs here set theta to the return that counts as
  solved (FrozenLake's theta is its maximum return, 1.0), so reaching it must suffice;
- broadcast: the champion (highest R_i among the instances that played the stage, lowest
  index on ties) has its whole memory copied over every other still-active instance (but
  the ``isolated`` ones); the replaced units are kept as SUPERSEDED history, the copies point
  back to the champion's units. A champion with no memory broadcasts nothing (it would wipe
  the others' rules; the stage records ``broadcast_skipped``).

An instance's memory is the units in the run's store in its private scope (owner
``inst-<i>``); each task hands a worker those units, and the worker's prompts are written from
them by the engine's recall. Instances differ on purpose: instance i samples its actions at a
temperature spread over ``[0, diversity]`` (instance 0 is greedy) with a seed derived from the
run seed, stage and instance, recorded in the task so a resumed run replays them.

Finally every instance is evaluated frozen over ``eval_episodes`` seeds.

Workers (processes) play instances; the parent process alone writes the run directory and
the store, committing each finished instance before the next is awaited, so ``resume``
continues from the last commit and reproduces an uninterrupted run.
"""

from __future__ import annotations

import functools
import multiprocessing
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from forge.errors import StoreError
from forge.llm.accounting import TokenLedger
from forge.llm.base import LLM
from forge.model import Provenance, Unit, new_id
from forge.population.ray_support import check_executor, import_ray, start_ray
from forge.protocols.config import ForgeConfig, derive_seed
from forge.protocols.episode import build_env, evaluate_instance, play_stage
from forge.protocols.ops import Add, Op, Relate, Supersede
from forge.protocols.progress import ProgressSink, make_sink
from forge.protocols.runs import RunDir, RunStore
from forge.store import indexed_text

__all__ = ["ChampionDelivery", "DirectDelivery", "RunResult", "evolve", "resume"]

Hook = Callable[[str, Mapping[str, Any]], None]
LLMFactory = Callable[[], LLM]


# -- broadcast seam ----------------------------------------------------------------------------


class ChampionDelivery(Protocol):
    """Delivers the champion's units to one receiver; returns the copies the receiver now holds.

    The in-process default copies directly; a bus-backed delivery (``forge.protocols.broadcast``)
    sends the champion's units as signed capsules through each receiver's exchange, without
    the protocol changing.
    """

    def deliver(self, *, champion: int, receiver: int, units: Sequence[Unit], stage: int) -> list[Unit]: ...


def champion_copy(unit: Unit, *, champion: int, receiver: int, stage: int) -> Unit:
    """The receiver's copy of one champion unit: its own id and scope, provenance to the origin."""
    meta = {k: v for k, v in unit.meta.items() if k not in ("uses", "successes", "failures")}
    meta["stage"] = stage
    return unit.replace(
        id=new_id(),
        owner=f"inst-{receiver}",
        provenance=Provenance(source=f"broadcast:inst-{champion}", episodes=unit.provenance.episodes, derived_from=(unit.id,)),
        validation=0.5,
        access_count=0,
        last_access=None,
        meta=meta,
    )


class DirectDelivery:
    """Broadcast with replacement, in process: the receiver gets fresh copies of every unit."""

    def deliver(self, *, champion: int, receiver: int, units: Sequence[Unit], stage: int) -> list[Unit]:
        return [champion_copy(u, champion=champion, receiver=receiver, stage=stage) for u in units]


# -- results -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunResult:
    """What a finished run produced; ``final`` is the content of final.json."""

    run_dir: Path
    config: ForgeConfig
    final: Mapping[str, Any] = field(default_factory=dict)

    @property
    def mean_return(self) -> float:
        return float(self.final["evaluation"]["mean_return"])

    @property
    def success_rate(self) -> float:
        return float(self.final["evaluation"]["success_rate"])

    @property
    def major_failure_rate(self) -> float:
        return float(self.final["evaluation"]["major_failure_rate"])

    @property
    def tokens(self) -> Mapping[str, Any]:
        return self.final["tokens"]


@dataclass(slots=True)
class _Instance:
    index: int
    graduated_stage: int | None = None
    returns: list[float | None] = field(default_factory=list)
    attempts: int = 0
    aborted: int = 0
    reflections: int = 0
    fallbacks: int = 0
    passes: int = 0  # checkpoints at or above theta

    @property
    def graduated(self) -> bool:
        return self.graduated_stage is not None

    @property
    def episodes(self) -> int:
        """Training episodes played so far (attempts and checkpoints): what warm-up counts.
        A graduated instance played every stage up to the one it graduated in."""
        played = self.graduated_stage + 1 if self.graduated_stage is not None else len(self.returns)
        return self.attempts + played

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.index,
            "graduated": self.graduated,
            "graduated_stage": self.graduated_stage,
            "returns": list(self.returns),
            "attempts": self.attempts,
            "aborted": self.aborted,
            "reflections": self.reflections,
            "fallbacks": self.fallbacks,
            "passes": self.passes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> _Instance:
        return cls(
            index=int(data["instance"]),
            graduated_stage=data.get("graduated_stage"),
            returns=list(data.get("returns", [])),
            attempts=int(data.get("attempts", 0)),
            aborted=int(data.get("aborted", 0)),
            reflections=int(data.get("reflections", 0)),
            fallbacks=int(data.get("fallbacks", 0)),
            passes=int(data.get("passes", 0)),
        )


# -- workers -----------------------------------------------------------------------------------

_WORKER_LLM: LLM | None = None
_WORKER_FACTORY: LLMFactory | None = None
_WORKER_KEY: str | None = None  # the run whose LLM a Ray worker holds


def _init_worker(factory: LLMFactory) -> None:
    global _WORKER_FACTORY
    _WORKER_FACTORY = factory


def _in_worker(kind: str, task: Mapping[str, Any]) -> dict[str, Any]:
    global _WORKER_LLM
    if _WORKER_LLM is None:
        assert _WORKER_FACTORY is not None  # set by the pool initializer
        _WORKER_LLM = _WORKER_FACTORY()
    fn = play_stage if kind == "stage" else evaluate_instance
    return fn(task, _WORKER_LLM)


def _in_ray_worker(key: str, factory: LLMFactory, kind: str, task: Mapping[str, Any]) -> dict[str, Any]:
    """A Ray task: a Ray worker process builds the LLM once per run (``key``) and keeps it."""
    global _WORKER_LLM, _WORKER_KEY
    if _WORKER_LLM is None or key != _WORKER_KEY:
        if _WORKER_LLM is not None:
            _WORKER_LLM.close()
        _WORKER_LLM, _WORKER_KEY = factory(), key
    fn = play_stage if kind == "stage" else evaluate_instance
    return fn(task, _WORKER_LLM)


def _open_llm(spec: str, threads: int | None) -> LLM:
    from forge.llm import open_llm

    kwargs: dict[str, Any] = {}
    if spec.startswith("local") and threads:
        kwargs["n_threads"] = threads
    return open_llm(spec, **kwargs)


def default_llm_factory(config: ForgeConfig) -> LLMFactory:
    """A picklable factory that builds ``config.llm`` (sharing the CPUs among workers)."""
    import os

    threads = max(1, (os.cpu_count() or 1) // config.workers) if config.workers > 1 else None
    return functools.partial(_open_llm, config.llm, threads)


class _Runner:
    """Runs tasks in process (workers=1), in a process pool, or as Ray tasks; results come
    back as they finish and are handed on in instance order per batch, so the run is the
    same whichever executes it (every task carries its own seeds)."""

    def __init__(self, config: ForgeConfig, factory: LLMFactory, hook: Hook | None, executor: str = "process") -> None:
        self.config = config
        self.factory = factory
        self.hook = hook
        self.executor = check_executor(executor)
        self._llm: LLM | None = None
        self._pool: ProcessPoolExecutor | None = None
        self._ray: Any = None  # the ray module once this runner started or joined a cluster
        self._ray_owned = False

    def run(self, kind: str, tasks: Sequence[Mapping[str, Any]], on_result: Callable[[dict[str, Any]], None]) -> None:
        if not tasks:
            return
        if self.executor != "process":
            self._run_ray(kind, tasks, on_result)
            return
        if self.config.workers == 1:
            if self._llm is None:
                self._llm = self.factory()
            fn = play_stage if kind == "stage" else evaluate_instance
            for task in tasks:
                on_result(fn(task, self._llm, self.hook))
            return
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.config.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(self.factory,),
            )
        pending: set[Future[dict[str, Any]]] = {self._pool.submit(_in_worker, kind, t) for t in tasks}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in sorted(done, key=lambda f: f.result()["instance"]):
                    on_result(fut.result())
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise

    def _start_ray(self) -> Any:
        """Join the Ray cluster (``ray://``) or start a local one with ``workers`` CPUs."""
        return self.adopt_ray(*start_ray(self.executor, self.config.workers))

    def adopt_ray(self, ray: Any, owned: bool) -> Any:
        """Play on a Ray this runner did not start itself; ``owned``: shut it down on close."""
        import uuid

        self._ray, self._ray_owned, self._ray_key = ray, owned, uuid.uuid4().hex
        self._ray_task = ray.remote(num_cpus=1, max_retries=0)(_in_ray_worker)
        return ray

    def _run_ray(self, kind: str, tasks: Sequence[Mapping[str, Any]], on_result: Callable[[dict[str, Any]], None]) -> None:
        ray = self._ray or self._start_ray()
        factory = ray.put(self.factory)
        pending = [self._ray_task.remote(self._ray_key, factory, kind, dict(t)) for t in tasks]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for result in sorted(ray.get(done), key=lambda r: r["instance"]):
                    on_result(result)
        except BaseException:
            for ref in pending:
                ray.cancel(ref)
            raise

    def close(self) -> None:
        if self._ray is not None and self._ray_owned:
            self._ray.shutdown()
        self._ray = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._llm is not None:
            self._llm.close()
            self._llm = None


# -- the protocol ------------------------------------------------------------------------------


def evolve(
    config: ForgeConfig,
    run_dir: str | Path,
    *,
    llm_factory: LLMFactory | None = None,
    progress: ProgressSink | bool | None = None,
    hook: Hook | None = None,
    delivery: ChampionDelivery | None = None,
    executor: str = "process",
) -> RunResult:
    """Run ``config`` from scratch into ``run_dir`` (which must not hold a run yet).

    ``llm_factory`` builds the LLM (once per worker process; it must be picklable when
    ``workers > 1``); by default ``open_llm(config.llm)``. ``executor`` is where instances
    are played: ``process`` (in this process, or ``workers`` worker processes), ``ray`` (Ray
    tasks on a local Ray started with ``workers`` CPUs) or ``ray://HOST:PORT`` (a running
    cluster whose nodes have FORGE installed); the result is the same for the same seeds. ``progress`` is True for a rich
    display (only on a terminal), a callable receiving ``(event, data)``, or None. ``hook``
    is called at stage, instance and attempt boundaries (tests interrupt runs from it).
    """
    if check_executor(executor) != "process":
        import_ray()  # fail fast, before anything is written, when Ray is missing
    env = build_env(config)  # fail on a missing optional backend before creating anything
    env.close()
    seeds = seed_units(config)  # a bad pack fails here, before the run directory exists
    run = RunDir(run_dir)
    # Start (or join) Ray before the run directory exists: an unreachable cluster is an
    # error that leaves nothing behind, not a run that cannot start.
    ray = start_ray(executor, config.workers) if executor != "process" else None
    try:
        run.create(config)
        run.event("run_started", config=config.to_dict())
        if seeds:
            store = RunStore(run, config)
            try:
                for owner, units in seeds.items():
                    store.apply([Add(u) for u in units], owner=owner)
            finally:
                store.close()
            run.event("seeded", pack=config.seed_pack, units={owner: len(units) for owner, units in seeds.items()})
    except BaseException:
        if ray is not None and ray[1]:
            ray[0].shutdown()
        raise
    return _drive(run, config, llm_factory=llm_factory, progress=progress, hook=hook, delivery=delivery,
                  executor=executor, ray=ray)


def seed_units(config: ForgeConfig) -> dict[str, list[Unit]]:
    """Every instance's copy of ``config.seed_pack`` (none without one), read and checked whole."""
    if not config.seed_pack:
        return {}
    from forge.curate.seeds import load_seed_pack

    out = {}
    for i in range(config.instances):
        owner = f"inst-{i}"
        out[owner] = [u.replace(id=f"{u.id}@{owner}") for u in load_seed_pack(config.seed_pack, scope="private", owner=owner)]
    return out


def resume(
    run_dir: str | Path,
    *,
    llm_factory: LLMFactory | None = None,
    progress: ProgressSink | bool | None = None,
    hook: Hook | None = None,
    delivery: ChampionDelivery | None = None,
    executor: str = "process",
) -> RunResult:
    """Continue an interrupted run where it stopped (a finished run returns its result).

    Completed stages and instances are not replayed; graduated instances stay graduated.
    A missing or corrupt run directory raises a one-line error and changes nothing.
    """
    run = RunDir(run_dir)
    config = run.load_config()
    # Validate every checkpoint before writing anything.
    for s in run.completed_stages(config.stages):
        run.read_json(run.stage_path(s))
    if run.final_path.exists():
        final = run.read_json(run.final_path)
        return RunResult(run.path, config, final)
    run.event("resumed")
    if check_executor(executor) != "process":
        import_ray()
    return _drive(run, config, llm_factory=llm_factory, progress=progress, hook=hook, delivery=delivery,
                  executor=check_executor(executor))


def _drive(
    run: RunDir,
    config: ForgeConfig,
    *,
    llm_factory: LLMFactory | None,
    progress: ProgressSink | bool | None,
    hook: Hook | None,
    delivery: ChampionDelivery | None,
    executor: str = "process",
    ray: tuple[Any, bool] | None = None,
) -> RunResult:
    started = time.perf_counter()
    sink = make_sink(progress, config)
    runner = _Runner(config, llm_factory or default_llm_factory(config), _chain(hook, sink), executor)
    if ray is not None:
        runner.adopt_ray(*ray)
    try:
        store = RunStore(run, config)
    except BaseException:
        runner.close()
        raise
    try:
        with sink:
            final = _Protocol(run, config, store, runner, sink, hook, delivery or DirectDelivery()).execute()
        final["wall_seconds"] = round(final.get("wall_seconds", 0.0) + time.perf_counter() - started, 3)
        run.write_json(run.final_path, final)
        run.event("run_done", mean_return=final["evaluation"]["mean_return"])
        return RunResult(run.path, config, final)
    finally:
        runner.close()
        store.close()


def _chain(hook: Hook | None, sink: ProgressSink) -> Hook:
    def both(event: str, data: Mapping[str, Any]) -> None:
        sink(event, data)
        if hook is not None:
            hook(event, data)

    return both


class _Protocol:
    def __init__(self, run: RunDir, config: ForgeConfig, store: RunStore, runner: _Runner, sink: ProgressSink, hook: Hook | None, delivery: ChampionDelivery) -> None:
        self.run = run
        self.config = config
        self.store = store
        self.runner = runner
        self.sink = sink
        self.hook = hook
        self.delivery = delivery
        self.ledger = TokenLedger()
        self.instances = [_Instance(i) for i in range(config.instances)]
        env = build_env(config)
        self.theta = env.spec.theta if config.theta is None else config.theta
        self.spec = env.spec
        env.close()
        self.stage_summaries: list[dict[str, Any]] = []
        self.budget: dict[str, Any] | None = None  # set when a training ceiling stopped the stages

    def _emit(self, event: str, **data: Any) -> None:
        self.sink(event, data)
        if self.hook is not None:
            self.hook(event, data)

    # -- state ------------------------------------------------------------------------------
    def _restore(self) -> int:
        """Load the last completed stage; returns the first stage still to play."""
        done = self.run.completed_stages(self.config.stages)
        for s in done:
            data = self.run.read_json(self.run.stage_path(s))
            try:
                self.stage_summaries.append(data["summary"])
            except (KeyError, TypeError):
                raise StoreError(f"{self.run.stage_path(s)}: not a stage checkpoint; nothing was changed") from None
        if not done:
            return 0
        last = self.run.read_json(self.run.stage_path(done[-1]))
        try:
            self.instances = [_Instance.from_dict(d) for d in last["instances"]]
            self.ledger = TokenLedger.from_dict(last["tokens"])
            # the last stage's broadcast may have been cut off before reaching the store
            for receiver, ops in last.get("broadcast_ops", {}).items():
                self.store.apply(ops, owner=f"inst-{int(receiver)}")
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"{self.run.stage_path(done[-1])}: corrupt checkpoint ({exc!r}); nothing was changed") from None
        return done[-1] + 1

    # -- main loop --------------------------------------------------------------------------
    def execute(self) -> dict[str, Any]:
        first = self._restore()
        for stage in range(first, self.config.stages):
            if not self._affordable(stage):
                break
            self._stage(stage)
        return self._evaluate()

    def _affordable(self, stage: int) -> bool:
        """Whether ``stage``'s worst case fits in the training ceilings still unspent
        (``train_decisions``, ``train_reflections``); if not, the run's ``budget`` says so."""
        cfg = self.config
        if not (cfg.train_decisions or cfg.train_reflections):
            return True
        active = sum(1 for i in self.instances if not i.graduated)
        attempts = cfg.attempts if cfg.flags.learning else 0
        worst = {
            "decisions": active * (attempts + 1) * (cfg.max_steps or self.spec.max_steps),
            "reflections": active * (attempts + int(cfg.flags.learning and cfg.reflect_on_checkpoint)),
        }
        spent = {k: sum(int(s.get(k, 0)) for s in self.stage_summaries) for k in worst}
        caps = {"decisions": cfg.train_decisions, "reflections": cfg.train_reflections}
        over = [k for k in worst if caps[k] and spent[k] + worst[k] > caps[k]]
        if over:
            self.budget = {"stopped_before_stage": stage, "spent": spent, "worst_next_stage": worst, "ceilings": caps, "over": over}
            self.run.event("budget_spent", **self.budget)
        return not over

    def _stage(self, stage: int) -> None:
        cfg = self.config
        active = [i for i in self.instances if not i.graduated]
        self.run.event("stage_started", stage=stage, active=[i.index for i in active])
        self._emit("stage_started", stage=stage, stages=cfg.stages, active=len(active))
        results: dict[int, dict[str, Any]] = {}
        for inst in active:  # finished before an interruption: committed, not replayed
            path = self.run.result_path(stage, inst.index)
            if path.is_file():
                results[inst.index] = self.run.read_json(path)
                self._apply_result(results[inst.index])
        tasks = [
            {
                "config": cfg.to_dict(),
                "instance": inst.index,
                "stage": stage,
                "seed": cfg.stage_seed(stage, inst.index),
                "sampling": self._sampling(inst.index, stage),
                **self._memory_of(inst.index),
                "episodes": inst.episodes,
            }
            for inst in active
            if inst.index not in results
        ]

        def commit(result: dict[str, Any]) -> None:
            self.run.write_json(self.run.result_path(stage, result["instance"]), result)
            self._apply_result(result)
            results[result["instance"]] = result
            ck = result["checkpoint"]
            self.run.event(
                "instance_done",
                stage=stage,
                instance=result["instance"],
                checkpoint_return=ck["return"],
                attempts=[{k: a[k] for k in ("attempt", "return", "aborted", "failing_step")} for a in result["attempts"]],
                fallbacks=sum(1 for a in result["attempts"] if a.get("reflection", {}).get("fallback")),
                tokens=TokenLedger.from_dict(result["tokens"]).total().total_tokens,
            )
            self._emit("instance_done", stage=stage, instance=result["instance"], checkpoint_return=ck["return"], attempts=len(result["attempts"]), tokens=self._tokens_so_far(results))

        self.runner.run("stage", tasks, commit)
        self._finish_stage(stage, active, results)

    def _memory_of(self, index: int) -> dict[str, Any]:
        """A task's view of an instance's memory: its unit records and the vectors they are
        stored with (the worker's scratch memory embeds nothing again)."""
        units = self.store.units(index)
        return {"units": [u.to_dict() for u in units], "vectors": self.store.vectors(units)}

    def _sampling(self, index: int, stage: int) -> dict[str, Any]:
        n = self.config.instances
        temperature = self.config.temperature + (self.config.diversity * index / (n - 1) if n > 1 else 0.0)
        return {"temperature": round(temperature, 4), "seed": derive_seed(self.config.seed, "sampling", stage, index)}

    def _tokens_so_far(self, results: Mapping[int, Mapping[str, Any]]) -> int:
        total = self.ledger.total().total_tokens
        return total + sum(TokenLedger.from_dict(r["tokens"]).total().total_tokens for r in results.values())

    def _apply_result(self, result: Mapping[str, Any]) -> None:
        owner = f"inst-{result['instance']}"
        self.store.add_episodes(result["episodes"])
        self.store.apply(result["ops"], owner=owner)

    def _finish_stage(self, stage: int, active: list[_Instance], results: Mapping[int, Mapping[str, Any]]) -> None:
        flags = self.config.flags
        scores: dict[int, float] = {}
        for inst in self.instances:
            res = results.get(inst.index)
            if res is None:  # graduated earlier: frozen, carries its last return
                inst.returns.append(inst.returns[-1] if inst.returns else None)
                continue
            score = float(res["checkpoint"]["return"])
            scores[inst.index] = score
            inst.returns.append(score)
            inst.attempts += len(res["attempts"])
            inst.aborted += sum(1 for a in res["attempts"] if a["aborted"])
            refl = [a["reflection"] for a in res["attempts"] if "reflection" in a]
            inst.reflections += len(refl)
            inst.fallbacks += sum(1 for r in refl if r["fallback"])
            self.ledger.merge(res["tokens"])
        graduated_now = []
        for idx, score in sorted(scores.items()):
            inst = self.instances[idx]
            first = results[idx]["attempts"][:1]
            first_try = not first or float(first[0]["return"]) >= self.theta
            inst.passes += score >= self.theta and (first_try or not self.config.graduate_first_try)
            if flags.graduation and score >= self.theta and inst.passes >= self.config.graduate_after:
                inst.graduated_stage = stage
                graduated_now.append(idx)
        champion = None
        skipped = None
        broadcast_ops: dict[int, list[Op]] = {}
        source: list[Unit] = []
        if flags.broadcast and scores:
            champion = max(sorted(scores), key=lambda i: scores[i])  # first max: lowest index
            source = self.store.units(champion)
            if not source:
                # A champion that won with no memory has nothing to teach: copying its empty
                # memory would erase what the others learned (a CAGE-2 run trained two stages
                # on wiped memories this way). Receivers keep theirs.
                skipped = f"champion inst-{champion} has no memory"
        if skipped is None and champion is not None:
            vectors = self.store.vectors(source)
            stored = dict(zip((u.id for u in source), vectors, strict=True)) if vectors is not None else {}
            for inst in self.instances:
                if inst.index == champion or inst.graduated or inst.index not in scores or inst.index in self.config.isolated:
                    continue
                new = self.delivery.deliver(champion=champion, receiver=inst.index, units=source, stage=stage)
                old = self.store.units(inst.index)
                broadcast_ops[inst.index] = _replacement_ops(old, new, champion=champion, stage=stage, sources=source, vectors=stored)
        summary = {
            "stage": stage,
            "returns": [inst.returns[-1] for inst in self.instances],
            "played": sorted(scores),
            "mean_checkpoint_return": statistics.fmean(v for v in (i.returns[-1] for i in self.instances) if v is not None)
            if any(i.returns[-1] is not None for i in self.instances)
            else None,
            "graduated_now": graduated_now,
            "graduated_total": sum(1 for i in self.instances if i.graduated),
            # the work the training ceilings count (decisions: one per env step)
            "decisions": sum(sum(int(a.get("steps", 0)) for a in r["attempts"]) + int(r["checkpoint"].get("steps", 0)) for r in results.values()),
            "reflections": sum(sum(1 for a in r["attempts"] if "reflection" in a) + ("reflection" in r["checkpoint"]) for r in results.values()),
            "champion": champion,
            "receivers": sorted(broadcast_ops),
            "broadcast_skipped": skipped,
            "successes": sum(1 for i in scores.values() if self.spec.succeeded(i)),  # checkpoints play on: never aborted
            "major_failures": sum(1 for i in scores.values() if i <= self.spec.major_failure_return),
            "tokens": self.ledger.total().total_tokens,
        }
        checkpoint = {
            "stage": stage,
            "summary": summary,
            "instances": [i.to_dict() for i in self.instances],
            "broadcast_ops": {str(k): [op.to_dict() for op in v] for k, v in broadcast_ops.items()},
            "tokens": self.ledger.to_dict(),
        }
        self.run.write_json(self.run.stage_path(stage), checkpoint)  # the commit point
        for receiver, ops in broadcast_ops.items():
            self.store.apply(ops, owner=f"inst-{receiver}")
        for inst in self.instances:
            self.run.write_jsonl(self.run.export_path(stage, inst.index), self.store.export(f"inst-{inst.index}"))
        self.stage_summaries.append(summary)
        self.run.event("stage_done", **summary)
        if champion is not None:
            self.run.event("broadcast", stage=stage, champion=champion, receivers=sorted(broadcast_ops), skipped=skipped)
        for idx in graduated_now:
            self.run.event("graduated", stage=stage, instance=idx, checkpoint_return=scores[idx])
        self._emit("stage_done", **summary)

    # -- final evaluation -------------------------------------------------------------------
    def _evaluate(self) -> dict[str, Any]:
        cfg = self.config
        seeds = cfg.evaluation_seeds()
        results: dict[int, dict[str, Any]] = {}
        for inst in self.instances:
            path = self.run.eval_path(inst.index)
            if path.is_file():
                results[inst.index] = self.run.read_json(path)
                self.store.add_episodes(results[inst.index]["episodes"])
        tasks = [{"config": cfg.to_dict(), "instance": i.index, "seeds": seeds, **self._memory_of(i.index), "episodes": i.episodes} for i in self.instances if i.index not in results]
        self.run.event("eval_started", pending=[t["instance"] for t in tasks])
        self._emit("eval_started", pending=len(tasks))

        def commit(result: dict[str, Any]) -> None:
            self.run.write_json(self.run.eval_path(result["instance"]), result)
            self.store.add_episodes(result["episodes"])
            results[result["instance"]] = result
            self.run.event("eval_done", instance=result["instance"], returns=[r["return"] for r in result["results"]])
            self._emit("eval_done", instance=result["instance"], returns=[r["return"] for r in result["results"]])

        self.runner.run("eval", tasks, commit)
        return self._final(results, seeds)

    def _final(self, results: Mapping[int, Mapping[str, Any]], seeds: list[int]) -> dict[str, Any]:
        eval_ledger = TokenLedger()
        for r in results.values():
            eval_ledger.merge(r["tokens"])
        all_tokens = TokenLedger().merge(self.ledger).merge(eval_ledger)
        rows = []
        flat: list[Mapping[str, Any]] = []
        for inst in self.instances:
            res = results[inst.index]["results"]
            flat += res
            rets = [r["return"] for r in res]
            rows.append(
                {
                    "instance": inst.index,
                    "graduated_stage": inst.graduated_stage,
                    "checkpoint_returns": inst.returns,
                    "final_returns": rets,
                    "mean_return": statistics.fmean(rets),
                    "attempts": inst.attempts,
                    "aborted": inst.aborted,
                    "reflections": inst.reflections,
                    "fallbacks": inst.fallbacks,
                    "memory_size": {k: sum(1 for u in self.store.units(inst.index) if u.kind.value == k) for k in ("rule", "example")},
                }
            )
        best = max(rows, key=lambda r: (r["mean_return"], -r["instance"]))["instance"]
        reflections = sum(i.reflections for i in self.instances)

        def usage(ledger: TokenLedger, tag: str) -> dict[str, Any]:
            return {str(k): v.to_dict() for k, v in sorted(ledger.by(tag).items(), key=lambda kv: str(kv[0]))}

        train = self.ledger
        return {
            "config": self.config.to_dict(),
            "condition": self.config.condition,
            "env": self.config.env,
            "thresholds": {"tau": self.config.tau if self.config.tau is not None else self.spec.tau, "theta": self.theta, "success_return": self.spec.success_return, "major_failure_return": self.spec.major_failure_return},
            "stages": self.stage_summaries,
            "instances": rows,
            "evaluation": {
                "seeds": seeds,
                "episodes": len(flat),
                "mean_return": statistics.fmean(r["return"] for r in flat),
                "success_rate": sum(1 for r in flat if r["success"]) / len(flat),
                "major_failure_rate": sum(1 for r in flat if r["major_failure"]) / len(flat),
                "returns": [r["return"] for r in flat],
                # held-out decisions with a rule for their situation in the prompt, and followed
                "rules": {k: sum(int((r.get("rules") or {}).get(k, 0)) for r in flat) for k in ("decisions", "rule_shown", "rule_followed")},
            },
            "graduated": sum(1 for i in self.instances if i.graduated),
            "budget": self.budget,
            "reflections": reflections,
            "fallback_rate": (sum(i.fallbacks for i in self.instances) / reflections) if reflections else 0.0,
            "champion": {"instance": best, "memory": [u.to_dict() for u in self.store.units(best)]},
            "tokens": {
                "training": train.total().to_dict(),
                "evaluation": eval_ledger.total().to_dict(),
                "total": all_tokens.total().to_dict(),
                "by_role": usage(all_tokens, "role"),
                "by_phase": usage(all_tokens, "phase"),
                "by_stage": usage(all_tokens, "stage"),
                "by_instance": usage(all_tokens, "instance"),
                "ledger": all_tokens.to_dict(),
            },
        }


def _replacement_ops(
    old: Sequence[Unit], new: Sequence[Unit], *, champion: int, stage: int,
    sources: Sequence[Unit] = (), vectors: Mapping[str, Any] | None = None,
) -> list[Op]:
    """Store ops for "receiver's memory replaced by the champion's": add copies, relate each
    copy to its origin (derived_from) and to the old unit it stands in for (supersedes), mark
    every old unit SUPERSEDED with the reason.

    A copy whose indexed text is its origin's carries the origin's stored vector (``vectors``
    by origin id): a broadcast embeds nothing."""
    vectors = vectors or {}
    origin_text = {u.id: indexed_text(u) for u in sources}

    def vector_of(copy: Unit) -> Any:
        origin = copy.provenance.derived_from[0] if copy.provenance.derived_from else ""
        return vectors.get(origin) if origin_text.get(origin) == indexed_text(copy) else None

    ops: list[Op] = [Add(u, vector_of(u)) for u in new]
    for u in new:
        for origin in u.provenance.derived_from:
            ops.append(Relate(u.id, origin, "derived_from", f"broadcast from inst-{champion}"))
    by_slot: dict[tuple[str, str], list[Unit]] = {}
    for u in new:
        by_slot.setdefault((u.context.role, u.kind.value), []).append(u)
    slots_old: dict[tuple[str, str], int] = {}
    reason = f"replaced by champion inst-{champion}'s memory at stage {stage}"
    for u in old:
        key = (u.context.role, u.kind.value)
        n = slots_old.get(key, 0)
        slots_old[key] = n + 1
        ops.append(Supersede(u.id, reason))
        candidates = by_slot.get(key) or list(new)
        if candidates:
            successor = candidates[min(n, len(candidates) - 1)]
            ops.append(Relate(successor.id, u.id, "supersedes", reason))
    return ops
