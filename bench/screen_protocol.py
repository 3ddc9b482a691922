"""Write ``bench/data/screen_protocol.jsonl``: honest protocol traffic, as benign training data
for the screen's semantic layer.

    python bench/screen_protocol.py          # writes the file and prints counts per source

The screen's semantic layer was trained on prose (hand-written rules, lessons, attacks), never
on the text FORGE itself writes and broadcasts, and it read that text as doubtful: a rule's
situation "left: hole; down: frozen; right: hole" scored 0.45, a line of identifiers 0.81, and
honest broadcasts were held for review. This script writes such text the way the system writes
it, with no model and nothing by hand:

* **rules**: each env is played with random actions (seeded); at a random step an action is
  taken as the failing one and the others as safe, and the rule is written by the project's
  own writer (``forge.learn.rules.write(focus(situation, action, safe), action, safe)``, as
  reflection's fallback does), then abstracted by the env's ``spec.abstract`` and dropped if
  ``spec.instance_terms`` still finds a name (as ``Snapshot.check`` does). A second form is
  the one the toy test model writes ("when X, then do not Y");
* **examples**: the content and description reflection's fallback writes for a failed step
  (``name: description`` then ``observation -> answer`` lines), the content joined with its
  description, and the meta strings alone (description, name, a step's situation), as
  :meth:`Screen.doubtful` reads a unit's meta;
* **team episodes and procedures**: the postgres diagnosis env's task text (no server: the
  task is a pure function of its seed), tools called, and the lesson
  ``forge.team.memories`` writes for a success or a failure; a procedure as the fallback
  consolidation writes it;
* **identifiers**: the context fields a protocol run sets (env, role, condition,
  representation) joined, as the patterns read them (grouped with the env they name);
* **samples**: the contents of ``forge/data/sample_memories.jsonl``.

Envs: FrozenLake (fixed and random maps, slippery or not), CliffWalking, Taxi, MiniCAGE,
TextWorld (when installed), TextArena's games (when installed), postgres diagnosis. Near
duplicates are dropped (digits folded, word-bigram Jaccard >= 0.8 within an env family), and each source
is capped, so the file stays a few hundred distinct items. Every line has ``label: benign``,
``family`` (the source kind), ``env`` (the group a cross-validation fold holds out whole) and
``split: protocol``.
"""

from __future__ import annotations

import json
import random
import re
from importlib import resources
from pathlib import Path

from forge.envs import make_env
from forge.envs.situation import situation_of
from forge.learn import rules

OUT = Path(__file__).with_name("data") / "screen_protocol.jsonl"
CONDITIONS = ("forge", "forge-no-graduation", "reflexion", "zero-shot", "sleep", "forge-sleep", "react")
ROLES = ("actor", "planner", "analyst", "scout", "defender")
REPRESENTATIONS = ("rules", "examples", "mixed")


def _norm(text: str) -> frozenset[str]:
    """Word bigrams with digits folded: what two near-duplicate texts share."""
    tokens = re.findall(r"[a-z_]+|\d+|[:;,>]", re.sub(r"\d+", "0", text.lower()))
    return frozenset(zip(tokens, tokens[1:], strict=False)) if len(tokens) > 1 else frozenset(tokens)


class Sink:
    """Keeps items that are not near duplicates of one already kept for the same env."""

    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []
        self._seen: dict[str, list[frozenset[str]]] = {}
        self._texts: set[str] = set()

    def add(self, text: str, family: str, env: str, cap: dict[tuple[str, str], int], limit: int) -> bool:
        text = text.strip()
        if not text or text in self._texts or cap.get((family, env), 0) >= limit:
            return False
        words = _norm(text)
        for other in self._seen.get(env, []):
            if len(words | other) and len(words & other) / len(words | other) >= 0.8:
                return False
        self._seen.setdefault(env, []).append(words)
        self._texts.add(text)
        cap[(family, env)] = cap.get((family, env), 0) + 1
        self.items.append({"text": text, "label": "benign", "family": family, "env": env, "split": "protocol"})
        return True


