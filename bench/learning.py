"""Does memory evolution help? Zero-shot vs Reflexion vs FORGE, on the same seeds and model.

Every condition runs through the same protocol code (``forge.protocols.evolve``); only the
condition's switches differ. For each environment and condition it runs ``--seeds`` run
seeds and prints mean ± standard deviation (over seeds) of the final-evaluation return and
success rate, the major-failure rate, the reflection fallback rate and tokens per success
(all tokens of the run, training and evaluation, divided by successful evaluation episodes),
then FORGE's ratios against zero-shot and Reflexion, with the paper's targets beside them.

    python bench/learning.py --quick                     # the embedded model; small cells
    python bench/learning.py --llm test --quick          # plumbing smoke run (a rule-obeying walker)
    python bench/learning.py --env frozenlake-4x4 --seeds 3 --json
    python bench/learning.py --llm openai:qwen2.5:7b-instruct --seeds 5

Environments by default: frozenlake-4x4, frozenlake-4x4-slippery, cliffwalking and the
TextArena Tower of Hanoi. Conditions: zero-shot, reflexion, forge (rules / examples / mixed)
and forge-no-graduation (rules). ``--seed-pack FILE`` adds the cold-start row: forge/rules
with the pack copied into every instance's memory first, beside forge/rules without it
(``bench/data/frozenlake_seeds.jsonl`` holds the holes of frozenlake-4x4).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from forge.protocols import ForgeConfig, evolve

ENVS = ["frozenlake-4x4", "frozenlake-4x4-slippery", "cliffwalking", "textarena:TowerOfHanoi-v0"]
CONDITIONS = [
    ("zero-shot", "rules"),
    ("reflexion", "rules"),
    ("forge", "rules"),
    ("forge", "examples"),
    ("forge", "mixed"),
    ("forge-no-graduation", "rules"),
]
TARGETS = {"success_vs_zero_shot": 1.7, "tokens_per_success_vs_reflexion": 0.6}


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    vals = [float(v) for v in values]
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def run_cell(env: str, condition: str, representation: str, seeds: Sequence[int], args: argparse.Namespace, root: Path, seed_pack: str = "") -> dict[str, Any]:
    """One (env, condition) cell over every seed; ``seed_pack`` makes it the cold-start row."""
    runs = []
    for seed in seeds:
        cfg = ForgeConfig(
            condition=condition, representation=representation, env=env, llm=args.llm,
            instances=args.instances, stages=args.stages, attempts=args.attempts,
            eval_episodes=args.eval_episodes, seed=seed,
            max_steps=None if env.startswith("textarena:") else args.max_steps,  # TextArena games set their own
            workers=args.workers, rule_guard=args.rule_guard, reflection=args.reflection, seed_pack=seed_pack,
        )
        run_dir = root / f"{env}-{condition}-{representation}{'-seeded' if seed_pack else ''}-seed{seed}"
        started = time.perf_counter()
        final = evolve(cfg, run_dir).final
        ev = final["evaluation"]
        tokens = final["tokens"]["total"]["total_tokens"]
        successes = round(ev["success_rate"] * ev["episodes"])
        runs.append({
            "seed": seed, "mean_return": ev["mean_return"], "success_rate": ev["success_rate"],
            "major_failure_rate": ev["major_failure_rate"], "successes": successes, "episodes": ev["episodes"],
            "reflections": final["reflections"], "fallback_rate": final["fallback_rate"], "tokens": tokens,
            "graduated": final["graduated"], "seconds": round(time.perf_counter() - started, 1), "run_dir": str(run_dir),
        })
        if not args.json:
            r = runs[-1]
            print(f"  {env} {condition}/{representation} seed {seed}: return {r['mean_return']:+.3f}, success {r['success_rate']:.0%} ({r['seconds']}s)", file=sys.stderr, flush=True)
    ret, ret_sd = _mean_sd([r["mean_return"] for r in runs])
    suc, suc_sd = _mean_sd([r["success_rate"] for r in runs])
    successes = sum(r["successes"] for r in runs)
    reflections = sum(r["reflections"] for r in runs)
    return {
        "env": env, "condition": condition, "representation": representation + ("+seed-pack" if seed_pack else ""), "seeds": list(seeds),
        "mean_return": ret, "return_sd": ret_sd, "success_rate": suc, "success_sd": suc_sd,
        "major_failure_rate": statistics.fmean(r["major_failure_rate"] for r in runs),
        "fallback_rate": (sum(r["fallback_rate"] * r["reflections"] for r in runs) / reflections) if reflections else None,
        "reflections": reflections,
        "tokens": sum(r["tokens"] for r in runs),
        "tokens_per_success": (sum(r["tokens"] for r in runs) / successes) if successes else None,
        "seconds": round(sum(r["seconds"] for r in runs), 1),
        "runs": runs,
    }


def success_ceiling(env_name: str, max_steps: int | None) -> float | None:
    """The best success rate any policy can reach in ``max_steps`` steps, for the grid worlds
    (value iteration over gymnasium's transition table); None where there is none.

    It says what a cell can show: slippery FrozenLake 4x4 in 10 steps allows 4.1% at best.
    """
    if env_name.startswith("textarena:"):
        return None
    from forge.envs import make_env

    env = make_env(env_name, **({"max_steps": max_steps} if max_steps else {}))
    table = getattr(env.unwrapped, "P", None)
    if table is None:
        return None
    horizon = env.spec.max_steps
    desc = getattr(env.unwrapped, "desc", None)
    n = len(table)
    goals = {s for s in range(n) if desc is not None and desc.reshape(-1)[s] == b"G"} if desc is not None else {n - 1}
    value = [0.0] * n
    for _ in range(horizon):
        value = [max(sum(p * (1.0 if s2 in goals else 0.0 if done else value[s2]) for p, s2, _r, done in table[s][a])
                     for a in table[s]) for s in range(n)]
    start = int(np.argmax(env.unwrapped.initial_state_distrib)) if hasattr(env.unwrapped, "initial_state_distrib") else 0
    return round(value[start], 4)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def compare(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """FORGE against the baselines per environment, and whether the paper's ordering held."""
    out = []
    for env in dict.fromkeys(c["env"] for c in cells):
        by = {(c["condition"], c["representation"]): c for c in cells if c["env"] == env}
        zero, refl = by.get(("zero-shot", "rules")), by.get(("reflexion", "rules"))
        for (cond, rep), f in by.items():
            if not cond.startswith("forge") or zero is None or refl is None:
                continue
            out.append({
                "env": env, "forge": f"{cond}/{rep}",
                "return_minus_zero_shot": round(f["mean_return"] - zero["mean_return"], 3),
                "return_minus_reflexion": round(f["mean_return"] - refl["mean_return"], 3),
                "success_vs_zero_shot": _ratio(f["success_rate"], zero["success_rate"]),
                "tokens_per_success_vs_reflexion": _ratio(f["tokens_per_success"], refl["tokens_per_success"]),
                "ordering_held": f["mean_return"] > refl["mean_return"] > zero["mean_return"],
            })
    return out


def _pm(mean: float, sd: float, pct: bool = False) -> str:
    return f"{mean:.0%}±{sd:.0%}" if pct else f"{mean:+.2f}±{sd:.2f}"


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small populations and short episodes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--llm", default="local")
    p.add_argument("--env", action="append", help=f"repeatable; default: {', '.join(ENVS)}")
    p.add_argument("--condition", action="append", help="repeatable 'condition/representation'; default: all six")
    p.add_argument("--seeds", type=int, default=3, help="run seeds per cell (default 3)")
    p.add_argument("--instances", "-n", type=int)
    p.add_argument("--stages", "-s", type=int)
    p.add_argument("--attempts", "-k", type=int)
    p.add_argument("--eval-episodes", type=int)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--rule-guard", action="store_true", help="enforce 'do not' rules as hard exclusions (and choose among the actions they name as safe)")
    p.add_argument("--reflection", default="slots", choices=["slots", "free"], help="how rules are reflected (default slots)")
    p.add_argument("--out", help="keep the run directories here (default: a temp dir)")
    p.add_argument("--save", help="also write the JSON result to this file (the table still prints)")
    p.add_argument("--seed-pack", help="add the cold-start row: forge/rules with this JSONL seed pack")
    args = p.parse_args(argv)
    quick = {"instances": 3, "stages": 2, "attempts": 2, "eval_episodes": 2, "max_steps": 10}
    full = {"instances": 3, "stages": 3, "attempts": 2, "eval_episodes": 3, "max_steps": None}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    envs = args.env or ENVS
    conditions = [tuple(c.split("/", 1)) if "/" in c else (c, "rules") for c in args.condition] if args.condition else CONDITIONS
    root = Path(args.out or tempfile.mkdtemp(prefix="forge-learning-"))
    started = time.perf_counter()
    cells = [run_cell(env, cond, rep, list(range(args.seeds)), args, root) for env in envs for cond, rep in conditions]
    if args.seed_pack:
        cells += [run_cell(env, "forge", "rules", list(range(args.seeds)), args, root, seed_pack=args.seed_pack) for env in envs]
    ceilings = {env: success_ceiling(env, args.max_steps) for env in envs}
    result = {"settings": vars(args), "cells": cells, "comparison": compare(cells), "targets": TARGETS, "success_ceiling": ceilings,
              "seconds": round(time.perf_counter() - started, 1), "out": str(root)}
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"\nllm={args.llm} seeds={args.seeds} N={args.instances} S={args.stages} k={args.attempts} eval={args.eval_episodes} max_steps={args.max_steps}")
    print(f"{'env':<28}{'condition':<28}{'return':>12}{'success':>11}{'major':>7}{'fallback':>9}{'tok/success':>12}{'sec':>8}")
    for c in cells:
        fb = "-" if c["fallback_rate"] is None else f"{c['fallback_rate']:.0%}"
        tps = "-" if c["tokens_per_success"] is None else f"{c['tokens_per_success']:,.0f}"
        print(f"{c['env']:<28}{c['condition'] + '/' + c['representation']:<28}{_pm(c['mean_return'], c['return_sd']):>12}"
              f"{_pm(c['success_rate'], c['success_sd'], True):>11}{c['major_failure_rate']:>7.0%}{fb:>9}{tps:>12}{c['seconds']:>8}")
    for env, top in ceilings.items():
        if top is not None:
            print(f"success ceiling, {env} in {args.max_steps or 'its default'} steps (the best any policy can do): {top:.1%}")
    print(f"\nFORGE against the baselines (targets: success >= {TARGETS['success_vs_zero_shot']}x zero-shot, tokens/success <= {TARGETS['tokens_per_success_vs_reflexion']}x Reflexion):")
    for q in result["comparison"]:
        print(f"  {q['env']:<28}{q['forge']:<28} return {q['return_minus_zero_shot']:+.2f} vs zero-shot, {q['return_minus_reflexion']:+.2f} vs reflexion; "
              f"success {_x(q['success_vs_zero_shot'])} zero-shot; tok/success {_x(q['tokens_per_success_vs_reflexion'])} reflexion; "
              f"FORGE > Reflexion > zero-shot: {'yes' if q['ordering_held'] else 'no'}")
    print(f"\nruns: {root} ({result['seconds']}s)")


if __name__ == "__main__":
    from forge.errors import ForgeError

    try:
        main()
    except ForgeError as exc:  # e.g. --out already holds a run of that name: one line, no traceback
        sys.exit(f"error: {exc}")
