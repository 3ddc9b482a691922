"""``forge curate`` (``run`` a pass, ``--dry-run`` to see it first; ``restore``, ``seed``,
``timeline``) and ``forge trace``: thin commands over :mod:`forge.curate`. ``forge.cli`` attaches them.
"""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path
from typing import Any

import click

from forge.errors import ValidationError

__all__ = ["curate_command", "trace_command"]

KINDS = ("episode", "fact", "rule", "example", "lesson", "preference", "procedure", "profile")


def _pairs(values: tuple[str, ...], option: str, cast: Any) -> dict[str, Any]:
    """``KEY=VALUE`` options into a dict, with a one-line error naming the option."""
    out: dict[str, Any] = {}
    for v in values:
        key, sep, raw = v.rpartition("=")
        if not sep or not key:
            raise ValidationError(f"{option} takes KEY=VALUE, got {v!r}")
        try:
            out[key] = cast(raw)
        except ValueError:
            raise ValidationError(f"{option} {key}: {raw!r} is not a {cast.__name__}") from None
    return out


def _when(ts: float | None) -> str:
    return "-" if ts is None else _dt.datetime.fromtimestamp(ts, _dt.UTC).strftime("%Y-%m-%d %H:%M")


class _CurateGroup(click.Group):
    """``forge curate`` is a group of subcommands; without one (``forge curate``, ``forge curate
    --dry-run``) it runs ``forge curate run``, as it did when the pass was the group itself."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0].startswith("-") and args[0] not in ("-h", "--help")):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("curate", cls=_CurateGroup)
def curate_command() -> None:
    """Keep memory healthy: run a curation pass (run), bring units back (restore), load a
    seed pack (seed), show what was believed when (timeline). 'forge curate' alone runs a pass."""


@curate_command.command("run")
@click.option("--dry-run", is_flag=True, help="Show what would change and why; change nothing.")
@click.option("--now", type=float, default=None, help="The pass's clock, epoch seconds (default: now).")
@click.option("--archive-below", type=float, default=0.1, show_default=True, help="Archive active units weaker than this.")
@click.option("--half-life", "half_lives", multiple=True, help="KIND=DAYS (repeatable).")
@click.option("--ttl", "ttl_scope", multiple=True, help="SCOPE=SECONDS: units of this scope expire (repeatable).")
@click.option("--ttl-kind", "ttl_kind", multiple=True, help="KIND=SECONDS: units of this kind expire (repeatable).")
@click.option("--cap-agent", type=int, default=None, help="Most active units per owner agent.")
@click.option("--cap-scope", type=int, default=None, help="Most active units per scope.")
@click.option("--cap-kind", "cap_kind", multiple=True, help="KIND=N: most active units of a kind (repeatable).")
@click.option("--no-decay", is_flag=True, help="Skip decay (TTL, caps and conflicts still apply).")
@click.option("--no-conflicts", is_flag=True, help="Leave contradictions unsettled.")
@click.option("--consolidate", "do_consolidate", is_flag=True, help="Also cluster and generalise related units.")
@click.option("--cluster-at", type=float, default=0.8, show_default=True, help="Cosine that joins a cluster.")
@click.option("--min-cluster", type=int, default=3, show_default=True, help="Smallest cluster that is generalised.")
@click.pass_obj
def run_command(
    obj: Any, dry_run: bool, now: float | None, archive_below: float, half_lives: tuple[str, ...],
    ttl_scope: tuple[str, ...], ttl_kind: tuple[str, ...], cap_agent: int | None, cap_scope: int | None,
    cap_kind: tuple[str, ...], no_decay: bool, no_conflicts: bool, do_consolidate: bool, cluster_at: float, min_cluster: int,
) -> None:
    """Run a curation pass: settle conflicts, expire, decay, cap (and consolidate); every
    change is recorded with its reason."""
    from forge.curate.consolidate import ConsolidationPolicy
    from forge.curate.lifecycle import HALF_LIFE_DAYS, CurationPolicy, curate

    policy = CurationPolicy(
        archive_below=archive_below,
        half_lives={**HALF_LIFE_DAYS, **_pairs(half_lives, "--half-life", float)},
        ttl_by_scope=_pairs(ttl_scope, "--ttl", float),
        ttl_by_kind=_pairs(ttl_kind, "--ttl-kind", float),
        cap_per_agent=cap_agent,
        cap_per_scope=cap_scope,
        cap_per_kind=_pairs(cap_kind, "--cap-kind", int),
        decay=not no_decay,
        conflicts=not no_conflicts,
    )
    cons = ConsolidationPolicy(threshold=cluster_at, min_size=min_cluster) if do_consolidate else None
    started = time.perf_counter()
    with obj.memory(must_exist=True) as mem, obj.progress("curation pass: scoring, settling, decaying", None) as bar:
        # a spinner (the pass reports no steps); with --consolidate the embedding of groups counts on it
        plan = curate(obj.counting(mem, bar), policy=policy, now=now, dry_run=dry_run, consolidate=cons, actor="cli-curate")
    took = time.perf_counter() - started
    verb = "would" if dry_run else "did"
    lines = []
    if plan.consolidation is not None:
        for c in plan.consolidation.generalised:
            lines.append(f"{verb} generalise {len(c.members)} units into {c.unit_id}: {c.reason}")
    for c in plan.all_changes:
        lines.append(f"{verb} {c.op} {c.unit_id} ({c.cause}): {c.reason}")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(plan.counts().items())) or "nothing"
    lines.append(
        f"{'dry run: ' if dry_run else ''}{plan.scanned} active units scanned in {took:.2f}s; {counts}"
        + ("; nothing was changed" if dry_run else f"; recorded as run {plan.run_id}")
    )
    obj.emit(plan.to_dict(), "\n".join(lines))


@curate_command.command("restore")
@click.argument("unit_id")
@click.option("--reason", default="restored by the operator", show_default=True)
@click.pass_obj
def restore_command(obj: Any, unit_id: str, reason: str) -> None:
    """Bring an archived unit back into recall."""
    from forge.curate.lifecycle import restore

    with obj.memory(must_exist=True) as mem:
        unit = restore(mem, unit_id, reason=reason, actor="cli-curate")
    obj.emit(unit.to_dict(), f"restored {unit.id}: {unit.content[:100]}")


@curate_command.command("seed")
@click.argument("path")
@click.option("--scope", default="global", show_default=True, help="private | group:NAME | global")
@click.option("--owner", default="", help="Owner agent (for a private scope).")
@click.option("--validation", type=float, default=0.3, show_default=True, help="Initial validation the seeds must earn beyond.")
@click.pass_obj
def seed_command(obj: Any, path: str, scope: str, owner: str, validation: float) -> None:
    """Import a seed pack (JSONL of rules/facts) with source 'seed': all lines or none."""
    from forge.curate.admission import admit
    from forge.curate.seeds import load_seed_pack

    units = load_seed_pack(path, scope=scope, owner=owner, validation=validation)  # all checked before the store is opened
    with obj.memory() as mem, obj.progress("embedding seeds", len(units), then=f"admitting {len(units):,} seeds in one transaction") as bar:
        got = admit(obj.counting(mem, bar), units, actor=f"seed:{Path(path).name}")
    counts: dict[str, int] = {}
    for d in got:
        counts[d.action] = counts.get(d.action, 0) + 1
    shown = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    obj.emit({"seeds": len(got), "decisions": [d.to_dict() for d in got]}, f"{len(got)} seeds from {path} into {scope}: {shown}")


@curate_command.command("timeline")
@click.argument("unit_id")
@click.pass_obj
def timeline_command(obj: Any, unit_id: str) -> None:
    """What was believed when: the supersedes chain of a unit, valid time beside record time."""
    from forge.curate.lifecycle import timeline

    with obj.memory(must_exist=True) as mem:
        beliefs = timeline(mem, unit_id)
    lines = [
        f"{_when(b.valid_from)} .. {_when(b.valid_to) if b.valid_to else 'now':16}  {b.status:10}  {b.unit_id}  {b.content[:80]}"
        + (f"\n    recorded {_when(b.recorded_at)}, retired {_when(b.retired_at)}: {b.reason[:120]}" if b.retired_at else "")
        for b in beliefs
    ]
    obj.emit([b.to_dict() for b in beliefs], "\n".join(lines))


@click.command("trace")
@click.argument("unit_id")
@click.pass_obj
def trace_command(obj: Any, unit_id: str) -> None:
    """Where a unit came from and what happened to it since (JSON with --json)."""
    from forge.curate.trace import render, trace

    with obj.memory(must_exist=True) as mem:
        data = trace(mem, unit_id)
    obj.emit(data, render(data))
