"""Grounding a failure in the environment: replay a seeded episode and probe the failing step.

Reflection on a failed attempt asks which other actions were safe there (and which won the
episode outright), so a rule can say what to do instead; a stalled episode is blamed where
it began to go in circles. These need a replayable environment and a seed: a user's own
agent, with neither, learns from its trace instead (:mod:`forge.learn.online`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from forge.envs.base import Env
from forge.envs.situation import goal_ways, situation_of, summarize_observation
from forge.errors import ForgeError

__all__ = ["Alternatives", "probe_alternatives", "replay_to", "safe_alternatives", "stall_step"]

@dataclass(frozen=True, slots=True)
class Alternatives:
    """What the probes of a failing step found: ``safe``, best first (see
    :func:`probe_alternatives`), and ``won``, those among them that won the episode outright."""

    safe: tuple[str, ...] = ()
    won: tuple[str, ...] = ()


def safe_alternatives(
    env: Env, *, seed: int, prefix: Sequence[str], failed: str, tau: float, must_move: bool = False,
    seen: Collection[str] = (),
) -> tuple[str, ...]:
    """The actions that were safe at the failing step, best first (:func:`probe_alternatives`)."""
    return probe_alternatives(env, seed=seed, prefix=prefix, failed=failed, tau=tau, must_move=must_move, seen=seen).safe


def probe_alternatives(
    env: Env, *, seed: int, prefix: Sequence[str], failed: str, tau: float, must_move: bool = False,
    seen: Collection[str] = (),
) -> Alternatives:
    """Replay the seeded episode up to the failing step and try every other action there.

    Environments are seeded, so this is the exact counterfactual; it costs env steps, no
    tokens, and gives reflection (and its fallback) a grounded "what would have been safe".
    Actions that change the situation come first: when any does, an action that leaves it
    as it was (a bump into an edge) is not named. "left was safe there" for a bump at a
    wall reads as advice, and the 1.5B model, primed by four such rules, pressed left at the
    start tile for a whole episode. ``must_move`` (for stalls) never names a no-op, and
    ``seen`` (the situations of a stalled episode) puts moves to new ground first (but a move
    the situation keys as the goal's way comes before all, new ground or not): after
    shuttling between row 0, cols 1-3, "left" at col 2 is safe but leads back. Within each
    group, actions with the better step reward come first (Python's sort is stable, so ties
    keep the env's order), since a rule names at most :data:`forge.learn.rules.MAX_SAFE`.
    An action that won the episode outright comes before everything.
    """
    new: list[tuple[float, str]] = []
    safe: list[tuple[float, str]] = []
    still: list[tuple[float, str]] = []
    try:
        # the actions valid at the failing step, not wherever the env was left (after the
        # episode, or after the probes of the step after this one when blame walks back): in
        # TextWorld another room's commands were tried here, and the room's own never were
        before, total = replay_to(env, seed=seed, prefix=prefix)
        valid = list(env.valid_actions())
    except ForgeError:
        return Alternatives()
    won: list[str] = []
    here = situation_of(before, env.spec)
    ahead = goal_ways(here)  # the moves the env keys as the goal's way where the step failed
    for action in valid:
        if action == failed:
            continue
        try:
            replay_to(env, seed=seed, prefix=prefix)
            result = env.step(action)
            after = situation_of(result.observation, env.spec)
            if result.done and env.spec.succeeded(total + result.reward):
                won.append(action)
            if result.reward >= tau:
                if after == here:
                    still.append((result.reward, action))
                else:
                    (safe if after in seen else new).append((result.reward, action))
        except ForgeError:
            continue
    # The goal's way first, whether or not it leads to new ground (coin-2's corridor rooms
    # read alike, so walking on looked like a bump or a room seen, and the way back new), then
    # the best step reward, then the env's order: a rule names only the first few, and the
    # prompt offers what it names
    onward = [ra for ra in new + safe + still if _move(ra[1]) in ahead or ra[1] in won]
    best = onward + [ra for ra in (new or safe or ([] if must_move else still)) if ra not in onward]
    ranked = sorted(best, key=lambda ra: (ra[1] not in won, ra not in onward, -ra[0]))
    return Alternatives(tuple(a for _, a in ranked), tuple(won))


def replay_to(env: Env, *, seed: int, prefix: Sequence[str]) -> tuple[str, float]:
    """Reset the seeded episode and play ``prefix``; the observation there and the return so far."""
    observation, total = env.reset(seed=seed), 0.0
    for a in prefix:
        result = env.step(a)
        observation, total = result.observation, total + result.reward
    return observation, total


def stall_step(observations: Sequence[str], actions: Sequence[str], *, situation: Callable[[str], str] | None = None) -> int:
    """Where an unsuccessful episode that never fell below tau went wrong.

    The first step that led back to a situation already seen undid progress (a bump into a
    wall, or a step back to where the agent came from): that is the step to blame. Blaming
    the first repeated (situation, action) pair instead, as this did before, blamed the bump
    at the start of CliffWalking and never the step down that undid the climb. A move the
    situation keys as the goal's way is never blamed. Without a return, the last step off the
    goal's way (else the last step).
    """
    sit = [(situation or summarize_observation)(obs) for obs in observations]
    for t in range(len(actions) - 1):
        # a move the env keys as the goal's way is progress even when the next room reads
        # like one seen before (coin-2's corridor rooms are alike in kinds): blaming it gave
        # "when go north: the goal's way, do not go north"
        if sit[t + 1] in sit[: t + 1] and not _goal_way(actions[t], sit[t]):
            return t
    # the last step off the goal's way (a detour walked back is no return to a seen room)
    return next((t for t in range(len(actions) - 1, -1, -1) if not _goal_way(actions[t], sit[t])), len(actions) - 1)


def _goal_way(action: str, situation: str) -> bool:
    return _move(action) in goal_ways(situation)


def _move(action: str) -> str:
    """An action as :func:`~forge.envs.situation.goal_ways` keys it."""
    return " ".join(action.lower().split())
