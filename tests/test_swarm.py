"""``forge swarm`` end to end: separate agent processes on the real Redis at 127.0.0.1:6379.

Each run uses the scripted walker (``--llm test``) so it finishes in seconds; tests that need
Redis skip with the reason when it is unreachable.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import forge.population.member as member
import forge.population.swarm as swarm
from forge.llm.base import Message, Request
from forge.llm.structured import choose
from forge.llm.testing import WalkerLLM
from forge.population.swarm import SECRET_ENV, SwarmConfig
from forge.population.swarm_cli import render_table, swarm_command

REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_or_skip():
    """A client of the test Redis, or a skip that says why there is none."""
    redis = pytest.importorskip("redis", reason="redis-py is not installed (pip install 'forge-memory[redis]')")
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        pytest.skip(f"Redis not reachable at {REDIS_URL}: {exc}")
    return client


@pytest.fixture
def redis_client():
    client = redis_or_skip()
    yield client
    client.close()


def leftover_keys(client, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=f"{prefix}*", count=500))


def run(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    out = tmp_path / "swarm"
    result = CliRunner().invoke(swarm_command, ["--llm", "test", "--dir", str(out), "--linger", "30", *args], env=env)
    return result, out


@pytest.mark.slow
def test_memory_flows_between_agent_processes(tmp_path, redis_client, monkeypatch):
    started: list[tuple[list[str], dict[str, str]]] = []
    real_popen = subprocess.Popen

    def spy(argv, **kw):
        started.append((list(argv), dict(kw["env"])))
        return real_popen(argv, **kw)

    monkeypatch.setattr(swarm.subprocess, "Popen", spy)
    t0 = time.monotonic()
    result, out = run(tmp_path, "--agents", "3", "--episodes", "3", env={SECRET_ENV: "s3cret-from-the-operator"})
    assert result.exit_code == 0, result.output
    assert time.monotonic() - t0 < 120  # all three came back; a generous bound for a loaded machine

    data = json.loads((out / "swarm.json").read_text())
    assert data["status"] == "ok" and data["exit_codes"] == {"agent-1": 0, "agent-2": 0, "agent-3": 0}
    agents = data["agents"]
    assert all(a["episodes"] == 3 and a["state"] == "done" for a in agents.values())
    assert data["totals"]["sent"] > 0
    assert any(a["received"] > 0 for a in agents.values())
    assert data["totals"]["accepted"] + data["totals"]["corroborated"] > 0  # judged and kept, not only delivered
    assert data["cleaned"] and leftover_keys(redis_client, data["prefix"]) == []
    assert sorted(p.name for p in out.glob("agent-*.db")) == ["agent-1.db", "agent-2.db", "agent-3.db"]
    # the table and the run line are printed; the secret travels only in the environment
    assert "agent-3" in result.output and "accepted" in result.output and data["prefix"] in result.output
    assert len(started) == 3
    for argv, child_env in started:
        assert "s3cret-from-the-operator" not in " ".join(argv)
        assert child_env[SECRET_ENV] == "s3cret-from-the-operator"


@pytest.mark.slow
def test_poisoned_agent_is_quarantined(tmp_path, redis_client):
    result, out = run(tmp_path, "--agents", "3", "--episodes", "2", "--poison", "1", "--topology", "star", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data == json.loads((out / "swarm.json").read_text())
    assert data["agents"]["agent-3"]["poison"] is True
    honest = [data["agents"][a] for a in ("agent-1", "agent-2")]
    assert sum(a["quarantined"] for a in honest) > 0
    assert data["agents"]["agent-3"]["quarantined"] == 0  # nobody honest sends poison
    assert leftover_keys(redis_client, data["prefix"]) == []


@pytest.mark.slow
def test_an_isolated_agent_is_marked_and_asks_nobody(tmp_path, redis_client):
    result, out = run(tmp_path, "--agents", "3", "--episodes", "3", "--isolate", "1", "--warmup-episodes", "1", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    agents = data["agents"]
    assert agents["agent-1"]["isolated"] is True and not agents["agent-2"]["isolated"]
    assert agents["agent-1"]["help_asked"] == 0  # cut off: it asks no peer for help
    assert data["config"]["isolate"] == 1 and data["config"]["warmup_episodes"] == 1


@pytest.mark.slow
def test_keep_leaves_the_keys(tmp_path, redis_client):
    result, out = run(tmp_path, "--agents", "2", "--episodes", "1", "--keep", "--topology", "ring")
    assert result.exit_code == 0, result.output
    data = json.loads((out / "swarm.json").read_text())
    try:
        assert not data["cleaned"]
        keys = {k.decode() for k in leftover_keys(redis_client, data["prefix"])}
        assert f"{data['prefix']}stats:agent-1" in keys
    finally:
        for k in leftover_keys(redis_client, data["prefix"]):
            redis_client.delete(k)


def test_a_child_stopped_while_its_interpreter_starts_exits_cleanly(tmp_path):
    # On a loaded machine a sibling can crash, and the parent stop the others, before their
    # interpreters have run a line: they used to die of the SIGTERM itself (exit -15).
    procs = swarm._Processes(tmp_path, secret="s")
    for aid in ("agent-1", "agent-2", "agent-3"):
        procs.start(aid, {"agent": aid})
    procs.stop()  # at once, while the children are still starting
    assert procs.codes() == {"agent-1": 0, "agent-2": 0, "agent-3": 0}


def child_exit(monkeypatch, agent) -> int:
    """A child's exit code with ``agent`` as its run_agent; the test's signal handlers restored."""
    monkeypatch.setattr(member, "run_agent", agent)
    monkeypatch.setenv(SECRET_ENV, "s")
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return member._child_main(["{}"])
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_a_stop_swallowed_by_a_library_still_stops_the_child(monkeypatch):
    """The SIGTERM handler's exception can be caught inside a library call and come back as
    an ordinary error; the stop must stick anyway (once under CI load a child played on
    until SIGKILL)."""
    seen: dict[str, int] = {}

    def agent(spec, *, secret, stop):
        try:
            signal.raise_signal(signal.SIGTERM)  # the handler raises here...
        except BaseException:
            seen["swallowed"] = 1  # ...and a library turns it into something it handles
        for n in range(1000):  # the episode loop
            member._check_parent(spec, stop)
            seen["episodes"] = n + 1
        return {}

    assert child_exit(monkeypatch, agent) == 0
    assert seen == {"swallowed": 1}  # no episode was played after the stop


def test_an_error_caused_by_the_stop_is_a_stop_not_a_crash(monkeypatch, capsys):
    """A stop that cuts a library call short can surface as an ordinary error, in the call
    or in the cleanup after it; the child was asked to stop and did: exit 0, and the log
    says what broke (once under CI load such a child exited 1 and failed the run)."""

    def agent(spec, *, secret, stop):
        try:
            signal.raise_signal(signal.SIGTERM)
        except BaseException as exc:  # a library wraps what it caught
            raise RuntimeError("connection reset while reading") from exc

    assert child_exit(monkeypatch, agent) == 0
    assert "stopped; the stop interrupted: RuntimeError: connection reset while reading" in capsys.readouterr().err


def test_an_error_without_a_stop_still_fails_the_child(monkeypatch, capsys):
    def agent(spec, *, secret, stop):
        raise RuntimeError("disk on fire")

    assert child_exit(monkeypatch, agent) == 1
    assert "RuntimeError: disk on fire" in capsys.readouterr().err


def test_a_crashing_agent_fails_the_run(tmp_path, redis_client, monkeypatch):
    real = swarm._child_argv

    def argv(spec):
        if spec["agent"] == "agent-2":
            return [sys.executable, "-c", "import sys; print('boom: no memory for you'); sys.exit(3)"]
        return real(spec)

    monkeypatch.setattr(swarm, "_child_argv", argv)
    result, out = run(tmp_path, "--agents", "2", "--episodes", "1000")
    assert result.exit_code == 1
    assert "agent-2 exited with code 3: boom: no memory for you" in result.output
    data = json.loads((out / "swarm.json").read_text())
    assert data["status"] == "failed" and data["agents"]["agent-2"]["state"] == "crashed"
    assert data["exit_codes"]["agent-1"] == 0  # stopped cleanly, not killed
    assert data["agents"]["agent-1"]["state"] == "stopped"
    assert leftover_keys(redis_client, data["prefix"]) == []


@pytest.mark.slow
def test_ctrl_c_stops_every_agent(tmp_path, redis_client):
    out = tmp_path / "swarm"
    cmd = [sys.executable, "-c", "from forge.population.swarm_cli import swarm_command; swarm_command()",
           "--llm", "test", "--agents", "2", "--episodes", "100000", "--dir", str(out)]
    before = set(redis_client.scan_iter(match="forge-swarm:*:stats:*", count=500))  # other runs' keys
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and not running_since(redis_client, before):
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, output.decode()
    data = json.loads((out / "swarm.json").read_text())
    logs = {p.name: p.read_text(errors="replace")[-2000:] for p in out.glob("*.log")}
    why = json.dumps({"agents": data["agents"], "exit_codes": data["exit_codes"], "logs": logs}, indent=1, default=str)
    assert data["status"] == "interrupted"
    assert all(a["state"] == "stopped" for a in data["agents"].values()), why
    assert all(code == 0 for code in data["exit_codes"].values()), why
    assert leftover_keys(redis_client, data["prefix"]) == []


def running_since(client, before: set[bytes]) -> bool:
    """Whether an agent of a swarm started after ``before`` was taken says it is running (a
    killed earlier run's keys may say "running" too, and a signal sent on them arrives while
    the new swarm is still starting)."""
    return any(b"running" in (client.hget(k, "state") or b"")
               for k in client.scan_iter(match="forge-swarm:*:stats:*", count=500) if k not in before)


def default_sigint() -> None:
    """In the child before exec: Ctrl-C's default action, as under a terminal. A test run in a
    background job (SIGINT ignored there) would otherwise hand its children an ignored SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--poison", "4", "--agents", "3"], "--poison must be between 0"),
        (["--bus", "memory://"], "need a shared bus"),
        (["--env", "chess"], "unknown environment"),
        (["--llm", "gpt"], "unknown LLM spec"),
        (["--sync-interval", "0"], "--sync-interval must be a positive"),
        (["--sync-interval", "nan"], "--sync-interval must be a positive"),
    ],
)
def test_bad_options_fail_before_starting_anything(tmp_path, args, message):
    result, out = run(tmp_path, *args)
    assert result.exit_code == 2
    assert message in result.output and result.output.startswith("error: ")
    assert not out.exists()


