"""The FORGE protocol end to end with the scripted toy model and real gymnasium FrozenLake."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from forge.engine.memory import Memory
from forge.envs import make_env
from forge.errors import ConfigError, NotFoundError, StoreError
from forge.learn.loop import play_episode
from forge.learn.policy import FlatPolicy, HierarchicalPolicy
from forge.model import Viewer
from forge.protocols import ForgeConfig, evolve, resume
from forge.protocols.cli import evolve_command, report_command
from forge.store import ANY_STATUS, Filter
from test_protocol_toy import toy_factory, toy_llm, valid_factory

ADMIN = Viewer.admin()
SLIPPERY = dict(env="frozenlake-4x4-slippery", llm="test", instances=3, stages=3, attempts=2, eval_episodes=2)


def essence(final: dict) -> dict:
    """What must be equal between an interrupted+resumed run and an uninterrupted one."""
    return {
        "stages": [{k: v for k, v in s.items()} for s in final["stages"]],
        "instances": final["instances"],
        "evaluation": final["evaluation"],
        "champion": [(m["context"]["role"], m["kind"], m["content"], m["provenance"]["source"]) for m in final["champion"]["memory"]],
        "tokens": (final["tokens"]["training"]["total_tokens"], final["tokens"]["evaluation"]["total_tokens"]),
        "by_role": {k: v["total_tokens"] for k, v in final["tokens"]["by_role"].items()},
    }


def exported(run: Path, stage: int, instance: int) -> list[dict]:
    """An instance's active units right after ``stage`` (the run's per-stage export)."""
    path = run / f"checkpoints/stage-{stage:02d}/inst-{instance:02d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def units(run: Path, owner: str, status=None) -> list:
    with Memory.open(run / "memory.db", embedder="hash") as mem:
        f = Filter.make(owner=owner, status=status) if status else Filter(status=ANY_STATUS.status, owner=owner)
        return mem.store.list(viewer=ADMIN, filter=f, limit=1000)


# -- inner loop --------------------------------------------------------------------------------


def test_abort_exactly_below_tau():
    env = make_env("frozenlake-4x4")
    policy = FlatPolicy(llm=lambda role: toy_llm(), spec=env.spec)
    # toy walks down, down, down: rewards 0, 0, -1 (hole at step 2)
    t = play_episode(env, policy, None, seed=1, tau=-0.5, abort=True, max_steps=20)
    assert t.failing == 2 and t.rewards == [0.0, 0.0, -1.0]
    t = play_episode(env, policy, None, seed=1, tau=0.0, abort=True, max_steps=20)  # 0 is not below 0
    assert t.failing == 2 and len(t.actions) == 3
    t = play_episode(env, policy, None, seed=1, tau=0.01, abort=True, max_steps=20)  # 0 < 0.01: first step
    assert t.failing == 0 and len(t.actions) == 1
    t = play_episode(env, policy, None, seed=1, tau=-2.0, abort=True, max_steps=20)  # nothing below -2
    assert t.failing is None and t.done and t.total == -1.0


def test_failing_step_is_the_first_below_tau_even_without_abort():
    env = make_env("cliffwalking")
    policy = FlatPolicy(llm=lambda role: toy_llm(), spec=env.spec)
    t = play_episode(env, policy, None, seed=1, tau=-50, abort=False, max_steps=6)
    falls = [i for i, r in enumerate(t.rewards) if r < -50]
    assert falls and t.failing == falls[0]


def test_attempts_restart_from_step_zero_and_reflection_changes_behaviour(tmp_path):
    cfg = ForgeConfig(condition="reflexion", env="frozenlake-4x4", llm="test", instances=1, stages=1, attempts=3, eval_episodes=1)
    r = evolve(cfg, tmp_path / "run", llm_factory=toy_factory)
    res = json.loads((tmp_path / "run/checkpoints/stage-00/inst-00.result.json").read_text())
    att = res["attempts"]
    assert [a["aborted"] for a in att] == [True, False]  # stopped after the first clean attempt
    assert att[0]["failing_step"] == 2 and att[0]["return"] == -1.0
    assert att[1]["return"] == 1.0 and att[1]["steps"] == 6  # replayed from step 0, took the safe way
    assert att[0]["reflection"]["fallback"] is True  # the toy answers reflection with prose
    assert r.final["fallback_rate"] == 1.0
    rules = units(tmp_path / "run", "inst-0")
    assert len(rules) == 1 and rules[0].meta["fallback"] is True
    assert rules[0].provenance.source == "reflection" and rules[0].provenance.episodes == (att[0]["episode"],)
    assert rules[0].context.role == "actor" and rules[0].scope.kind == "private"


def test_valid_reflection_is_used_and_invented_names_dropped(tmp_path):
    cfg = ForgeConfig(condition="reflexion", env="frozenlake-4x4", llm="test", instances=1, stages=1, attempts=2, eval_episodes=1, reflection="free")
    evolve(cfg, tmp_path / "run", llm_factory=valid_factory)
    res = json.loads((tmp_path / "run/checkpoints/stage-00/inst-00.result.json").read_text())
    refl = res["attempts"][0]["reflection"]
    assert refl["fallback"] is False
    # the model named the whole failing situation (row 2, col 0, above the hole); the check
    # narrowed its "when" to the clause of the action it names, which recurs on other maps
    assert refl["edits"][0]["add"] == ["when down: hole, do not down"]  # rendered from its typed record
    assert any("narrowed" in r for r in refl["repaired"])
    assert any("teleport_home" in d for d in refl["dropped"])


def test_stall_is_reflected_on(tmp_path):
    # the default ScriptedLLM always picks "left": it bumps into the edge until the step limit
    cfg = ForgeConfig(condition="reflexion", env="frozenlake-4x4", llm="test", instances=1, stages=1, attempts=2, eval_episodes=1, max_steps=5)
    evolve(cfg, tmp_path / "run", llm_factory=lambda: __import__("forge.llm.testing", fromlist=["x"]).ScriptedLLM())
    res = json.loads((tmp_path / "run/checkpoints/stage-00/inst-00.result.json").read_text())
    first = res["attempts"][0]
    assert not first["aborted"] and first["stalled_step"] == 0 and len(res["attempts"]) == 2
    added = [op["unit"]["content"] for op in res["ops"] if op["op"] == "add"]
    assert added and "do not left" in added[0]


@pytest.mark.parametrize("reflect", [True, False])
def test_a_failed_greedy_checkpoint_is_reflected_on_after_its_return_is_taken(tmp_path, reflect):
    """TextWorld coin-1: a sampled attempt won, the greedy checkpoint paced between two rooms
    to the step limit (the failure held-out games repeat), and nothing was reflected on: the
    instance graduated with an empty memory."""
    from forge.llm.testing import ScriptedLLM  # noqa: PLC0415

    walk = iter(["down", "down", "right", "right", "down", "right"])  # the safe path to the goal

    def answer(req):
        if req.json_schema:
            return json.dumps({"avoid": "left", "instead": "down"})
        if req.choices:
            return next(walk) if req.temperature > 0 else "left"  # greedy: bump into the edge
        return "ok"

    cfg = ForgeConfig(condition="reflexion", env="frozenlake-4x4", llm="test", instances=1, stages=1, attempts=1,
                      eval_episodes=1, max_steps=8, temperature=0.7, reflect_on_checkpoint=reflect)
    evolve(cfg, tmp_path / "run", llm_factory=lambda: ScriptedLLM(answer, capabilities=("choices", "json_schema")))
    res = json.loads((tmp_path / "run/checkpoints/stage-00/inst-00.result.json").read_text())
    (attempt,) = res["attempts"]
    assert attempt["return"] >= 1 and "reflection" not in attempt  # the sampled attempt won
    checkpoint = res["checkpoint"]
    assert not checkpoint["success"] and checkpoint["return"] < 1  # taken before any reflection
    added = [op["unit"]["content"] for op in res["ops"] if op["op"] == "add"]
    if reflect:
        assert checkpoint["stalled_step"] == 0 and "reflection" in checkpoint
        assert added and "do not left" in added[0]
    else:
        assert added == [] and "reflection" not in checkpoint


def test_caps_archive_oldest(tmp_path):
    cfg = ForgeConfig(condition="reflexion", **{**SLIPPERY, "instances": 1, "stages": 3, "attempts": 3}, rule_cap=1)
    evolve(cfg, tmp_path / "run", llm_factory=toy_factory)
    active = units(tmp_path / "run", "inst-0", status=["active"])
    archived = units(tmp_path / "run", "inst-0", status=["archived"])
    assert len(active) == 1 and len(archived) >= 1
    assert all(a.created_at <= active[0].created_at for a in archived)  # newest kept
    with Memory.open(tmp_path / "run/memory.db", embedder="hash") as mem:
        reasons = [e.data.get("reason") for a in archived for e in mem.store.events(unit_id=a.id, viewer=Viewer.admin()) if e.op == "status"]
    # the cap evicts; a newer rule for the same situation that advises what an older one
    # forbade retires the older (contradiction), which is the only other way out
    assert reasons and any("cap" in r for r in reasons)
    assert all("cap" in r or r.startswith("contradicted by a newer rule") for r in reasons)


# -- outer loop --------------------------------------------------------------------------------


@pytest.mark.slow
def test_broadcast_copies_champion_and_keeps_history(tmp_path):
    cfg = ForgeConfig(condition="forge-no-graduation", **SLIPPERY)
    r = evolve(cfg, tmp_path / "run", llm_factory=toy_factory)
    ck = json.loads((tmp_path / "run/checkpoints/stage-00.json").read_text())
    champ = ck["summary"]["champion"]
    returns = ck["summary"]["returns"]
    assert returns[champ] == max(returns) and champ == returns.index(max(returns))  # lowest index on ties
    def shape(m: dict) -> tuple:
        return (m["context"]["role"], m["kind"], m["content"])

    champ_units = exported(tmp_path / "run", 0, champ)
    for inst in ck["instances"]:
        assert [shape(m) for m in exported(tmp_path / "run", 0, inst["instance"])] == [shape(m) for m in champ_units]
    receiver = next(i for i in ck["summary"]["receivers"])
    superseded = units(tmp_path / "run", f"inst-{receiver}", status=["superseded"])
    copies = [u for u in units(tmp_path / "run", f"inst-{receiver}") if u.provenance.source == f"broadcast:inst-{champ}"]
    assert copies and superseded  # old memory kept as history, never deleted
    champ_ids = {m["id"] for m in champ_units}
    stage0 = [c for c in copies if c.meta["stage"] == 0]
    assert stage0 and all(len(c.provenance.derived_from) == 1 and set(c.provenance.derived_from) <= champ_ids for c in stage0)
    assert all(c.owner == f"inst-{receiver}" and c.scope.kind == "private" for c in copies)
    with Memory.open(tmp_path / "run/memory.db", embedder="hash") as mem:
        rels = [rel for s in superseded for rel in mem.store.relations(s.id, viewer=Viewer.admin()) if rel.type.value == "supersedes"]
    assert rels
    assert r.final["graduated"] == 0


def test_a_champion_with_no_memory_does_not_wipe_the_others(tmp_path):
    """Run seed 6: instance 0 wins its random map at once (nothing to reflect on, no memory)
    and is champion; instance 1 falls into a hole and learns rules. Copying the champion's
    empty memory over instance 1 erased them (CAGE-2 trained two stages on wiped memories);
    now nothing is broadcast and instance 1 keeps what it learned."""
    cfg = ForgeConfig(condition="forge-no-graduation", env="frozenlake-random-4x4", llm="test", instances=2, stages=1,
                      attempts=2, eval_episodes=1, seed=6, max_steps=10)
    evolve(cfg, tmp_path / "run", llm_factory=valid_factory)
    summary = json.loads((tmp_path / "run/checkpoints/stage-00.json").read_text())["summary"]
    assert summary["returns"] == [1.0, -1.0] and summary["champion"] == 0
    assert exported(tmp_path / "run", 0, 0) == []
    kept = exported(tmp_path / "run", 0, 1)
    assert kept and all(m["kind"] == "rule" and not m["provenance"]["source"].startswith("broadcast") for m in kept)
    assert units(tmp_path / "run", "inst-1", status=["superseded"]) == []
    assert summary["broadcast_skipped"] == "champion inst-0 has no memory" and summary["receivers"] == []


@pytest.mark.slow
def test_reflexion_never_broadcasts(tmp_path):
    r = evolve(ForgeConfig(condition="reflexion", **SLIPPERY), tmp_path / "run", llm_factory=toy_factory)
    assert all(s["champion"] is None for s in r.final["stages"])
    assert not any(u.provenance.source.startswith("broadcast") for i in range(3) for u in units(tmp_path / "run", f"inst-{i}"))


def test_zero_shot_learns_nothing(tmp_path):
    r = evolve(ForgeConfig(condition="zero-shot", **SLIPPERY), tmp_path / "run", llm_factory=toy_factory)
    assert r.final["reflections"] == 0 and all(i["attempts"] == 0 for i in r.final["instances"])
    assert "reflector" not in r.final["tokens"]["by_role"]
    assert r.tokens["training"]["total_tokens"] > 0 and r.tokens["evaluation"]["total_tokens"] > 0


def test_graduation_freezes_for_good(tmp_path):
    cfg = ForgeConfig(condition="forge", env="frozenlake-4x4", llm="test", instances=2, stages=3, attempts=2, eval_episodes=1)
    seen = []

    def hook(event, data):
        seen.append((event, dict(data)))
        if event == "stage_started" and data["stage"] == 1 and not (tmp_path / "flag").exists():
            (tmp_path / "flag").touch()
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evolve(cfg, tmp_path / "run", llm_factory=toy_factory, hook=hook)
    r = resume(tmp_path / "run", llm_factory=toy_factory, hook=hook)
    assert [i["graduated_stage"] for i in r.final["instances"]] == [0, 0]
    assert r.final["stages"][1]["played"] == [] and r.final["stages"][2]["played"] == []
    assert not [e for e, d in seen if e in ("instance_done", "attempt_done") and d.get("stage", 0) > 0]
    before = json.loads((tmp_path / "run/checkpoints/stage-00.json").read_text())["instances"]
    after = json.loads((tmp_path / "run/checkpoints/stage-02.json").read_text())["instances"]
    for b, a in zip(before, after, strict=True):
        assert a["attempts"] == b["attempts"]
        assert exported(tmp_path / "run", 0, b["instance"]) == exported(tmp_path / "run", 2, a["instance"])
    assert r.final["stages"][2]["returns"] == [1.0, 1.0]  # carried forward, not replayed


def test_graduate_after_asks_for_more_wins_and_survives_a_resume(tmp_path):
    """With graduate_after=2 a first win does not graduate; the second does, and the count of
    wins is in the checkpoint (a resume between them must not forget the first)."""
    cfg = ForgeConfig(condition="forge", env="frozenlake-4x4", llm="test", instances=2, stages=3, attempts=2, eval_episodes=1, graduate_after=2)

    def hook(event, data):
        if event == "stage_started" and data["stage"] == 1 and not (tmp_path / "flag").exists():
            (tmp_path / "flag").touch()
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evolve(cfg, tmp_path / "run", llm_factory=toy_factory, hook=hook)
    first = json.loads((tmp_path / "run/checkpoints/stage-00.json").read_text())
    assert first["summary"]["graduated_now"] == [] and [i["passes"] for i in first["instances"]] == [1, 1]
    r = resume(tmp_path / "run", llm_factory=toy_factory)
    assert [i["graduated_stage"] for i in r.final["instances"]] == [1, 1]
    assert r.final["stages"][1]["played"] == [0, 1] and r.final["stages"][2]["played"] == []
    with pytest.raises(ConfigError, match="graduate_after"):
        ForgeConfig(condition="forge", llm="test", graduate_after=0)


@pytest.mark.slow
def test_graduate_first_try_does_not_count_a_stage_won_only_after_a_reflection(tmp_path):
    """The toy model falls in the hole on stage 0's first attempt and wins its second (after a
    reflection), then wins stages 1 and 2 at once. The paper's count graduates it after
    stage 1; counting only first-try wins, stage 0 does not count and it plays stage 2."""
    base = {"condition": "forge", "env": "frozenlake-4x4", "llm": "test", "instances": 2, "stages": 3, "attempts": 2,
            "eval_episodes": 1, "graduate_after": 2}
    paper = evolve(ForgeConfig(**base), tmp_path / "paper", llm_factory=toy_factory).final
    strict = evolve(ForgeConfig(**base, graduate_first_try=True), tmp_path / "strict", llm_factory=toy_factory).final
    first = json.loads((tmp_path / "strict/checkpoints/stage-00/inst-00.result.json").read_text())
    assert [a["return"] for a in first["attempts"]] == [-1.0, 1.0]  # the premise: stage 0 was won on the second attempt
    assert [i["graduated_stage"] for i in paper["instances"]] == [1, 1]
    assert [i["graduated_stage"] for i in strict["instances"]] == [2, 2]
    assert strict["stages"][2]["played"] == [0, 1] and paper["stages"][2]["played"] == []
    with pytest.raises(ConfigError, match="graduate_first_try"):
        ForgeConfig(condition="forge", llm="test", graduate_first_try="yes")


# -- resume ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    return evolve(ForgeConfig(condition="forge-no-graduation", **SLIPPERY), d / "run", llm_factory=toy_factory).final


@pytest.mark.parametrize(
    "when",
    [
        ("stage_started", {"stage": 1}),
        ("instance_done", {"stage": 1, "instance": 1}),
        ("attempt_done", {"stage": 2, "instance": 0, "attempt": 0}),
        ("stage_done", {"stage": 0}),
        ("eval_done", {"instance": 0}),
    ],
    ids=["stage", "instance", "attempt", "after-stage", "eval"],
)
@pytest.mark.slow
def test_resume_after_interrupt_equals_uninterrupted(tmp_path, reference, when):
    event, match = when
    fired = []

    def hook(e, data):
        if e == event and all(data.get(k) == v for k, v in match.items()) and not fired:
            fired.append(1)
            raise KeyboardInterrupt

    cfg = ForgeConfig(condition="forge-no-graduation", **SLIPPERY)
    with pytest.raises(KeyboardInterrupt):
        evolve(cfg, tmp_path / "run", llm_factory=toy_factory, hook=hook)
    assert not (tmp_path / "run/final.json").exists()
    r = resume(tmp_path / "run", llm_factory=toy_factory)
    assert essence(r.final) == essence(reference)
    events = [json.loads(line)["event"] for line in (tmp_path / "run/events.jsonl").read_text().splitlines()]
    assert events[0] == "run_started" and "resumed" in events and events[-1] == "run_done"
    # nothing stored twice
    for i in range(3):
        ids = [u.id for u in units(tmp_path / "run", f"inst-{i}")]
        assert len(ids) == len(set(ids))


def test_resume_of_finished_run_returns_it(tmp_path):
    r1 = evolve(ForgeConfig(condition="forge", **{**SLIPPERY, "stages": 1}), tmp_path / "run", llm_factory=toy_factory)
    r2 = resume(tmp_path / "run", llm_factory=toy_factory)
    assert r2.final == r1.final


_CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
from test_protocol_toy import toy_factory
from forge.protocols import ForgeConfig, evolve
def slow(event, data):
    if event == "instance_done":
        time.sleep(0.4)
evolve(ForgeConfig(condition="forge-no-graduation", **{cfg!r}), {run!r}, llm_factory=toy_factory, hook=slow)
"""


