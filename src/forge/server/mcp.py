"""The MCP server: FORGE memory as tools and resources for coding and desktop agents.

Tools: ``remember``, ``recall``, ``context``, ``relate``, ``forget`` (archive), ``erase``
(for good, admin), ``trace`` (provenance), ``stats``, and the learning door's ``feedback``
(credit a recall) and ``learn`` (reflect on a task and share what holds). Resources: ``forge://units/{id}``, ``forge://units`` (oldest first, ``?limit=``),
``forge://runs`` and ``forge://runs/{name}``. Every tool calls the same
:class:`~forge.server.service.Service` method the REST API does, so scope, audit and
ownership rules are the same.

Over HTTP (mounted at ``/mcp`` by ``forge serve``) the caller is the API key in the
``Authorization`` header; over stdio (``forge mcp``) it is the key in ``FORGE_API_KEY``,
or the local operator when the store has no keys.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from starlette.responses import JSONResponse

from forge.errors import ForgeError
from forge.server.auth import Authenticator, RateLimited, Unauthorized, token_from
from forge.server.errors import error_response, status_of
from forge.server.keys import Principal
from forge.server.learning import Learning
from forge.server.service import Service, admission_dict
from forge.store import Filter

__all__ = ["build_mcp", "guard", "http_principal"]


def build_mcp(service: Service, principal: Callable[[Context], Principal], learning: Learning | None = None) -> MCPServer:
    """An MCP server over ``service``; ``principal(ctx)`` says who each call is from;
    ``learning`` (the service's learning door) serves the ``learn`` and ``feedback`` tools."""
    read = _Reported(service, error=ResourceError)  # resources report errors as resource errors (a ToolError there is a crash)
    reader = _reported(principal, error=ResourceError)
    service = _Reported(service)  # type: ignore[assignment]
    principal = _reported(principal)
    server = MCPServer(
        "forge",
        instructions="Shared long-term memory. recall before acting; remember what you learn; forget what is wrong.",
        log_level="WARNING",
    )

    @server.tool()
    def remember(content: str, ctx: Context, kind: str = "fact", tags: list[str] | None = None, scope: str = "global",
                 domain: str = "", confidence: float = 0.5, importance: float = 0.5, admit: bool = True) -> dict[str, Any]:
        """Store one memory (kind: fact, rule, lesson, example, preference, procedure, profile, episode).

        A duplicate is merged into the memory already stored and a newer contradicting one
        updates it (admission; admit=false stores it as given): ``summary`` says which, ``id``
        is the memory that holds it now."""
        unit = {"content": content, "kind": kind, "scope": scope, "confidence": confidence, "importance": importance,
                "context": {"domain": domain, "tags": list(tags or [])}}
        [d] = service.write(principal(ctx), [unit], admit=admit)
        return {"id": d.unit_id, **admission_dict(d)}

    @server.tool()
    def remember_messages(messages: list[dict[str, str]], ctx: Context, scope: str = "global", admit: bool = True) -> dict[str, Any]:
        """Remember a conversation ([{"role": "user", "content": "..."}, ...]): the server's LLM
        extracts facts, preferences and rules, each with why; those grounded in the turns are
        admitted. Returns every candidate with its decision or why it was skipped."""
        return service.add_messages(principal(ctx), messages, scope=scope, admit=admit).to_dict()

    @server.tool()
    def recall(query: str, ctx: Context, k: int = 5, kinds: list[str] | None = None, tags: list[str] | None = None,
               min_score: float = 0.0) -> list[dict[str, Any]]:
        """The memories that best match the query, best first, each with why it was returned;
        scores are 0-1, and none below ``min_score`` is returned."""
        f = Filter.make(kinds=kinds or (), tags_all=tags or ())
        return [{"id": r.unit.id, "kind": r.unit.kind.value, "content": r.unit.content, "score": round(r.score, 6), "reasons": r.reasons}
                for r in service.recall(principal(ctx), query, k=k, filter=f, min_score=min_score)]

    @server.tool()
    def context(query: str, ctx: Context, budget: int = 400) -> str:
        """Relevant memories packed into a prompt block of at most ``budget`` tokens. Its last
        line names the recall (``recall_id: ...``): pass it to ``feedback`` or ``learn`` once
        you know how the work it fed turned out."""
        packed = service.context(principal(ctx), query, budget=budget)
        return packed.render() + (f"\n\nrecall_id: {packed.recall_id}" if packed.recall_id else "")

    if learning is not None:
        door = _Reported(learning)  # type: ignore[arg-type]

        @server.tool()
        def feedback(recall_id: str, ctx: Context, success: bool | None = None, score: float | None = None,
                     feedback: str = "") -> dict[str, Any]:
            """How the work a recall fed turned out (success and/or a 0-1 score): credits the
            memories it showed, once; memories that keep failing are retired."""
            return door.outcome(principal(ctx), recall_id, success=success, score=score, feedback=feedback)  # type: ignore[no-any-return]

        @server.tool()
        def learn(task: str, ctx: Context, steps: list[dict[str, Any]] | None = None, answer: str = "", kind: str = "",
                  recall_ids: list[str] | None = None, success: bool | None = None, score: float | None = None,
                  feedback: str = "", wait: float = 60.0) -> dict[str, Any]:
            """Learn from a task you did: its steps ({"type": "tool", "tool": ..., "args": {...},
            "error": ...}, or type message/observation/answer with "content"), its outcome and
            feedback. Rules in terms that recur (tools, error kinds, the task's kind) are kept and
            shared with your group; ids, names and numbers of this one case are refused. Waits up
            to ``wait`` seconds for the result (what was learned, who received it)."""
            who = principal(ctx)
            trace = {"task": task, "kind": kind, "steps": steps or [], "answer": answer, "recall_ids": recall_ids or []}
            job = door.submit(who, trace, {"success": success, "score": score, "feedback": feedback})
            end = time.monotonic() + max(0.0, min(wait, 600.0))
            while time.monotonic() < end:
                got = door.job(who, job["job_id"])
                if got["status"] in ("done", "failed"):
                    return got  # type: ignore[no-any-return]
                time.sleep(0.05)
            return door.job(who, job["job_id"])  # type: ignore[no-any-return]

    @server.tool()
    def relate(src: str, dst: str, ctx: Context, type: str = "related_to", note: str = "") -> dict[str, Any]:
        """Link two memories (related_to, supports, contradicts, supersedes, derived_from, prerequisite_of, duplicate_of)."""
        return service.relate(principal(ctx), src, dst, type, note=note).to_dict()

    @server.tool()
    def forget(unit_id: str, reason: str, ctx: Context) -> dict[str, Any]:
        """Archive a memory: it is no longer recalled, but kept with the reason for history."""
        unit = service.set_status(principal(ctx), unit_id, "archived", reason=reason)
        return {"id": unit.id, "status": unit.status.value}

    @server.tool()
    def erase(unit_id: str, reason: str, ctx: Context) -> dict[str, Any]:
        """Erase a memory for good (admin keys only; the right to erasure): its text, vector,
        links and history go, one tombstone event says who, when and why. Use forget to archive."""
        return service.erase(principal(ctx), unit_id, reason=reason)

    @server.tool()
    def trace(unit_id: str, ctx: Context) -> dict[str, Any]:
        """Where a memory came from: episodes, parent units, broadcast, corroborations and history."""
        return service.trace(principal(ctx), unit_id)

    @server.tool()
    def stats(ctx: Context) -> dict[str, Any]:
        """How many memories there are, by kind and status (those this caller may see)."""
        return service.stats(principal(ctx))

    @server.resource("forge://units/{unit_id}", mime_type="application/json")
    def unit(unit_id: str, ctx: Context) -> str:
        """One memory unit."""
        return json.dumps(read.get(reader(ctx), unit_id).to_dict())

    @server.resource("forge://units{?limit}", mime_type="application/json")
    def units(ctx: Context, limit: int = 100) -> str:
        """The oldest active memories this caller may see (``limit``, default 100)."""
        found, _ = read.list(reader(ctx), limit=max(1, min(int(limit), 1000)))
        return json.dumps([u.to_dict() for u in found])

    @server.resource("forge://runs{?limit}", mime_type="application/json")
    def runs(ctx: Context, limit: int = 1000) -> str:
        """Evolution runs under the server's runs folder."""
        return json.dumps(read.runs(reader(ctx))[: max(1, int(limit))])

    @server.resource("forge://runs/{name}", mime_type="application/json")
    def run(name: str, ctx: Context) -> str:
        """One finished run's summary (learning curve, returns, tokens)."""
        return json.dumps(read.run(reader(ctx), name))

    return server


class _Reported:
    """The service, with FORGE's errors turned into tool errors the calling model can read
    (``error=ResourceError`` for resources: the SDK treats any other error raised by a
    resource as a crash, logs its traceback and tells the client only the URI)."""

    def __init__(self, service: Service, error: type[Exception] = ToolError) -> None:
        self._service = service
        self._error = error

    def __getattr__(self, name: str) -> Any:
        return _reported(getattr(self._service, name), error=self._error)


def _reported(fn: Callable[..., Any], error: type[Exception] = ToolError) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ForgeError, Unauthorized, RateLimited) as exc:
            status, code = status_of(exc)
            kind = ResourceNotFoundError if error is ResourceError and status == 404 else error
            raise kind(f"{code}: {exc}") from None

    return call


