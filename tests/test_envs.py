"""The env registry and the gymnasium toy-text adapters, against the real gymnasium envs."""

from __future__ import annotations

import random
import re

import pytest

from forge.envs import Env, available_envs, make_env, oracle_action
from forge.errors import ConfigError, UserError, ValidationError

pytest.importorskip("gymnasium", reason="gymnasium is an optional extra: pip install '.[envs]'")

RANDOM_LAKES = [f"frozenlake-random-{n}x{n}{tail}" for n in (4, 5, 6) for tail in ("", "-slippery")]
GYM_ENVS = [
    "frozenlake-4x4",
    "frozenlake-4x4-slippery",
    "frozenlake-8x8",
    "frozenlake-8x8-slippery",
    *RANDOM_LAKES,
    "cliffwalking",
    "taxi",
]
LAKES = [n for n in GYM_ENVS if n.startswith("frozenlake")]
DETERMINISTIC = ["frozenlake-4x4", "frozenlake-8x8", "frozenlake-random-4x4", "frozenlake-random-6x6", "cliffwalking", "taxi"]


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


@pytest.mark.parametrize("name", ["frozenlake-4x4-slippery", "frozenlake-random-4x4", "taxi"])
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


# random maps: a new task per seed, and seeds split into training and held-out maps


def map_of(observation: str) -> list[str]:
    """The map an observation draws, with the agent's "Y" put back as the tile it stands on."""
    lines = observation.split("G goal):\n", 1)[1].split("\nLast step")[0].splitlines()
    return [line.replace(" ", "") for line in lines]


def test_random_lakes_are_registered_for_every_size() -> None:
    from forge.envs.gym import RANDOM_SIZES

    assert [f"frozenlake-random-{n}x{n}{t}" for n in RANDOM_SIZES for t in ("", "-slippery")] == RANDOM_LAKES
    assert set(RANDOM_LAKES) <= set(available_envs())
    spec = make_env("frozenlake-random-5x5").spec
    assert (spec.tau, spec.success_return, spec.max_steps) == (-0.5, 1.0, 25)
    assert make_env("frozenlake-random-5x5-slippery").spec.max_steps == 50
    assert "new in every episode" in spec.description
    with pytest.raises(ConfigError, match="3x3 to 12x12"):
        from forge.envs.gym import FrozenLakeEnv

        FrozenLakeEnv(size=20, random_map=True)


@pytest.mark.parametrize("size", [4, 5, 6])
def test_a_seed_plays_its_own_solvable_map_whatever_came_before(size: int) -> None:
    from forge.envs.gym import random_map

    name = f"frozenlake-random-{size}x{size}"
    one, other = make_env(name), make_env(name)
    maps = {}
    for seed in range(12):
        drawn = map_of(one.reset(seed=seed))
        drawn[0] = "S" + drawn[0][1:]  # the agent starts on S
        assert drawn == random_map(size, seed) and len(drawn) == size
        assert drawn[0][0] == "S" and drawn[-1][-1] == "G"
        maps[seed] = drawn
    assert len({tuple(m) for m in maps.values()}) > 8  # seeds draw different maps
    for seed in (7, 3, 11):  # another instance, other seeds in between, the same maps
        other.reset(seed=seed + 1)
        start = map_of(other.reset(seed=seed))
        assert start[1:] == maps[seed][1:]
    # solvable: the shortest safe path reaches the goal on every map
    for seed in range(12):
        one.reset(seed=seed)
        result = None
        for _ in range(one.spec.max_steps):
            result = one.step(oracle_action(one))
            if result.done:
                break
        assert result is not None and result.info["event"] == "goal"


