"""The data FORGE remembers: memory units, their relations, and the episodes they came from.

Pure data and validation, no I/O. Everything else in FORGE imports from here and nothing
here imports from the rest. Values are validated when built, so a unit that exists is a
valid unit: bad input fails at the edge with a :class:`~forge.errors.ValidationError`.

Types are checked, not coerced (an ``owner`` of ``7`` or a ``created_at`` of
``"yesterday"`` is refused), every text must be encodable as UTF-8 (no lone surrogates),
and sizes are bounded, so one record cannot fill a store or a prompt:

==========================  ===========================================================
content                     :data:`MAX_CONTENT_CHARS` characters (16,000)
ids (unit, episode)         :data:`MAX_ID_CHARS` characters (128)
owner, source, context      :data:`MAX_FIELD_CHARS` characters each (256): domain, task,
fields, each tag            role, every tag, provenance source, agent and env names
tags                        :data:`MAX_TAGS` per unit (64)
meta (and episode outcome,  :data:`MAX_META_BYTES` bytes of UTF-8 JSON (64 KiB); it must
step info)                  be JSON: string keys, JSON values
provenance references       :data:`MAX_REFS` episode and unit ids (1,000)
relation note               :data:`MAX_NOTE_CHARS` characters (2,000)
episode steps               :data:`MAX_STEPS` steps (100,000) of at most
                            :data:`MAX_STEP_CHARS` characters per text field
==========================  ===========================================================
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import numbers
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from forge.errors import ValidationError

__all__ = [
    "origin_of",
    "MAX_CONTENT_CHARS",
    "MAX_FIELD_CHARS",
    "MAX_ID_CHARS",
    "MAX_META_BYTES",
    "MAX_NOTE_CHARS",
    "MAX_REFS",
    "MAX_STEPS",
    "MAX_STEP_CHARS",
    "MAX_TAGS",
    "Context",
    "Episode",
    "Kind",
    "Counts",
    "Provenance",
    "Rule",
    "Relation",
    "RelationType",
    "Scope",
    "Status",
    "Step",
    "Unit",
    "Viewer",
    "derived_id",
    "new_id",
]

#: Longest unit content accepted. Memory is injected into prompts; a unit that does not fit
#: in a small model's context window is a document, not a memory.
MAX_CONTENT_CHARS = 16_000
#: Longest id (unit, episode, relation end).
MAX_ID_CHARS = 128
#: Longest short field: owner, context domain/task/role, each tag, provenance source.
MAX_FIELD_CHARS = 256
#: Most context tags on one unit.
MAX_TAGS = 64
#: Largest ``meta`` (and episode ``outcome``/``meta``, step ``info``), as UTF-8 JSON bytes.
MAX_META_BYTES = 64 * 1024
#: Most episode / unit ids in one provenance list.
MAX_REFS = 1_000
#: Longest relation note.
MAX_NOTE_CHARS = 2_000
#: Most steps in one episode, and the longest text of one step field.
MAX_STEPS = 100_000
MAX_STEP_CHARS = 100_000


def new_id() -> str:
    """A 20-hex-digit id that sorts by creation time (ms) and is unique across processes."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(4).hex()}"


def derived_id(prefix: str, *parts: object, algorithm: str = "sha1", digits: int = 20, sep: str = ":") -> str:
    """An id computed from what a record is, so writing it again finds the one already there
    (a replayed team task, a rerun consolidation, a re-imported seed, a LangGraph key).

    ``prefix + sep`` and the first ``digits`` hex digits of ``algorithm`` over ``parts``
    joined by ``|`` (each part as ``str``; text UTF-8 cannot hold is replaced, so any text
    gets an id). These ids are persisted: a caller that changed its parts or its digest would
    orphan the units stored under the old ones.
    """
    text = "|".join(map(str, parts)).encode("utf-8", errors="replace")
    return f"{prefix}{sep}{hashlib.new(algorithm, text).hexdigest()[:digits]}"


