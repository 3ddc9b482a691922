"""FORGE beside the tools a user would pick instead, on held-out games no change was tuned on.

Arms, all on the same model, policy, observation and action format, and max steps:

- ``zero-shot``: no memory (greedy decoding plays the same episode whatever the run seed,
  so it is played once per env and reused for every run seed);
- ``reflexion`` and ``forge``: the evolution protocol (:func:`forge.protocols.evolve`), as
  bench/transfer.py runs it;
- ``gepa``: ``gepa.optimize`` (GEPA, arXiv 2507.19457) through its adapter interface. The
  candidate is one text component, the memory section of the agent's system prompt; GEPA's
  rollouts play whole episodes with the project's loop and policy, and its reflection LM is
  the same LLM;
- ``ace``: an ACE playbook (``ace-playbook``, arXiv 2510.04618): after each training episode
  its Reflector and Curator (the same LLM) turn the trajectory and its outcome into delta
  edits of a bulleted playbook, which the next episode reads in the same memory section.

Every learning arm gets the same training games and the same budget of training episodes,
N x S x (k+1) (a population of N counts N times its episodes); FORGE and Reflexion may stop
short of it when instances graduate or win. Memory and prompts are then frozen and every
*distinct* learned memory plays every held-out game once, greedily; an instance that holds a
copy of the same memory counts with its weight, not as another sample. Held-out games come
from a new range no change was tuned on (TextWorld 2000-; FrozenLake maps from seed 20,000
that are neither training nor earlier held-out maps); 1000-1003 stay the development games.
Every token is counted: training, reflection, curation and held-out play. The protocol is
written down in docs/protocols/peers.md.

Cells are appended to ``--out`` (JSON lines, one per env, arm and run seed) as they finish,
and a cell already there is not run again, so a long grid can be stopped and resumed, or run
one arm at a time. ``--report`` renders the table from such files without running anything:
mean held-out success with a 95% bootstrap interval over games and run seeds, tokens per
success, and FORGE's per-game paired difference against each other arm.

    python bench/peers.py --llm test --envs frozenlake-random-4x4 --held-out 3 --quick
    nice -n 19 taskset -c 1 python bench/peers.py --envs frozenlake-random-6x6 --out bench/data/peers/fl6.jsonl
    python bench/peers.py --report bench/data/peers/*.jsonl --json

GEPA and ACE need the ``peers`` extra: ``pip install 'forge-memory[peers]'``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge.envs import seed_split
from forge.errors import ForgeError, StructuredOutputError
from forge.learn.loop import Trajectory, play_episode
from forge.learn.policy import make_policy
from forge.learn.prompt import Recollection
from forge.llm import open_llm
from forge.llm.accounting import MeteredLLM, TokenLedger
from forge.llm.base import LLM, Completion, Message, Request
from forge.llm.structured import complete_json
from forge.protocols import ForgeConfig, RunDir, evolve
from forge.protocols.episode import build_env, evaluate_instance

ARMS = ("zero-shot", "reflexion", "forge", "gepa", "ace")
ENVS = ("frozenlake-random-6x6", "textworld:coin-2", "textworld:treasure-2")
TEXTWORLD_HELD_OUT_FIRST = 2000
"""Where the new held-out TextWorld games start (the development games are 1000-1003)."""
FROZENLAKE_HELD_OUT_FIRST = 20_000
"""Where the new held-out FrozenLake maps are drawn from (earlier held-out maps: 10,000-)."""
BOOTSTRAP = 2000


# -- games -------------------------------------------------------------------------------------


@functools.cache
def held_out_games(env: str, n: int) -> tuple[int, ...]:
    """``n`` held-out seeds for ``env`` from the new range: games no run trained on and no
    change so far was tuned on (TextWorld 2000-; FrozenLake maps that are neither training
    maps nor any of the first 100 earlier held-out maps)."""
    if env.startswith("textworld:"):
        return tuple(range(TEXTWORLD_HELD_OUT_FIRST, TEXTWORLD_HELD_OUT_FIRST + n))
    if env.startswith("frozenlake-random-"):
        from forge.envs import gym

        size = int(env.removeprefix("frozenlake-random-").split("x", 1)[0].split("-", 1)[0])
        taken = {tuple(gym.random_map(size, s)) for s in (*gym.train_seeds(size), *gym.held_out_seeds(size))}
        out: list[int] = []
        seed = FROZENLAKE_HELD_OUT_FIRST
        while len(out) < n:
            board = tuple(gym.random_map(size, seed))
            if board not in taken:
                taken.add(board)
                out.append(seed)
            seed += 1
        return tuple(out)
    raise ForgeError(f"{env}: peers compares on random FrozenLake maps and TextWorld families only")


# -- shared settings and accounting ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    """What every arm of a cell shares."""

    llm: str
    instances: int
    stages: int
    attempts: int
    train_maps: int
    held_out: int
    max_steps: int | None
    rule_guard: bool
    memory_tokens: int = 600

    @property
    def budget(self) -> int:
        """Training episodes each learning arm may play: N x S x (k+1)."""
        return self.instances * self.stages * (self.attempts + 1)

    def config(self, env: str, arm: str, run_seed: int) -> ForgeConfig:
        train, _ = seed_split(env, train=self.train_maps, held_out=1)
        condition = arm if arm in ("zero-shot", "reflexion", "forge") else "zero-shot"
        return ForgeConfig(
            condition=condition, representation="rules", env=env, llm=self.llm, instances=self.instances,
            stages=self.stages, attempts=self.attempts, seed=run_seed, train_seeds=tuple(train),
            eval_seeds=(_dev_game(env),), max_steps=self.max_steps, rule_guard=self.rule_guard,
            memory_tokens=self.memory_tokens,
        )


def _dev_game(env: str) -> int:
    """The first development game: evolve's own final evaluation plays it (and is not counted)."""
    return seed_split(env, train=1, held_out=1)[1][0]


