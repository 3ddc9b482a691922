"""Who is calling (from the key) and whether it may call again now (per-key rate limit)."""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Mapping

from forge.server.keys import KeyStore, Principal

__all__ = ["LOOPBACK", "Authenticator", "RateLimited", "Unauthorized", "is_loopback", "token_from"]

LOOPBACK = "127.0.0.1"


class Unauthorized(Exception):
    """No key, or a key that is unknown or revoked (401)."""


class RateLimited(Exception):
    """Too many requests for this key (429); ``retry_after`` is in seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host in ("localhost", "testclient"):  # testclient: Starlette's in-process test transport
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_from(headers: Mapping[str, str], cookies: Mapping[str, str] | None = None) -> str | None:
    """The API key from ``Authorization: Bearer``, ``X-API-Key`` or the dashboard's cookie."""
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return headers.get("x-api-key") or (cookies or {}).get("forge_key") or None


class _Bucket:
    __slots__ = ("tokens", "at")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens = tokens
        self.at = at


class Authenticator:
    """Keys -> principals, plus a token bucket per key.

    Without any active key the server is in local mode: every caller is the operator, and
    only loopback callers are let in (the server also binds to 127.0.0.1 only).
    """

    def __init__(
        self, keys: KeyStore | None, *, rate: float = 50.0, burst: float | None = None, share: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``share``: how many server processes split each key's rate (``forge serve --workers``);
        each enforces its part, so together they admit about the configured rate."""
        self.keys = keys
        self.rate = rate
        self.share = max(1, int(share))
        self.burst = burst
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    @property
    def local(self) -> bool:
        return self.keys is None or not self.keys.active()

    def principal(self, token: str | None, client_host: str | None) -> Principal:
        if self.local:
            if not is_loopback(client_host):
                raise Unauthorized("this server has no API keys and answers loopback callers only")
            return Principal.local()
        if not token:
            raise Unauthorized("an API key is required: send 'Authorization: Bearer <key>'")
        found = self.keys.authenticate(token) if self.keys is not None else None
        if found is None:
            raise Unauthorized("unknown or revoked API key")
        principal, record = found
        total = record.rate or self.rate
        self._take(record.id, total / self.share, total)
        return principal

    def _take(self, key_id: str, rate: float, total: float) -> None:
        burst = self.burst / self.share if self.burst is not None else max(1.0, rate)
        now = self.clock()
        with self._lock:
            b = self._buckets.get(key_id)
            if b is None:
                b = self._buckets[key_id] = _Bucket(burst, now)
            b.tokens = min(burst, b.tokens + (now - b.at) * rate)
            b.at = now
            if b.tokens < 1.0:
                wait = (1.0 - b.tokens) / rate
                raise RateLimited(f"rate limit of {total:g} requests/s exceeded for key {key_id}; retry in {wait:.2f}s", wait)
            b.tokens -= 1.0
