"""What every request passes before it reaches a route (one ASGI layer around the app).

- **The Host header, in local mode.** A server without keys trusts whoever reaches it on
  loopback, so a web page whose name was re-pointed at 127.0.0.1 (DNS rebinding) could read
  it from the browser. Without keys only loopback names and the bound address are answered;
  any other Host gets 421.
- **No request from another origin's page.** A browser names the page that sent a request
  (``Sec-Fetch-Site``, ``Origin``). ``/v1`` refuses one sent by a page on another origin,
  another port or a sibling subdomain included (they are the same *site*, so ``SameSite``
  cookies do not stop them), with 403: a server without keys would otherwise take a form a
  web page posts to 127.0.0.1 as its operator's. API clients send neither header.
- **The dashboard's cookie, only from the dashboard.** ``/v1`` authenticated by the
  ``forge_key`` cookie (no ``Authorization`` or ``X-API-Key`` header) needs a same-origin
  request (``Sec-Fetch-Site: same-origin``, else an ``Origin`` or ``Referer`` naming this
  host) that carries ``X-Forge-Request`` (or htmx's ``HX-Request``), a header no cross-site
  form can send. Bearer and API-key callers are unaffected.
- **The key, before the body.** ``/v1`` requests are authenticated from their headers before
  a byte of the body is read: an unauthenticated 300 MB upload gets its 401 at once, and an
  agent key posting to the admin-only import gets its 403 the same way. The principal found
  is handed to the route (``scope["state"]["principal"]``), so a request is rate-counted once.
- **An internal error keeps the connection.** A crash inside a route answers the usual 500
  JSON and is logged; it is not re-raised to the server, which would reset the keep-alive
  connection and fail the caller's next request too.

- **Headers a browser obeys.** Every answer says ``X-Content-Type-Options: nosniff``; the
  dashboard's pages also carry a Content-Security-Policy (scripts, styles and requests from
  this server only, no framing, forms posting only here) and ``X-Frame-Options: DENY``.
- **A cap on bodies.** A body larger than ``max_body`` bytes (a few paths may have a
  bigger cap) is answered 413: at once when its Content-Length says so, else as soon as
  that many bytes have arrived, never buffered whole. (FastAPI's own ``max_body_size``
  would answer in plain text, outside the one error shape.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import cookie_parser

from forge.server.auth import Authenticator, RateLimited, Unauthorized, token_from
from forge.server.errors import error_response

__all__ = ["LOOPBACK_NAMES", "Edge", "TooLarge", "host_name"]

_log = logging.getLogger("forge.server")

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

#: Host names a local-mode server answers to, besides the address it is bound to.
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
#: Paths under /v1 that need no key.
_PUBLIC = frozenset({"/v1/health"})
#: Paths only an admin key may call (refused before their body is read).
_ADMIN_ONLY = frozenset({"/v1/import"})
#: Headers on every answer, and on the dashboard's (``/ui``) answers besides.
_ALWAYS = [(b"x-content-type-options", b"nosniff")]
_PAGES = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
     b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]


def host_name(value: str) -> str:
    """The name part of a Host header: ``[::1]:8765`` -> ``::1``, ``Example.org:80`` -> ``example.org``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value  # a bare name, or an unbracketed IPv6 address (no port can be told apart)