# -- small validators ----------------------------------------------------------------------


def _only(data: Mapping[str, Any], allowed: set[str], what: str) -> None:
    unknown = set(data) - allowed
    if unknown:
        raise ValidationError(f"unknown {what} field(s): {', '.join(sorted(unknown))}")


def _kind_of(value: Any) -> str:
    """How to name a wrong value in a message without echoing a large or hostile one."""
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    if value is None:
        return "null"
    return type(value).__name__


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValidationError(f"{name} must be a JSON object, got {_kind_of(value)}")
    return value


_Built = TypeVar("_Built")


def _build(cls: type[_Built], kwargs: Mapping[str, Any], what: str) -> _Built:
    """``cls(**kwargs)`` with any type slip the validators did not name reported as ours."""
    try:
        return cls(**kwargs)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise ValidationError(f"{what}: {type(exc).__name__}: {str(exc)[:200]}") from None


def _text(value: Any, name: str, limit: int) -> str:
    """A string of at most ``limit`` characters that is valid Unicode (UTF-8 encodable)."""
    if not isinstance(value, str):
        raise ValidationError(f"{name} must be a string, got {_kind_of(value)}")
    if len(value) > limit:
        raise ValidationError(f"{name} is {len(value)} characters; the limit is {limit}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError(f"{name} is not valid Unicode text (it contains a lone surrogate)") from None
    return value


def _json_object(value: Any, name: str) -> None:
    """A JSON object (string keys, JSON values) of at most MAX_META_BYTES as UTF-8."""
    if type(value) is not dict and not isinstance(value, Mapping):
        raise ValidationError(f"{name} must be a JSON object, got {_kind_of(value)}")
    if not value:
        return
    try:
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValidationError(f"{name} is not JSON: {type(exc).__name__}: {str(exc)[:120]}") from None
    except UnicodeEncodeError:
        raise ValidationError(f"{name} contains text that is not valid Unicode (a lone surrogate)") from None
    if size > MAX_META_BYTES:
        raise ValidationError(f"{name} is {size} bytes as JSON; the limit is {MAX_META_BYTES}")


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{name} must be a string, got {_kind_of(value)}")
    return value


def _strs(values: Any, name: str) -> list[str]:
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise ValidationError(f"{name} must be a list of strings, got {_kind_of(values)}")
    strs: list[str] = list(values)
    if not all(isinstance(v, str) for v in strs):
        raise ValidationError(f"{name} must be a list of strings")
    return strs


def _float(value: Any, name: str) -> float:
    if type(value) is float:  # the common case, without the ABC check
        if math.isfinite(value):
            return value
        raise ValidationError(f"{name} must be a finite number, got {value}")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValidationError(f"{name} must be a finite number, got {_kind_of(value)}")
    try:
        v = float(value)
    except (OverflowError, ValueError):
        raise ValidationError(f"{name} must be a finite number") from None
    if not math.isfinite(v):
        raise ValidationError(f"{name} must be a finite number, got {v}")
    return v


def _score(value: Any, name: str) -> float:
    v = _float(value, name)
    if not 0.0 <= v <= 1.0:
        raise ValidationError(f"{name} must be between 0 and 1, got {v}")
    return v


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
        if not isinstance(self.kind, str) or not isinstance(self.name, str):
            raise ValidationError("a scope is written as a string: private, group:<name> or global")
        if self.kind not in ("private", "group", "global"):
            raise ValidationError(
                f"unknown scope {self.kind!r}; expected private, group:<name> or global"
            )
        if self.kind == "group" and not self.name:
            raise ValidationError("a group scope needs a name, e.g. 'group:red-team'")
        if self.kind != "group" and self.name:
            raise ValidationError(f"scope {self.kind!r} takes no name")
        _text(self.name, "scope group name", MAX_FIELD_CHARS)

    @classmethod
    def parse(cls, value: str | Scope) -> Scope:
        if isinstance(value, Scope):
            return value
        if not isinstance(value, str):
            raise ValidationError(f"scope must be a string (private, group:<name> or global), got {_kind_of(value)}")
        kind, _, name = value.partition(":")
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


T = TypeVar("T")


def _restore(cls: type[T], fields: Mapping[str, Any]) -> T:
    """An instance of the frozen, slotted dataclass ``cls`` with every field given, unchecked."""
    obj = object.__new__(cls)
    for name in cls.__slots__:  # type: ignore[attr-defined]
        object.__setattr__(obj, name, fields[name])
    return obj


@dataclass(frozen=True, slots=True)
class Context:
    """Where a unit applies: recall filters and conflict detection use it."""

    domain: str = ""
    task: str = ""
    role: str = ""
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("domain", "task", "role"):
            _text(getattr(self, name), f"context.{name}", MAX_FIELD_CHARS)
        tags = self.tags
        if type(tags) is not tuple:
            if isinstance(tags, str | bytes | Mapping) or not isinstance(tags, Iterable):
                raise ValidationError("context tags must be a list of strings")
            tags = tuple(tags)
        if not all(isinstance(t, str) for t in tags):
            raise ValidationError("context tags must be a list of strings")
        cleaned = tuple(dict.fromkeys(t.strip() for t in tags if t.strip()))
        if len(cleaned) > MAX_TAGS:
            raise ValidationError(f"a unit has {len(cleaned)} tags; the limit is {MAX_TAGS}")
        for t in cleaned:
            _text(t, "context tag", MAX_FIELD_CHARS)
        object.__setattr__(self, "tags", cleaned)

    def to_dict(self) -> dict[str, Any]:
        return {"domain": self.domain, "task": self.task, "role": self.role, "tags": list(self.tags)}

    @classmethod
    def restore(cls, **fields: Any) -> Context:
        """Rebuilt from stored, already validated fields (see :meth:`Unit.restore`)."""
        return _restore(cls, fields)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Context:
        data = _mapping(data or {}, "context")
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

    def __post_init__(self) -> None:
        _text(self.source, "provenance.source", MAX_FIELD_CHARS)
        for name in ("episodes", "derived_from"):
            ids = getattr(self, name)
            if type(ids) in (tuple, list) and not ids:
                object.__setattr__(self, name, ())
                continue
            ids = tuple(_strs(ids, f"provenance.{name}"))
            if len(ids) > MAX_REFS:
                raise ValidationError(f"provenance.{name} has {len(ids)} ids; the limit is {MAX_REFS}")
            for i in ids:
                _text(i, f"provenance.{name} id", MAX_ID_CHARS)
            object.__setattr__(self, name, ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "episodes": list(self.episodes),
            "derived_from": list(self.derived_from),
        }

    @classmethod
    def restore(cls, **fields: Any) -> Provenance:
        """Rebuilt from stored, already validated fields (see :meth:`Unit.restore`)."""
        return _restore(cls, fields)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Provenance:
        data = _mapping(data or {}, "provenance")
        _only(data, {"source", "episodes", "derived_from"}, "provenance")
        return cls(
            source=_str(data.get("source", ""), "provenance.source"),
            episodes=tuple(_strs(data.get("episodes") or (), "provenance.episodes")),
            derived_from=tuple(_strs(data.get("derived_from") or (), "provenance.derived_from")),
        )


@dataclass(frozen=True, slots=True)
class Rule:
    """A rule as data: the situation it applies in, what to avoid there, what to prefer.

    Every rule FORGE writes carries this record (``Unit.meta["rule"]``, read with
    :attr:`Unit.rule`), so recall, the prompt, the rule guard, contradiction checks, the
    service and the dashboard read its parts instead of parsing its prose; the prose
    (:meth:`text`) is rendered from it once, when the unit is written.

    ``when`` names what an agent can recognise in a new task (``"down: hole"``, ``"tool
    refund_api returned rate_limited"``); ``avoid`` and ``prefer`` are actions (or kinds of
    action) as the agent names them; ``why`` is an optional reason in one line.
    """

    when: str
    avoid: tuple[str, ...] = ()
    prefer: tuple[str, ...] = ()
    why: str = ""

    #: How many preferred actions the rendered text names, best first.
    MAX_PREFER: ClassVar[int] = 3

    def __post_init__(self) -> None:
        when = " ".join(_str(self.when, "rule.when").split()).rstrip(" .")
        if not when:
            raise ValidationError("a rule needs a 'when': the situation it applies in")
        _text(when, "rule.when", MAX_FIELD_CHARS * 4)
        object.__setattr__(self, "when", when)
        for name in ("avoid", "prefer"):
            raw = getattr(self, name)
            if isinstance(raw, str):
                raw = (raw,)
            items = tuple(dict.fromkeys(" ".join(a.split()) for a in _strs(raw, f"rule.{name}") if a.strip()))
            if len(items) > MAX_TAGS:
                raise ValidationError(f"rule.{name} names {len(items)} actions; the limit is {MAX_TAGS}")
            for a in items:
                _text(a, f"rule.{name} action", MAX_FIELD_CHARS)
            object.__setattr__(self, name, items)
        if not self.avoid and not self.prefer:
            raise ValidationError("a rule must say what to avoid or what to prefer")
        why = " ".join(_str(self.why, "rule.why").split())
        _text(why, "rule.why", MAX_NOTE_CHARS)
        object.__setattr__(self, "why", why)

    def text(self) -> str:
        """The rule in words: "when W, do not A; P was safe there", or "when W, P" for one
        that only advises. Written into a unit's content once, when the unit is made."""
        when = self.when[:1].lower() + self.when[1:]
        prefer = list(self.prefer)[: self.MAX_PREFER]
        if not self.avoid:
            out = f"when {when}, {', '.join(prefer)}"
        else:
            out = f"when {when}, " + "; ".join(f"do not {a}" for a in self.avoid)
            if prefer:
                out += f"; {', '.join(prefer)} {'was' if len(prefer) == 1 else 'were'} safe there"
        return out + (f" ({self.why})" if self.why else "")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"when": self.when, "avoid": list(self.avoid), "prefer": list(self.prefer)}
        if self.why:
            out["why"] = self.why
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rule:
        data = _mapping(data, "rule")
        _only(data, {"when", "avoid", "prefer", "why"}, "rule")
        return cls(
            when=data.get("when", ""),
            avoid=tuple(_strs(data.get("avoid") or (), "rule.avoid")),
            prefer=tuple(_strs(data.get("prefer") or (), "rule.prefer")),
            why=data.get("why", ""),
        )


