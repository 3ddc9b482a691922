"""What one worker does: play an instance's stage (attempts, reflection, checkpoint) or its
final evaluation, and report everything as plain JSON-ready data.

The instance's memory arrives as unit records (its active units in the run's store, in its
private scope) with the vectors they are stored with. The worker loads them into a scratch
in-memory :class:`~forge.engine.memory.Memory` without embedding them again,
so every prompt is written by the engine's recall (:mod:`forge.learn.prompt`) exactly as for any
other agent; what it learns comes back as store ops (:mod:`forge.protocols.ops`: new units with their
vectors, archived units, use counts)
for the parent, the run store's single writer. Given the same task and a deterministic LLM a
worker returns the same result, which is what makes ``resume`` equal an uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from forge.engine.embed import open_embedder
from forge.engine.memory import Memory
from forge.engine.recall import Weights
from forge.envs import Env, make_env
from forge.learn.loop import (
    Caps,
    Recaller,
    Trajectory,
    failure_point,
    learn_from,
    play_episode,
    reflect_on,
    retire_failing,
)
from forge.learn.policy import make_policy
from forge.llm.accounting import MeteredLLM, TokenLedger
from forge.llm.base import LLM
from forge.model import Context, Episode, Unit, Viewer
from forge.protocols.config import ForgeConfig
from forge.protocols.ops import Add, Archive, Op, SetCounts
from forge.store import open_store

__all__ = ["RUN_WEIGHTS", "build_env", "evaluate_instance", "play_stage", "scratch_memory"]

Hook = Callable[[str, Mapping[str, Any]], None]

#: Recall scoring inside runs: relevance, validation and importance, no recency, because
#: wall-clock ages would make a resumed run rank differently from an uninterrupted one.
RUN_WEIGHTS = Weights(validation=1.0, importance=0.5, recency=0.0)


def build_env(config: ForgeConfig) -> Env:
    kwargs = {"max_steps": config.max_steps} if config.max_steps else {}
    return make_env(config.env, **kwargs)


def scratch_memory(config: ForgeConfig, units: Sequence[Mapping[str, Any]], vectors: Any = None) -> Memory:
    """An in-memory engine holding ``units``: what a worker recalls from. ``vectors`` (one row
    per unit, from the run's store) are stored as given; without them the units are embedded."""
    memory = Memory(open_store(":memory:"), open_embedder(config.embedder))
    records = [Unit.from_dict(u) for u in units]
    if records:
        memory.add(records, vectors=vectors, actor="forge")
    return memory


def _task_memory(config: ForgeConfig, task: Mapping[str, Any]) -> Memory:
    return scratch_memory(config, task.get("units") or [], task.get("vectors"))


def _episode(traj: Trajectory, *, agent: str, config: ForgeConfig, env: Env, meta: Mapping[str, Any]) -> Episode:
    spec = env.spec
    aborted = traj.aborted
    return Episode(
        agent=agent,
        task=config.env,
        env=config.env,
        steps=tuple(traj.steps),
        outcome={
            "return": traj.total,
            "success": spec.succeeded(traj.total, aborted=aborted),
            "major_failure": traj.total <= spec.major_failure_return,
            "aborted": aborted,
            "failing_step": traj.failing,
            "steps": len(traj.actions),
            "shown": traj.used,
        },
        meta=dict(meta),
    )


def _thresholds(config: ForgeConfig, env: Env) -> tuple[float, float]:
    tau = env.spec.tau if config.tau is None else config.tau
    theta = env.spec.theta if config.theta is None else config.theta
    return tau, theta


def _counts(memory: Memory, ids: Sequence[str]) -> list[Op]:
    """Absolute use counts of ``ids`` after this worker's uses: idempotent store ops."""
    return [SetCounts.of(u) for u in memory.get_many(list(dict.fromkeys(ids)), viewer=Viewer.admin())]


def _added(memory: Memory, units: Sequence[Unit]) -> list[Op]:
    """Add ops for units this worker stored, each with the vector it embedded them with, so
    the run's store keeps that vector instead of embedding the unit again."""
    admin = Viewer.admin()
    return [Add(u, memory.vector(u.id, viewer=admin)) for u in units]


def play_stage(task: Mapping[str, Any], llm: LLM, hook: Hook | None = None) -> dict[str, Any]:
    """One instance's stage: up to k attempts with reflection on failure, then a frozen checkpoint.

    ``task`` holds ``config`` (dict), ``instance``, ``stage``, ``seed``, ``sampling``
    (temperature and seed of this instance's LLM calls), ``units`` (its memory) and
    ``episodes`` (how many it played before: what warm-up counts).
    Returns attempts, episodes, store ops, the checkpoint and the tokens.
    """
    config = ForgeConfig.from_dict(task["config"])
    inst, stage, seed = int(task["instance"]), int(task["stage"]), int(task["seed"])
    sampling = dict(task.get("sampling") or {})
    env = build_env(config)
    memory = _task_memory(config, task)
    agent = f"inst-{inst}"
    try:
        tau, _ = _thresholds(config, env)
        ledger = TokenLedger()
        metered = MeteredLLM(llm, ledger, condition=config.condition, stage=stage, instance=inst)
        recall = Recaller(
            memory, Viewer.of(agent), budget=config.memory_tokens, weights=RUN_WEIGHTS, valid_actions=env.valid_actions, abstract=env.spec.abstract,
            exposure=config.exposure(inst), episodes=int(task.get("episodes", 0)),
        )
        context = Context(domain=config.env, task=config.env, tags=(config.condition, config.representation))

        def policy_for(phase: str, sample_seed: int | None, temperature: float | None = None) -> Any:
            tagged = metered.with_tags(phase=phase)
            return make_policy(
                config.policy,
                llm=lambda role: tagged.with_tags(role=role),
                spec=env.spec,
                rule_guard=config.rule_guard,
                show_map=config.show_map,
                temperature=float(sampling.get("temperature", 0.0)) if temperature is None else temperature,
                seed=sample_seed,
            )

        episodes: list[dict[str, Any]] = []
        attempts: list[dict[str, Any]] = []
        ops: list[Op] = []

        def reflect_and_learn(traj: Any, policy: Any, episode_id: str, record: dict[str, Any], *, phase: str) -> tuple[int, bool] | None:
            """Reflect on ``traj`` if it failed and write what reflection says into memory (its
            ops into ``ops``, the reflection into ``record``); its failure point, else None."""
            point = failure_point(traj, spec=env.spec, reflect_on_stall=config.reflect_on_stall)
            if point is None:
                return None
            at, stalled = point
            if stalled:
                record["stalled_step"] = at
            reflection = reflect_on(
                traj, env=env, roles=policy.roles, acting_roles=policy.acting_roles, llm=metered.with_tags(phase=phase, role="reflector"),
                seed=seed, tau=tau, at=at, stalled=stalled,
                representation=config.representation, probe_alternatives=config.probe_alternatives,
                style=config.reflection,
            )
            applied = learn_from(
                memory, reflection, owner=agent, actor=agent, shown={r: rec.shown for r, rec in traj.recollections.items()},
                context=context, caps=Caps(rules=config.rule_cap, examples=config.example_cap),
                episodes=[episode_id], stage=stage, valid_actions=env.valid_actions(),
            )
            ops.extend(_added(memory, applied.added))
            ops.extend(Archive(u.id, why) for u, why in applied.removed)
            record["reflection"] = reflection.to_dict()
            record["memory_size"] = len(applied.units)
            return point
        used: list[str] = []
        base_seed = sampling.get("seed")
        if config.flags.learning:
            for attempt in range(config.attempts):
                policy = policy_for("train", None if base_seed is None else int(base_seed) + attempt)
                traj = play_episode(env, policy, recall, seed=seed, tau=tau, abort=True)
                recall.episodes += 1
                ep = _episode(traj, agent=agent, config=config, env=env, meta={"stage": stage, "attempt": attempt, "phase": "train", "seed": seed})
                episodes.append(ep.to_dict())
                for unit in retire_failing(memory, memory.record_use(traj.used, success=bool(ep.outcome["success"]), actor=agent), actor=agent):
                    ops.append(Archive(unit.id, "retired: kept failing"))
                used += traj.used
                record: dict[str, Any] = {
                    "attempt": attempt, "return": traj.total, "aborted": traj.aborted,
                    "failing_step": traj.failing, "steps": len(traj.actions), "episode": ep.id,
                    "shown": len(traj.used), "now": len(traj.now),
                }
                point = reflect_and_learn(traj, policy, ep.id, record, phase="train")
                attempts.append(record)
                if hook is not None:
                    hook("attempt_done", {"stage": stage, "instance": inst, **{k: v for k, v in record.items() if k != "reflection"}})
                if point is None:
                    break
        # Greedy, like the final evaluation: R_i must measure the memory, not a lucky sample
        # (a 1.5B instance at temperature 0.6 graduated on one lucky checkpoint and then failed
        # every greedy evaluation). Sampling is for the attempts, where exploring pays.
        policy = policy_for("checkpoint", None, temperature=0.0)
        traj = play_episode(env, policy, recall, seed=seed, tau=tau, abort=False)
        ep = _episode(traj, agent=agent, config=config, env=env, meta={"stage": stage, "phase": "checkpoint", "seed": seed})
        episodes.append(ep.to_dict())
        if config.flags.learning:
            memory.record_use(traj.used, success=bool(ep.outcome["success"]), actor=agent)
            used += traj.used
        ops += _counts(memory, used)
        checkpoint = {"return": traj.total, "episode": ep.id, "rules": traj.rule_record, **{k: ep.outcome[k] for k in ("success", "major_failure", "steps")}}
        if config.flags.learning and config.reflect_on_checkpoint:
            # after its return is taken, so R_i still measures the memory it was played with. On
            # TextWorld coin-1 a sampled attempt won, the greedy checkpoint paced between two
            # rooms to the step limit, and that failure, the one held-out games repeat, was
            # never reflected on: the instance graduated with an empty memory
            reflect_and_learn(traj, policy, ep.id, checkpoint, phase="checkpoint")
        return {
            "instance": inst,
            "stage": stage,
            "seed": seed,
            "sampling": sampling,
            "attempts": attempts,
            "episodes": episodes,
            "ops": [op.to_dict() for op in ops],
            "checkpoint": checkpoint,
            "tokens": ledger.to_dict(),
        }
    finally:
        memory.close()
        env.close()


def evaluate_instance(task: Mapping[str, Any], llm: LLM, hook: Hook | None = None) -> dict[str, Any]:
    """Final evaluation of one instance: frozen memory, greedy decoding, one episode per seed."""
    config = ForgeConfig.from_dict(task["config"])
    inst = int(task["instance"])
    env = build_env(config)
    memory = _task_memory(config, task)
    try:
        tau, _ = _thresholds(config, env)
        ledger = TokenLedger()
        metered = MeteredLLM(llm, ledger, condition=config.condition, stage="eval", instance=inst, phase="eval")
        policy = make_policy(config.policy, llm=lambda role: metered.with_tags(role=role), spec=env.spec, rule_guard=config.rule_guard, show_map=config.show_map)
        recall = Recaller(
            memory, Viewer.of(f"inst-{inst}"), budget=config.memory_tokens, weights=RUN_WEIGHTS, valid_actions=env.valid_actions, abstract=env.spec.abstract,
            exposure=config.exposure(inst), episodes=int(task.get("episodes", 0)),
        )
        episodes, results = [], []
        for n, seed in enumerate(task["seeds"]):
            traj = play_episode(env, policy, recall, seed=int(seed), tau=tau, abort=False)
            ep = _episode(traj, agent=f"inst-{inst}", config=config, env=env, meta={"phase": "eval", "episode": n, "seed": seed})
            episodes.append(ep.to_dict())
            results.append({"seed": seed, "episode": ep.id, "return": traj.total, "success": ep.outcome["success"], "major_failure": ep.outcome["major_failure"], "steps": len(traj.actions), "shown": len(traj.used), "now": len(traj.now), "rules": traj.rule_record})
            if hook is not None:
                hook("eval_episode_done", {"instance": inst, "episode": n, "return": traj.total})
        return {"instance": inst, "results": results, "episodes": episodes, "tokens": ledger.to_dict()}
    finally:
        memory.close()
        env.close()
