"""Capsules: a memory unit in transit between agents, signed by its sender.

A capsule carries the unit plus what a receiver needs to judge it: who sent it (and who
wrote it first), how sure they were, in which context it held, how far it has travelled,
until when it is valid, and a content hash. The sender signs the canonical JSON of all of
that with its per-agent key (HMAC-SHA256), so receivers can reject unsigned, tampered,
replayed or expired capsules before looking at the content.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from forge.errors import ValidationError
from forge.model import MAX_FIELD_CHARS, MAX_ID_CHARS, Context, Scope, Unit, _kind_of, _text, new_id
from forge.model import _float as _number

__all__ = ["CAPSULE_KINDS", "MAX_HOPS", "MAX_TTL_S", "Capsule", "Keyring", "content_hash"]

#: What a capsule can be: a memory shared, a question for the agent, an answer to one.
CAPSULE_KINDS = ("share", "help_request", "help_reply")
#: Longest validity a capsule may claim (7 days): a capsule that never expires could be
#: replayed forever into any store whose ledger was reset.
MAX_TTL_S = 7 * 24 * 3600.0
#: Most hops a capsule may claim (receivers apply their own, lower limit).
MAX_HOPS = 1_000


def content_hash(unit: Unit) -> str:
    """Hash of what a unit says (kind + normalised content), used for dedup and echo checks."""
    norm = " ".join(unit.content.lower().split())
    return hashlib.sha256(f"{unit.kind.value}\n{norm}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Capsule:
    """A signed envelope around one unit. ``origin`` wrote the unit, ``sender`` forwarded it."""

    unit: Unit
    sender: str
    origin: str
    confidence: float
    context: Mapping[str, Any] = field(default_factory=dict)
    scope: str = "global"
    hops: int = 0
    ttl: float = 3600.0  # seconds after ``sent_at`` during which the capsule is valid
    sent_at: float = field(default_factory=time.time)
    id: str = field(default_factory=new_id)  # unique per send: replay protection keys on it
    kind: str = "share"  # share | help_request | help_reply
    reply_to: str = ""
    hash: str = ""
    signature: str = ""

    def __post_init__(self) -> None:
        _check_fields(self)
        if not self.hash:
            object.__setattr__(self, "hash", content_hash(self.unit))

    @classmethod
    def of(cls, unit: Unit, *, sender: str, ttl: float = 3600.0, kind: str = "share", reply_to: str = "") -> Capsule:
        """Wrap a unit an agent owns (or forwards) for broadcast."""
        return cls(
            unit=unit,
            sender=sender,
            # A received unit is owned by its receiver; its author is kept in meta["origin"],
            # so re-broadcasting it does not make the forwarder a fresh, independent witness.
            origin=str(unit.meta.get("origin") or unit.owner or sender),
            confidence=unit.confidence,
            context=unit.context.to_dict(),
            scope=str(unit.scope),
            ttl=ttl,
            kind=kind,
            reply_to=reply_to,
        )

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) > self.sent_at + self.ttl

    def forwarded(self, *, by: str) -> Capsule:
        """A copy re-sent by ``by`` one hop further (new id, unsigned until signed)."""
        return replace(self, sender=by, hops=self.hops + 1, id=new_id(), sent_at=time.time(), signature="")

    def payload(self) -> bytes:
        """Canonical bytes that the signature covers: everything but the signature."""
        d = self.to_dict()
        d.pop("signature")
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "unit": self.unit.to_dict(),
            "sender": self.sender,
            "origin": self.origin,
            "confidence": self.confidence,
            "context": dict(self.context),
            "scope": self.scope,
            "hops": self.hops,
            "ttl": self.ttl,
            "sent_at": self.sent_at,
            "reply_to": self.reply_to,
            "hash": self.hash,
            "signature": self.signature,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Capsule:
        """Parse a capsule; anything malformed raises :class:`ValidationError`, nothing else."""
        if not isinstance(data, Mapping) or "unit" not in data:
            raise ValidationError("malformed capsule: not an object with a unit")
        d = dict(data)
        try:
            d["unit"] = Unit.from_dict(d["unit"])
            return cls(**d)
        except ValidationError as exc:
            raise ValidationError(f"malformed capsule: {exc}") from None
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
            raise ValidationError(f"malformed capsule: {type(exc).__name__}: {str(exc)[:200]}") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> Capsule:
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError, RecursionError, TypeError) as exc:
            raise ValidationError(f"malformed capsule JSON: {str(exc)[:200]}") from None
        return cls.from_dict(data)


def _check_fields(c: Capsule) -> None:
    """Every field's type and bounds, so a capsule that exists can be verified, hashed,
    judged and stored without a TypeError: a malformed one fails here, as ValidationError."""
    if not isinstance(c.unit, Unit):
        raise ValidationError(f"capsule unit must be a Unit, got {_kind_of(c.unit)}")
    for name in ("sender", "origin"):
        value = getattr(c, name)
        if not isinstance(value, str) or not value:
            raise ValidationError(f"a capsule needs a {name} agent id (a non-empty string), got {_kind_of(value)}")
        _text(value, f"capsule {name}", MAX_FIELD_CHARS)
    if not isinstance(c.id, str) or not c.id:
        raise ValidationError(f"capsule id must be a non-empty string, got {_kind_of(c.id)}")
    _text(c.id, "capsule id", MAX_ID_CHARS)
    if c.kind not in CAPSULE_KINDS:
        raise ValidationError(f"capsule kind must be one of {', '.join(CAPSULE_KINDS)}")
    _text(c.reply_to, "capsule reply_to", MAX_ID_CHARS)
    _text(c.hash, "capsule hash", 128)
    _text(c.signature, "capsule signature", 4096)
    confidence = _number(c.confidence, "capsule confidence")
    if not 0.0 <= confidence <= 1.0:
        raise ValidationError(f"capsule confidence must be between 0 and 1, got {confidence}")
    if not isinstance(c.context, Mapping):
        raise ValidationError(f"capsule context must be a JSON object, got {_kind_of(c.context)}")
    Context.from_dict(c.context)  # same fields, types and limits as a unit's context
    if not isinstance(c.scope, str):
        raise ValidationError(f"capsule scope must be a string, got {_kind_of(c.scope)}")
    Scope.parse(c.scope)
    if isinstance(c.hops, bool) or not isinstance(c.hops, int) or not 0 <= c.hops <= MAX_HOPS:
        raise ValidationError(f"capsule hops must be an integer from 0 to {MAX_HOPS}")
    ttl = _number(c.ttl, "capsule ttl")
    if not 0 < ttl <= MAX_TTL_S:
        raise ValidationError(f"capsule ttl must be above 0 and at most {MAX_TTL_S:.0f} seconds, got {ttl}")
    _number(c.sent_at, "capsule sent_at")


class Keyring:
    """Per-agent HMAC keys. Secrets come from the caller (or the environment at the edge).

    ``Keyring.from_secret(master)`` derives each agent's key from one master secret, which
    suits a swarm started by one operator; ``Keyring({agent: key})`` takes explicit keys.
    """

    def __init__(self, keys: Mapping[str, bytes] | None = None, *, master: bytes | None = None) -> None:
        self._keys = dict(keys or {})
        self._master = master

    @classmethod
    def from_secret(cls, master: bytes | str) -> Keyring:
        return cls(master=master.encode() if isinstance(master, str) else master)

    @classmethod
    def random(cls) -> Keyring:
        return cls(master=os.urandom(32))

    def key(self, agent: str) -> bytes | None:
        if agent in self._keys:
            return self._keys[agent]
        if self._master is not None:
            return hmac.new(self._master, f"agent:{agent}".encode(), hashlib.sha256).digest()
        return None

    def sign(self, capsule: Capsule) -> Capsule:
        key = self.key(capsule.sender)
        if key is None:
            raise ValidationError(f"no signing key for agent {capsule.sender!r}")
        sig = hmac.new(key, capsule.payload(), hashlib.sha256).hexdigest()
        return replace(capsule, signature=sig)

    def verify(self, capsule: Capsule) -> str | None:
        """None if the signature is valid, else the reason it is not."""
        if not capsule.signature:
            return "unsigned"
        key = self.key(capsule.sender)
        if key is None:
            return f"unknown sender {capsule.sender!r}"
        expected = hmac.new(key, capsule.payload(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, capsule.signature):
            return "bad signature"
        if capsule.hash != content_hash(capsule.unit):
            return "content hash mismatch"
        return None
