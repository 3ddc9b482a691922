"""What a rule's "when" clause names: an observation reduced to its situation.

Here, beside the env port, because envs, reflection, policies and the scripted test LLM all
read it, and none of them should import the others to do so.
"""

from __future__ import annotations

import re

from forge.envs.base import EnvSpec

__all__ = ["GOAL_OBJECT", "GOAL_WAY", "goal_ways", "situation_of", "summarize_observation"]

#: What a situation's clause keyed by a move says when the env knows the move is the one its
#: goal asks for next ("go west: the goal's way"). Reflection reads it as the env's own word
#: that the move makes progress: never blamed for a stall, never forbidden by a rule.
GOAL_WAY = "the goal's way"
#: The same for the action that takes the thing the goal names, where it lies in reach
#: ("take a key: the goal's object").
GOAL_OBJECT = "the goal's object"

_STEP_HEAD = re.compile(r"^\s*(?:Step|Move|Turn) \d+ of \d+\.(?: The (?:episode|game) is over\.)?\s*", re.IGNORECASE)
_PARENS = re.compile(r"\s*\([^()]*\)")


def summarize_observation(observation: str, *, limit: int = 140) -> str:
    """The situation in one short sentence: what a rule's "when" clause can name.

    Drops a leading "Step N of M." (or "Move"/"Turn") and parenthesised asides, keeps the
    first sentence.
    Generic on purpose: every env adapter opens its text with where the agent stands.
    """
    text = _STEP_HEAD.sub("", observation.strip())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    first = _PARENS.sub("", lines[0])
    sentence = re.split(r"(?<=[.!?])\s", first, maxsplit=1)[0].rstrip(".!? ")
    return sentence[:limit].rstrip()


def situation_of(observation: str, spec: EnvSpec | None = None) -> str:
    """The situation a rule's "when" clause names: the env's own one-line state when it has
    one (``EnvSpec.situation``, e.g. CAGE-2's host states), else :func:`summarize_observation`."""
    if spec is not None and spec.situation is not None:
        return spec.situation(observation)
    return summarize_observation(observation)


def goal_ways(situation: str) -> set[str]:
    """The actions ``situation`` keys as the goal's own next step, its :data:`GOAL_WAY` or its
    :data:`GOAL_OBJECT` ("go west: the goal's way; take a coin: the goal's object" ->
    {"go west", "take a coin"})."""
    out = set()
    for clause in str(situation).split(";"):
        key, sep, said = clause.partition(":")
        if sep and said.strip().lower().startswith((GOAL_WAY, GOAL_OBJECT)):
            out.add(" ".join(key.lower().split()))
    return out
