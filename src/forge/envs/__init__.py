"""Environment adapters behind one string factory.

``make_env("frozenlake-4x4")``, ``make_env("taxi")``, ``make_env("textarena:TowerOfHanoi-v0")``,
``make_env("cyborg-cage2")``, ``make_env("minicage")`` (CAGE-2's shape without CybORG): each
name imports its backend only when built, so ``forge.envs`` costs nothing to import and a
missing optional package surfaces as a ConfigError with an install hint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forge.envs.base import Env, EnvSpec, StepResult, check_action
from forge.errors import ConfigError

__all__ = [
    "Env",
    "EnvSpec",
    "StepResult",
    "available_envs",
    "check_action",
    "make_env",
    "oracle_action",
]


def _frozenlake(size: int, slippery: bool, random_map: bool = False) -> Callable[..., Env]:
    def build(**kwargs: Any) -> Env:
        from forge.envs.gym import FrozenLakeEnv

        return FrozenLakeEnv(size=size, slippery=slippery, random_map=random_map, **kwargs)

    return build


def _cliffwalking(**kwargs: Any) -> Env:
    from forge.envs.gym import CliffWalkingEnv

    return CliffWalkingEnv(**kwargs)


def _taxi(**kwargs: Any) -> Env:
    from forge.envs.gym import TaxiEnv

    return TaxiEnv(**kwargs)


def _postgres(**kwargs: Any) -> Env:
    from forge.envs.postgres import PostgresDiagnosisEnv

    return PostgresDiagnosisEnv(**kwargs)


def _cyborg(**kwargs: Any) -> Env:
    from forge.envs.cyborg import CybORGCage2Env

    return CybORGCage2Env(**kwargs)


def _minicage(**kwargs: Any) -> Env:
    from forge.envs.minicage import MiniCageEnv

    return MiniCageEnv(**kwargs)


_REGISTRY: dict[str, Callable[..., Env]] = {
    "frozenlake-4x4": _frozenlake(4, False),
    "frozenlake-4x4-slippery": _frozenlake(4, True),
    "frozenlake-8x8": _frozenlake(8, False),
    "frozenlake-8x8-slippery": _frozenlake(8, True),
    # a new map per episode seed (forge.envs.gym.train_seeds / held_out_seeds split them)
    **{
        f"frozenlake-random-{n}x{n}{tail}": _frozenlake(n, slippery, random_map=True)
        for n in (4, 5, 6)
        for tail, slippery in (("", False), ("-slippery", True))
    },
    "cliffwalking": _cliffwalking,
    "taxi": _taxi,
    "cyborg-cage2": _cyborg,
    "minicage": _minicage,
    "postgres-diagnosis": _postgres,
}

# Kept literal so listing names never imports textarena; a test checks it matches.
_TEXTARENA_GAMES = (
    "TowerOfHanoi-v0",
    "TowerOfHanoi-v0-medium",
    "TowerOfHanoi-v0-hard",
    "GuessTheNumber-v0",
    "GuessTheNumber-v0-hardcore",
)


def available_envs() -> list[str]:
    """Every name :func:`make_env` accepts (CybORG's is listed even when not installed)."""
    return [*_REGISTRY, *(f"textarena:{g}" for g in _TEXTARENA_GAMES)]


def make_env(name: str, **kwargs: Any) -> Env:
    """Build the environment called ``name``; keyword arguments go to its adapter."""
    if name.startswith("textarena:"):
        from forge.envs.textarena import make_textarena

        if kwargs:
            raise ConfigError(f"{name} takes no options, got: {', '.join(kwargs)}")
        return make_textarena(name.removeprefix("textarena:"))
    try:
        build = _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown environment {name!r}; known: {', '.join(available_envs())}"
        ) from None
    return build(**kwargs)


def oracle_action(env: Env) -> str:
    """A scripted expert's next action, for tests and seeded demonstrations.

    Defined for the deterministic gymnasium envs (shortest safe path) and the TextArena games;
    other envs raise ConfigError.
    """
    own = getattr(env, "oracle_action", None)
    if not callable(own):
        raise ConfigError(f"no oracle for {env.spec.name}")
    return own()