def _trajectory(env: object, seed: int, rng: random.Random, max_steps: int = 25) -> list[tuple[str, str, list[str]]]:
    """(situation, action taken, valid actions) per step of one random episode."""
    obs = env.reset(seed=seed)  # type: ignore[attr-defined]
    out = []
    for _ in range(max_steps):
        acts = list(env.valid_actions())  # type: ignore[attr-defined]
        if not acts:
            break
        a = rng.choice(acts)
        out.append((situation_of(obs, env.spec), a, acts))  # type: ignore[attr-defined]
        r = env.step(a)  # type: ignore[attr-defined]
        obs = r.observation
        if r.done:
            break
    return out


def _rule(spec: object, situation: str, action: str, safe: list[str]) -> str | None:
    rule = rules.write(rules.focus(situation, action, safe), action, safe)
    abstract = getattr(spec, "abstract", None)
    if abstract is not None:
        rule = abstract(rule)
    terms = getattr(spec, "instance_terms", None)
    if terms is not None and list(terms(rule)):
        return None
    return rule


def play(sink: Sink, cap: dict[tuple[str, str], int], name: str, seeds: range, *, rules_per_env: int, examples_per_env: int) -> None:
    try:
        env = make_env(name)
    except Exception as exc:  # not installed, or needs a service: skipped, and said so
        print(f"  {name}: skipped ({type(exc).__name__}: {str(exc)[:80]})")
        return
    rng = random.Random(f"screen-protocol:{name}")
    group = name.split(":")[0] if ":" in name else name.split("-")[0]  # one group per env family
    for seed in seeds:
        try:
            steps = _trajectory(env, seed, rng)
        except Exception as exc:
            print(f"  {name} seed {seed}: skipped ({type(exc).__name__}: {str(exc)[:80]})")
            break
        if not steps:
            continue
        for _ in range(3):
            i = rng.randrange(len(steps))
            situation, action, acts = steps[i]
            if not situation:
                continue
            others = [a for a in acts if a != action]
            safe = rng.sample(others, k=min(len(others), rng.choice((0, 1, 1, 2, 3))))
            rule = _rule(env.spec, situation, action, safe)
            if rule:
                sink.add(rule, "rule", group, cap, rules_per_env)
                if rng.random() < 0.3:
                    sink.add(f"when {situation[:1].lower() + situation[1:]}, then do not {action}", "rule", group, cap, rules_per_env)
        i = rng.randrange(len(steps))
        situation, failing, acts = steps[i]
        alt = next((a for a in acts if a != failing), failing)
        description = f"{name}: the same start, with {alt} instead of {failing} at step {i}"
        lines = [f"avoid-{failing}-at-step-{i}: {description}"]
        lines += [f"{s} -> {a}" for s, a, _ in steps[max(0, i - 4) : i]]
        lines.append(f"{situation} -> {alt}")
        content = "\n".join(lines)
        if sink.add(content, "example", group, cap, examples_per_env):
            sink.add(f"{content}\n{description}", "example", group, cap, examples_per_env)
        # meta strings on their own, as the screen reads each one: the description, the
        # example's name, a step's observation (a situation)
        sink.add(description, "meta", group, cap, examples_per_env)
        sink.add(f"avoid-{failing}-at-step-{i}", "meta", group, cap, examples_per_env)
        sink.add(situation, "situation", group, cap, examples_per_env)
    close = getattr(env, "close", None)
    if callable(close):
        close()


