"""``forge swarm --executor ray``: agents as Ray actors on a local Ray, over the real Redis.

One local Ray (four CPUs) serves the whole module; the Ctrl-C test starts its own in the
child it interrupts. The swarm is not deterministic once agents read each other's rules
(what arrives before which episode depends on timing), so the comparison with the process
executor isolates every agent (:option:`--isolate`): each plays only from what it learned
itself, while still sending, receiving and judging, which makes every agent's episodes,
returns and learned, sent and received counts a function of the seeds alone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from forge.population.swarm import SECRET_ENV
from test_swarm import default_sigint, leftover_keys, redis_or_skip, run

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'forge-memory[ray]')")]

SAME = ("episodes", "mean_return", "learned", "sent", "received")  # seed-determined when agents are isolated


@pytest.fixture(scope="module")
def redis_client():
    client = redis_or_skip()
    yield client
    client.close()


@pytest.fixture(scope="module")
def local_ray(redis_client):
    """One local Ray for the module (after Redis is known to be there); the swarm joins it."""
    from forge.population.ray_support import start_ray

    ray, owned = start_ray("ray", 4)
    yield ray
    if owned:
        ray.shutdown()


def _swarm(tmp_path, name: str, *args: str, env: dict[str, str] | None = None):
    result, out = run(tmp_path / name, *args, env=env)
    return result, out, (json.loads((out / "swarm.json").read_text()) if (out / "swarm.json").exists() else None)


def test_ray_actors_play_as_the_process_children_do(tmp_path, redis_client, local_ray):
    # No periodic batch inside the run: it fires on the wall clock, so on a loaded machine one
    # executor's agents sent a batch the other's did not (sent 5 against 3, received 9 against 5).
    args = ("--agents", "3", "--episodes", "3", "--isolate", "3", "--sync-interval", "3600", "--json")
    secret = {SECRET_ENV: "s3cret-for-the-actors"}
    by_process, _, processes = _swarm(tmp_path, "processes", *args, env=secret)
    assert by_process.exit_code == 0, by_process.output
    result, out, data = _swarm(tmp_path, "ray", "--executor", "ray", *args, env=secret)
    assert result.exit_code == 0, result.output

    assert data["status"] == "ok" and data["exit_codes"] == {"agent-1": 0, "agent-2": 0, "agent-3": 0}
    assert data["config"]["executor"] == "ray" and data["config"]["parent"] is None
    agents = data["agents"]
    assert all(a["state"] == "done" for a in agents.values())
    for aid, a in agents.items():
        assert {k: a[k] for k in SAME} == {k: processes["agents"][aid][k] for k in SAME}, aid
    assert data["totals"]["learned"] > 0 and data["totals"]["sent"] > 0
    assert any(a["received"] > 0 for a in agents.values())
    assert data["totals"]["accepted"] + data["totals"]["corroborated"] > 0  # judged and kept, not only delivered
    assert sorted(p.name for p in out.glob("agent-*.db")) == ["agent-1.db", "agent-2.db", "agent-3.db"]  # a SQLite file each
    assert data["cleaned"] and leftover_keys(redis_client, data["prefix"]) == []
    assert "s3cret-for-the-actors" not in result.output + (out / "swarm.json").read_text()


def test_actors_share_one_postgresql_memory(tmp_path, redis_client, local_ray, pg_server):
    import pg_support

    schema = pg_support.new_schema()
    try:
        result, out, data = _swarm(tmp_path, "pg", "--executor", "ray", "--db", pg_server.url(schema),
                                   "--agents", "2", "--episodes", "3", "--json")
        assert result.exit_code == 0, result.output
        assert data["status"] == "ok" and data["totals"]["learned"] > 0
        assert data["config"]["db"] == pg_server.url(schema)
        assert list(out.glob("*.db")) == []  # no SQLite file: the memory is the database
        with pg_server.admin() as c:
            owners = dict(c.execute(f'SELECT owner, count(*) FROM "{schema}".units GROUP BY owner').fetchall())
            ledgers = {r[0] for r in c.execute(f"SELECT DISTINCT actor FROM \"{schema}\".events WHERE op = 'decision'").fetchall()}
        learned = {a: s["learned"] for a, s in data["agents"].items() if s["learned"]}
        assert set(learned) <= set(owners)  # what each agent learned is in the one memory, owned by it
        # the receivers' rulings sit there too, one ledger per agent; a peer's rule is already
        # in the memory, so receiving it merges a corroboration instead of storing a copy
        assert {a for a, s in data["agents"].items() if s["received"]} <= ledgers
        # each agent reads the shared memory as its own viewer: a private unit is its owner's alone
        from forge.engine.memory import Memory
        from forge.errors import NotFoundError
        from forge.model import Unit, Viewer

        with Memory.open(pg_server.url(schema), embedder="hash") as mem:
            [mine] = mem.add(Unit("agent-1 keeps this to itself", scope="private", owner="agent-1"))
            assert mem.get(mine, viewer=Viewer(agent="agent-1")).id == mine
            with pytest.raises(NotFoundError):
                mem.get(mine, viewer=Viewer(agent="agent-2"))
    finally:
        pg_server.drop(schema)


def test_a_failing_actor_fails_the_run_with_its_error(tmp_path, redis_client, local_ray):
    result, out, data = _swarm(tmp_path, "fail", "--executor", "ray", "--db", "postgresql://forge@127.0.0.1:1/nowhere",
                               "--agents", "2", "--episodes", "1000")
    assert result.exit_code == 1
    # Both agents fail; whichever the run sees first is named (agent-2 can be first on a loaded machine).
    named = re.search(r"error: (agent-[12]) failed: StoreError: ", result.output)
    assert named and "cannot connect" in result.output
    assert data["status"] == "failed" and data["exit_codes"] == {"agent-1": 1, "agent-2": 1}
    assert data["agents"][named.group(1)]["state"] == "error"
    # the other one failed too, or was stopped by the first failure while it was failing
    assert {s["state"] for s in data["agents"].values()} <= {"error", "stopped"}
    assert leftover_keys(redis_client, data["prefix"]) == []


def test_ctrl_c_stops_every_actor(tmp_path, redis_client, local_ray):
    out = tmp_path / "swarm"
    cmd = [sys.executable, "-c", "from forge.population.swarm_cli import swarm_command; swarm_command()",
           "--llm", "test", "--executor", "ray", "--agents", "2", "--episodes", "100000", "--dir", str(out)]
    before = set(redis_client.scan_iter(match="forge-swarm:*:stats:*", count=500))  # other runs' keys
    # its own session, so the signal can go to the whole group, as a terminal's Ctrl-C does
    # (it reaches the local Ray's raylet too, which the driver started)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 120  # its own Ray starts first: seconds on a busy machine
        while time.monotonic() < deadline and proc.poll() is None and not _running(redis_client, before):
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray it started
            proc.communicate()
    assert proc.returncode == 130, output.decode()[-3000:]
    assert b"interrupted: every agent was stopped" in output
    data = json.loads((out / "swarm.json").read_text())
    why = json.dumps({"agents": data["agents"], "exit_codes": data["exit_codes"]}, indent=1, default=str)
    assert data["status"] == "interrupted"
    assert all(a["state"] == "stopped" for a in data["agents"].values()), why
    assert data["exit_codes"] == {"agent-1": 0, "agent-2": 0}, why
    assert leftover_keys(redis_client, data["prefix"]) == []


def _running(client, before: set[bytes]) -> bool:
    """Both agents of the new run have started playing (their stats say so)."""
    keys = [k for k in client.scan_iter(match="forge-swarm:*:stats:*", count=500) if k not in before]
    return sum(client.hget(k, "state") == b'"running"' for k in keys) >= 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--executor", "slurm"], "unknown executor 'slurm'; expected process, ray or ray://HOST:PORT"),
        (["--db", "shared.db"], "agents share only a postgresql://"),
        (["--db", "postgresql://forge:hunter2@db/memory"], "PGPASSWORD"),
    ],
)
def test_bad_executor_or_db_is_one_line_and_exit_2(tmp_path, args, message):
    result, out = run(tmp_path, *args)
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and result.output.count("\n") == 1 and message in result.output
    assert "hunter2" not in result.output
    assert not out.exists()
