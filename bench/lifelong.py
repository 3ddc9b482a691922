"""Lifelong team memory: does memory make a team better over a stream of tasks?

Per memory mode (none, raw, local, shared, hybrid) on the same stream, seed and model, through
the same runner (:func:`forge.team.runner.run_team`): AIP, final AP_t, mean TS and CS, tokens
per task, and AIP / final AP_t against the no-memory baseline; then the team-size sweep
(AIP and tokens per team size), written as the scaling report.

    python bench/lifelong.py --quick --llm test        # scripted model: seconds
    python bench/lifelong.py --quick                   # embedded default model: minutes on 2 cores
    python bench/lifelong.py --quick --llm local:smollm2   # the small smoke-test model
    python bench/lifelong.py --llm openai:gpt-4o-mini --tasks 30 --sizes 1,3,5,7
    python bench/lifelong.py --quick --json
    python bench/lifelong.py --stream textworld --tasks 20 --sizes 1,3,5    # 20 distinct held-out games
    python bench/lifelong.py --stream frozenlake --tasks 20                  # 20 held-out random maps
    python bench/lifelong.py --stream db --tasks 20                          # database diagnosis (a server)

Targets (issue "Learning that transfers"): the best memory mode's AIP >= 1.2x none, and its
tokens per task <= 0.9x none; a procedure that works should also shorten the episode.

Every memory mode's prompts are written by :func:`forge.learn.prompt.recollect` (the team's units,
as each agent's viewer). Figures, not assertions: with a small local model expect noise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from forge.errors import ForgeError
from forge.llm import open_llm
from forge.team.runner import (
    MEMORY_MODES,
    TeamConfig,
    load_results,
    resume_team,
    run_team,
    sweep,
    team_config,
)


def _ratio(a: float, b: float) -> float | None:
    return None if b == 0 else a / b


def _modes(text: str | None) -> tuple[str, ...]:
    """The memory modes to run, ``none`` first: every ratio is against it."""
    if not text:
        return MEMORY_MODES
    asked = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in asked if m not in MEMORY_MODES]
    if unknown:
        raise SystemExit(f"error: unknown memory mode {unknown[0]!r}; known: {', '.join(MEMORY_MODES)}")
    return ("none", *[m for m in MEMORY_MODES if m in asked and m != "none"])


def _run_mode(cfg: TeamConfig, run_dir: Path, llm: Any) -> Any:
    """One memory mode's run in ``run_dir``: kept there, so a rerun with the same ``--out``
    reuses a finished mode and resumes a stopped one (a TextWorld stream is hours on two
    cores); a run there with other settings is refused, never mixed into the table."""
    if run_dir.exists() and not run_dir.is_dir():
        raise SystemExit(f"error: {run_dir} is not a directory; pick another --out")
    if not (run_dir / "config.json").is_file():
        return run_team(cfg, run_dir, llm=llm)
    held = team_config(run_dir).to_dict()  # the runner's own reading: a damaged file is one line
    if held != cfg.to_dict():
        differ = sorted(k for k in {*held, *cfg.to_dict()} if held.get(k) != cfg.to_dict().get(k))
        raise SystemExit(f"error: {run_dir} holds a run with other settings ({', '.join(differ)}); pick another --out")
    print(f"  resuming {run_dir}", file=sys.stderr, flush=True)
    return resume_team(run_dir, llm=llm)


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out or tempfile.mkdtemp(prefix="forge-lifelong-"))
    quick = args.quick
    tasks = args.tasks or (4 if quick else 20)
    envs = tuple(args.envs.split(",")) if args.envs else (("frozenlake-4x4", "frozenlake-4x4-slippery") if quick and args.stream == "gym" else ())
    base = TeamConfig(
        stream=args.stream,
        tasks=tasks,
        team_size=args.team_size,
        consolidate_every=args.consolidate_every,
        llm=args.llm,
        seed=args.seed,
        envs=envs,
        max_steps=args.max_steps or (8 if quick else None),
        reflect=not (quick and args.llm.startswith("local")),  # quick local runs: the trajectory's own rules
        memory="none",
        rule_guard=args.rule_guard,
    )
    modes = _modes(args.modes)
    llm = open_llm(args.llm)
    try:
        rows = []
        for mode in modes:
            cfg = TeamConfig.from_dict({**base.to_dict(), "memory": mode})
            t0 = time.perf_counter()
            print(f"running memory={mode} ...", file=sys.stderr, flush=True)
            f = _run_mode(cfg, out / f"mode-{mode}", llm).final
            results = load_results(out / f"mode-{mode}")
            rows.append({
                "memory": mode, "aip": f["aip"], "ap": f["ap"], "ts": f["ts_mean"], "cs": f["cs_mean"],
                "success_rate": f["success_rate"], "tokens_per_task": f["tokens"]["per_task"],
                "steps_per_task": sum(r["steps"] for r in results) / max(1, len(results)),
                "rule_shown": sum((r.get("rules") or {}).get("rule_shown", 0) for r in results),
                "rule_followed": sum((r.get("rules") or {}).get("rule_followed", 0) for r in results),
                "decisions": sum((r.get("rules") or {}).get("decisions", 0) for r in results),
                "consolidation_tokens": f["tokens"]["consolidation"], "seconds": round(time.perf_counter() - t0, 1),
                # the tasks' own time, whole even when this call only resumed (or reused) the mode
                "task_seconds": round(sum(r.get("seconds", 0.0) for r in results), 3),
            })
        none = rows[0]
        for r in rows:
            r["aip_vs_none"] = _ratio(r["aip"], none["aip"])
            r["ap_vs_none"] = _ratio(r["ap"], none["ap"])
            r["tokens_vs_none"] = _ratio(r["tokens_per_task"], none["tokens_per_task"])
        sizes = [int(s) for s in args.sizes.split(",") if s] if args.sizes is not None else ([1, 3] if quick else [1, 3, 5, 7])
        summary: dict[str, Any] = {"runs": [], "paths": {}}
        if sizes:
            sweep_cfg = TeamConfig.from_dict({**base.to_dict(), "memory": args.sweep_memory, "tasks": args.sweep_tasks or (3 if quick else tasks)})
            print(f"running the team-size sweep {sizes} ...", file=sys.stderr, flush=True)
            summary = sweep(sweep_cfg, out / "sweep", sizes=sizes, llm=llm)
    finally:
        llm.close()
    return {
        "config": {**base.to_dict(), "memory": list(modes)},
        "modes": rows,
        "sweep": {
            "memory": args.sweep_memory,
            "sizes": [{"team_size": r["team_size"], "tasks": r["tasks"], "aip": r["aip"], "ap": r["ap"], "tokens_per_task": r["tokens_per_task"]} for r in summary["runs"]],
            "report": summary["paths"],
        },
        "out": str(out),
    }


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny stream and sweep (minutes on 2 cores with the local model)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--llm", default="local", help="local (embedded Qwen2.5-Coder-1.5B), local:smollm2, test (scripted, fast) or openai:MODEL")
    p.add_argument("--stream", default="gym", help="gym, db, textworld (distinct held-out games) or frozenlake (held-out random maps)")
    p.add_argument("--tasks", type=int, default=None)
    p.add_argument("--team-size", type=int, default=3)
    p.add_argument("--consolidate-every", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--envs", default=None, help="comma-separated gym ladder")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--modes", default=None, help="memory modes, e.g. local,shared,hybrid (none always runs first: the ratios are against it)")
    p.add_argument("--sizes", default=None, help="team sizes of the sweep, e.g. 1,3,5,7; an empty string skips the sweep")
    p.add_argument("--rule-guard", action="store_true", help="rules are binding: an actor chooses only among what they leave")
    p.add_argument("--sweep-tasks", type=int, default=None)
    p.add_argument("--sweep-memory", default="hybrid")
    p.add_argument("--out", default=None, help="directory for runs and the report (default: a temp dir); rerun with it to reuse finished modes and resume a stopped one")
    args = p.parse_args(argv)
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise SystemExit(f"error: --out {args.out} is not a directory")
    try:
        res = run_all(args)
    except ForgeError as exc:  # a damaged kept run, a bad setting: one line, not a traceback
        raise SystemExit(f"error: {exc}") from None
    if args.json:
        print(json.dumps(res, indent=2))
        return
    cols = ["memory", "aip", "ap", "success_rate", "steps_per_task", "tokens_per_task", "rule_shown", "rule_followed", "aip_vs_none", "tokens_vs_none", "seconds"]
    print("  ".join(f"{c:>14}" for c in cols))
    for r in res["modes"]:
        print("  ".join(f"{_fmt(r[c]):>14}" for c in cols))
    best = max(res["modes"][1:], key=lambda r: r["aip"], default=None)
    if best is not None:
        a, tk = best["aip_vs_none"], best["tokens_vs_none"]
        print(
            f"best memory mode {best['memory']}: AIP {_fmt(a)}x none (target >= 1.2: {'met' if a is not None and a >= 1.2 else 'missed'}), "
            f"tokens/task {_fmt(tk)}x none (target <= 0.9: {'met' if tk is not None and tk <= 0.9 else 'missed'})"
        )
    if res["sweep"]["sizes"]:
        print(f"\nteam-size sweep (memory={res['sweep']['memory']})")
    for r in res["sweep"]["sizes"]:
        print(f"  size {r['team_size']}: {r['tasks']} tasks, AIP {r['aip']:.3f}, final AP_t {r['ap']:.3f}, tokens/task {r['tokens_per_task']:,.0f}")
    if res["sweep"]["report"]:
        print(f"report: {res['sweep']['report']['html']}")


if __name__ == "__main__":
    main()