@dataclass(frozen=True, slots=True)
class Counts:
    """The evidence for a unit, and the one credit model that turns it into ``validation``.

    ``uses``, ``successes`` and ``failures`` count the decisions it was in front of an agent
    for; ``support`` is corroboration (each independent witness adds its weight, about one
    for an average reputation); ``prior`` is the validation it had before any evidence.
    :attr:`rate` is the Beta estimate ``(2 prior + s + support) / (2 + s + f + support)``:
    outcomes and corroboration move one number, each further piece of evidence by less.
    Kept in ``Unit.meta`` (``uses``, ``successes``, ``failures``, ``support``, ``prior``) and
    read with :attr:`Unit.counts`; :meth:`forge.engine.memory.Memory.record_use` and
    corroboration (:mod:`forge.share.consensus`) are its only writers.
    """

    uses: int = 0
    successes: int = 0
    failures: int = 0
    support: float = 0.0
    prior: float = 0.5

    @property
    def rate(self) -> float:
        """The unit's validation under this evidence."""
        s, f = self.successes + self.support, self.failures
        return (2.0 * self.prior + s) / (2.0 + s + f)

    def added(self, success: bool | None) -> Counts:
        """These counts after one more use whose outcome is ``success`` (None: not known)."""
        return dataclasses.replace(
            self, uses=self.uses + 1, successes=self.successes + (success is True), failures=self.failures + (success is False)
        )

    def supported(self, weight: float) -> Counts:
        """These counts with one more independent witness of ``weight``."""
        return dataclasses.replace(self, support=self.support + max(0.0, float(weight)))

    def to_meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {"uses": self.uses, "successes": self.successes, "failures": self.failures, "prior": self.prior}
        if self.support:
            out["support"] = self.support
        return out

    @classmethod
    def of(cls, meta: Mapping[str, Any], *, prior: float = 0.5) -> Counts:
        """The counts kept in ``meta``; ``prior`` (the unit's validation) for a unit with no
        evidence counted yet."""

        def n(key: str) -> int:
            v = meta.get(key, 0)
            return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 else 0

        kept = meta.get("prior")
        if not (isinstance(kept, int | float) and not isinstance(kept, bool) and 0 <= kept <= 1):
            # a unit that already counts outcomes (written before the prior was kept) had
            # them in its validation: the neutral prior, not that validation again
            kept = 0.5 if any(n(k) for k in ("uses", "successes", "failures")) else prior
        p = float(kept)
        sup = meta.get("support", 0.0)
        support = float(sup) if isinstance(sup, int | float) and not isinstance(sup, bool) and sup >= 0 else 0.0
        return cls(n("uses"), n("successes"), n("failures"), support, min(1.0, max(0.0, p)))


