"""``forge swarm``: the terminal face of :mod:`forge.population.swarm` (a live table, a summary, exit codes).

The swarm itself (agent processes, the stats board, the run's result) is library code in
:mod:`forge.population.swarm`; this module only renders it and maps errors to one-line messages.
"""

from __future__ import annotations

import json
import os
import secrets as _secrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from forge.errors import ForgeError, UserError
from forge.population.swarm import (
    SECRET_ENV,
    TOPOLOGIES,
    SwarmConfig,
    _totals,
    agent_ids,
    run_swarm,
)

__all__ = ["render_table", "swarm_command"]


_HEAD = ("agent", "state", "episodes", "return", "learned", "sent", "recv", "accepted", "corrob.", "quarant.", "rejected", "conflicts", "help q/a", "units")
_SHORT = ("agent", "state", "ep", "ret", "lrn", "sent", "recv", "acc", "cor", "quar", "rej", "conf", "help", "units")
_COUNTS = ("learned", "sent", "received", "accepted", "corroborated", "quarantined", "rejected", "conflicts", "help", "units")


def _count(s: Mapping[str, Any], column: str) -> str:
    if column == "help":  # help requests this agent sent / peers' requests it answered
        return f"{int(s.get('help_asked', 0) or 0)}/{int(s.get('help_answered', 0) or 0)}"
    return str(int(s.get(column, 0) or 0))


def _row(aid: str, s: Mapping[str, Any], episodes: int, *, compact: bool) -> list[str]:
    name = (f"{aid}*" if compact else f"{aid} (poison)") if s.get("poison") else aid
    if s.get("isolated"):
        name += "^" if compact else " (isolated)"
    return [
        name,
        str(s.get("state", "starting")),
        f"{s.get('episodes', 0)}/{episodes}",
        f"{float(s.get('mean_return', 0.0)):+.2f}",
        *(_count(s, c) for c in _COUNTS),
    ]


def render_table(
    stats: Mapping[str, Mapping[str, Any]], *, config: SwarmConfig, agents: Sequence[str], title: str, compact: bool = False
) -> Any:
    """The live/final table: one row per agent and a totals row.

    ``compact`` (short headers, light box, ``*`` for poisoned agents) fits an 80-column terminal.
    """
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD, padding=(0, 0 if compact else 1), pad_edge=not compact)
    for h in _SHORT if compact else _HEAD:
        table.add_column(h, justify="left" if h in ("agent", "state") else "right", no_wrap=True)
    for aid in agents:
        table.add_row(*_row(aid, stats.get(aid, {}), config.episodes, compact=compact))
    tot = _totals({a: stats.get(a, {}) for a in agents})
    table.add_section()
    table.add_row(
        "total", "", f"{int(tot['episodes'])}/{config.episodes * len(agents)}", f"{tot['mean_return']:+.2f}",
        *(_count(tot, c) for c in _COUNTS),
    )
    if compact and any(s.get("poison") or s.get("isolated") for s in stats.values()):
        marks = [m for m, on in (("* adversarial (--poison)", any(s.get("poison") for s in stats.values())), ("^ isolated (--isolate)", any(s.get("isolated") for s in stats.values()))) if on]
        table.caption = "; ".join(marks)
    return table


def _line(stats: Mapping[str, Mapping[str, Any]], elapsed: float) -> str:
    parts = []
    for aid, s in stats.items():
        parts.append(
            f"{aid} {s.get('state', 'starting')} ep {s.get('episodes', 0)} sent {s.get('sent', 0)} recv {s.get('received', 0)} "
            f"acc {s.get('accepted', 0)} cor {s.get('corroborated', 0)} quar {s.get('quarantined', 0)} conf {s.get('conflicts', 0)}"
        )
    return f"[{elapsed:6.1f}s] " + " | ".join(parts)


