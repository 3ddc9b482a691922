"""What reflection sees and writes: a :class:`Snapshot` of a failed attempt, and the artifacts
it answers with (:class:`RuleEdit` ops carrying typed rules, corrected :class:`Example`
demonstrations, gathered in a :class:`Reflection`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from forge.envs.base import Env
from forge.envs.situation import summarize_observation
from forge.errors import ValidationError
from forge.learn import rules as rulebook
from forge.model import Kind, Rule, Step, Unit

__all__ = ["REFLECTION_STYLES", "REPRESENTATIONS", "Example", "Reflection", "RuleEdit", "Snapshot"]

REPRESENTATIONS = ("rules", "examples", "mixed")
REFLECTION_STYLES = ("slots", "free")


@dataclass(frozen=True, slots=True)
class RuleEdit:
    """Edit ops on one role's rule list: delete by shown index, then append typed rules.

    ``add`` holds :class:`~forge.model.Rule` records; a text given instead (a hand-written
    edit) is read into one here, once, and refused if it is not a "when X, ..." rule."""

    role: str
    delete: tuple[int, ...] = ()
    add: tuple[Rule, ...] = ()

    def __post_init__(self) -> None:
        typed = []
        for item in self.add:
            rule = item if isinstance(item, Rule) else rulebook.to_rule(rulebook.parse(str(item)))
            if rule is None:
                raise ValidationError(f"not a 'when <situation>, ...' rule naming an action: {str(item)[:80]!r}")
            typed.append(rule)
        object.__setattr__(self, "add", tuple(typed))

    @property
    def texts(self) -> list[str]:
        """The added rules in words, as their units hold them."""
        return [r.text() for r in self.add]

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "delete": list(self.delete), "add": self.texts, "rules": [r.to_dict() for r in self.add]}


@dataclass(frozen=True, slots=True)
class Example:
    """A corrected demonstration: steps of thought / tool / observation / answer."""

    role: str
    name: str
    description: str
    steps: tuple[Mapping[str, str], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "name": self.name,
            "description": self.description,
            "steps": [dict(s) for s in self.steps],
        }

    def content(self) -> str:
        """The text stored and embedded for this example."""
        lines = [f"{self.name}: {self.description}"]
        lines += [f"{s.get('observation', '')} -> {s.get('answer', '')}" for s in self.steps]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the reflection agent sees about one failed attempt.

    ``steps`` holds every role's steps in order (``Step.role`` names the role; the acting
    role's steps carry the env reward); ``failing`` is the env step index (0-based) whose
    reward fell below ``tau``. ``safe_actions`` are actions checked by replaying the episode
    not to fail at that point (empty when unknown).
    """

    env: str
    description: str
    valid_actions: tuple[str, ...]
    roles: tuple[str, ...]
    acting_roles: tuple[str, ...]
    steps: tuple[Step, ...]
    failing: int
    failing_action: str
    failing_reward: float
    failing_observation: str
    tau: float
    shown: Mapping[str, tuple[Unit, ...]] = field(default_factory=dict)  # rules shown, per role
    safe_actions: tuple[str, ...] = ()
    won_actions: tuple[str, ...] = ()  # the safe actions that won the episode outright there
    known_names: tuple[str, ...] = ()
    reason: str = "abort"  # "abort": a reward fell below tau; "stall": ended unsuccessful
    episode_return: float = 0.0
    describe: Callable[[str], str] | None = field(default=None, compare=False, repr=False)  # EnvSpec.situation
    abstract: Callable[[str], str] | None = field(default=None, compare=False, repr=False)  # EnvSpec.abstract
    instance_terms: Callable[[str], Sequence[str]] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        trajectory: Any,
        *,
        env: Env,
        failing: int,
        roles: Sequence[str],
        acting_roles: Sequence[str],
        shown: Mapping[str, Sequence[Unit]],
        tau: float,
        stalled: bool,
        safe_actions: Sequence[str] = (),
        won_actions: Sequence[str] = (),
        known_names: Sequence[str] = (),
    ) -> Snapshot:
        """The snapshot of a played ``trajectory`` (steps, actions, rewards, observations)
        failing at step ``failing``."""
        return cls(
            env=env.spec.name,
            description=env.spec.description,
            valid_actions=tuple(env.valid_actions()),
            roles=tuple(roles),
            acting_roles=tuple(acting_roles),
            steps=tuple(trajectory.steps),
            failing=failing,
            failing_action=trajectory.actions[failing],
            failing_reward=trajectory.rewards[failing],
            failing_observation=trajectory.observations[failing],
            tau=tau,
            shown={role: tuple(u for u in units if u.kind is Kind.RULE) for role, units in shown.items()},
            safe_actions=tuple(safe_actions),
            won_actions=tuple(won_actions),
            known_names=tuple(known_names),
            reason="stall" if stalled else "abort",
            episode_return=trajectory.total,
            describe=env.spec.situation,
            abstract=env.spec.abstract,
            instance_terms=env.spec.instance_terms,
        )

    def rules(self, role: str) -> list[str]:
        """The rule texts shown to ``role``, in the order their indexes refer to."""
        return [u.content for u in self.shown.get(role, ())]

    def situation_of(self, observation: str) -> str:
        return self.describe(observation) if self.describe is not None else summarize_observation(observation)

    @property
    def situation(self) -> str:
        return self.situation_of(self.failing_observation)

    def typed(self, text: str) -> Rule | None:
        """A checked rule's text as a typed record, read against this attempt's actions and
        their kinds: where a model's words become data, once."""
        vocabulary = list(self.valid_actions)
        if self.abstract is not None:
            vocabulary = list(dict.fromkeys([*vocabulary, *(self.abstract(a) for a in vocabulary)]))
        return rulebook.to_rule(rulebook.parse(text, vocabulary))

    def check(self, rule: str) -> tuple[str | None, str]:
        """:func:`forge.learn.rules.check` against this attempt: ``(rule to keep or None, why)``."""
        return rulebook.check(
            rule,
            valid_actions=self.valid_actions,
            situations=self.situations,
            failing_situation=self.situation,
            failing_action=self.failing_action,
            safe_actions=self.safe_actions,
            won_actions=self.won_actions,
            abstract=self.abstract,
            instance_terms=self.instance_terms,
        )

    @property
    def situations(self) -> list[str]:
        """Every situation the agent met in this attempt (what a rule may name)."""
        return list(dict.fromkeys(self.situation_of(s.observation) for s in self.steps if s.observation))


@dataclass(frozen=True, slots=True)
class Reflection:
    """Artifacts from one reflection, and how they were obtained."""

    edits: tuple[RuleEdit, ...] = ()
    examples: tuple[Example, ...] = ()
    fallback: bool = False
    dropped: tuple[str, ...] = ()  # why model output was rejected, one line each
    error: str = ""
    repaired: tuple[str, ...] = ()  # rules rewritten because they advised what failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "edits": [e.to_dict() for e in self.edits],
            "examples": [e.to_dict() for e in self.examples],
            "fallback": self.fallback,
            "dropped": list(self.dropped),
            "repaired": list(self.repaired),
            "error": self.error,
        }
