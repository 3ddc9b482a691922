"""How long does README's demo take? ``forge evolve --quick-demo`` over several seeds, each in a
fresh process as a user runs it, with the work it did and the ceiling on that work beside it.

    python bench/demo_time.py                          # the embedded 1.5B, seeds 0-4
    python bench/demo_time.py --llm test --seeds 0,1   # plumbing, in seconds
    python bench/demo_time.py --json

For each seed: wall seconds, decisions (env steps: training and evaluation, both conditions),
reflections, and the prompt tokens the model read. Then p50 and p90 of the wall time (nearest
rank), and the machine's prompt tokens/s (a fresh ~300-token prefix evaluated by the same
model, bench/llm_speed.py's figure), so a reader can scale the figure to their own machine:
a decision costs its new prompt tokens (``bench/llm_speed.py --only tokens``) over that rate.

The ceiling is the quick demo's, whatever the trajectories do: training's caps
(``train_decisions``, ``train_reflections``, see forge.protocols.config) plus the evaluation's
worst case (every held-out episode to the step limit) and zero-shot's checkpoints.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from forge.protocols.cli import QUICK_DEMO, QUICK_DEMO_HELD_OUT, QUICK_DEMO_ZERO_SHOT_INSTANCES


def ceiling() -> dict[str, int]:
    """The most decisions and reflections the quick demo can make (both conditions)."""
    steps, stages = QUICK_DEMO["max_steps"], QUICK_DEMO["stages"]
    forge_eval = QUICK_DEMO["instances"] * QUICK_DEMO_HELD_OUT * steps
    zero = QUICK_DEMO_ZERO_SHOT_INSTANCES * (stages + QUICK_DEMO_HELD_OUT) * steps  # a checkpoint per stage, then evaluation
    return {"decisions": QUICK_DEMO["train_decisions"] + forge_eval + zero, "reflections": QUICK_DEMO["train_reflections"]}


def work(run_dir: Path) -> dict[str, int]:
    """Decisions, reflections and prompt tokens of one finished quick demo."""
    out = {"decisions": 0, "reflections": 0, "prompt_tokens": 0, "stages_played": 0}
    for condition in ("zero-shot", "forge"):
        final = json.loads((run_dir / condition / "final.json").read_text(encoding="utf-8"))
        out["decisions"] += sum(int(s.get("decisions", 0)) for s in final["stages"])
        out["reflections"] += sum(int(s.get("reflections", 0)) for s in final["stages"])
        for path in sorted((run_dir / condition).rglob("eval/inst-*.json")):  # the held-out episodes
            out["decisions"] += sum(int(r.get("steps", 0)) for r in json.loads(path.read_text(encoding="utf-8"))["results"])
        out["prompt_tokens"] += int(final["tokens"]["total"]["prompt_tokens"])
        if condition == "forge":
            out["stages_played"] = len(final["stages"])
    return out


def prompt_rate(llm: str) -> float | None:
    """Prompt tokens/s of ``llm`` on this machine now: a fresh ~300-token prefix (median of 2)."""
    if not llm.startswith("local"):
        return None
    sys.path.insert(0, str(Path(__file__).parent))
    from forge.llm import open_llm
    from llm_speed import prefix_latency

    model = open_llm(llm)
    try:
        fresh = prefix_latency(model, 2, 300, "score")["fresh"]
    finally:
        model.close()
    return round(fresh["evaluated_tokens"] / (fresh["wall_ms"] / 1000), 1)


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of them at or below it."""
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q * len(ranked)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4", help="demo seeds (default 0-4)")
    parser.add_argument("--llm", default="local", help="the demo's model (default local: the embedded 1.5B)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    rate = prompt_rate(args.llm)
    load = [round(x, 2) for x in os.getloadavg()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="forge-demo-time-") as tmp:
        for seed in seeds:
            run_dir = Path(tmp) / f"seed{seed}"
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "forge.cli", "evolve", "--quick-demo", "--llm", args.llm, "--seed", str(seed),
                                   "--run-dir", str(run_dir), "--json"], capture_output=True, text=True)
            wall = time.perf_counter() - started
            if done.returncode != 0:
                raise SystemExit(f"seed {seed}: the demo failed:\n{done.stderr[-2000:]}")
            summary = json.loads(done.stdout)
            verdict = json.loads((run_dir / "report" / "summary.json").read_text(encoding="utf-8"))["verdict"]
            rows.append({"seed": seed, "wall_s": round(wall, 1), **work(run_dir), "verdict": verdict,
                         "success": {r["condition"]: r["success_rate"] for r in summary["runs"]}})
            if not args.json:
                print(f"seed {seed}: {wall:.0f} s, {rows[-1]['decisions']} decisions, {rows[-1]['reflections']} reflections", file=sys.stderr, flush=True)
    walls = [r["wall_s"] for r in rows]
    result = {
        "llm": args.llm, "prompt_tokens_per_s": rate, "load_avg_before": load, "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(), "ceiling": ceiling(), "runs": rows,
        "wall_p50_s": percentile(walls, 0.5), "wall_p90_s": percentile(walls, 0.9), "wall_max_s": max(walls),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"quick demo with {args.llm} over seeds {args.seeds}: wall p50 {result['wall_p50_s']} s, p90 {result['wall_p90_s']} s, max {result['wall_max_s']} s")
    print(f"work per demo: {min(r['decisions'] for r in rows)}-{max(r['decisions'] for r in rows)} decisions, "
          f"{min(r['reflections'] for r in rows)}-{max(r['reflections'] for r in rows)} reflections; "
          f"ceiling {result['ceiling']['decisions']} decisions, {result['ceiling']['reflections']} reflections")
    print(f"machine: {result['cpus']} CPUs, load average {load} before, {result['load_avg_after']} after; "
          f"prompt tokens/s: {rate if rate is not None else '- (not a local model)'}")


if __name__ == "__main__":
    main()
