"""minicage: CAGE-2's shape without CybORG, so what breaks only with that shape breaks in CI.

First the env's contract (actions only after a reset, seeded, CAGE-2's rewards, rules name
roles), then every real path that plays an env (``forge evolve``, ``Agent.play``, ``forge
swarm``, ``forge team``) on it. Each in-process path plays through a spy that records any
``valid_actions()`` asked before the episode's reset, so a caller that catches the error
still fails here; the swarm's children are separate processes, where the error itself ends
the child and fails the run.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import forge.envs
from forge.envs import Env, available_envs, make_env, oracle_action
from forge.envs.cyborg import cage2_abstract, cage2_instance_terms, cage2_situation
from forge.envs.minicage import HOSTS, MiniCageEnv
from forge.errors import ConfigError, UserError, ValidationError

RESET_FIRST = "minicage: call reset(seed=...) before asking for actions"


def play(env: Env, *, seed: int, pick: Any) -> list[tuple[str, float]]:
    trace = [(env.reset(seed=seed), 0.0)]
    rng = random.Random(seed)
    done = False
    while not done:
        result = env.step(pick(rng))
        trace.append((result.observation, result.reward))
        done = result.done
    return trace


def observations(seeds: range, *, pick: str = "random") -> list[str]:
    env = make_env("minicage")
    out: list[str] = []
    for seed in seeds:
        chooser = (lambda rng: rng.choice(list(env.valid_actions()))) if pick == "random" else (lambda rng: pick)
        out.extend(o for o, _ in play(env, seed=seed, pick=chooser))
    return out


# -- the env's contract -------------------------------------------------------------------------


def test_actions_exist_only_after_reset_as_in_cyborg() -> None:
    env = make_env("minicage")
    assert isinstance(env, Env) and "minicage" in available_envs()
    with pytest.raises(UserError) as err:
        env.valid_actions()
    assert str(err.value) == RESET_FIRST  # the CybORG adapter's words, with this env's name
    with pytest.raises(UserError, match="reset"):
        env.step("sleep")
    env.reset(seed=0)
    actions = list(env.valid_actions())
    assert actions[:2] == ["sleep", "monitor"] and len(actions) == 2 + 3 * len(HOSTS)
    assert {f"{v} {h}" for v in ("analyse", "remove", "restore") for h in HOSTS} <= set(actions)
    with pytest.raises(ValidationError, match="sleep"):
        env.step("decoy_apache User1")
    assert env.step(" Restore USER1 ").observation.count("\n") == 1  # case forgiven, two lines


def test_the_description_names_every_action_and_never_changes() -> None:
    env = make_env("minicage")
    description = env.spec.description
    env.reset(seed=0)
    assert env.spec.actions_in_description
    head = re.search(r"^Actions \((\d+); [^)]*\): (.*)$", description, re.M)
    assert head and int(head[1]) == len(env.valid_actions())
    verbs, hosts = re.search(r"^VERB: (.*)$", description, re.M), re.search(r"^HOST: (.*)$", description, re.M)
    assert verbs and hosts
    named = {a for a in head[2].split(" | ") if a != "VERB HOST"} | {f"{v} {h}" for v in verbs[1].split() for h in hosts[1].split()}
    assert named == set(env.valid_actions())
    for _ in range(5):
        env.step(oracle_action(env))
    env.reset(seed=9)
    assert env.spec.description == description == make_env("minicage", max_steps=12).spec.description


def test_a_seed_replays_exactly_and_seeds_differ() -> None:
    one, other = make_env("minicage"), make_env("minicage")

    def rnd(env: Env):
        return lambda rng: rng.choice(list(env.valid_actions()))

    assert play(one, seed=5, pick=rnd(one)) == play(other, seed=5, pick=rnd(other))
    play(one, seed=6, pick=rnd(one))
    assert play(one, seed=5, pick=rnd(one)) == play(other, seed=5, pick=rnd(other))  # after another episode too
    sleeping = {str(play(one, seed=s, pick=lambda rng: "sleep")) for s in range(10)}
    assert len(sleeping) > 3
    paths = set()
    for s in range(20):
        one.reset(seed=s)
        paths.add(one.path)
    assert all(p[0] == "User0" and p[-1] == "Op_Server0" for p in paths) and len(paths) == 4


def test_observations_have_cyborgs_two_line_format() -> None:
    env = make_env("minicage")
    assert env.reset(seed=3) == "Step 0 of 20. Activity: none; compromised: none.\nLast step: the episode has just started."
    for obs in observations(range(5)):
        first, last = obs.split("\n")
        assert re.fullmatch(
            r"Step \d+ of 20\.( The episode is over\.)? Activity: (none|(exploit|scan) \w+(, (exploit|scan) \w+)*); "
            r"compromised: (none|\w+ (user|privileged|unknown)(, \w+ (user|privileged|unknown))*)\.",
            first,
        ), first
        assert re.fullmatch(r"Last step: (the episode has just started\.|[\w ]+ (succeeded|failed), reward -?\d+\.\d\.)", last), last


def test_rewards_are_cage2s_and_restore_costs_one() -> None:
    env = make_env("minicage")
    assert (env.spec.tau, env.spec.max_steps) == (-1.1, 20)
    assert (env.spec.theta, env.spec.success_return, env.spec.major_failure_return) == pytest.approx((-10.0, -20 / 3, -200 / 3))
    env.reset(seed=0)
    first = env.step("restore Enterprise0")
    assert first.reward == -1.0 and "restore Enterprise0 succeeded, reward -1.0" in first.observation  # red holds nothing yet
    assert env.step("restore User0").reward == -1.0  # a restore costs even where it changes nothing
    # a sleeping blue: red's root costs 0.1 on a User host, 1 on an Enterprise host or the
    # server, 10 while it disrupts operations; rewards are never positive
    rewards = [r for _, r in play(env, seed=0, pick=lambda rng: "sleep")][1:]
    assert all(r <= 0 for r in rewards) and -0.1 in rewards and min(rewards) <= -12.0
    assert min(rewards) < env.spec.tau
    assert {round(-r % 1, 1) for r in rewards} <= {0.0, 0.1}  # sums of 0.1, 1 and 10


def test_remove_ends_user_access_only_and_analyse_shows_root() -> None:
    env = make_env("minicage")
    seed = next(s for s in range(50) if (env.reset(seed=s), env.path[1])[1] == "User1")
    env.reset(seed=seed)
    obs = ""
    for _ in range(6):
        obs = env.step("monitor").observation
        if "User1 user" in obs:
            break
    assert "compromised: User1 user" in obs
    removed = env.step("remove User1")
    access = env._access["User1"]  # test-only peek: what red really holds
    assert ("User1 unknown" in removed.observation) and ("remove User1 succeeded" in removed.observation) == (access is None)
    analysed = env.step("analyse User1").observation
    assert ("User1 privileged" in analysed) == (env._access["User1"] == "root")


def test_the_text_is_enough_to_defend_and_thresholds_tell_good_from_bad() -> None:
    env = make_env("minicage")
    scripted = [sum(r for _, r in play(env, seed=s, pick=lambda rng: oracle_action(env))) for s in range(30)]
    sleeping = [sum(r for _, r in play(env, seed=s, pick=lambda rng: "sleep")) for s in range(30)]
    assert sum(scripted) / 30 > env.spec.theta > env.spec.major_failure_return > max(sleeping)
    assert sum(t >= env.spec.success_return for t in scripted) >= 15
    with pytest.raises(UserError):
        env.oracle_action()  # the episode is over


def test_options_are_checked() -> None:
    assert make_env("minicage", max_steps=30).spec.theta == -15.0
    assert make_env("minicage", theta=-3.0).spec.theta == -3.0
    with pytest.raises(ConfigError, match="max_steps"):
        make_env("minicage", max_steps=0)


def test_situation_names_roles_never_host_names() -> None:
    env = make_env("minicage")
    assert env.spec.situation is cage2_situation
    assert env.spec.abstract is cage2_abstract and env.spec.instance_terms is cage2_instance_terms
    seen = set()
    for obs in observations(range(20)):
        situation = env.spec.situation(obs)
        assert not re.search(r"(User|Enterprise|Op_Server)\d", situation), situation
        assert env.spec.instance_terms(situation) == []
        assert situation == env.spec.situation(obs) and "Step" not in situation
        seen.add(situation)
    assert "Activity: exploit on a User host; compromised: a User host (user)" in seen
    assert any("an Enterprise host (user)" in s for s in seen) and len(seen) > 10


def test_abstract_removes_every_instance_term() -> None:
    env = make_env("minicage")
    texts = observations(range(20))
    texts += [f"when {t.split(chr(10))[0]}, do not sleep; restore {h} was safe there" for t, h in zip(texts[:30], HOSTS * 5, strict=False)]
    named = 0
    for text in texts:
        terms = env.spec.instance_terms(text)
        named += bool(terms)
        general = env.spec.abstract(text)
        assert env.spec.instance_terms(general) == [], general
        for term in terms:
            assert term not in general
    assert named > len(texts) / 2  # the texts did name hosts
    assert env.spec.abstract("restore Op_Server0 then remove User2") == "restore the Op_Server then remove a User host"


def test_the_minicage_class_is_what_make_env_builds() -> None:
    assert type(make_env("minicage")) is MiniCageEnv


# -- the real paths, through a spy that records actions asked before a reset ---------------------


class _Spy(MiniCageEnv):
    """minicage that also writes down every valid_actions() asked before its first reset."""

    early: list[str] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._reset_once = False

    def reset(self, *, seed: int) -> str:
        self._reset_once = True
        return super().reset(seed=seed)

    def valid_actions(self):  # type: ignore[override]
        if not self._reset_once:
            import traceback

            _Spy.early.append("".join(traceback.format_stack(limit=6)))
        return super().valid_actions()


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every in-process make_env("minicage") builds a _Spy; the list is what it caught."""
    _Spy.early = []
    monkeypatch.setitem(forge.envs._REGISTRY, "minicage", lambda **kw: _Spy(**kw))
    yield _Spy.early
    assert _Spy.early == [], "valid_actions() asked before reset:\n" + "\n---\n".join(_Spy.early)


