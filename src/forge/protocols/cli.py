"""``forge evolve`` and ``forge report``: thin commands over :func:`evolve`, :func:`resume` and
:func:`forge.protocols.report.build_report`. The lead attaches them to the top-level ``forge`` group.

Errors print one line (``error: ...``) and exit 2 for something the user can fix (unknown
env or condition, existing run dir), 1 for a backend failure.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from forge.errors import ConfigError, ForgeError, UserError
from forge.protocols.config import CONDITIONS, POLICIES, REPRESENTATIONS, ForgeConfig

__all__ = ["QUICK_DEMO", "evolve_command", "report_command"]

#: ``--quick-demo``: zero-shot and FORGE on the embedded model, trained on random FrozenLake
#: maps and evaluated on held-out maps no instance trained on, one comparison report; minutes
#: on 2 cores.
QUICK_DEMO: dict[str, Any] = {
    "env": "frozenlake-random-4x4",
    "instances": 2,
    "stages": 3,
    "attempts": 2,
    "max_steps": 10,
    "representation": "rules",
    # A ceiling on training's work, whatever greedy trajectories do (a run that keeps losing
    # reflects after every attempt): FORGE's 2 instances x 3 stages x (2 attempts + a
    # checkpoint) could cost 180 decisions and 18 reflections; the ceilings keep two stages
    # always and a third only where the first two left room for its worst case.
    "train_decisions": 120,
    "train_reflections": 12,
}
QUICK_DEMO_HELD_OUT = 4  # held-out maps each instance is evaluated on
QUICK_DEMO_CONDITIONS = ("zero-shot", "forge")
#: Zero-shot's instances in the demo: with no memory and greedy evaluation, a second instance
#: replays the first one's held-out episodes move for move (at ae24b15 both returned -1, -1,
#: +1, -1 on the four maps), so it doubled zero-shot's 2 minutes for the same figure.
QUICK_DEMO_ZERO_SHOT_INSTANCES = 1


def _instances(text: str, n: int) -> tuple[int, ...]:
    """``--isolate 0,2`` or ``--isolate all`` as instance indices (ForgeConfig checks the range)."""
    if text.strip().lower() == "all":
        return tuple(range(n))
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ConfigError(f"--isolate takes instance indices like 0,2 or 'all', got {text!r}") from None


def _demo_instances(settings: dict[str, Any], condition: str, quick_demo: bool, options: Mapping[str, Any]) -> dict[str, Any]:
    """The quick demo's zero-shot plays :data:`QUICK_DEMO_ZERO_SHOT_INSTANCES` instances
    unless ``--instances`` was given; every other run plays what its settings say."""
    if quick_demo and condition == "zero-shot" and options.get("instances") is None:
        return {**settings, "instances": QUICK_DEMO_ZERO_SHOT_INSTANCES}
    return settings


def _seeds(text: str, flag: str) -> tuple[int, ...]:
    """``--eval-seeds 10000-10009`` or ``--train-seeds 0,3,7`` as seeds (ranges inclusive)."""
    out: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            lo, dash, hi = part.partition("-")
            out += range(int(lo), int(hi) + 1) if dash else [int(lo)]
    except ValueError:
        raise ConfigError(f"{flag} takes seeds like 0-99 or 3,7,11, got {text!r}") from None
    if not out:
        raise ConfigError(f"{flag} names no seeds: {text!r}")
    return tuple(out)


def _held_out_split(settings: dict[str, Any]) -> dict[str, Any]:
    """The quick demo's seeds: training maps, and held-out maps no instance trains on; and a
    stand-in that obeys its rules for ``--llm test`` (the plain scripted model only says "left")."""
    from forge.envs import seed_split

    out: dict[str, Any] = {}
    if settings.get("llm") == "test":
        out["llm"] = "test:walker"
    if "train_seeds" not in settings and "eval_seeds" not in settings:
        try:
            train, held = seed_split(settings["env"], held_out=settings.get("eval_episodes") or QUICK_DEMO_HELD_OUT)
        except ConfigError:
            return out  # an env with one task: evaluated on derived seeds, and the report says so
        out.update(train_seeds=",".join(map(str, train)), eval_seeds=",".join(map(str, held)))
    return out


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
@click.option("--llm", default=None, help="'local' (embedded Qwen2.5-Coder-1.5B), 'local:smollm2', 'local:/path.gguf', 'openai:MODEL' or 'test'.")
@click.option("--embedder", default=None, help="Embedder of the run's store (default hash: fast, offline).")
@click.option("--seed", type=int, default=None, help="Run seed; stage, instance and eval seeds derive from it.")
@click.option("--workers", type=int, default=None, help="Worker processes playing instances in parallel.")
@click.option("--executor", default="process", show_default=True, help="Where instances are played: process, ray (a local Ray with --workers CPUs) or ray://HOST:PORT.")
@click.option("--policy", default=None, help=f"Acting agent: {', '.join(POLICIES)}.")
@click.option("--eval-episodes", type=int, default=None, help="Final evaluation episodes per instance.")
@click.option("--max-steps", type=int, default=None, help="Cap on steps per episode (default: the env's).")
@click.option("--memory-tokens", type=int, default=None, help="Token budget of the memory shown in one prompt.")
@click.option("--diversity", type=float, default=None, help="Sampling temperature spread across instances (instance 0 is greedy; default 0.6).")
@click.option("--reflection", default=None, help="How rules are reflected: slots (the model fills in the failing situation's rule; default) or free (free-text edits, the paper's way).")
@click.option("--rule-guard/--no-rule-guard", default=None, help="Enforce 'when X, then do not A' rules as hard exclusions, choosing among the actions they name as safe (off: paper).")
@click.option("--graduate-after", type=int, default=None, help="Checkpoints at or above theta an instance needs to graduate (default 1: the paper's rule).")
@click.option("--graduate-first-try/--no-graduate-first-try", default=None, help="Count a checkpoint toward --graduate-after only when the stage's first attempt won (off: the paper's count).")
@click.option("--warmup-episodes", type=int, default=None, help="Warm-up: received memory stays out of an instance's prompts until it has played this many episodes (default 0).")
@click.option("--warmup-validation", type=float, default=None, help="Warm-up: then show received units only if validated at least this well (0-1; default 0).")
@click.option("--ramp-episodes", type=int, default=None, help="Gradual enablement: prompt sections shown grow from one to all over this many episodes (default 0: all).")
@click.option("--seed-pack", default=None, help="Cold start: copy this JSONL seed pack into every instance's memory first (source seed, validation 0.3).")
@click.option("--train-seeds", default=None, help="Seeds training episodes are drawn from, e.g. 0-99 (maps or games; default: derived from --seed).")
@click.option("--eval-seeds", default=None, help="Held-out seeds the final evaluation plays, e.g. 10000-10009; must not overlap --train-seeds.")
@click.option("--train-decisions", type=int, default=None, help="Ceiling on training's decisions (env steps); a stage starts only if its worst case fits (default 0: none; the quick demo 120).")
@click.option("--train-reflections", type=int, default=None, help="Ceiling on training's reflections, kept the same way (default 0: none; the quick demo 12).")
@click.option("--isolate", "isolated", default=None, help="Instances cut off from all but their own memory, e.g. 0,2 or all (an ablation; default none).")
@click.option("--run-dir", type=click.Path(path_type=Path), default=None, help="Where the run is written (default runs/<condition>-<time>).")
@click.option("--resume", "resume_dir", type=click.Path(path_type=Path), default=None, help="Continue the interrupted run in this directory.")
@click.option("--bus", "bus_url", default=None, help="Send the champion broadcast over this bus (memory:// or redis://HOST:PORT/DB); default: in-process copy.")
@click.option("--quick-demo", is_flag=True, help="Zero-shot and FORGE on the embedded model with the same seeds (minutes on 2 cores), then one comparison report.")
@click.option("--report/--no-report", "with_report", default=None, help="Write the HTML/JSON report into RUN/report afterwards.")
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
def evolve_command(resume_dir: Path | None, run_dir: Path | None, quick_demo: bool, with_report: bool | None, as_json: bool, bus_url: str | None, executor: str, **options: Any) -> None:
    """Run (or resume) a FORGE / Reflexion / zero-shot evolution experiment."""
    from forge.protocols.forge import evolve, resume

    started = time.perf_counter()
    bus = None
    try:
        delivery = None
        if bus_url is not None:
            from forge.protocols.broadcast import BusDelivery
            from forge.share.bus import open_bus

            bus = open_bus(bus_url)
            delivery = BusDelivery(bus)
        runs: list[tuple[Path, Any]] = []
        if resume_dir is not None:
            runs.append((resume_dir, resume(resume_dir, progress=True, delivery=delivery, executor=executor)))
            run_path = resume_dir
            report_root = resume_dir
        else:
            settings: dict[str, Any] = dict(QUICK_DEMO) if quick_demo else {}
            settings.update({k: v for k, v in options.items() if v is not None})
            if quick_demo:
                settings.update(_held_out_split(settings))
            for flag in ("train_seeds", "eval_seeds"):
                if flag in settings:
                    settings[flag] = _seeds(settings[flag], "--" + flag.replace("_", "-"))
            if "isolated" in settings:
                settings["isolated"] = _instances(settings["isolated"], settings.get("instances", ForgeConfig.__dataclass_fields__["instances"].default))
            conditions = [settings.pop("condition", "forge")] if "condition" in settings or not quick_demo else list(QUICK_DEMO_CONDITIONS)
            configs = [ForgeConfig(**_demo_instances(settings, c, quick_demo, options), condition=c) for c in conditions]  # all validated before any runs
            stamp = time.strftime('%Y%m%d-%H%M%S')
            if len(configs) == 1:
                report_root = run_dir or Path("runs") / f"{configs[0].condition}-{stamp}"
                paths = [report_root]
            else:
                report_root = run_dir or Path("runs") / f"quick-demo-{stamp}"
                paths = [report_root / c.condition for c in configs]
            for config, path in zip(configs, paths, strict=True):
                if len(configs) > 1 and not as_json:
                    click.echo(f"== {config.condition} on {config.env} with {config.llm} ({config.instances} instances, {config.stages} stages) ==", err=True)
                runs.append((path, evolve(config, path, progress=True, delivery=delivery, executor=executor)))
            run_path = paths[-1]
        report_paths: dict[str, Any] = {}
        if with_report or (with_report is None and quick_demo):
            from forge.protocols.report import build_report

            report_paths = {k: str(v) for k, v in build_report([p for p, _ in runs], Path(report_root) / "report").items()}
    except ForgeError as exc:
        _fail(exc)
        return
    finally:
        if bus is not None:
            bus.close()
    summaries = []
    for path, result in runs:
        ev = result.final["evaluation"]
        summaries.append({
            "run_dir": str(path),
            "condition": result.config.condition,
            "mean_return": ev["mean_return"],
            "success_rate": ev["success_rate"],
            "major_failure_rate": ev["major_failure_rate"],
            "graduated": result.final["graduated"],
            "fallback_rate": result.final.get("fallback_rate", 0.0),
            "training_tokens": result.tokens["training"]["total_tokens"],
            "evaluation_tokens": result.tokens["evaluation"]["total_tokens"],
        })
    seconds = round(time.perf_counter() - started, 1)
    if as_json:
        out = dict(summaries[-1]) if len(summaries) == 1 else {"runs": summaries}
        out.update(seconds=seconds, report=report_paths)
        click.echo(json.dumps(out, indent=2))
        return
    verdict = json.loads(Path(report_paths["json"]).read_text(encoding="utf-8")).get("verdict") if report_paths else None
    if verdict:  # the result's first line: what was learned, and whether it could be chance
        click.echo(verdict)
    for summary in summaries:
        click.echo(
            f"{summary['condition']}: mean return {summary['mean_return']:.3f}, success {summary['success_rate']:.0%}, "
            f"major failures {summary['major_failure_rate']:.0%}, graduated {summary['graduated']}, "
            f"tokens {summary['training_tokens']:,} train + {summary['evaluation_tokens']:,} eval"
        )
    if len(summaries) > 1:
        base, best = summaries[0], summaries[-1]
        click.echo(f"{best['condition']} vs {base['condition']}: mean return {best['mean_return']:+.3f} vs {base['mean_return']:+.3f}, success {best['success_rate']:.0%} vs {base['success_rate']:.0%}")
    click.echo(f"run: {run_path} ({seconds}s)")
    if report_paths:
        click.echo(f"report: {report_paths.get('html')}")


@click.command("report")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="Directory for report.html, summary.json and memory.md.")
@click.option("--json", "as_json", is_flag=True, help="Print the written paths as JSON.")
def report_command(runs: tuple[Path, ...], out_dir: Path, as_json: bool) -> None:
    """Compare finished runs side by side: learning curves, returns, failures, tokens, memory."""
    from forge.protocols.report import build_report

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