def test_unreachable_redis_is_one_line(tmp_path):
    result, out = run(tmp_path, "--bus", "redis://127.0.0.1:1/0")
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "127.0.0.1:1" in result.output and "redis-server" in result.output
    assert not out.exists()


def test_walker_obeys_rules_in_its_prompt():
    walker = WalkerLLM(seed=3)
    obs = "Step 1 of 20.\nYou are at row 0, col 1 (rows 0-3 top to bottom), on a frozen (safe) tile. The goal is far."
    rule = "## Rules\n[0] when you are at row 0, col 1, on a frozen tile, then do not down; right was safe there"
    moves = ["left", "down", "right", "up"]

    def picks(system: str) -> set[str]:
        return {choose(walker, [Message("system", system), Message("user", f"{obs}\n{i}")], moves) for i in range(40)}

    ruled, free = picks(f"Task.\n{rule}"), picks("Task.")
    assert "down" not in ruled and "down" in free
    same = [walker.complete(Request(messages=[Message("user", obs)], choices=["left", "down"])).text for _ in range(3)]
    assert len(set(same)) == 1  # deterministic for the same prompt
    assert json.loads(walker.complete(Request(messages=[Message("user", "reflect")], json_schema={"type": "object", "properties": {"edits": {"type": "array"}}})).text) == {"edits": []}


