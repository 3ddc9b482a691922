"""``evolve(..., executor="ray")``: instances played as Ray tasks give the process workers' result.

Both runs happen in a fresh Python process, with a local ``ray.init()`` on two CPUs, so Ray's
workers and state never touch the pytest process. Skipped when Ray is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from forge.errors import ConfigError
from forge.protocols import ForgeConfig, evolve
from test_protocol import SLIPPERY
from test_protocol_toy import toy_factory

_BOTH = textwrap.dedent(
    """
    import json, sys
    import ray
    sys.path.insert(0, {tests!r})
    from forge.llm.base import forbid_real_llms
    from forge.protocols import ForgeConfig, evolve
    from test_protocol import SLIPPERY, essence
    from test_protocol_toy import toy_factory
    cfg = ForgeConfig(condition="forge-no-graduation", **SLIPPERY, workers=2)
    with forbid_real_llms():
        by_processes = evolve(cfg, {run!r} + "/processes", llm_factory=toy_factory)
        by_ray = evolve(cfg, {run!r} + "/ray", llm_factory=toy_factory, executor="ray")
    print(json.dumps([essence(by_processes.final), essence(by_ray.final)]))
    """
)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'forge-memory[ray]')")
def test_ray_tasks_give_the_process_workers_result(tmp_path):
    code = _BOTH.format(tests=str(Path(__file__).parent), run=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_processes, by_ray = json.loads(proc.stdout.strip().splitlines()[-1])
    assert by_ray == by_processes
    assert (tmp_path / "ray" / "final.json").exists()


def test_an_unknown_executor_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="executor"):
        evolve(ForgeConfig(**SLIPPERY), tmp_path / "run", llm_factory=toy_factory, executor="slurm")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'forge-memory[ray]')")
def test_an_unreachable_cluster_is_one_line_and_writes_no_run(tmp_path):
    """Nothing listens on port 9: the error names the cluster, and no run directory is left
    half-made (Ray is joined before the run is created)."""
    proc = subprocess.run(
        [sys.executable, "-m", "forge.cli", "evolve", "--llm", "test", "--env", "frozenlake-4x4", "-n", "2", "-s", "1", "-k", "1",
         "--executor", "ray://127.0.0.1:9", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: cannot join the Ray cluster at ray://127.0.0.1:9") and proc.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()
