"""How fast is each embedded LLM per decision, and does it follow a rule in its prompt? Side by side.

    python bench/llm_speed.py                       # local (Qwen2.5-Coder-1.5B) and local:smollm2
    python bench/llm_speed.py --models local:smollm2 --runs 2 --json
    python bench/llm_speed.py --models local --prefixes 300 --skip probe --verbose
    python bench/llm_speed.py --models local --only tokens --json     # new tokens per decision, no inference

For each model, and for each way of answering a choice (``score``: the options scored from the
logits of one forward pass; ``grammar``: the option generated under a grammar), it measures:

* ms per decision after a static prefix of ~300 and ~2,000 tokens (system prompt, option list,
  memory block; then a one-line observation): *fresh* (a prefix never seen: all of it is
  evaluated), *restored* (seen before, then pushed out of llama.cpp's KV cache by another
  prompt: its saved state is restored, see forge.llm.states) and *cached* (still in the KV
  cache: only the observation is evaluated). Wall time and the process's CPU time
  (``time.process_time``: every llama.cpp thread), since the machine may be shared; tokens per
  decision (prompt, evaluated, decoded after the prompt).
* a CAGE-2-sized decision: FORGE's flat policy over the 145 CAGE-2 blue actions (CybORG's
  action grammar in the task text, as forge.envs.cyborg writes it), ~450 prompt tokens, one
  episode of steps: the first step (static prefix fresh) and the p50 of the others (cached);
* generation tokens/s on a cached prompt (decoding, not prompt evaluation);
* new prompt tokens per decision (issue 51's floor: a decision costs its new tokens times the
  per-token cost, plus one forward pass), counted, not timed: the project's own prompts
  (forge.learn, zero-shot memory) for FrozenLake (random 4x4 maps), TextWorld (coin-1) and
  CAGE-2 (CybORG's task text and 145 actions; observations written as forge.envs.cyborg
  writes them, without CybORG), each decision answered by a seeded random stand-in, its
  prompt tokenized by the model's own chat template (loaded vocabulary-only) and charged
  what LlamaCppLLM would evaluate: all but what the KV cache holds from the previous prompt
  or a saved state of a static prefix restores. Beside each, issue 51's target;
* the rule-compliance probe of issue 8: 12 situations (grid worlds, games, operations), each
  with one right action that goes against what the model would pick on its own. With rules,
  the system prompt holds the rule naming that action plus three distractor rules about other
  situations; without, it holds none. "followed" counts right actions with the rules,
  "without" counts right actions without them. A model that uses its memory scores well
  above its "without". Run for both choice modes.

It reports the load average before and after, and the CPUs other processes kept busy when it
started, so a figure from a shared machine says so. Prints, never asserts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from forge.envs.base import EnvSpec
from forge.errors import ForgeError
from forge.learn.policy import FlatPolicy
from forge.llm import Message, Request, choose, open_llm
from forge.llm.local import CHOICE_MODES, busy_cpus

SECTIONS = ("prefix", "cage", "gen", "probe", "tokens")
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


def _timed(llm: Any, messages: list[Message], options: list[str]) -> dict[str, Any]:
    """One decision as the policies ask for it (options in the system prompt, enforced by the
    backend), timed in wall and CPU time."""
    request = Request(messages=messages, choices=options, max_tokens=24)
    cpu, wall = time.process_time(), time.perf_counter()
    out = llm.complete(request)
    return {
        "wall_ms": 1000 * (time.perf_counter() - wall),
        "cpu_ms": 1000 * (time.process_time() - cpu),
        "prompt_tokens": out.prompt_tokens,
        "evaluated_tokens": out.prompt_tokens - out.meta.get("cached_tokens", 0),
        "decoded_tokens": out.completion_tokens,
        "prefix": out.meta.get("prefix"),
        "answer": out.text,
    }


def _median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: round(statistics.median(r[k] for r in rows)) for k in ("wall_ms", "cpu_ms", "prompt_tokens", "evaluated_tokens", "decoded_tokens")}
    out["prefix"] = "/".join(sorted({str(r["prefix"]) for r in rows}))
    return out


_STEPS = [
    "You are at row 1, col 2. The goal is at row 3, col 3.",
    "You are at row 2, col 2. The goal is at row 3, col 3.",
    "You are at row 0, col 1. The goal is at row 3, col 3.",
]


def prefix_latency(llm: Any, runs: int, target: int, mode: str) -> dict[str, Any]:
    """Median decision cost after a static prefix of about ``target`` tokens: fresh, restored
    and cached (see the module docstring). Each run starts a prefix no earlier run used."""
    llm.choice_mode = mode
    rules = [_memory_block(n) for n in range(1, 400)]
    base = "Walk on a 4x4 frozen lake to the goal. Some tiles are holes. Valid actions: left, down, right, up."
    n_rules = next(i for i, block in enumerate(rules, 1) if llm.count_tokens(f"{base}\n{block}") >= target - 30)

    def system(tag: str) -> Message:
        return Message("system", f"Run {tag}. {base}\n\nRules learned from earlier episodes:\n{_memory_block(n_rules)}")

    buckets: dict[str, list[dict[str, Any]]] = {"fresh": [], "restored": [], "cached": []}
    for run in range(runs):
        tag = f"{mode}-{target}-{run}-{time.time_ns()}"
        buckets["fresh"].append(_timed(llm, [system(tag), Message("user", _STEPS[0])], GRID))
        # another prompt takes llama.cpp's KV cache, as another role or a reflection would
        _timed(llm, [Message("system", "You sort fruit. Answer with one option."), Message("user", f"An apple, run {run}.")], ["keep", "drop"])
        buckets["restored"].append(_timed(llm, [system(tag), Message("user", _STEPS[1])], GRID))
        buckets["cached"].append(_timed(llm, [system(tag), Message("user", _STEPS[2])], GRID))
    return {"static_tokens": llm.count_tokens(system("x").content), **{k: _median(v) for k, v in buckets.items()}}


# -- a CAGE-2-sized decision -----------------------------------------------------------------

_CAGE_HOSTS = ["Defender", "Enterprise0", "Enterprise1", "Enterprise2", "Op_Host0", "Op_Host1", "Op_Host2", "Op_Server0", "User0", "User1", "User2", "User3", "User4"]
_CAGE_VERBS = ["analyse", "remove", "decoy_apache", "decoy_femitter", "decoy_haraka_smpt", "decoy_smss", "decoy_sshd", "decoy_svchost", "decoy_tomcat", "decoy_vsftpd", "restore"]
CAGE_ACTIONS = ["sleep", "monitor", *(f"{v} {h}" for v in _CAGE_VERBS for h in _CAGE_HOSTS)]  # 145
_CAGE_OBS = [
    "Step {n} of 30. Activity: none; compromised: none.\nLast step: the episode has just started.",
    "Step {n} of 30. Activity: scan User1; compromised: none.\nLast step: sleep succeeded, reward 0.0.",
    "Step {n} of 30. Activity: exploit User1; compromised: User1 user.\nLast step: monitor succeeded, reward 0.0.",
    "Step {n} of 30. Activity: scan Enterprise1; compromised: User1 user.\nLast step: remove User1 succeeded, reward -0.1.",
    "Step {n} of 30. Activity: exploit Enterprise1; compromised: User1 unknown, Enterprise1 user.\nLast step: analyse User1 succeeded, reward -0.1.",
    "Step {n} of 30. Activity: none; compromised: Enterprise1 privileged.\nLast step: remove Enterprise1 failed, reward -1.0.",
]


def cage_spec() -> EnvSpec:
    """CAGE-2's task text as forge.envs.cyborg writes it, without CybORG installed: its
    ``_describe`` needs only the action names."""
    from forge.envs.cyborg import CybORGCage2Env

    text = CybORGCage2Env._describe(SimpleNamespace(_actions=dict.fromkeys(CAGE_ACTIONS)))  # type: ignore[arg-type]
    return EnvSpec(
        name="cyborg-cage2", description=text, max_steps=30, tau=-1.1, theta=-15.0,
        success_return=-10.0, major_failure_return=-100.0, actions_in_description=True,
    )


def cage_decision(llm: Any, steps: int, mode: str) -> dict[str, Any]:
    """One episode's decisions through FlatPolicy (zero-shot memory): the first step finds the
    static prefix fresh (or restored, when an earlier run in this process saved it), the rest
    find it in the KV cache."""
    llm.choice_mode = mode
    seen: list[dict[str, Any]] = []

    class Timed:
        """The role LLM the policy calls, recording each decision's cost."""

        name, capabilities = llm.name, llm.capabilities

        def complete(self, request: Request) -> Any:
            cpu, wall = time.process_time(), time.perf_counter()
            out = llm.complete(request)
            seen.append({
                "wall_ms": 1000 * (time.perf_counter() - wall), "cpu_ms": 1000 * (time.process_time() - cpu),
                "prompt_tokens": out.prompt_tokens, "decoded_tokens": out.completion_tokens, "prefix": out.meta.get("prefix"),
                "evaluated_tokens": out.prompt_tokens - out.meta.get("cached_tokens", 0),
            })
            return out

        def count_tokens(self, text: str) -> int:
            return llm.count_tokens(text)

    policy = FlatPolicy(llm=lambda role: Timed(), spec=cage_spec())  # type: ignore[arg-type,return-value]
    history: list[str] = []
    for n in range(steps):
        obs = _CAGE_OBS[n % len(_CAGE_OBS)].format(n=n)
        history.append(policy.act(observation=obs, valid_actions=CAGE_ACTIONS, history=history, memory={}).action)
    return {"options": len(CAGE_ACTIONS), "first": _median(seen[:1]), "steady": _median(seen[1:]), "actions": history}


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


