"""Reports: JSON summary, self-contained HTML with embedded figures, champion memory."""

from __future__ import annotations

import html
import json

import pytest

from forge.errors import ConfigError, NotFoundError
from forge.learn import rules
from forge.llm.base import forbid_real_llms
from forge.protocols import ForgeConfig, evolve
from forge.protocols.report import build_report, memory_markdown
from test_protocol_toy import toy_factory

BASE = dict(env="frozenlake-4x4-slippery", llm="test", instances=3, stages=2, attempts=2, eval_episodes=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    with forbid_real_llms():
        for cond, rep in (("zero-shot", "rules"), ("reflexion", "rules"), ("forge", "mixed")):
            evolve(ForgeConfig(condition=cond, representation=rep, **BASE), root / cond, llm_factory=toy_factory)
    return root


@pytest.mark.slow
def test_report_side_by_side(runs, tmp_path):
    paths = build_report([runs / "zero-shot", runs / "reflexion", runs / "forge"], tmp_path / "rep")
    summary = json.loads(paths["json"].read_text())
    assert [r["label"] for r in summary["runs"]] == ["zero-shot/rules", "reflexion/rules", "forge/mixed"]
    assert all(len(r["curve"]) == 2 for r in summary["runs"])
    assert "forge/mixed / zero-shot/rules" in summary["ratios"]
    page = paths["html"].read_text()
    assert page.count("data:image/png;base64,") == 5
    for name in ("Learning curve", "Final champion memory", "forge/mixed", "training tokens"):
        assert name.lower() in page.lower()
    assert "http" not in page.replace("http-equiv", "")  # self-contained: nothing fetched
    md = paths["markdown"].read_text()
    assert "### Rules" in md and "### Examples" in md and "do not" in md


def test_report_shows_which_memories_drove_which_actions(runs, tmp_path):
    paths = build_report([runs / "zero-shot", runs / "reflexion"], tmp_path / "rep")
    drove = json.loads(paths["json"].read_text())["decisions"]
    assert drove["zero-shot/rules"] and all(not d["memory"] for d in drove["zero-shot/rules"])  # no memory
    learned = drove["reflexion/rules"]
    assert learned and all(set(d) >= {"situation", "action", "memory", "shown"} for d in learned)
    driven = [d for d in learned if d["memory"]]
    assert driven, "the reflexion champion's evaluation used none of its rules"
    for d in driven:  # each listed memory is a rule for the situation the action was taken in
        assert any(rules.applies(rules.parse(m, ["left", "down", "right", "up"]), d["situation"]) for m in d["memory"])
    assert "Which memories drove which actions" in paths["html"].read_text()


def test_same_condition_twice_gets_distinct_labels(runs, tmp_path):
    paths = build_report([runs / "forge", runs / "forge"], tmp_path / "rep")
    labels = [r["label"] for r in json.loads(paths["json"].read_text())["runs"]]
    assert len(set(labels)) == 2


def test_unfinished_or_missing_run_is_a_clear_error(tmp_path):
    with pytest.raises(NotFoundError, match="config.json is missing"):
        build_report([tmp_path], tmp_path / "rep")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(NotFoundError, match="has not finished"):
        build_report([tmp_path], tmp_path / "rep")
    with pytest.raises(ConfigError):
        build_report([], tmp_path / "rep")


def test_memory_markdown_empty_and_fallback_marked():
    assert "empty memory" in memory_markdown([])
    md = memory_markdown([{"role": "actor", "kind": "rule", "content": "when x, then up", "source": "reflection", "stage": 1, "meta": {"fallback": True}}])
    assert "0. when x, then up" in md and "(fallback)" in md


def test_the_first_line_says_what_was_learned_and_whether_it_beat_zero_shot(runs, tmp_path):
    paths = build_report([runs / "zero-shot", runs / "reflexion"], tmp_path / "rep")
    summary = json.loads(paths["json"].read_text())
    line = summary["verdict"]
    assert line.startswith("reflexion/rules learned ") and "vs zero-shot" in line
    assert "not held out" in line  # these runs evaluated on derived seeds, not held-out tasks
    assert summary["differences"] == []
    assert html.escape(line) in paths["html"].read_text()


@pytest.mark.slow
def test_compared_runs_that_differ_in_settings_are_flagged(runs, tmp_path):
    other = tmp_path / "short"
    evolve(ForgeConfig(condition="forge", representation="rules", **{**BASE, "stages": 1}, rule_guard=True), other, llm_factory=toy_factory)
    summary = json.loads(build_report([runs / "zero-shot", other], tmp_path / "rep")["json"].read_text())
    assert any(d.startswith("stages differs") for d in summary["differences"])
    assert any(d.startswith("rule_guard differs") for d in summary["differences"])
    assert "Beware: stages differs" in summary["verdict"]


def _verdict_rows(forge_success: float, forge_return: float, *, forge_episodes: int = 8, base_success: float = 0.25, base_episodes: int = 8) -> tuple[list[dict], list[dict]]:
    rows = [
        {"label": "zero-shot", "condition": "zero-shot", "success_rate": base_success, "mean_return": -0.5, "eval_episodes": base_episodes},
        {"label": "forge/rules", "condition": "forge", "success_rate": forge_success, "mean_return": forge_return,
         "eval_episodes": forge_episodes, "rule_shown_rate": 0.4, "rule_followed_rate": 0.5},
    ]
    memory = [{"kind": "rule", "content": "when down: hole, do not down"}]
    runs = [{"config": {"eval_seeds": [1, 2, 3, 4]}, "champion": {"memory": []}}, {"config": {"eval_seeds": [1, 2, 3, 4]}, "champion": {"memory": memory}}]
    return rows, runs


@pytest.mark.parametrize(
    ("success", "ret", "says", "why"),
    [
        (1.0, 0.9, "it transferred (one-sided Fisher exact p = 0.0035)", False),  # 8/8 vs 2/8
        (0.5, 0.1, "success rose, but chance could give as much (one-sided Fisher exact p = 0.3", True),  # 4/8 vs 2/8
        (0.25, -0.1, "success did not improve, the return did", True),  # equal success is not a transfer
        (0.125, 0.0, "it did not beat zero-shot", True),
    ],
)
def test_the_verdict_calls_a_transfer_only_when_held_out_success_rose_beyond_chance(success, ret, says, why):
    from forge.protocols.report import verdict

    line = verdict(*_verdict_rows(success, ret))
    assert f"on 4 held-out tasks (8 episodes) {says}" in line
    assert ("in front of the model in 40% of decisions, followed in 50%" in line) is why


def test_three_of_eight_against_one_of_four_is_no_transfer():
    """The quick demo's line that claimed a transfer from 3 of 8 held-out episodes against
    zero-shot's 1 of 4: chance deals 3 or more of the 4 successes to the 8 in 59% of deals."""
    from forge.protocols.report import verdict

    line = verdict(*_verdict_rows(0.375, -0.25, forge_episodes=8, base_success=0.25, base_episodes=4))
    assert "transferred" not in line
    assert "success rose, but chance could give as much (one-sided Fisher exact p = 0.59; a transfer needs p < 0.05): no transfer shown" in line
    assert "success 3/8 (38%) vs zero-shot 1/4 (25%)" in line


def test_a_clear_win_on_the_same_episodes_is_a_transfer():
    from forge.protocols.report import verdict

    line = verdict(*_verdict_rows(1.0, 1.0, forge_episodes=8, base_success=0.0, base_episodes=4))
    assert "it transferred (one-sided Fisher exact p = 0.002): success 8/8 (100%) vs zero-shot 0/4 (0%)" in line


@pytest.mark.parametrize(("k1", "n1", "k0", "n0"), [(3, 8, 1, 4), (8, 8, 0, 4), (7, 8, 1, 4), (0, 3, 2, 5), (2, 2, 2, 2), (0, 1, 0, 1)])
def test_fisher_p_is_the_share_of_deals_that_give_the_first_arm_as_many_successes(k1, n1, k0, n0):
    """Against brute force: every way of dealing the pooled outcomes to the two arms."""
    from itertools import combinations

    from forge.protocols.report import fisher_greater

    outcomes = [1] * (k1 + k0) + [0] * (n1 + n0 - k1 - k0)
    deals = list(combinations(range(n1 + n0), n1))
    share = sum(1 for d in deals if sum(outcomes[i] for i in d) >= k1) / len(deals)
    assert fisher_greater(k1, n1, k0, n0) == pytest.approx(share)


def test_fisher_p_refuses_impossible_counts():
    from forge.protocols.report import fisher_greater

    with pytest.raises(ConfigError, match="successes must lie between 0 and their episodes"):
        fisher_greater(5, 4, 0, 4)


def test_a_setting_a_run_predates_counts_as_its_default():
    """A run written before graduate_after existed graduated after one win: comparing it with
    a new run at the default is no difference, with one at 2 it is."""
    from forge.protocols.report import differences

    old = {"label": "old", "config": {"env": "frozenlake-4x4"}}
    same = {"label": "new", "config": {"env": "frozenlake-4x4", "graduate_after": 1}}
    two = {"label": "two", "config": {"env": "frozenlake-4x4", "graduate_after": 2}}
    assert differences([old, same]) == []
    assert differences([old, two]) == ["graduate_after differs (old: 1, two: 2)"]


def test_zero_shots_instances_are_no_difference_but_a_learners_are():
    """The quick demo plays one zero-shot instance (its instances would replay one another);
    the verdict must not warn of it, and must still warn when two learners differ."""
    from forge.protocols.report import differences

    zero = {"label": "zero-shot", "config": {"condition": "zero-shot", "instances": 1}}
    forge = {"label": "forge", "config": {"condition": "forge", "instances": 2}}
    three = {"label": "reflexion", "config": {"condition": "reflexion", "instances": 3}}
    assert differences([zero, forge]) == []
    assert differences([zero, forge, three]) == ["instances differs (forge: 2, reflexion: 3)"]
