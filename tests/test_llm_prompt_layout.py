"""The policies' prompts are cheap to repeat: what is static comes first and stays byte-identical.

llama.cpp reuses the KV cache (and forge.llm.states the saved state) of the longest common
token prefix, so the system prompt (role, task, the action list while it is stable, then the
episode's memory block) must not change from step to step, and what does change (the
observation, an action list that varies) must come after it.
"""

from __future__ import annotations

import pytest

from forge.envs.base import EnvSpec
from forge.learn.policy import FlatPolicy, HierarchicalPolicy
from forge.learn.prompt import Recollection
from forge.llm.testing import ScriptedLLM


def _spec(*, in_description: bool = False) -> EnvSpec:
    return EnvSpec(
        name="grid", description="Walk to the goal.", max_steps=10, tau=-1.0, theta=0.0,
        success_return=1.0, major_failure_return=-1.0, actions_in_description=in_description,
    )


MEMORY = {role: Recollection(role=role, block="## Rules\n- When the goal is below you, move down.")
          for role in ("actor", "analyst", "action_chooser", "planner")}
GRID = ["left", "down", "right", "up"]


def _system_and_user(llm: ScriptedLLM, index: int = -1) -> tuple[str, str]:
    request = llm.requests[index]
    return request.messages[0].content, request.messages[-1].content


def test_a_stable_action_list_sits_in_the_system_prompt_before_the_memory():
    llm = ScriptedLLM()
    policy = FlatPolicy(llm=lambda role: llm, spec=_spec())
    for step in ("You are at row 1, col 2.", "You are at row 2, col 2."):
        policy.act(observation=step, valid_actions=GRID, history=[], memory=MEMORY)
    (sys1, user1), (sys2, user2) = _system_and_user(llm, 0), _system_and_user(llm, 1)
    assert sys1 == sys2
    assert sys1.index("Valid actions: left, down, right, up") < sys1.index("## Rules")
    assert "row 1" in user1 and "row 1" not in sys1 and "Valid actions" not in user2


def test_an_action_list_that_changes_moves_after_the_observation():
    llm = ScriptedLLM()
    policy = FlatPolicy(llm=lambda role: llm, spec=_spec())
    steps = [["open door", "go north"], ["take key", "go south"], ["go east", "wait"]]
    for n, actions in enumerate(steps):
        policy.act(observation=f"Room {n}.", valid_actions=actions, history=[], memory=MEMORY)
    systems = [_system_and_user(llm, i)[0] for i in range(3)]
    users = [_system_and_user(llm, i)[1] for i in range(3)]
    assert "Valid actions: open door, go north" in systems[0]  # not known to vary yet
    assert systems[1] == systems[2] and "Valid actions" not in systems[1] and "## Rules" in systems[1]
    assert "Valid actions: take key, go south" in users[1] and "Valid actions: go east, wait" in users[2]
    assert users[2].index("Room 2.") < users[2].index("Valid actions")
    assert llm.requests[2].choices == ["go east", "wait"]


@pytest.mark.parametrize("in_description", [False, True])
def test_the_hierarchical_chooser_reads_the_options_from_its_static_prompt(in_description):
    actions = ["sleep", "monitor", *(f"{v} {h}" for v in ("analyse", "remove", "restore") for h in ("User1", "User2", "Enterprise0"))]
    spec = _spec(in_description=in_description)
    if in_description:
        spec = EnvSpec(**{**{f: getattr(spec, f) for f in ("name", "max_steps", "tau", "theta", "success_return", "major_failure_return")},
                          "description": "Walk to the goal. Actions: sleep | monitor | VERB HOST.", "actions_in_description": True})
    llm = ScriptedLLM()
    policy = HierarchicalPolicy(llm=lambda role: llm, spec=spec, proposals=2)
    for step in ("Step 1. Activity: scan User1.", "Step 2. Activity: exploit User1."):
        policy.act(observation=step, valid_actions=actions, history=[], memory=MEMORY)
    chooser = [r for r in llm.requests if r.messages[0].content.startswith("You are the action chooser")]
    assert len(chooser) == 4  # two proposals a step
    systems = {r.messages[0].content for r in chooser}
    assert len(systems) == 1  # byte-identical across steps and proposals
    (system,) = systems
    assert ("Valid actions: sleep, monitor" in system) is not in_description
    for request in chooser:
        user = request.messages[-1].content
        assert "restore Enterprise0" not in user and "Answer with exactly one" not in user
    assert chooser[1].choices == [a for a in actions if a != chooser[0].choices[0]]