# -- new prompt tokens per decision (issue 51) ------------------------------------------------

#: Issue 51's targets: new prompt tokens per decision, at most.
NEW_TOKEN_TARGETS = {"frozenlake-random-4x4": 50, "textworld:coin-1": 120}
TOKEN_ENVS = ("frozenlake-random-4x4", "textworld:coin-1", "cyborg-cage2")
_MIN_STATE_TOKENS = 32  # as forge.llm.local: shorter static prefixes get no saved state


class _Recorder:
    """The role LLM a policy calls: answers each choice at random (seeded), keeps each request."""

    capabilities = frozenset({"choices"})

    def __init__(self, counter: Any, seed: int) -> None:
        import random

        self.name = "bench:recorder"
        self.requests: list[Request] = []
        self._rng = random.Random(seed)
        self._counter = counter

    def complete(self, request: Request) -> Any:
        from forge.llm.base import Completion

        self.requests.append(request)
        text = self._rng.choice(list(request.choices)) if request.choices else ""
        return Completion(text=text, prompt_tokens=0, completion_tokens=0, model=self.name)

    def count_tokens(self, text: str) -> int:
        return self._counter.count_tokens(text)


def evaluated_tokens(prompts: list[tuple[list[int], int]]) -> list[int]:
    """What LlamaCppLLM evaluates for each prompt in turn (forge.llm.local ``_prepare``): all
    but what the KV cache still holds from the previous prompt, or, where more, a saved state
    of a static prefix seen before (saved once evaluated, if 32 tokens or longer). The last
    prompt token is always evaluated: its logits are read."""
    from forge.llm.states import common_prefix

    kv: list[int] = []
    saved: list[list[int]] = []
    out = []
    for tokens, static in prompts:
        limit = len(tokens) - 1
        live = min(common_prefix(kv, tokens), limit)
        static = min(static, limit)
        if static >= _MIN_STATE_TOKENS and live < static:
            best = max((common_prefix(s, tokens[:static]) for s in saved), default=0)
            if best >= live + _MIN_STATE_TOKENS:
                live = best
            if live < static:
                saved.append(tokens[:static])
        out.append(len(tokens) - live)
        kv = tokens
    return out


