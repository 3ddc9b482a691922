"""Online learning as a user would run it: 3 agents in their own processes, FORGE over REST.

Each agent is :mod:`bench/online_agent.py`, a small loop that uses only FORGE's REST client.
The model is FORGE's embedded one behind an OpenAI-compatible endpoint
(:mod:`bench/llm_server.py`, started here unless ``--llm-url`` names one), which also serves
the FORGE server's reflection (``forge serve --llm openai:forge-local``). The stream is
distinct tasks that no run trained on: TextWorld games of two families and database
diagnosis on the local PostgreSQL, from seed 3000 on (training seeds are 0-99, held-out
1000-1099); task ``i`` goes to agent ``i % 3``, in an order drawn from the run seed.

Modes (a fresh server and database each): ``none`` (no memory), ``raw`` (episodes stored
and recalled, shared in the agents' group; no reflection, no credit), ``isolated``
(learning; each agent in a group of its own), ``shared`` (learning; the three in one group).
``--poison`` repeats the learning modes with the third agent lying about its outcomes
(``online_agent.py --poisoned``).

    python bench/online.py --llm test --quick --json       # plumbing smoke run (scripted model, FrozenLake)
    python bench/online.py --json                           # 42 tasks, 4 modes, run seeds 0,1,2 (hours on 2 cores)
    python bench/online.py --modes none,shared --tasks 12 --run-seeds 0
    python bench/online.py --poison --modes shared
    python bench/online.py --llm-url http://127.0.0.1:8766/v1  # a model already served

Reports per mode: success and tokens per task along the stream (``--plot``, a PNG), the last
half's success pooled over run seeds with a 95% Wilson interval and per run seed, agent
tokens per task and the reflection's tokens per task, what learning did (learned, shared,
credited, retired), and the issue's targets beside the measured ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
MODES = ("none", "raw", "isolated", "shared")
ENVS = ("textworld:coin-1", "textworld:treasure-1", "postgres-diagnosis")
QUICK_ENVS = ("frozenlake-random-4x4",)
#: Stream seeds start here: no run trains on them (TextWorld trains on 0-99 and judges on 1000-1099).
FIRST_SEED = 3000
AGENTS = ("agent-1", "agent-2", "agent-3")
TARGETS = {"shared_vs_none": 1.3, "shared_vs_isolated": 1.0, "tokens_vs_none": 0.9, "failing_retired": 0.9,
           "poisoned_vs_clean": 0.9, "poisoned_units_retired": 1.0}
#: A learned unit "keeps failing" once it failed this often and at least twice as often as it helped.
FAILING_AFTER = 3


def stream(envs: Sequence[str], n: int, run_seed: int) -> list[dict[str, Any]]:
    """``n`` distinct tasks, the envs in turn, each env's seeds from :data:`FIRST_SEED` on,
    in an order drawn from ``run_seed``; task ``i`` goes to agent ``i % 3``."""
    tasks = [{"env": envs[i % len(envs)], "seed": FIRST_SEED + i // len(envs)} for i in range(n)]
    random.Random(f"online:{run_seed}").shuffle(tasks)
    return [{"index": i, **t, "agent": AGENTS[i % len(AGENTS)]} for i, t in enumerate(tasks)]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], *, patience_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it answered; see {log}:\n{log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code < 500:
                return
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not answer at {url} within {patience_s:.0f}s; see {log}")


@contextlib.contextmanager
def _process(cmd: list[str], log: Path, *, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _forge(db: Path, *args: str, embedder: str | None) -> list[str]:
    cmd = [sys.executable, "-c", "from forge.cli import main; main()", "--db", str(db)]
    return [*cmd, *(["--embedder", embedder] if embedder else []), *args]


def _key(db: Path, embedder: str | None, *, agent: str = "", groups: Sequence[str] = (), admin: bool = False) -> str:
    args = ["keys", "create", "--json", "--rate", "1000"]
    args += ["--admin"] if admin else ["--agent", agent, *(x for g in groups for x in ("--group", g))]
    out = subprocess.run(_forge(db, *args, embedder=embedder), check=True, capture_output=True, text=True).stdout
    return str(json.loads(out)["key"])


def _llm_stats(llm_url: str) -> dict[str, Any]:
    base = llm_url.rstrip("/").removesuffix("/v1")
    try:
        return httpx.get(f"{base}/stats", timeout=30.0).json()
    except (httpx.HTTPError, ValueError):
        return {}


def run_mode(mode: str, run_seed: int, tasks: list[dict[str, Any]], args: argparse.Namespace, root: Path, llm_url: str,
             *, poisoned: bool = False) -> dict[str, Any]:
    """One mode on one run seed: a fresh server and database, three agent processes, then what
    the server's memory says learning did."""
    work = root / f"seed{run_seed}-{mode}{'-poisoned' if poisoned else ''}"
    work.mkdir(parents=True, exist_ok=True)
    db = work / "memory.db"
    groups = {a: (["fleet"] if mode in ("shared", "raw") else [f"solo-{a}"]) for a in AGENTS}
    before = _llm_stats(llm_url)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        server_url, admin = "", ""
        keys: dict[str, str] = {}
        if mode != "none":
            admin = _key(db, args.embedder, admin=True)
            keys = {a: _key(db, args.embedder, agent=a, groups=groups[a]) for a in AGENTS}
            port = _free_port()
            server_url = f"http://127.0.0.1:{port}"
            env = {**os.environ, "FORGE_LLM_BASE_URL": llm_url}
            log = work / "server.log"
            proc = stack.enter_context(_process(_forge(db, "serve", "--port", str(port), "--runs", str(work), "--llm", "openai:forge-local",
                                                       "--no-mcp", embedder=args.embedder), log, env=env))
            _wait_http(f"{server_url}/v1/health", proc, patience_s=180, what="forge serve", log=log)
        agents = []
        for i, a in enumerate(AGENTS):
            mine = [{**t, "group": groups[a][0] if mode == "raw" else ""} for t in tasks if t["agent"] == a]
            (work / f"{a}.tasks.json").write_text(json.dumps(mine))
            bad = poisoned and i == len(AGENTS) - 1
            cmd = [sys.executable, str(HERE / "online_agent.py"), "--server", server_url or "http://127.0.0.1:9", "--key", keys.get(a, "-"),
                   "--agent", a, "--llm-url", llm_url, "--mode", mode, "--tasks", str(work / f"{a}.tasks.json"),
                   "--out", str(work / f"{a}.jsonl"), "--seed", str(run_seed), "--temperature", str(args.temperature),
                   *(["--poisoned"] if bad else []), *(["--max-steps", str(args.max_steps)] if args.max_steps else [])]
            agents.append(stack.enter_context(_process(cmd, work / f"{a}.log")))
        deadline = time.monotonic() + args.timeout
        for a, proc in zip(AGENTS, agents, strict=True):
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"  {mode} seed {run_seed}: {a} ran past --timeout {args.timeout}s; its tasks so far are counted", file=sys.stderr)
        memory = learned_report(server_url, admin) if mode in ("isolated", "shared") else {}
    rows, jobs = [], []
    for a in AGENTS:
        path = work / f"{a}.jsonl"
        for line in path.read_text().splitlines() if path.exists() else ():
            rec = json.loads(line)
            if rec.get("summary"):
                jobs.extend(rec.get("jobs", []))
            else:
                rows.append(rec)
    rows.sort(key=lambda r: r["index"])
    after = _llm_stats(llm_url)
    reflection = _delta(before, after, "-")
    return {"mode": mode, "run_seed": run_seed, "poisoned": poisoned, "rows": rows, "jobs": _jobs(jobs), "memory": memory,
            "reflection_tokens": reflection, "seconds": round(time.perf_counter() - started, 1), "dir": str(work)}


