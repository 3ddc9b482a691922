"""Team lessons and procedures in the goal's terms: what one map or game taught, read on the next.

A lesson that lists the moves that won one game is one map's walk; on the next generated game
it is wrong. These tests play real envs (random FrozenLake maps; TextWorld games when the
optional extra is installed) and hold the lessons and procedures to the envs' own
``instance_terms`` and to the walks they came from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from forge.engine.memory import Memory
from forge.envs import Env, make_env
from forge.envs.base import EnvSpec
from forge.envs.gym import held_out_seeds, oracle_action, random_map
from forge.envs.situation import situation_of
from forge.learn.loop import Trajectory
from forge.learn.rules import clauses
from forge.team import Action, Outcome, TeamMemory, consolidate, task_lesson
from forge.team.lessons import move_list

FL = "frozenlake-random-4x4"


def play(env: Env, seed: int, commands: Sequence[str] | None = None) -> Trajectory:
    """The trajectory of ``commands`` (else the env's own plan, one oracle step at a time)."""
    traj, obs = Trajectory(), env.reset(seed=seed)
    for t in range(env.spec.max_steps):
        if commands is not None and t >= len(commands):
            break
        action = commands[t] if commands is not None else oracle_action(env)  # type: ignore[arg-type]
        r = env.step(action)
        traj.observations.append(obs)
        traj.actions.append(action)
        traj.rewards.append(r.reward)
        if r.reward < env.spec.tau and traj.failing is None:
            traj.failing = t
        obs = r.observation
        if r.done:
            break
    return traj


def lesson_of(env: Env, traj: Trajectory, task: str = "a task") -> tuple[str, object]:
    acts = [Action("agent-1", a) for a in traj.actions]
    won = env.spec.succeeded(traj.total)
    got = task_lesson(None, task=task, actions=acts, outcome=Outcome(success=won), trajectory=traj, spec=env.spec)
    return got.lessons[0], got


# -- FrozenLake: random maps ----------------------------------------------------------------------


def test_a_frozenlake_success_is_written_in_its_situations_not_its_coordinates_or_walk() -> None:
    env = make_env(FL)
    seeds = held_out_seeds(4, 3)
    assert len({tuple(random_map(4, s)) for s in seeds}) == 3  # three different maps
    for seed in seeds:
        traj = play(env, seed)
        assert env.spec.succeeded(traj.total)
        text, got = lesson_of(env, traj)
        assert env.spec.instance_terms(text) == [] and not re.search(r"\brow\b|\bcol\b", text)  # no coordinate
        assert move_list(text, [traj.actions]) == ""  # not the walk
        assert got.steps == len(traj.actions) == 6 and got.source == "record"
        # the winning step, by what lay there; the other moves summed up, not listed
        assert got.parts[0] in ("when right: goal, right, as the goal says", "when down: goal, down, as the goal says")
        assert got.parts[1].startswith("other moves: the way the goal names, to frozen")
        holes_beside = any("hole" in situation_of(o, env.spec) for o in traj.observations[:-1])
        assert ("none to edge or hole" in got.parts[1]) == holes_beside  # on offer and never taken


def test_a_frozenlake_failure_names_the_clause_it_ignored() -> None:
    env = make_env(FL)
    seed = next(s for s in held_out_seeds(4, 20) if random_map(4, s)[1][0] == "H")  # a hole below the start
    traj = play(env, seed, ["down"])
    assert traj.failing == 0
    acts = [Action("agent-1", "down")]
    got = task_lesson(None, task="t", actions=acts, outcome=Outcome(success=False), trajectory=traj, spec=env.spec, at=0)
    assert got.parts == ("when down: hole, down (reward -1, below tau -0.5)",)
    assert got.lessons[0] == "For tasks like 't', this failed after 1 step: when down: hole, down (reward -1, below tau -0.5)."
    assert got.diagnosis == "score 0 was not enough to succeed"


def test_a_part_that_still_names_an_instance_term_is_dropped_and_why_is_kept() -> None:
    env = make_env(FL)
    traj = play(env, held_out_seeds(4, 1)[0])
    strict = EnvSpec(  # an env for which "frozen" names one map only
        name="strict", description="", max_steps=20, tau=-0.5, theta=1.0, success_return=1.0, major_failure_return=-1.0,
        situation=env.spec.situation, instance_terms=lambda text: re.findall(r"\bfrozen\b", text),
    )
    got = task_lesson(None, task="t", actions=[], outcome=Outcome(success=True), trajectory=traj, spec=strict)
    assert len(got.parts) == 1 and "frozen" not in got.lessons[0]
    (why,) = got.dropped
    assert why.startswith("dropped: names what holds in this task only (frozen): 'other moves: ")


def situated(observations: list[str], actions: list[str], rewards: list[float]) -> Trajectory:
    return Trajectory(observations=observations, actions=actions, rewards=rewards)


#: An env whose observations are their own situations, to write trajectories by hand.
PLAIN = EnvSpec(
    name="plain", description="", max_steps=20, tau=-0.5, theta=1.0, success_return=1.0, major_failure_return=-1.0,
    situation=lambda obs: obs,
)


def test_moves_taken_now_and_then_are_no_lesson_and_a_list_is_never_written() -> None:
    rooms = [
        "in a room; exits east; goal: take a coin",
        "in a room; exits east, west; go west: the way back; goal: take a coin",
        "in a room; exits east, west; go west: the way back; goal: take a coin",
        "in a room; exits north, south; go south: the way back; goal: take a coin",
        "in a room with a coin; exits west; go west: the way back; goal: take a coin",
    ]
    walk = ["go east", "go west", "go east", "go north", "take coin"]  # went back once of three
    traj = situated(rooms, walk, [-0.01] * 4 + [1.99])
    got = task_lesson(None, task="t", actions=[], outcome=Outcome(success=True), trajectory=traj, spec=PLAIN)
    assert got.parts == ("when in a room with a coin, take coin, as the goal says",)
    assert got.lessons[0] == "For tasks like 't', this worked (solved in 5 steps): when in a room with a coin, take coin, as the goal says."
    never = situated(rooms, ["go east", "go east", "go east", "go north", "take coin"], [-0.01] * 4 + [1.99])
    got = task_lesson(None, task="t", actions=[], outcome=Outcome(success=True), trajectory=never, spec=PLAIN)
    assert got.parts[1] == "other moves: none to the way back"


# -- TextWorld: two held-out games of one family ----------------------------------------------------

KIND_WORDS = {"room", "door", "container", "supporter", "key", "food", "object", "coin"}


@pytest.fixture(scope="module")
def tw_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("textworld", reason="textworld is an optional extra: pip install '.[textworld]'")
    return tmp_path_factory.mktemp("textworld")


def walkthrough(env: Env, seed: int) -> Trajectory:
    env.reset(seed=seed)
    return play(env, seed, list(env.walkthrough))  # type: ignore[attr-defined]


def names_of(env: Env) -> set[str]:
    """The generated names of the game ``env`` plays, from TextWorld's own game file."""
    data = json.loads(env.game_path.with_suffix(".json").read_text(encoding="utf-8"))  # type: ignore[attr-defined]
    return {info["name"].lower() for _, info in data["infos"] if info.get("name")} - KIND_WORDS


@pytest.mark.slow
@pytest.mark.parametrize(("family", "seeds"), [("coin-1", (1000, 1001)), ("treasure-1", (1000, 1002))])
def test_a_textworld_lesson_from_game_a_names_nothing_of_a_and_reads_the_same_on_game_b(
    tw_cache: Path, memory: Memory, family: str, seeds: tuple[int, int]
) -> None:
    a_env = make_env(f"textworld:{family}", cache_dir=tw_cache)
    b_env = make_env(f"textworld:{family}", cache_dir=tw_cache)
    a, b = (walkthrough(env, seed) for env, seed in ((a_env, seeds[0]), (b_env, seeds[1])))
    assert a.actions != b.actions  # two maps, two walks
    task = f"{family.split('-')[0]} task (level 0) in textworld:{family}"
    text, got = lesson_of(a_env, a, task)
    assert a_env.spec.instance_terms(text) == []
    assert not [n for n in names_of(a_env) if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text, re.I)]
    assert not any(move in text for move in a.actions if move.startswith("go "))  # no move of A's walk
    # the last step is read in the clause the env keys its take by, in kinds: in a treasure
    # game the room clause ("in a room with a key") also holds where a wrong key lies
    take = a_env.spec.abstract(a.actions[-1])
    assert got.parts[0] == f"when {take}: the goal's object, {take}, as the goal says"
    # the env names the goal's way from each room, so the walk is also read in its clauses
    assert got.parts[1] == "other moves: the way the goal names, in its order, to the goal's way, none to the way back"
    _, on_b = lesson_of(b_env, b, task)
    assert on_b.parts == got.parts  # what A taught is what B would teach: it transfers

    # Consolidated from A alone (no model: the composed fallback), recalled for B, true on B.
    tm = TeamMemory(memory, team="red", agents=["agent-1"], layout="shared")
    tm.record_task(task=task, outcome=Outcome(success=True, score=1.0), actions=[Action("agent-1", x) for x in a.actions],
                   team=["agent-1"], task_type=family.split("-")[0], env=a_env.spec.name, lesson=got)
    report = consolidate(tm, specs={a_env.spec.name: a_env.spec}.get)
    (c,) = report.generalised
    (proc,) = tm.procedures()
    assert c.author == "fallback" and proc.knowledge.startswith(f"Solved 1 time in 3 steps. When {take}: the goal's object, ")
    for env in (a_env, b_env):
        assert env.spec.instance_terms(proc.knowledge) == []
    assert move_list(proc.knowledge, [a.actions]) == "" and "go " not in proc.knowledge
    b_obs = b_env.reset(seed=seeds[1])
    query = f"{task}\n{b_env.spec.name}: {situation_of(b_obs, b_env.spec)}"
    recalled = tm.recollect("agent-1", query, valid_actions=b_env.valid_actions(), abstract=b_env.spec.abstract)
    assert proc.id in recalled.ids
    # Its situated step holds on B: B's last room has that clause, and the act is one of B's there.
    when, act = got.parts[0].removeprefix("when ").removesuffix(", as the goal says").split(", take ")
    obs = b_env.reset(seed=seeds[1])
    for move in b.actions[:-1]:
        obs = b_env.step(move).observation
    assert when in clauses(situation_of(obs, b_env.spec))
    assert f"take {act}" in {b_env.spec.abstract(x) for x in b_env.valid_actions()}