class Borrowed:
    """One loaded LLM lent to every arm of a process; ``close`` leaves it open for the next."""

    def __init__(self, llm: LLM) -> None:
        self.inner = llm
        self.name = llm.name
        self.capabilities = llm.capabilities

    def complete(self, request: Request) -> Completion:
        return self.inner.complete(request)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def close(self) -> None:
        pass


def _usage(ledger: TokenLedger) -> dict[str, Any]:
    total = ledger.total()
    return {
        "tokens": total.total_tokens, "prompt_tokens": total.prompt_tokens, "completion_tokens": total.completion_tokens,
        "cached_tokens": total.cached_tokens, "llm_seconds": round(total.seconds, 2),
        "prompt_tokens_per_s": round(total.prompt_tokens / total.seconds, 1) if total.seconds else None,
        "by_role": {str(k): v.total_tokens for k, v in sorted(ledger.by("role").items(), key=lambda kv: str(kv[0]))},
    }


# -- playing with a memory section given as text -------------------------------------------------


def text_memory(block: str, *, heading: str) -> Callable[[str, str], Recollection]:
    """A recall function whose memory section is ``block``, for every role and situation:
    how GEPA's candidate and ACE's playbook reach the same prompt slot as FORGE's memory."""
    text = f"## {heading}\n{block.strip()}" if block.strip() else ""

    def recall(role: str, query: str) -> Recollection:
        return Recollection(role=role, block=text)

    return recall


def cap_tokens(text: str, budget: int) -> str:
    """``text`` cut at ``budget`` tokens (about four characters each), as FORGE's memory
    block is packed into the same budget: no arm gets a longer memory section."""
    limit = 4 * budget
    return text if len(text) <= limit else text[:limit].rsplit("\n", 1)[0]


@dataclass(slots=True)
class Player:
    """Plays episodes of one env with the project's loop and policy, greedy, metered."""

    cfg: ForgeConfig
    llm: LLM
    ledger: TokenLedger = field(default_factory=TokenLedger)

    def play(self, seed: int, block: str, *, heading: str, phase: str) -> tuple[Trajectory, bool, Any]:
        env = build_env(self.cfg)
        try:
            metered = MeteredLLM(self.llm, self.ledger, phase=phase)
            policy = make_policy(self.cfg.policy, llm=lambda role: metered.with_tags(role=role), spec=env.spec,
                                 rule_guard=self.cfg.rule_guard, show_map=self.cfg.show_map)
            traj = play_episode(env, policy, text_memory(block, heading=heading), seed=seed, tau=env.spec.tau, abort=False)
            won = env.spec.succeeded(traj.total, aborted=traj.aborted)
            print(f"    {phase} game {seed}: {'won' if won else 'lost'} in {len(traj.actions)} steps", file=sys.stderr, flush=True)
            return traj, won, env.spec
        finally:
            env.close()

    def reflector(self, role: str) -> MeteredLLM:
        return MeteredLLM(self.llm, self.ledger, phase="train", role=role)


