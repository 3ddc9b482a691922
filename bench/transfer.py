"""Does what agents learn transfer? Train on some maps or games, evaluate on ones never seen.

Every cell trains only on the env's training seeds and evaluates only on its held-out seeds
(``forge.envs.seed_split``; a run refuses the two overlapping), so a gain here is memory that
applies to new tasks, not memorisation of one map. For each env and condition it runs
``--run-seeds`` run seeds and prints mean ± spread (standard deviation over run seeds) of the
held-out success rate and return, tokens per success (every token of the run, training and
evaluation, over held-out successes), and from the recorded decisions how often a rule for
the situation was in front of the model (``shown``) and how often the action followed it
(``followed``, of those shown), and how many held-out episodes were distinct (greedy
instances that share a memory replay each other's episodes). Then FORGE's ratios with the issue's targets beside them:
success >= 1.5x zero-shot and above Reflexion, tokens per success <= 0.6x Reflexion.

    python bench/transfer.py --quick                      # the embedded 1.5B, small cells
    python bench/transfer.py --llm test --quick           # plumbing smoke run (a rule-obeying walker)
    python bench/transfer.py --envs frozenlake-random-4x4,textworld:coin-1 --run-seeds 0,1,2 --json
    python bench/transfer.py --llm openai:qwen2.5-7b-instruct --run-seeds 0,1,2
    python bench/transfer.py --merge a.json b.json        # one table from cells run apart

For scale (GiGPO, arXiv 2505.10978): Qwen2.5-1.5B-Instruct on ALFWorld's held-out games is
reported at 4.1% (prompting), 12.8% (ReAct) and 21.8% (Reflexion).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from forge.envs import seed_split
from forge.errors import ForgeError
from forge.protocols import ForgeConfig, evolve

ENVS = ["frozenlake-random-4x4", "frozenlake-random-5x5", "textworld:coin-1", "textworld:coin-2", "textworld:treasure-1", "textworld:treasure-2"]
QUICK_ENVS = ["frozenlake-random-4x4", "textworld:coin-1"]
CONDITIONS = [("zero-shot", "rules"), ("reflexion", "rules"), ("forge", "rules"), ("forge", "examples")]
TARGETS = {"success_vs_zero_shot": 1.5, "tokens_per_success_vs_reflexion": 0.6}


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    vals = [float(v) for v in values]
    return (statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0) if vals else (0.0, 0.0)


def decisions(run_dir: Path) -> dict[str, int]:
    """The held-out decisions of every instance: how many, with a rule shown, and followed;
    and how many of the held-out episodes were distinct (seed and actions). Instances that
    share a memory after a broadcast and decide greedily play the same episode on a seed, so
    a cell's episodes can be fewer independent samples than they look."""
    out = {"decisions": 0, "rule_shown": 0, "rule_followed": 0}
    played: set[tuple[object, tuple[object, ...]]] = set()
    for path in sorted((run_dir / "checkpoints" / "eval").glob("inst-*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        results = data.get("results", [])
        for r in results:
            for key in out:
                out[key] += int((r.get("rules") or {}).get(key, 0))
        for r, episode in zip(results, data.get("episodes", []), strict=False):
            played.add((r.get("seed"), tuple(step.get("action") for step in episode.get("steps", []))))
    return {**out, "distinct_episodes": len(played)}


def run_cell(env: str, condition: str, representation: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One (env, condition) cell over every run seed, held-out evaluation only."""
    train, held_out = seed_split(env, train=args.train_maps, held_out=args.eval_episodes)
    runs = []
    for seed in args.run_seeds:
        cfg = ForgeConfig(
            condition=condition, representation=representation, env=env, llm=args.llm,
            instances=args.instances, stages=args.stages, attempts=args.attempts, seed=seed,
            train_seeds=tuple(train), eval_seeds=tuple(held_out), max_steps=args.max_steps,
            workers=args.workers, rule_guard=args.rule_guard, graduate_after=args.graduate_after,
            graduate_first_try=args.graduate_first_try,
        )
        run_dir = root / f"{env.replace(':', '_')}-{condition}-{representation}-seed{seed}"
        started = time.perf_counter()
        final = evolve(cfg, run_dir, progress=True).final  # a panel on a terminal, else lines on stderr
        ev = final["evaluation"]
        successes = round(ev["success_rate"] * ev["episodes"])
        rec = decisions(run_dir)
        runs.append({
            "seed": seed, "success_rate": ev["success_rate"], "mean_return": ev["mean_return"],
            "successes": successes, "episodes": ev["episodes"], "tokens": final["tokens"]["total"]["total_tokens"],
            "graduated": final["graduated"], "fallback_rate": final["fallback_rate"], **rec,
            "seconds": round(time.perf_counter() - started, 1), "run_dir": str(run_dir),
        })
        if not args.json:
            r = runs[-1]
            print(
                f"  {env} {condition}/{representation} run seed {seed}: held-out success {r['success_rate']:.0%}, "
                f"return {r['mean_return']:+.2f}, rule shown {r['rule_shown']}/{r['decisions']} ({r['seconds']}s)",
                file=sys.stderr, flush=True,
            )
    return summarise(env, condition, representation, runs, train=len(train), held_out=len(held_out), instances=args.instances)


def summarise(env: str, condition: str, representation: str, runs: list[dict[str, Any]], *, train: int, held_out: int,
              instances: int | None = None) -> dict[str, Any]:
    succ, succ_sd = _mean_sd([r["success_rate"] for r in runs])
    ret, ret_sd = _mean_sd([r["mean_return"] for r in runs])
    wins = sum(r["successes"] for r in runs)
    tokens = sum(r["tokens"] for r in runs)
    decided = sum(r["decisions"] for r in runs)
    shown = sum(r["rule_shown"] for r in runs)
    return {
        "env": env, "condition": condition, "representation": representation, "instances": instances,
        "label": condition if condition == "zero-shot" else f"{condition}/{representation}",
        "train_seeds": train, "held_out_seeds": held_out, "run_seeds": [r["seed"] for r in runs],
        "success": succ, "success_sd": succ_sd, "return": ret, "return_sd": ret_sd,
        "tokens_per_success": tokens / wins if wins else None,
        "rule_shown_rate": shown / decided if decided else 0.0,
        "rule_followed_rate": sum(r["rule_followed"] for r in runs) / shown if shown else None,
        "episodes": sum(r["episodes"] for r in runs), "distinct_episodes": sum(r["distinct_episodes"] for r in runs),
        "runs": runs,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def compare(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """FORGE (rules) against zero-shot and Reflexion, per env, with the targets met or missed."""
    out = []
    for env in dict.fromkeys(c["env"] for c in cells):
        row = {c["label"]: c for c in cells if c["env"] == env}
        forge, zero, refl = row.get("forge/rules"), row.get("zero-shot"), row.get("reflexion/rules")
        if forge is None:
            continue
        vs_zero = _ratio(forge["success"], zero["success"]) if zero else None
        tps = _ratio(forge["tokens_per_success"], refl["tokens_per_success"]) if refl else None
        out.append({
            "env": env,
            "success_vs_zero_shot": vs_zero,
            "success_above_reflexion": (forge["success"] > refl["success"]) if refl else None,
            "tokens_per_success_vs_reflexion": tps,
            # None where the baseline did not run: no verdict, not a miss
            "meets": {
                "success_vs_zero_shot": None if zero is None else (forge["success"] > 0 and zero["success"] == 0) or (vs_zero is not None and vs_zero >= TARGETS["success_vs_zero_shot"]),
                "above_reflexion": None if refl is None else forge["success"] > refl["success"],
                "tokens_per_success": None if refl is None else tps is not None and tps <= TARGETS["tokens_per_success_vs_reflexion"],
            },
        })
    return out


# settings every merged result must share: a ratio between cells run differently means nothing
_MERGE_SAME = ("llm", "stages", "attempts", "eval_episodes", "graduate_after", "graduate_first_try", "rule_guard", "max_steps")
# a file written before a setting existed ran with its default, as report.differences reads old runs
_MERGE_DEFAULTS = {f.name: f.default for f in fields(ForgeConfig)}


def merge(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One result from several ``--json`` results (cells run in separate processes, so a long
    grid can run one env, condition or run seed at a time), with the ratios computed across
    them. The same cell's run seeds from different results join into one cell."""
    if not results:
        raise ValueError("nothing to merge")
    for r in results:
        if not isinstance(r, dict) or not isinstance(r.get("cells"), list) or not all(isinstance(c, dict) for c in r["cells"]):
            raise ValueError("not a bench/transfer.py --json result (an object with a list of cells)")
    first = results[0]
    for r in results[1:]:
        if diff := [k for k in _MERGE_SAME if r.get(k, _MERGE_DEFAULTS.get(k)) != first.get(k, _MERGE_DEFAULTS.get(k))]:
            raise ValueError(f"results differ in {', '.join(diff)}: their cells cannot share a table")
    joined: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        for c in r["cells"]:
            c = {**c, "instances": c.get("instances", r["instances"])}
            key = (c["env"], c["label"])
            if (had := joined.get(key)) is None:
                joined[key] = c
                continue
            # the same cell run one run seed at a time: its runs join, re-summarised
            if overlap := set(had["run_seeds"]) & set(c["run_seeds"]):
                raise ValueError(f"{c['env']} {c['label']} run seed {sorted(overlap)} is in two results")
            if (had["instances"], had["train_seeds"], had["held_out_seeds"]) != (c["instances"], c["train_seeds"], c["held_out_seeds"]):
                raise ValueError(f"{c['env']} {c['label']} was run with other instances or seeds in another result")
            joined[key] = summarise(c["env"], c["condition"], c["representation"], sorted([*had["runs"], *c["runs"]], key=lambda x: x["seed"]),
                                    train=c["train_seeds"], held_out=c["held_out_seeds"], instances=c["instances"])
    cells = list(joined.values())
    return {
        **{k: first.get(k, _MERGE_DEFAULTS.get(k)) for k in _MERGE_SAME}, "instances": sorted({c["instances"] for c in cells}),
        "run_seeds": sorted({s for c in cells for s in c["run_seeds"]}), "cells": cells,
        "ratios": compare(cells), "seconds": sum(r["seconds"] for r in results),
    }


def _pct(mean: float, sd: float) -> str:
    return f"{mean:.0%} ± {sd:.0%}"


def render(result: dict[str, Any]) -> str:
    n = result["instances"]
    lines = [
        f"Held-out transfer ({result['llm']}; N={'/'.join(map(str, n)) if isinstance(n, list) else n}, S={result['stages']}, k={result['attempts']}; "
        f"run seeds {result['run_seeds']}; {result['seconds']:.0f}s)",
        f"{'env':<24} {'condition':<17} {'held-out success':>17} {'return':>14} {'tok/success':>12} {'rule shown':>11} {'followed':>9} {'distinct':>9}",
    ]
    for c in result["cells"]:
        tps = f"{c['tokens_per_success']:,.0f}" if c["tokens_per_success"] is not None else "-"
        fol = f"{c['rule_followed_rate']:.0%}" if c["rule_followed_rate"] is not None else "-"
        lines.append(
            f"{c['env']:<24} {c['label']:<17} {_pct(c['success'], c['success_sd']):>17} "
            f"{c['return']:>+7.2f} ± {c['return_sd']:<4.2f} {tps:>12} {c['rule_shown_rate']:>11.0%} {fol:>9} {str(c['distinct_episodes']) + '/' + str(c['episodes']):>9}"
        )
    if result["ratios"]:
        lines.append("")
        lines.append(f"FORGE/rules vs baselines (targets: success >= {TARGETS['success_vs_zero_shot']}x zero-shot and above Reflexion; tokens/success <= {TARGETS['tokens_per_success_vs_reflexion']}x Reflexion)")
        for r in result["ratios"]:
            def x(v: float | None) -> str:
                return f"{v:.2f}x" if v is not None else "n/a"

            marks = " ".join(f"{k}={'not run' if v is None else 'met' if v else 'missed'}" for k, v in r["meets"].items())
            above = "not run" if r["success_above_reflexion"] is None else r["success_above_reflexion"]
            lines.append(f"  {r['env']:<24} success {x(r['success_vs_zero_shot'])} zero-shot, above Reflexion: {above}, tokens/success {x(r['tokens_per_success_vs_reflexion'])} Reflexion  [{marks}]")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llm", default="local", help="local (embedded 1.5B), local:smollm2, openai:MODEL or test")
    ap.add_argument("--envs", default=None, help=f"comma list (default: {','.join(ENVS)}; --quick: {','.join(QUICK_ENVS)})")
    ap.add_argument("--conditions", default=None, help="comma list of condition/representation, e.g. zero-shot,forge/rules")
    ap.add_argument("--run-seeds", default="0,1,2", help="run seeds (default 0,1,2)")
    ap.add_argument("--instances", "-n", type=int, default=3)
    ap.add_argument("--stages", "-s", type=int, default=3)
    ap.add_argument("--attempts", "-k", type=int, default=2)
    ap.add_argument("--train-maps", type=int, default=100, help="training seeds (maps or games) to draw from")
    ap.add_argument("--eval-episodes", type=int, default=10, help="held-out seeds each instance is evaluated on")
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--rule-guard", action="store_true")
    ap.add_argument("--graduate-first-try", action="store_true", help="count a checkpoint toward --graduate-after only when the stage's first attempt won")
    ap.add_argument("--graduate-after", type=int, default=1, help="checkpoints at or above theta an instance needs to graduate (1: the paper)")
    ap.add_argument("--quick", action="store_true", help="2 envs, N=2, S=2, k=2, 5 held-out seeds, run seeds 0,1")
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary directory)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                    help="render earlier --json results as one table (runs nothing)")
    args = ap.parse_args(argv)
    if args.merge:
        results = []
        for path in args.merge:
            try:
                results.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError) as exc:
                raise SystemExit(f"error: --merge: {path}: {exc}") from None
        try:
            merged = merge(results)
        except KeyError as exc:
            raise SystemExit(f"error: --merge: a result or cell lacks {exc}") from None
        except (ValueError, TypeError) as exc:
            raise SystemExit(f"error: --merge: {exc}") from None
        print(json.dumps(merged, indent=2) if args.json else render(merged))
        return
    if args.quick:
        args.instances, args.stages, args.attempts, args.eval_episodes = 2, 2, 2, 5
        if args.run_seeds == "0,1,2":
            args.run_seeds = "0,1"
    try:
        args.run_seeds = [int(s) for s in args.run_seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--run-seeds takes integers like 0,1,2, got {args.run_seeds!r}")
    envs = [e for e in (args.envs.split(",") if args.envs else (QUICK_ENVS if args.quick else ENVS)) if e]
    conditions = CONDITIONS
    if args.conditions:
        conditions = [tuple((c.split("/") + ["rules"])[:2]) for c in args.conditions.split(",") if c]  # type: ignore[misc]
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="forge-transfer-") as tmp:
            root = args.out or Path(tmp)
            cells = [run_cell(env, cond, rep, args, root) for env in envs for cond, rep in conditions]
    except ForgeError as exc:  # a bad env, condition or setting: one line, not a traceback
        raise SystemExit(f"error: {exc}") from None
    result = {
        "llm": args.llm, "instances": args.instances, "stages": args.stages, "attempts": args.attempts,
        "run_seeds": args.run_seeds, "eval_episodes": args.eval_episodes, "graduate_after": args.graduate_after, "graduate_first_try": args.graduate_first_try,
        "rule_guard": args.rule_guard, "cells": cells,
        "ratios": compare(cells), "seconds": time.perf_counter() - started,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render(result))


if __name__ == "__main__":
    main()