def test_training_and_held_out_seeds_draw_disjoint_sets_of_distinct_maps() -> None:
    from forge.envs.gym import HELD_OUT_FIRST_SEED, held_out_seeds, random_map, train_seeds

    for size in (4, 5, 6):
        train, held = train_seeds(size), held_out_seeds(size)
        assert len(train) == len(held) == 100
        assert train[0] == 0 and min(held) >= HELD_OUT_FIRST_SEED > max(train)
        train_maps = {tuple(random_map(size, s)) for s in train}
        held_maps = {tuple(random_map(size, s)) for s in held}
        assert len(train_maps) == len(held_maps) == 100  # every seed a different map
        assert not train_maps & held_maps  # nothing learned on a training map is tested on it
    # 4x4 has few maps: 30 of seeds 10,000-10,099 would draw a training map, so they are skipped
    naive = {tuple(random_map(4, s)) for s in range(HELD_OUT_FIRST_SEED, HELD_OUT_FIRST_SEED + 100)}
    assert naive & {tuple(random_map(4, s)) for s in train_seeds(4)}
    assert held_out_seeds(4, 10) == held_out_seeds(4)[:10] and train_seeds(4) == train_seeds(4)


# what a FrozenLake rule's "when" names: surroundings and the goal's direction, no coordinates


def lake_observations(name: str, *, seeds: range = range(6), steps: int = 12) -> list[str]:
    env = make_env(name)
    out = []
    for seed in seeds:
        out.append(env.reset(seed=seed))
        rng = random.Random(seed)
        for _ in range(steps):
            result = env.step(rng.choice(list(env.valid_actions())))
            out.append(result.observation)
            if result.done:
                break
    return out


def test_frozenlake_situation_names_surroundings_and_the_goal_not_coordinates() -> None:
    env = make_env("frozenlake-4x4")
    start = env.reset(seed=0)
    assert env.spec.situation(start) == (
        "on the start tile; left: edge; down: frozen; right: frozen; up: edge; goal: down-right at distance 6"
    )
    ahead = env.step("right").observation  # row 0, col 1: the hole is below
    assert env.spec.situation(ahead) == (
        "on a frozen tile; left: frozen; down: hole; right: frozen; up: edge; goal: down-right at distance 5"
    )
    for _ in range(2):
        env.step("right")
    corner = env.step("down").observation  # row 1, col 3 is a hole
    assert env.spec.situation(corner).startswith("in a hole; ") and "goal: down at distance 2" in env.spec.situation(corner)
    assert "goal" in env.spec.situation(env.reset(seed=0).replace("right: frozen (safe)", "right: GOAL"))


@pytest.mark.parametrize("name", LAKES)
def test_no_frozenlake_situation_names_a_coordinate(name: str) -> None:
    env = make_env(name)
    for obs in lake_observations(name):
        situation = env.spec.situation(obs)
        assert env.spec.instance_terms(situation) == [], situation
        assert not re.search(r"\b(?:row|col)\b|\d+\s*,\s*\d+", situation), situation
        assert re.fullmatch(
            r"(on the start tile|on a frozen tile|in a hole|on the goal)"
            r"(; (left|down|right|up): (edge|frozen|hole|goal)){4}; goal: (here|((down|up)(-(left|right))?|left|right) at distance \d+)",
            situation,
        ), situation
        assert situation == env.spec.situation(obs)  # a pure function of the text
        assert ("on the start tile" in situation) == (", on a start (frozen, safe) tile" in obs)


@pytest.mark.parametrize("name", ["frozenlake-random-4x4", "frozenlake-random-6x6", "frozenlake-8x8"])
def test_a_move_changes_the_situation_and_a_bump_does_not(name: str) -> None:
    """Reflection tells a bump from a move by the situation: a move changes the distance."""
    env = make_env(name)
    for seed in range(8):
        before = env.reset(seed=seed)
        rng = random.Random(seed)
        for _ in range(15):
            result = env.step(rng.choice(list(env.valid_actions())))
            moved = result.info["event"] != "bump"
            assert (env.spec.situation(result.observation) != env.spec.situation(before)) == moved
            if result.done:
                break
            before = result.observation


