"""The env registry and the gymnasium toy-text adapters, against the real gymnasium envs."""

from __future__ import annotations

import random

import pytest

from forge.envs import Env, available_envs, make_env, oracle_action
from forge.errors import ConfigError, UserError, ValidationError

pytest.importorskip("gymnasium", reason="gymnasium is an optional extra: pip install '.[envs]'")

GYM_ENVS = [
    "frozenlake-4x4",
    "frozenlake-4x4-slippery",
    "frozenlake-8x8",
    "frozenlake-8x8-slippery",
    "cliffwalking",
    "taxi",
]
DETERMINISTIC = ["frozenlake-4x4", "frozenlake-8x8", "cliffwalking", "taxi"]


def play(env: Env, *, seed: int, actions: list[str]) -> list[tuple[str, float, bool]]:
    trace = [(env.reset(seed=seed), 0.0, False)]
    for action in actions:
        result = env.step(action)
        trace.append((result.observation, result.reward, result.done))
        if result.done:
            break
    return trace


def random_actions(env: Env, *, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(list(env.valid_actions())) for _ in range(n)]


# registry


def test_available_envs_lists_every_family() -> None:
    names = available_envs()
    for name in [*GYM_ENVS, "cyborg-cage2", "textarena:TowerOfHanoi-v0"]:
        assert name in names


def test_unknown_env_is_a_config_error_listing_known_names() -> None:
    with pytest.raises(ConfigError) as err:
        make_env("frozenlake-5x5")
    message = str(err.value)
    assert "frozenlake-5x5" in message and "frozenlake-4x4" in message and "taxi" in message
    assert "\n" not in message


def test_make_env_passes_options_to_the_adapter() -> None:
    env = make_env("frozenlake-4x4", max_steps=5)
    assert env.spec.max_steps == 5


# the port


@pytest.mark.parametrize("name", GYM_ENVS)
def test_adapter_satisfies_the_port_and_documents_thresholds(name: str) -> None:
    env = make_env(name)
    assert isinstance(env, Env)
    spec = env.spec
    assert spec.name == name
    assert spec.description and spec.max_steps > 0
    assert spec.major_failure_return < spec.tau < spec.success_return
    assert spec.theta >= spec.success_return
    actions = list(env.valid_actions())
    assert actions and len(set(actions)) == len(actions)
    assert all(a.isalpha() and a.islower() and len(a) <= 8 for a in actions)
    env.close()


@pytest.mark.parametrize("name", GYM_ENVS)
def test_first_observation_mentions_position_and_map(name: str) -> None:
    env = make_env(name)
    obs = env.reset(seed=0)
    assert "row " in obs and "col " in obs
    assert "Map" in obs and "Last step" in obs


@pytest.mark.parametrize("name", GYM_ENVS)
def test_same_seed_replays_the_same_episode(name: str) -> None:
    first, second = make_env(name), make_env(name)
    actions = random_actions(first, n=first.spec.max_steps, seed=11)
    assert play(first, seed=5, actions=actions) == play(second, seed=5, actions=actions)
    # and the same instance replays it after other episodes
    play(first, seed=6, actions=actions)
    assert play(first, seed=5, actions=actions) == play(second, seed=5, actions=actions)


@pytest.mark.parametrize("name", ["frozenlake-4x4-slippery", "taxi"])
def test_the_seed_matters_where_the_env_is_random(name: str) -> None:
    env = make_env(name)
    actions = random_actions(env, n=10, seed=3)
    traces = {str(play(env, seed=seed, actions=actions)) for seed in range(8)}
    assert len(traces) > 1


def test_bad_action_is_a_validation_error_listing_valid_actions() -> None:
    env = make_env("taxi")
    env.reset(seed=0)
    with pytest.raises(ValidationError) as err:
        env.step("fly")
    assert "fly" in str(err.value)
    for action in env.valid_actions():
        assert action in str(err.value)


def test_action_case_and_whitespace_are_forgiven() -> None:
    env = make_env("frozenlake-4x4")
    env.reset(seed=0)
    assert "row 1, col 0" in env.step(" DOWN\n").observation


def test_step_before_reset_and_after_the_end_are_user_errors() -> None:
    env = make_env("cliffwalking")
    with pytest.raises(UserError, match="reset"):
        env.step("up")
    env.reset(seed=0)
    assert env.step("right").done
    with pytest.raises(UserError, match="over"):
        env.step("up")


# reward shaping: mistakes below tau and terminal, ordinary steps not


