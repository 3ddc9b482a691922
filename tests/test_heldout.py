"""Learning is judged on tasks no run trained on: seed splits, held-out evaluation, and the
record of whether each decision had a rule in front of it and followed it."""

from __future__ import annotations

import json

import pytest

from forge.envs import make_env, seed_split
from forge.errors import ConfigError
from forge.learn.loop import play_episode
from forge.learn.policy import FlatPolicy
from forge.learn.prompt import recollect
from forge.llm.testing import ScriptedLLM
from forge.model import Kind, Unit, Viewer
from forge.protocols import ForgeConfig, evolve


def test_splits_are_disjoint_and_refuse_one_map_envs():
    train, held = seed_split("frozenlake-random-4x4", train=20, held_out=10)
    assert len(train) == 20 and len(held) == 10 and not set(train) & set(held)
    gym = pytest.importorskip("forge.envs.gym")
    maps = {tuple(gym.random_map(4, s)) for s in train}
    assert not maps & {tuple(gym.random_map(4, s)) for s in held}  # no held-out map was trained on
    with pytest.raises(ConfigError, match="no held-out tasks"):
        seed_split("frozenlake-4x4")
    train, held = seed_split("minicage", train=3, held_out=2)
    assert train == (0, 1, 2) and held == (10_000, 10_001)


def test_a_run_refuses_overlapping_seeds_and_evaluates_exactly_the_held_out_ones(tmp_path):
    with pytest.raises(ConfigError, match="overlap"):
        ForgeConfig(env="frozenlake-random-4x4", train_seeds=(1, 2, 3), eval_seeds=(3, 4))
    cfg = ForgeConfig(
        condition="reflexion", env="frozenlake-random-4x4", llm="test:walker", instances=2, stages=2, attempts=1,
        train_seeds=(0, 1, 2), eval_seeds=(10_002, 10_004, 10_005), max_steps=8,
    )
    assert cfg.eval_episodes == 3
    final = evolve(cfg, tmp_path / "run").final
    assert final["evaluation"]["seeds"] == [10_002, 10_004, 10_005]
    trained = set()
    for path in (tmp_path / "run" / "checkpoints").glob("stage-*/inst-*.result.json"):
        trained.add(json.loads(path.read_text())["seed"])
    assert trained and trained <= {0, 1, 2}
    result = json.loads((tmp_path / "run/checkpoints/eval/inst-00.json").read_text())
    rules = [r["rules"] for r in result["results"]]
    assert all(r["decisions"] >= 1 and r["rule_shown"] <= r["decisions"] and r["rule_followed"] <= r["rule_shown"] for r in rules)


def test_each_decision_records_whether_a_rule_applied_and_was_followed(tmp_path):
    from forge.engine.embed import HashingEmbedder
    from forge.engine.memory import Memory

    env = make_env("frozenlake-4x4")
    with Memory.open(":memory:", embedder=HashingEmbedder(dim=64)) as mem:
        obs = env.reset(seed=0)
        situation = env.spec.situation(obs) if env.spec.situation else obs
        # a rule for the start: do not left (an edge); right was safe. The scripted model
        # goes right (follows it), then left at the next tile (no rule for it there).
        mem.add(Unit(f"when {situation}, do not left; right was safe there", kind=Kind.RULE, owner="a"))
        viewer = Viewer.of("a")

        def recall(role: str, query: str):
            return recollect(mem, viewer=viewer, query=query, role=role, valid_actions=env.valid_actions())

        policy = FlatPolicy(llm=lambda role: ScriptedLLM(["right", "left"]), spec=env.spec)
        traj = play_episode(env, policy, recall, seed=0, tau=env.spec.tau, abort=False, max_steps=2)
    env.close()
    first, second = (s.info for s in traj.steps)
    assert first["rule_shown"] is True and first["rule_followed"] is True
    assert second["rule_followed"] is None
    assert traj.rule_record == {"decisions": 2, "rule_shown": 1, "rule_followed": 1}
