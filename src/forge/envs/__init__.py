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
    "seed_split",
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


# Spelled out here so listing names never imports textworld; a test checks it matches
# forge.envs.textworld.textworld_games().
_TEXTWORLD_GAMES = tuple(
    f"{family}-{level}" for family in ("coin", "treasure", "simple", "cooking") for level in (1, 2, 3)
)


def available_envs() -> list[str]:
    """Every name :func:`make_env` accepts (CybORG's is listed even when not installed)."""
    return [
        *_REGISTRY,
        *(f"textarena:{g}" for g in _TEXTARENA_GAMES),
        *(f"textworld:{g}" for g in _TEXTWORLD_GAMES),
    ]


def make_env(name: str, **kwargs: Any) -> Env:
    """Build the environment called ``name``; keyword arguments go to its adapter."""
    if name.startswith("textarena:"):
        from forge.envs.textarena import make_textarena

        if kwargs:
            raise ConfigError(f"{name} takes no options, got: {', '.join(kwargs)}")
        return make_textarena(name.removeprefix("textarena:"))
    if name.startswith("textworld:"):
        from forge.envs.textworld import make_textworld

        return make_textworld(name.removeprefix("textworld:"), **kwargs)
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


#: Envs whose seed changes nothing a rule could name: one map (or one start) for every seed.
_ONE_TASK = ("frozenlake-4x4", "frozenlake-8x8", "cliffwalking")
_GENERIC_HELD_OUT = 10_000


def seed_split(name: str, *, train: int = 100, held_out: int = 10) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(training seeds, held-out seeds)`` for ``name``: tasks to learn on, and tasks (maps,
    games, attack paths) no run trains on, disjoint by construction.

    Random FrozenLake maps and TextWorld games declare their own split (distinct maps; game
    seeds 0-99 against 1000-1099); other seeded envs split at seed 10,000. An env that plays
    one task whatever the seed has no held-out tasks, and says so.
    """
    if train < 1 or held_out < 1:
        raise ConfigError(f"a seed split needs at least one training and one held-out seed, got {train} and {held_out}")
    if name.startswith(_ONE_TASK):
        raise ConfigError(f"{name} plays one map whatever the seed, so it has no held-out tasks; use frozenlake-random-4x4 or a TextWorld family")
    if name.startswith("frozenlake-random-"):
        from forge.envs import gym

        size = int(name.removeprefix("frozenlake-random-").split("x", 1)[0])
        return tuple(gym.train_seeds(size, train)), tuple(gym.held_out_seeds(size, held_out))
    if name.startswith("textworld:"):
        from forge.envs import textworld

        family = name.removeprefix("textworld:").rsplit("-", 1)[0]
        tr, ho = textworld.train_seeds(family), textworld.held_out_seeds(family)
        if train > len(tr) or held_out > len(ho):
            raise ConfigError(f"{name} has {len(tr)} training and {len(ho)} held-out games")
        return tuple(tr[:train]), tuple(ho[:held_out])
    if name not in available_envs():
        raise ConfigError(f"unknown environment {name!r}; known: {', '.join(available_envs())}")
    return tuple(range(train)), tuple(range(_GENERIC_HELD_OUT, _GENERIC_HELD_OUT + held_out))