def describe(traj: Trajectory, spec: Any, *, won: bool, last: int = 12) -> str:
    """The episode as the peers' reflection reads it: outcome, then its last steps."""
    from forge.envs.situation import situation_of

    lines = [f"Outcome: {'success' if won else 'failure'}, return {traj.total:+.2f} in {len(traj.actions)} steps"
             + (f"; the reward first fell at step {traj.failing}" if traj.failing is not None else "") + "."]
    start = max(0, len(traj.actions) - last)
    for t in range(start, len(traj.actions)):
        lines.append(f"step {t}: {situation_of(traj.observations[t], spec)} -> {traj.actions[t]} (reward {traj.rewards[t]:+.2f})")
    return "\n".join(lines)


# -- the arms ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Learned:
    """What an arm learned in one run seed: distinct memories with their weights."""

    memories: list[dict[str, Any]]  # {"weight": int, "units": [...]} or {"weight": int, "text": str}
    train_episodes: int
    train: TokenLedger
    notes: dict[str, Any] = field(default_factory=dict)


def learn_protocol(cfg: ForgeConfig, llm: LLM, root: Path) -> Learned:
    """FORGE or Reflexion: the evolution protocol, then each distinct final memory."""
    run_dir = root / f"{cfg.env.replace(':', '_')}-{cfg.condition}-seed{cfg.seed}"
    final = evolve(cfg, run_dir, llm_factory=lambda: Borrowed(llm)).final
    run = RunDir(run_dir)
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for i in range(cfg.instances):
        path = run.export_path(cfg.stages - 1, i)
        units = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        key = tuple(sorted((u["kind"], (u.get("context") or {}).get("role", ""), u["content"]) for u in units))
        group = groups.setdefault(key, {"weight": 0, "units": units, "instances": []})
        group["weight"] += 1
        group["instances"].append(i)
    played = 0
    for row in final["instances"]:
        stages = row["graduated_stage"] + 1 if row["graduated_stage"] is not None else cfg.stages
        played += row["attempts"] + stages
    return Learned(list(groups.values()), played, TokenLedger.from_dict(final["tokens"]["ledger"]),
                   {"run_dir": str(run_dir), "graduated": final["graduated"],
                    "dev_eval_tokens": final["tokens"]["evaluation"]["total_tokens"]})


def _train_seeds(cfg: ForgeConfig, arm: str, n: int) -> list[int]:
    """The training games a text arm plays, drawn from the same training seeds as FORGE's."""
    from forge.protocols import derive_seed

    return [cfg.train_seeds[derive_seed(cfg.seed, arm, e) % len(cfg.train_seeds)] for e in range(n)]


