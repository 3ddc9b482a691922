"""Reports over finished evolution runs: one JSON summary, one self-contained HTML page, and
the final champion's memory as readable markdown.

    from forge.protocols.report import build_report
    paths = build_report(["runs/zero", "runs/reflexion", "runs/forge"], "report/")
    paths["html"]     # figures embedded as base64 PNG: open it anywhere, no server, no network

Runs are shown side by side: checkpoint return per stage (the learning curve), the final
evaluation's return distribution, success and major-failure rates, graduation over stages,
and training vs evaluation tokens. matplotlib is imported only here, only when called.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from forge.errors import ConfigError, NotFoundError, StoreError

__all__ = ["ALPHA", "REPORT_CSS", "build_report", "figure_png", "fisher_greater", "load_run", "memory_markdown", "verdict"]


def load_run(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """final.json of a finished run, with ``label`` and ``run_dir`` added."""
    path = Path(run_dir)
    final = path / "final.json"
    if not (path / "config.json").is_file():
        raise NotFoundError(f"{path} is not a FORGE run: config.json is missing")
    if not final.is_file():
        raise NotFoundError(f"{path} has not finished (no final.json); finish it with: forge evolve --resume {path}")
    try:
        data = json.loads(final.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise StoreError(f"{final}: corrupt or unreadable ({exc})") from None
    cfg = data.get("config", {})
    data["label"] = f"{cfg.get('condition', '?')}/{cfg.get('representation', '?')}"
    data["run_dir"] = str(path)
    return data


def memory_markdown(memory: Sequence[Mapping[str, Any]], *, title: str = "Champion memory") -> str:
    """Rules and examples (unit records), grouped by role, with their provenance and record:
    how often each was shown to the model and how the episodes that showed it ended."""
    lines = [f"# {title}", ""]
    if not memory:
        return "\n".join([*lines, "_(empty memory)_", ""])

    def role_of(m: Mapping[str, Any]) -> str:
        return (m.get("context") or {}).get("role") or "any role"

    def record(m: Mapping[str, Any]) -> str:
        meta = m.get("meta", {})
        prov = m.get("provenance") or {}
        uses = int(meta.get("uses", 0))
        used = f"; shown {uses}x, {meta.get('successes', 0)} successes, validation {m.get('validation', 0.5):.2f}" if uses else ""
        return f"source: {prov.get('source', '')}, stage {meta.get('stage', 0)}{used}"

    for role in dict.fromkeys(role_of(m) for m in memory):
        lines.append(f"## Role: {role}")
        rules = [m for m in memory if role_of(m) == role and m["kind"] in ("rule", "lesson")]
        examples = [m for m in memory if role_of(m) == role and m["kind"] == "example"]
        if rules:
            lines += ["", "### Rules", ""]
            for i, m in enumerate(rules):
                tag = " _(fallback)_" if m.get("meta", {}).get("fallback") else ""
                lines.append(f"{i}. {m['content']}  \n   {record(m)}{tag}")
        if examples:
            lines += ["", "### Examples", ""]
            for m in examples:
                meta = m.get("meta", {})
                tag = " _(fallback)_" if meta.get("fallback") else ""
                lines.append(f"**{meta.get('name', 'example')}**: {meta.get('description', '')}{tag}  ")
                lines.append(record(m))
                lines.append("")
                for s in meta.get("steps", []):
                    thought = f" _{s.get('thought')}_" if s.get("thought") else ""
                    tool = f" [tool {s['tool']}]" if s.get("tool") else ""
                    lines.append(f"- {s.get('observation', '')}{tool}{thought} -> **{s.get('answer', '')}**")
                lines.append("")
        lines.append("")
    return "\n".join(lines)


def decisions(run: Mapping[str, Any], *, limit: int = 40) -> list[dict[str, Any]]:
    """Which memories drove which actions: the champion's evaluation steps, each with the
    units that named its situation (read from the run's eval results and final memory)."""
    from forge.envs.situation import summarize_observation

    champ = run["champion"]["instance"]
    path = Path(run["run_dir"]) / "checkpoints" / "eval" / f"inst-{champ:02d}.json"
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    content = {m["id"]: m["content"] for m in run["champion"]["memory"]}
    rows: list[dict[str, Any]] = []
    for ep in result.get("episodes", [])[:2]:
        for step in ep.get("steps", []):
            info = step.get("info") or {}
            if "now" not in info:
                continue  # a non-acting role's step
            row = {
                "seed": ep.get("meta", {}).get("seed"),
                "t": info.get("t"),
                "situation": info.get("situation") or summarize_observation(step.get("observation", "")),
                "action": step.get("action", ""),
                "reward": step.get("reward", 0.0),
                "memory": [content.get(i, i) for i in info.get("now", [])],
                "shown": len(info.get("shown", [])),
                "against_memory": info.get("rule_followed") is False,
                "repeats": 1,
            }
            last = rows[-1] if rows else None
            if last is not None and (last["seed"], last["situation"], last["action"], last["memory"]) == (row["seed"], row["situation"], row["action"], row["memory"]):
                last["repeats"] += 1  # a stall: one row, counted, not twenty alike
                continue
            rows.append(row)
    return rows[:limit]


#: Settings that change what a run measures: runs compared side by side should share them.
_COMPARED = ("env", "llm", "instances", "stages", "attempts", "eval_episodes", "max_steps", "rule_guard", "graduate_after", "graduate_first_try", "memory_tokens", "policy", "eval_seeds", "train_seeds", "train_decisions", "train_reflections")


def differences(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The settings (beyond condition and representation) in which compared runs differ.

    Zero-shot's number of instances is no difference: with no memory and greedy evaluation
    its instances replay one another, so the quick demo plays one.
    """
    from dataclasses import fields

    from forge.protocols.config import ForgeConfig

    # A setting a run's config.json predates had its default then (graduate_after came later).
    defaults = {f.name: f.default for f in fields(ForgeConfig)}
    out = []
    for key in _COMPARED:
        among = [r for r in runs if not (key == "instances" and r["config"].get("condition") == "zero-shot")]
        values = [r["config"].get(key, defaults.get(key)) for r in among]
        if any(v != values[0] for v in values[1:]):
            shown = ", ".join(f"{r['label']}: {v!r}" for r, v in zip(among, values, strict=True))
            out.append(f"{key} differs ({shown})")
    return out


#: The one-sided p-value under which a rise in success is called a transfer.
ALPHA = 0.05


def fisher_greater(k1: int, n1: int, k0: int, n0: int) -> float:
    """One-sided p-value of Fisher's exact test that ``k1`` successes of ``n1`` beat ``k0`` of
    ``n0``: the chance, with the successes of both arms pooled and dealt at random, that the
    first arm gets ``k1`` or more of them (3/8 vs 1/4: 0.59; 8/8 vs 0/4: 0.002)."""
    if not (0 <= k1 <= n1 and 0 <= k0 <= n0) or n1 + n0 == 0:
        raise ConfigError(f"successes must lie between 0 and their episodes, got {k1}/{n1} and {k0}/{n0}")
    total, hits = n1 + n0, k1 + k0
    ways = math.comb(total, n1)
    return sum(math.comb(hits, x) * math.comb(total - hits, n1 - x) for x in range(k1, min(n1, hits) + 1)) / ways


def _successes(row: Mapping[str, Any]) -> tuple[int, int]:
    n = int(row["eval_episodes"])
    return round(row["success_rate"] * n), n


def verdict(rows: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]]) -> str:
    """One line: what was learned, and whether it beat the baseline on the evaluation tasks
    (held out when the runs named eval seeds no instance trained on).

    "It transferred" is said only when the rise in success could hardly be chance: one-sided
    Fisher's exact test on the episodes' successes, p < :data:`ALPHA`. The test takes episodes
    as independent; a population's instances replay the same held-out tasks, so it is, if
    anything, generous, and a handful of episodes can show no transfer at all (4 zero-shot
    episodes against 8: even 7/8 vs 1/4 gives p = 0.07)."""
    learners = [(r, run) for r, run in zip(rows, runs, strict=True) if r["condition"] != "zero-shot"]
    base = next((r for r in rows if r["condition"] == "zero-shot"), None)
    if not learners:
        return f"{rows[0]['label']}: success {rows[0]['success_rate']:.0%} (nothing learns in zero-shot)."
    best, run = max(learners, key=lambda rr: (rr[0]["success_rate"], rr[0]["mean_return"]))
    memory = run["champion"]["memory"]
    rules = [m for m in memory if m.get("kind") in ("rule", "example")]
    held = len(run["config"].get("eval_seeds") or ())
    where = (
        f"{held} held-out tasks ({best['eval_episodes']} episodes)" if held
        else f"{best['eval_episodes']} evaluation episodes (not held out: the same tasks as training)"
    )
    learned = f"{best['label']} learned {len(rules)} rule(s)/example(s)" + (f", e.g. \"{_clip(rules[0]['content'], 90)}\"" if rules else "")
    if base is None:
        return f"{learned}; success {best['success_rate']:.0%} on {where}."
    (k1, n1), (k0, n0) = _successes(best), _successes(base)
    gain = best["success_rate"] - base["success_rate"]
    p = fisher_greater(k1, n1, k0, n0)
    test = f"one-sided Fisher exact p = {p:.2g}"
    # Success is what the user asked for: a better return at equal success (fewer holes, a
    # later fall) is said as such, not called a transfer; nor is a rise chance could give.
    transferred = gain > 0 and p < ALPHA
    if transferred:
        outcome = f"it transferred ({test})"
    elif gain > 0:
        outcome = f"success rose, but chance could give as much ({test}; a transfer needs p < {ALPHA:g}): no transfer shown"
    elif gain == 0 and best["mean_return"] > base["mean_return"]:
        outcome = "success did not improve, the return did"
    else:
        outcome = "it did not beat zero-shot"
    why = ""
    if best.get("rule_shown_rate") is not None and not transferred:
        why = f" (a rule for the situation was in front of the model in {best['rule_shown_rate']:.0%} of decisions"
        why += f", followed in {best['rule_followed_rate']:.0%} of those)" if best.get("rule_followed_rate") is not None else ")"
    diff = differences(runs)
    caveat = f" Beware: {'; '.join(diff)}." if diff else ""
    stopped = run.get("budget")
    if stopped:  # a training ceiling skipped stages: say so, the figures are of a shorter run
        caveat += f" Training stopped before stage {int(stopped['stopped_before_stage']) + 1} at its ceiling on {' and '.join(stopped['over'])}."
    return (
        f"{learned}; on {where} {outcome}: success {k1}/{n1} ({best['success_rate']:.0%}) vs zero-shot {k0}/{n0} ({base['success_rate']:.0%}), "
        f"mean return {best['mean_return']:+.2f} vs {base['mean_return']:+.2f}{why}.{caveat}"
    )


def _clip(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _summary_row(run: Mapping[str, Any]) -> dict[str, Any]:
    ev = run["evaluation"]
    tok = run["tokens"]
    return {
        "label": run["label"],
        "run_dir": run["run_dir"],
        "condition": run["config"]["condition"],
        "representation": run["config"]["representation"],
        "env": run["config"]["env"],
        "llm": run["config"]["llm"],
        "instances": run["config"]["instances"],
        "stages": run["config"]["stages"],
        "attempts": run["config"]["attempts"],
        "mean_return": ev["mean_return"],
        "success_rate": ev["success_rate"],
        "major_failure_rate": ev["major_failure_rate"],
        "eval_episodes": ev["episodes"],
        "graduated": run.get("graduated", 0),
        "fallback_rate": run.get("fallback_rate", 0.0),
        "training_tokens": tok["training"]["total_tokens"],
        "evaluation_tokens": tok["evaluation"]["total_tokens"],
        "curve": [s.get("mean_checkpoint_return") for s in run["stages"]],
        "graduation": [s.get("graduated_total", 0) for s in run["stages"]],
        "champion": run["champion"]["instance"],
        **_rule_rates(ev.get("rules") or {}),
    }


def _rule_rates(rec: Mapping[str, Any]) -> dict[str, float | None]:
    decided, shown = int(rec.get("decisions", 0)), int(rec.get("rule_shown", 0))
    return {
        "rule_shown_rate": shown / decided if decided else None,
        "rule_followed_rate": int(rec.get("rule_followed", 0)) / shown if shown else None,
    }


def figure_png(fig: Any) -> str:
    """A matplotlib figure as base64 PNG, for self-contained HTML reports."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _figures(runs: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as exc:
        raise ConfigError("reports need matplotlib: pip install 'forge-memory[report]'") from exc
    labels = [r["label"] for r in rows]
    figs: dict[str, str] = {}

    fig = Figure(figsize=(6, 3.4))
    ax = fig.add_subplot()
    for r in rows:
        xs = [i + 1 for i, v in enumerate(r["curve"]) if v is not None]
        ax.plot(xs, [v for v in r["curve"] if v is not None], marker="o", label=r["label"])
    ax.set(xlabel="stage", ylabel="mean checkpoint return", title="Learning curve")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
    figs["learning curve"] = figure_png(fig)

    fig = Figure(figsize=(6, 3.4))
    ax = fig.add_subplot()
    ax.boxplot([run["evaluation"]["returns"] for run in runs], tick_labels=labels)
    for i, run in enumerate(runs, 1):
        ys = run["evaluation"]["returns"]
        ax.scatter([i] * len(ys), ys, alpha=0.4, s=12)
    ax.set(ylabel="return", title="Final evaluation returns")
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    figs["final evaluation"] = figure_png(fig)

    fig = Figure(figsize=(6, 3.4))
    ax = fig.add_subplot()
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["success_rate"] for r in rows], width=0.4, label="success")
    ax.bar([x + 0.2 for x in xs], [r["major_failure_rate"] for r in rows], width=0.4, label="major failure")
    ax.set_xticks(list(xs), labels, rotation=20, fontsize=8)
    ax.set(ylabel="rate", ylim=(0, 1), title="Success and major-failure rates")
    ax.legend(fontsize=8)
    figs["rates"] = figure_png(fig)

    fig = Figure(figsize=(6, 3.4))
    ax = fig.add_subplot()
    for r in rows:
        ax.step(range(1, len(r["graduation"]) + 1), r["graduation"], where="post", marker="o", label=r["label"])
    ax.set(xlabel="stage", ylabel="instances graduated", title="Graduation over stages")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
    figs["graduation"] = figure_png(fig)

    fig = Figure(figsize=(6, 3.4))
    ax = fig.add_subplot()
    train = [r["training_tokens"] for r in rows]
    ax.bar(labels, train, label="training")
    ax.bar(labels, [r["evaluation_tokens"] for r in rows], bottom=train, label="evaluation")
    ax.set(ylabel="tokens", title="Tokens")
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    ax.legend(fontsize=8)
    figs["tokens"] = figure_png(fig)
    return figs


