"""What one worker does: play an instance's stage (attempts, reflection, checkpoint) or its
final evaluation, and report everything as plain JSON-ready data.

These functions never touch the run directory or the store: the parent process is the
single writer and applies what they return. Given the same task and a deterministic LLM they
return the same result, which is what makes ``resume`` equal an uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from forge.envs import Env, make_env
from forge.errors import ForgeError
from forge.llm.accounting import MeteredLLM, TokenLedger
from forge.llm.base import LLM
from forge.model import Episode, Step
from forge.policy import ANALYST_TOOLS, Policy, PromptMemory, make_policy
from forge.protocols.config import ForgeConfig
from forge.reflect import (
    Snapshot,
    apply_reflection,
    fallback_reflection,
    reflect,
    safe_alternatives,
    stall_step,
)

__all__ = ["Trajectory", "build_env", "evaluate_instance", "play", "play_stage"]

Hook = Callable[[str, Mapping[str, Any]], None]


def build_env(config: ForgeConfig) -> Env:
    kwargs = {"max_steps": config.max_steps} if config.max_steps else {}
    return make_env(config.env, **kwargs)


@dataclass(slots=True)
class Trajectory:
    """One episode as played: every role's steps, env rewards, and where it failed."""

    steps: list[Step] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)  # before each action
    rewards: list[float] = field(default_factory=list)
    failing: int | None = None  # env step index whose reward fell below tau (aborted there)
    done: bool = False

    @property
    def total(self) -> float:
        return float(sum(self.rewards))


def play(
    env: Env,
    policy: Policy,
    memory: PromptMemory,
    *,
    seed: int,
    tau: float,
    abort: bool,
    max_steps: int,
) -> Trajectory:
    """Play one episode from step 0 with ``seed``; with ``abort`` stop at the first reward < tau."""
    traj = Trajectory()
    obs = env.reset(seed=seed)
    for _ in range(max_steps):
        decision = policy.act(observation=obs, valid_actions=list(env.valid_actions()), history=traj.actions, memory=memory)
        result = env.step(decision.action)
        traj.observations.append(obs)
        traj.actions.append(decision.action)
        traj.rewards.append(float(result.reward))
        for s in decision.steps:
            if s.role in policy.acting_roles[:1]:
                s = Step(observation=s.observation, thought=s.thought, action=s.action, reward=float(result.reward), role=s.role, info={"t": len(traj.actions) - 1, "event": result.info.get("event", "")})
            else:
                s = Step(observation=s.observation, thought=s.thought, action=s.action, role=s.role, info={"t": len(traj.actions) - 1})
            traj.steps.append(s)
        obs = result.observation
        if result.reward < tau:
            traj.failing = len(traj.actions) - 1
            if abort:
                break
        if result.done:
            traj.done = True
            break
    return traj


def _episode(traj: Trajectory, *, agent: str, config: ForgeConfig, env: Env, meta: Mapping[str, Any]) -> Episode:
    spec = env.spec
    return Episode(
        agent=agent,
        task=config.env,
        env=config.env,
        steps=tuple(traj.steps),
        outcome={
            "return": traj.total,
            "success": traj.total >= spec.success_return,
            "major_failure": traj.total <= spec.major_failure_return,
            "aborted": traj.failing is not None and not traj.done,
            "failing_step": traj.failing,
            "steps": len(traj.actions),
        },
        meta=dict(meta),
    )


def _thresholds(config: ForgeConfig, env: Env) -> tuple[float, float]:
    tau = env.spec.tau if config.tau is None else config.tau
    theta = env.spec.theta if config.theta is None else config.theta
    return tau, theta


