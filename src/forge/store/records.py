"""Export records, read back: one parser for every backend's ``import_records``.

An export is a stream of JSON objects, each with a ``record`` field: ``unit`` (with its
vector, base64 float32), ``relation``, ``episode``, and for the operator ``setting`` and
``event``. Parsing and validating them happens before a backend opens its transaction, so
bad input never leaves half-written state and every backend words its errors the same way.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forge.errors import ValidationError
from forge.model import Episode, Relation, Unit
from forge.store.base import check_event_op, check_setting

__all__ = ["HISTORY_RECORDS", "ImportBatch", "check_history", "event_record", "parse_records", "setting_record", "vector_field"]

#: Records that are history the store writes itself, not memory: audit events (who did what,
#: who saw what) and settings (reputations, the embedder's name).
HISTORY_RECORDS = ("event", "setting")


@dataclass
class ImportBatch:
    """Validated records, ready to be written in one transaction."""

    units: list[Unit] = field(default_factory=list)
    vectors: np.ndarray | None = None  # one row per unit, or None when no unit carries one
    relations: list[Relation] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)
    events: list[tuple[float, str, str | None, str, dict[str, Any]]] = field(default_factory=list)
    count: int = 0

    def check_embedder(self, recorded: str | None) -> None:
        """Refuse vectors made by another embedder than the one this store was built with."""
        theirs = self.settings.get("embedder")
        if self.vectors is not None and recorded and theirs and theirs != recorded:
            raise ValidationError(
                f"these records carry vectors from embedder {theirs!r}; this store uses {recorded!r} "
                "(export without vectors, or import into a store built with that embedder)"
            )


def vector_field(vec: np.ndarray) -> str:
    """A vector as an export record carries it."""
    return base64.b64encode(np.asarray(vec, dtype=np.float32).tobytes()).decode()


def setting_record(key: str, value: str) -> dict[str, Any]:
    return {"record": "setting", "key": key, "value": value}


def event_record(ts: float, op: str, unit_id: str | None, actor: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """An appended event as an export record (its seq is the source store's, so it stays behind)."""
    return {"record": "event", "ts": ts, "op": op, "unit_id": unit_id, "actor": actor, "data": dict(data)}


def check_history(records: Iterable[Any], *, allowed: bool, flag: str = "--with-history") -> None:
    """Refuse audit events and settings among ``records`` unless ``allowed``.

    An import that carries them rewrites history: an event dated 1970 "seen by alice", or a
    reputation that makes one agent's word count double. Restoring a whole store's export
    is an operator's deliberate act, asked for with ``flag``; an import of memories is not.
    The ``embedder`` setting passes: it names what made the records' vectors, is checked
    against this store's, and never replaces it.
    """
    if allowed:
        return
    for i, rec in enumerate(records, 1):
        kind = rec.get("record") if isinstance(rec, Mapping) else None
        if kind == "setting" and rec.get("key") == "embedder":
            continue  # what made the records' vectors, checked against this store's; never overwrites it
        if kind in HISTORY_RECORDS:
            what = "an audit event" if kind == "event" else "a setting (a reputation, the embedder's name)"
            raise ValidationError(f"record {i} is {what}: an import writes memories, not history; to restore a whole "
                                  f"store's audit log and settings, import with {flag} (admin)")


def parse_records(records: Iterable[Any]) -> ImportBatch:
    """Validate export records; errors name the record (``record 3: ...``)."""
    out = ImportBatch()
    vecs: list[np.ndarray | None] = []
    for i, rec in enumerate(records, 1):
        try:
            if not isinstance(rec, Mapping):
                raise ValidationError("a record must be a JSON object")
            rec = dict(rec)
            kind = rec.pop("record", None)
            if kind == "unit":
                vec = rec.pop("vector", None)
                out.units.append(Unit.from_dict(rec))
                vecs.append(_vector(vec) if vec is not None else None)
            elif kind == "relation":
                out.relations.append(Relation.from_dict(rec))
            elif kind == "episode":
                out.episodes.append(Episode.from_dict(rec))
            elif kind == "setting":
                key, value = check_setting(rec.get("key"), rec.get("value"))
                out.settings[key] = value
            elif kind == "event":
                out.events.append(_event(rec))
            else:
                raise ValidationError(
                    f"unknown record {kind!r}; expected 'record' to be unit, relation, episode, setting or event"
                )
        except ValidationError as exc:
            raise ValidationError(f"record {i}: {exc}") from None
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
            raise ValidationError(f"record {i}: {type(exc).__name__}: {str(exc)[:200]}") from None
        out.count += 1
    with_vec = [v for v in vecs if v is not None]
    if with_vec and len(with_vec) != len(vecs):
        raise ValidationError("either every imported unit carries a vector or none does")
    dims = {v.shape[0] for v in with_vec}
    if len(dims) > 1:
        raise ValidationError(f"imported vectors have mixed dimensions: {sorted(dims)}")
    out.vectors = np.stack(with_vec) if with_vec else None
    return out


def _vector(vec: Any) -> np.ndarray:
    if not isinstance(vec, str):
        raise ValidationError(f"vector must be a base64 string of float32 values, got {type(vec).__name__}")
    try:
        return np.frombuffer(base64.b64decode(vec, validate=True), dtype=np.float32)
    except ValueError:
        raise ValidationError("vector is not base64 float32") from None


def _event(rec: Mapping[str, Any]) -> tuple[float, str, str | None, str, dict[str, Any]]:
    ts, unit_id, actor, data = rec.get("ts"), rec.get("unit_id"), rec.get("actor", ""), rec.get("data", {})
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise ValidationError("an event needs a finite numeric 'ts'")
    if unit_id is not None and not isinstance(unit_id, str):
        raise ValidationError("an event's unit_id must be a string or null")
    if not isinstance(actor, str):
        raise ValidationError("an event's actor must be a string")
    if not isinstance(data, Mapping):
        raise ValidationError("an event's data must be an object")
    return float(ts), check_event_op(rec.get("op")), unit_id, actor, dict(data)