def test_the_spy_catches_a_caller_that_asks_before_reset(spy: list[str]) -> None:
    env = make_env("minicage")
    with pytest.raises(UserError, match="before asking for actions"):
        env.valid_actions()
    assert len(spy) == 1
    spy.clear()  # this test broke the rule on purpose


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])  # in this process (the spy sees it), and in workers
def test_forge_evolve_plays_minicage(spy: list[str], tmp_path: Path, workers: str) -> None:
    from forge.cli import cli

    run = tmp_path / "run"
    res = CliRunner().invoke(cli, [
        "evolve", "--env", "minicage", "--llm", "test", "-n", "2", "-s", "1", "-k", "1",
        "--eval-episodes", "1", "--max-steps", "8", "--workers", workers, "--run-dir", str(run), "--json",
    ])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["condition"] == "forge" and summary["mean_return"] <= 0
    for inst in ("00", "01"):
        result = json.loads((run / f"checkpoints/stage-00/inst-{inst}.result.json").read_text())
        assert result["attempts"] and result["attempts"][0]["steps"] > 0


def test_agent_play_and_learn_on_minicage(spy: list[str]) -> None:
    from forge.learn import rules
    from forge.learn.policy import FlatPolicy
    from forge.llm.testing import WalkerLLM
    from forge.population.agent import Agent
    from forge.share.bus import MemoryBus

    env = make_env("minicage", max_steps=12)
    bus = MemoryBus()
    try:
        with Agent.open("a1", bus=bus, agents=["a1"], secret="s") as agent:
            policy = FlatPolicy(llm=lambda role: WalkerLLM(seed=2), spec=env.spec)
            learned = []
            for seed in range(3):
                traj = agent.play(env, policy, seed=seed)
                assert traj.actions and all(a in env.valid_actions() for a in traj.actions)
                learned += agent.learn(traj, env=env, seed=seed, policy=policy)
            assert learned  # red's servers cost more than tau: reflection wrote rules
            kinds = [*env.valid_actions(), *{env.spec.abstract(a) for a in env.valid_actions()}]
            for unit in learned:  # rules name roles, of hosts and of the actions on them
                parsed = rules.parse(unit.content, kinds)
                assert parsed is not None and parsed.avoid, unit.content
                assert cage2_instance_terms(unit.content) == [], unit.content
    finally:
        bus.close()


