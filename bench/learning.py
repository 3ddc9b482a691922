"""Does memory evolution help? Zero-shot vs Reflexion vs FORGE (rules, examples, mixed).

Every condition runs on the same environments, seeds and model, through the same protocol
code (``forge.protocols.evolve``); only the condition's switches differ. Prints, per
condition, the mean final-evaluation return, success rate, major-failure rate and tokens,
then the ratios FORGE / zero-shot and FORGE / Reflexion.

    python bench/learning.py --quick            # embedded SmolLM2, minutes on 2 cores
    python bench/learning.py --llm openai:gpt-4o-mini --env frozenlake-4x4-slippery
    python bench/learning.py --quick --json

Ratios of mean returns are only meaningful when the baseline's mean is not near zero; they
are printed as "n/a" when it is exactly zero.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from forge.protocols import ForgeConfig, evolve
from forge.report import build_report

CONDITIONS = [
    ("zero-shot", "rules"),
    ("reflexion", "rules"),
    ("forge", "rules"),
    ("forge", "examples"),
    ("forge", "mixed"),
]


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    out_root = Path(args.out or tempfile.mkdtemp(prefix="forge-learning-"))
    rows = []
    for env in args.env:
        for condition, representation in CONDITIONS:
            cfg = ForgeConfig(
                condition=condition,
                representation=representation,
                env=env,
                llm=args.llm,
                instances=args.instances,
                stages=args.stages,
                attempts=args.attempts,
                eval_episodes=args.eval_episodes,
                max_steps=args.max_steps,
                seed=args.seed,
                workers=args.workers,
                rule_guard=args.rule_guard,
            )
            run_dir = out_root / f"{env}-{condition}-{representation}"
            started = time.perf_counter()
            result = evolve(cfg, run_dir)
            ev = result.final["evaluation"]
            rows.append(
                {
                    "env": env,
                    "condition": condition,
                    "representation": representation,
                    "mean_return": ev["mean_return"],
                    "success_rate": ev["success_rate"],
                    "major_failure_rate": ev["major_failure_rate"],
                    "graduated": result.final["graduated"],
                    "fallback_rate": result.final["fallback_rate"],
                    "training_tokens": result.tokens["training"]["total_tokens"],
                    "evaluation_tokens": result.tokens["evaluation"]["total_tokens"],
                    "seconds": round(time.perf_counter() - started, 1),
                    "run_dir": str(run_dir),
                }
            )
            if not args.json:
                r = rows[-1]
                print(f"  done {env} {condition}/{representation}: return {r['mean_return']:+.3f} in {r['seconds']}s", file=sys.stderr)
    report = build_report([r["run_dir"] for r in rows], out_root / "report")
    return {"settings": vars(args), "rows": rows, "ratios": ratios(rows), "report": str(report["html"])}


def _ratio(a: float, b: float) -> float | None:
    return None if b == 0 else round(a / b, 3)


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for env in dict.fromkeys(r["env"] for r in rows):
        by = {(r["condition"], r["representation"]): r for r in rows if r["env"] == env}
        zero, refl = by[("zero-shot", "rules")], by[("reflexion", "rules")]
        for rep in ("rules", "examples", "mixed"):
            f = by[("forge", rep)]
            out.append(
                {
                    "env": env,
                    "forge": rep,
                    "return_vs_zero_shot": _ratio(f["mean_return"], zero["mean_return"]),
                    "return_vs_reflexion": _ratio(f["mean_return"], refl["mean_return"]),
                    "return_minus_zero_shot": round(f["mean_return"] - zero["mean_return"], 3),
                    "return_minus_reflexion": round(f["mean_return"] - refl["mean_return"], 3),
                    "tokens_vs_reflexion": _ratio(f["training_tokens"], refl["training_tokens"]),
                }
            )
    return out


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small population and short episodes: minutes on 2 cores")
    p.add_argument("--json", action="store_true")
    p.add_argument("--llm", default="local")
    p.add_argument("--env", action="append", help="repeatable; default frozenlake-4x4")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--instances", "-n", type=int)
    p.add_argument("--stages", "-s", type=int)
    p.add_argument("--attempts", "-k", type=int)
    p.add_argument("--eval-episodes", type=int)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--rule-guard", action="store_true", help="enforce 'do not' rules as hard exclusions")
    p.add_argument("--out", help="keep the run directories here (default: a temp dir)")
    args = p.parse_args(argv)
    quick = {"instances": 2, "stages": 1, "attempts": 1, "eval_episodes": 1, "max_steps": 5}
    full = {"instances": 4, "stages": 3, "attempts": 2, "eval_episodes": 3, "max_steps": None}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.env = args.env or ["frozenlake-4x4"]
    result = run_all(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    s = result["settings"]
    print(f"\nllm={s['llm']} seed={s['seed']} N={s['instances']} S={s['stages']} k={s['attempts']} eval={s['eval_episodes']} max_steps={s['max_steps']}")
    print(f"{'env':<24}{'condition':<22}{'return':>8}{'success':>9}{'major':>7}{'grad':>6}{'fallback':>9}{'train tok':>11}{'eval tok':>10}{'sec':>7}")
    for r in result["rows"]:
        print(
            f"{r['env']:<24}{r['condition'] + '/' + r['representation']:<22}{r['mean_return']:>+8.3f}{r['success_rate']:>9.0%}"
            f"{r['major_failure_rate']:>7.0%}{r['graduated']:>6}{r['fallback_rate']:>9.0%}{r['training_tokens']:>11,}{r['evaluation_tokens']:>10,}{r['seconds']:>7}"
        )
    print("\nratios of mean final return (n/a: baseline mean is 0) and differences:")
    for q in result["ratios"]:
        print(
            f"  {q['env']} forge/{q['forge']}: vs zero-shot {_fmt(q['return_vs_zero_shot'])} ({q['return_minus_zero_shot']:+.3f}), "
            f"vs reflexion {_fmt(q['return_vs_reflexion'])} ({q['return_minus_reflexion']:+.3f}), training tokens vs reflexion {_fmt(q['tokens_vs_reflexion'])}"
        )
    print(f"\nreport: {result['report']}")


if __name__ == "__main__":
    main()
