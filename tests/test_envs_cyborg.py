"""CybORG CAGE-2 adapter: runs only where CybORG is installed (from git), else says why.

The text helpers (situation line, its parser, the scripted blue) are pure and tested always.
"""

from __future__ import annotations

import importlib.util
import inspect
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from forge.envs import Env, EnvSpec, make_env, oracle_action
from forge.envs.cyborg import (
    cage2_abstract,
    cage2_instance_terms,
    cage2_situation,
    host_role,
    parse_cage2_situation,
    rule_based_action,
)
from forge.errors import ConfigError, UserError, ValidationError

HAVE_CYBORG = importlib.util.find_spec("CybORG") is not None
needs_cyborg = pytest.mark.skipif(
    not HAVE_CYBORG,
    reason="CybORG is not installed (git-only: pip install -e cage-challenge-2/CybORG)",
)

OBS = (
    "Step 7 of 30. Activity: exploit Enterprise1, scan User2; compromised: Enterprise1 user, "
    "User1 privileged, User3 unknown.\nLast step: remove User3 succeeded, reward -0.1."
)


# -- pure text helpers (no CybORG needed) ------------------------------------------------------


def test_situation_is_the_host_states_by_role_without_the_step_counter() -> None:
    assert cage2_situation(OBS) == (
        "Activity: exploit on an Enterprise host, scan on a User host; compromised: an "
        "Enterprise host (user), a User host (privileged), a User host (unknown)"
    )
    over = "Step 30 of 30. The episode is over. Activity: none; compromised: none.\nLast step: x"
    assert cage2_situation(over) == "Activity: none; compromised: none"
    # roles in a fixed order, most valuable first, counted where they repeat
    busy = (
        "Step 9 of 30. Activity: scan User1, scan User4, exploit Op_Server0; compromised: "
        "User4 privileged, User1 privileged, Defender user, Op_Host2 user.\nLast step: x"
    )
    assert cage2_situation(busy) == (
        "Activity: exploit on the Op_Server, scan on 2 User hosts; compromised: an Op_Host "
        "(user), the Defender (user), 2 User hosts (privileged)"
    )


def test_two_networks_in_the_same_state_by_role_share_one_situation() -> None:
    """What a rule learned on one attack path needs to apply on another."""
    here = "Step 3 of 30. Activity: exploit User1; compromised: User1 user.\nLast step: x"
    there = "Step 5 of 30. Activity: exploit User3; compromised: User3 user.\nLast step: y"
    assert cage2_situation(here) == cage2_situation(there) == (
        "Activity: exploit on a User host; compromised: a User host (user)"
    )


SAMPLES = [
    OBS,
    "Step 0 of 30. Activity: none; compromised: none.\nLast step: the episode has just started.",
    "Step 2 of 20. Activity: exploit User2; compromised: User2 user.\nLast step: sleep succeeded, reward 0.0.",
    "Step 12 of 30. Activity: scan Op_Host0, exploit Enterprise0; compromised: Enterprise0 user, Op_Server0 privileged.\nLast step: restore Enterprise2 succeeded, reward -2.0.",
]


def test_instance_terms_are_host_names_with_numbers() -> None:
    assert cage2_instance_terms(OBS) == ["Enterprise1", "User2", "User1", "User3"]
    assert cage2_instance_terms("when red exploits user2, restore op_server0 (seed 4)") == ["user2", "op_server0", "seed 4"]
    assert cage2_instance_terms("when the Defender and 2 User hosts are seen, monitor") == []
    for text in SAMPLES:
        assert cage2_instance_terms(cage2_situation(text)) == []


