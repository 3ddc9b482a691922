"""CAGE-2 through FORGE's adapter: prompt sizes, baseline returns, reward fidelity; and the
paper's experiment (zero-shot, Reflexion and FORGE at 30 steps) with ``--protocols``.

    python bench/cage2.py                     # 30 steps, 10 seeds
    python bench/cage2.py --seeds 30 --fidelity 108 --json
    python bench/cage2.py --tokenizers qwen,/path/model.gguf
    python bench/cage2.py --protocols --json                       # N=3, S=3, k=2, 2 run seeds, the 1.5B
    python bench/cage2.py --protocols --env minicage --llm test:walker --run-seeds 0   # the stand-in, seconds
    python bench/cage2.py --protocols --run-seeds 1 --conditions forge --out runs/    # one cell, kept; rerun to resume

``--protocols`` runs zero-shot, Reflexion and FORGE (rules) with tau -1.1 and theta -15 over
``--run-seeds``, each instance evaluated frozen on ``--eval-seeds`` held-out seeds (attack
paths no instance trained on), and prints mean return ± spread, graduation, the
major-failure rate (return < -100) and tokens, beside sleep and CybORG's BlueReactRestoreAgent
and BlueReactRemoveAgent on the same held-out seeds and the paper's figures with Gemini 2.5
Flash Lite (zero-shot -189.6, Reflexion -62.7, FORGE -24.5).

Needs CybORG (git-only: ``pip install -e cage-challenge-2/CybORG``). Prints, never asserts:

- tokens of the stable task text (``spec.description``, which holds every action) against
  the per-step 145-line option listing ``choose()`` appends, and tokens per observation;
- mean, spread and range of the return over seeds 0..N-1 for: sleep; CybORG's own
  BlueReactRestoreAgent and BlueReactRemoveAgent (fed CybORG's raw observation, acting
  through the adapter); the adapter's scripted blue (``rule_based_action``), which reads
  only the adapter's text; and how many reach the spec's theta at several horizons;
- reward fidelity: random blue actions played through the adapter and through raw CybORG
  (same seeds), step rewards compared exactly.
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from forge.engine.recall import approx_tokens
from forge.envs import make_env, oracle_action
from forge.envs.cyborg import CybORGCage2Env

Policy = Callable[[CybORGCage2Env, str], str]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def token_counters(names: list[str]) -> dict[str, Callable[[str], int]]:
    """Real tokenizers (a .gguf's vocabulary via llama.cpp), by local model name or path;
    the tokenizer-free estimate when none can be loaded."""
    counters: dict[str, Callable[[str], int]] = {}
    for name in names:
        try:
            from llama_cpp import Llama

            from forge.llm.models import MODELS, resolve_model

            path = str(resolve_model(name, build=False)) if name in MODELS else name
            vocab = Llama(model_path=path, vocab_only=True, verbose=False)
        except Exception as exc:  # no llama.cpp or no model: say so and go on
            log(f"no tokenizer {name} ({type(exc).__name__}: {exc})")
            continue
        counters[Path(path).stem] = lambda text, v=vocab: len(
            v.tokenize(text.encode(), add_bos=False, special=False)
        )
    return counters or {"approx_tokens": approx_tokens}


def listing(actions: list[str]) -> str:
    """The per-step option list as ``forge.llm.choose`` writes it."""
    return "Answer with exactly one of these options and nothing else:\n" + "\n".join(
        f"- {a}" for a in actions
    )


# -- policies -------------------------------------------------------------------------------


def sleep(env: CybORGCage2Env, obs: str) -> str:
    return "sleep"


def scripted(env: CybORGCage2Env, obs: str) -> str:
    return oracle_action(env)


def cyborg_agent(name: str) -> Policy:
    """One of CybORG's own blue agents, fed CybORG's raw observation, acting via the adapter."""
    import CybORG.Agents as agents

    agent = getattr(agents, name)()

    def act(env: CybORGCage2Env, obs: str) -> str:
        if obs.startswith("Step 0 "):
            agent.end_episode()
        raw = env.cyborg.get_observation("Blue")
        action = agent.get_action(raw, env.cyborg.get_action_space("Blue"))
        return env.action_name(action)

    return act


def returns(policy: Policy, *, steps: int, seeds: Sequence[int], env_name: str = "cyborg-cage2") -> list[float]:
    env = make_env(env_name, max_steps=steps)
    out = []
    for seed in seeds:
        obs, total = env.reset(seed=seed), 0.0
        for _ in range(steps):
            result = env.step(policy(env, obs))
            obs, total = result.observation, total + result.reward
            if result.done:
                break
        out.append(round(total, 2))
    env.close()
    return out


# -- fidelity -------------------------------------------------------------------------------


def raw_rewards(seed: int, names: list[str], env: CybORGCage2Env) -> list[float]:
    """The same actions straight through CybORG (no wrapper), seeded as the adapter seeds."""
    import numpy as np
    from CybORG import CybORG
    from CybORG.Agents import B_lineAgent

    scenario = Path(inspect.getfile(CybORG)).parent / "Shared" / "Scenarios" / "Scenario2.yaml"
    cyborg = CybORG(str(scenario), "sim", agents={"Red": B_lineAgent})
    random.seed(seed)
    np.random.seed(seed)
    cyborg.reset(agent="Blue")
    out = []
    for name in names:
        out.append(float(cyborg.step(agent="Blue", action=env.cyborg_action(name)).reward))
    return out


def fidelity(episodes: int, steps: int) -> dict[str, Any]:
    env = make_env("cyborg-cage2", max_steps=steps)
    mismatched, compared = [], 0
    for seed in range(episodes):
        env.reset(seed=seed)
        rng = random.Random(seed)
        names = [rng.choice(list(env.valid_actions())) for _ in range(steps)]
        mine = [env.step(n).reward for n in names]
        theirs = raw_rewards(seed, names, env)
        compared += len(mine)
        if mine != theirs:
            mismatched.append(seed)
    env.close()
    return {"episodes": episodes, "steps_compared": compared, "mismatched_seeds": mismatched}


# -- the paper's experiment -------------------------------------------------------------------

PAPER = {"zero-shot": -189.6, "reflexion": -62.7, "forge": -24.5}  # Gemini 2.5 Flash Lite, 30 steps
PROTOCOLS = ("zero-shot", "reflexion", "forge")


def _spread(values: Sequence[float]) -> dict[str, float]:
    vals = [float(v) for v in values]
    return {"mean": round(statistics.fmean(vals), 2), "sd": round(statistics.stdev(vals), 2) if len(vals) > 1 else 0.0, "min": min(vals), "max": max(vals)}


def _run(cfg: Any, path: Path) -> dict[str, Any]:
    """The finished run of ``cfg`` at ``path``: played from scratch, or (kept by an earlier
    ``--out``) read back when finished and resumed when interrupted, so a cell that stopped
    halfway is not played again. A run there with other settings is refused."""
    from forge.protocols import evolve, resume
    from forge.protocols.runs import RunDir

    if not (path / "config.json").exists():
        return evolve(cfg, path).final
    kept = RunDir(path).load_config()
    if kept != cfg:
        sys.exit(f"error: {path} holds a run with other settings; choose another --out")
    return resume(path).final


def protocols(args: argparse.Namespace) -> dict[str, Any]:
    """Zero-shot, Reflexion and FORGE (rules) on ``args.env`` as the paper runs them."""
    import tempfile
    import time

    from forge.envs import seed_split
    from forge.protocols import ForgeConfig

    train, held_out = seed_split(args.env, train=100, held_out=args.eval_seeds)
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="forge-cage2-") as tmp:
        root = Path(args.out or tmp)
        for condition in args.conditions:
            runs = []
            for seed in args.run_seeds:
                cfg = ForgeConfig(
                    condition=condition, env=args.env, llm=args.llm, instances=args.instances, stages=args.stages,
                    attempts=args.attempts, max_steps=args.steps, tau=-1.1, theta=-15.0, seed=seed,
                    train_seeds=train, eval_seeds=held_out, representation="rules",
                )
                cpu = time.process_time()
                final = _run(cfg, root / f"{condition}-seed{seed}")
                ev = final["evaluation"]
                runs.append({
                    "seed": seed, "mean_return": ev["mean_return"], "returns": ev["returns"],
                    "major_failure_rate": sum(r < -100 for r in ev["returns"]) / len(ev["returns"]),
                    "graduated": final["graduated"], "tokens": final["tokens"]["total"]["total_tokens"],
                    "rules": ev.get("rules", {}), "seconds": round(final.get("wall_seconds", 0.0), 1),
                    "cpu_seconds_this_call": round(time.process_time() - cpu, 1),
                })
                log(f"{condition} run seed {seed}: mean return {runs[-1]['mean_return']:.1f}, graduated {runs[-1]['graduated']}, {runs[-1]['seconds']}s")
            every = [r for run in runs for r in run["returns"]]
            rows[condition] = {
                "return": _spread(every), "per_run_seed": [round(r["mean_return"], 2) for r in runs],
                "major_failure_rate": sum(r < -100 for r in every) / len(every),
                "graduated": sum(r["graduated"] for r in runs), "instances": args.instances * len(runs),
                "tokens_per_run": statistics.fmean(r["tokens"] for r in runs),
                "rule_shown": sum(r["rules"].get("rule_shown", 0) for r in runs),
                "rule_followed": sum(r["rules"].get("rule_followed", 0) for r in runs),
                "decisions": sum(r["rules"].get("decisions", 0) for r in runs),
                "seconds": sum(r["seconds"] for r in runs), "paper": PAPER.get(condition) if args.env == "cyborg-cage2" else None,
            }
    baselines: dict[str, Policy] = {"sleep": sleep}
    if args.env == "cyborg-cage2":
        baselines.update(BlueReactRestoreAgent=cyborg_agent("BlueReactRestoreAgent"), BlueReactRemoveAgent=cyborg_agent("BlueReactRemoveAgent"))
    base = {name: _spread(returns(policy, steps=args.steps, seeds=held_out, env_name=args.env)) for name, policy in baselines.items()}
    order = [c for c in PROTOCOLS if c in rows]
    means = [rows[c]["return"]["mean"] for c in order]
    return {
        "env": args.env, "llm": args.llm, "steps": args.steps, "instances": args.instances, "stages": args.stages,
        "attempts": args.attempts, "run_seeds": args.run_seeds, "held_out_seeds": list(held_out),
        "protocols": rows, "baselines": base,
        # FORGE > Reflexion > zero-shot, strictly; None when --conditions left one out
        "ordering_met": all(a < b for a, b in zip(means, means[1:], strict=False)) if len(order) == len(PROTOCOLS) else None,
    }


def render_protocols(result: dict[str, Any]) -> str:
    lines = [
        f"{result['env']} at {result['steps']} steps, {result['llm']}, N={result['instances']}, S={result['stages']}, k={result['attempts']}, "
        f"run seeds {result['run_seeds']}, held-out seeds {result['held_out_seeds']}",
        f"{'blue':22s} {'mean return':>16s} {'range':>17s} {'major fail':>10s} {'graduated':>10s} {'tokens/run':>11s} {'rule shown':>11s} {'paper':>8s}",
    ]
    for name, r in result["protocols"].items():
        ret = r["return"]
        shown = f"{r['rule_shown']}/{r['decisions']}"
        lines.append(
            f"{name:22s} {ret['mean']:>8.1f} ± {ret['sd']:<6.1f} {ret['min']:>8.1f}..{ret['max']:<7.1f} {r['major_failure_rate']:>10.0%} "
            f"{r['graduated']:>4d}/{r['instances']:<5d} {r['tokens_per_run']:>11,.0f} {shown:>11s} {r['paper'] if r['paper'] is not None else '-':>8}"
        )
    for name, ret in result["baselines"].items():
        lines.append(f"{name:22s} {ret['mean']:>8.1f} ± {ret['sd']:<6.1f} {ret['min']:>8.1f}..{ret['max']:<7.1f}")
    verdict = {True: "met", False: "missed", None: "not measured (a condition was left out)"}[result["ordering_met"]]
    lines.append(f"FORGE > Reflexion > zero-shot: {verdict}")
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocols", action="store_true", help="run zero-shot, Reflexion and FORGE (the paper's experiment)")
    parser.add_argument("--env", default="cyborg-cage2", help="with --protocols: cyborg-cage2 or the stand-in minicage")
    parser.add_argument("--llm", default="local", help="with --protocols: local, openai:MODEL, test:walker")
    parser.add_argument("--run-seeds", default="0,1", help="with --protocols: run seeds")
    parser.add_argument("--conditions", default=",".join(PROTOCOLS), help="with --protocols: which of zero-shot, reflexion, forge")
    parser.add_argument("--eval-seeds", type=int, default=2, help="with --protocols: held-out seeds each instance is evaluated on")
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--attempts", type=int, default=2)
    parser.add_argument("--out", default=None, help="with --protocols: keep the runs here")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--horizons", default="10,15,20,30", help="horizons for the theta check")
    parser.add_argument("--fidelity", type=int, default=20, help="episodes for the reward check")
    parser.add_argument(
        "--tokenizers", default="qwen,smollm2", help="local model names or .gguf paths"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.protocols:
        args.run_seeds = [int(s) for s in str(args.run_seeds).split(",") if s.strip()]
        args.conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
        unknown = sorted(set(args.conditions) - set(PROTOCOLS))
        if unknown or not args.conditions:
            sys.exit(f"error: --conditions takes some of {', '.join(PROTOCOLS)}, not {', '.join(unknown) or 'nothing'}")
        result = protocols(args)
        print(json.dumps(result, indent=2) if args.json else render_protocols(result))
        return

    counters = token_counters([t for t in args.tokenizers.split(",") if t])
    env = make_env("cyborg-cage2", max_steps=args.steps)
    obs = [env.reset(seed=0)]
    while not env.spec.max_steps <= len(obs) - 1:
        obs.append(env.step(oracle_action(env)).observation)
    actions = list(env.valid_actions())
    sizes: dict[str, Any] = {
        "actions": len(actions),
        "situation_example": env.spec.situation(obs[len(obs) // 2]),
        "tokens": {
            name: {
                "description": count(env.spec.description),
                "option_listing": count(listing(actions)),
                "observation_mean": round(statistics.mean(count(o) for o in obs), 1),
                "observation_max": max(count(o) for o in obs),
            }
            for name, count in counters.items()
        },
    }
    env.close()
    log(f"sizes: {sizes}")

    seeds = range(args.seeds)
    policies: dict[str, Policy] = {
        "sleep": sleep,
        "BlueReactRestoreAgent": cyborg_agent("BlueReactRestoreAgent"),
        "BlueReactRemoveAgent": cyborg_agent("BlueReactRemoveAgent"),
        "scripted (text only)": scripted,
    }
    scores: dict[str, Any] = {}
    for name, policy in policies.items():
        got = returns(policy, steps=args.steps, seeds=seeds)
        scores[name] = {
            "mean": round(statistics.mean(got), 2),
            "stdev": round(statistics.stdev(got), 2) if len(got) > 1 else 0.0,
            "min": min(got),
            "max": max(got),
        }
        log(f"{name}: {scores[name]}")

    horizons = [int(h) for h in args.horizons.split(",") if h]
    graduation: dict[str, Any] = {}
    for h in horizons:
        spec = make_env("cyborg-cage2", max_steps=h).spec
        row: dict[str, Any] = {"theta": round(spec.theta, 2), "success_return": round(spec.success_return, 2)}
        for name in ("sleep", "scripted (text only)"):
            got = returns(policies[name], steps=h, seeds=seeds)
            row[name] = f"{sum(r >= spec.theta for r in got)}/{len(got)} (mean {statistics.mean(got):.1f})"
        graduation[str(h)] = row
        log(f"horizon {h}: {row}")

    fid = fidelity(args.fidelity, args.steps)
    log(f"fidelity: {fid}")
    result = {"steps": args.steps, "seeds": args.seeds, "sizes": sizes, "returns": scores,
              "reaching_theta": graduation, "fidelity": fid}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"CAGE-2 via forge.envs.cyborg, {args.steps} steps, seeds 0..{args.seeds - 1}")
    for name, t in sizes["tokens"].items():
        print(f"tokens ({name}): stable task text incl. all {sizes['actions']} actions "
              f"{t['description']}; per-step option listing {t['option_listing']}; "
              f"observation mean {t['observation_mean']} (max {t['observation_max']})")
    print(f"situation, e.g.: {sizes['situation_example']}")
    print(f"{'blue':24s} {'mean':>8s} {'stdev':>7s} {'min':>8s} {'max':>8s}")
    for name, s in scores.items():
        print(f"{name:24s} {s['mean']:8.2f} {s['stdev']:7.2f} {s['min']:8.2f} {s['max']:8.2f}")
    print("episodes at or above theta:")
    for h, row in graduation.items():
        print(f"  {h:>3s} steps, theta {row['theta']:7.2f}: sleep {row['sleep']}; "
              f"scripted {row['scripted (text only)']}")
    print(f"reward fidelity: {fid['episodes']} episodes, {fid['steps_compared']} steps, "
          f"mismatched seeds: {fid['mismatched_seeds'] or 'none'}")


if __name__ == "__main__":
    main()
