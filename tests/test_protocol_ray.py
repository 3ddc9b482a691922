"""``evolve(..., executor="ray")``: instances played as Ray tasks give the process workers' result.

A local ``ray.init()`` with two CPUs; skipped when Ray is not installed.
"""

from __future__ import annotations

import pytest

from forge.errors import ConfigError
from forge.llm.base import forbid_real_llms
from forge.protocols import ForgeConfig, evolve
from test_protocol import SLIPPERY, essence
from test_protocol_toy import toy_factory

pytest.importorskip("ray", reason="Ray is not installed (pip install 'forge-memory[ray]')")


def test_ray_tasks_give_the_process_workers_result(tmp_path):
    cfg = ForgeConfig(condition="forge-no-graduation", **SLIPPERY, workers=2)
    with forbid_real_llms():
        by_processes = evolve(cfg, tmp_path / "processes", llm_factory=toy_factory)
        by_ray = evolve(cfg, tmp_path / "ray", llm_factory=toy_factory, executor="ray")
    assert essence(by_ray.final) == essence(by_processes.final)
    assert by_ray.final["evaluation"]["mean_return"] == by_processes.final["evaluation"]["mean_return"]


def test_an_unknown_executor_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="executor"):
        evolve(ForgeConfig(**SLIPPERY), tmp_path / "run", llm_factory=toy_factory, executor="slurm")
    assert not (tmp_path / "run").exists()