@pytest.mark.slow
def test_resume_after_sigkill(tmp_path, reference):
    run = tmp_path / "run"
    code = textwrap.dedent(_CHILD).format(tests=str(Path(__file__).parent), cfg=SLIPPERY, run=str(run))
    proc = subprocess.Popen([sys.executable, "-c", code])
    target = run / "checkpoints/stage-01/inst-00.result.json"
    deadline = time.time() + 60
    while not target.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert target.exists(), "the child run never reached stage 1"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run / "final.json").exists()
    r = resume(run, llm_factory=toy_factory)
    assert essence(r.final) == essence(reference)


@pytest.mark.slow
def test_parallel_workers_match_serial(tmp_path, reference):
    cfg = ForgeConfig(condition="forge-no-graduation", **SLIPPERY, workers=2)
    r = evolve(cfg, tmp_path / "run", llm_factory=toy_factory)
    assert essence(r.final) == essence(reference)


# -- errors ------------------------------------------------------------------------------------


def test_unknown_env_and_condition_are_config_errors():
    with pytest.raises(ConfigError, match="unknown environment"):
        ForgeConfig(env="pong")
    with pytest.raises(ConfigError, match="unknown condition"):
        ForgeConfig(condition="magic")
    with pytest.raises(ConfigError, match="representation"):
        ForgeConfig(representation="poems")
    with pytest.raises(ConfigError, match="instances"):
        ForgeConfig(instances=0)