def _episodes_requests(env_name: str, counter: Any, episodes: int, steps: int, seed: int) -> tuple[list[Request], str]:
    """The actor requests of ``episodes`` zero-shot episodes of ``env_name``, as the protocols'
    workers write them (play_episode, recall from an empty memory, the flat policy)."""
    from forge.engine.embed import open_embedder
    from forge.engine.memory import Memory
    from forge.envs import make_env
    from forge.learn.loop import Recaller, play_episode
    from forge.learn.policy import make_policy
    from forge.model import Viewer
    from forge.protocols.episode import RUN_WEIGHTS
    from forge.store import open_store

    recorder = _Recorder(counter, seed)
    if env_name == "cyborg-cage2" and importlib.util.find_spec("CybORG") is None:
        # CybORG is not installed: its task text and actions, observations as the env writes them
        policy = make_policy("flat", llm=lambda role: recorder, spec=cage_spec())  # type: ignore[arg-type,return-value]
        for _ in range(episodes):
            history: list[str] = []
            for n in range(steps):
                obs = _CAGE_OBS[n % len(_CAGE_OBS)].format(n=n)
                history.append(policy.act(observation=obs, valid_actions=CAGE_ACTIONS, history=history, memory={}).action)
        return recorder.requests, "CybORG's task text and 145 actions; observations written as forge.envs.cyborg writes them"
    env = make_env(env_name, max_steps=steps)
    memory = Memory(open_store(":memory:"), open_embedder("hash"))
    try:
        recall = Recaller(memory, Viewer.of("inst-0"), budget=600, weights=RUN_WEIGHTS, valid_actions=env.valid_actions, abstract=env.spec.abstract)
        policy = make_policy("flat", llm=lambda role: recorder, spec=env.spec)  # type: ignore[arg-type,return-value]
        for n in range(episodes):
            play_episode(env, policy, recall, seed=seed + n, tau=float("-inf"), abort=False)
    finally:
        memory.close()
        env.close()
    return recorder.requests, "the env itself"