def test_abstract_rewrites_host_names_into_roles() -> None:
    assert cage2_abstract("remove User2") == "remove a User host"
    assert cage2_abstract("restore Enterprise0, then Op_Server0") == "restore an Enterprise host, then the Op_Server"
    rule = "when Activity: exploit User1; compromised: User1 user, do not sleep; remove User1 was safe there"
    assert cage2_abstract(rule) == (
        "when Activity: exploit on a User host; compromised: a User host (user), do not sleep; "
        "remove a User host was safe there"
    )
    for text in [*SAMPLES, rule, "analyse user3 after seed 9"]:
        general = cage2_abstract(text)
        assert cage2_instance_terms(general) == [], general
        assert cage2_abstract(general) == general  # nothing left to rewrite
    assert [host_role(h) for h in ("User0", "Enterprise2", "Op_Server0", "Op_Host1", "Defender", "Printer")] == [
        "User", "Enterprise", "Op_Server", "Op_Host", "Defender", "host",
    ]


def test_situation_parses_back_to_host_states() -> None:
    assert parse_cage2_situation(OBS) == {
        "Enterprise1": ("exploit", "user"),
        "User2": ("scan", "no"),
        "User1": ("none", "privileged"),
        "User3": ("none", "unknown"),
    }
    assert parse_cage2_situation("Step 0 of 30. Activity: none; compromised: none.") == {}


def test_scripted_blue_reads_the_text() -> None:
    # A server-side host red holds is restored first, whatever else is going on.
    assert rule_based_action(OBS) == "restore Enterprise1"
    # Red's user access on a user host is removed; its root on a user host is left (0.1/step).
    assert rule_based_action("Activity: exploit User2; compromised: User2 user") == "remove User2"
    assert rule_based_action("Activity: none; compromised: User1 privileged, User3 unknown") == (
        "analyse User3"
    )
    # Quiet: plant each decoy once, in order, skipping what was already tried.
    quiet = "Step 1 of 30. Activity: none; compromised: none."
    assert rule_based_action(quiet) == "decoy_apache Enterprise1"
    assert rule_based_action(quiet, taken=["decoy_apache Enterprise1"]) == (
        "decoy_femitter Enterprise1"
    )


def test_env_spec_situation_is_optional_and_ignored_by_equality() -> None:
    base = {
        "name": "x", "description": "d", "max_steps": 3, "tau": -1.0, "theta": 1.0,
        "success_return": 1.0, "major_failure_return": -1.0,
    }
    assert EnvSpec(**base).situation is None and not EnvSpec(**base).actions_in_description
    assert EnvSpec(**base, situation=cage2_situation) == EnvSpec(**base)


@pytest.mark.skipif(HAVE_CYBORG, reason="CybORG is installed; this checks the missing-install hint")
def test_missing_cyborg_is_a_config_error_with_an_install_hint() -> None:
    with pytest.raises(ConfigError, match="pip install"):
        make_env("cyborg-cage2")


# -- the adapter over the real CybORG ----------------------------------------------------------


def expand_actions(description: str) -> set[str]:
    """Every action the description's grammar names: what a model sees instead of a listing."""
    head = re.search(r"^Actions \(\d+; [^)]*\): (.*)$", description, re.M)
    assert head, description
    bare = {a for a in head[1].split(" | ") if a != "VERB HOST"}
    verbs = re.findall(r"^VERB\d*: (.*)$", description, re.M)
    hosts = re.findall(r"^HOST\d*: (.*)$", description, re.M)
    return bare | {f"{v} {h}" for vs, hs in zip(verbs, hosts, strict=True) for v in vs.split() for h in hs.split()}


@needs_cyborg
def test_cage2_plays_thirty_steps_and_replays_for_a_seed() -> None:
    env = make_env("cyborg-cage2")
    assert isinstance(env, Env) and env.spec.tau == -1.1 and env.spec.max_steps == 30

    def run(seed: int) -> list[tuple[str, float]]:
        obs = env.reset(seed=seed)
        assert obs.startswith("Step 0 of 30. Activity: none; compromised: none.")
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


@needs_cyborg
def test_cage2_description_names_all_145_actions_and_never_changes() -> None:
    env = make_env("cyborg-cage2")
    description = env.spec.description
    env.reset(seed=0)
    actions = list(env.valid_actions())
    assert len(actions) == 145 and expand_actions(description) == set(actions)
    assert env.spec.actions_in_description
    for _ in range(5):
        env.step(oracle_action(env))
    env.reset(seed=9)
    assert env.spec.description == description
    assert make_env("cyborg-cage2", max_steps=12).spec.description == description


