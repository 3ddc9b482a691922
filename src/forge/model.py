"""The data FORGE remembers: memory units, their relations, and the episodes they came from.

Pure data and validation, no I/O. Everything else in FORGE imports from here and nothing
here imports from the rest. Values are validated when built, so a unit that exists is a
valid unit: bad input fails at the edge with a :class:`~forge.errors.ValidationError`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from forge.errors import ValidationError

__all__ = [
    "MAX_CONTENT_CHARS",
    "Context",
    "Episode",
    "Kind",
    "Provenance",
    "Relation",
    "RelationType",
    "Scope",
    "Status",
    "Step",
    "Unit",
    "Viewer",
    "new_id",
]

#: Longest unit content accepted. Memory is injected into prompts; a unit that does not fit
#: in a small model's context window is a document, not a memory.
MAX_CONTENT_CHARS = 16_000


def new_id() -> str:
    """A 20-hex-digit id that sorts by creation time (ms) and is unique across processes."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(4).hex()}"


class Kind(enum.StrEnum):
    """What a memory unit is; decides where recall packs it in a prompt."""

    EPISODE = "episode"  # what happened once
    FACT = "fact"  # a statement about the world
    RULE = "rule"  # "when X, then Y"
    EXAMPLE = "example"  # a demonstration to imitate
    LESSON = "lesson"  # a generalisation learned from outcomes
    PREFERENCE = "preference"  # how someone wants things done
    PROCEDURE = "procedure"  # steps that worked, with a track record
    PROFILE = "profile"  # who knows what (transactive memory)

    @classmethod
    def parse(cls, value: str | Kind) -> Kind:
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(k.value for k in cls)
            raise ValidationError(f"unknown kind {value!r}; expected one of: {known}") from None


class Status(enum.StrEnum):
    """Lifecycle state; only ACTIVE units are recalled by default."""

    ACTIVE = "active"
    QUARANTINED = "quarantined"  # received but judged unsafe; kept with a reason
    ARCHIVED = "archived"  # forgotten from recall, kept for history
    SUPERSEDED = "superseded"  # replaced by a newer unit (see the supersedes relation)

    @classmethod
    def parse(cls, value: str | Status) -> Status:
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(s.value for s in cls)
            raise ValidationError(f"unknown status {value!r}; expected one of: {known}") from None


class RelationType(enum.StrEnum):
    """Typed edges between units, used by graph expansion and reconciliation."""

    RELATED_TO = "related_to"
    CONTRADICTS = "contradicts"
    PREREQUISITE_OF = "prerequisite_of"
    SUPERSEDES = "supersedes"
    DERIVED_FROM = "derived_from"
    DUPLICATE_OF = "duplicate_of"
    SUPPORTS = "supports"

    @classmethod
    def parse(cls, value: str | RelationType) -> RelationType:
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(r.value for r in cls)
            raise ValidationError(
                f"unknown relation {value!r}; expected one of: {known}"
            ) from None


@dataclass(frozen=True, slots=True)
class Scope:
    """Who may see a unit: one agent (``private``), a named ``group``, or everyone (``global``).

    Written as a string: ``"private"``, ``"group:red-team"``, ``"global"``.
    """

    kind: str = "global"
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("private", "group", "global"):
            raise ValidationError(
                f"unknown scope {self.kind!r}; expected private, group:<name> or global"
            )
        if self.kind == "group" and not self.name:
            raise ValidationError("a group scope needs a name, e.g. 'group:red-team'")
        if self.kind != "group" and self.name:
            raise ValidationError(f"scope {self.kind!r} takes no name")

    @classmethod
    def parse(cls, value: str | Scope) -> Scope:
        if isinstance(value, Scope):
            return value
        kind, _, name = str(value).partition(":")
        return cls(kind.strip(), name.strip())

    def __str__(self) -> str:
        return f"group:{self.name}" if self.kind == "group" else self.kind


PRIVATE = Scope("private")
GLOBAL = Scope("global")


@dataclass(frozen=True, slots=True)
class Viewer:
    """On whose behalf a store is read. Scope is enforced against it inside every query.

    An agent sees global units, its own private units, and units of its groups. The
    operator (CLI, admin tools) sees everything; agents never get it by accident because
    library calls take the viewer explicitly.
    """

    agent: str | None = None
    groups: frozenset[str] = frozenset()
    operator: bool = False

    @classmethod
    def of(cls, agent: str, groups: Iterable[str] = ()) -> Viewer:
        if not agent:
            raise ValidationError("an agent viewer needs an agent id")
        return cls(agent=agent, groups=frozenset(groups))

    @classmethod
    def admin(cls) -> Viewer:
        return cls(operator=True)

    def can_see(self, unit: Unit) -> bool:
        if self.operator or unit.scope.kind == "global":
            return True
        if unit.scope.kind == "private":
            return unit.owner == self.agent
        return unit.scope.name in self.groups


