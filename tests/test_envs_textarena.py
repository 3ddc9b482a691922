"""TextArena adapters, against the real TextArena games."""

from __future__ import annotations

import pytest

from forge.envs import Env, available_envs, make_env, oracle_action
from forge.errors import ConfigError

pytest.importorskip("textarena", reason="textarena is an optional extra: pip install '.[envs]'")

from forge.envs.textarena import textarena_games  # noqa: E402

GAMES = [f"textarena:{g}" for g in textarena_games()]


def solve(env: Env, *, seed: int) -> tuple[float, int, list[float]]:
    env.reset(seed=seed)
    rewards: list[float] = []
    while True:
        result = env.step(oracle_action(env))
        rewards.append(result.reward)
        if result.done:
            return sum(rewards), len(rewards), rewards


def test_registry_names_match_the_adapted_games() -> None:
    assert [n for n in available_envs() if n.startswith("textarena:")] == GAMES


@pytest.mark.parametrize("name", GAMES)
def test_game_satisfies_the_port(name: str) -> None:
    env = make_env(name)
    assert isinstance(env, Env) and env.spec.name == name
    assert env.spec.major_failure_return < env.spec.tau < env.spec.success_return
    obs = env.reset(seed=0)
    assert "Last step" in obs
    actions = list(env.valid_actions())
    assert actions and all(len(a) <= 8 for a in actions)
    env.close()


@pytest.mark.parametrize("name", ["textarena:TowerOfHanoi-v0", "textarena:TowerOfHanoi-v0-medium"])
def test_hanoi_oracle_solves_in_the_minimum_number_of_moves(name: str) -> None:
    env = make_env(name)
    total, moves, rewards = solve(env, seed=0)
    disks = env.num_disks
    assert moves == 2**disks - 1
    assert total >= env.spec.success_return and min(rewards) >= env.spec.tau


def test_hanoi_observation_shows_the_towers() -> None:
    env = make_env("textarena:TowerOfHanoi-v0")
    obs = env.reset(seed=0)
    assert "A: 3 2 1" in obs and "B: empty" in obs
    obs = env.step("a to c").observation
    assert "C: 1" in obs and "moved disk 1 from A to C" in obs


@pytest.mark.parametrize(
    ("moves", "why"),
    [(["B to C"], "tower B is empty"), (["A to C", "A to C"], "cannot go on the smaller disk")],
)
def test_hanoi_illegal_move_is_below_tau_and_ends_the_game(moves: list[str], why: str) -> None:
    env = make_env("textarena:TowerOfHanoi-v0")
    env.reset(seed=0)
    for move in moves:
        result = env.step(move)
    assert result.reward < env.spec.tau and result.done
    assert result.reward <= env.spec.major_failure_return
    assert result.info["event"] == "invalid_move"
    assert why in result.observation


def test_guess_the_number_bisection_wins_and_replays_for_a_seed() -> None:
    env = make_env("textarena:GuessTheNumber-v0")
    first = solve(env, seed=4)
    assert first[0] >= env.spec.success_return and first[1] <= 5
    assert solve(make_env("textarena:GuessTheNumber-v0"), seed=4) == first
    secrets = set()
    for seed in range(6):
        env.reset(seed=seed)
        secrets.add(env.unwrapped.state.game_state["game_number"])
    assert len(secrets) > 1


def test_guess_the_number_mistakes_are_below_tau() -> None:
    env = make_env("textarena:GuessTheNumber-v0")
    env.reset(seed=4)
    secret = env.unwrapped.state.game_state["game_number"]
    guess = 10 if secret != 10 else 11
    hint = env.step(str(guess))
    assert hint.reward == 0.0 and not hint.done and "between" in hint.observation
    repeat = env.step(str(guess))
    assert repeat.reward < env.spec.tau and repeat.done and "already guessed" in repeat.observation

    env.reset(seed=4)
    env.step(str(guess))
    ruled_out = 1 if secret > guess else 20
    wrong = env.step(str(ruled_out))
    assert wrong.reward < env.spec.tau and wrong.done and wrong.info["event"] == "mistake"


def test_unsupported_game_and_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="TowerOfHanoi-v0"):
        make_env("textarena:Chess-v0")
    with pytest.raises(ConfigError, match="no options"):
        make_env("textarena:TowerOfHanoi-v0", max_steps=3)


def test_an_env_closed_before_any_reset_closes_quietly():
    """The protocols build an env to read its spec and close it without playing."""
    make_env("textarena:TowerOfHanoi-v0").close()


def test_a_rule_names_the_position_not_the_move_counter() -> None:
    """Rules are keyed by the situation: two positions at the same move must differ, and the
    same position must read the same at any move (the first 1.5B run wrote "when move 2 of
    14, do not A to C" for two different positions)."""
    from forge.envs.situation import situation_of

    env = make_env("textarena:TowerOfHanoi-v0")
    start = env.reset(seed=0)
    assert situation_of(start, env.spec) == "towers A: 3 2 1, B: empty, C: empty"
    a = situation_of(env.step("A to B").observation, env.spec)
    env.reset(seed=0)
    b = situation_of(env.step("A to C").observation, env.spec)
    assert a == "towers A: 3 2, B: 1, C: empty" and b == "towers A: 3 2, B: empty, C: 1"
    env.step("C to B")
    back = env.step("B to C").observation  # the same position as b, two moves later
    assert situation_of(back, env.spec) == b and "Move 3" in back
    guess = make_env("textarena:GuessTheNumber-v0")
    obs = guess.reset(seed=0)
    low, high = guess.low, guess.high
    assert situation_of(obs, guess.spec) == f"the number is between {low} and {high}"
    result = guess.step(str(low))  # the lowest number: not the secret for seed 0
    assert not result.done
    assert situation_of(result.observation, guess.spec) == f"the number is between {low + 1} and {high}"


def test_the_generic_summary_drops_a_move_counter_too() -> None:
    from forge.envs.situation import summarize_observation

    assert summarize_observation("Move 2 of 14.\nYou stand by the door.") == "You stand by the door"
    assert summarize_observation("Turn 3 of 9. The game is over.\nNothing left.") == "Nothing left"