def team(sink: Sink, cap: dict[tuple[str, str], int], n: int = 40, *, start: int = 0) -> None:
    """Team episodes and procedures on the postgres diagnosis stream, as forge.team writes them."""
    from forge.envs.postgres import _CAUSES, TOOLS, task_for_seed
    from forge.team.memories import _clip

    env = make_env("postgres-diagnosis")
    rng = random.Random("screen-protocol:team" + (f":{start}" if start else ""))
    tools = list(TOOLS)
    lessons: list[str] = []
    for seed in range(start, start + n):
        obs = env.reset(seed=seed)
        task = " ".join(obs.split("Root causes:")[0].split()).removeprefix("Task: ")
        anomaly = task_for_seed(seed).anomaly
        called = rng.sample(tools, k=rng.randint(1, 4))
        success = rng.random() < 0.5
        answer = anomaly if success else rng.choice([a for a in _CAUSES if a != anomaly])
        steps = "; ".join([*(f"{t}()" for t in called), f"answer:{answer}"])
        if success:
            lesson = f"For tasks like '{_clip(task, 80)}', this worked: {_clip(steps, 200)}."
            content = f"Task: {_clip(task, 400)}\nOutcome: success (score 1)\nLessons: {lesson}"
        else:
            cause = f"answered {answer}, but the cause was {anomaly}: {_CAUSES[anomaly]}"
            lesson = f"For tasks like '{_clip(task, 80)}', avoid repeating: {_clip(steps, 200)} (failed: {_clip(cause, 120)})."
            content = f"Task: {_clip(task, 400)}\nOutcome: failure (score 0)\nLessons: {lesson}\nDiagnosis: {cause}"
        lessons.append(lesson)
        sink.add(content, "team_episode", "postgres", cap, 30)
        sink.add(lesson, "meta", "postgres", cap, 10)  # the episode's meta holds its lessons and task
        sink.add(task, "meta", "postgres", cap, 10)
        situation = task.split(".")[0]
        sink.add(_rule(env.spec, situation, rng.choice(tools), rng.sample(tools, k=2)) or "", "rule", "postgres", cap, 30)
    for k in range(8):
        picked = rng.sample(lessons, k=rng.randint(1, 3))
        title = "diagnosis" if k % 2 else _clip(picked[0].split("'")[1], 60)
        sink.add(f"{title}: {' '.join(dict.fromkeys(picked))}", "team_procedure", "postgres", cap, 8)
    env.close() if hasattr(env, "close") else None


def identifiers(sink: Sink, cap: dict[tuple[str, str], int], envs: list[str]) -> None:
    rng = random.Random("screen-protocol:ids")
    for _ in range(200):
        env = rng.choice(envs)
        parts = [env, rng.choice(ROLES), rng.choice(CONDITIONS), rng.choice(REPRESENTATIONS)]
        if rng.random() < 0.4:
            parts.append(f"agent-{rng.randrange(8)}")
        if rng.random() < 0.3:
            parts.append(f"inst-{rng.randrange(4)} stage {rng.randrange(5)}")
        family = env.split(":")[0] if ":" in env else env.split("-")[0]
        sink.add(" ".join(parts), "identifiers", family, cap, 8)


def samples(sink: Sink, cap: dict[tuple[str, str], int]) -> None:
    text = resources.files("forge").joinpath("data", "sample_memories.jsonl").read_text(encoding="utf-8")
    for line in text.splitlines():
        if line.strip():
            rec = json.loads(line)
            if rec.get("record") == "unit":
                sink.add(rec["content"], "sample", "samples", cap, 50)


def main() -> None:
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help, and no stray arguments
    sink = Sink()
    cap: dict[tuple[str, str], int] = {}
    envs = [
        "frozenlake-4x4", "frozenlake-4x4-slippery", "frozenlake-8x8", "frozenlake-8x8-slippery",
        *(f"frozenlake-random-{n}x{n}{t}" for n in (4, 5, 6) for t in ("", "-slippery")),
        "cliffwalking", "taxi", "minicage",
        "textworld:coin-1", "textworld:treasure-1", "textworld:simple-1", "textworld:cooking-1",
        "textarena:TowerOfHanoi-v0", "textarena:GuessTheNumber-v0",
    ]
    for name in envs:
        heavy = name.startswith("textworld:")
        lake = name.startswith("frozenlake")
        play(sink, cap, name, range(4 if heavy else 40), rules_per_env=100 if lake else 50, examples_per_env=16 if lake else 10)
    team(sink, cap)
    identifiers(sink, cap, [*envs, "postgres-diagnosis"])
    samples(sink, cap)
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in sink.items), encoding="utf-8")
    counts: dict[str, int] = {}
    for r in sink.items:
        counts[f"{r['env']}/{r['family']}"] = counts.get(f"{r['env']}/{r['family']}", 0) + 1
    print(f"{len(sink.items)} items -> {OUT}")
    for k, v in sorted(counts.items()):
        print(f"  {k:40} {v}")


if __name__ == "__main__":
    main()