def test_cli_unknown_env_exits_2_with_one_line(tmp_path):
    res = CliRunner().invoke(evolve_command, ["--env", "pong", "--run-dir", str(tmp_path / "r")])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and res.output.startswith("error: unknown environment 'pong'")
    res = CliRunner().invoke(evolve_command, ["--condition", "magic", "--run-dir", str(tmp_path / "r")])
    assert res.exit_code == 2 and "unknown condition" in res.output
    assert not (tmp_path / "r").exists()


def snapshot_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_corrupt_run_dir_is_refused_and_untouched(tmp_path):
    cfg = ForgeConfig(condition="forge", **{**SLIPPERY, "stages": 2})
    with pytest.raises(KeyboardInterrupt):
        evolve(cfg, tmp_path / "run", llm_factory=toy_factory, hook=lambda e, d: (_ for _ in ()).throw(KeyboardInterrupt) if e == "stage_started" and d["stage"] == 1 else None)
    (tmp_path / "run/checkpoints/stage-00.json").write_text("{not json")
    before = snapshot_files(tmp_path / "run")
    with pytest.raises(StoreError, match="stage-00.json: corrupt") as info:
        resume(tmp_path / "run", llm_factory=toy_factory)
    assert "\n" not in str(info.value)
    assert snapshot_files(tmp_path / "run") == before

    (tmp_path / "run/config.json").unlink()
    with pytest.raises(NotFoundError, match="config.json is missing"):
        resume(tmp_path / "run", llm_factory=toy_factory)
    with pytest.raises(NotFoundError):
        resume(tmp_path / "nowhere", llm_factory=toy_factory)


