"""One way from a reflection to memory, for the agent, the protocols and the team.

A reflection's delete indexes count the rules shown to a role (``Snapshot.of`` numbers only
rules). With a lesson and an example shown before the rule, deleting rule 0 must archive the
rule, not the lesson: the agent used to index every shown unit and archived the lesson.
"""

from __future__ import annotations

import dataclasses

from forge.engine.memory import Memory
from forge.envs import make_env
from forge.learn.loop import Caps, learn_from
from forge.learn.policy import FlatPolicy
from forge.learn.reflect import Reflection, RuleEdit
from forge.llm.testing import ScriptedLLM
from forge.model import Kind, Status, Unit, Viewer
from forge.population import agent as agent_module
from forge.population.agent import Agent
from forge.share.bus import MemoryBus

ADMIN = Viewer.admin()


def mixed(memory: Memory, owner: str = "a1") -> list[Unit]:
    """A lesson, an example and a rule, shown to the actor in that order."""
    units = [
        Unit("Holes end the episode; the goal wins it.", kind=Kind.LESSON, owner=owner),
        Unit("walk right then down", kind=Kind.EXAMPLE, owner=owner),
        Unit("when a hole lies below, do not down", kind=Kind.RULE, owner=owner),
    ]
    memory.add(units)
    return units


def status(memory: Memory, unit: Unit) -> Status:
    return memory.get(unit.id, viewer=ADMIN).status


def test_deleting_rule_zero_archives_the_rule_among_mixed_kinds(memory):
    lesson, example, rule = mixed(memory)
    reflection = Reflection(edits=(RuleEdit("actor", delete=(0,), add=("when a hole lies right, do not right",)),))
    applied = learn_from(memory, reflection, owner="a1", actor="a1", shown={"actor": [lesson, example, rule]})
    assert status(memory, rule) is Status.ARCHIVED
    assert status(memory, lesson) is Status.ACTIVE and status(memory, example) is Status.ACTIVE
    assert [u.id for u, _ in applied.removed] == [rule.id]
    [new] = applied.added
    assert memory.get(new.id, viewer=ADMIN).provenance.source == "reflection"


def test_an_index_past_the_shown_rules_deletes_nothing(memory):
    lesson, example, rule = mixed(memory)
    reflection = Reflection(edits=(RuleEdit("actor", delete=(1, 2)),))
    applied = learn_from(memory, reflection, owner="a1", actor="a1", shown={"actor": [lesson, example, rule]})
    assert applied.removed == () and all(status(memory, u) is Status.ACTIVE for u in (lesson, example, rule))


def test_caps_evict_the_oldest_rules_among_the_active_ones(memory):
    old = [Unit(f"when rule {i} holds, do not up", kind=Kind.RULE, owner="a1", created_at=float(i + 1)) for i in range(3)]
    memory.add(old)
    reflection = Reflection(edits=(RuleEdit("", add=("when the newest holds, do not left",)),))
    applied = learn_from(memory, reflection, owner="a1", actor="a1", shown={}, caps=Caps(rules=2))
    assert {u.id for u, _ in applied.removed} == {old[0].id, old[1].id}
    assert status(memory, old[0]) is Status.ARCHIVED and status(memory, old[2]) is Status.ACTIVE


def test_the_agent_archives_the_rule_it_was_told_to_delete_not_the_lesson(monkeypatch):
    """Through Agent.learn: the recollection shows a lesson and an example before the rule."""
    env = make_env("frozenlake-4x4")
    bus = MemoryBus()
    with Agent.open("a1", bus=bus, agents=["a1"], secret="s") as a1:
        lesson, example, rule = mixed(a1.memory)
        edit = Reflection(edits=(RuleEdit("actor", delete=(0,), add=("when a hole lies below, do not down; right was safe there",)),))
        monkeypatch.setattr(agent_module, "reflect_on", lambda traj, **kw: edit)
        scripted = ScriptedLLM(["right", "down"])  # into the hole at row 1, col 1
        policy = FlatPolicy(llm=lambda role: scripted, spec=env.spec)
        traj = a1.play(env, policy, seed=0, max_steps=2)
        # the block lists the lesson and the example before the rule: a wrong index hits them
        traj.recollections["actor"] = dataclasses.replace(traj.recollections["actor"], shown=(lesson, example, rule))
        [new] = a1.learn(traj, env=env, seed=0, policy=policy)
        assert status(a1.memory, rule) is Status.ARCHIVED
        assert status(a1.memory, lesson) is Status.ACTIVE and status(a1.memory, example) is Status.ACTIVE
        assert new.owner == "a1" and new.confidence == 0.7
    bus.close()
    env.close()
