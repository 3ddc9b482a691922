"""``forge team``: a thin command over :func:`~forge.team.runner.run_team`, ``resume_team`` and
``sweep``. The lead attaches :data:`team_command` to the top-level ``forge`` group.

Errors print one line (``error: ...``) and exit 2 for something the user can fix (unknown
stream or memory mode, existing run dir), 1 for a backend failure.
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

__all__ = ["team_command"]


def _fail(exc: ForgeError) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2 if isinstance(exc, UserError) else 1)


class _Progress:
    """A live rich line on a terminal (task t/N, last TS/CS, AP_t, tokens); where stdout is no
    terminal, a line on standard error per task done, with the time elapsed and left
    (:class:`~forge.protocols.progress.Lines`: none through a run shorter than its quiet start)."""

    def __init__(self) -> None:
        self.live: Any = None
        self.lines: Any = None
        self.state: dict[str, Any] = {}

    def __enter__(self) -> _Progress:
        if sys.stdout.isatty():
            from rich.live import Live

            self.live = Live("starting...", refresh_per_second=4)
            self.live.__enter__()
        else:
            from forge.protocols.progress import Lines

            self.lines = Lines()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def __call__(self, event: str, data: Mapping[str, Any]) -> None:
        if self.live is None and self.lines is None:
            return
        s = self.state
        if event == "task_started":
            if self.lines is not None and (data["task"] <= 1 or "seen" not in s):
                self.lines.mark()  # a new stream (a sweep runs several) or a resumed one: its own pace
                s["seen"] = 0
            s.update(task=data["task"], total=data["total"], env=data["env"], step=0)
        elif event == "step":
            s["step"] = data["step"]
        elif event == "task_done":
            s.update(ts=data["ts"], cs=data["cs"], ap=data["ap"], tokens=s.get("tokens", 0) + data["tokens"], seen=s.get("seen", 0) + 1)
        elif event == "consolidated":
            s["cons"] = f"consolidated after task {data['after']}: +{data['procedures']} procedures, {data['pruned']} pruned"
        if self.lines is not None:
            if event == "task_done":
                task, total, seen = int(s.get("task", 0)), int(s.get("total", 0)), s["seen"]
                self.lines.write(f"task {task}/{total} {s.get('env', '')} done: TS {s['ts']:.2f} CS {s['cs']:.2f} AP_t {s['ap']:.3f}, "
                                 f"tokens {s['tokens']:,} | {self.lines.timing(seen, seen + max(total - task, 0))}")
            return
        line = f"task {s.get('task', 0)}/{s.get('total', '?')} {s.get('env', '')} step {s.get('step', 0)}"
        if "ap" in s:
            line += f" | last TS {s['ts']:.2f} CS {s['cs']:.2f} | AP_t {s['ap']:.3f} | tokens {s['tokens']:,}"
        if "cons" in s:
            line += f"\n{s['cons']}"
        self.live.update(line)


def _sizes(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"expected comma-separated integers, got {text!r}") from None
    if not out:
        raise ConfigError("expected at least one integer")
    return out


@click.command("team")
@click.option("--stream", default="gym", show_default=True, help="Task stream: gym (gymnasium ladder), db (PostgreSQL diagnosis), textworld (distinct held-out games) or frozenlake (held-out random maps).")
@click.option("--tasks", "-n", type=int, default=20, show_default=True, help="Tasks in the stream.")
@click.option("--team-size", "-k", type=int, default=3, show_default=True, help="Agents in the team (1-7).")
@click.option("--memory", default="hybrid", show_default=True, help="none, raw, or a memory layout: local, shared or hybrid.")
@click.option("--consolidate-every", type=int, default=5, show_default=True, help="Consolidate episodes into procedures every N tasks.")
@click.option("--llm", default="local", show_default=True, help="'local' (embedded Qwen2.5-Coder-1.5B), 'local:smollm2', 'openai:MODEL', 'local:/path.gguf' or 'test'.")
@click.option("--embedder", default="hash", show_default=True, help="Embedder of the run's memory store.")
@click.option("--seed", type=int, default=0, show_default=True, help="Stream seed.")
@click.option("--memory-tokens", type=int, default=300, show_default=True, help="Token budget of the memory block in one prompt.")
@click.option("--steps-per-subtask", type=int, default=4, show_default=True, help="Env steps per allocated subtask.")
@click.option("--max-steps", type=int, default=None, help="Cap on steps per task (default: the env's).")
@click.option("--envs", default=None, help="Comma-separated gym ladder overriding the default one.")
@click.option("--reflect/--no-reflect", default=True, show_default=True, help="LLM-written lessons and procedures (off: deterministic fallbacks).")
@click.option("--rule-guard/--no-rule-guard", default=False, show_default=True, help="Make rules binding: an actor chooses only among the actions its rules leave.")
@click.option("--run-dir", type=click.Path(path_type=Path), default=None, help="Where the run is written (default runs/team-<time>).")
@click.option("--resume", "resume_dir", type=click.Path(path_type=Path), default=None, help="Continue the interrupted run in this directory.")
@click.option("--sweep", "sweep_sizes", default=None, help="Run a team-size sweep, e.g. 1,3,5,7, and write the scaling report.")
@click.option("--lengths", default=None, help="With --sweep: comma-separated stream lengths (default: --tasks).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None, help="With --sweep: output directory (default runs/team-sweep-<time>).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def team_command(
    resume_dir: Path | None,
    run_dir: Path | None,
    sweep_sizes: str | None,
    lengths: str | None,
    out_dir: Path | None,
    as_json: bool,
    envs: str | None,
    **options: Any,
) -> None:
    """Run (or resume) a lifelong team over a task stream; print AIP, AP_t, TS, CS, tokens."""
    from forge.team.runner import TeamConfig, resume_team, run_team, sweep

    started = time.perf_counter()
    try:
        config = TeamConfig(envs=tuple(e.strip() for e in envs.split(",") if e.strip()) if envs else (), **options)
        with _Progress() as progress:
            if sweep_sizes is not None:
                out = out_dir or Path("runs") / f"team-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
                summary = sweep(config, out, sizes=_sizes(sweep_sizes), lengths=_sizes(lengths) if lengths else None, progress=progress)
            elif resume_dir is not None:
                result = resume_team(resume_dir, progress=progress)
            else:
                path = run_dir or Path("runs") / f"team-{time.strftime('%Y%m%d-%H%M%S')}"
                result = run_team(config, path, progress=progress)
    except ForgeError as exc:
        _fail(exc)
        return
    if sweep_sizes is not None:
        if as_json:
            click.echo(json.dumps({k: v for k, v in summary.items() if k != "runs"} | {"runs": [{k: v for k, v in r.items() if k != "curve"} for r in summary["runs"]]}, indent=2))
            return
        for r in summary["runs"]:
            click.echo(f"{r['label']}: AIP {r['aip']:.3f}, final AP_t {r['ap']:.3f}, TS {r['ts_mean']:.3f}, CS {r['cs_mean']:.3f}, tokens/task {r['tokens_per_task']:,.0f}")
        click.echo(f"report: {summary['paths']['html']}")
        return
    f = result.final
    out_summary = {
        "run_dir": str(result.run_dir),
        "stream": result.config.stream,
        "memory": result.config.memory,
        "team_size": result.config.team_size,
        "tasks": f["tasks"],
        "aip": f["aip"],
        "ap": f["ap"],
        "ts_mean": f["ts_mean"],
        "cs_mean": f["cs_mean"],
        "success_rate": f["success_rate"],
        "tokens_per_task": f["tokens"]["per_task"],
        "tokens_in": f["tokens"]["in"],
        "tokens_out": f["tokens"]["out"],
        "consolidation_tokens": f["tokens"]["consolidation"],
        "procedures_generalised": f["procedures_generalised"],
        "seconds": round(time.perf_counter() - started, 1),
    }
    if as_json:
        click.echo(json.dumps(out_summary, indent=2))
        return
    click.echo(
        f"{out_summary['memory']} team of {out_summary['team_size']} on {out_summary['tasks']} {out_summary['stream']} tasks: "
        f"AIP {f['aip']:.3f}, final AP_t {f['ap']:.3f}, TS {f['ts_mean']:.3f}, CS {f['cs_mean']:.3f}, "
        f"tokens/task {f['tokens']['per_task']:,.0f} (in {f['tokens']['in']:,}, out {f['tokens']['out']:,}), {out_summary['seconds']}s"
    )
    click.echo(f"run: {result.run_dir}")