@needs_cyborg
def test_cage2_observation_is_host_states_without_addresses() -> None:
    env = make_env("cyborg-cage2")
    observations = [env.reset(seed=1)]
    for _ in range(12):
        observations.append(env.step("sleep").observation)
    for obs in observations:
        assert len(obs.splitlines()) == 2
        assert not re.search(r"\d+\.\d+\.\d+\.\d+", obs)  # no IP or subnet columns
        situation = env.spec.situation(obs)
        assert situation == cage2_situation(obs) and "Step" not in situation
        assert env.spec.instance_terms(situation) == []  # roles, not host names
    # Against a sleeping blue, B_line is seen exploiting hosts within 12 steps.
    seen = [env.spec.situation(o) for o in observations]
    assert any(re.search(r"exploit on (a|an|the) ", s) for s in seen)
    assert any(re.search(r"compromised: .*\(user\)", s) for s in seen)
    assert any(re.search(r"exploit User\d", o) for o in observations)  # the text keeps the names
    assert env.spec.abstract is cage2_abstract and env.spec.instance_terms is cage2_instance_terms


@needs_cyborg
def test_cage2_rewards_equal_raw_cyborg() -> None:
    """Random blue actions through the adapter and straight through CybORG: same rewards."""
    import numpy as np
    from CybORG import CybORG
    from CybORG.Agents import B_lineAgent

    scenario = Path(inspect.getfile(CybORG)).parent / "Shared" / "Scenarios" / "Scenario2.yaml"
    raw = CybORG(str(scenario), "sim", agents={"Red": B_lineAgent})
    env = make_env("cyborg-cage2")
    for seed in range(12):
        env.reset(seed=seed)
        rng = random.Random(seed)
        names = [rng.choice(list(env.valid_actions())) for _ in range(30)]
        mine = [env.step(name).reward for name in names]
        random.seed(seed)
        np.random.seed(seed)
        raw.reset(agent="Blue")
        theirs = [float(raw.step(agent="Blue", action=env.cyborg_action(n)).reward) for n in names]
        assert mine == theirs, seed
    env.close()


@needs_cyborg
def test_cage2_thresholds_scale_with_the_horizon() -> None:
    long, short = make_env("cyborg-cage2").spec, make_env("cyborg-cage2", max_steps=15).spec
    assert (long.theta, long.success_return, long.major_failure_return) == (-15.0, -10.0, -100.0)
    assert (short.theta, short.success_return) == (-7.5, -5.0)
    assert short.tau == long.tau == -1.1
    assert make_env("cyborg-cage2", max_steps=15, theta=-3.0).spec.theta == -3.0
    with pytest.raises(ConfigError, match="max_steps"):
        make_env("cyborg-cage2", max_steps=0)


@needs_cyborg
def test_cage2_scripted_blue_reading_only_text_beats_sleep_and_cyborg_react() -> None:
    """The text carries what a policy needs: a blue that reads only it defends the network."""
    from CybORG.Agents import BlueReactRestoreAgent

    env = make_env("cyborg-cage2")

    react = BlueReactRestoreAgent()

    def total(choose: Callable[[], str]) -> float:
        score = 0.0
        for seed in range(4):
            env.reset(seed=seed)
            react.end_episode()
            for _ in range(30):
                score += env.step(choose()).reward
        return score / 4

    def react_action() -> str:
        raw = env.cyborg.get_observation("Blue")
        return env.action_name(react.get_action(raw, env.cyborg.get_action_space("Blue")))

    scripted, sleeping = total(lambda: oracle_action(env)), total(lambda: "sleep")
    reacting = total(react_action)
    assert scripted > env.spec.theta > reacting > sleeping
    with pytest.raises(UserError):
        env.oracle_action()  # the episode is over
    env.close()
