"""bench/peers.py: FORGE beside GEPA, an ACE playbook, Reflexion and zero-shot on new held-out games.

The arms run end to end with the scripted test LLM on one tiny game; the peer libraries come
from the ``peers`` extra, and the tests that need them skip cleanly without it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import peers  # noqa: E402
from _common import bootstrap_mean  # noqa: E402
from forge.llm.testing import ScriptedLLM  # noqa: E402


def test_held_out_games_come_from_a_new_range_disjoint_from_training_and_development() -> None:
    pytest.importorskip("gymnasium")
    from forge.envs import gym

    games = peers.held_out_games("frozenlake-random-6x6", 24)
    assert len(set(games)) == 24 and min(games) >= peers.FROZENLAKE_HELD_OUT_FIRST
    boards = {tuple(gym.random_map(6, s)) for s in games}
    assert len(boards) == 24  # 24 distinct maps
    earlier = {tuple(gym.random_map(6, s)) for s in (*gym.train_seeds(6), *gym.held_out_seeds(6))}
    assert not boards & earlier
    assert peers.held_out_games("textworld:coin-2", 24) == tuple(range(2000, 2024))


def test_bootstrap_interval_resamples_runs_and_games() -> None:
    mean, lo, hi = bootstrap_mean([[1, 0, 1, 1], [0, 0, 1, 0]], resamples=500)
    assert mean == pytest.approx(0.5) and 0.0 <= lo < mean < hi <= 1.0
    assert bootstrap_mean([[1, 1, 1]], resamples=50) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        bootstrap_mean([], resamples=10)


def _cell(arm: str, seed: int, per_game: dict[str, float], tokens: int = 100) -> dict[str, object]:
    usage = {"tokens": tokens, "prompt_tokens": tokens, "completion_tokens": 0, "cached_tokens": 0, "llm_seconds": 1.0, "prompt_tokens_per_s": float(tokens)}
    return {"env": "e", "arm": arm, "run_seed": seed, "settings": {"llm": "test"}, "held_out_games": [int(g) for g in per_game],
            "per_game": per_game, "success": sum(per_game.values()) / len(per_game), "tokens": tokens, "train": usage, "eval": usage,
            "train_episodes": 4, "budget": 4, "distinct_memories": 1, "instances": 1, "seconds": 1.0}


def test_summary_pairs_forge_with_each_arm_per_game_and_reuses_the_one_greedy_zero_shot_run() -> None:
    cells = [
        _cell("zero-shot", 0, {"1": 0.0, "2": 1.0}),
        _cell("forge", 0, {"1": 1.0, "2": 1.0}), _cell("forge", 1, {"1": 1.0, "2": 0.5}),
        _cell("gepa", 0, {"1": 0.0, "2": 1.0}), _cell("gepa", 1, {"1": 0.0, "2": 0.0}),
    ]
    s = peers.summarise(cells, resamples=200)
    rows = {r["arm"]: r for r in s["rows"]}
    assert rows["forge"]["success"] == pytest.approx(0.875) and rows["zero-shot"]["run_seeds"] == [0]
    paired = {p["versus"]: p for p in s["paired"]}
    assert paired["zero-shot"]["run_seeds"] == [0, 1]  # the greedy run stands for both seeds
    assert paired["zero-shot"]["difference"] == pytest.approx((1 + 0 + 1 - 0.5) / 4)
    assert paired["gepa"]["difference"] == pytest.approx((1 + 0 + 1 + 0.5) / 4)
    assert s["targets"][0]["best_peer"] == "gepa" and s["targets"][0]["at_least_each_peer"] is True
    table = peers.render_markdown(s)
    assert "| e | forge | 0, 1 | 2 | 88%" in table and "| e | gepa | 0, 1 | 2 | 25%" in table
    with pytest.raises(ValueError, match="different settings"):
        peers.summarise([*cells, {**_cell("ace", 0, {"1": 0.0, "2": 0.0}), "settings": {"llm": "local"}}])


def test_the_ace_adapter_reads_an_unparsable_reply_as_nothing_learned() -> None:
    llm = ScriptedLLM(["not json at all"], repeat_last=True)
    ace_llm = peers.AceLLM(llm)
    assert ace_llm.complete_json("You are the Reflector in the ACE framework.", "x") == {}
    assert ace_llm.complete("sys", "user") == "not json at all"


def test_text_memory_fills_the_same_prompt_slot_within_the_same_budget() -> None:
    rec = peers.text_memory("- keep off holes", heading="Advice")("actor", "q")
    assert rec.block == "## Advice\n- keep off holes" and not rec.shown
    assert peers.text_memory("  ", heading="Advice")("actor", "q").block == ""
    assert len(peers.cap_tokens("word\n" * 1000, 100)) <= 400


def test_every_arm_runs_end_to_end_on_one_tiny_game_and_a_rerun_skips_finished_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gepa")
    pytest.importorskip("ace")
    pytest.importorskip("gymnasium")
    out = tmp_path / "cells.jsonl"
    argv = ["--llm", "test", "--envs", "frozenlake-random-4x4", "--quick", "--held-out", "2", "--out", str(out), "--json"]
    peers.main(argv)
    cells = [json.loads(line) for line in out.read_text().splitlines()]
    assert [c["arm"] for c in cells] == ["zero-shot", "forge", "gepa", "ace", "reflexion"]
    for c in cells:
        assert c["held_out_games"] == list(peers.held_out_games("frozenlake-random-4x4", 2))
        assert all(len(m["results"]) == 2 for m in c["memories"])
        if c["arm"] != "zero-shot":
            assert 0 < c["train_episodes"] <= c["budget"] == 2 * 2 * 2
            assert c["train"]["tokens"] > 0  # training, reflection and curation all counted
    arm = {c["arm"]: c for c in cells}
    assert arm["gepa"]["train"]["by_role"]["reflector"] > 0  # GEPA's proposals
    assert arm["ace"]["train"]["by_role"]["reflector"] > 0 and arm["ace"]["train"]["by_role"]["curator"] > 0
    assert arm["ace"]["notes"]["bullets"] >= 1 and arm["ace"]["memories"][0]["text"]  # the playbook reached the prompt
    forge = arm["forge"]
    assert forge["distinct_memories"] <= forge["instances"] == 2
    assert sum(m["weight"] for m in forge["memories"]) == 2
    summary = json.loads(capsys.readouterr().out)
    assert {r["arm"] for r in summary["rows"]} == set(peers.ARMS)
    assert {p["versus"] for p in summary["paired"]} == {"zero-shot", "reflexion", "gepa", "ace"}
    peers.main(argv)  # every cell is there: nothing runs again
    assert len(out.read_text().splitlines()) == 5