@dataclass(frozen=True, slots=True)
class Context:
    """Where a unit applies: recall filters and conflict detection use it."""

    domain: str = ""
    task: str = ""
    role: str = ""
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        tags = self.tags
        if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
            raise ValidationError("context tags must be a list of strings")
        cleaned = tuple(dict.fromkeys(t.strip() for t in tags if t.strip()))
        object.__setattr__(self, "tags", cleaned)

    def to_dict(self) -> dict[str, Any]:
        return {"domain": self.domain, "task": self.task, "role": self.role, "tags": list(self.tags)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Context:
        data = data or {}
        _only(data, {"domain", "task", "role", "tags"}, "context")
        return cls(
            domain=_str(data.get("domain", ""), "context.domain"),
            task=_str(data.get("task", ""), "context.task"),
            role=_str(data.get("role", ""), "context.role"),
            tags=tuple(_strs(data.get("tags") or (), "context.tags")),
        )


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a unit came from, so every memory can be traced back to experience."""

    source: str = ""  # e.g. "user", "reflection", "broadcast:agent-3", "import"
    episodes: tuple[str, ...] = ()  # episode / trajectory ids it was learned from
    derived_from: tuple[str, ...] = ()  # unit ids it was derived from

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "episodes": list(self.episodes),
            "derived_from": list(self.derived_from),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Provenance:
        data = data or {}
        _only(data, {"source", "episodes", "derived_from"}, "provenance")
        return cls(
            source=_str(data.get("source", ""), "provenance.source"),
            episodes=tuple(_strs(data.get("episodes") or (), "provenance.episodes")),
            derived_from=tuple(_strs(data.get("derived_from") or (), "provenance.derived_from")),
        )


@dataclass(frozen=True, slots=True)
class Unit:
    """One memory: typed, scoped, scored and traceable.

    Scores are in [0, 1]: ``confidence`` is how sure the author was, ``validation`` how well
    the unit has held up (corroboration, outcomes), ``importance`` how much it matters.
    ``meta`` holds kind-specific fields (an example's name, a procedure's success counts).
    """

    content: str
    kind: Kind = Kind.FACT
    id: str = field(default_factory=new_id)
    context: Context = Context()
    scope: Scope = GLOBAL
    owner: str = ""
    confidence: float = 0.5
    validation: float = 0.5
    importance: float = 0.5
    access_count: int = 0
    last_access: float | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float | None = None
    provenance: Provenance = Provenance()
    status: Status = Status.ACTIVE
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Kind.parse(self.kind))
        object.__setattr__(self, "status", Status.parse(self.status))
        object.__setattr__(self, "scope", Scope.parse(self.scope))
        if not isinstance(self.content, str) or not self.content.strip():
            raise ValidationError("unit content is empty")
        if len(self.content) > MAX_CONTENT_CHARS:
            raise ValidationError(
                f"unit content is {len(self.content)} characters; the limit is {MAX_CONTENT_CHARS}"
            )
        if not isinstance(self.id, str) or not self.id or len(self.id) > 128:
            raise ValidationError("unit id must be a non-empty string of at most 128 characters")
        if self.scope.kind == "private" and not self.owner:
            raise ValidationError("a private unit needs an owner agent")
        for name in ("confidence", "validation", "importance"):
            _score(getattr(self, name), name)
        if not isinstance(self.access_count, int) or self.access_count < 0:
            raise ValidationError("access_count must be a non-negative integer")
        if self.updated_at is None:
            object.__setattr__(self, "updated_at", self.created_at)
        if not isinstance(self.meta, Mapping):
            raise ValidationError("unit meta must be a JSON object")

    def replace(self, **changes: Any) -> Unit:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    @property
    def text(self) -> str:
        """The text that is embedded and keyword-indexed: content plus its context words."""
        extra = " ".join(x for x in (self.context.domain, self.context.task, self.context.role) if x)
        tags = " ".join(self.context.tags)
        return " ".join(x for x in (self.content, extra, tags) if x)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "content": self.content,
            "context": self.context.to_dict(),
            "scope": str(self.scope),
            "owner": self.owner,
            "confidence": self.confidence,
            "validation": self.validation,
            "importance": self.importance,
            "access_count": self.access_count,
            "last_access": self.last_access,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "provenance": self.provenance.to_dict(),
            "status": self.status.value,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Unit:
        if not isinstance(data, Mapping):
            raise ValidationError("a unit must be a JSON object")
        _only(data, set(_UNIT_FIELDS), "unit")
        if "content" not in data:
            raise ValidationError("unit has no content")
        kwargs: dict[str, Any] = {k: data[k] for k in _UNIT_FIELDS if k in data and data[k] is not None}
        if "context" in kwargs:
            kwargs["context"] = Context.from_dict(kwargs["context"])
        if "provenance" in kwargs:
            kwargs["provenance"] = Provenance.from_dict(kwargs["provenance"])
        for name in ("created_at", "updated_at", "last_access"):
            if name in kwargs:
                kwargs[name] = _float(kwargs[name], name)
        if "last_access" in data and data["last_access"] is None:
            kwargs["last_access"] = None
        return cls(**kwargs)


_UNIT_FIELDS = tuple(f.name for f in dataclasses.fields(Unit))


@dataclass(frozen=True, slots=True)
class Relation:
    """A typed, weighted edge ``src -[type]-> dst`` between two units."""

    src: str
    dst: str
    type: RelationType = RelationType.RELATED_TO
    weight: float = 1.0
    created_at: float = field(default_factory=time.time)
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", RelationType.parse(self.type))
        if not self.src or not self.dst:
            raise ValidationError("a relation needs both a source and a target unit id")
        if self.src == self.dst:
            raise ValidationError("a unit cannot be related to itself")
        _float(self.weight, "weight")

    def to_dict(self) -> dict[str, Any]:
        return {
            "src": self.src,
            "dst": self.dst,
            "type": self.type.value,
            "weight": self.weight,
            "created_at": self.created_at,
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Relation:
        if not isinstance(data, Mapping):
            raise ValidationError("a relation must be a JSON object")
        _only(data, {"src", "dst", "type", "weight", "created_at", "note"}, "relation")
        try:
            return cls(**dict(data))
        except TypeError as exc:
            raise ValidationError(f"relation: {exc}") from None


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a trajectory. ``role`` names the sub-agent that took it (planner, analyst)."""

    observation: str = ""
    thought: str = ""
    action: str = ""
    reward: float = 0.0
    role: str = ""
    info: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "observation": self.observation,
            "thought": self.thought,
            "action": self.action,
            "reward": self.reward,
            "role": self.role,
            "info": dict(self.info),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Step:
        if not isinstance(data, Mapping):
            raise ValidationError("a step must be a JSON object")
        _only(data, {"observation", "thought", "action", "reward", "role", "info"}, "step")
        return cls(**{**dict(data), "reward": _float(data.get("reward", 0.0), "reward")})


@dataclass(frozen=True, slots=True)
class Episode:
    """A trajectory and its outcome: the raw experience memories are learned from."""

    agent: str = ""
    task: str = ""
    env: str = ""
    steps: tuple[Step, ...] = ()
    outcome: Mapping[str, Any] = field(default_factory=dict)  # success, return, errors...
    id: str = field(default_factory=new_id)
    created_at: float = field(default_factory=time.time)
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        if not all(isinstance(s, Step) for s in self.steps):
            raise ValidationError("episode steps must be Step records")

    @property
    def total_reward(self) -> float:
        return float(sum(s.reward for s in self.steps))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "agent": self.agent,
            "task": self.task,
            "env": self.env,
            "steps": [s.to_dict() for s in self.steps],
            "outcome": dict(self.outcome),
            "created_at": self.created_at,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Episode:
        if not isinstance(data, Mapping):
            raise ValidationError("an episode must be a JSON object")
        _only(data, {"id", "agent", "task", "env", "steps", "outcome", "created_at", "meta"}, "episode")
        kwargs = dict(data)
        kwargs["steps"] = tuple(Step.from_dict(s) for s in kwargs.get("steps") or ())
        return cls(**kwargs)


# -- small validators ----------------------------------------------------------------------


def _only(data: Mapping[str, Any], allowed: set[str], what: str) -> None:
    unknown = set(data) - allowed
    if unknown:
        raise ValidationError(f"unknown {what} field(s): {', '.join(sorted(unknown))}")


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{name} must be a string")
    return value


def _strs(values: Any, name: str) -> list[str]:
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise ValidationError(f"{name} must be a list of strings")
    return list(values)


def _float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValidationError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _score(value: Any, name: str) -> None:
    v = _float(value, name)
    if not 0.0 <= v <= 1.0:
        raise ValidationError(f"{name} must be between 0 and 1, got {v}")