def new_tokens(spec: str, envs: Sequence[str], episodes: int, steps: int, seed: int = 0) -> dict[str, Any]:
    """New prompt tokens per decision for each env (see the module docstring): the first
    decision of the run (everything fresh) apart, then the median, mean and largest."""
    from forge.llm.local import LlamaCppLLM

    model = spec.partition(":")[2] or None
    path = model if model and model.endswith(".gguf") else None
    counter = LlamaCppLLM(model=None if path else model, model_path=path, vocab_only=True)
    try:
        out: dict[str, Any] = {}
        for env_name in envs:
            try:
                requests, source = _episodes_requests(env_name, counter, episodes, steps, seed)
            except (ImportError, ForgeError) as exc:  # an env whose extra is not installed
                out[env_name] = {"skipped": f"{type(exc).__name__}: {exc}"}
                continue
            prompts = [counter.prompt_tokens(r.messages) for r in requests]
            if any(p is None for p in prompts):
                out[env_name] = {"skipped": "the model's chat template is not rendered by forge.llm.local"}
                continue
            new = evaluated_tokens(prompts)  # type: ignore[arg-type]
            later = new[1:] or new
            target = NEW_TOKEN_TARGETS.get(env_name)
            mean = statistics.fmean(later)
            out[env_name] = {
                "decisions": len(new), "episodes": episodes, "observations": source,
                "prompt_tokens_p50": round(statistics.median(len(p[0]) for p in prompts)),  # type: ignore[index]
                "static_tokens_p50": round(statistics.median(p[1] for p in prompts)),  # type: ignore[index]
                "new_first": new[0], "new_p50": round(statistics.median(later)), "new_mean": round(mean, 1), "new_max": max(later),
                "target": target, "within_target": None if target is None else mean <= target,
            }
        return out
    finally:
        counter.close()