def learn_gepa(cfg: ForgeConfig, llm: LLM, settings: Settings) -> Learned:
    """GEPA over the memory section: rollouts are whole episodes, the score is success."""
    import gepa  # the peers extra
    from gepa.core.adapter import EvaluationBatch

    player = Player(cfg, llm)
    budget = settings.budget
    seeds = _train_seeds(cfg, "gepa", max(budget, 8))
    valset = sorted(set(seeds))[: max(1, min(3, budget // 4))]
    trainset = [s for s in dict.fromkeys(seeds) if s not in valset] or valset
    played = {"episodes": 0}

    class Adapter:
        propose_new_texts = None

        def evaluate(self, batch: list[int], candidate: dict[str, str], capture_traces: bool = False) -> Any:
            outputs, scores, trajectories = [], [], []
            for seed in batch:
                if played["episodes"] >= budget:
                    # GEPA checks its budget between iterations, so its last iteration could
                    # overrun it; a rollout past the budget is not played and scores 0, which
                    # no candidate can be accepted on
                    outputs.append({"seed": seed, "return": None, "success": False, "played": False})
                    scores.append(0.0)
                    trajectories.append({"seed": seed, "won": False, "played": False, "text": ""})
                    continue
                text = cap_tokens(candidate["memory"], settings.memory_tokens)
                traj, won, spec = player.play(int(seed), text, heading="Advice", phase="train")
                played["episodes"] += 1
                outputs.append({"seed": seed, "return": traj.total, "success": won})
                scores.append(1.0 if won else 0.0)
                trajectories.append({"seed": seed, "won": won, "text": describe(traj, spec, won=won)})
            return EvaluationBatch(outputs=outputs, scores=scores, trajectories=trajectories if capture_traces else None)

        def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: Any, components_to_update: list[str]) -> dict[str, list[dict[str, Any]]]:
            records = [
                {"Inputs": {"game": f"{cfg.env} seed {t['seed']}"}, "Generated Outputs": t["text"],
                 "Feedback": "The agent solved this game." if t["won"] else "The agent failed this game: say what it should do instead."}
                for t in eval_batch.trajectories or [] if t.get("played", True)
            ]
            return {name: records for name in components_to_update}

    reflector = player.reflector("reflector")

    def reflection_lm(prompt: str | list[dict[str, Any]]) -> str:
        messages = [Message("user", prompt)] if isinstance(prompt, str) else [Message(m["role"], str(m["content"])) for m in prompt]
        return reflector.complete(Request(messages=messages, max_tokens=400, temperature=0.0)).text

    result = gepa.optimize(
        seed_candidate={"memory": "Solve the task; avoid actions that failed before."},
        trainset=trainset, valset=valset, adapter=Adapter(), reflection_lm=reflection_lm,
        max_metric_calls=budget, seed=cfg.seed, display_progress_bar=False, logger=_QuietLogger(),
        raise_on_exception=True,
    )
    best = cap_tokens(result.best_candidate["memory"], settings.memory_tokens)
    return Learned([{"weight": 1, "text": best}], played["episodes"], player.ledger,
                   {"candidates": len(result.candidates), "heading": "Advice"})


class _QuietLogger:
    """GEPA's log lines go to stderr, so ``--json`` output stays one clean object."""

    def log(self, message: str) -> None:
        print(f"    gepa: {message}", file=sys.stderr, flush=True)


# ACE's roles ask for JSON of these shapes; the schema lets llama.cpp's grammar hold the 1.5B to it
_INSIGHT = {"type": "object", "properties": {"content": {"type": "string", "minLength": 8}, "section": {"type": "string", "enum": ["strategies", "domain_concepts", "common_mistakes"]}}, "required": ["content", "section"]}
_ACE_SCHEMAS = {
    "Reflector": {"type": "object", "properties": {"diagnosis": {"type": "string"}, "insights": {"type": "array", "items": _INSIGHT, "minItems": 1, "maxItems": 3}}, "required": ["diagnosis", "insights"]},
    "Curator": {"type": "object", "properties": {"operations": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "properties": {
        "op": {"type": "string", "enum": ["ADD", "UPDATE", "REMOVE"]}, "section": {"type": "string"}, "content": {"type": "string"}, "target_id": {"type": "string"}}, "required": ["op", "content"]}}}, "required": ["operations"]},
}


class AceLLM:
    """``ace``'s LLM protocol (``complete`` and ``complete_json`` of a system and a user
    message) over a FORGE LLM; a reply that never parses is an empty object, which ACE's
    roles read as "nothing learned"."""

    def __init__(self, llm: LLM, *, max_tokens: int = 400) -> None:
        self.llm = llm
        self.max_tokens = max_tokens

    def complete(self, system: str, user: str, **kwargs: Any) -> str:
        return self.llm.complete(Request(messages=[Message("system", system), Message("user", user)], max_tokens=self.max_tokens)).text

    def complete_json(self, system: str, user: str, **kwargs: Any) -> dict[str, Any]:
        role = next((r for r in _ACE_SCHEMAS if f"the {r} in the ACE framework" in system), None)
        schema = _ACE_SCHEMAS.get(role or "", {"type": "object"})
        try:
            value = complete_json(self.llm, [Message("system", system), Message("user", user)], schema=schema, retries=1, max_tokens=self.max_tokens)
        except StructuredOutputError:
            return {}
        return value if isinstance(value, dict) else {}


def render_playbook(playbook: Any, budget: int) -> str:
    """The playbook's bullets, best-scored first, packed into the memory budget."""
    bullets = sorted(playbook.bullets, key=lambda b: (-b.score, b.created_at_step))
    return cap_tokens("\n".join(f"- {b.content}" for b in bullets), budget)