def test_config_defaults_match_the_command():
    defaults = {p.name: p.default for p in swarm_command.params}
    config = SwarmConfig()
    for name in ("agents", "episodes", "env", "llm", "topology", "embedder", "bus", "poison", "seed", "max_steps", "rule_guard", "linger_s",
                 "sync_interval_s", "warmup_episodes", "warmup_validation", "ramp_episodes", "isolate", "executor", "db"):
        assert defaults[name] == getattr(config, name), name


def test_the_table_shows_every_agent_and_the_totals():
    from rich.console import Console

    stats = {
        "agent-1": {"state": "done", "episodes": 2, "mean_return": 1.0, "sent": 3, "received": 4, "accepted": 2, "quarantined": 0},
        "agent-2": {"state": "running", "episodes": 1, "mean_return": -1.0, "sent": 1, "received": 5, "quarantined": 2, "poison": True},
    }
    console = Console(record=True, width=160)
    console.print(render_table(stats, config=SwarmConfig(episodes=2), agents=["agent-1", "agent-2", "agent-3"], title="t"))
    text = console.export_text()
    assert "agent-2 (poison)" in text and "starting" in text  # agent-3 has not reported yet
    total = next(line for line in text.splitlines() if "total" in line)
    cells = [c.strip() for c in total.split("│")][1:-1]
    assert cells == ["total", "", "3/6", "+0.00", "0", "4", "9", "2", "0", "2", "0", "0", "0/0", "0"]