class Edge:
    """The ASGI layer described in the module docstring, around ``app``.

    ``hosts``: extra Host names a local-mode server answers to (the bound ``--host`` is
    always one); a server with keys answers any Host, since every request needs a key.
    """

    def __init__(
        self, app: ASGIApp, auth: Authenticator, *, hosts: Iterable[str] = (), max_body: int = 8 * 2**20,
        bigger: Mapping[str, int] | None = None,
    ) -> None:
        self.app = app
        self.auth = auth
        self.hosts = LOOPBACK_NAMES | {host_name(h) for h in hosts if h and h not in ("0.0.0.0", "::")}
        self.max_body = max_body
        self.bigger = dict(bigger or {})

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            if scope["type"] == "http":
                await refusal(scope, receive, send)
            else:
                await send({"type": "websocket.close", "code": 1008})
            return
        limit = self.bigger.get(scope.get("path", ""), self.max_body)
        started, received = False, 0
        extra = _ALWAYS + (_PAGES if scope.get("path", "").startswith("/ui") else [])

        async def tracked(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                present = {k.lower() for k, _ in message.get("headers", ())}
                message = {**message, "headers": [*message.get("headers", ()), *(h for h in extra if h[0] not in present)]}
            await send(message)

        async def capped() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise TooLarge(limit)
            return message

        if scope["type"] == "http" and _declared(headers) > limit:
            await _too_large(limit)(scope, receive, send)
            return
        try:
            await self.app(scope, capped if scope["type"] == "http" else receive, tracked)
        except Exception as exc:
            if started or scope["type"] != "http" or (_passes_through(exc) and not isinstance(exc, TooLarge)):
                raise
            if isinstance(exc, TooLarge):
                await _too_large(limit)(scope, receive, send)
                return
            _log.error("internal error on %s %s", scope.get("method"), scope.get("path"), exc_info=exc)
            await error_response(500, "internal", f"internal error: {type(exc).__name__}")(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> Any:
        """The response that ends this request before the app sees it, or None."""
        local = self.auth.local
        host = headers.get("host")
        if local and host is not None and host_name(host) not in self.hosts:
            return error_response(421, "misdirected", f"this server without API keys answers only to {', '.join(sorted(self.hosts))}; "
                                  f"not to Host {host[:100]!r} (create a key with 'forge keys create' to serve other names)")
        path = scope.get("path", "")
        if not path.startswith("/v1/") or path in _PUBLIC:
            return None
        foreign = _foreign(headers)
        if foreign is not None:
            return error_response(403, "forbidden", f"/v1 answers no request sent by a page on another origin ({foreign}); "
                                  "call it from a program with 'Authorization: Bearer <key>'")
        if _by_cookie(headers) and not (_same_origin(headers) and _marked(headers)):
            return error_response(403, "forbidden", "/v1 takes the dashboard's cookie only from the dashboard's own pages: a same-origin "
                                  "request with the X-Forge-Request header; programs send 'Authorization: Bearer <key>'")
        client = scope.get("client")
        try:
            principal = self.auth.principal(token_from(headers, _cookies(headers)), client[0] if client else None)
        except Unauthorized as exc:
            return error_response(401, "unauthorized", str(exc), {"WWW-Authenticate": "Bearer"})
        except RateLimited as exc:
            return error_response(429, "rate_limited", str(exc), {"Retry-After": str(max(1, math.ceil(exc.retry_after)))})
        if path in _ADMIN_ONLY and not principal.admin and scope.get("method") == "POST":
            return error_response(403, "forbidden", f"only an admin key can call {path}")
        scope.setdefault("state", {})["principal"] = principal
        return None


class TooLarge(HTTPException):
    """A body passed its cap while it was read (an HTTPException, so FastAPI's body reading
    lets it through to the app's handler, which answers 413 in the one error shape)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, _too_large_message(limit))


def _too_large_message(limit: int) -> str:
    return (f"the request body is larger than this server accepts ({limit:,} bytes); send less at once "
            "(split the batch), or start the server with a larger --max-body-mb")


def _too_large(limit: int) -> Any:
    return error_response(413, "too_large", _too_large_message(limit), {"Connection": "close"})


def _declared(headers: Mapping[str, str]) -> int:
    """The body size a request declares (0 when it declares none or nonsense)."""
    try:
        return max(0, int(headers.get("content-length", "0")))
    except ValueError:
        return 0


def _cookies(headers: dict[str, str]) -> dict[str, str]:
    return cookie_parser(headers.get("cookie", ""))  # the parser Request.cookies uses


def _foreign(headers: Mapping[str, str]) -> str | None:
    """The header that says a page on another origin sent this request, or None."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):  # none: typed into the address bar
        return f"Sec-Fetch-Site: {site[:40]}"
    origin = headers.get("origin")
    if origin is not None and not _names_host(origin, headers.get("host")):
        return f"Origin: {origin[:100]}"
    return None


def _names_host(url: str | None, host: str | None) -> bool:
    """Whether ``url`` (an Origin or Referer) is on this request's Host (``null`` is no origin)."""
    from urllib.parse import urlsplit

    if not url or not host or url == "null":
        return False
    return urlsplit(url).netloc.lower() == host.strip().lower()


def _same_origin(headers: Mapping[str, str]) -> bool:
    if headers.get("sec-fetch-site") == "same-origin":
        return True
    return _names_host(headers.get("origin") or headers.get("referer"), headers.get("host"))


def _marked(headers: Mapping[str, str]) -> bool:
    """A header a page's own script adds and a cross-site form cannot."""
    return bool(headers.get("x-forge-request")) or headers.get("hx-request") == "true"


def _by_cookie(headers: Mapping[str, str]) -> bool:
    """Whether the key would come from the dashboard's cookie (no header names one)."""
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer ") and auth[7:].strip() or headers.get("x-api-key"):
        return False
    return bool(_cookies(dict(headers)).get("forge_key"))


def _passes_through(exc: BaseException) -> bool:
    """Exceptions an outer layer answers itself (FastAPI's body limit sends its own 413)."""
    if isinstance(exc, HTTPException):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_passes_through(e) for e in exc.exceptions)
    return False
