"""Pure helpers every store backend shares: argument checks, what a viewer may see of a
unit's history, and the words keyword search matches. Backends import them so that the same
input gets the same answer, and the same error, whichever database is underneath."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from forge.errors import ValidationError
from forge.model import Viewer
from forge.store.base import MAX_RESULTS

__all__ = ["HIDDEN", "STOPWORDS", "count_arg", "diff", "int_arg", "query_words", "scope_before", "sees"]

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
    value = int_arg(value, name)
    if not 0 <= value <= most:
        raise ValidationError(f"{name} must be between 0 and {most}, got {value}")
    return value


def query_words(text: str) -> list[str]:
    """The content words of free text, deduplicated, at most 32: what keyword search matches."""
    # One-letter tokens ("Jonah's" -> "s") match huge posting lists and carry no meaning.
    words = [w for w in re.findall(r"\w+", text.lower()) if len(w) > 1 and w not in STOPWORDS]
    return list(dict.fromkeys(words))[:32]


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """What an update changed, as ``{field: {"from": old, "to": new}}`` (the event's data)."""
    return {k: {"from": before.get(k), "to": v} for k, v in after.items() if before.get(k) != v and k != "updated_at"}