def learn_ace(cfg: ForgeConfig, llm: LLM, settings: Settings) -> Learned:
    """ACE online over the training budget: play, then Reflector and Curator edit the playbook."""
    from ace import ACE, ACEConfig, Feedback, Generation, Sample

    from forge.engine.embed import open_embedder

    player = Player(cfg, llm)
    embedder = open_embedder(cfg.embedder)
    ace = ACE(
        AceLLM(player.reflector("generator")),
        # one reflection round (the package's default is the paper's 5): a 1.5B's later rounds
        # mostly restate the first, at five times the tokens
        config=ACEConfig(reflector_max_rounds=1, auto_embedder=False),
        embedder=lambda texts: embedder.embed(list(texts)).tolist(),
        reflector_llm=AceLLM(player.reflector("reflector")),
        curator_llm=AceLLM(player.reflector("curator")),
    )
    seeds = _train_seeds(cfg, "ace", settings.budget)
    for n, seed in enumerate(seeds):
        text = render_playbook(ace.playbook, settings.memory_tokens)
        traj, won, spec = player.play(seed, text, heading="Playbook", phase="train")
        story = describe(traj, spec, won=won)
        sample = Sample(id=f"{seed}-{n}", question=f"{spec.name}: {spec.description}")
        generation = Generation(answer="success" if won else "failure", reasoning=story)
        ace.step(sample, Feedback(correct=won, signal=story), phase="train", generation=generation)
    return Learned([{"weight": 1, "text": render_playbook(ace.playbook, settings.memory_tokens)}], len(seeds), player.ledger,
                   {"bullets": len(ace.playbook), "heading": "Playbook"})


# -- held-out evaluation -----------------------------------------------------------------------


def evaluate(cfg: ForgeConfig, llm: LLM, memory: Mapping[str, Any], games: Sequence[int], *, heading: str) -> tuple[list[dict[str, Any]], TokenLedger]:
    """One frozen memory on every held-out game, greedy: FORGE's units through the protocol's
    own evaluation (:func:`forge.protocols.episode.evaluate_instance`), a text memory through
    the same loop and policy."""
    if "units" in memory:
        task = {"config": cfg.to_dict(), "instance": 0, "seeds": list(games), "units": memory["units"], "episodes": 10**6}
        out = evaluate_instance(task, llm)
        return [{"seed": r["seed"], "success": bool(r["success"]), "return": r["return"], "steps": r["steps"]} for r in out["results"]], TokenLedger.from_dict(out["tokens"])
    player = Player(cfg, llm)
    rows = []
    for seed in games:
        traj, won, _ = player.play(int(seed), memory.get("text", ""), heading=heading, phase="eval")
        rows.append({"seed": seed, "success": won, "return": traj.total, "steps": len(traj.actions)})
    return rows, player.ledger


def run_cell(env: str, arm: str, run_seed: int, settings: Settings, llm: LLM, root: Path) -> dict[str, Any]:
    """Train ``arm`` on ``env`` with ``run_seed`` (nothing for zero-shot), then evaluate each
    distinct memory on the held-out games."""
    started = time.perf_counter()
    cfg = settings.config(env, arm, run_seed)
    games = held_out_games(env, settings.held_out)
    if arm == "zero-shot":
        learned = Learned([{"weight": 1, "text": ""}], 0, TokenLedger())
    elif arm in ("forge", "reflexion"):
        learned = learn_protocol(cfg, llm, root)
    elif arm == "gepa":
        learned = learn_gepa(cfg, llm, settings)
    elif arm == "ace":
        learned = learn_ace(cfg, llm, settings)
    else:
        raise ForgeError(f"unknown arm {arm!r}; expected one of {', '.join(ARMS)}")
    trained = time.perf_counter() - started
    heading = str(learned.notes.get("heading", "Memory"))
    memories, eval_ledger = [], TokenLedger()
    for memory in learned.memories:
        rows, ledger = evaluate(cfg, llm, memory, games, heading=heading)
        eval_ledger.merge(ledger)
        memories.append({"weight": memory["weight"], "instances": memory.get("instances"), "results": rows,
                         "size": len(memory["units"]) if "units" in memory else len(memory.get("text", "")),
                         "text": memory.get("text") if "text" in memory else None})
    weight = sum(m["weight"] for m in memories)
    per_game = {str(g): sum(m["weight"] * next(r["success"] for r in m["results"] if r["seed"] == g) for m in memories) / weight for g in games}
    train_usage = _usage(_without_phase(learned.train, "eval"))
    return {
        "env": env, "arm": arm, "run_seed": run_seed, "settings": _settings_dict(settings), "held_out_games": list(games),
        "train_episodes": learned.train_episodes, "budget": settings.budget if arm != "zero-shot" else 0,
        "distinct_memories": len(memories), "instances": weight, "memories": memories, "per_game": per_game,
        "success": statistics.fmean(per_game.values()),
        "train": train_usage, "eval": _usage(eval_ledger),
        "tokens": train_usage["tokens"] + eval_ledger.total().total_tokens,
        "notes": learned.notes, "seconds": round(time.perf_counter() - started, 1), "train_seconds": round(trained, 1),
    }