def test_an_eager_recaller_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The break this file guards against: actions read when the recaller is made, before the
    episode's reset (as Agent.play did before the fix) fail on minicage as on CybORG."""
    from forge.learn.policy import FlatPolicy
    from forge.llm.testing import ScriptedLLM
    from forge.population.agent import Agent

    real = Agent.recaller

    def eager(self: Agent, *, budget: int = 600, valid_actions: Any = (), **kw: Any) -> Any:
        return real(self, budget=budget, valid_actions=valid_actions() if callable(valid_actions) else valid_actions, **kw)

    monkeypatch.setattr(Agent, "recaller", eager)
    env = make_env("minicage")
    with Agent.open("a1") as agent, pytest.raises(UserError, match="before asking for actions"):
        agent.play(env, FlatPolicy(llm=lambda role: ScriptedLLM(), spec=env.spec), seed=0)


def test_forge_team_plays_minicage(spy: list[str], tmp_path: Path) -> None:
    from forge.team.cli import team_command

    res = CliRunner().invoke(team_command, [
        "--envs", "minicage", "--llm", "test", "--tasks", "2", "--team-size", "2", "--max-steps", "6",
        "--no-reflect", "--run-dir", str(tmp_path / "team"), "--json",
    ])
    assert res.exit_code == 0, res.output
    from forge.team.runner import load_results

    results = load_results(tmp_path / "team")
    assert [r["env"] for r in results] == ["minicage", "minicage"] and all(r["steps"] == 6 for r in results)