def machine() -> dict[str, Any]:
    """What else the machine was doing: the load average and the CPUs others kept busy."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {"cpus": os.cpu_count(), "load_avg": [round(x, 2) for x in load], "busy_cpus": round(busy_cpus(0.5), 2)}


def measure(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    llm = open_llm(spec, n_threads=args.threads)
    try:
        t0 = time.perf_counter()
        llm.load()
        load_s = time.perf_counter() - t0
        if args.verbose:
            print(f"{llm.name}: loaded in {load_s:.1f} s", file=sys.stderr)
        result: dict[str, Any] = {"model": llm.name, "threads": llm.n_threads, "load_s": round(load_s, 1), "modes": {}}
        choose(llm, [Message("system", "warm up"), Message("user", "go")], GRID)
        skip = set(args.skip.split(","))
        for mode in args.modes.split(","):
            row: dict[str, Any] = {}
            if "prefix" not in skip:
                for target in (int(t) for t in args.prefixes.split(",") if t):
                    row[f"prefix_{target}"] = prefix_latency(llm, args.runs, target, mode)
                    if args.verbose:
                        print(f"{llm.name} {mode} prefix {target}: {row[f'prefix_{target}']}", file=sys.stderr)
            if "cage" not in skip:
                row["cage2"] = cage_decision(llm, args.cage_steps, mode)
                if args.verbose:
                    print(f"{llm.name} {mode} cage2: {row['cage2']}", file=sys.stderr)
            if "probe" not in skip:
                llm.choice_mode = mode
                variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
                rules = probe(llm, variants=variants, verbose=args.verbose)
                row["probe_n"] = rules["n"]
                row.update({f"probe_{v}": rules[v] for v in variants})
                row["probe_rows"] = rules["rows"]
            result["modes"][mode] = row
        if "gen" not in skip:
            result["gen_tokens_per_s"] = generation_rate(llm, args.runs, args.tokens)
        result["prefix_stats"] = llm.prefix_stats.to_dict()
        result["saved_states"] = {"entries": len(llm.prefix_states), "bytes": llm.prefix_states.nbytes, "evictions": llm.prefix_states.evictions}
        return result
    finally:
        llm.close()


def table(results: list[dict[str, Any]]) -> str:
    columns = [(r, mode) for r in results for mode in r["modes"]]

    def cost(*path: str) -> Any:
        def cell(r: dict[str, Any], mode: str) -> str:
            node: Any = r["modes"][mode]
            for key in path:
                if not isinstance(node, dict) or key not in node:
                    return "-"
                node = node[key]
            return f"{node['wall_ms']} ({node['cpu_ms']} CPU) [{node['prompt_tokens']}/{node['evaluated_tokens']}/{node['decoded_tokens']}]"
        return cell

    def score(key: str) -> Any:
        return lambda r, mode: f"{r['modes'][mode][key]}/{r['modes'][mode]['probe_n']}" if key in r["modes"][mode] else "-"

    def once(key: str) -> Any:
        return lambda r, mode: str(r.get(key, "-"))

    targets = sorted({k for r, m in columns for k in r["modes"][m] if k.startswith("prefix_")}, key=lambda k: int(k.split("_")[1]))
    rows: list[tuple[str, Any]] = [("threads", once("threads")), ("load (s)", once("load_s"))]
    for key in targets:
        static = next((r["modes"][m][key]["static_tokens"] for r, m in columns if key in r["modes"][m]), "?")
        for kind in ("fresh", "restored", "cached"):
            rows.append((f"decision after a {static}-token prefix, {kind}", cost(key, kind)))
    rows += [
        ("CAGE-2 decision (145 options), first step", cost("cage2", "first")),
        ("CAGE-2 decision (145 options), later steps p50", cost("cage2", "steady")),
        ("generation (tokens/s)", once("gen_tokens_per_s")),
        ("probe: followed the rule (rules in system prompt)", score("probe_with")),
        ("probe: followed, rule also repeated before the question", score("probe_near")),
        ("probe: right without rules", score("probe_without")),
    ]
    head = ["", *(f"{r['model']} {mode}" for r, mode in columns)]
    body = [[label, *(fmt(r, mode) for r, mode in columns)] for label, fmt in rows]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    lines.append("")
    lines.append("Decisions: wall ms (process CPU ms) [prompt / evaluated / decoded-after-prompt tokens], medians.")
    for r in results:
        st = r["prefix_stats"]
        rate = f"{st['hit_rate']:.2f}" if st["hit_rate"] is not None else "-"
        lines.append(
            f"{r['model']}: static prefix from KV {st['kv']}, restored {st['restored']}, partly restored {st['partial']}, "
            f"evaluated {st['evaluated']} (hit rate {rate}); saved states kept {r['saved_states']['entries']} "
            f"({r['saved_states']['bytes'] / 2**20:.0f} MiB, {r['saved_states']['evictions']} evicted)"
        )
    return "\n".join(lines)


def token_table(tokens: dict[str, dict[str, Any]]) -> str:
    lines = ["", "New prompt tokens per decision (counted with the model's tokenizer and chat template; zero-shot memory):", ""]
    lines += ["| model | env | decisions | prompt p50 | static p50 | first | later p50 | later mean | later max | target |", "|" + "---|" * 10]
    for spec, envs in tokens.items():
        for env, r in envs.items():
            if "skipped" in r:
                lines.append(f"| {spec} | {env} | skipped: {r['skipped']} |" + " |" * 7)
                continue
            target = "-" if r["target"] is None else f"<= {r['target']}: {'met' if r['within_target'] else 'missed'}"
            lines.append(f"| {spec} | {env} | {r['decisions']} | {r['prompt_tokens_p50']} | {r['static_tokens_p50']} | {r['new_first']} | "
                         f"{r['new_p50']} | {r['new_mean']} | {r['new_max']} | {target} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="local,local:smollm2", help="comma-separated LLM specs (default: local,local:smollm2)")
    parser.add_argument("--modes", default=",".join(CHOICE_MODES), help="choice modes side by side (default: score,grammar)")
    parser.add_argument("--threads", type=int, default=None, help="default: every usable CPU not busy")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per figure (median)")
    parser.add_argument("--prefixes", default="300,2000", help="static prefix sizes in tokens (default: 300,2000)")
    parser.add_argument("--cage-steps", type=int, default=8, help="decisions in the CAGE-2-sized episode")
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per generation run")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="probe prompt variants: with, without, near (default: all)")
    parser.add_argument("--skip", default="", help=f"sections to skip: {', '.join(SECTIONS)} (comma-separated)")
    parser.add_argument("--probe-only", action="store_true", help="only the probe (same as --only probe)")
    parser.add_argument("--only", default="", help=f"only these sections: {', '.join(SECTIONS)} (comma-separated)")
    parser.add_argument("--token-envs", default=",".join(TOKEN_ENVS), help="envs whose new tokens per decision are counted")
    parser.add_argument("--token-episodes", type=int, default=3, help="episodes per env for the token count")
    parser.add_argument("--token-steps", type=int, default=10, help="step limit of those episodes")
    parser.add_argument("--verbose", action="store_true", help="progress and per-situation picks on stderr")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.probe_only:
        args.only = ",".join(filter(None, [args.only, "probe"]))
    if args.only:
        args.skip = ",".join(filter(None, [args.skip, *(s for s in SECTIONS if s not in args.only.split(","))]))
    skip = set(args.skip.split(","))
    specs = [spec.strip() for spec in args.models.split(",") if spec.strip()]

    before = machine()
    results = [measure(spec, args) for spec in specs] if set(SECTIONS) - {"tokens"} - skip else []
    envs = [e.strip() for e in args.token_envs.split(",") if e.strip()]
    tokens = {} if "tokens" in skip else {spec: new_tokens(spec, envs, args.token_episodes, args.token_steps) for spec in specs}
    after = machine()
    if args.json:
        print(json.dumps({"machine_before": before, "machine_after": after, "models": results, "new_tokens": tokens}))
    else:
        if results:
            print(table(results))
        if tokens:
            print(token_table(tokens))
        print(f"\nMachine: {before['cpus']} CPUs; load average {before['load_avg']} before, {after['load_avg']} after; "
              f"CPUs busy with other work at the start: {before['busy_cpus']}")


if __name__ == "__main__":
    main()