def play_stage(task: Mapping[str, Any], llm: LLM, hook: Hook | None = None) -> dict[str, Any]:
    """One instance's stage: up to k attempts with reflection on abort, then a frozen checkpoint.

    ``task`` holds ``config`` (dict), ``instance``, ``stage``, ``seed`` and ``memory`` (items).
    Returns attempts, episodes, memory ops, the new memory, the checkpoint and the tokens.
    """
    config = ForgeConfig.from_dict(task["config"])
    inst, stage, seed = int(task["instance"]), int(task["stage"]), int(task["seed"])
    memory = PromptMemory.from_list(task["memory"])
    env = build_env(config)
    try:
        tau, _ = _thresholds(config, env)
        ledger = TokenLedger()
        metered = MeteredLLM(llm, ledger, condition=config.condition, stage=stage, instance=inst)
        train = metered.with_tags(phase="train")
        policy = make_policy(
            config.policy,
            llm=lambda role: train.with_tags(role=role),
            spec=env.spec,
            memory_tokens=config.memory_tokens,
            rule_guard=config.rule_guard,
            show_map=config.show_map,
        )
        agent = f"inst-{inst}"
        episodes: list[dict[str, Any]] = []
        attempts: list[dict[str, Any]] = []
        ops: list[dict[str, Any]] = []
        max_steps = env.spec.max_steps
        if config.flags.learning:
            for attempt in range(config.attempts):
                traj = play(env, policy, memory, seed=seed, tau=tau, abort=True, max_steps=max_steps)
                ep = _episode(traj, agent=agent, config=config, env=env, meta={"stage": stage, "attempt": attempt, "phase": "train", "seed": seed})
                episodes.append(ep.to_dict())
                record: dict[str, Any] = {"attempt": attempt, "return": traj.total, "aborted": traj.failing is not None, "failing_step": traj.failing, "steps": len(traj.actions), "episode": ep.id}
                stalled = (
                    traj.failing is None
                    and config.reflect_on_stall
                    and bool(traj.actions)
                    and traj.total < env.spec.success_return
                )
                if stalled:
                    record["stalled_step"] = stall_step(traj.observations, traj.actions)
                if traj.failing is not None or stalled:
                    t = traj.failing if traj.failing is not None else record["stalled_step"]
                    safe: tuple[str, ...] = ()
                    if config.probe_alternatives:
                        safe = safe_alternatives(env, seed=seed, prefix=traj.actions[:t], failed=traj.actions[t], tau=tau, must_move=stalled)
                    snapshot = Snapshot.of(
                        traj, env=env, failing=t, roles=policy.roles, acting_roles=policy.acting_roles,
                        memory=memory, tau=tau, stalled=stalled, safe_actions=safe, known_names=ANALYST_TOOLS,
                    )
                    reflector = metered.with_tags(phase="train", role="reflector")
                    try:
                        reflection = reflect(reflector, snapshot, representation=config.representation)
                    except ForgeError as exc:  # anything the LLM layer raises: keep learning anyway
                        reflection = fallback_reflection(snapshot, representation=config.representation, error=str(exc))
                    applied = apply_reflection(memory, reflection, rule_cap=config.rule_cap, example_cap=config.example_cap, episodes=[ep.id], stage=stage)
                    memory = applied.memory
                    ops += [{"op": "add", "item": it.to_dict()} for it in applied.added]
                    ops += [{"op": "archive", "id": it.id, "reason": why} for it, why in applied.removed]
                    record["reflection"] = reflection.to_dict()
                    record["memory_size"] = len(memory)
                attempts.append(record)
                if hook is not None:
                    hook("attempt_done", {"stage": stage, "instance": inst, **{k: v for k, v in record.items() if k != "reflection"}})
                if traj.failing is None and not stalled:
                    break
        frozen = metered.with_tags(phase="checkpoint")
        policy = make_policy(config.policy, llm=lambda role: frozen.with_tags(role=role), spec=env.spec, memory_tokens=config.memory_tokens, rule_guard=config.rule_guard, show_map=config.show_map)
        traj = play(env, policy, memory, seed=seed, tau=tau, abort=False, max_steps=max_steps)
        ep = _episode(traj, agent=agent, config=config, env=env, meta={"stage": stage, "phase": "checkpoint", "seed": seed})
        episodes.append(ep.to_dict())
        checkpoint = {"return": traj.total, "episode": ep.id, **{k: ep.outcome[k] for k in ("success", "major_failure", "steps")}}
        return {
            "instance": inst,
            "stage": stage,
            "seed": seed,
            "attempts": attempts,
            "episodes": episodes,
            "ops": ops,
            "memory": memory.to_list(),
            "checkpoint": checkpoint,
            "tokens": ledger.to_dict(),
        }
    finally:
        env.close()


def evaluate_instance(task: Mapping[str, Any], llm: LLM, hook: Hook | None = None) -> dict[str, Any]:
    """Final evaluation of one instance: frozen memory, one episode per seed in ``seeds``."""
    config = ForgeConfig.from_dict(task["config"])
    inst = int(task["instance"])
    memory = PromptMemory.from_list(task["memory"])
    env = build_env(config)
    try:
        tau, _ = _thresholds(config, env)
        ledger = TokenLedger()
        metered = MeteredLLM(llm, ledger, condition=config.condition, stage="eval", instance=inst, phase="eval")
        policy = make_policy(config.policy, llm=lambda role: metered.with_tags(role=role), spec=env.spec, memory_tokens=config.memory_tokens, rule_guard=config.rule_guard, show_map=config.show_map)
        episodes, results = [], []
        for n, seed in enumerate(task["seeds"]):
            traj = play(env, policy, memory, seed=int(seed), tau=tau, abort=False, max_steps=env.spec.max_steps)
            ep = _episode(traj, agent=f"inst-{inst}", config=config, env=env, meta={"phase": "eval", "episode": n, "seed": seed})
            episodes.append(ep.to_dict())
            results.append({"seed": seed, "episode": ep.id, "return": traj.total, "success": ep.outcome["success"], "major_failure": ep.outcome["major_failure"], "steps": len(traj.actions)})
            if hook is not None:
                hook("eval_episode_done", {"instance": inst, "episode": n, "return": traj.total})
        return {"instance": inst, "results": results, "episodes": episodes, "tokens": ledger.to_dict()}
    finally:
        env.close()