@click.command("swarm")
@click.option("--agents", "-n", type=int, default=3, show_default=True, help="How many agents.")
@click.option("--episodes", "-e", type=int, default=5, show_default=True, help="Episodes each agent plays.")
@click.option("--env", default="frozenlake-4x4", show_default=True, help="Environment each agent plays (see forge.envs.available_envs).")
@click.option("--llm", default="local", show_default=True, help="local (embedded Qwen2.5-Coder-1.5B), local:smollm2 (tiny, fast), openai:MODEL, local:/path.gguf, or test (scripted, instant).")
@click.option("--topology", type=click.Choice(TOPOLOGIES), default="full", show_default=True, help="Who hears whom.")
@click.option("--embedder", type=click.Choice(["hash", "local"]), default="hash", show_default=True, help="Embedder of every agent's store.")
@click.option("--bus", default="redis://127.0.0.1:6379/0", show_default=True, help="The Redis the agents share.")
@click.option("--dir", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Per-agent stores, logs and swarm.json (default runs/swarm-<time>).")
@click.option("--poison", type=int, default=0, show_default=True, help="Make this many agents adversarial: they also broadcast injections and secrets.")
@click.option("--seed", type=int, default=0, show_default=True, help="Run seed; every agent's episode seeds derive from it.")
@click.option("--max-steps", type=int, default=None, help="Cap on steps per episode (default: the env's).")
@click.option("--rule-guard/--no-rule-guard", default=False, show_default=True, help="Enforce 'when X, then do not A' rules as hard exclusions, choosing among the actions they name as safe (for models too small to follow them).")
@click.option("--linger", "linger_s", type=float, default=60.0, show_default=True, help="After its last episode an agent keeps listening until its peers have finished and sent everything, giving up on a peer not heard from for this many seconds (on a loaded machine a slow peer needed more than 10).")
@click.option("--sync-interval", "sync_interval_s", type=float, default=30.0, show_default=True, help="Seconds between an agent's periodic batches of the units its importance trigger did not send at once.")
@click.option("--warmup-episodes", type=int, default=0, show_default=True, help="Warm-up: received memory stays out of an agent's prompts until it has played this many episodes.")
@click.option("--warmup-validation", type=float, default=0.0, show_default=True, help="Warm-up: then show received units only if validated at least this well (0-1).")
@click.option("--ramp-episodes", type=int, default=0, show_default=True, help="Gradual enablement: prompt sections shown grow from one to all over this many episodes (0: all).")
@click.option("--isolate", type=int, default=0, show_default=True, help="Cut this many agents (the first ones) off from all but their own memory (an ablation).")
@click.option("--executor", default="process", show_default=True, help="Run each agent as a process, a Ray actor on a local Ray (ray), or on a running cluster (ray://HOST:PORT).")
@click.option("--db", default="", help="One PostgreSQL memory every agent shares, postgresql://USER@HOST/DB[?schema=NAME] (password from PGPASSWORD); default: a SQLite file per agent in --dir.")
@click.option("--keep", is_flag=True, help="Keep the run's Redis keys (streams and stats) instead of deleting them.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of a table.")
def swarm_command(out_dir: Path | None, as_json: bool, **options: Any) -> None:
    """Run a population of agents as separate processes (or Ray actors) that share memory live over Redis."""
    from rich.console import Console

    config = SwarmConfig(dir=str(out_dir) if out_dir else "", **options)
    secret = os.environ.get(SECRET_ENV) or _secrets.token_hex(32)
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))
    agents = agent_ids(config.agents)
    title = f"forge swarm: {config.agents} agents, {config.topology} topology, {config.env}, llm {config.llm}"
    compact = console.width < 130
    live: Any = None
    last_line = [0.0, ""]

    def update(stats: dict[str, dict[str, Any]], elapsed: float) -> None:
        if as_json:
            return
        if live is not None:
            live.update(render_table(stats, config=config, agents=agents, title=f"{title} ({elapsed:.0f}s)", compact=compact))
            return
        line = _line(stats, elapsed)
        if elapsed - last_line[0] >= 2.0 and line.split("] ", 1)[-1] != last_line[1]:
            click.echo(line)
            last_line[:] = [elapsed, line.split("] ", 1)[-1]]

    try:
        if console.is_terminal and not as_json:
            from rich.live import Live

            with Live(render_table({}, config=config, agents=agents, title=title, compact=compact), console=console, refresh_per_second=2, transient=True) as live:
                result = run_swarm(config, secret=secret, on_update=update)
        else:
            result = run_swarm(config, secret=secret, on_update=update)
    except ForgeError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2 if isinstance(exc, UserError) else 1)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        console.print(render_table(result.agents, config=config, agents=agents, title=f"{title}: {result.status} in {result.seconds:.1f}s", compact=compact))
        click.echo(f"run: {result.prefix} ({'keys deleted' if result.cleaned else 'keys kept'}); results: {Path(result.dir) / 'swarm.json'}")
    for f in result.failures:
        click.echo(f"error: {f}", err=True)
    if result.status == "interrupted":
        click.echo("interrupted: every agent was stopped", err=True)
        sys.exit(130)
    if result.status != "ok":
        sys.exit(1)
