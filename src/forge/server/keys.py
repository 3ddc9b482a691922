"""API keys: each maps to one agent id and its groups, or to an operator (admin).

Only a SHA-256 hash of each key is stored, in a small JSON file beside the database
(``<db>.keys.json`` by default), written atomically. Keys are 32 random bytes, so a fast
hash is enough: there is nothing to brute-force. The file is re-read when it changes, so
``forge keys revoke`` takes effect on a running server without a restart.

    keys = KeyStore.beside("team.db")
    token = keys.create(agent="scout", groups=["ops"])   # shown once, never stored
    keys.authenticate(token)                             # -> Principal(agent="scout", ...)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from forge.errors import NotFoundError, StoreError, ValidationError
from forge.model import Viewer

__all__ = ["RESERVED_AGENTS", "KeyRecord", "KeyStore", "Principal", "check_agent_id"]

_PREFIX = "fk_"

#: Agent ids a key may not take: the names the audit log gives the operator and the system's
#: own writers. An agent key named "admin" would otherwise read the admin key's trail (its
#: queries and what they returned), since an agent reads the entries its name wrote.
RESERVED_AGENTS = frozenset({"admin", "operator", "cli", "cli-curate", "curate", "import", "seed", "system", "forge", "team", "demo"})


def check_agent_id(agent: str) -> str:
    """``agent`` if a key may act as it, else a ValidationError that says why.

    Reserved: the names in :data:`RESERVED_AGENTS` (any case) and any id with a colon,
    the form of the system's actors (``exchange:<agent>``, ``consensus:<agent>``, ``api:<agent>``).
    """
    if agent != agent.strip() or not agent or any(c.isspace() or not c.isprintable() for c in agent):
        raise ValidationError(f"agent id {agent!r} is not usable: use letters, digits, '-', '_' or '.' without spaces")
    if agent.lower() in RESERVED_AGENTS or ":" in agent:
        raise ValidationError(f"agent id {agent!r} is reserved for the operator or the system's own writers "
                              f"({', '.join(sorted(RESERVED_AGENTS))}, or any id with ':'); choose another")
    if len(agent) > 200:
        raise ValidationError("an agent id is at most 200 characters")
    return agent


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: taken from the key, never from a request field."""

    agent: str
    groups: frozenset[str] = frozenset()
    admin: bool = False
    key_id: str = ""
    by: str = ""  # who is looking through this agent's eyes (an admin on the dashboard), if not the agent

    @property
    def viewer(self) -> Viewer:
        return Viewer.admin() if self.admin else Viewer.of(self.agent, self.groups)

    @property
    def actor(self) -> str:
        """How this principal is written in the audit log: an admin viewing as an agent is
        written ``"admin as scout"``, so its queries never join that agent's own trail."""
        return f"{self.by} as {self.agent}" if self.by else self.agent

    @classmethod
    def local(cls) -> Principal:
        """The operator of a server without keys (reachable from loopback only)."""
        return cls(agent="operator", admin=True, key_id="local")


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """What is stored for a key: never the key itself."""

    id: str
    hash: str
    agent: str
    groups: tuple[str, ...] = ()
    admin: bool = False
    rate: float | None = None  # requests per second; None = the server's default
    created_at: float = field(default_factory=time.time)
    revoked_at: float | None = None
    note: str = ""

    def public(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("hash")
        d["groups"] = list(self.groups)
        return d


class KeyStore:
    """API keys in one JSON file; thread-safe, shared between processes through the file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._records: dict[str, KeyRecord] = {}
        self._stamp: tuple[int, int] | None = None

    @classmethod
    def beside(cls, db: str | os.PathLike[str]) -> KeyStore:
        """The key file of a database file (``:memory:`` stores get a throw-away path)."""
        text = str(db)
        if text.startswith("sqlite:///"):
            text = text[len("sqlite:///") :]
        return cls(text + ".keys.json")

    # -- file ---------------------------------------------------------------------------
    def _load(self) -> dict[str, KeyRecord]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._records, self._stamp = {}, None
            return self._records
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                raw = json.loads(self.path.read_text(encoding="utf-8"))
                self._records = {
                    k: KeyRecord(**{**v, "groups": tuple(v.get("groups", ()))}) for k, v in raw.get("keys", {}).items()
                }
            except (OSError, ValueError, TypeError) as exc:
                raise StoreError(f"{self.path}: unreadable key file ({exc})") from None
            self._stamp = stamp
        return self._records

    def _save(self, records: dict[str, KeyRecord]) -> None:
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        data = {"keys": {k: asdict(r) for k, r in records.items()}}
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self._stamp = None

    # -- management ---------------------------------------------------------------------
    def create(
        self, *, agent: str = "", groups: Iterable[str] = (), admin: bool = False, rate: float | None = None, note: str = ""
    ) -> str:
        """Make a key and return it; this is the only time the key itself is seen."""
        if not admin and not agent:
            raise ValidationError("an agent key needs an agent id (or make an --admin key)")
        if not admin:
            check_agent_id(agent)
        elif agent:
            raise ValidationError("an admin key acts as the operator ('admin' in the audit log); leave out --agent")
        if rate is not None and rate <= 0:
            raise ValidationError("a rate limit must be positive (requests per second)")
        groups = tuple(sorted({g.strip() for g in groups if g.strip()}))
        key_id = secrets.token_hex(6)
        token = f"{_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        rec = KeyRecord(key_id, _hash(token), agent or "admin", groups, admin, rate, note=note)
        with self._lock:
            records = dict(self._load())
            records[key_id] = rec
            self._save(records)
        return token

    def list(self, *, include_revoked: bool = True) -> list[KeyRecord]:
        with self._lock:
            records = list(self._load().values())
        return sorted((r for r in records if include_revoked or r.revoked_at is None), key=lambda r: r.created_at)

    def revoke(self, key_id: str) -> KeyRecord:
        with self._lock:
            records = dict(self._load())
            rec = records.get(key_id)
            if rec is None:
                raise NotFoundError(f"no key with id {key_id}; see 'forge keys list'")
            if rec.revoked_at is None:
                rec = KeyRecord(**{**asdict(rec), "groups": rec.groups, "revoked_at": time.time()})
                records[key_id] = rec
                self._save(records)
        return rec

    def active(self) -> bool:
        """True when at least one key is usable: then every request must carry one."""
        return any(r.revoked_at is None for r in self.list())

    # -- checking -----------------------------------------------------------------------
    def authenticate(self, token: str) -> tuple[Principal, KeyRecord] | None:
        """The principal a key stands for, or None for an unknown, malformed or revoked key."""
        if not token.startswith(_PREFIX) or token.count("_") < 2:
            return None
        key_id = token[len(_PREFIX) :].split("_", 1)[0]
        with self._lock:
            rec = self._load().get(key_id)
        if rec is None or rec.revoked_at is not None or not hmac.compare_digest(rec.hash, _hash(token)):
            return None
        if not rec.admin and not _usable(rec.agent):
            return None  # a key made before reserved ids were refused: it would read the operator's trail
        return Principal(rec.agent, frozenset(rec.groups), rec.admin, rec.id), rec


def _usable(agent: str) -> bool:
    try:
        check_agent_id(agent)
    except ValidationError:
        return False
    return True


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
