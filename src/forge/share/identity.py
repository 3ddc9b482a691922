"""Per-agent identities: one Ed25519 key pair per agent, and files to keep them in.

An agent signs what it sends with its own private key; everyone else holds only its public
key, in a keyring (:class:`forge.share.capsule.Keyring`). Holding the keyring lets an agent check
who wrote and who sent a capsule; it does not let it speak for anyone but itself, which a
shared master secret cannot promise (every holder of the secret can sign as every agent).

    alice = Identity.generate("alice")
    alice.save("alice.key")                       # private: mode 0600, never share it
    save_public_keys("keyring.json", {"alice": alice.public_b64, "bob": bob.public_b64})
    keyring = Keyring.load("keyring.json", identity="alice.key")   # forge.share.capsule

Keys are raw 32-byte Ed25519 keys, base64 in the files; signatures are 64 bytes. The
primitives are the ``cryptography`` package's (OpenSSL underneath): nothing hand-rolled.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from forge.errors import ConfigError, ValidationError

__all__ = ["Identity", "load_public_keys", "public_key", "save_public_keys", "verify_ed25519"]


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str, *, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError) as exc:
        raise ValidationError(f"{what} is not base64: {exc}") from None


def public_key(value: bytes | str | Ed25519PublicKey) -> Ed25519PublicKey:
    """An Ed25519 public key from its raw 32 bytes, their base64, or the key itself."""
    if isinstance(value, Ed25519PublicKey):
        return value
    raw = _unb64(value, what="public key") if isinstance(value, str) else bytes(value)
    if len(raw) != 32:
        raise ValidationError(f"an Ed25519 public key is 32 bytes, got {len(raw)}")
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        raise ValidationError(f"not an Ed25519 public key: {exc}") from None


def verify_ed25519(key: Ed25519PublicKey, signature: bytes, data: bytes) -> bool:
    try:
        key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


class Identity:
    """One agent's name and private key. ``repr`` never shows the key."""

    __slots__ = ("_key", "agent")

    def __init__(self, agent: str, key: Ed25519PrivateKey) -> None:
        if not agent:
            raise ValidationError("an identity needs an agent id")
        self.agent = agent
        self._key = key

    @classmethod
    def generate(cls, agent: str) -> Identity:
        return cls(agent, Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, agent: str, raw: bytes | str) -> Identity:
        raw = _unb64(raw, what="private key") if isinstance(raw, str) else raw
        if len(raw) != 32:
            raise ValidationError(f"an Ed25519 private key is 32 bytes, got {len(raw)}")
        return cls(agent, Ed25519PrivateKey.from_private_bytes(raw))

    @classmethod
    def load(cls, path: str | Path) -> Identity:
        """Read a key file written by :meth:`save` (``{"agent": ..., "private_key": b64}``)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls.from_private_bytes(str(data["agent"]), str(data["private_key"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot read identity file {path}: {exc}") from None

    def save(self, path: str | Path) -> Path:
        """Write the private key, readable by its owner only (created with mode 0600)."""
        path = Path(path)
        raw = self._key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        body = json.dumps({"agent": self.agent, "private_key": _b64(raw), "public_key": self.public_b64})
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body + "\n")
        return path

    @property
    def public(self) -> Ed25519PublicKey:
        return self._key.public_key()

    @property
    def public_bytes(self) -> bytes:
        return self.public.public_bytes(Encoding.Raw, PublicFormat.Raw)

    @property
    def public_b64(self) -> str:
        return _b64(self.public_bytes)

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def __repr__(self) -> str:
        return f"Identity({self.agent!r}, public={self.public_b64})"


def save_public_keys(path: str | Path, keys: Mapping[str, bytes | str | Ed25519PublicKey]) -> Path:
    """Write a keyring file: ``{"agents": {agent: base64 public key}}``. Public: safe to share."""
    out = {}
    for agent, key in sorted(keys.items()):
        out[agent] = _b64(public_key(key).public_bytes(Encoding.Raw, PublicFormat.Raw))
    path = Path(path)
    path.write_text(json.dumps({"agents": out}, indent=1) + "\n", encoding="utf-8")
    return path


def load_public_keys(path: str | Path) -> dict[str, Ed25519PublicKey]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        agents = data["agents"]
        if not isinstance(agents, Mapping):
            raise TypeError("'agents' is not an object")
        return {str(a): public_key(str(k)) for a, k in agents.items()}
    except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
        raise ConfigError(f"cannot read keyring file {path}: {exc}") from None