def test_evolve_refuses_an_existing_run(tmp_path):
    cfg = ForgeConfig(condition="zero-shot", **{**SLIPPERY, "stages": 1})
    evolve(cfg, tmp_path / "run", llm_factory=toy_factory)
    before = snapshot_files(tmp_path / "run")
    with pytest.raises(ConfigError, match="already holds a run"):
        evolve(cfg, tmp_path / "run", llm_factory=toy_factory)
    assert snapshot_files(tmp_path / "run") == before


# -- accounting, policies, CLI -----------------------------------------------------------------


def test_tokens_by_role_stage_instance_phase(tmp_path):
    r = evolve(ForgeConfig(condition="forge", **SLIPPERY), tmp_path / "run", llm_factory=toy_factory)
    tok = r.tokens
    assert tok["total"]["total_tokens"] == tok["training"]["total_tokens"] + tok["evaluation"]["total_tokens"]
    assert set(tok["by_role"]) == {"actor", "reflector"}
    assert set(tok["by_phase"]) == {"train", "checkpoint", "eval"}
    assert sum(v["total_tokens"] for v in tok["by_instance"].values()) == tok["total"]["total_tokens"]
    assert "eval" in tok["by_stage"] and "0" in tok["by_stage"]
    ck = json.loads((tmp_path / "run/checkpoints/stage-00.json").read_text())
    assert ck["tokens"]["total"]["total_tokens"] == ck["summary"]["tokens"] > 0


