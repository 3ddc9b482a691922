"""One definition of each shared concept: the representations, the id scheme, the success rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import forge.learn.reflect
import forge.protocols
import forge.protocols.config
from forge.curate import ConsolidationPolicy, consolidate, import_seed_pack
from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.envs.base import EnvSpec, StepResult
from forge.learn.loop import Trajectory, failure_point, play_episode
from forge.learn.policy import FlatPolicy
from forge.learn.rules import write as write_rule
from forge.llm.testing import ScriptedLLM
from forge.model import Scope, Unit, Viewer, derived_id
from forge.protocols.config import ForgeConfig
from forge.protocols.episode import _episode
from forge.store import Filter, SQLiteStore
from forge.team import Action, Outcome, TaskLesson, TeamMemory
from forge.team import consolidate as team_consolidate


def test_the_representations_are_defined_once_in_learn() -> None:
    assert forge.protocols.config.REPRESENTATIONS is forge.learn.reflect.REPRESENTATIONS
    assert forge.protocols.REPRESENTATIONS is forge.learn.reflect.REPRESENTATIONS


# -- one id scheme -------------------------------------------------------------------------
# The ids below were written by the four schemes FORGE had before forge.model.derived_id
# (team, consolidation, seeds, LangGraph). They are persisted (a resumed team run, a rerun
# consolidation, a re-imported seed pack, a LangGraph key all find their unit by its id),
# so the one scheme must give exactly these.


def test_derived_id_is_deterministic_prefixed_and_total() -> None:
    a = derived_id("x", "one", 2, Scope.parse("group:ops"))
    assert a == derived_id("x", "one", 2, "group:ops") and a.startswith("x:") and len(a) == 22
    assert a != derived_id("x", "one", 3, "group:ops") and a[2:] != derived_id("y", "one", 2, "group:ops")[2:][::-1]
    assert derived_id("y", "one", 2, "group:ops") == "y:" + a[2:]  # the prefix names, the parts identify
    assert derived_id("x", "bad \udc80 text").startswith("x:")  # any text gets an id
    lg = derived_id("lg", "k", algorithm="sha256", digits=32, sep="-")
    assert lg.startswith("lg-") and len(lg) == 35


def test_team_ids_are_the_ones_written_before(tmp_path: Path) -> None:
    with Memory.open(tmp_path / "t.db", embedder="hash") as m:
        tm = TeamMemory(m, team="red", agents=["dba"], layout="shared")
        rule = write_rule("You are at row 1, col 0", "down", ["right"])
        rec = tm.record_task(
            task="orders updates hang", outcome=Outcome(success=True, score=1.0), actions=[Action("dba", "SELECT 1")],
            team=["dba"], task_type="locks", lesson=TaskLesson(("Check pg_locks first.",), None, "test"), rules=[rule],
        )
        assert rec.episode_units == ("episode:1b06a589f7e430abe161",)
        assert rec.rule_units == ("rule:ab6fc69f18e89303cd18",)
        tm.record_task(
            task="users updates hang", outcome=Outcome(success=True, score=1.0), actions=[Action("dba", "SELECT 1")],
            team=["dba"], task_type="locks", lesson=TaskLesson(("Check pg_locks first.",), None, "test"),
        )
        [c] = team_consolidate(tm).generalised
        assert c.procedure == "procedure:0432d2107034b1c40b0f"


def test_consolidation_seed_and_langgraph_ids_are_the_ones_written_before(tmp_path: Path) -> None:
    with Memory(SQLiteStore(tmp_path / "c.db"), HashingEmbedder(256)) as m:
        disk = "When the disk is full, then rotate the logs and compress them"
        m.add([Unit(f"{disk}{end}", id=f"r{i}", kind="rule", created_at=1.0 + i) for i, end in enumerate([".", " quickly.", " today."])])
        [c] = consolidate(m, policy=ConsolidationPolicy(subsume_at=1.0), now=10.0).generalised
        assert c.unit_id == "gen:ee6cfbae166ac3b54426"
        pack = tmp_path / "pack.jsonl"
        pack.write_text(json.dumps({"content": "When the tile ahead is a hole, then step around it."}) + "\n")
        import_seed_pack(m, pack, scope="group:ops")
        [seed] = [u.id for u in m.list(viewer=Viewer.admin(), filter=Filter.make(kinds=["rule"])) if u.id.startswith("seed:")]
        assert seed == "seed:c6f04b315adc3010d4c3"
    pytest.importorskip("langgraph")
    from forge.integrations.langgraph import ForgeStore

    with Memory(SQLiteStore(tmp_path / "lg.db"), HashingEmbedder(128)) as m:
        ForgeStore(m, agent="planner").put(("users", "ann"), "prefs", {"content": "likes short answers"})
        [u] = m.list(viewer=Viewer.admin())
        assert u.id == "lg-f9b98e46ccd782533170636f9d3785d2"


# -- one success rule ------------------------------------------------------------------------


class Steps:
    """An env that pays ``rewards`` one step at a time and never ends by itself."""

    def __init__(self, rewards: list[float]) -> None:
        self.rewards = rewards
        self.spec = EnvSpec(name="steps", description="Walk on.", max_steps=len(rewards), tau=-1.0, theta=3.0,
                            success_return=1.0, major_failure_return=-5.0)

    def reset(self, *, seed: int) -> str:
        self.t = 0
        return "at step 0"

    def valid_actions(self) -> list[str]:
        return ["go"]

    def step(self, action: str) -> StepResult:
        self.t += 1
        return StepResult(f"at step {self.t}", self.rewards[self.t - 1], False)

    def close(self) -> None:
        pass


def play(env: Steps, *, abort: bool) -> Trajectory:
    policy = FlatPolicy(llm=lambda role: ScriptedLLM(["go"], repeat_last=True), spec=env.spec)
    return play_episode(env, policy, None, seed=0, tau=env.spec.tau, abort=abort)


def test_the_success_rule_is_the_return_in_an_attempt_not_cut_off() -> None:
    spec = Steps([0.0]).spec
    assert spec.succeeded(1.0) and not spec.succeeded(0.99) and not spec.succeeded(5.0, aborted=True)


def test_an_episode_that_dipped_below_tau_and_played_on_is_judged_by_its_return() -> None:
    # Before the one rule, the protocols and the agent read "fell below tau and did not end"
    # as aborted, so a checkpoint or evaluation episode (played without abort) that dipped
    # once and still reached the success return was a failure there, while the FORGE stage
    # summary and the team runner, reading the return, counted it a success.
    env = Steps([-2.0, 2.0, 2.0])
    traj = play(env, abort=False)
    assert traj.failing == 0 and not traj.done and not traj.aborted and traj.total == 2.0
    ep = _episode(traj, agent="a", config=ForgeConfig(env="frozenlake-4x4", llm="test"), env=env, meta={})
    assert ep.outcome["success"] is True and ep.outcome["aborted"] is False
    assert failure_point(traj, spec=env.spec, reflect_on_stall=True) == (0, False)  # still reflected on


def test_an_aborted_attempt_is_never_a_success_whatever_its_partial_return() -> None:
    # The swarm member counted a failure by the return alone, so an aborted attempt that had
    # already earned the success return reset its "stuck" count; now it counts as stuck.
    env = Steps([5.0, -2.0, 2.0])
    traj = play(env, abort=True)
    assert traj.aborted and traj.failing == 1 and traj.total == 3.0
    ep = _episode(traj, agent="a", config=ForgeConfig(env="frozenlake-4x4", llm="test"), env=env, meta={})
    assert ep.outcome["success"] is False and ep.outcome["aborted"] is True
    assert not env.spec.succeeded(traj.total, aborted=traj.aborted)
