"""Recall ids: a signed note of which units one agent was shown, so an outcome can credit them.

A ``recall_id`` carries the agent, the unit ids and the time, signed with a key kept in the
memory's settings (``credit/key``, made on first use). Nothing is stored per recall, so a
busy service writes nothing on its read path, and an id minted by one process or before a
restart is read by any other process on the same store. A forged, truncated or foreign id
fails its signature; :func:`forge.learn.online.credit` claims each id once, so an outcome
is counted once however often it is sent.

Why signed and not stored: recalls are the hot path (thousands per second per replica)
while outcomes are rare; a row per recall would turn every read into a write.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass

from forge.errors import NotFoundError, ValidationError
from forge.store.base import Store

__all__ = ["KEY_SETTING", "MAX_TICKET_CHARS", "Ticket", "key_of", "mint", "read"]

KEY_SETTING = "credit/key"
#: Longest recall id accepted (an answer shows at most a few hundred units).
MAX_TICKET_CHARS = 16_384
_PREFIX = "r1."


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a recall id says: who recalled, which units were shown, when."""

    agent: str
    units: tuple[str, ...]
    at: float
    digest: str  # names this recall once (what an outcome claims)


def key_of(store: Store) -> bytes | None:
    """The memory's signing key, made and kept on first use; None for a read-only store
    that has none yet (its answers then carry no recall id)."""
    key = store.settings().get(KEY_SETTING)
    if key is None:
        if store.info.get("readonly"):
            return None
        store.set_setting(KEY_SETTING, os.urandom(32).hex())
        key = store.settings()[KEY_SETTING]
    return bytes.fromhex(key)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def mint(key: bytes, *, agent: str, units: list[str], at: float | None = None) -> str:
    """A recall id for ``agent`` having been shown ``units``."""
    body = json.dumps({"a": agent, "u": units, "t": round(time.time() if at is None else at, 3)}, separators=(",", ":")).encode()
    sig = hmac.new(key, body, hashlib.sha256).digest()[:16]
    return f"{_PREFIX}{_b64(body)}.{_b64(sig)}"


def read(key: bytes | None, recall_id: object) -> Ticket:
    """The ticket a recall id holds; :class:`NotFoundError` for one this memory never issued."""
    if not isinstance(recall_id, str) or not recall_id.strip():
        raise ValidationError("recall_id must be a non-empty string (the recall_id of a recall or context answer)")
    if len(recall_id) > MAX_TICKET_CHARS:
        raise ValidationError(f"recall_id is {len(recall_id)} characters; the limit is {MAX_TICKET_CHARS}")
    unknown = NotFoundError("no recall with that recall_id: it was not issued by this memory (or was altered)")
    if key is None or not recall_id.startswith(_PREFIX) or recall_id.count(".") != 2:
        raise unknown
    body_text, sig_text = recall_id[len(_PREFIX):].split(".")
    try:
        body, sig = _unb64(body_text), _unb64(sig_text)
    except (binascii.Error, ValueError):
        raise unknown from None
    if not hmac.compare_digest(sig, hmac.new(key, body, hashlib.sha256).digest()[:16]):
        raise unknown
    data = json.loads(body)  # signed by us: well-formed by construction
    return Ticket(agent=data["a"], units=tuple(data["u"]), at=float(data["t"]), digest=hashlib.sha256(body).hexdigest()[:32])
