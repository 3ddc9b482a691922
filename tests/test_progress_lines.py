"""Progress where there is no terminal (issue 51): long commands piped to a file or a CI log
print a line per instance, stage, evaluation, task or batch, with the time elapsed and left;
work shorter than the quiet start prints nothing. And the ceiling on a run's training work."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from forge.llm.base import forbid_real_llms
from forge.protocols import ForgeConfig, evolve
from forge.protocols import progress as prog
from forge.protocols.progress import Lines, LineSink, duration, make_sink
from test_protocol_toy import toy_factory


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (42.4, "42s"), (185, "3m05s"), (3725, "1h02m")])
def test_durations_read_as_a_person_says_them(seconds, text):
    assert duration(seconds) == text


def test_lines_stay_quiet_through_short_work_then_trickle():
    clock, out = Clock(), io.StringIO()
    lines = Lines(out, after=10, every=10, clock=clock)
    clock.now += 5
    assert not lines.count("embedding units", 100, 1000)  # 5 s in: quiet
    clock.now += 5
    assert lines.count("embedding units", 200, 1000)  # 10 s in: 200 of 1,000 at 20/s -> 40 s left
    clock.now += 3
    assert not lines.count("embedding units", 260, 1000)  # too soon after the last line
    assert lines.write("phase done", force=True)  # a boundary is always said
    clock.now += 10
    assert lines.count("curation pass", 0, None)  # nothing counted: still at work
    assert out.getvalue().splitlines() == [
        "embedding units: 200/1,000 (20%) | 10s elapsed, about 40s left",
        "phase done",
        "curation pass: working | 23s elapsed",
    ]


def test_a_new_phase_is_estimated_at_its_own_pace():
    clock, out = Clock(), io.StringIO()
    lines = Lines(out, after=0, every=0, clock=clock)
    clock.now += 60  # a slow first phase
    lines.mark()
    clock.now += 10
    lines.count("writing", 50, 100)
    assert out.getvalue().strip() == "writing: 50/100 (50%) | 1m10s elapsed, about 10s left"


def test_a_runs_lines_say_stage_instance_and_time_left():
    cfg = ForgeConfig(env="frozenlake-4x4", llm="test", instances=2, stages=2, attempts=2, eval_episodes=3)
    clock, out = Clock(), io.StringIO()
    sink = LineSink(cfg, out, after=0, every=0, clock=clock)
    # 2 stages x 2 instances x (2 attempts + 1 checkpoint) = 12 training episodes, then 2 x 3 evaluated: 18;
    # instance 1 wins its first attempt (2 episodes played, not 3), then graduates
    sink("stage_started", {"stage": 0, "stages": 2, "active": 2})
    clock.now += 30
    sink("instance_done", {"stage": 0, "instance": 0, "checkpoint_return": -1.0, "attempts": 2})
    clock.now += 30
    sink("instance_done", {"stage": 0, "instance": 1, "checkpoint_return": 1.0, "attempts": 1})
    sink("stage_done", {"graduated_total": 1})
    sink("stage_started", {"stage": 1, "stages": 2, "active": 1})  # one graduated: 3 + 6 episodes left
    clock.now += 30
    sink("instance_done", {"stage": 1, "instance": 0, "checkpoint_return": 1.0, "attempts": 2})
    sink("eval_started", {"pending": 2})
    clock.now += 30
    sink("eval_done", {"instance": 0, "returns": [1.0, -1.0, 1.0]})
    clock.now += 30
    sink("eval_done", {"instance": 1, "returns": [1.0, 1.0, 1.0]})
    got = out.getvalue().splitlines()
    assert got[0] == "[forge on frozenlake-4x4] stage 1/2: instance 0 done (1/2), checkpoint return -1 | 30s elapsed, about 2m30s left"
    assert got[2] == "[forge on frozenlake-4x4] stage 1/2 done, 1 graduated | 1m00s elapsed, about 2m24s left"  # graduation is known at the next stage
    assert got[3].startswith("[forge on frozenlake-4x4] stage 2/2: instance 0 done (1/1)") and got[3].endswith("1m30s elapsed, about 1m08s left")
    assert got[4] == "[forge on frozenlake-4x4] final evaluation of 2 instance(s), 3 episodes each | 1m30s elapsed, about 1m08s left"
    assert got[-1] == "[forge on frozenlake-4x4] evaluated instance 1 (2/2), mean return +1.00 | 2m30s elapsed, about 0s left"


def test_episodes_between_instances_move_the_estimate_and_zero_shot_plays_no_attempts():
    clock, out = Clock(), io.StringIO()
    cfg = ForgeConfig(condition="zero-shot", env="frozenlake-4x4", llm="test", instances=1, stages=2, attempts=3, eval_episodes=2)
    sink = LineSink(cfg, out, after=0, every=0, clock=clock)  # 2 checkpoints + 2 evaluation episodes: 4
    sink("stage_started", {"stage": 0, "stages": 2, "active": 1})
    clock.now += 10
    sink("instance_done", {"stage": 0, "instance": 0, "checkpoint_return": -1.0, "attempts": 0})
    assert out.getvalue().splitlines()[-1].endswith("10s elapsed, about 30s left")
    sink("stage_started", {"stage": 1, "stages": 2, "active": 1})
    clock.now += 10
    sink("instance_done", {"stage": 1, "instance": 0, "checkpoint_return": -1.0, "attempts": 0})
    sink("eval_started", {"pending": 1})
    clock.now += 10
    sink("eval_episode_done", {"instance": 0, "episode": 0, "return": 1.0})
    assert out.getvalue().splitlines()[-1] == "[zero-shot on frozenlake-4x4] evaluating instance 0: episode 1/2 returned 1 | 30s elapsed, about 10s left"
    clock.now += 10
    sink("eval_episode_done", {"instance": 0, "episode": 1, "return": -1.0})
    sink("eval_done", {"instance": 0, "returns": [1.0, -1.0]})  # its episodes were counted already
    assert out.getvalue().splitlines()[-1].endswith("40s elapsed, about 0s left") and sink.done == 4


def test_off_a_terminal_a_run_gets_lines_not_a_panel(monkeypatch):
    cfg = ForgeConfig(env="frozenlake-4x4", llm="test", instances=1, stages=1)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert isinstance(make_sink(True, cfg), LineSink)
    assert type(make_sink(None, cfg)).__name__ == "NullSink"


def test_evolve_piped_prints_progress_lines_on_stderr_and_clean_json_on_stdout(tmp_path, monkeypatch):
    from forge.protocols.cli import evolve_command

    monkeypatch.setattr(prog, "QUIET_S", 0.0)
    res = CliRunner().invoke(evolve_command, ["--llm", "test", "--env", "frozenlake-4x4", "--instances", "2", "--stages", "2",
                                              "--attempts", "1", "--eval-episodes", "2", "--run-dir", str(tmp_path / "r"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["condition"] == "forge"
    lines = res.stderr.splitlines()
    assert any(re.match(r"\[forge on frozenlake-4x4\] stage 1/2: instance \d done \(\d/2\), checkpoint return .* \| \d+s elapsed, about \d+s left$", x) for x in lines), lines
    assert any("final evaluation of 2 instance(s)" in x for x in lines) and "evaluated instance" in lines[-1]


@pytest.mark.slow
def test_short_piped_work_prints_nothing(tmp_path):
    from forge.protocols.cli import evolve_command

    res = CliRunner().invoke(evolve_command, ["--llm", "test", "--env", "frozenlake-4x4", "--instances", "1", "--stages", "1",
                                              "--eval-episodes", "1", "--run-dir", str(tmp_path / "r"), "--json"])
    assert res.exit_code == 0 and res.stderr == ""


def test_import_and_curate_piped_print_counted_lines(tmp_path, monkeypatch):
    from forge.cli import cli

    monkeypatch.setattr(prog, "QUIET_S", 0.0)
    (tmp_path / "units.jsonl").write_text("".join(json.dumps({"record": "unit", "id": f"u{i}", "content": f"item {i} on shelf {i % 9}"}) + "\n" for i in range(150)))
    db = ["--db", str(tmp_path / "m.db"), "--embedder", "hash"]
    res = CliRunner().invoke(cli, [*db, "import", str(tmp_path / "units.jsonl")])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == "imported 150 records"
    assert re.search(r"^embedding units: 64/150 \(43%\) \| \d+s elapsed, about \d+s left$", res.stderr, re.M), res.stderr
    assert res.stderr.splitlines()[-1].startswith("writing 150 records in one transaction: done | ")
    res = CliRunner().invoke(cli, [*db, "curate", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert re.match(r"curation pass: scoring, settling, decaying: done \| \d+s elapsed$", res.stderr), res.stderr


def test_team_piped_prints_a_line_per_task(tmp_path, monkeypatch):
    from forge.team.cli import team_command

    monkeypatch.setattr(prog, "QUIET_S", 0.0)
    res = CliRunner().invoke(team_command, ["--llm", "test", "--tasks", "3", "--envs", "frozenlake-4x4", "--memory", "local",
                                            "--run-dir", str(tmp_path / "r"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["tasks"] == 3
    lines = res.stderr.splitlines()
    assert len(lines) == 3 and lines[0].startswith("task 1/3 frozenlake-4x4 done: TS ")
    assert re.search(r"\| \d+s elapsed, about \d+s left$", lines[0]) and lines[-1].endswith("about 0s left")


# -- a ceiling on training's work ---------------------------------------------------------


def _run(tmp_path: Path, name: str, **caps: int):
    cfg = ForgeConfig(env="frozenlake-4x4", llm="test", instances=2, stages=4, attempts=2, eval_episodes=2, max_steps=10, graduate_after=9, **caps)
    with forbid_real_llms():
        return evolve(cfg, tmp_path / name, llm_factory=toy_factory).final


def test_training_never_passes_its_ceilings_and_says_where_it_stopped(tmp_path):
    # a stage's worst case: 2 instances x (2 attempts + checkpoint) x 10 steps = 60 decisions, 2 x 3 = 6 reflections
    final = _run(tmp_path, "capped", train_decisions=100, train_reflections=12)
    stages = final["stages"]
    assert len(stages) < 4 and final["budget"]["stopped_before_stage"] == len(stages)
    assert sum(s["decisions"] for s in stages) <= 100 and sum(s["reflections"] for s in stages) <= 12
    spent = final["budget"]["spent"]
    assert spent == {"decisions": sum(s["decisions"] for s in stages), "reflections": sum(s["reflections"] for s in stages)}
    assert any(spent[k] + final["budget"]["worst_next_stage"][k] > final["budget"]["ceilings"][k] for k in final["budget"]["over"])
    assert final["evaluation"]["episodes"] == 4  # the evaluation is never cut


def test_no_ceiling_plays_every_stage(tmp_path):
    final = _run(tmp_path, "free")
    assert len(final["stages"]) == 4 and final["budget"] is None
    assert all(s["decisions"] > 0 for s in final["stages"])


@pytest.mark.slow
def test_the_quick_demo_has_a_ceiling(tmp_path):
    from forge.protocols.cli import evolve_command

    res = CliRunner().invoke(evolve_command, ["--quick-demo", "--llm", "test", "--run-dir", str(tmp_path / "qd"), "--json"])
    assert res.exit_code == 0, res.output
    for cond in ("zero-shot", "forge"):
        config = json.loads((tmp_path / "qd" / cond / "config.json").read_text())
        assert (config["train_decisions"], config["train_reflections"]) == (120, 12)
        final = json.loads((tmp_path / "qd" / cond / "final.json").read_text())
        assert sum(s["decisions"] for s in final["stages"]) <= 120 and sum(s["reflections"] for s in final["stages"]) <= 12


@pytest.mark.slow
def test_the_quick_demos_first_line_is_the_verdict(tmp_path):
    from forge.protocols.cli import evolve_command

    res = CliRunner().invoke(evolve_command, ["--quick-demo", "--llm", "test", "--run-dir", str(tmp_path / "qd")])
    assert res.exit_code == 0, res.output
    first = res.stdout.splitlines()[0]
    assert first.startswith("forge/rules learned ") and " held-out tasks " in first and " vs zero-shot " in first, first