REPORT_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f3f3f3}td:first-child{text-align:left}.figs{display:flex;flex-wrap:wrap;gap:12px}
pre{background:#f8f8f8;padding:1em;overflow-x:auto;white-space:pre-wrap}
tr.against td{background:#fde8e8}.verdict{font-size:1.1em;background:#f3f7ff;padding:.6em 1em;border-left:4px solid #36c}"""


def _decisions_html(label: str, rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return ""
    body = "".join(
        f"<tr{' class=against' if r.get('against_memory') else ''}><td>{html.escape(str(r['seed']))}/{r['t']}"
        f"{' (x' + str(r['repeats']) + ')' if r.get('repeats', 1) > 1 else ''}</td><td>{html.escape(r['situation'])}</td>"
        f"<td>{html.escape(r['action'])}{' <b>against memory</b>' if r.get('against_memory') else ''}</td>"
        f"<td>{r['reward']:g}</td><td>{r['shown']}</td><td style='text-align:left'>{'<br>'.join(html.escape(m) for m in r['memory']) or '-'}</td></tr>"
        for r in rows
    )
    return (f"<h3>{html.escape(label)}</h3><table><tr><th>seed/step</th><th>situation</th><th>action</th><th>reward</th>"
            f"<th>units shown</th><th>memory for this situation</th></tr>{body}</table>")


def _html(rows: Sequence[Mapping[str, Any]], figs: Mapping[str, str], memories: Mapping[str, str], drove: Mapping[str, Sequence[Mapping[str, Any]]] | None = None, *, verdict: str = "") -> str:
    cols = [
        ("run", "label"),
        ("mean return", "mean_return"),
        ("success", "success_rate"),
        ("major failure", "major_failure_rate"),
        ("graduated", "graduated"),
        ("rule shown", "rule_shown_rate"),
        ("followed", "rule_followed_rate"),
        ("fallback reflections*", "fallback_rate"),
        ("training tokens", "training_tokens"),
        ("eval tokens", "evaluation_tokens"),
    ]

    def cell(key: str, value: Any) -> str:
        if value is None:
            return "-"
        if key in ("success_rate", "major_failure_rate", "fallback_rate", "rule_shown_rate", "rule_followed_rate"):
            return f"{value:.0%}"
        if isinstance(value, float):
            return f"{value:.3f}"
        if isinstance(value, int):
            return f"{value:,}"
        return html.escape(str(value))

    head = "".join(f"<th>{html.escape(c)}</th>" for c, _ in cols)
    body = "".join("<tr>" + "".join(f"<td>{cell(k, r[k])}</td>" for _, k in cols) + "</tr>" for r in rows)
    settings = "".join(
        f"<li>{html.escape(r['label'])}: {html.escape(r['env'])}, llm {html.escape(r['llm'])}, N={r['instances']}, S={r['stages']}, k={r['attempts']}, "
        f"{r['eval_episodes']} eval episodes, run dir <code>{html.escape(r['run_dir'])}</code></li>"
        for r in rows
    )
    images = "".join(f'<figure><img alt="{html.escape(n)}" src="data:image/png;base64,{b}"><figcaption>{html.escape(n)}</figcaption></figure>' for n, b in figs.items())
    mem = "".join(f"<h3>{html.escape(label)}</h3><pre>{html.escape(md)}</pre>" for label, md in memories.items())
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>FORGE report</title><style>{REPORT_CSS}</style></head><body>"
        f"<h1>FORGE report</h1><p class='verdict'><strong>{html.escape(verdict)}</strong></p><ul>{settings}</ul><table><tr>{head}</tr>{body}</table>"
        "<p><small>* fallback reflections: failures the LLM's reflection could not turn into a usable rule (no valid answer, or a rule "
        "the check refused), so the rule was derived from the trajectory instead. Rule shown: evaluation decisions with a rule for "
        "their situation in the prompt; followed: of those, the ones whose action the rule allowed.</small></p>"
        f"<h2>Figures</h2><div class='figs'>{images}</div><h2>Final champion memory</h2>{mem}"
        f"<h2>Which memories drove which actions (champion's evaluation)</h2>"
        f"{''.join(_decisions_html(k, v) for k, v in (drove or {}).items()) or '<p>(no recorded decisions)</p>'}</body></html>"
    )


def build_report(run_dirs: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write summary.json, report.html and memory.md for ``run_dirs`` into ``out_dir``."""
    if not run_dirs:
        raise ConfigError("build_report needs at least one run directory")
    runs = [load_run(d) for d in run_dirs]
    seen: dict[str, int] = {}
    for run in runs:  # disambiguate equal labels by run directory name
        seen[run["label"]] = seen.get(run["label"], 0) + 1
    used: set[str] = set()
    for n, run in enumerate(runs, 1):
        if seen[run["label"]] > 1:
            run["label"] = f"{run['label']} ({Path(run['run_dir']).name})"
        if run["label"] in used:
            run["label"] = f"{run['label']} #{n}"
        used.add(run["label"])
    rows = [_summary_row(r) for r in runs]
    figs = _figures(runs, rows)
    memories = {
        r["label"]: memory_markdown(r["champion"]["memory"], title=f"{r['label']}: champion inst-{r['champion']['instance']}")
        for r in runs
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "summary.json", "html": out / "report.html", "markdown": out / "memory.md"}
    drove = {r["label"]: decisions(r) for r in runs}
    line = verdict(rows, runs)
    summary: dict[str, Any] = {"verdict": line, "differences": differences(runs), "runs": rows, "decisions": drove}
    if len(rows) > 1:
        summary["ratios"] = _ratios(rows)
    paths["json"].write_text(json.dumps(summary, indent=2), encoding="utf-8")
    paths["html"].write_text(_html(rows, figs, memories, drove, verdict=line), encoding="utf-8")
    paths["markdown"].write_text("\n\n".join(memories.values()), encoding="utf-8")
    return paths


def _ratios(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean-return ratios of every run against the zero-shot and reflexion runs present."""
    out: dict[str, Any] = {}
    for base in ("zero-shot", "reflexion"):
        ref = next((r for r in rows if r["condition"] == base), None)
        if ref is None:
            continue
        for r in rows:
            if r is ref:
                continue
            out[f"{r['label']} / {ref['label']}"] = _ratio(r["mean_return"], ref["mean_return"])
    return out


def _ratio(a: float, b: float) -> float | None:
    """a / b, or None when b is zero (a ratio of returns near zero says nothing)."""
    return None if b == 0 else a / b
