"""The lifelong team runner: memories updated, baselines on one path, resume, metrics, CLI."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from forge.engine.memory import Memory
from forge.errors import ConfigError, ForgeError, NotFoundError, StoreError
from forge.model import Kind, Viewer
from forge.store import Filter
from forge.team import TeamMemory
from forge.team.cli import team_command
from forge.team.runner import TeamConfig, load_results, resume_team, run_team
from forge.team.streams import coordination_score, gym_stream, make_stream, task_score

# A deterministic "model": walks the FrozenLake 4x4 safe path, avoids holes elsewhere, and as
# planner rotates subtasks over the team. Kept as source so the kill test's child runs it too.
NAV_SRC = r'''
import json, re
from forge.llm.testing import ScriptedLLM, example_for_schema

PATH = {(0, 0): "right", (0, 1): "right", (0, 2): "down", (1, 2): "down", (2, 2): "down", (3, 2): "right"}

def navigate(req):
    if req.choices is None:
        return json.dumps(example_for_schema(req.json_schema)) if req.json_schema else "ok"
    text = "\n".join(m.content for m in req.messages)
    if "agent-1" in req.choices:
        n = int(re.findall(r"Subtask (\d+)", text)[-1])
        return req.choices[n % len(req.choices)]
    pos = re.findall(r"You are at row (\d+), col (\d+)", text)
    if pos:
        r, c = map(int, pos[-1])
        if (r, c) in PATH:
            return PATH[(r, c)]
        near = re.findall(r"Next to you: (.*)", text)[-1]
        for move in ("down", "right", "left", "up"):
            if re.search(move + r": (frozen|goal|start)", near):
                return move
    return req.choices[0]

def nav_llm():
    return ScriptedLLM(navigate, capabilities=("choices", "json_schema"))
'''
_ns: dict[str, Any] = {}
exec(NAV_SRC, _ns)  # noqa: S102 - our own source, shared with the subprocess test
nav_llm = _ns["nav_llm"]

ENVS = ("frozenlake-4x4", "frozenlake-4x4-slippery")


def cfg(**kw: Any) -> TeamConfig:
    base: dict[str, Any] = dict(tasks=6, team_size=3, memory="hybrid", consolidate_every=2, llm="test", envs=ENVS, seed=7)
    base.update(kw)
    return TeamConfig(**base)


def comparable(result: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    tasks = [{k: v for k, v in r.items() if k != "seconds"} for r in result.results]
    final = {k: v for k, v in result.final.items() if k != "wall_seconds"}
    return tasks, final


class Stop(Exception):
    pass


def stop_at(event: str, **where: Any):
    def hook(ev: str, data: Any) -> None:
        if ev == event and all(data.get(k) == v for k, v in where.items()):
            raise Stop(f"{ev} {where}")

    return hook


def units(run_dir: Path, kind: Kind) -> int:
    m = Memory.open(run_dir / "memory.db", embedder="hash")
    try:
        return m.store.count(viewer=Viewer.admin(), filter=Filter.make(kinds=[kind]))
    finally:
        m.close()


# -- streams and scores ----------------------------------------------------------------------


def test_gym_stream_rises_in_blocks_and_is_seeded() -> None:
    s = gym_stream(12, seed=1)
    assert [t.env for t in s[:2]] == ["frozenlake-4x4"] * 2 and s[-1].env == "frozenlake-8x8-slippery"
    assert [t.difficulty for t in s] == sorted(t.difficulty for t in s)
    assert s == gym_stream(12, seed=1) and s != gym_stream(12, seed=2)
    with pytest.raises(ConfigError):
        make_stream("bogus", 3, seed=0)
    with pytest.raises(ConfigError):
        gym_stream(3, seed=0, envs=["nope"])


def test_scores_are_normalised() -> None:
    from forge.envs import make_env

    spec = make_env("cliffwalking").spec
    assert task_score(spec.success_return, spec) == 1.0
    assert task_score(spec.major_failure_return - 50, spec) == 0.0
    assert 0 < task_score((spec.success_return + spec.major_failure_return) / 2, spec) < 1
    assert coordination_score([{"ok": True}, {"ok": False}]) == 0.5
    assert coordination_score([]) == 1.0


# -- one run updates all three memories ---------------------------------------------------------


def test_run_updates_all_three_memories(tmp_path: Path) -> None:
    res = run_team(cfg(), tmp_path / "run", llm=nav_llm())
    f = res.final
    assert f["tasks"] == 6 and len(res.results) == 6
    assert f["memory_units"]["episode"] > 0
    assert f["consolidations"] == 3 and f["procedures_generalised"] >= 1 and f["memory_units"]["procedure"] >= 1
    assert (tmp_path / "run" / "consolidations" / "after-0002.json").is_file()
    m = Memory.open(tmp_path / "run" / "memory.db", embedder="hash")
    try:
        tm = TeamMemory(m, team="team", agents=["agent-1", "agent-2", "agent-3"], layout="hybrid")
        assert tm.tasks_recorded == 6
        block = tm.recollect("agent-1", res.results[-1]["text"], layers=("transactive",)).block
        assert "agent-1" in block and "reliability" in block
        assert tm.procedures()
        # What was shown to the agents was credited with the outcome, through record_use.
        used = [i for r in res.results for i in r["used"]]
        assert used
        credited = m.store.get_many(list(dict.fromkeys(used)), viewer=Viewer.admin())
        assert credited and all(u.meta.get("uses", 0) >= 1 for u in credited)
    finally:
        m.close()
    # Several agents acted, and later tasks read memory.
    assert len({s["agent"] for r in res.results for s in r["subtasks"]}) > 1
    assert any(label != "none" for r in res.results[1:] for label in r["retrieval"].values())
    assert any(r["success"] for r in res.results)
    assert all(r["tokens"]["in"] > 0 for r in res.results)
    # Failures were reflected on by the library, and every task left its lesson.
    assert all(r["lesson"]["lessons"] for r in res.results)
    failed = [r for r in res.results if not r["success"]]
    assert failed and all(r["reflection"] is not None and r["reflection"]["step"] >= 0 for r in failed)
    # ... in the situations' terms: no coordinate, and a success's lesson is not its walk.
    for r in res.results:
        text = " ".join(r["lesson"]["lessons"]) + " " + (r["lesson"]["diagnosis"] or "")
        assert "row" not in text and "col " not in text and r["lesson"]["steps"] == r["steps"]
    for r in (r for r in res.results if r["success"]):
        walk = [t for _, _, t in r["actions"]]
        assert r["lesson"]["source"] == "record" and r["lesson"]["parts"]
        assert "; ".join(walk[:3]) not in r["lesson"]["lessons"][0] and ", ".join(walk[:3]) not in r["lesson"]["lessons"][0]


def test_actor_prompts_carry_the_recollected_block(tmp_path: Path) -> None:
    llm = nav_llm()
    res = run_team(cfg(memory="shared", tasks=4), tmp_path / "run", llm=llm)
    systems = [m.content for r in llm.requests for m in r.messages if m.role == "system" and "of a team of agents" in m.content]
    with_memory = [p for p in systems if "## Past tasks" in p or "## Procedures" in p]
    assert with_memory  # written by forge.learn.prompt.recollect, section headers and all
    shown = [i for r in res.results[1:] for ids in r["shown"].values() for i in ids]
    assert shown and set(shown) <= {i for r in res.results for i in r["used"]}


def test_metrics_per_task(tmp_path: Path) -> None:
    res = run_team(cfg(memory="shared"), tmp_path / "run", llm=nav_llm())
    js = [(r["ts"] + r["cs"]) / 2 for r in res.results]
    aps = [sum(js[: t + 1]) / (t + 1) for t in range(len(js))]
    assert res.final["curve"] == pytest.approx(aps)
    assert res.final["aip"] == pytest.approx(sum(aps) / len(aps))
    assert res.final["ap"] == pytest.approx(aps[-1])
    tokens = sum(r["tokens"]["in"] + r["tokens"]["out"] for r in res.results)
    assert res.final["tokens"]["per_task"] == pytest.approx(tokens / 6)


# -- baselines on one code path -----------------------------------------------------------------


def test_none_writes_no_memory_and_raw_feeds_transcripts(tmp_path: Path) -> None:
    res = run_team(cfg(memory="none"), tmp_path / "none", llm=nav_llm())
    assert res.final["memory_units"] == {} and res.final["consolidations"] == 0
    for kind in (Kind.EPISODE, Kind.PROCEDURE, Kind.PROFILE):
        assert units(tmp_path / "none", kind) == 0

    llm = nav_llm()
    res = run_team(cfg(memory="raw"), tmp_path / "raw", llm=llm)
    assert units(tmp_path / "raw", Kind.EPISODE) == 0
    prompts = [m.content for r in llm.requests for m in r.messages if m.role == "system"]
    fed = [p for p in prompts if "Past tasks (raw transcripts" in p]
    assert fed and "agent-" in fed[-1] and "=> " in fed[-1]
    assert res.results[-1]["retrieval"] and set(res.results[-1]["retrieval"].values()) == {"raw"}


# -- resume -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return comparable(run_team(cfg(), tmp_path_factory.mktemp("u") / "run", llm=nav_llm()))


@pytest.mark.parametrize(
    "event,where",
    [
        ("task_done", {"task": 3}),  # at a task boundary, right after a consolidation was due
        ("step", {"task": 4, "step": 3}),  # mid-task
        ("task_committed", {"task": 5}),  # result committed, memory not yet updated
    ],
)
def test_resume_equals_uninterrupted(tmp_path: Path, uninterrupted: Any, event: str, where: dict[str, Any]) -> None:
    d = tmp_path / "run"
    with pytest.raises(Stop):
        run_team(cfg(), d, llm=nav_llm(), hook=stop_at(event, **where))
    assert not (d / "final.json").exists()
    res = resume_team(d, llm=nav_llm())
    assert comparable(res) == uninterrupted
    assert resume_team(d, llm=nav_llm()).final == res.final  # a finished run just returns


def test_slow_consolidation_changes_nothing(tmp_path: Path, uninterrupted: Any) -> None:
    slowed: list[int] = []

    def slow(event: str, data: Any) -> None:
        if event == "consolidating":
            slowed.append(data["after"])
            time.sleep(0.3)  # a loaded machine: consolidation takes longer than a task

    res = run_team(cfg(), tmp_path / "run", llm=nav_llm(), hook=slow)
    assert slowed == [2, 4, 6]
    assert comparable(res) == uninterrupted


@pytest.mark.parametrize("where", ["consolidation", "record"])
def test_resume_after_a_half_written_memory_update(
    tmp_path: Path, uninterrupted: Any, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Killed in the middle of consolidating (a procedure added, its links and report not)
    or of recording a task (episodes written, profiles and credit not): each is one
    transaction, so the memory holds none of it, and the resumed run redoes it."""
    from forge.team.memories import TeamMemory as TM

    engine = importlib.import_module("forge.curate.consolidate")  # the module, not the function

    if where == "consolidation":

        def die(*args: Any, **kw: Any) -> None:
            raise Stop("killed mid-consolidation")

        monkeypatch.setattr(engine, "link_sources", die)
    else:
        real_observe = TM._observe
        calls = {"n": 0}

        def observe_then_die(self: Any, **kw: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 3:
                raise Stop("killed mid-record")
            return real_observe(self, **kw)

        monkeypatch.setattr(TM, "_observe", observe_then_die)
    d = tmp_path / "run"
    with pytest.raises(Stop):
        run_team(cfg(), d, llm=nav_llm())
    assert list(d.glob("memory.task-*.bak"))  # the memory before the interrupted task
    if where == "consolidation":
        assert units(d, Kind.PROCEDURE) == 0  # the procedure's add was undone with its links
    else:
        with Memory.open(d / "memory.db", embedder="hash") as m:
            eps = m.list(viewer=Viewer.admin(), filter=Filter.make(kinds=[Kind.EPISODE]), limit=1000)
        assert eps and {u.meta["task_index"] for u in eps} == {1, 2}  # none of the third task's episodes
    monkeypatch.undo()
    res = resume_team(d, llm=nav_llm())
    assert comparable(res) == uninterrupted
    assert not list(d.glob("memory.task-*.bak"))


def test_resume_after_sigkill_in_a_slow_consolidation(tmp_path: Path, uninterrupted: Any) -> None:
    d = tmp_path / "run"
    marker = tmp_path / "consolidating"
    script = tmp_path / "child.py"
    script.write_text(
        NAV_SRC
        + "\nimport importlib, pathlib, time\nc = importlib.import_module('forge.curate.consolidate')\nfrom forge.team.runner import TeamConfig, run_team\n"
        + "real = c.link_sources\n"
        + "def slow_link(*a, **kw):\n    real(*a, **kw)\n"
        + f"    pathlib.Path({str(marker)!r}).touch()\n    time.sleep(60)\n"
        + "c.link_sources = slow_link\n"
        + f"run_team(TeamConfig.from_dict({cfg().to_dict()!r}), {str(d)!r}, llm=nav_llm())\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.time() < deadline
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # a procedure and its links written, not committed; no report
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    assert not (d / "consolidations" / "after-0002.json").exists()
    assert comparable(resume_team(d, llm=nav_llm())) == uninterrupted


def test_resume_after_sigkill(tmp_path: Path, uninterrupted: Any) -> None:
    d = tmp_path / "run"
    script = tmp_path / "child.py"
    marker = tmp_path / "held"
    script.write_text(
        NAV_SRC
        + "\nimport pathlib, time\nfrom forge.team.runner import TeamConfig, run_team\n"
        + f"done, marker = pathlib.Path({str(d / 'tasks' / 'task-0002.json')!r}), pathlib.Path({str(marker)!r})\n"
        + "def slow(req):\n"
        + "    if done.exists():  # the first call after task 2 committed: hold it until killed\n"
        + "        marker.touch()\n        time.sleep(600)\n"
        + "    return navigate(req)\n"
        + "llm = ScriptedLLM(slow, capabilities=('choices', 'json_schema'))\n"
        + f"run_team(TeamConfig.from_dict({cfg().to_dict()!r}), {str(d)!r}, llm=llm)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not marker.exists():  # killed mid-run, in a model call, never on a timer
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.time() < deadline
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    assert not (d / "final.json").exists()
    assert comparable(resume_team(d, llm=nav_llm())) == uninterrupted


def test_damaged_run_dirs_give_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        resume_team(tmp_path / "missing")
    d = tmp_path / "run"
    with pytest.raises(Stop):
        run_team(cfg(), d, llm=nav_llm(), hook=stop_at("task_done", task=2))
    (d / "tasks" / "task-0002.json").write_text("{not json")
    with pytest.raises(StoreError) as err:
        resume_team(d, llm=nav_llm())
    assert "\n" not in str(err.value) and "task-0002.json" in str(err.value)
    (d / "config.json").write_text("[]")
    with pytest.raises(ForgeError):
        resume_team(d, llm=nav_llm())
    with pytest.raises(ConfigError):
        run_team(cfg(), d, llm=nav_llm())  # refuses a directory holding a run


# -- CLI ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["--stream", "bogus"], ["--memory", "bogus"], ["--team-size", "9"]])
def test_cli_bad_input_exits_2_with_one_line(args: list[str], tmp_path: Path) -> None:
    r = CliRunner().invoke(team_command, [*args, "--llm", "test", "--run-dir", str(tmp_path / "r")])
    assert r.exit_code == 2
    assert r.output.startswith("error: ") and r.output.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_cli_runs_and_resumes(tmp_path: Path) -> None:
    d = tmp_path / "r"
    args = ["--llm", "test", "--tasks", "3", "--envs", "frozenlake-4x4", "--memory", "local", "--run-dir", str(d), "--json"]
    r = CliRunner().invoke(team_command, args)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["tasks"] == 3 and 0 <= out["aip"] <= 1 and out["tokens_per_task"] > 0
    assert len(load_results(d)) == 3
    r = CliRunner().invoke(team_command, ["--resume", str(d), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["aip"] == out["aip"]


@pytest.mark.slow
@pytest.mark.parametrize("guard", [False, True])
def test_rule_guard_makes_the_team_actor_obey_its_rules(tmp_path: Path, guard: bool) -> None:
    """A model that always takes the first listed option (as the 1.5B does on the db stream)
    ignores a rule against it; with the guard the forbidden action is not offered."""
    from forge.llm.testing import ScriptedLLM

    llm = ScriptedLLM(capabilities=("choices", "json_schema"))  # answers the first option
    cfg = TeamConfig(stream="db", tasks=4, memory="local", llm="test", consolidate_every=5, rule_guard=guard)
    run_team(cfg, tmp_path / "run", llm=llm)
    ruled = [r for r in llm.requests if r.choices and "Failed here before: check_table_stats" in r.messages[-1].content]
    assert ruled, "no decision had a rule against check_table_stats in front of it"
    taken = [r.choices[0] for r in ruled]
    rules = [res.get("rules") or {} for res in load_results(tmp_path / "run")]
    followed = sum(r.get("rule_followed", 0) for r in rules)
    if guard:
        assert "check_table_stats" not in taken and all("check_table_stats" not in r.choices for r in ruled)
        assert followed >= len(ruled)
    else:
        assert set(taken) == {"check_table_stats"} and followed == 0


def test_rule_guard_is_recorded_and_old_configs_load(tmp_path: Path) -> None:
    cfg = TeamConfig(stream="db", tasks=1, memory="local", llm="test", rule_guard=True)
    assert TeamConfig.from_dict(cfg.to_dict()).rule_guard is True
    old = {k: v for k, v in cfg.to_dict().items() if k != "rule_guard"}  # a run written before the option
    assert TeamConfig.from_dict(old).rule_guard is False
