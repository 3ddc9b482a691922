"""Acting agents and prompt memory rendering."""

from __future__ import annotations

from forge.envs import make_env
from forge.errors import ConfigError
from forge.llm.testing import ScriptedLLM
from forge.policy import (
    FlatPolicy,
    MemoryItem,
    PromptMemory,
    forbidden_actions,
    make_policy,
    render_memory,
    strip_map,
    summarize_observation,
)


def test_summarize_observation_is_one_short_sentence():
    env = make_env("frozenlake-4x4")
    obs = env.reset(seed=0)
    assert summarize_observation(obs) == "You are at row 0, col 0, on a start tile"
    assert "Map" not in strip_map(obs) and "Next to you" in strip_map(obs) and "Last step" in strip_map(obs)


def test_render_memory_budget_prefers_relevant_and_keeps_indices():
    items = [MemoryItem("rule", "actor", f"when you are at row {r}, col 0, then do not down") for r in range(4)]
    items.append(MemoryItem("rule", "planner", "when anything, then up"))
    mem = PromptMemory(tuple(items))
    full = render_memory(mem, "actor", budget=10_000)
    assert full.startswith("## Rules\n[0] ") and "[3]" in full and "planner" not in full and "then up" not in full
    small = render_memory(mem, "actor", budget=26, situation="You are at row 2, col 0")
    assert small == "## Rules\n[2] when you are at row 2, col 0, then do not down"
    assert render_memory(PromptMemory(), "actor", budget=100) == ""


def test_examples_rendered_in_their_section():
    ex = MemoryItem("example", "actor", "demo", meta={"name": "safe", "description": "go right", "steps": [{"observation": "at row 2", "answer": "right"}]})
    text = render_memory(PromptMemory((ex,)), "actor", budget=200)
    assert text.startswith("## Examples\nExample safe: go right") and "at row 2 -> right" in text


def test_flat_policy_uses_constrained_choice_and_memory():
    env = make_env("frozenlake-4x4")
    llm = ScriptedLLM()  # obeys: first option
    mem = PromptMemory((MemoryItem("rule", "actor", "when you are at row 0, col 0, on a start tile, then do not left"),))
    policy = FlatPolicy(llm=lambda role: llm, spec=env.spec)
    d = policy.act(observation=env.reset(seed=0), valid_actions=env.valid_actions(), history=[], memory=mem)
    assert d.action == "left"
    assert list(llm.last_request.choices) == ["left", "down", "right", "up"]
    assert "## Rules" in llm.last_request.messages[0].content
    guarded = FlatPolicy(llm=lambda role: llm, spec=env.spec, rule_guard=True)
    d = guarded.act(observation=env.reset(seed=0), valid_actions=env.valid_actions(), history=[], memory=mem)
    assert d.action == "down"


def test_forbidden_actions_match_the_situation_exactly():
    mem = PromptMemory((MemoryItem("rule", "actor", "when you are at row 1, col 0, then do not right; up was safe there"),))
    assert forbidden_actions(mem, "actor", "You are at row 1, col 0", ["left", "right"]) == {"right"}
    assert forbidden_actions(mem, "actor", "You are at row 1, col 1", ["left", "right"]) == set()


def test_unknown_policy():
    import pytest

    with pytest.raises(ConfigError):
        make_policy("swarm", llm=lambda r: ScriptedLLM(), spec=make_env("frozenlake-4x4").spec)
