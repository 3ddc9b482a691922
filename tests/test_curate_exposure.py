"""Cold-start switches of the protocols: warm-up, gradual enablement and isolation change
what a prompt shows, and the defaults change nothing."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from forge.curate import WarmUp
from forge.curate.exposure import Exposure
from forge.curate.seeds import own
from forge.engine.memory import Memory
from forge.envs import make_env
from forge.errors import ConfigError, UserError
from forge.learn.loop import Recaller
from forge.model import Context, Provenance, Unit, Viewer
from forge.population.agent import Agent
from forge.population.member import exposure_of
from forge.population.swarm import SwarmConfig
from forge.population.swarm_cli import swarm_command
from forge.protocols import ForgeConfig, evolve
from forge.protocols.cli import evolve_command
from forge.protocols.episode import play_stage
from forge.share.bus import MemoryBus
from test_protocol_toy import toy_factory, toy_llm

MINE = "when you are at row 0, col 1, on a frozen tile, then do not down"
THEIRS = "when you are at row 0, col 2, on a frozen tile, then do not down"
FACT = "The lake is frozen at row 0 and row 1."


def received(text: str, *, owner: str = "ann", sender: str = "bob", validation: float = 0.5, **kw) -> Unit:
    """A received copy as the exchange stores it: the receiver's private unit, the sender's provenance."""
    return Unit(text, kind=kw.pop("kind", "rule"), scope="private", owner=owner, validation=validation,
                provenance=Provenance(source=f"broadcast:{sender}"), meta={"origin": sender}, **kw)


@pytest.fixture
def mem():
    m = Memory.open(":memory:", embedder="hash")
    m.add([
        Unit(MINE, kind="rule", scope="private", owner="ann", provenance=Provenance(source="reflection")),
        received(THEIRS),
        Unit(FACT, kind="fact", scope="private", owner="ann"),
    ])
    yield m
    m.close()


def shown(mem: Memory, exposure: Exposure | None = None, *, episodes: int = 0) -> list[str]:
    recall = Recaller(mem, Viewer.of("ann"), exposure=exposure, episodes=episodes)
    return [u.content for u in recall("actor", "frozen lake row 0 col 1 tile down").shown]


def test_own_is_about_provenance_not_the_owner() -> None:
    assert own(Unit("x", owner="ann", provenance=Provenance(source="reflection")), "ann")
    assert own(Unit("x", scope="private", owner="ann"), "ann")
    assert not own(received("x"), "ann")  # the receiver owns the copy; it is still someone else's
    assert not own(Unit("x", owner="ann", provenance=Provenance(source="broadcast:inst-2")), "ann")  # the champion's copy
    assert not own(Unit("x", owner="ann", provenance=Provenance(source="seed")), "ann")
    assert not own(Unit("x", owner="ann", meta={"consensus_of": "u1"}), "ann")
    assert not own(Unit("x", owner="bob"), "ann") and not own(Unit("x"), "")


def test_defaults_show_everything_exactly_as_without_exposure(mem: Memory) -> None:
    assert Exposure().open and not Exposure(isolated=True).open and not Exposure(WarmUp(ramp_episodes=2)).open
    plain = Recaller(mem, Viewer.of("ann"))("actor", "frozen lake row 0 col 1 tile down")
    gated = Recaller(mem, Viewer.of("ann"), exposure=Exposure(), episodes=0)("actor", "frozen lake row 0 col 1 tile down")
    assert plain.block == gated.block and THEIRS in plain.block and MINE in plain.block


def test_warm_up_hides_received_memory_until_n_episodes(mem: Memory) -> None:
    warm = Exposure(WarmUp(after_episodes=3))
    assert MINE in shown(mem, warm, episodes=0) and THEIRS not in shown(mem, warm, episodes=2)
    assert THEIRS in shown(mem, warm, episodes=3)


def test_warm_up_by_validation_shows_only_earned_received_units(mem: Memory) -> None:
    strict = Exposure(WarmUp(min_validation=0.6))
    assert THEIRS not in shown(mem, strict) and MINE in shown(mem, strict)  # an own unit at 0.5 stays
    [copy] = [u for u in mem.store.list(viewer=Viewer.admin()) if u.content == THEIRS]
    mem.update(copy.replace(validation=0.7))
    assert THEIRS in shown(mem, strict)


def test_gradual_enablement_grows_the_sections_with_experience(mem: Memory) -> None:
    ramp = Exposure(WarmUp(ramp_episodes=4))  # four sections: rules, procedures, examples, facts
    assert FACT in shown(mem) and FACT not in shown(mem, ramp, episodes=0) and MINE in shown(mem, ramp, episodes=0)
    assert FACT not in shown(mem, ramp, episodes=2) and FACT in shown(mem, ramp, episodes=4)


def test_isolation_shows_only_own_memory_even_when_received_units_outrank_it() -> None:
    m = Memory.open(":memory:", embedder="hash")
    try:
        m.add([received(f"{THEIRS} (peer note {i})", validation=1.0, importance=1.0) for i in range(30)])
        m.add(Unit(MINE, kind="rule", scope="private", owner="ann", validation=0.0, importance=0.0))
        recall = Recaller(m, Viewer.of("ann"), exposure=Exposure(isolated=True))
        assert [u.content for u in recall("actor", THEIRS).shown] == [MINE]  # fetched past 30 hidden ones
        assert len(Recaller(m, Viewer.of("ann"))("actor", THEIRS).shown) > 1
    finally:
        m.close()


def test_an_agent_isolated_or_warming_up_does_not_read_what_it_received(tmp_path) -> None:
    env = make_env("frozenlake-4x4")
    bus = MemoryBus()
    ids = ["a1", "a2", "a3"]
    agents = {
        "a1": Agent.open("a1", bus=bus, agents=ids, secret="s"),
        "a2": Agent.open("a2", bus=bus, agents=ids, secret="s", exposure=Exposure(isolated=True)),
        "a3": Agent.open("a3", bus=bus, agents=ids, secret="s", exposure=Exposure(WarmUp(after_episodes=1))),
    }
    try:
        a1, a2, a3 = agents.values()
        a1.remember(Unit(MINE, kind="rule", importance=0.9))
        a1.flush()
        assert [d.outcome for d in a2.pump()] == ["accepted"] and [d.outcome for d in a3.pump()] == ["accepted"]
        assert MINE in a1.recollect("actor", "row 0 col 1 frozen tile down").block
        assert MINE not in a2.recollect("actor", "row 0 col 1 frozen tile down").block  # received, but cut off
        assert MINE not in a3.recollect("actor", "row 0 col 1 frozen tile down").block  # no episode yet
        a3.episodes = 1
        assert MINE in a3.recollect("actor", "row 0 col 1 frozen tile down").block
    finally:
        for a in agents.values():
            a.close()
        bus.close()
        env.close()


# -- the protocols -----------------------------------------------------------------------------


def _prompts(config: ForgeConfig, *, episodes: int) -> str:
    """Every prompt instance 0 saw in one stage, with one own and one received rule in memory."""
    units = [
        Unit(MINE, kind="rule", scope="private", owner="inst-0", context=Context(role="actor")).to_dict(),
        Unit(THEIRS, kind="rule", scope="private", owner="inst-0", context=Context(role="actor"), provenance=Provenance(source="broadcast:inst-1")).to_dict(),
    ]
    llm = toy_llm()
    task = {"config": config.to_dict(), "instance": 0, "stage": 0, "seed": 1, "units": units, "episodes": episodes}
    play_stage(task, llm)
    return "\n".join(m.content for r in llm.requests for m in r.messages)


def test_protocol_switches_change_what_an_instance_is_shown() -> None:
    base = ForgeConfig(condition="forge", env="frozenlake-4x4", llm="test", instances=2, attempts=1, eval_episodes=1)
    plain = _prompts(base, episodes=0)
    assert MINE in plain and THEIRS in plain
    assert THEIRS not in _prompts(base.replace(warmup_episodes=2), episodes=0)
    assert THEIRS in _prompts(base.replace(warmup_episodes=2), episodes=2)  # episodes the parent counted
    assert THEIRS not in _prompts(base.replace(warmup_validation=0.8), episodes=5)
    isolated = _prompts(base.replace(isolated=(0,)), episodes=9)
    assert MINE in isolated and THEIRS not in isolated
    assert THEIRS in _prompts(base.replace(isolated=(1,)), episodes=0)  # only the isolated instance


def test_an_isolated_instance_never_receives_the_champion_broadcast(tmp_path) -> None:
    cfg = ForgeConfig(condition="forge-no-graduation", env="frozenlake-4x4-slippery", llm="test", instances=3, stages=2, attempts=2, eval_episodes=1, isolated=[1, 2])
    r = evolve(cfg, tmp_path / "run", llm_factory=toy_factory)
    assert r.config.isolated == (1, 2)
    assert all(s["receivers"] == [] or set(s["receivers"]) == {0} for s in r.final["stages"])
    with Memory.open(tmp_path / "run/memory.db", embedder="hash") as m:
        for i in (1, 2):
            units = m.store.list(viewer=Viewer.admin(), limit=1000)
            assert not [u for u in units if u.owner == f"inst-{i}" and u.provenance.source.startswith("broadcast:")]
    saved = json.loads((tmp_path / "run/config.json").read_text())
    assert ForgeConfig.from_dict(saved) == cfg  # a resumed run keeps its switches


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--isolate", "x"], "error: --isolate takes instance indices"),
        (["--isolate", "5", "-n", "3"], "error: isolated instance 5 is not one of 0..2"),
        (["--warmup-validation", "1.5"], "error: warmup_validation must be a number between 0 and 1"),
        (["--warmup-episodes", "-1"], "error: warmup_episodes must be zero or a positive integer"),
    ],
)
def test_evolve_rejects_bad_switches_in_one_line(tmp_path, args, message) -> None:
    res = CliRunner().invoke(evolve_command, ["--llm", "test", "--run-dir", str(tmp_path / "run"), *args])
    assert res.exit_code == 2 and res.output.startswith(message) and res.output.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_evolve_takes_the_switches_and_records_them(tmp_path) -> None:
    args = ["--llm", "test", "-n", "2", "-s", "1", "-k", "1", "--eval-episodes", "1", "--max-steps", "4", "--run-dir", str(tmp_path / "run"),
            "--warmup-episodes", "3", "--warmup-validation", "0.4", "--ramp-episodes", "2", "--isolate", "all", "--json"]
    res = CliRunner().invoke(evolve_command, args)
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "run/config.json").read_text())
    assert (saved["warmup_episodes"], saved["warmup_validation"], saved["ramp_episodes"], saved["isolated"]) == (3, 0.4, 2, [0, 1])


def test_the_swarm_takes_the_switches() -> None:
    assert exposure_of({}) is None  # defaults: prompts as always
    assert exposure_of({"isolated": True}) == Exposure(isolated=True)
    assert exposure_of({"warmup_episodes": 2, "warmup_validation": 0.5, "ramp_episodes": 3}) == Exposure(WarmUp(2, 0.5, 3))
    with pytest.raises(UserError):
        SwarmConfig(agents=2, isolate=3, llm="test").check()
    with pytest.raises(UserError):
        SwarmConfig(llm="test", warmup_validation=2.0).check()
    res = CliRunner().invoke(swarm_command, ["--llm", "test", "--agents", "2", "--isolate", "3"])
    assert res.exit_code == 2 and res.output.startswith("error: --isolate must be between 0 and --agents (2)")


def test_bad_exposures_are_refused() -> None:
    with pytest.raises(ConfigError):
        ForgeConfig(llm="test", isolated="0")
    with pytest.raises(ConfigError):
        ForgeConfig(llm="test", ramp_episodes=True)


# -- cold start: a seed pack in the protocol ---------------------------------------------------

PACK = "bench/data/frozenlake_seeds.jsonl"


def test_a_seed_pack_reaches_every_instance_and_its_prompts(tmp_path) -> None:
    from pathlib import Path

    pack = str(Path(__file__).resolve().parents[1] / PACK)
    llm = toy_llm()

    def factory():
        return llm

    cfg = ForgeConfig(condition="forge", env="frozenlake-4x4", llm="test", instances=2, stages=1, attempts=1, eval_episodes=1, seed_pack=pack)
    evolve(cfg, tmp_path / "run", llm_factory=factory)
    seen = [m.content for r in llm.requests for m in r.messages]
    assert any("when you are at row 0, col 1, on a frozen tile, then do not down" in t for t in seen)
    with Memory.open(tmp_path / "run/memory.db", embedder="hash") as m:
        units = [u for u in m.store.list(viewer=Viewer.admin(), limit=1000) if u.provenance.source == "seed"]
    assert {u.owner for u in units} == {"inst-0", "inst-1"} and len(units) == 18
    assert all(u.validation == 0.3 or u.meta.get("uses") for u in units)  # 0.3 until use earns more
    assert any(u.validation > 0.3 for u in units)  # the toy walker was shown them and succeeded
    assert not any(own(u, u.owner) for u in units)  # a seed is not the instance's own experience: warm-up may hide it
    events = [json.loads(line)["event"] for line in (tmp_path / "run/events.jsonl").read_text().splitlines()]
    assert events[:2] == ["run_started", "seeded"]


def test_a_bad_seed_pack_fails_before_the_run_exists(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"content": "ok"}\n{"contnet": "typo"}\n')
    res = CliRunner().invoke(evolve_command, ["--llm", "test", "--run-dir", str(tmp_path / "run"), "--seed-pack", str(bad)])
    assert res.exit_code == 2 and res.output.startswith("error: bad.jsonl:2: unknown seed field(s): contnet") and res.output.count("\n") == 1
    res = CliRunner().invoke(evolve_command, ["--llm", "test", "--run-dir", str(tmp_path / "run"), "--seed-pack", str(tmp_path / "none.jsonl")])
    assert res.exit_code == 2 and "no such file" in res.output
    assert not (tmp_path / "run").exists()