def test_a_situation_recurs_on_maps_never_trained_on() -> None:
    """What the situation names transfers: most of what the held-out maps show the agent was
    already seen on a training map, where no coordinate pair would mean the same tile."""
    from forge.envs.gym import held_out_seeds, train_seeds

    name = "frozenlake-random-6x6"
    trained = {make_env(name).spec.situation(o) for o in lake_observations(name, seeds=train_seeds(6)[:40])}
    tested = [make_env(name).spec.situation(o) for o in lake_observations(name, seeds=held_out_seeds(6)[:20])]
    assert sum(s in trained for s in tested) > len(tested) / 2


def test_frozenlake_instance_terms_and_abstract() -> None:
    from forge.envs.gym import frozenlake_abstract, frozenlake_instance_terms

    text = "when you are at row 2, col 0, on a frozen tile, do not down; at (2, 0) or at 2,0 seed 7"
    assert frozenlake_instance_terms(text) == ["row 2, col 0", "(2, 0)", "at 2,0", "seed 7"]
    assert frozenlake_instance_terms("when down: hole; goal: down-right at distance 4, do not down") == []
    assert frozenlake_abstract("when you are at row 2, col 0, on a frozen tile, do not down") == (
        "when you are on a frozen tile, do not down"
    )
    # nothing true elsewhere replaces a bare coordinate: the rule is left without a situation
    assert frozenlake_abstract("when at row 2, col 0, do not down") == "when, do not down"
    env = make_env("frozenlake-random-5x5")
    for obs in lake_observations("frozenlake-random-5x5", seeds=range(3), steps=4):
        general = frozenlake_abstract(obs)
        assert frozenlake_instance_terms(general) == [] and frozenlake_instance_terms(obs)
        assert "Next to you:" in general and "The goal is " in general  # the surroundings stay
        assert env.spec.abstract is frozenlake_abstract and env.spec.instance_terms is frozenlake_instance_terms
    start = make_env("frozenlake-4x4").reset(seed=0)
    assert "You are on a start (frozen, safe) tile. The goal is down-right at distance 6." in frozenlake_abstract(start)


def test_text_that_is_no_lake_observation_gets_the_generic_summary_without_coordinates() -> None:
    situation = make_env("frozenlake-4x4").spec.situation
    assert situation("Step 1 of 5.\nYou are at row 2, col 0, near the hole. More.") == "You are near the hole"
    assert situation("Step 1 of 5.\nThe ice creaks.") == "The ice creaks"


def test_the_walker_obeys_a_rule_named_by_the_lake_situation() -> None:
    """The scripted test model takes the prompt's word for which rules hold here: a rule
    learned on one map ("down: hole") keeps it out of the hole on another map."""
    from forge.engine.memory import Memory
    from forge.learn.policy import FlatPolicy
    from forge.learn.prompt import recollect
    from forge.llm.testing import WalkerLLM
    from forge.model import Kind, Unit, Viewer

    env = make_env("frozenlake-random-6x6")
    rule = Unit("when down: hole, do not down", kind=Kind.RULE, owner="a", scope="private")

    def moves(with_rule: bool) -> list[tuple[str, str]]:
        out = []
        with Memory.open(":memory:", embedder="hash") as mem:
            if with_rule:
                mem.add([rule])
            policy = FlatPolicy(llm=lambda role: WalkerLLM(seed=1), spec=env.spec)
            for seed in range(30):
                obs = env.reset(seed=seed)
                rec = recollect(mem, viewer=Viewer.of("a"), query=obs, role="actor", valid_actions=env.valid_actions())
                for _ in range(6):
                    action = policy.act(observation=obs, valid_actions=env.valid_actions(), history=[], memory={"actor": rec}).action
                    out.append((env.spec.situation(obs), action))
                    result = env.step(action)
                    if result.done:
                        break
                    obs = result.observation
        return out

    above_a_hole = [a for s, a in moves(True) if "down: hole" in s]
    assert above_a_hole and "down" not in above_a_hole
    assert "down" in [a for s, a in moves(False) if "down: hole" in s]  # without the rule it falls
