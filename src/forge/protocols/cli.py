"""``forge evolve`` and ``forge report``: thin commands over :func:`evolve`, :func:`resume` and
:func:`forge.report.build_report`. The lead attaches them to the top-level ``forge`` group.

Errors print one line (``error: ...``) and exit 2 for something the user can fix (unknown
env or condition, existing run dir), 1 for a backend failure.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from forge.errors import ForgeError, UserError
from forge.protocols.config import CONDITIONS, POLICIES, REPRESENTATIONS, ForgeConfig

__all__ = ["QUICK_DEMO", "evolve_command", "report_command"]

#: ``--quick-demo``: a FORGE run on the embedded model that finishes in minutes on 2 cores.
QUICK_DEMO: dict[str, Any] = {
    "condition": "forge",
    "env": "frozenlake-4x4",
    "instances": 2,
    "stages": 2,
    "attempts": 2,
    "eval_episodes": 1,
    "max_steps": 6,
    "representation": "rules",
}


def _fail(exc: ForgeError) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2 if isinstance(exc, UserError) else 1)


@click.command("evolve")
@click.option("--condition", default=None, help=f"One of: {', '.join(CONDITIONS)} (default forge).")
@click.option("--instances", "-n", type=int, default=None, help="Population size N (paper: 10).")
@click.option("--stages", "-s", type=int, default=None, help="Stages S (paper: 6).")
@click.option("--attempts", "-k", type=int, default=None, help="Attempts per instance and stage (paper: 3).")
@click.option("--tau", type=float, default=None, help="Abort threshold on one step's reward (default: the env's).")
@click.option("--theta", type=float, default=None, help="Graduation threshold on a checkpoint return (default: the env's).")
@click.option("--representation", default=None, help=f"One of: {', '.join(REPRESENTATIONS)}.")
@click.option("--env", default=None, help="Environment name, e.g. frozenlake-4x4 (see forge.envs.available_envs).")
@click.option("--llm", default=None, help="'local' (embedded SmolLM2), 'openai:MODEL', 'local:/path.gguf' or 'test'.")
@click.option("--embedder", default=None, help="Embedder of the run's store (default hash: fast, offline).")
@click.option("--seed", type=int, default=None, help="Run seed; stage, instance and eval seeds derive from it.")
@click.option("--workers", type=int, default=None, help="Worker processes playing instances in parallel.")
@click.option("--policy", default=None, help=f"Acting agent: {', '.join(POLICIES)}.")
@click.option("--eval-episodes", type=int, default=None, help="Final evaluation episodes per instance.")
@click.option("--max-steps", type=int, default=None, help="Cap on steps per episode (default: the env's).")
@click.option("--memory-tokens", type=int, default=None, help="Token budget of the memory shown in one prompt.")
@click.option("--rule-guard/--no-rule-guard", default=None, help="Enforce 'when X, then do not A' rules as hard exclusions (off: paper).")
@click.option("--run-dir", type=click.Path(path_type=Path), default=None, help="Where the run is written (default runs/<condition>-<time>).")
@click.option("--resume", "resume_dir", type=click.Path(path_type=Path), default=None, help="Continue the interrupted run in this directory.")
@click.option("--bus", "bus_url", default=None, help="Send the champion broadcast over this bus (memory:// or redis://HOST:PORT/DB); default: in-process copy.")
@click.option("--quick-demo", is_flag=True, help="A small FORGE run on the embedded model (minutes on 2 cores), then its report.")
@click.option("--report/--no-report", "with_report", default=None, help="Write the HTML/JSON report into RUN/report afterwards.")
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
def evolve_command(resume_dir: Path | None, run_dir: Path | None, quick_demo: bool, with_report: bool | None, as_json: bool, bus_url: str | None, **options: Any) -> None:
    """Run (or resume) a FORGE / Reflexion / zero-shot evolution experiment."""
    from forge.protocols.forge import evolve, resume

    started = time.perf_counter()
    bus = None
    try:
        delivery = None
        if bus_url is not None:
            from forge.bus import open_bus
            from forge.protocols.broadcast import BusDelivery

            bus = open_bus(bus_url)
            delivery = BusDelivery(bus)
        if resume_dir is not None:
            result = resume(resume_dir, progress=True, delivery=delivery)
            run_path = resume_dir
        else:
            settings: dict[str, Any] = dict(QUICK_DEMO) if quick_demo else {}
            settings.update({k: v for k, v in options.items() if v is not None})
            config = ForgeConfig(**settings)
            run_path = run_dir or Path("runs") / f"{config.condition}-{time.strftime('%Y%m%d-%H%M%S')}"
            result = evolve(config, run_path, progress=True, delivery=delivery)
        report_paths: dict[str, Any] = {}
        if with_report or (with_report is None and quick_demo):
            from forge.report import build_report

            report_paths = {k: str(v) for k, v in build_report([run_path], Path(run_path) / "report").items()}
    except ForgeError as exc:
        _fail(exc)
        return
    finally:
        if bus is not None:
            bus.close()
    ev = result.final["evaluation"]
    summary = {
        "run_dir": str(run_path),
        "condition": result.config.condition,
        "mean_return": ev["mean_return"],
        "success_rate": ev["success_rate"],
        "major_failure_rate": ev["major_failure_rate"],
        "graduated": result.final["graduated"],
        "training_tokens": result.tokens["training"]["total_tokens"],
        "evaluation_tokens": result.tokens["evaluation"]["total_tokens"],
        "seconds": round(time.perf_counter() - started, 1),
        "report": report_paths,
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(
        f"{summary['condition']}: mean return {summary['mean_return']:.3f}, success {summary['success_rate']:.0%}, "
        f"major failures {summary['major_failure_rate']:.0%}, graduated {summary['graduated']}, "
        f"tokens {summary['training_tokens']:,} train + {summary['evaluation_tokens']:,} eval, {summary['seconds']}s"
    )
    click.echo(f"run: {run_path}")
    if report_paths:
        click.echo(f"report: {report_paths.get('html')}")


@click.command("report")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="Directory for report.html, summary.json and memory.md.")
@click.option("--json", "as_json", is_flag=True, help="Print the written paths as JSON.")
def report_command(runs: tuple[Path, ...], out_dir: Path, as_json: bool) -> None:
    """Compare finished runs side by side: learning curves, returns, failures, tokens, memory."""
    from forge.report import build_report

    try:
        paths = build_report(list(runs), out_dir)
    except ForgeError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(json.dumps({k: str(v) for k, v in paths.items()}, indent=2))
    else:
        for name, path in paths.items():
            click.echo(f"{name}: {path}")
