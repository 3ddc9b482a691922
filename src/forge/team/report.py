"""Reports over finished team runs: the scaling landscape (team size vs time) as JSON + HTML.

    from forge.team.report import build_team_report
    summary, paths = build_team_report(["runs/size-1", "runs/size-3"], "report/")

Figures (PNG embedded in one self-contained page, drawn with the helpers of
:mod:`forge.protocols.report`): AP_t over the stream per run, AIP per team size (one line per memory
mode and stream length), and tokens per task per team size.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from forge.errors import ConfigError, NotFoundError, StoreError
from forge.protocols.report import REPORT_CSS, figure_png

__all__ = ["build_team_report", "load_team_run"]


def load_team_run(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``final.json`` of a finished team run, with ``label`` and ``run_dir`` added."""
    path = Path(run_dir)
    final = path / "final.json"
    if not (path / "config.json").is_file():
        raise NotFoundError(f"{path} is not a team run: config.json is missing")
    if not final.is_file():
        raise NotFoundError(f"{path} has not finished (no final.json); finish it with: forge team --resume {path}")
    try:
        data = json.loads(final.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise StoreError(f"{final}: corrupt or unreadable ({exc})") from None
    cfg = data.get("config", {})
    data["label"] = f"{cfg.get('memory', '?')}, size {cfg.get('team_size', '?')}, {data.get('tasks', '?')} tasks"
    data["run_dir"] = str(path)
    return data


def _row(run: Mapping[str, Any]) -> dict[str, Any]:
    cfg = run["config"]
    return {
        "label": run["label"],
        "run_dir": run["run_dir"],
        "stream": cfg["stream"],
        "memory": cfg["memory"],
        "team_size": cfg["team_size"],
        "tasks": run["tasks"],
        "llm": cfg["llm"],
        "aip": run["aip"],
        "ap": run["ap"],
        "ts_mean": run["ts_mean"],
        "cs_mean": run["cs_mean"],
        "tokens_per_task": run["tokens"]["per_task"],
        "curve": run["curve"],
    }


def _figures(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as exc:
        raise ConfigError("reports need matplotlib: pip install 'forge-memory[report]'") from exc
    figs: dict[str, str] = {}
    fig = Figure(figsize=(6, 3.4))
    ax = fig.add_subplot()
    for r in rows:
        ax.plot(range(1, len(r["curve"]) + 1), r["curve"], marker=".", label=r["label"])
    ax.set(xlabel="task t", ylabel="AP_t", ylim=(0, 1.02), title="AP_t over the stream (time)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7)
    figs["AP_t curves"] = figure_png(fig)

    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["memory"], r["tasks"]), []).append(r)
    fig = Figure(figsize=(6, 3.4))
    ax = fig.add_subplot()
    for (mem, n), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["team_size"])
        ax.plot([r["team_size"] for r in rs], [r["aip"] for r in rs], marker="o", label=f"{mem}, {n} tasks")
    ax.set(xlabel="team size", ylabel="AIP", ylim=(0, 1.02), title="Scaling teams: AIP per team size")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7)
    figs["AIP per team size"] = figure_png(fig)

    fig = Figure(figsize=(6, 3.4))
    ax = fig.add_subplot()
    for (mem, n), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["team_size"])
        ax.plot([r["team_size"] for r in rs], [r["tokens_per_task"] for r in rs], marker="s", label=f"{mem}, {n} tasks")
    ax.set(xlabel="team size", ylabel="tokens per task", title="Cost per team size")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7)
    figs["tokens per task"] = figure_png(fig)
    return figs


def _html(rows: Sequence[Mapping[str, Any]], figs: Mapping[str, str]) -> str:
    cols = [("run", "label"), ("stream", "stream"), ("AIP", "aip"), ("final AP_t", "ap"), ("mean TS", "ts_mean"),
            ("mean CS", "cs_mean"), ("tokens/task", "tokens_per_task"), ("llm", "llm")]

    def cell(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else html.escape(str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c, _ in cols)
    body = "".join("<tr>" + "".join(f"<td>{cell(r[k])}</td>" for _, k in cols) + "</tr>" for r in rows)
    images = "".join(
        f'<figure><img alt="{html.escape(n)}" src="data:image/png;base64,{b}"><figcaption>{html.escape(n)}</figcaption></figure>'
        for n, b in figs.items()
    )
    dirs = "".join(f"<li>{html.escape(r['label'])}: <code>{html.escape(r['run_dir'])}</code></li>" for r in rows)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>FORGE team report</title><style>{REPORT_CSS}</style></head><body>"
        f"<h1>Scaling teams or scaling time</h1><table><tr>{head}</tr>{body}</table>"
        f"<h2>Figures</h2><div class='figs'>{images}</div><h2>Runs</h2><ul>{dirs}</ul></body></html>"
    )


def build_team_report(
    run_dirs: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str]
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Write ``team-summary.json`` and ``team-report.html`` for ``run_dirs`` into ``out_dir``."""
    if not run_dirs:
        raise ConfigError("build_team_report needs at least one run directory")
    rows = [_row(load_team_run(d)) for d in run_dirs]
    figs = _figures(rows)
    by_size: dict[int, list[float]] = {}
    for r in rows:
        by_size.setdefault(r["team_size"], []).append(r["aip"])
    summary: dict[str, Any] = {
        "runs": rows,
        "aip_by_team_size": {str(k): sum(v) / len(v) for k, v in sorted(by_size.items())},
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "team-summary.json", "html": out / "team-report.html"}
    paths["json"].write_text(json.dumps(summary, indent=2), encoding="utf-8")
    paths["html"].write_text(_html(rows, figs), encoding="utf-8")
    return summary, paths
