"""Evolution protocols: FORGE (population + champion broadcast + graduation), Reflexion,
zero-shot, and the no-graduation ablation, all from one code path.

    from forge.protocols import ForgeConfig, evolve, resume
    result = evolve(ForgeConfig(condition="forge", env="frozenlake-4x4", instances=4), "runs/a")
    result = resume("runs/a")          # after an interruption: continues where it stopped
"""

from __future__ import annotations

from forge.protocols.config import (
    CONDITIONS,
    POLICIES,
    REPRESENTATIONS,
    Condition,
    ForgeConfig,
    derive_seed,
)
from forge.protocols.forge import ChampionDelivery, DirectDelivery, RunResult, evolve, resume
from forge.protocols.runs import RunDir

__all__ = [
    "CONDITIONS",
    "POLICIES",
    "REPRESENTATIONS",
    "Condition",
    "ChampionDelivery",
    "DirectDelivery",
    "ForgeConfig",
    "RunDir",
    "RunResult",
    "derive_seed",
    "evolve",
    "resume",
]
