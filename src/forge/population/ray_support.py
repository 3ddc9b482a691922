"""Ray for populations: the one place ``forge evolve`` and ``forge swarm`` import and start it.

``process`` runs on this machine without Ray; ``ray`` starts a local Ray; ``ray://HOST:PORT``
joins a running cluster (whose nodes have FORGE installed). Ray is optional: it is imported
only here, only when asked for, so the rest of FORGE never depends on it.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from forge.errors import ConfigError

__all__ = ["EXECUTORS", "check_executor", "import_ray", "start_ray"]

EXECUTORS = ("process", "ray")  # or ray://HOST:PORT, a running Ray cluster


def check_executor(executor: str) -> str:
    if executor in EXECUTORS or (isinstance(executor, str) and executor.startswith("ray://")):
        return executor
    raise ConfigError(f"unknown executor {executor!r}; expected process, ray or ray://HOST:PORT")


def import_ray() -> Any:
    """Import Ray, or say how to install it. (Ray, like llama.cpp, failed to start in a process
    that had loaded usearch 2.26's C++ runtime; pyproject keeps usearch below 2.26.)"""
    with warnings.catch_warnings():  # Ray's own import-time notices are not ours to fail on
        warnings.simplefilter("ignore")
        try:
            import ray
        except ImportError:
            raise ConfigError("--executor ray needs Ray: pip install 'forge-memory[ray]'") from None
    return ray


def start_ray(executor: str, num_cpus: int) -> tuple[Any, bool]:
    """Join the cluster (``ray://``) or start a local Ray with ``num_cpus`` CPUs.

    Returns ``(ray, owned)``: ``owned`` is True when this call started or joined it, so the
    caller shuts it down when done; a Ray already initialised (a test's, a notebook's) is
    used as it is and left running.
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    with warnings.catch_warnings():  # Ray's own start-up notices are not ours to fail on
        warnings.simplefilter("ignore")
        if check_executor(executor) == "ray":
            # Local workers import what this process can (tests, user modules with factories).
            env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
        else:
            try:
                ray.init(address=executor, log_to_driver=False)
            except Exception as exc:  # noqa: BLE001 - Ray's client raises ConnectionError, RuntimeError, grpc errors...
                detail = " ".join(str(exc).split())[:300]
                raise ConfigError(f"cannot join the Ray cluster at {executor}: {type(exc).__name__}: {detail}") from None
    return ray, True
