"""The HTTP service: REST API under ``/v1``, MCP at ``/mcp``, the dashboard at ``/ui``.

    app = create_app(Memory.open("team.db"), keys=KeyStore.beside("team.db"))
    uvicorn.run(app, host="127.0.0.1", port=8765)

Errors all have one shape, ``{"error": {"status", "code", "message"}}``, with the codes the
CLI's exit statuses stand for: the caller's mistakes are 4xx (400 malformed, 401 no key,
403 not allowed, 404 not found or not visible, 409 id exists, 422 invalid, 429 too many
requests) and the backend's failures 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from forge.engine.memory import Memory
from forge.engine.recall import Recalled
from forge.errors import ConfigError, ForgeError
from forge.server import models as m
from forge.server.auth import Authenticator, RateLimited, Unauthorized, token_from
from forge.server.edge import Edge
from forge.server.errors import error_response, status_of
from forge.server.keys import KeyStore, Principal
from forge.server.service import Service, admission_dict, event_dict
from forge.store import Filter

__all__ = ["SETTLE_S", "create_app"]

#: How long the event stream waits at a gap in the log (an entry numbered but not yet
#: committed, on PostgreSQL) before taking it for a rolled-back write and moving on.
SETTLE_S = 5.0


def _allowed(app: FastAPI, request: Request) -> list[str]:
    from starlette.routing import Match, Route

    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, Route) and route.methods:
            match, _ = route.matches({**request.scope, "method": next(iter(route.methods))})
            if match is Match.FULL:
                methods |= route.methods
    return sorted(methods)


def _unit(u: Any) -> dict[str, Any]:
    return u.to_dict()


def _recalled(r: Recalled) -> dict[str, Any]:
    return {"unit": r.unit.to_dict(), "score": r.score if math.isfinite(r.score) else 0.0, "reasons": r.reasons, "why": r.why}


def _answer(body: dict[str, Any]) -> Response:
    """A JSON answer written at once, for the recall path: a route that returns a Response
    skips FastAPI's response model (validated again in a second thread-pool hop, then dumped
    by json), which cost ~0.3 ms a recall (bench/service.py --layers). The body is built here
    from the engine's own types; its model still documents the route."""
    return Response(_dumps(body), media_type="application/json")


def _dumps(body: Any) -> bytes:
    try:
        import orjson

        return orjson.dumps(body, default=str)
    except (ImportError, TypeError):  # without orjson, or an integer past 64 bits in a unit's meta: plain json
        return json.dumps(body, separators=(",", ":"), default=str).encode()


async def current_principal(request: Request) -> Principal:
    """The caller, from its API key (or the local operator on a server without keys).

    Async on purpose: it only hashes the key and stats the key file, and a sync dependency
    would cost every request a hop through the thread pool before the endpoint's own.
    """
    found = request.scope.get("state", {}).get("principal")  # the edge checked the key before the body
    if found is not None:
        return found
    client = request.client.host if request.client else None
    return request.app.state.auth.principal(token_from(request.headers, request.cookies), client)


Who = Annotated[Principal, Depends(current_principal)]