def test_frozenlake_hole_is_below_tau_and_ends_the_episode() -> None:
    env = make_env("frozenlake-4x4")
    env.reset(seed=0)
    ok = env.step("down")
    assert ok.reward >= env.spec.tau and not ok.done
    assert "right: HOLE" in ok.observation
    fell = env.step("right")
    assert fell.reward < env.spec.tau and fell.done
    assert fell.reward <= env.spec.major_failure_return
    assert fell.info["event"] == "hole" and "hole" in fell.observation


def test_frozenlake_8x8_hole_is_below_tau() -> None:
    env = make_env("frozenlake-8x8")
    trace = play(env, seed=0, actions=["right", "right", "right", "down", "down"])
    _, reward, done = trace[-1]
    assert len(trace) == 6 and done and reward < env.spec.tau


def test_cliff_is_below_tau_and_ends_the_episode() -> None:
    env = make_env("cliffwalking")
    env.reset(seed=0)
    fell = env.step("right")
    assert fell.reward < env.spec.tau and fell.done
    assert fell.reward <= env.spec.major_failure_return
    assert fell.info["event"] == "cliff"
    assert "cliff at row 3, col 1" in fell.observation


def test_cliffwalking_standing_still_is_no_success_under_a_short_step_limit() -> None:
    # With 16 steps, 16 bumps into the edge returned -16 >= -30 and counted as success (and
    # graduated at theta -20): what bench/learning.py --max-steps 16 first measured.
    env = make_env("cliffwalking", max_steps=16)
    still = play(env, seed=0, actions=["left"] * 16)
    assert sum(r for _, r, _ in still) < env.spec.success_return and still[-1][2]
    route = play(env, seed=0, actions=["up"] + ["right"] * 11 + ["down"])
    assert route[-1][2] and sum(r for _, r, _ in route) >= max(env.spec.success_return, env.spec.theta)  # the goal in 13
    default = make_env("cliffwalking").spec
    assert (default.success_return, default.theta) == (-30.0, -20.0)


def test_taxi_illegal_pickup_and_dropoff_are_below_tau() -> None:
    env = make_env("taxi")
    env.reset(seed=0)
    row, col, passenger, _ = env.decode(env.state)
    assert passenger < 4 and env.unwrapped.locs[passenger] != (row, col)
    pickup = env.step("pickup")
    assert pickup.reward < env.spec.tau and pickup.info["event"] == "illegal_pickup"
    env.reset(seed=0)
    dropoff = env.step("dropoff")
    assert dropoff.reward < env.spec.tau and dropoff.info["event"] == "illegal_dropoff"
    assert "-10" in dropoff.observation


def test_running_out_of_steps_is_neither_success_nor_major_failure() -> None:
    env = make_env("frozenlake-4x4")
    trace = play(env, seed=0, actions=["left"] * 30)
    assert len(trace) == env.spec.max_steps + 1
    total = sum(reward for _, reward, _ in trace)
    assert trace[-1][2] and "step limit" in trace[-1][0]
    assert env.spec.major_failure_return < total < env.spec.success_return


@pytest.mark.parametrize("name", DETERMINISTIC)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle_reaches_success_without_dipping_below_tau(name: str, seed: int) -> None:
    env = make_env(name)
    env.reset(seed=seed)
    total, steps = 0.0, 0
    while True:
        result = env.step(oracle_action(env))
        assert result.reward >= env.spec.tau
        total += result.reward
        steps += 1
        if result.done:
            break
    assert total >= env.spec.success_return
    assert total >= env.spec.theta
    assert steps < env.spec.max_steps
    assert not result.info["truncated"]


def test_oracle_takes_the_shortest_paths() -> None:
    for name, length in [("frozenlake-4x4", 6), ("frozenlake-8x8", 14), ("cliffwalking", 13)]:
        env = make_env(name)
        trace = play(env, seed=0, actions=[])
        steps = 0
        while not trace[-1][2]:
            result = env.step(oracle_action(env))
            trace.append((result.observation, result.reward, result.done))
            steps += 1
        assert steps == length, name


def test_oracle_refuses_slippery_ice() -> None:
    env = make_env("frozenlake-4x4-slippery")
    env.reset(seed=0)
    with pytest.raises(UserError, match="deterministic"):
        oracle_action(env)


def test_slippery_ice_is_narrated() -> None:
    env = make_env("frozenlake-4x4-slippery")
    slips = 0
    for seed in range(5):
        env.reset(seed=seed)
        slips += "slipped" in env.step("right").observation
    assert 0 < slips < 5
