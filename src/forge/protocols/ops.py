"""The store ops a run records: what a worker learned and what a broadcast replaces, typed.

A worker's result and a stage checkpoint carry these ops; the parent, the run store's only
writer, applies them (:meth:`forge.protocols.runs.RunStore.apply`). Every op is idempotent
(unit ids come from the files, use counts are absolute), so a file replays after a crash.

On disk an op is a dict with an ``"op"`` key, as run files have always held; :func:`parse`
reads one (an unknown op or a malformed field is a :class:`~forge.errors.ValidationError`,
never skipped), :func:`to_dict` writes one. An :class:`Add` may carry the vector its unit is
stored with (base64 float32, as an export holds it), so the parent stores what the worker
embedded instead of embedding it again; a file without one (written before) still replays,
its unit embedded on apply.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forge.errors import ValidationError
from forge.model import Unit

__all__ = ["Add", "Archive", "Op", "Relate", "SetCounts", "Supersede", "parse", "parse_all", "to_dict"]


@dataclass(frozen=True, slots=True, eq=False)
class Add:
    """Store ``unit`` (unless its id is already there), with ``vector`` if the sender has it."""

    unit: Unit
    vector: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": "add", "unit": self.unit.to_dict()}
        if self.vector is not None:
            d["vector"] = base64.b64encode(np.asarray(self.vector, dtype=np.float32).tobytes()).decode()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Add:
        unit = Unit.from_dict(_field(d, "unit", Mapping))
        raw = d.get("vector")
        if raw is None:
            return cls(unit)
        try:
            vector = np.frombuffer(base64.b64decode(_str(raw, "vector"), validate=True), dtype=np.float32)
        except (binascii.Error, ValueError):
            raise ValidationError(f"add op for {unit.id}: its vector is not base64 float32") from None
        return cls(unit, vector)


@dataclass(frozen=True, slots=True)
class Archive:
    """Mark a unit ARCHIVED (if it is not already), with the reason."""

    id: str
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"op": "archive", "id": self.id, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Archive:
        return cls(_str(d.get("id"), "id"), _str(d.get("reason", ""), "reason"))


@dataclass(frozen=True, slots=True)
class Supersede:
    """Mark a unit SUPERSEDED (if it is not already), with the reason."""

    id: str
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"op": "supersede", "id": self.id, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Supersede:
        return cls(_str(d.get("id"), "id"), _str(d.get("reason", ""), "reason"))


@dataclass(frozen=True, slots=True)
class Relate:
    """Relate ``src`` to ``dst`` with ``type`` (the store keeps one relation per triple)."""

    src: str
    dst: str
    type: str
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"op": "relate", "src": self.src, "dst": self.dst, "type": self.type, "note": self.note}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Relate:
        return cls(_str(d.get("src"), "src"), _str(d.get("dst"), "dst"), _str(d.get("type"), "type"), _str(d.get("note", ""), "note"))


@dataclass(frozen=True, slots=True)
class SetCounts:
    """A unit's absolute use counts and validation after a worker's uses (idempotent)."""

    id: str
    validation: float
    uses: int = 0
    successes: int = 0
    failures: int = 0

    @classmethod
    def of(cls, unit: Unit) -> SetCounts:
        c = unit.counts
        return cls(unit.id, unit.validation, c.uses, c.successes, c.failures)

    def to_dict(self) -> dict[str, Any]:
        return {"op": "counts", "id": self.id, "validation": self.validation, "uses": self.uses,
                "successes": self.successes, "failures": self.failures}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SetCounts:
        def n(key: str) -> int:
            v = d.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise ValidationError(f"counts op: {key} must be a count, got {v!r}")
            return int(v)

        v = d.get("validation")
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValidationError(f"counts op: validation must be a number, got {v!r}")
        return cls(_str(d.get("id"), "id"), float(v), n("uses"), n("successes"), n("failures"))


Op = Add | Archive | Supersede | Relate | SetCounts

_KINDS: dict[str, Any] = {"add": Add, "archive": Archive, "supersede": Supersede, "relate": Relate, "counts": SetCounts}


def parse(d: Op | Mapping[str, Any]) -> Op:
    """One op from its dict (an op passes through); an unknown op is an error, never dropped."""
    if isinstance(d, Add | Archive | Supersede | Relate | SetCounts):
        return d
    if not isinstance(d, Mapping):
        raise ValidationError(f"a store op is a dict with an 'op' key, got {type(d).__name__}")
    name = d.get("op")
    kind = _KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ValidationError(f"unknown store op {d.get('op')!r}; expected one of {', '.join(_KINDS)}")
    return kind.from_dict(d)  # type: ignore[no-any-return]


def parse_all(ops: Any) -> list[Op]:
    """Every op of a list, each checked before any is applied."""
    return [parse(d) for d in ops]


def to_dict(op: Op) -> dict[str, Any]:
    return op.to_dict()


def _field(d: Mapping[str, Any], key: str, kind: type) -> Any:
    v = d.get(key)
    if not isinstance(v, kind):
        raise ValidationError(f"{d.get('op')} op: {key} is missing or not a {kind.__name__}")
    return v


def _str(v: Any, name: str) -> str:
    if not isinstance(v, str):
        raise ValidationError(f"store op field {name} must be a string, got {type(v).__name__}")
    return v
