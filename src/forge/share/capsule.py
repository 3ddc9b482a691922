"""Capsules: a memory unit in transit between agents, signed by its author and its sender.

A capsule carries the unit plus what a receiver needs to judge it: who sent it (and who
wrote it first), to whom, how sure they were, in which context it held, how far it has
travelled, until when it is valid, and a content hash. Two signatures travel with it:

- ``origin_sig``: the author's signature over what it wrote (origin, kind, exact content).
  It survives forwarding unchanged, so a relay can pass a unit on but cannot put words in
  another agent's mouth or invent authors;
- ``signature``: the sender's signature over the whole envelope, *including the recipients*
  (``to``), so a capsule lifted from one agent's inbox is refused by every other agent.

Receivers reject unsigned, tampered, misdirected, replayed or expired capsules before
looking at the content (:class:`Keyring.verify`, then the exchange's replay/expiry checks).

Two signing schemes, chosen per keyring:

- **Ed25519, per agent (the default)**: each agent holds its own private key
  (:class:`forge.share.identity.Identity`) and everyone's public keys. No agent can sign as
  another, because no agent holds another's private key. :meth:`Keyring.random` and
  :meth:`Keyring.generate` make Ed25519 keyrings; :meth:`Keyring.load` reads key files.
- **HMAC-SHA256 from one master secret (legacy, simple)**: :meth:`Keyring.from_secret`
  derives every agent's key from one shared string, which needs no key distribution (a
  swarm of processes started by one operator). Its limit: every holder of the master can
  sign as any agent, origin included; only outsiders are kept out. Recipient binding still
  stops replay into another inbox.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from forge.errors import ValidationError
from forge.model import MAX_FIELD_CHARS, MAX_ID_CHARS, Context, Scope, Unit, _kind_of, _text, new_id
from forge.model import _float as _number
from forge.share.identity import (
    Identity,
    load_public_keys,
    public_key,
    save_public_keys,
    verify_ed25519,
)

__all__ = ["CAPSULE_KINDS", "MAX_HOPS", "MAX_TTL_S", "SYSTEM_META", "Capsule", "Keyring", "content_hash"]

#: Meta keys the system records and no writer sets: neither an agent's key (REST, MCP:
#: :mod:`forge.server.service`) nor a capsule's sender (:mod:`forge.share.exchange`). Set by
#: a writer they would forge authorship or consensus, or retire and outlive other units:
#: ``pinned`` spares a unit from decay and caps, ``valid_from`` decides which side of a
#: contradiction is newer, ``superseded_by`` says it was replaced. One set, read by both.
SYSTEM_META = frozenset({
    # provenance and travel
    "origin", "via", "sender", "capsule", "remote_id", "hops", "received_scope", "received_at", "authored_at", "hash",
    "origin_sig",
    # screening and review
    "assessment", "quarantine", "released", "doubt",
    # consensus
    "promoted_to", "promoted_at", "consensus_of", "witnesses", "corroboration", "merged", "merges", "holds_when",
    # curation
    "valid_from", "valid_to", "superseded_by", "pinned", "restored_at",
})

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
    to: tuple[str, ...] = ()  # recipients the sender signed for; a receiver must be among them
    origin_sig: str = ""  # the origin's signature over what it wrote (see origin_statement)
    signature: str = ""  # the sender's signature over everything else

    def __post_init__(self) -> None:
        _check_fields(self)
        if not self.hash:
            object.__setattr__(self, "hash", content_hash(self.unit))
        if not isinstance(self.to, tuple):
            if isinstance(self.to, str) or not isinstance(self.to, Iterable):
                raise ValidationError("capsule recipients 'to' must be a list of agent ids")
            object.__setattr__(self, "to", tuple(self.to))
        if not all(isinstance(a, str) for a in self.to):
            raise ValidationError("capsule recipients 'to' must be agent id strings")

    @classmethod
    def of(cls, unit: Unit, *, sender: str, ttl: float = 3600.0, kind: str = "share", reply_to: str = "") -> Capsule:
        """Wrap a unit an agent owns (or forwards) for broadcast.

        A received unit keeps its author's signature in ``meta["origin_sig"]`` (the exchange
        stores it), so forwarding it later still proves who wrote it.
        """
        origin = str(unit.meta.get("origin") or unit.owner or sender)
        return cls(
            unit=unit,
            sender=sender,
            # A received unit is owned by its receiver; its author is kept in meta["origin"],
            # so re-broadcasting it does not make the forwarder a fresh, independent witness.
            origin=origin,
            origin_sig=str(unit.meta.get("origin_sig") or "") if origin != sender else "",
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
        """A copy re-sent by ``by`` one hop further (new id, unaddressed and unsigned until
        signed; the origin's signature is kept)."""
        return replace(self, sender=by, hops=self.hops + 1, id=new_id(), sent_at=time.time(), to=(), signature="")

    def addressed(self, recipients: Iterable[str]) -> Capsule:
        """A copy for ``recipients`` (sorted, deduplicated), to be signed."""
        if isinstance(recipients, str):
            recipients = [recipients]
        return replace(self, to=tuple(sorted(set(recipients))), signature="")

    def payload(self) -> bytes:
        """Canonical bytes that the sender's signature covers: everything but that signature."""
        d = self.to_dict()
        d.pop("signature")
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    def origin_statement(self) -> bytes:
        """What the origin signs: who wrote which exact text, of which kind.

        Not the context, confidence or ids: receivers narrow a unit's context and keep
        their own ids, and forwarding must not break the author's signature.
        """
        digest = hashlib.sha256(self.unit.content.encode("utf-8", "surrogatepass")).hexdigest()
        d = {"v": 1, "origin": self.origin, "kind": self.unit.kind.value, "content_sha256": digest}
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
            "to": list(self.to),
            "origin_sig": self.origin_sig,
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
    _text(c.origin_sig, "capsule origin_sig", 4096)
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



_ED = "ed25519:"  # prefix of Ed25519 signatures; HMAC signatures are bare hex (legacy format)


class Keyring:
    """Signs capsules as local agents and verifies capsules from known agents.

    Ed25519 (the default scheme): ``Keyring.ed25519(public={agent: key}, identities=[...])``
    holds everyone's public keys and the private keys of the agents that live in this
    process (normally one: :meth:`for_agent`). :meth:`generate` makes keys for a whole
    population in one process (tests, simulations, benchmarks); :meth:`random` makes them
    on first use, for agents that all live in this one process.

    HMAC (legacy, simple): ``Keyring.from_secret(master)`` derives each agent's key from one
    master secret; ``Keyring({agent: key})`` takes explicit shared keys. Anyone holding the
    master can sign as any agent: fine for one operator's swarm, not against an insider.
    """

    def __init__(self, keys: Mapping[str, bytes] | None = None, *, master: bytes | None = None) -> None:
        self.scheme = "hmac-sha256"
        self._keys = dict(keys or {})
        self._master = master
        self._public: dict[str, Any] = {}
        self._private: dict[str, Identity] = {}
        self._auto = False

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def ed25519(
        cls,
        public: Mapping[str, bytes | str | Any] | None = None,
        *,
        identities: Iterable[Identity] = (),
        auto: bool = False,
    ) -> Keyring:
        """Public keys of known agents, plus the identities this process may sign as.

        ``auto`` generates an identity for any agent signed as that has none (everything
        in one process, where keeping agents apart by key is not the point).
        """
        ring = cls()
        ring.scheme = "ed25519"
        ring._auto = auto
        for agent, key in (public or {}).items():
            ring._public[agent] = public_key(key)
        for ident in identities:
            ring.add_identity(ident)
        return ring

    @classmethod
    def generate(cls, agents: Iterable[str]) -> Keyring:
        """Fresh Ed25519 keys for every agent (one process plays them all)."""
        return cls.ed25519(identities=[Identity.generate(a) for a in agents])

    @classmethod
    def random(cls) -> Keyring:
        """An Ed25519 keyring that makes each agent's key on first use; one process only."""
        return cls.ed25519(auto=True)

    @classmethod
    def from_secret(cls, master: bytes | str) -> Keyring:
        """Legacy HMAC: every agent's key derived from one shared master secret."""
        return cls(master=master.encode() if isinstance(master, str) else master)

    @classmethod
    def load(cls, path: str | Path, *, identity: str | Path | Identity | None = None) -> Keyring:
        """Public keys from a keyring file, and this agent's own key file (or Identity)."""
        ident = Identity.load(identity) if isinstance(identity, str | Path) else identity
        return cls.ed25519(load_public_keys(path), identities=[ident] if ident is not None else ())

    def save_public(self, path: str | Path) -> Path:
        """Write every known public key to a keyring file (safe to share)."""
        self._need_ed25519("save_public")
        return save_public_keys(path, self._public)

    def add_identity(self, identity: Identity) -> None:
        self._need_ed25519("add_identity")
        self._private[identity.agent] = identity
        self._public[identity.agent] = identity.public

    def add_public(self, agent: str, key: bytes | str | Any) -> None:
        self._need_ed25519("add_public")
        self._public[agent] = public_key(key)

    def for_agent(self, agent: str) -> Keyring:
        """A copy that can sign as ``agent`` only, and verify everyone: what one agent holds."""
        self._need_ed25519("for_agent")
        if agent not in self._private:
            raise ValidationError(f"no private key for agent {agent!r} in this keyring")
        return Keyring.ed25519(self._public, identities=[self._private[agent]])

    def identity(self, agent: str) -> Identity | None:
        if agent not in self._private and self._auto and self.scheme == "ed25519":
            self.add_identity(Identity.generate(agent))
        return self._private.get(agent)

    @property
    def agents(self) -> list[str]:
        """Agents whose signatures this keyring can check (explicit keys; a master covers all)."""
        return sorted(self._public if self.scheme == "ed25519" else self._keys)

    def _need_ed25519(self, what: str) -> None:
        if self.scheme != "ed25519":
            raise ValidationError(f"{what} needs an Ed25519 keyring, this one is {self.scheme}")

    # -- HMAC (legacy) --------------------------------------------------------------------
    def key(self, agent: str) -> bytes | None:
        """The HMAC key of ``agent`` (legacy scheme); None for Ed25519 keyrings."""
        if self.scheme != "hmac-sha256":
            return None
        if agent in self._keys:
            return self._keys[agent]
        if self._master is not None:
            return hmac.new(self._master, f"agent:{agent}".encode(), hashlib.sha256).digest()
        return None

    def _can_sign(self, agent: str) -> bool:
        if self.scheme == "ed25519":
            return self.identity(agent) is not None
        return self.key(agent) is not None

    def _sign_bytes(self, agent: str, data: bytes) -> str:
        if self.scheme == "ed25519":
            ident = self.identity(agent)
            if ident is None:
                raise ValidationError(f"no private key for agent {agent!r}: an agent signs only as itself")
            return _ED + base64.b64encode(ident.sign(data)).decode("ascii")
        key = self.key(agent)
        if key is None:
            raise ValidationError(f"no signing key for agent {agent!r}")
        return hmac.new(key, data, hashlib.sha256).hexdigest()

    def _known(self, agent: str) -> bool:
        if self.scheme == "ed25519":
            return agent in self._public
        return self.key(agent) is not None

    def _check(self, agent: str, data: bytes, signature: str) -> bool:
        if not isinstance(signature, str):
            return False
        if self.scheme == "ed25519":
            if not signature.startswith(_ED):
                return False
            try:
                raw = base64.b64decode(signature[len(_ED) :].encode("ascii"), validate=True)
            except (binascii.Error, ValueError, UnicodeEncodeError):
                return False
            return len(raw) == 64 and verify_ed25519(self._public[agent], raw, data)
        key = self.key(agent)
        if key is None:
            return False
        expected = hmac.new(key, data, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected.encode(), signature.encode("utf-8", "surrogatepass"))

    # -- signing --------------------------------------------------------------------------
    def sign(self, capsule: Capsule) -> Capsule:
        """Sign as ``capsule.sender``; sign as the origin too if it is this sender (or local).

        A forwarded capsule keeps the origin's signature it carries. Address it first
        (:meth:`Capsule.addressed`): the recipients are part of what is signed.
        """
        if not self._can_sign(capsule.sender):
            raise ValidationError(f"no signing key for agent {capsule.sender!r}")
        if not capsule.origin_sig:
            if not self._can_sign(capsule.origin):
                raise ValidationError(
                    f"{capsule.sender!r} cannot vouch for origin {capsule.origin!r}: the capsule carries no "
                    "signature of its author and only the author can make one"
                )
            capsule = replace(capsule, origin_sig=self._sign_bytes(capsule.origin, capsule.origin_statement()))
        capsule = replace(capsule, signature="")
        return replace(capsule, signature=self._sign_bytes(capsule.sender, capsule.payload()))

    def verify(self, capsule: Capsule, *, recipient: str | None = None) -> str | None:
        """None if the capsule is authentic (and addressed to ``recipient``), else why not.

        Reasons: ``unsigned``, ``unknown sender 'x'``, ``bad signature``, ``content hash
        mismatch``, ``origin unsigned``, ``unknown origin 'x'``, ``bad origin signature``,
        ``not addressed to 'x'``.
        """
        if not capsule.signature:
            return "unsigned"
        if not self._known(capsule.sender):
            return f"unknown sender {capsule.sender!r}"
        if not self._check(capsule.sender, capsule.payload(), capsule.signature):
            return "bad signature"
        if capsule.hash != content_hash(capsule.unit):
            return "content hash mismatch"
        if not capsule.origin_sig:
            return "origin unsigned"
        if not self._known(capsule.origin):
            return f"unknown origin {capsule.origin!r}"
        if not self._check(capsule.origin, capsule.origin_statement(), capsule.origin_sig):
            return "bad origin signature"
        if recipient is not None and recipient not in capsule.to:
            return f"not addressed to {recipient!r}"
        return None