def test_forge_team_library_path_plays_minicage(spy: list[str], tmp_path: Path) -> None:
    from forge.team.runner import TeamConfig, run_team

    result = run_team(TeamConfig(tasks=2, team_size=3, memory="hybrid", llm="test", envs=("minicage",), seed=1, max_steps=6), tmp_path / "t")
    assert len(result.results) == 2 and all(r["env"] == "minicage" for r in result.results)


def _redis_or_skip() -> None:
    redis = pytest.importorskip("redis", reason="redis-py is not installed (pip install 'forge-memory[redis]')")
    client = redis.Redis.from_url("redis://127.0.0.1:6379/0", socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis not reachable at 127.0.0.1:6379: {exc}")
    finally:
        client.close()


@pytest.mark.slow
def test_forge_swarm_plays_minicage(tmp_path: Path) -> None:
    """Agents in their own processes: an error there ends the child and fails the run."""
    _redis_or_skip()
    from forge.population.swarm_cli import swarm_command

    out = tmp_path / "swarm"
    res = CliRunner().invoke(swarm_command, [
        "--env", "minicage", "--llm", "test", "--agents", "2", "--episodes", "2", "--max-steps", "8",
        "--linger", "1", "--dir", str(out), "--json",
    ])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "swarm.json").read_text())
    assert data["status"] == "ok" and data["exit_codes"] == {"agent-1": 0, "agent-2": 0}, data["failures"]
    assert all(a["episodes"] == 2 for a in data["agents"].values())
