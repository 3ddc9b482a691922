"""The environment port: text in, text out, a reward per step, a seed per episode.

Adapters wrap real third-party environments (gymnasium toy-text, TextArena, CybORG) so the
protocols never see their APIs. Actions are strings chosen from :meth:`Env.valid_actions`,
which is what lets a small model be constrained to a legal move.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from forge.errors import ValidationError

__all__ = ["Env", "EnvSpec", "StepResult", "check_action"]


@dataclass(frozen=True, slots=True)
class StepResult:
    observation: str
    reward: float
    done: bool
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EnvSpec:
    """What the protocols need to know about an environment before playing it.

    ``tau`` is the abort threshold (an attempt stops the moment one step's reward is below
    it); ``theta`` the graduation threshold on a checkpoint return; ``success_return`` the
    return at or above which an episode counts as a success, ``major_failure_return`` the
    return at or below which it counts as a major failure.

    ``description`` is the stable part of a prompt: the same text at every step of every
    episode, so it can sit before the observation and a model's prefix cache can reuse it.
    ``actions_in_description`` says it already names every valid action (a large action set
    written compactly, as CAGE-2's 145), so a prompt need not list them again.

    ``situation``, when an env sets it, maps one of its observations to a one-line state (no
    step counter, stable word order) for a rule's "when" clause; None means the caller's
    generic summary will do. It must be a pure function of the observation text, because
    reflection calls it on recorded observations long after the episode. It names only what
    an agent can recognise in another task of the same family (what lies around it, the kind
    of an object or host, the objective), never coordinates, generated names or seeds: that
    is what lets a rule learned on one map or game apply on the next.

    ``abstract`` rewrites instance-only names in a text into their kinds (CAGE-2: "User2" ->
    "a User host"), and ``instance_terms`` lists the instance-only tokens a text still names
    (a coordinate, a generated object name, a seed). The rule check repairs a learned rule with
    the first and refuses it, saying why, when the second still finds something. None means
    the env has no such names.

    ``place`` maps an observation to where the agent stands as the env knows it (FrozenLake's
    row and column; TextWorld's room and what is carried), instance names and all: it is never
    shown to a model or stored, only compared within one episode, so a policy can tell a
    return to where it stood from a new place that reads alike. None means returns are not
    tracked.
    """

    name: str
    description: str
    max_steps: int
    tau: float
    theta: float
    success_return: float
    major_failure_return: float
    situation: Callable[[str], str] | None = field(default=None, compare=False, repr=False)
    actions_in_description: bool = False
    abstract: Callable[[str], str] | None = field(default=None, compare=False, repr=False)
    instance_terms: Callable[[str], Sequence[str]] | None = field(default=None, compare=False, repr=False)
    place: Callable[[str], str] | None = field(default=None, compare=False, repr=False)

    def succeeded(self, total: float, *, aborted: bool = False) -> bool:
        """Whether an episode with return ``total`` is a success: FORGE's one rule. At or
        above ``success_return``, in an attempt that was not cut off below tau (``aborted``:
        a partial return says nothing of the task). An episode that fell below tau and played
        on (no abort) is judged by its return like any other."""
        return total >= self.success_return and not aborted


@runtime_checkable
class Env(Protocol):
    spec: EnvSpec

    def reset(self, *, seed: int) -> str:
        """Start a fresh episode; returns the first observation as text."""
        ...

    def valid_actions(self) -> Sequence[str]: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...


def check_action(action: str, *, valid: Sequence[str], env: str) -> str:
    """Return the valid action ``action`` names, or raise a ValidationError listing them.

    Case and surrounding whitespace are forgiven because models emit both; anything else is a
    caller bug and is reported with the full list so the prompt or grammar can be fixed.
    """
    if isinstance(action, str):
        wanted = action.strip().lower()
        for candidate in valid:
            if candidate.lower() == wanted:
                return candidate
    raise ValidationError(
        f"{action!r} is not a valid action for {env}; choose one of: {', '.join(valid)}"
    )