def _no_telemetry() -> dict[str, Any]:
    """FastAPI >= 0.16x traces requests with OpenTelemetry and, with FASTAPI_OTEL_AUTO_CONFIGURE
    set, exports to OTLP endpoints from the environment. A memory server sends nothing
    anywhere it was not asked to, and the per-request spans cost time: both are off."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False, "auto_configure": False}}


def create_app(
    memory: Memory,
    *,
    keys: KeyStore | None = None,
    rate: float = 50.0,
    burst: float | None = None,
    runs_dir: str | None = None,
    capsule_secret: str | None = None,
    capsule_keyring: Any = None,
    host: str = "127.0.0.1",
    mcp: bool = True,
    dashboard: bool = True,
    close_memory: bool = False,
    clock: Any = None,
    curate_every: float | None = None,
    curate_policy: Any = None,
    workers: int = 1,
    read_audit_delay_s: float = 0.05,
    max_body: int = 8 * 2**20,
    max_import_body: int = 128 * 2**20,
    allowed_hosts: tuple[str, ...] = (),
    llm: Any = None,
    jobs: str | None = None,
) -> FastAPI:
    """The ASGI app over one Memory. ``close_memory`` closes it at shutdown (``forge serve``).

    ``curate_every`` runs a curation pass (``curate_policy``, default policy) every that many
    seconds while the app runs (:class:`forge.curate.CurationSchedule`, ``app.state.curation``).
    ``workers`` is how many processes serve this memory side by side (``forge serve
    --workers``): each then enforces its share of every key's rate, and MCP runs stateless,
    since consecutive requests of one MCP session may reach different processes.
    ``read_audit_delay_s``: see :class:`~forge.server.service.Service`.
    ``max_body`` caps a request body in bytes (``max_import_body`` for ``/v1/import``): a
    larger one is answered 413 without being read. ``allowed_hosts``: Host names a server
    without keys answers to beyond loopback and ``host`` (:mod:`forge.server.edge`).
    ``jobs`` is where learning jobs wait (:class:`~forge.server.learning.Learning`): a file
    for huey's SQLite queue (default: beside the store) or a ``redis://`` URL.
    """
    for name, value in (("max_body", max_body), ("max_import_body", max_import_body)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive number of bytes")
    service = Service(memory, runs_dir=runs_dir, capsule_secret=capsule_secret, capsule_keyring=capsule_keyring,
                      read_audit_delay_s=read_audit_delay_s, llm=llm)
    auth = Authenticator(keys, rate=rate, burst=burst, share=workers, **({"clock": clock} if clock else {}))
    from forge.server.learning import Learning, peers_from

    learning = Learning(service, queue=jobs, peers=peers_from(keys), llm=llm)
    mcp_server = None
    if mcp:
        from forge.server.mcp import build_mcp, http_principal

        mcp_server = build_mcp(service, lambda ctx: http_principal(auth, ctx), learning)

    curation = None
    if curate_every is not None:
        from forge.curate.schedule import CurationSchedule

        curation = CurationSchedule(memory, every_s=curate_every, policy=curate_policy)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if mcp_server is not None:
                await stack.enter_async_context(mcp_server.session_manager.run())
            if curation is not None:
                curation.start()
            learning.start()
            try:
                yield
            finally:
                learning.stop()
                if curation is not None:
                    curation.stop()
                service.close()  # the last read records, before the memory closes
                if close_memory:
                    memory.close()

    app = FastAPI(
        title="FORGE memory service",
        version="0.1.0",
        description="Shared, scoped, audited memory for LLM agents. Authenticate with 'Authorization: Bearer <key>'.",
        lifespan=lifespan,
        responses={code: m.ERRORS[code] for code in (400, 401, 403, 404, 409, 413, 421, 422, 429, 500, 503)},
        docs_url=None,  # served offline by forge.server.docs, not from a CDN
        redoc_url=None,
        **_no_telemetry(),
    )
    from forge.server.docs import mount_docs

    mount_docs(app, title="FORGE memory service")
    app.state.service = service
    app.state.auth = auth
    app.state.curation = curation
    app.state.learning = learning
    app.add_middleware(Edge, auth=auth, hosts=(host, *allowed_hosts), max_body=max_body, bigger={"/v1/import": max_import_body})

    # -- errors: one shape ---------------------------------------------------------------
    @app.exception_handler(ForgeError)
    async def _forge_error(request: Request, exc: ForgeError) -> JSONResponse:
        status, code = status_of(exc)
        return error_response(status, code, str(exc))

    @app.exception_handler(Unauthorized)
    async def _unauthorized(request: Request, exc: Unauthorized) -> JSONResponse:
        return error_response(401, "unauthorized", str(exc), {"WWW-Authenticate": "Bearer"})

    @app.exception_handler(RateLimited)
    async def _limited(request: Request, exc: RateLimited) -> JSONResponse:
        return error_response(429, "rate_limited", str(exc), {"Retry-After": str(max(1, math.ceil(exc.retry_after)))})

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        malformed = any(e.get("type") == "json_invalid" for e in errors)
        first = errors[0] if errors else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg", "invalid request"))
        if malformed:
            return error_response(400, "malformed", f"malformed JSON body: {first.get('msg', '')}")
        return error_response(422, "invalid", msg)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # 400: a body FastAPI could not parse at all (JSON nested past the parser's depth)
        code = {400: "malformed", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(exc.status_code, "http_error")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:  # Starlette names only the first route's methods; name every route's
            headers["Allow"] = ", ".join(_allowed(app, request))
        return error_response(exc.status_code, code, str(exc.detail), headers or None)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        return error_response(500, "internal", f"internal error: {type(exc).__name__}")

    E = m.ERRORS

    # -- meta -----------------------------------------------------------------------------
    @app.get("/v1/health", tags=["meta"])
    def health() -> dict[str, Any]:
        """Liveness; needs no key. ``pid`` tells which server process answered; ``warming``
        that its search indexes are still loading (recall works meanwhile, more slowly)."""
        return {"ok": True, "local_only": auth.local, "pid": os.getpid(),
                "warming": bool(memory.info.get("warming", False))}

    @app.get("/v1/whoami", response_model=m.WhoAmI, tags=["meta"])
    def whoami(p: Who) -> dict[str, Any]:
        return {"agent": p.agent, "groups": sorted(p.groups), "admin": p.admin, "key_id": p.key_id}

    # -- units ----------------------------------------------------------------------------
    @app.post("/v1/units", response_model=m.AddOut, status_code=201, tags=["units"], responses={k: E[k] for k in (403, 409, 422)})
    def add_units(body: m.AddIn, p: Who) -> dict[str, Any]:
        """Add a batch of units in one transaction, through admission unless ``admit`` is false;
        ``admission`` says per unit what was done (added / merged into X / updated X)."""
        decisions = service.write(p, [u.data() for u in body.units], admit=body.admit)
        return {"ids": [d.unit_id for d in decisions], "admission": [admission_dict(d) for d in decisions]}

    @app.get("/v1/units", response_model=m.UnitPage, tags=["units"], responses={422: E[422]})
    def list_units(
        p: Who,
        kind: Annotated[list[m.KindName], Query()] = [],  # noqa: B006
        status: Annotated[list[m.StatusName], Query()] = [],  # noqa: B006
        tag: Annotated[list[str], Query(max_length=200)] = [],  # noqa: B006
        owner: Annotated[str | None, Query(max_length=200)] = None,
        scope: Annotated[str | None, Query(max_length=200)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    ) -> dict[str, Any]:
        f = Filter.make(kinds=kind, status=status or None, tags_all=tag, owner=owner, scopes=[scope] if scope else [])
        units, total = service.list(p, filter=f, limit=limit, offset=offset)
        return {"units": [_unit(u) for u in units], "total": total, "limit": limit, "offset": offset}

    @app.get("/v1/units/{unit_id}", response_model=m.UnitOut, tags=["units"], responses={404: E[404]})
    def get_unit(unit_id: str, p: Who) -> dict[str, Any]:
        return _unit(service.get(p, unit_id))

    @app.patch("/v1/units/{unit_id}", response_model=m.UnitOut, tags=["units"], responses={k: E[k] for k in (403, 404, 422)})
    def update_unit(unit_id: str, body: m.UnitPatch, p: Who) -> dict[str, Any]:
        changes = body.model_dump(exclude_none=True)
        return _unit(service.update(p, unit_id, changes))

    @app.post("/v1/units/{unit_id}/status", response_model=m.UnitOut, tags=["units"], responses={k: E[k] for k in (403, 404, 422)})
    def set_status(unit_id: str, body: m.StatusIn, p: Who) -> dict[str, Any]:
        """Change status with a reason: archive (forget), approve or reject from quarantine."""
        return _unit(service.set_status(p, unit_id, body.status, reason=body.reason))

    @app.delete("/v1/units/{unit_id}", response_model=m.ErasedOut, tags=["units"], responses={k: E[k] for k in (403, 404, 422)})
    def erase_unit(unit_id: str, p: Who, reason: Annotated[str, Query(min_length=1, max_length=1000)]) -> dict[str, Any]:
        """Erase a unit for good (admin; the right to erasure): its content, vector, keyword
        postings, relations and history text go; one ``erase`` event says who, when and why.
        To forget a unit and keep its history, set its status to ``archived`` instead."""
        return service.erase(p, unit_id, reason=reason)

    @app.get("/v1/units/{unit_id}/relations", response_model=list[m.RelationOut], tags=["units"], responses={404: E[404]})
    def unit_relations(unit_id: str, p: Who) -> list[dict[str, Any]]:
        return [r.to_dict() for r in service.relations(p, unit_id)]

    @app.get("/v1/units/{unit_id}/history", response_model=m.EventPage, tags=["units"], responses={404: E[404]})
    def unit_history(unit_id: str, p: Who) -> dict[str, Any]:
        return {"events": [event_dict(e) for e in service.history(p, unit_id)]}

    @app.get("/v1/units/{unit_id}/trace", tags=["units"], responses={404: E[404]})
    def unit_trace(unit_id: str, p: Who) -> dict[str, Any]:
        """Provenance: episodes, derived-from units, broadcast, corroborations, promotion, history."""
        return service.trace(p, unit_id)

    @app.post("/v1/messages", response_model=m.MessagesOut, status_code=201, tags=["units"], responses={k: E[k] for k in (403, 422, 502)})
    def add_messages(body: m.MessagesIn, p: Who) -> dict[str, Any]:
        """Remember a conversation: the server's LLM extracts candidate facts, preferences and
        rules (under a JSON-schema grammar), each with why and the turns that state it; those
        grounded in the turns go through admission. Every candidate comes back, with
        admission's decision or why it was skipped."""
        got = service.add_messages(p, [t.model_dump() for t in body.messages], scope=body.scope, admit=body.admit)
        return got.to_dict()

    # -- recall ---------------------------------------------------------------------------
    @app.post("/v1/recall", response_model=m.RecallOut, tags=["recall"], responses={422: E[422]})
    def recall(body: m.RecallIn, p: Who) -> Response:
        """The best units for a query that this key may see, each with why it was returned."""
        results = service.recall(p, body.query, k=body.k, filter=body.filter.build(), hops=body.hops, touch=body.touch,
                                 min_score=body.min_score)
        return _answer({"results": [_recalled(r) for r in results], "recall_id": getattr(results, "recall_id", "")})

    @app.post("/v1/context", response_model=m.ContextOut, tags=["recall"], responses={422: E[422]})
    def context(body: m.ContextReq, p: Who) -> Response:
        """Recall packed into a prompt block of at most ``budget`` tokens."""
        packed = service.context(p, body.query, budget=body.budget, k=body.k, filter=body.filter.build(), hops=body.hops,
                                 min_score=body.min_score)
        return _answer({"prompt": packed.render(), "tokens": packed.tokens, "budget": packed.budget, "units": [u.id for u in packed.units],
                        "sections": {name: [_recalled(r) for r in rs] for name, rs in packed.sections.items()},
                        "dropped": [r.unit.id for r in packed.dropped], "recall_id": packed.recall_id,
                        "rules": [{"unit_id": u.id, **rule.to_dict(), "validation": u.validation} for u, rule in packed.rules]})

    # -- learning ------------------------------------------------------------------------
    @app.post("/v1/outcomes", response_model=m.OutcomeOut, tags=["learning"], responses={k: E[k] for k in (403, 404, 409, 422)})
    def outcome(body: m.OutcomeIn, p: Who) -> dict[str, Any]:
        """How the decision a recall fed turned out: credits the units it showed (use counts,
        validation, their authors' reputations), once per recall_id, and retires rules that
        keep failing."""
        return learning.outcome(p, body.recall_id, success=body.success, score=body.score, feedback=body.feedback)

    @app.post("/v1/learn", response_model=m.JobIn, status_code=202, tags=["learning"], responses={k: E[k] for k in (403, 404, 422)})
    def learn(body: m.LearnIn, p: Who) -> dict[str, Any]:
        """Learn from a task the agent did (its trace and outcome): queued as a durable job,
        answered at once. Poll ``url`` for what was learned and which peers received it."""
        return learning.submit(p, body.trace, body.outcome)

    @app.get("/v1/jobs/{job_id}", response_model=m.JobOut, tags=["learning"], responses={404: E[404]})
    def job(job_id: str, p: Who) -> dict[str, Any]:
        """How a learning job stands: queued, running, done (with what it learned) or failed."""
        return learning.job(p, job_id)

    # -- relations, episodes --------------------------------------------------------------
    @app.post("/v1/relations", response_model=m.RelationOut, status_code=201, tags=["relations"], responses={k: E[k] for k in (404, 422)})
    def relate(body: m.RelationIn, p: Who) -> dict[str, Any]:
        return service.relate(p, body.src, body.dst, body.type, weight=body.weight, note=body.note).to_dict()

    @app.post("/v1/episodes", response_model=m.IdOut, status_code=201, tags=["episodes"], responses={k: E[k] for k in (403, 409, 422)})
    def add_episode(body: m.EpisodeIn, p: Who) -> dict[str, Any]:
        return {"id": service.add_episode(p, body.model_dump(exclude_none=True))}

    @app.get("/v1/episodes/{episode_id}", response_model=m.EpisodeOut, tags=["episodes"], responses={404: E[404]})
    def get_episode(episode_id: str, p: Who) -> dict[str, Any]:
        return service.get_episode(p, episode_id).to_dict()

    # -- bulk -----------------------------------------------------------------------------
    @app.get("/v1/export", tags=["bulk"], response_class=StreamingResponse, responses={403: E[403], 200: {"content": {"application/x-ndjson": {}}}})
    def export(p: Who) -> StreamingResponse:
        """Every unit (with its vector), relation and episode as JSON lines (admin)."""
        records = service.export(p)

        def lines() -> Iterator[bytes]:
            for rec in records:
                yield (json.dumps(rec, sort_keys=True) + "\n").encode()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.post("/v1/import", response_model=m.CountOut, tags=["bulk"], responses={k: E[k] for k in (400, 403, 404, 409, 413, 422)})
    def import_records(p: Who, body: Annotated[str, Body(media_type="application/x-ndjson")] = "",
                       include_history: bool = False) -> dict[str, Any]:
        """JSON lines as written by export; one transaction: every record lands or none does (admin).
        Audit events and settings (reputations) are refused unless ``include_history=true``."""
        from forge.errors import ValidationError

        records = []
        for n, line in enumerate(body.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except (ValueError, RecursionError) as exc:  # RecursionError: nested past the parser's depth
                    raise ValidationError(f"line {n}: malformed JSON ({type(exc).__name__}: {exc})"[:300]) from None
        return {"records": service.import_records(p, records, history=include_history)}

    @app.get("/v1/stats", tags=["meta"])
    def stats(p: Who) -> dict[str, Any]:
        """Counts by kind, status and scope (an agent's counts cover what it may see)."""
        return service.stats(p)

    # -- audit ----------------------------------------------------------------------------
    @app.get("/v1/events", response_model=m.EventPage, tags=["audit"], responses={403: E[403]})
    def events(
        p: Who,
        since_seq: Annotated[int, Query(ge=0, le=2**62)] = 0,
        unit_id: Annotated[str | None, Query(max_length=128)] = None,
        actor: Annotated[str | None, Query(max_length=200)] = None,
        op: Annotated[list[str], Query(max_length=50)] = [],  # noqa: B006
        since: Annotated[float | None, Query(ge=0, le=1e11)] = None,
        until: Annotated[float | None, Query(ge=0, le=1e11)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        newest_first: bool = False,
    ) -> dict[str, Any]:
        """The audit log: who did what to which unit, when and why. Agents see their own entries."""
        evs = service.events(p, since_seq=since_seq, unit_id=unit_id, actor=actor, ops=op, since=since, until=until, limit=limit, newest_first=newest_first)
        return {"events": [event_dict(e) for e in evs]}

    @app.get("/v1/events/stream", tags=["audit"], response_class=StreamingResponse, responses={200: {"content": {"text/event-stream": {}}}})
    async def event_stream(
        request: Request,
        p: Who,
        since_seq: Annotated[int, Query(ge=0, le=2**62)] = 0,
        max_events: Annotated[int, Query(ge=1, le=1_000_000)] = 1_000_000,
        poll_s: Annotated[float, Query(ge=0.05, le=10)] = 0.5,
        timeout_s: Annotated[float, Query(gt=0, le=86_400)] = 3600,
    ) -> StreamingResponse:
        """New audit entries as server-sent events, as they are written (an agent: its own).

        The stream ends after ``max_events`` entries or ``timeout_s`` seconds, or once its key
        is revoked; reconnect with ``since_seq`` set to the last ``id`` received.

        Entries are sent in log order, each once. PostgreSQL numbers an entry when it is
        written, not when its transaction commits, so with concurrent writers entry 11 may be
        visible before entry 10: the stream waits at such a gap until it fills, or until the
        entry after it is ``SETTLE_S`` old (a rolled-back write leaves a number unused).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        token = token_from(request.headers, request.cookies)
        operator = Principal.local()

        def next_batch(seq: int, limit: int) -> tuple[list[Any], int] | None:
            """The caller's entries after ``seq`` up to the settled position, and that position;
            None once the caller's key no longer holds (checked after the read, so nothing
            written after a revocation is sent)."""
            log = service.events(operator, since_seq=seq, limit=500)  # every actor's: where the gaps are
            settled, expect, now = seq, seq + 1, time.time()
            for e in log:
                if e.seq != expect and now - e.ts < SETTLE_S:
                    break  # an earlier entry may still be committing
                settled, expect = e.seq, e.seq + 1
            batch = [e for e in (log if p.admin else service.events(p, since_seq=seq, limit=limit)) if e.seq <= settled][:limit]
            if len(batch) == limit:
                settled = batch[-1].seq
            if auth.local:
                return (batch, settled) if p.key_id == "local" else None
            found = auth.keys.authenticate(token) if token and auth.keys is not None else None
            return (batch, settled) if found is not None and found[0].key_id == p.key_id else None

        async def gen() -> AsyncIterator[bytes]:
            seq, sent = since_seq, 0
            while sent < max_events and loop.time() < deadline:
                got = await run_in_threadpool(next_batch, seq, min(500, max_events - sent))
                if got is None:
                    return
                batch, settled = got
                for e in batch:
                    sent += 1
                    yield f"id: {e.seq}\nevent: {e.op}\ndata: {json.dumps(event_dict(e))}\n\n".encode()
                if settled == seq:
                    if await request.is_disconnected():
                        return
                    await asyncio.sleep(poll_s)
                seq = settled

        return StreamingResponse(gen(), media_type="text/event-stream")

    @app.get("/v1/audit/seen", response_model=m.SeenOut, tags=["audit"], responses={403: E[403]})
    def seen(
        p: Who,
        agent: Annotated[str, Query(min_length=1, max_length=200)],
        before: Annotated[float | None, Query(ge=0, le=1e11)] = None,
    ) -> dict[str, Any]:
        """Which memories ``agent`` was shown before time ``before`` (a decision), and why."""
        return {"agent": agent, "before": before, "units": service.seen(p, agent, before=before)}

    # -- exchange -------------------------------------------------------------------------
    @app.post("/v1/capsules", tags=["exchange"], responses={k: E[k] for k in (403, 422)})
    def receive(p: Who, capsule: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        """Receive a signed capsule through the calling agent's exchange; returns the decision."""
        return service.receive(p, capsule)

    @app.get("/v1/quarantine", response_model=list[m.UnitOut], tags=["exchange"])
    def quarantine(p: Who, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[dict[str, Any]]:
        return [_unit(u) for u in service.quarantine(p, limit=limit)]

    # -- runs -----------------------------------------------------------------------------
    @app.get("/v1/runs", tags=["runs"])
    def runs(p: Who) -> list[dict[str, Any]]:
        """Run directories under the server's --runs folder."""
        return service.runs(p)

    # A run may be nested one level (the quick demo's quick-demo-<stamp>/forge): names are paths;
    # the report's route comes first, or the summary's would take ".../report" as a name.
    @app.get("/v1/runs/{name:path}/report", tags=["runs"], responses={200: {"content": {"text/html": {"schema": {"type": "string"}}}}, 404: E[404]})
    def run_report(name: str, p: Who) -> HTMLResponse:
        return HTMLResponse(service.run_report(p, name))

    @app.get("/v1/runs/{name:path}", tags=["runs"], responses={404: E[404]})
    def run_summary(name: str, p: Who) -> dict[str, Any]:
        return service.run(p, name)

    @app.get("/", include_in_schema=False)
    def root() -> Response:
        return Response(status_code=307, headers={"Location": "/ui/" if dashboard else "/docs"})

    if dashboard:
        from forge.server.dashboard import mount_dashboard

        mount_dashboard(app, service, auth)

    if mcp_server is not None:
        from forge.server.mcp import guard

        async def unrouted(scope: Any, receive: Any, send: Any) -> None:
            """Paths the MCP mount (the fallback at "/") catches: 405 where a route has the path."""
            allowed = _allowed(app, Request(scope))
            if allowed:
                await error_response(405, "method_not_allowed", "Method Not Allowed", {"Allow": ", ".join(allowed)})(scope, receive, send)
            else:
                await error_response(404, "not_found", f"no route {scope.get('path', '')}")(scope, receive, send)

        mcp_app = mcp_server.streamable_http_app(streamable_http_path="/mcp", host=host, stateless_http=workers > 1)
        app.mount("/", guard(mcp_app, auth, unrouted=unrouted))

    return app