class _Peers:
    """A board whose one peer works for ``busy_s`` (publishing as it goes), then sends a rule
    and finishes: what a slow peer on a loaded machine looks like to a lingering agent."""

    def __init__(self, busy_s: float) -> None:
        self.start, self.busy_s = time.monotonic(), busy_s

    def read(self, agents):
        t = time.monotonic() - self.start
        done = t >= self.busy_s
        return {a: {"state": "done" if done else "running", "outbox": 0, "at": round(t, 1)} for a in agents}


class _Listener:
    """The lingering agent: counts what it receives once the peer has sent it."""

    def __init__(self, peers: _Peers) -> None:
        self.id, self.peers, self.received = "agent-1", peers, 0
        self.broadcaster = type("B", (), {"outbox": []})()

    def flush(self) -> None:
        pass

    def pump(self, block_ms: int) -> int:
        time.sleep(block_ms / 1000)
        if self.received == 0 and time.monotonic() - self.peers.start >= self.peers.busy_s:
            self.received = 1
            return 1
        return 0


def test_a_lingering_agent_waits_for_a_peer_that_is_still_working():
    """``linger_s`` is patience with silence, not a cap on the wait: a peer that keeps
    publishing progress is waited for however long it works (the Ray swarm beside a heavy job:
    its agent-1 left before its peers had sent anything, received 0 against 6), and one that
    falls silent is given up on after ``linger_s``."""
    peers = _Peers(busy_s=1.5)
    agent = _Listener(peers)
    spec = {"linger_s": 0.6, "agents": ["agent-1", "agent-2"]}
    member._linger(agent, peers, spec, lambda **_: None)
    assert agent.received == 1 and time.monotonic() - peers.start >= 1.5

    class Silent(_Peers):  # started, then never heard from again (killed -9)
        def read(self, agents):
            return {a: {"state": "running", "outbox": 0, "at": 0.0} for a in agents}

    silent = Silent(busy_s=1e9)
    member._linger(_Listener(silent), silent, spec, lambda **_: None)
    assert 0.6 <= time.monotonic() - silent.start < 5