def _delta(before: dict[str, Any], after: dict[str, Any], user: str) -> int:
    def tot(s: dict[str, Any]) -> int:
        row = (s.get("by_user") or {}).get(user) or {}
        return int(row.get("prompt_tokens", 0)) + int(row.get("completion_tokens", 0))

    return tot(after) - tot(before)


def _jobs(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    status: dict[str, int] = {}
    learned = credited = retired = 0
    shared: dict[str, int] = {}
    for j in jobs:
        status[str(j.get("status"))] = status.get(str(j.get("status")), 0) + 1
        res = j.get("result") or {}
        learned += len(res.get("learned") or ())
        credited += len(res.get("credited") or ())
        retired += len(res.get("retired") or ())
        for s in res.get("shared") or ():
            shared[str(s.get("outcome"))] = shared.get(str(s.get("outcome")), 0) + 1
    return {"jobs": len(jobs), "status": status, "learned": learned, "credited": credited, "retired": retired, "shared": shared}


def learned_report(server_url: str, admin: str) -> dict[str, Any]:
    """What the server's memory holds after a learning mode (read with the admin key)."""
    from forge import Filter
    from forge.client import Client
    from forge.errors import ForgeError

    try:
        with contextlib.closing(Client(server_url, admin, timeout=120.0)) as c:
            units = c.list(filter=Filter.make(kinds=["rule", "lesson", "procedure"], status=["active", "archived", "superseded", "quarantined"]),
                           limit=1000)
    except ForgeError as exc:
        return {"error": str(exc)}
    learned = [u for u in units if u.provenance.source.startswith(("learned:", "reflection"))]
    copies = [u for u in units if u.provenance.source.startswith("broadcast:")]
    failing = [u for u in units if u.counts.failures >= FAILING_AFTER and u.counts.failures >= 2 * u.counts.successes]
    poisoned = [u for u in units if u.provenance.source == f"learned:{AGENTS[-1]}" or u.meta.get("origin") == AGENTS[-1]]
    gone = ("archived", "quarantined", "superseded")
    return {
        "learned": len(learned), "copies": len(copies), "active": sum(u.status.value == "active" for u in units),
        "retired": sum(u.status.value == "archived" for u in units), "quarantined": sum(u.status.value == "quarantined" for u in units),
        "failing": len(failing), "failing_retired": sum(u.status.value in gone for u in failing),
        "from_agent_3": len(poisoned), "from_agent_3_retired": sum(u.status.value in gone for u in poisoned),
        "examples": [{"content": u.content[:200], "status": u.status.value, "source": u.provenance.source, "uses": u.counts.uses,
                      "successes": u.counts.successes, "failures": u.counts.failures} for u in learned[:5]],
    }


def summarise(runs: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Per mode (and poisoning): the last half's success pooled over run seeds, with a 95%
    Wilson interval and each seed's own, tokens per task, and learning's bookkeeping."""
    half = n // 2
    out: dict[str, Any] = {}
    for key in dict.fromkeys((r["mode"], r["poisoned"]) for r in runs):
        mine = [r for r in runs if (r["mode"], r["poisoned"]) == key]
        last = [row for r in mine for row in r["rows"] if row["index"] >= half]
        k, m = sum(bool(row.get("success")) for row in last), len(last)
        every = [row for r in mine for row in r["rows"]]
        played = max(1, len(every))
        per_seed = {r["run_seed"]: _rate([row for row in r["rows"] if row["index"] >= half]) for r in mine}
        mem = [r["memory"] for r in mine if r["memory"] and "error" not in r["memory"]]
        failing = sum(x["failing"] for x in mem)
        bad = sum(x["from_agent_3"] for x in mem)
        out[f"{key[0]}{'+poison' if key[1] else ''}"] = {
            "mode": key[0], "poisoned": key[1], "run_seeds": [r["run_seed"] for r in mine],
            "last_half_success": k / m if m else None, "last_half_ci95": wilson(k, m), "last_half_n": m, "per_seed": per_seed,
            "success": _rate(every), "tokens_per_task": sum(row.get("tokens", 0) for row in every) / played,
            "reflection_tokens_per_task": sum(r["reflection_tokens"] for r in mine) / played,
            "errors": sum(1 for row in every if row.get("error")), "learn_errors": sum(1 for row in every if row.get("learn_error")),
            "tasks_played": len(every),
            "jobs": _merge([r["jobs"] for r in mine]),
            "failing": failing, "failing_retired": sum(x["failing_retired"] for x in mem) / failing if failing else None,
            "from_agent_3": bad, "from_agent_3_retired": sum(x["from_agent_3_retired"] for x in mem) / bad if bad else None,
            "seconds": sum(r["seconds"] for r in mine),
        }
    return out


def _rate(rows: list[dict[str, Any]]) -> float | None:
    return sum(bool(r.get("success")) for r in rows) / len(rows) if rows else None


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs": 0, "learned": 0, "credited": 0, "retired": 0, "status": {}, "shared": {}}
    for p in parts:
        for k in ("jobs", "learned", "credited", "retired"):
            out[k] += p.get(k, 0)
        for k in ("status", "shared"):
            for kk, v in (p.get(k) or {}).items():
                out[k][kk] = out[k].get(kk, 0) + v
    return out


def targets(modes: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets beside what was measured; None where a mode needed was not run."""
    def get(name: str, field: str) -> float | None:
        return (modes.get(name) or {}).get(field)

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    measured = {
        "shared_vs_none": ratio(get("shared", "last_half_success"), get("none", "last_half_success")),
        "shared_vs_isolated": ratio(get("shared", "last_half_success"), get("isolated", "last_half_success")),
        "tokens_vs_none": ratio(get("shared", "tokens_per_task"), get("none", "tokens_per_task")),
        "failing_retired": get("shared", "failing_retired"),
        "poisoned_vs_clean": ratio(get("shared+poison", "last_half_success"), get("shared", "last_half_success")),
        "poisoned_units_retired": get("shared+poison", "from_agent_3_retired"),
    }
    met = {k: None if v is None else (v <= TARGETS[k] if k == "tokens_vs_none" else v >= TARGETS[k]) for k, v in measured.items()}
    return {"targets": TARGETS, "measured": measured, "met": met, "missed": [k for k, v in met.items() if v is False],
            "not_measured": [k for k, v in met.items() if v is None]}


def plot(runs: list[dict[str, Any]], n: int, path: Path, window: int = 6) -> Path | None:
    """Success (a moving mean over ``window`` tasks) and tokens per task along the stream, per mode."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for key in dict.fromkeys((r["mode"], r["poisoned"]) for r in runs):
        mine = [r for r in runs if (r["mode"], r["poisoned"]) == key]
        label = key[0] + (" (poisoned)" if key[1] else "")
        succ, toks = [], []
        for i in range(n):
            rows = [row for r in mine for row in r["rows"] if row["index"] == i]
            succ.append(sum(bool(x.get("success")) for x in rows) / len(rows) if rows else math.nan)
            toks.append(sum(x.get("tokens", 0) for x in rows) / len(rows) if rows else math.nan)
        smooth = [_nanmean(succ[max(0, i - window + 1) : i + 1]) for i in range(n)]
        ax1.plot(range(n), smooth, label=label)
        ax2.plot(range(n), toks, label=label, alpha=0.8)
    ax1.axvline(n // 2, color="#999", lw=0.8, ls="--")
    ax1.set_ylabel(f"success (mean of last {window})")
    ax1.set_ylim(-0.05, 1.05)
    ax1.legend(fontsize=8)
    ax2.set_ylabel("agent tokens per task")
    ax2.set_xlabel("task in the stream")
    fig.suptitle("bench/online.py: 3 agents over REST")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _nanmean(xs: list[float]) -> float:
    vals = [x for x in xs if not math.isnan(x)]
    return sum(vals) / len(vals) if vals else math.nan


def render(result: dict[str, Any]) -> str:
    lines = [f"bench/online.py: {result['tasks']} tasks ({', '.join(result['envs'])}, seeds from {FIRST_SEED}), 3 agents, "
             f"llm {result['llm']}, run seeds {result['run_seeds']} ({result['seconds']:.0f}s)", "",
             f"{'mode':<16}{'last half':>10}{'95% CI':>16}{'n':>5}{'all':>7}{'tok/task':>10}{'refl tok/task':>15}{'learned':>9}{'retired':>9}{'errors':>8}"]
    for name, m in result["modes"].items():
        lh = m["last_half_success"]
        lo, hi = m["last_half_ci95"]
        lines.append(f"{name:<16}{'-' if lh is None else f'{lh:.0%}':>10}{f'{lo:.0%}-{hi:.0%}':>16}{m['last_half_n']:>5}"
                     f"{'-' if m['success'] is None else format(m['success'], '.0%'):>7}{m['tokens_per_task']:>10.0f}"
                     f"{m['reflection_tokens_per_task']:>15.0f}{m['jobs']['learned']:>9}{m['jobs']['retired']:>9}{m['errors']:>8}")
    t = result["targets"]
    lines.append("")
    for k, v in t["measured"].items():
        ok = t["met"][k]
        lines.append(f"  {k:<24} {'-' if v is None else f'{v:.2f}':>6}  target {'<=' if k == 'tokens_vs_none' else '>='} {TARGETS[k]}"
                     f"  {'not measured' if ok is None else 'met' if ok else 'MISSED'}")
    if result.get("plot"):
        lines.append(f"\nplot: {result['plot']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llm", default="local", help="what bench/llm_server.py serves: local (the 1.5B), local:smollm2, test (scripted)")
    ap.add_argument("--llm-url", default=None, help="an OpenAI-compatible endpoint already serving (then --llm is not started)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--envs", default=",".join(ENVS))
    ap.add_argument("--tasks", type=int, default=42, help="tasks in the stream (default 42: 14 of each env)")
    ap.add_argument("--run-seeds", default="0,1,2")
    ap.add_argument("--poison", action="store_true", help="also run the learning modes with agent-3 poisoned")
    ap.add_argument("--embedder", default=None, help="the server's embedder (default: FORGE's; hash for smoke runs)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-steps", type=int, default=None, help="steps a task may take (default: each env's own, 8-30)")
    ap.add_argument("--timeout", type=float, default=6 * 3600.0, help="seconds a mode's agents may take")
    ap.add_argument("--out", default=None, help="folder for the servers, logs and records (default: a temporary one)")
    ap.add_argument("--plot", default=None, help="PNG path (default: online.png in --out)")
    ap.add_argument("--quick", action="store_true", help="6 tasks of FrozenLake, run seed 0, hash embedder: a smoke run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.envs = ",".join(QUICK_ENVS) if args.envs == ",".join(ENVS) else args.envs
        args.tasks = 6 if args.tasks == 42 else args.tasks
        args.run_seeds = "0" if args.run_seeds == "0,1,2" else args.run_seeds
        args.embedder = args.embedder or "hash"
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := [m for m in modes if m not in MODES]:
        ap.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    try:
        seeds = [int(s) for s in args.run_seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--run-seeds takes integers like 0,1,2, got {args.run_seeds!r}")
    if args.tasks < len(AGENTS):
        ap.error(f"--tasks must be at least {len(AGENTS)}")
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="forge-online-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        llm_url = args.llm_url
        if llm_url is None:
            port = _free_port()
            log = root / "llm.log"
            proc = stack.enter_context(_process([sys.executable, str(HERE / "llm_server.py"), "--llm", args.llm, "--port", str(port)], log))
            llm_url = f"http://127.0.0.1:{port}/v1"
            _wait_http(f"{llm_url}/models", proc, patience_s=900, what="bench/llm_server.py", log=log)
        plan = [(m, False) for m in modes] + ([(m, True) for m in modes if m in ("isolated", "shared")] if args.poison else [])
        for seed in seeds:
            tasks = stream(envs, args.tasks, seed)
            for mode, poisoned in plan:
                print(f"run seed {seed}, {mode}{' (poisoned)' if poisoned else ''}: {len(tasks)} tasks ...", file=sys.stderr, flush=True)
                runs.append(run_mode(mode, seed, tasks, args, root, llm_url, poisoned=poisoned))
                r = runs[-1]
                print(f"  {sum(bool(x.get('success')) for x in r['rows'])}/{len(r['rows'])} succeeded, {r['seconds']}s", file=sys.stderr, flush=True)
        served = _llm_stats(llm_url)
    modes_out = summarise(runs, args.tasks)
    png = plot(runs, args.tasks, Path(args.plot) if args.plot else root / "online.png")
    total = served.get("total") or {}
    result = {
        "bench": "online", "llm": args.llm if args.llm_url is None else args.llm_url, "envs": envs, "tasks": args.tasks,
        "first_seed": FIRST_SEED, "run_seeds": seeds, "agents": list(AGENTS), "modes": modes_out, "targets": targets(modes_out),
        "served": {**total, "tokens_per_s": (total.get("prompt_tokens", 0) + total.get("completion_tokens", 0)) / total["busy_seconds"]
                   if total.get("busy_seconds") else None},
        "plot": str(png) if png else None, "out": str(root), "seconds": round(time.perf_counter() - started, 1), "runs": runs,
    }
    (root / "online.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
