"""How fast is each embedded LLM, and does it follow a rule in its prompt? Side by side.

    python bench/llm_speed.py                       # local (Qwen2.5-Coder-1.5B) and local:smollm2
    python bench/llm_speed.py --models local:smollm2 --runs 2 --json
    python bench/llm_speed.py --models local:/path/model.gguf --threads 1 --verbose

For each model it measures:

* ms per action choice (``forge.llm.structured.choose`` over 4 actions) with a *fresh* prompt
  prefix (the system prompt and memory block change, so llama.cpp evaluates all of it) and
  with a *cached* prefix (same system prompt and memory, a new observation: llama.cpp keeps
  the KV cache of the common token prefix and evaluates only the new tail). This is why
  FORGE keeps the memory block byte-identical across the steps of an episode.
* generation tokens/s on a cached prompt (so the figure is decoding, not prompt evaluation);
* the rule-compliance probe of issue 8: 12 situations (grid worlds, games, operations), each
  with one right action that goes against what the model would pick on its own. With rules,
  the system prompt holds the rule naming that action plus three distractor rules about other
  situations; without, it holds none. "followed" counts right actions with the rules,
  "without" counts right actions without them. A model that uses its memory scores well
  above its "without".

Prints, never asserts: the timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from forge.llm import Message, Request, choose, open_llm

GRID = ["left", "down", "right", "up"]
COMPASS = ["go north", "go south", "go east", "go west"]


@dataclass(frozen=True)
class Situation:
    name: str
    task: str  # the system prompt's description of the environment
    observation: str
    options: list[str]
    right: str
    rule: str  # names ``right`` for exactly this situation
    distractors: tuple[str, str, str]  # rules about other situations, naming other actions


SITUATIONS = [
    Situation(
        "frozenlake-hole",
        "You walk on a 4x4 frozen lake from row 0, col 0 to the goal at row 3, col 3. "
        "Some tiles are holes.",
        "You are at row 2, col 1. The goal is at row 3, col 3, below and to your right.",
        GRID,
        "up",
        "When you are at row 2, col 1, move up: the tiles below and to the right are holes.",
        (
            "When you are at row 0, col 3, move down.",
            "When you are at row 1, col 0, move right.",
            "When you are at row 3, col 2, move left.",
        ),
    ),
    Situation(
        "cliffwalking-start",
        "You walk on a 4x12 grid from the start at row 3, col 0 to the goal at row 3, col 11.",
        "You are at the start, row 3, col 0. The goal is straight to your right on row 3.",
        GRID,
        "up",
        "When you are at row 3, col 0, move up: every tile to the right on row 3 is a cliff.",
        (
            "When you are at row 2, col 11, move down.",
            "When you are at row 0, col 5, move right.",
            "When you are at row 2, col 0, move left.",
        ),
    ),
    Situation(
        "slippery-goal",
        "You walk on a slippery 4x4 frozen lake: a move may slide you sideways.",
        "You are at row 3, col 2. The goal is at row 3, col 3, right next to you.",
        GRID,
        "down",
        "When you are at row 3, col 2, move down: it slides you into the goal, while right "
        "can slide you up into a hole.",
        (
            "When you are at row 0, col 0, move right.",
            "When you are at row 2, col 3, move left.",
            "When you are at row 1, col 2, move up.",
        ),
    ),
    Situation(
        "dragon",
        "You explore a cave and must reach the exit alive.",
        "The exit is to the north. A sleeping dragon lies to the north, between you and the "
        "exit. Tunnels lead east, west and south.",
        COMPASS,
        "go east",
        "When a dragon lies between you and the northern exit, go east: a side tunnel leads "
        "around it.",
        (
            "When a river blocks the west, go south.",
            "When you hear bats in the east, go west.",
            "When the exit is to the south, go south.",
        ),
    ),
    Situation(
        "guarded-door",
        "You are a thief in a castle. Get through the locked door without being caught.",
        "You stand in front of a locked door. A key lies on the floor beside you. A guard is "
        "awake in the next room.",
        ["open door", "pick up key", "go north", "wait"],
        "wait",
        "When a guard is awake in the next room, wait: he falls asleep a few turns later.",
        (
            "When the door is open, go north.",
            "When the key is in your hand and the guards sleep, open door.",
            "When the corridor is dark, pick up key.",
        ),
    ),
    Situation(
        "checkout-crashloop",
        "You are the on-call engineer for an online shop.",
        "The checkout service has crashed every 30 seconds since a deploy ten minutes ago. "
        "CPU and memory look normal.",
        ["restart the service", "roll back the last deploy", "scale out", "page the database team"],
        "page the database team",
        "When checkout crash-loops after a deploy, page the database team: rolling checkout "
        "back corrupts the cart database.",
        (
            "When latency rises with traffic, scale out.",
            "When a service leaks memory slowly, restart the service.",
            "When a config change breaks login, roll back the last deploy.",
        ),
    ),
    Situation(
        "disk-full",
        "You are the on-call engineer for a company's databases.",
        "Alert: disk usage on db-1 is at 95% and rising. Most of the space is old log files.",
        ["delete old log files", "expand the volume", "restart the database", "ignore the alert"],
        "expand the volume",
        "When db-1's disk fills up, expand the volume: its old log files are kept for audits.",
        (
            "When the database refuses connections, restart the database.",
            "When a test server's disk alert fires at night, ignore the alert.",
            "When app-2's disk fills with old logs, delete old log files.",
        ),
    ),
    Situation(
        "cpu-night",
        "You are the on-call engineer for a website.",
        "CPU on web-3 has been at 100% since 02:00. Traffic is normal and pages load fine.",
        ["add more servers", "restart the web server", "kill the busy process", "do nothing"],
        "do nothing",
        "When web-3's CPU peaks after 02:00, do nothing: it is the nightly backup and it ends "
        "by itself.",
        (
            "When traffic doubles, add more servers.",
            "When a cron job loops for hours on app-1, kill the busy process.",
            "When the web server stops answering, restart the web server.",
        ),
    ),
    Situation(
        "failed-logins",
        "You are the security analyst of a small company.",
        "500 failed logins in one minute for the user alice, all from 10.0.0.1.",
        ["block the IP address", "reset the user's password", "disable the account", "ignore it"],
        "reset the user's password",
        "When failed logins come from 10.0.0.1, reset the user's password: 10.0.0.1 is the "
        "office VPN gateway and blocking it locks everyone out.",
        (
            "When an account logs in from two countries at once, disable the account.",
            "When an unknown external IP scans ports, block the IP address.",
            "When a single login fails, ignore it.",
        ),
    ),
    Situation(
        "cage-user2",
        "You defend a network of user hosts and servers against an attacker.",
        "User2 shows a new suspicious process. No other host is affected.",
        ["analyse the host", "remove the malware", "restore the host", "sleep"],
        "restore the host",
        "When User2 shows a suspicious process, restore the host: removing malware never "
        "cleans User2.",
        (
            "When no host shows anything suspicious, sleep.",
            "When an enterprise server shows new network connections, analyse the host.",
            "When a user host has a known user-level implant, remove the malware.",
        ),
    ),
    Situation(
        "slow-orders",
        "You are the database administrator of a PostgreSQL server.",
        "Queries on the table orders became ten times slower overnight. The plan shows a "
        "sequential scan on orders.",
        ["add an index", "run VACUUM ANALYZE", "increase work_mem", "kill the query"],
        "run VACUUM ANALYZE",
        "When queries on orders turn slow overnight, run VACUUM ANALYZE: the index exists but "
        "the statistics are stale.",
        (
            "When a sort spills to disk, increase work_mem.",
            "When a report query blocks writers for minutes, kill the query.",
            "When a new filter column has no index, add an index.",
        ),
    ),
    Situation(
        "supplier-strike",
        "You manage the stock of a warehouse.",
        "Stock of item A is below its reorder point. Its usual supplier is on strike this week.",
        ["reorder now", "wait", "switch supplier", "cancel customer orders"],
        "wait",
        "When item A runs low during a supplier strike, wait: the strike ends before the stock "
        "runs out and other suppliers charge triple.",
        (
            "When a customer cancels in bulk, cancel customer orders.",
            "When item B falls below its reorder point, reorder now.",
            "When a supplier fails a quality inspection, switch supplier.",
        ),
    ),
]


def _system(situation: Situation, with_rules: bool, index: int) -> str:
    text = f"{situation.task} Choose the best action."
    if not with_rules:
        return text
    rules = list(situation.distractors)
    rules.insert(index % 4, situation.rule)  # the right rule in every position, in turn
    return text + "\n\nRules learned from earlier episodes:\n" + "\n".join(f"- {r}" for r in rules)


VARIANTS = ("with", "without", "near")


def _messages(s: Situation, variant: str, index: int) -> list[Message]:
    """``with``: the 4 rules in the system prompt; ``without``: none; ``near``: the 4 rules
    and, as forge.learn.prompt does at each step, the matching rule repeated before the question."""
    system = Message("system", _system(s, variant != "without", index))
    if variant == "near":
        return [system, Message("user", f"Memory for this situation: {s.rule}\n\n{s.observation}")]
    return [system, Message("user", s.observation)]


def probe(
    llm: Any, *, variants: tuple[str, ...] = VARIANTS, verbose: bool = False
) -> dict[str, Any]:
    """Right actions per prompt variant over the 12 situations (see :func:`_messages`)."""
    rows = []
    for i, s in enumerate(SITUATIONS):
        row = {"situation": s.name, "right": s.right}
        for variant in variants:
            row[variant] = choose(llm, _messages(s, variant, i), s.options)
        rows.append(row)
        if verbose:
            picks = " ".join(f"{v}={row[v]!r}" for v in variants)
            print(f"  {s.name:<20} right={s.right!r:<28} {picks}", file=sys.stderr)
    out: dict[str, Any] = {"n": len(rows), "rows": rows}
    for variant in variants:
        out[variant] = sum(r[variant] == r["right"] for r in rows)
    return out


def _memory_block(n_rules: int) -> str:
    rules = [r for s in SITUATIONS for r in (s.rule, *s.distractors)]
    return "\n".join(f"- {rules[i % len(rules)]}" for i in range(n_rules))


def choice_latency(llm: Any, runs: int, n_rules: int) -> dict[str, Any]:
    """Median ms per choice with a fresh prefix and with a cached one, and the prompt sizes.

    Each run changes the first line of the system prompt (so nothing but the chat template's
    first tokens is shared with the previous call), times one choice, then times a second
    choice with the same system prompt and memory and a different observation.
    """
    memory = _memory_block(n_rules)
    fresh_ms, cached_ms = [], []
    steps = [
        "You are at row 1, col 2. The goal is at row 3, col 3.",
        "You are at row 2, col 2. The goal is at row 3, col 3.",
    ]

    def system(run: int) -> Message:
        return Message(
            "system",
            f"Episode {run + 1}: walk on a 4x4 frozen lake to the goal. Some tiles are holes.\n\n"
            f"Rules learned from earlier episodes:\n{memory}",
        )

    prompt_tokens = llm.count_tokens(system(0).content)
    choose(llm, [Message("system", "warm up"), Message("user", "go")], GRID)
    for run in range(runs):
        for step, bucket in zip(steps, (fresh_ms, cached_ms), strict=True):
            t = time.perf_counter()
            choose(llm, [system(run), Message("user", step)], GRID)
            bucket.append(1000 * (time.perf_counter() - t))
    return {
        "system_prompt_tokens": prompt_tokens,
        "fresh_ms": round(statistics.median(fresh_ms)),
        "cached_ms": round(statistics.median(cached_ms)),
    }


def generation_rate(llm: Any, runs: int, tokens: int) -> float:
    """Decoding tokens/s: the prompt is evaluated first by a 1-token call, so the timed call
    finds it in the KV cache and spends its time generating."""
    rates = []
    for run in range(runs):
        msgs = [Message("user", f"Write a short story about a robot who learns to garden ({run}).")]
        llm.complete(Request(messages=msgs, max_tokens=1))
        out = llm.complete(Request(messages=msgs, max_tokens=tokens))
        rates.append(out.completion_tokens / max(out.seconds, 1e-9))
    return round(statistics.median(rates), 1)


def measure(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    llm = open_llm(spec, n_threads=args.threads)
    try:
        t0 = time.perf_counter()
        llm.load()
        load_s = time.perf_counter() - t0
        if args.verbose:
            print(f"{llm.name}: loaded in {load_s:.1f} s", file=sys.stderr)
        result: dict[str, Any] = {
            "model": llm.name,
            "threads": llm.n_threads,
            "load_s": round(load_s, 1),
        }
        if not args.probe_only:
            result.update(choice_latency(llm, args.runs, args.memory_rules))
            result["gen_tokens_per_s"] = generation_rate(llm, args.runs, args.tokens)
        variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
        rules = probe(llm, variants=variants, verbose=args.verbose)
        result["probe_n"] = rules["n"]
        result.update({f"probe_{v}": rules[v] for v in variants})
        result["probe_rows"] = rules["rows"]
        return result
    finally:
        llm.close()


def table(results: list[dict[str, Any]]) -> str:
    def get(key: str, fmt: str = "{}") -> Any:
        return lambda r: fmt.format(r[key]) if key in r else "-"

    def score(key: str) -> Any:
        return lambda r: f"{r[key]}/{r['probe_n']}" if key in r else "-"

    rows = [
        ("threads", get("threads")),
        ("load (s)", get("load_s", "{:.1f}")),
        ("system prompt (tokens)", get("system_prompt_tokens")),
        ("choice, fresh prefix (ms)", get("fresh_ms")),
        ("choice, cached prefix (ms)", get("cached_ms")),
        ("generation (tokens/s)", get("gen_tokens_per_s", "{:.1f}")),
        ("probe: followed the rule (rules in system prompt)", score("probe_with")),
        ("probe: followed, rule also repeated before the question", score("probe_near")),
        ("probe: right without rules", score("probe_without")),
    ]
    head = ["", *(r["model"] for r in results)]
    body = [[label, *(fmt(r) for r in results)] for label, fmt in rows]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        default="local,local:smollm2",
        help="comma-separated LLM specs (default: local,local:smollm2)",
    )
    parser.add_argument("--threads", type=int, default=None, help="default: every usable CPU")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per figure (median)")
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per run")
    parser.add_argument(
        "--memory-rules",
        type=int,
        default=24,
        help="rules in the memory block of the latency prompt",
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="probe prompt variants: with, without, near (default: all)",
    )
    parser.add_argument("--probe-only", action="store_true", help="skip the timings")
    parser.add_argument("--verbose", action="store_true", help="per-situation picks on stderr")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    results = [measure(spec.strip(), args) for spec in args.models.split(",") if spec.strip()]
    if args.json:
        print(json.dumps({"models": results}))
    else:
        print(table(results))


if __name__ == "__main__":
    main()
