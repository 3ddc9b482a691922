"""CybORG CAGE-2 adapter: runs only where CybORG is installed (from git), else says why."""

from __future__ import annotations

import importlib.util
import random

import pytest

from forge.envs import Env, make_env
from forge.errors import ConfigError, ValidationError

HAVE_CYBORG = importlib.util.find_spec("CybORG") is not None
needs_cyborg = pytest.mark.skipif(
    not HAVE_CYBORG,
    reason="CybORG is not installed (git-only: pip install -e cage-challenge-2/CybORG)",
)


@pytest.mark.skipif(HAVE_CYBORG, reason="CybORG is installed; this checks the missing-install hint")
def test_missing_cyborg_is_a_config_error_with_an_install_hint() -> None:
    with pytest.raises(ConfigError, match="pip install"):
        make_env("cyborg-cage2")


@needs_cyborg
def test_cage2_plays_thirty_steps_and_replays_for_a_seed() -> None:
    env = make_env("cyborg-cage2")
    assert isinstance(env, Env) and env.spec.tau == -1.1 and env.spec.max_steps == 30

    def run(seed: int) -> list[tuple[str, float]]:
        obs = env.reset(seed=seed)
        assert "Op_Server0" in obs and "User0" in obs
        rng = random.Random(1)
        actions = list(env.valid_actions())
        trace = []
        for _ in range(env.spec.max_steps):
            result = env.step(rng.choice(actions))
            trace.append((result.observation, result.reward))
        assert result.done and result.info["truncated"]
        return trace

    first = run(3)
    assert run(3) == first
    assert all(reward <= 0 for _, reward in first)
    assert min(reward for _, reward in first) < env.spec.tau  # red reaches the servers
    env.close()


@needs_cyborg
def test_cage2_actions_are_readable_and_checked() -> None:
    env = make_env("cyborg-cage2")
    env.reset(seed=0)
    actions = env.valid_actions()
    assert {"sleep", "monitor", "analyse User1", "restore Op_Server0"} <= set(actions)
    assert any(a.startswith("decoy_apache ") for a in actions)
    with pytest.raises(ValidationError, match="sleep"):
        env.step("format c:")