def _without_phase(ledger: TokenLedger, phase: str) -> TokenLedger:
    """``ledger`` less the calls tagged ``phase`` (evolve's own development-game evaluation)."""
    groups = [g for g in ledger.to_dict()["groups"] if g["tags"].get("phase") != phase]
    return TokenLedger.from_dict({"groups": groups})


def _settings_dict(s: Settings) -> dict[str, Any]:
    return {k: getattr(s, k) for k in ("llm", "instances", "stages", "attempts", "train_maps", "held_out", "max_steps", "rule_guard", "memory_tokens")}


# -- results -----------------------------------------------------------------------------------


def read_cells(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Every cell in these JSON-lines files; the same cell twice is an error, not a vote."""
    cells: dict[tuple[str, str, int], dict[str, Any]] = {}
    for path in paths:
        if not path.is_file():
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                cell = json.loads(line)
                key = (cell["env"], cell["arm"], int(cell["run_seed"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: not a bench/peers.py cell ({exc})") from None
            if key in cells:
                raise ValueError(f"{path}:{n}: {key} is already in another line or file")
            cells[key] = cell
    return list(cells.values())


def _table(cells: Sequence[Mapping[str, Any]], seeds: Sequence[int], games: Sequence[str]) -> list[list[float]]:
    """Run seeds x games of weighted success; zero-shot's one greedy run stands for every seed."""
    by_seed = {int(c["run_seed"]): c for c in cells}
    rows = []
    for s in seeds:
        cell = by_seed.get(s) if len(by_seed) > 1 or cells[0]["arm"] != "zero-shot" else cells[0]
        if cell is not None:
            rows.append([float(cell["per_game"][g]) for g in games])
    return rows


def summarise(cells: Sequence[Mapping[str, Any]], *, resamples: int = BOOTSTRAP) -> dict[str, Any]:
    """Per env and arm: held-out success with its interval, tokens per success, cost; then
    FORGE's paired per-game difference against every other arm, and the issue's targets."""
    from _common import bootstrap_mean

    out: dict[str, Any] = {"rows": [], "paired": [], "targets": []}
    for env in dict.fromkeys(c["env"] for c in cells):
        mine = [c for c in cells if c["env"] == env]
        settings = {json.dumps(c["settings"], sort_keys=True) for c in mine}
        if len(settings) > 1:
            raise ValueError(f"{env}: cells were run with different settings; they cannot share a table")
        games = [str(g) for g in mine[0]["held_out_games"]]
        arms = {a: [c for c in mine if c["arm"] == a] for a in ARMS if any(c["arm"] == a for c in mine)}
        learned_seeds = sorted({int(c["run_seed"]) for c in mine if c["arm"] != "zero-shot"}) or [0]
        rows = {}
        for arm, group in arms.items():
            seeds = sorted(int(c["run_seed"]) for c in group)
            mean, lo, hi = bootstrap_mean(_table(group, seeds, games), resamples=resamples)
            wins = sum(c["success"] * len(games) for c in group)
            tokens = sum(c["tokens"] for c in group)
            prompt = sum(c["train"]["prompt_tokens"] + c["eval"]["prompt_tokens"] for c in group)
            cached = sum(c["train"]["cached_tokens"] + c["eval"]["cached_tokens"] for c in group)
            secs = sum(c["train"]["llm_seconds"] + c["eval"]["llm_seconds"] for c in group)
            rows[arm] = row = {
                "env": env, "arm": arm, "run_seeds": seeds, "games": len(games), "success": mean, "low": lo, "high": hi,
                "tokens_per_success": tokens / wins if wins else None, "tokens": tokens,
                "train_episodes": statistics.fmean(c["train_episodes"] for c in group), "budget": group[0]["budget"],
                "distinct_memories": sum(c["distinct_memories"] for c in group), "instances": sum(c["instances"] for c in group),
                # prompt tokens per second of model time, and those not served from llama.cpp's prefix cache
                "prompt_tokens_per_s": round(prompt / secs, 1) if secs else None,
                "uncached_prompt_tokens_per_s": round((prompt - cached) / secs, 1) if secs else None,
                "seconds": sum(c["seconds"] for c in group),
            }
            out["rows"].append(row)
        forge = arms.get("forge")
        if forge is None:
            continue
        for arm, group in arms.items():
            if arm == "forge":
                continue
            seeds = [s for s in learned_seeds if s in {int(c["run_seed"]) for c in forge}
                     and (arm == "zero-shot" or s in {int(c["run_seed"]) for c in group})]
            if not seeds:
                continue
            a, b = _table(forge, seeds, games), _table(group, seeds, games)
            diff = [[x - y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]
            mean, lo, hi = bootstrap_mean(diff, resamples=resamples)
            out["paired"].append({"env": env, "versus": arm, "run_seeds": seeds, "difference": mean, "low": lo, "high": hi,
                                  "ratio": rows["forge"]["success"] / rows[arm]["success"] if rows[arm]["success"] else None})
        peers = [rows[a] for a in ("reflexion", "gepa", "ace") if a in rows]
        if peers:
            best = max(peers, key=lambda r: r["success"])
            costs = [r["tokens_per_success"] for r in peers if r["tokens_per_success"] is not None]
            f = rows["forge"]
            out["targets"].append({
                "env": env, "best_peer": best["arm"],
                "at_least_each_peer": all(f["success"] >= r["success"] for r in peers),
                "vs_best_peer": f["success"] / best["success"] if best["success"] else None,
                "tokens_per_success_vs_best": (f["tokens_per_success"] / min(costs)) if costs and f["tokens_per_success"] is not None else None,
            })
    return out


def render(summary: Mapping[str, Any]) -> str:
    lines = [f"{'env':<24} {'arm':<10} {'held-out success (95% CI)':>27} {'tok/success':>12} {'train ep/budget':>15} {'memories':>9} {'prompt tok/s':>12}"]
    for r in summary["rows"]:
        tps = f"{r['tokens_per_success']:,.0f}" if r["tokens_per_success"] is not None else "-"
        ci = f"{r['success']:.0%} [{r['low']:.0%}, {r['high']:.0%}]"
        lines.append(f"{r['env']:<24} {r['arm']:<10} {ci:>27} {tps:>12} {r['train_episodes']:>9.1f}/{r['budget']:<5} "
                     f"{str(r['distinct_memories']) + '/' + str(r['instances']):>9} {r['prompt_tokens_per_s'] or '-':>12}")
    if summary["paired"]:
        lines += ["", "FORGE minus each arm, paired per game (95% CI over games and run seeds)"]
        for p in summary["paired"]:
            ratio = f"{p['ratio']:.2f}x" if p["ratio"] is not None else "n/a"
            lines.append(f"  {p['env']:<24} vs {p['versus']:<10} {p['difference']:+.0%} [{p['low']:+.0%}, {p['high']:+.0%}]  ({ratio}; run seeds {p['run_seeds']})")
    for t in summary["targets"]:
        vs = f"{t['vs_best_peer']:.2f}x" if t["vs_best_peer"] is not None else "n/a"
        tps = f"{t['tokens_per_success_vs_best']:.2f}x" if t["tokens_per_success_vs_best"] is not None else "n/a"
        lines.append(f"  {t['env']:<24} at least each peer: {t['at_least_each_peer']}; vs best peer ({t['best_peer']}) {vs} "
                     f"(target 1.2x on one family); tokens/success {tps} the cheapest peer's (target <= 0.8x)")
    return "\n".join(lines)


def render_markdown(summary: Mapping[str, Any]) -> str:
    """The same table as Markdown, for docs/figures/learning.md."""
    lines = ["| env | arm | run seeds | held-out games | success (95% CI) | FORGE minus arm, paired (95% CI) | tokens per success | training episodes / budget | distinct memories / instances | wall | prompt tokens/s (uncached) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    paired = {(p["env"], p["versus"]): p for p in summary["paired"]}
    for r in summary["rows"]:
        p = paired.get((r["env"], r["arm"]))
        diff = f"{p['difference']:+.0%} [{p['low']:+.0%}, {p['high']:+.0%}]" if p else "–"
        tps = f"{r['tokens_per_success']:,.0f}" if r["tokens_per_success"] is not None else "– (no success)"
        lines.append(f"| {r['env']} | {r['arm']} | {', '.join(map(str, r['run_seeds']))} | {r['games']} | "
                     f"{r['success']:.0%} [{r['low']:.0%}, {r['high']:.0%}] | {diff} | {tps} | {r['train_episodes']:.1f} / {r['budget']} | "
                     f"{r['distinct_memories']} / {r['instances']} | {r['seconds'] / 60:.0f} min | "
                     f"{r['prompt_tokens_per_s'] or '–'} ({r['uncached_prompt_tokens_per_s'] or '–'}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llm", default="local", help="local (embedded 1.5B), openai:MODEL or test")
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads for --llm local (1 under taskset -c 1)")
    ap.add_argument("--envs", default=",".join(ENVS))
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma list of {', '.join(ARMS)}")
    ap.add_argument("--run-seeds", default="0,1,2")
    ap.add_argument("--instances", "-n", type=int, default=3)
    ap.add_argument("--stages", "-s", type=int, default=3)
    ap.add_argument("--attempts", "-k", type=int, default=2)
    ap.add_argument("--train-maps", type=int, default=100)
    ap.add_argument("--held-out", type=int, default=None, help="held-out games per env, from the new range (default 24; --quick: 4)")
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--rule-guard", action="store_true", help="on for every arm (off for every arm without it)")
    ap.add_argument("--quick", action="store_true", help="N=2, S=2, k=1, 4 held-out games, run seed 0")
    ap.add_argument("--out", type=Path, default=None, help="JSON lines, one per cell; cells already there are skipped")
    ap.add_argument("--runs", type=Path, default=None, help="keep the protocol's run directories here")
    ap.add_argument("--report", type=Path, nargs="+", default=None, metavar="JSONL", help="summarise these cells; runs nothing")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="with --report: the table as Markdown")
    args = ap.parse_args(argv)
    if args.report:
        try:
            summary = summarise(read_cells(args.report))
        except ValueError as exc:
            raise SystemExit(f"error: --report: {exc}") from None
        print(json.dumps(summary, indent=2) if args.json else render_markdown(summary) if args.markdown else render(summary))
        return
    if args.quick:
        args.instances, args.stages, args.attempts = 2, 2, 1
        args.held_out = args.held_out or 4
        if args.run_seeds == "0,1,2":
            args.run_seeds = "0"
    try:
        run_seeds = [int(s) for s in args.run_seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--run-seeds takes integers like 0,1,2, got {args.run_seeds!r}")
    arms = [a for a in args.arms.split(",") if a]
    if unknown := [a for a in arms if a not in ARMS]:
        ap.error(f"unknown arm(s) {', '.join(unknown)}; expected {', '.join(ARMS)}")
    args.held_out = args.held_out or 24
    settings = Settings(llm=args.llm, instances=args.instances, stages=args.stages, attempts=args.attempts,
                        train_maps=args.train_maps, held_out=args.held_out, max_steps=args.max_steps, rule_guard=args.rule_guard)
    out_path = args.out
    done = {(c["env"], c["arm"], int(c["run_seed"])) for c in read_cells([out_path])} if out_path else set()
    cells: list[dict[str, Any]] = []
    kwargs = {"n_threads": args.threads} if args.threads and args.llm.startswith("local") else {}
    try:
        llm = open_llm(args.llm, **kwargs)
    except ForgeError as exc:
        raise SystemExit(f"error: {exc}") from None
    try:
        with tempfile.TemporaryDirectory(prefix="forge-peers-") as tmp:
            root = args.runs or Path(tmp)
            for env, arm, seed in _grid(args.envs.split(","), arms, run_seeds):
                if (env, arm, seed) in done:
                    continue
                print(f"  {env} {arm} run seed {seed} ...", file=sys.stderr, flush=True)
                cell = run_cell(env, arm, seed, settings, llm, root)
                print(f"  {env} {arm} run seed {seed}: held-out success {cell['success']:.0%} over {len(cell['held_out_games'])} games, "
                      f"{cell['distinct_memories']} distinct memories, {cell['tokens']:,} tokens, {cell['seconds']:.0f}s "
                      f"({cell['train']['prompt_tokens_per_s'] or cell['eval']['prompt_tokens_per_s']} prompt tok/s)", file=sys.stderr, flush=True)
                cells.append(cell)
                if out_path:
                    out_path.parent.mkdir(parents=True, exist_ok=True)
                    with out_path.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(cell) + "\n")
    except ForgeError as exc:
        raise SystemExit(f"error: {exc}") from None
    finally:
        llm.close()
    summary = summarise(read_cells([out_path]) if out_path else cells) if (cells or out_path) else {"rows": [], "paired": [], "targets": []}
    print(json.dumps(summary, indent=2) if args.json else render(summary))


def _grid(envs: Sequence[str], arms: Sequence[str], run_seeds: Sequence[int]) -> Iterator[tuple[str, str, int]]:
    """Zero-shot once per env (greedy: every run seed plays the same episodes), then each run
    seed's learning arms, FORGE and the peers first: a grid cut short still holds whole run seeds."""
    for env in (e for e in envs if e):
        if "zero-shot" in arms:
            yield env, "zero-shot", run_seeds[0]
        for seed in run_seeds:
            for arm in (a for a in ("forge", "gepa", "ace", "reflexion") if a in arms):
                yield env, arm, seed


if __name__ == "__main__":
    main()
