"""Pure helpers every store backend shares: argument checks, what a viewer may see of a
unit's history, and the words keyword search matches. Backends import them so that the same
input gets the same answer, and the same error, whichever database is underneath."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from forge.errors import DimensionError, ValidationError
from forge.model import Context, Kind, Provenance, Scope, Status, Unit, Viewer
from forge.store.base import MAX_RESULTS, Event, indexed_text

__all__ = [
    "HIDDEN",
    "STOPWORDS",
    "check_vectors",
    "count_arg",
    "diff",
    "int_arg",
    "query_words",
    "redact_events",
    "row_unit",
    "scope_before",
    "sees",
    "unit_row",
]

STOPWORDS = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "but", "by", "did", "do", "does", "for", "from", "had", "has", "have", "he", "her", "his", "how", "i", "if", "in", "into", "is", "it", "its", "me", "my", "no", "not", "of", "on", "or", "our", "she", "so", "than", "that", "the", "their", "them", "then", "there", "these", "they", "this", "to", "was", "we", "were", "what", "when", "where", "which", "who", "why", "will", "with", "you", "your"]
)

#: What an agent sees of a value it could not see when it was written.
HIDDEN = "(hidden)"


def sees(viewer: Viewer, scope: Any, owner: Any) -> bool:
    """Whether ``viewer`` may see a unit with this scope and owner."""
    if viewer.operator or scope == "global":
        return True
    if scope == "private":
        return bool(owner) and owner == viewer.agent
    return isinstance(scope, str) and scope.startswith("group:") and scope[6:] in viewer.groups


def scope_before(state: tuple[Any, Any], change: Mapping[str, Any]) -> tuple[Any, Any]:
    """(scope, owner) before an update event whose diff is ``change``."""
    scope, owner = state
    if isinstance(change.get("scope"), Mapping):
        scope = change["scope"].get("from")
    if isinstance(change.get("owner"), Mapping):
        owner = change["owner"].get("from")
    return scope, owner


def int_arg(value: Any, name: str) -> int:
    """An integer argument (not a bool) that fits a 64-bit column."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{name} must be an integer, got {type(value).__name__}")
    if not -(2**63) <= value < 2**63:
        raise ValidationError(f"{name} is out of range")
    return value


def count_arg(value: Any, name: str, *, most: int = MAX_RESULTS) -> int:
    """A result count: an integer from 0 to ``most``."""
    count = int_arg(value, name)
    if not 0 <= count <= most:
        raise ValidationError(f"{name} must be between 0 and {most}, got {count}")
    return count


def query_words(text: str) -> list[str]:
    """The content words of free text, deduplicated, at most 32: what keyword search matches."""
    # One-letter tokens ("Jonah's" -> "s") match huge posting lists and carry no meaning.
    words = [w for w in re.findall(r"\w+", text.lower()) if len(w) > 1 and w not in STOPWORDS]
    return list(dict.fromkeys(words))[:32]


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """What an update changed, as ``{field: {"from": old, "to": new}}`` (the event's data)."""
    return {k: {"from": before.get(k), "to": v} for k, v in after.items() if before.get(k) != v and k != "updated_at"}


def check_vectors(vectors: np.ndarray | None, n: int, dim: int | None) -> np.ndarray | None:
    """``vectors`` as an (n, dim) float32 matrix, or a clear error: wrong count, wrong
    dimension (``dim`` None: the store has none yet) or non-finite values."""
    if vectors is None:
        return None
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim == 1:
        vectors = vectors.reshape(1, -1)
    if vectors.shape[0] != n:
        raise ValidationError(f"got {vectors.shape[0]} vectors for {n} units")
    if dim is not None and vectors.shape[1] != dim:
        raise DimensionError(dim, vectors.shape[1])
    if not np.isfinite(vectors).all():
        raise ValidationError("vectors contain NaN or infinite values")
    return vectors