#: The ``Unit.meta`` key that holds a rule's typed record (:class:`Rule`).
RULE_META = "rule"


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
        if not isinstance(self.content, str):
            raise ValidationError(f"unit content must be a string, got {_kind_of(self.content)}")
        if not self.content.strip():
            raise ValidationError("unit content is empty")
        if len(self.content) > MAX_CONTENT_CHARS:
            raise ValidationError(
                f"unit content is {len(self.content)} characters; the limit is {MAX_CONTENT_CHARS}"
            )
        _text(self.content, "unit content", MAX_CONTENT_CHARS)
        if not isinstance(self.id, str) or not self.id or len(self.id) > MAX_ID_CHARS:
            raise ValidationError(f"unit id must be a non-empty string of at most {MAX_ID_CHARS} characters")
        _text(self.id, "unit id", MAX_ID_CHARS)
        _text(self.owner, "unit owner", MAX_FIELD_CHARS)
        if self.scope.kind == "private" and not self.owner:
            raise ValidationError("a private unit needs an owner agent")
        if not isinstance(self.context, Context):
            raise ValidationError(f"unit context must be a Context, got {_kind_of(self.context)}")
        if not isinstance(self.provenance, Provenance):
            raise ValidationError(f"unit provenance must be a Provenance, got {_kind_of(self.provenance)}")
        for name in ("confidence", "validation", "importance"):
            object.__setattr__(self, name, _score(getattr(self, name), name))
        if isinstance(self.access_count, bool) or not isinstance(self.access_count, int) or self.access_count < 0:
            raise ValidationError("access_count must be a non-negative integer")
        object.__setattr__(self, "created_at", _float(self.created_at, "created_at"))
        if self.updated_at is None:
            object.__setattr__(self, "updated_at", self.created_at)
        else:
            object.__setattr__(self, "updated_at", _float(self.updated_at, "updated_at"))
        if self.last_access is not None:
            object.__setattr__(self, "last_access", _float(self.last_access, "last_access"))
        _json_object(self.meta, "unit meta")
        if RULE_META in self.meta:
            Rule.from_dict(self.meta[RULE_META])  # a malformed record fails here, not in a reader

    @property
    def rule(self) -> Rule | None:
        """This unit's typed rule record, or None for a unit that carries none."""
        data = self.meta.get(RULE_META)
        return Rule.from_dict(data) if isinstance(data, Mapping) else None

    @property
    def counts(self) -> Counts:
        """The evidence for this unit (see :class:`Counts`); its validation is the prior where
        nothing was counted yet."""
        return Counts.of(self.meta, prior=self.validation)

    def replace(self, **changes: Any) -> Unit:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def restore(cls, **fields: Any) -> Unit:
        """A unit rebuilt from every one of its fields as a store holds them, which were
        validated when it was written: no checks again (reads are on every recall's path,
        and validation was a third of turning a row into a unit). Anything else: ``Unit(...)``."""
        return _restore(cls, fields)

    @property
    def text(self) -> str:
        """Content plus its context words (domain, task, role, tags). What is embedded and
        keyword-indexed is :func:`forge.store.base.indexed_text`: this plus the unit's search
        context (``meta["search_context"]``), when it has one."""
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
        return _build(cls, kwargs, "unit")


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
        if not isinstance(self.type, str | RelationType):
            raise ValidationError(f"relation type must be a string, got {_kind_of(self.type)}")
        object.__setattr__(self, "type", RelationType.parse(self.type))
        if not isinstance(self.src, str) or not isinstance(self.dst, str) or not self.src or not self.dst:
            raise ValidationError("a relation needs both a source and a target unit id (strings)")
        _text(self.src, "relation source id", MAX_ID_CHARS)
        _text(self.dst, "relation target id", MAX_ID_CHARS)
        if self.src == self.dst:
            raise ValidationError("a unit cannot be related to itself")
        object.__setattr__(self, "weight", _float(self.weight, "weight"))
        object.__setattr__(self, "created_at", _float(self.created_at, "relation created_at"))
        _text(self.note, "relation note", MAX_NOTE_CHARS)

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
        return _build(cls, {k: v for k, v in data.items() if v is not None or k in ("src", "dst")}, "relation")


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a trajectory. ``role`` names the sub-agent that took it (planner, analyst)."""

    observation: str = ""
    thought: str = ""
    action: str = ""
    reward: float = 0.0
    role: str = ""
    info: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("observation", "thought", "action"):
            _text(getattr(self, name), f"step {name}", MAX_STEP_CHARS)
        _text(self.role, "step role", MAX_FIELD_CHARS)
        object.__setattr__(self, "reward", _float(self.reward, "step reward"))
        _json_object(self.info, "step info")

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
        return _build(cls, {k: v for k, v in data.items() if v is not None}, "step")


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
        if not isinstance(self.id, str) or not self.id:
            raise ValidationError(f"episode id must be a non-empty string, got {_kind_of(self.id)}")
        _text(self.id, "episode id", MAX_ID_CHARS)
        _text(self.agent, "episode agent", MAX_FIELD_CHARS)
        _text(self.task, "episode task", MAX_CONTENT_CHARS)
        _text(self.env, "episode env", MAX_FIELD_CHARS)
        if isinstance(self.steps, str | bytes | Mapping) or not isinstance(self.steps, Iterable):
            raise ValidationError(f"episode steps must be a list of steps, got {_kind_of(self.steps)}")
        object.__setattr__(self, "steps", tuple(self.steps))
        if len(self.steps) > MAX_STEPS:
            raise ValidationError(f"an episode has {len(self.steps)} steps; the limit is {MAX_STEPS}")
        if not all(isinstance(s, Step) for s in self.steps):
            raise ValidationError("episode steps must be Step records")
        _json_object(self.outcome, "episode outcome")
        _json_object(self.meta, "episode meta")
        object.__setattr__(self, "created_at", _float(self.created_at, "episode created_at"))

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
        steps = kwargs.get("steps") or ()
        if not isinstance(steps, list | tuple):
            raise ValidationError(f"episode steps must be a list of steps, got {_kind_of(steps)}")
        kwargs["steps"] = tuple(Step.from_dict(s) for s in steps)
        return _build(cls, kwargs, "episode")


def origin_of(unit: Unit, *, default: str = "") -> str:
    """Who first wrote a unit: ``meta["origin"]`` for received units, else its owner."""
    origin = unit.meta.get("origin") if isinstance(unit.meta, Mapping) else None
    return str(origin) if origin else (unit.owner or default)