def test_hierarchical_policy_runs_every_role(tmp_path):
    r = evolve(ForgeConfig(condition="forge", **{**SLIPPERY, "stages": 2}, policy="hierarchical"), tmp_path / "run", llm_factory=toy_factory)
    assert {"planner", "action_chooser", "analyst", "reflector"} <= set(r.tokens["by_role"])
    env = make_env("frozenlake-4x4")
    d = HierarchicalPolicy(llm=lambda role: toy_llm(), spec=env.spec).act(observation=env.reset(seed=0), valid_actions=env.valid_actions(), history=[], memory={})
    assert [s.role for s in d.steps] == ["analyst", "action_chooser", "planner"]
    assert d.action in d.steps[1].action.split(", ")  # the planner copied a proposal


def test_progress_callback_and_cli_roundtrip(tmp_path):
    events = []
    evolve(ForgeConfig(condition="forge", **{**SLIPPERY, "stages": 1}), tmp_path / "a", llm_factory=toy_factory, progress=lambda e, d: events.append(e))
    assert {"stage_started", "attempt_done", "instance_done", "stage_done", "eval_done"} <= set(events)
    res = CliRunner().invoke(evolve_command, ["--llm", "test", "-n", "2", "-s", "1", "-k", "1", "--eval-episodes", "1", "--run-dir", str(tmp_path / "b"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["condition"] == "forge"
    res = CliRunner().invoke(report_command, [str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rep/report.html").is_file()
    res = CliRunner().invoke(evolve_command, ["--resume", str(tmp_path / "b"), "--json"])
    assert res.exit_code == 0, res.output


@pytest.mark.slow
def test_rich_progress_display_renders(tmp_path):
    import io

    from rich.console import Console

    from forge.protocols.progress import RichSink, make_sink

    cfg = ForgeConfig(condition="forge", **{**SLIPPERY, "stages": 1})
    sink = RichSink(cfg)
    sink.console = Console(file=io.StringIO(), force_terminal=True, width=100)
    evolve(cfg, tmp_path / "run", llm_factory=toy_factory, progress=sink)
    out = sink.console.file.getvalue()
    assert "checkpoint returns" in out and "tokens" in out
    assert type(make_sink(True, cfg)).__name__ == "LineSink"  # pytest's stdout is not a terminal: lines on stderr
    assert type(make_sink(None, cfg)).__name__ == "NullSink"


@pytest.mark.parametrize("value", ["5", "-0.1", "nan"])
def test_cli_bad_diversity_exits_2_with_one_line(tmp_path, value):
    res = CliRunner().invoke(evolve_command, ["--llm", "test", "--diversity", value, "--run-dir", str(tmp_path / "r")])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "diversity must be a number between 0 and 2" in res.output
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_quick_demo_runs_zero_shot_and_forge_on_the_same_seeds_into_one_report(tmp_path):
    res = CliRunner().invoke(evolve_command, ["--quick-demo", "--llm", "test", "--run-dir", str(tmp_path / "qd"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [r["condition"] for r in out["runs"]] == ["zero-shot", "forge"]
    configs = [json.loads((tmp_path / "qd" / c / "config.json").read_text()) for c in ("zero-shot", "forge")]
    assert {c["seed"] for c in configs} == {0} and {c["env"] for c in configs} == {"frozenlake-random-4x4"}
    # trained on some maps, evaluated on held-out maps no instance trained on
    train, held = (set(configs[1]["train_seeds"]), set(configs[1]["eval_seeds"]))
    assert train and held and not train & held and configs[0]["eval_seeds"] == configs[1]["eval_seeds"]
    assert {c["llm"] for c in configs} == {"test:walker"}  # the stand-in that obeys its rules
    # greedy with no memory, a second zero-shot instance would replay the first move for move
    assert [c["instances"] for c in configs] == [1, 2]
    summary = json.loads((tmp_path / "qd/report/summary.json").read_text())
    assert f"on {len(held)} held-out tasks" in summary["verdict"] and "Beware" not in summary["verdict"]
    assert (tmp_path / "qd/report/report.html").is_file()


@pytest.mark.slow
def test_quick_demo_instances_given_hold_for_both_conditions(tmp_path):
    res = CliRunner().invoke(evolve_command, ["--quick-demo", "--llm", "test", "--instances", "3", "--stages", "1", "--run-dir", str(tmp_path / "qd"), "--json"])
    assert res.exit_code == 0, res.output
    configs = [json.loads((tmp_path / "qd" / c / "config.json").read_text()) for c in ("zero-shot", "forge")]
    assert [c["instances"] for c in configs] == [3, 3]


def test_cli_unknown_reflection_style_exits_2_with_one_line(tmp_path):
    res = CliRunner().invoke(evolve_command, ["--llm", "test", "--reflection", "poem", "--run-dir", str(tmp_path / "r")])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "unknown reflection style 'poem'" in res.output
    assert not (tmp_path / "r").exists()