_SESSIONS = 100_000  # session owners remembered (the oldest forgotten first)


def _claiming(send: Any, owners: dict[str, str], key_id: str) -> Any:
    """``send``, noting the session id an answer opens as ``key_id``'s."""

    async def claim(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            for k, v in message.get("headers", ()):
                if k.lower() == b"mcp-session-id":
                    owners[v.decode("latin-1")] = key_id
                    while len(owners) > _SESSIONS:
                        owners.pop(next(iter(owners)))
        await send(message)

    return claim


def http_principal(auth: Authenticator, ctx: Context) -> Principal:
    """The caller of an MCP request that came over HTTP (the guard already let it in)."""
    headers = {k.lower(): v for k, v in (ctx.headers or {}).items()}
    request = getattr(ctx.request_context, "request", None)
    client = getattr(getattr(request, "client", None), "host", None)
    if auth.local:
        return Principal.local()
    token = token_from(headers)
    found = auth.keys.authenticate(token) if token and auth.keys is not None else None
    if found is None:
        raise Unauthorized("unknown or revoked API key")
    del client
    return found[0]


def guard(app: Any, auth: Authenticator, *, unrouted: Any = None) -> Any:
    """ASGI wrapper: MCP over HTTP needs the same key (and obeys the same rate limit) as REST.

    A session (a server of one process keeps them) belongs to the key that opened it: a
    request naming another key's session id is answered as for an unknown session (404), so
    holding an id lets no one close that session or take its stream.

    Mounted at the root as the fallback route, it hands every other path to ``unrouted``
    (the app's 404 or 405), or answers 404.
    """
    owners: dict[str, str] = {}  # session id -> the key id that opened it (the newest _SESSIONS kept)

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not scope.get("path", "").startswith("/mcp"):
            if unrouted is not None:
                await unrouted(scope, receive, send)
            else:
                await error_response(404, "not_found", f"no route {scope.get('path', '')}")(scope, receive, send)
            return
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            client = scope.get("client")
            try:
                who = auth.principal(token_from(headers), client[0] if client else None)
            except Unauthorized as exc:
                await error_response(401, "unauthorized", str(exc), {"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
            except RateLimited as exc:
                await error_response(429, "rate_limited", str(exc), {"Retry-After": str(max(1, round(exc.retry_after)))})(scope, receive, send)
                return
            sid = headers.get("mcp-session-id")
            if sid is not None and owners.get(sid, who.key_id) != who.key_id:
                await JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}},
                                   status_code=404)(scope, receive, send)
                return
            if sid is None:
                send = _claiming(send, owners, who.key_id)
            elif scope.get("method") == "DELETE":
                owners.pop(sid, None)
        await app(scope, receive, send)

    return wrapped
