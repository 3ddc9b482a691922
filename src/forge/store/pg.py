"""Reaching PostgreSQL, one way for every part of FORGE that does (the store, the database
diagnosis env): psycopg imported only when needed, with an install hint when it is missing;
a failed connection said in one line; a DSN shown without its password."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from forge.errors import ConfigError, ForgeError, StoreError

__all__ = ["connect", "psycopg", "redact_dsn"]

# "password=x" in key=value words; also "password x", which libpq refuses and then quotes.
_KEYWORD_PASSWORD = re.compile(r"(\bpassword\b\s*=?\s*)('(?:[^'\\]|\\.)*'|[^\s=]\S*)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"((?:^|&)password=)[^&]*", re.IGNORECASE)


def psycopg() -> Any:
    """The psycopg module, or a ConfigError that says how to install it."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - depends on the install
        raise ConfigError("psycopg is not installed; install it with: pip install 'forge-memory[postgres]'") from None
    return psycopg


def redact_dsn(dsn: str) -> str:
    """``dsn`` (a ``postgresql://`` URL or ``key=value`` words) without its password, for
    messages and ``info``."""
    if "://" not in dsn:
        return _KEYWORD_PASSWORD.sub(r"\1***", dsn)
    parts = urlsplit(dsn)
    netloc = parts.netloc
    user, at, host = netloc.rpartition("@")
    name, _, secret = user.partition(":")
    if at and secret:
        netloc = f"{name}:***@{host}"
    query = _QUERY_PASSWORD.sub(r"\1***", parts.query)
    if (netloc, query) == (parts.netloc, parts.query):
        return dsn
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _passwords(dsn: str) -> set[str]:
    """The passwords written in ``dsn`` (as written and decoded), to keep them out of messages."""
    if "://" not in dsn:
        return {m.group(2).strip("'") for m in _KEYWORD_PASSWORD.finditer(dsn)} - {""}
    parts = urlsplit(dsn)
    found = {parts.password or ""} | {v for k, v in parse_qsl(parts.query) if k.lower() == "password"}
    return {p for p in found | {unquote(p) for p in found} if p}


def connect(dsn: str, *, error: type[ForgeError] = StoreError, advice: str = "", **params: Any) -> Any:
    """``psycopg.connect(dsn, autocommit=True, **params)``; when the server cannot be
    reached, ``error`` saying so in one line, with the DSN's password left out and
    ``advice`` after the reason."""
    pg = psycopg()
    params.setdefault("autocommit", True)
    try:
        return pg.connect(dsn, **params)
    except pg.Error as exc:
        reason = " ".join(str(exc).split())
        for password in _passwords(dsn):  # libpq may quote the DSN it could not parse
            reason = re.sub(rf"(?<!\w){re.escape(password)}(?!\w)", "***", reason)
        reason = reason[:300] or type(exc).__name__
        raise error(f"cannot connect to PostgreSQL at {redact_dsn(dsn)}: {reason}{advice}") from None