def unit_row(u: Unit, *, tags: Callable[[list[str]], Any], text: Callable[[str], str] = str) -> tuple[Any, ...]:
    """A unit as the ``units`` table's columns, in order; ``tags`` encodes the tag list for the
    backend (a JSON string, an array) and ``text`` cleans the indexed text."""
    return (
        u.id,
        u.kind.value,
        u.content,
        u.context.domain,
        u.context.task,
        u.context.role,
        tags(list(u.context.tags)),
        str(u.scope),
        u.owner,
        u.confidence,
        u.validation,
        u.importance,
        u.access_count,
        u.last_access,
        u.created_at,
        u.updated_at,
        json.dumps(u.provenance.to_dict()),
        u.status.value,
        json.dumps(dict(u.meta), sort_keys=True),
        text(indexed_text(u)),
    )


def row_unit(r: Sequence[Any], *, tags: Callable[[Any], Sequence[str]] = tuple) -> Unit:
    """The unit of a ``units`` row (the first 19 columns of :func:`unit_row`). The row was
    validated when it was written, so it is restored without checking it again. Provenance
    and meta as :func:`unit_row` writes them when empty (most units) are not parsed."""
    prov = _NO_PROVENANCE if r[16] == _NO_PROVENANCE_TEXT else json.loads(r[16])
    return Unit.restore(
        id=r[0],
        kind=Kind(r[1]),
        content=r[2],
        context=Context.restore(domain=r[3], task=r[4], role=r[5], tags=tuple(tags(r[6]))),
        scope=_scope(r[7]),
        owner=r[8],
        confidence=r[9],
        validation=r[10],
        importance=r[11],
        access_count=r[12],
        last_access=r[13],
        created_at=r[14],
        updated_at=r[15] if r[15] is not None else r[14],
        provenance=Provenance.restore(source=prov.get("source", ""), episodes=tuple(prov.get("episodes") or ()),
                                      derived_from=tuple(prov.get("derived_from") or ())),
        status=Status(r[17]),
        meta={} if r[18] == "{}" else json.loads(r[18]),
    )


_NO_PROVENANCE = Provenance().to_dict()  # read only: its lists are copied into tuples
_NO_PROVENANCE_TEXT = json.dumps(_NO_PROVENANCE)


@functools.lru_cache(maxsize=4096)
def _scope(text: str) -> Scope:
    return Scope.parse(text)  # frozen: one parsed object per distinct scope text is shared


def redact_events(
    rows: Sequence[Sequence[Any]],
    later: Mapping[str, Sequence[tuple[int, Mapping[str, Any]]]],
    visible_named: set[str],
    viewer: Viewer,
) -> list[Event]:
    """What ``viewer`` may see of event ``rows`` (seq, ts, op, unit id, actor, data JSON, and
    the unit's scope and owner now), one rule for every backend.

    ``later`` holds each unit's scope/owner changes, newest first, to undo those made after an
    event (what the unit was then); ``visible_named`` the units named by relation events that
    the viewer may see. A relation to a unit it may not see is left out; of an update it sees
    only the sides it could see then; of any other event it could not see, only that it happened.
    """
    out = []
    for seq, ts, op, uid, actor, data, scope, owner in rows:
        d = json.loads(data)
        after = (scope, owner)
        for s_seq, change in later.get(uid, ()):  # newest first: undo changes made after this event
            if s_seq <= seq:
                break
            after = scope_before(after, change)
        before = scope_before(after, d) if op == "update" else after
        see_after, see_before = sees(viewer, *after), sees(viewer, *before)
        if op == "relate" and not {d.get("src"), d.get("dst")} <= visible_named:
            continue  # it names a unit this viewer may not see
        if op == "update":
            d = {
                k: {"from": v.get("from") if see_before else HIDDEN, "to": v.get("to") if see_after else HIDDEN}
                if isinstance(v, Mapping) else HIDDEN
                for k, v in d.items()
            }
        elif not see_after:
            d = {"hidden": HIDDEN}
        out.append(Event(seq, ts, op, uid, actor, d))
    return out
