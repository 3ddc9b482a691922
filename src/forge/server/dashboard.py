"""The dashboard at ``/ui``: server-rendered pages (Jinja2) with htmx for the interactive bits.

Pages: search (as any agent, for admins), a unit (relations as a graph, provenance chain,
change history), what agents learned (each rule or lesson: its author and source, who
received it, its recalls and outcomes, why it was retired; also in evolution runs), the
quarantine review queue (approve / reject with a reason, written to the audit log),
conflicts and their resolutions, agents with reputations, and runs with learning curves.
No build step, no CDN: htmx 2 (0BSD licence, from the npm package ``htmx.org``) is vendored
in ``static/``. Pages call the same :class:`Service` as the API.

The browser authenticates with the API key in a ``SameSite=Strict`` cookie set by
``/ui/login``; state-changing requests must also carry htmx's ``HX-Request`` header, which a
cross-site form cannot send. Pages link only to ``/ui``: ``/v1`` takes the cookie only from a
same-origin request with ``X-Forge-Request`` or ``HX-Request`` (:mod:`forge.server.edge`).
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, FastAPI, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from forge.curate.trace import describe, readable
from forge.errors import AccessError, ForgeError, ValidationError
from forge.server.auth import Authenticator, RateLimited, Unauthorized, token_from
from forge.server.keys import Principal
from forge.server.service import Service, event_dict
from forge.store import Filter

__all__ = ["mount_dashboard"]

_HERE = Path(__file__).parent


class _Login(Exception):
    """Send the browser to the login page."""


def _who(request: Request) -> Principal:
    client = request.client.host if request.client else None
    try:
        return request.app.state.auth.principal(token_from(request.headers, request.cookies), client)
    except Unauthorized:
        raise _Login() from None


Who = Annotated[Principal, Depends(_who)]


def mount_dashboard(app: FastAPI, service: Service, auth: Authenticator) -> None:
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    templates.env.filters["ts"] = _ts
    templates.env.globals["describe"] = describe
    templates.env.filters["readable"] = readable
    router = APIRouter(prefix="/ui", include_in_schema=False)

    def page(request: Request, name: str, p: Principal, code: int = 200, **ctx: Any) -> HTMLResponse:
        return templates.TemplateResponse(request, name, {"me": p, "local": auth.local, **ctx}, status_code=code)

    @app.exception_handler(_Login)
    async def _to_login(request: Request, exc: _Login) -> Response:
        return RedirectResponse("/ui/login", status_code=303)

    @router.get("/login", response_class=HTMLResponse)
    def login_form(request: Request, error: str = "") -> HTMLResponse:
        return templates.TemplateResponse(request, "login.html", {"me": None, "error": error, "local": auth.local})

    @router.post("/login")
    def login(request: Request, key: Annotated[str, Form(max_length=500)]) -> Response:
        if not _same_origin(request):
            return HTMLResponse("sign-in is accepted only from this server's own login page", status_code=403)
        client = request.client.host if request.client else None
        try:
            auth.principal(key.strip(), client)
        except (Unauthorized, RateLimited):
            return RedirectResponse("/ui/login?error=unknown+or+revoked+key", status_code=303)
        resp = RedirectResponse("/ui/", status_code=303)
        resp.set_cookie("forge_key", key.strip(), httponly=True, samesite="strict", path="/")
        return resp

    @router.post("/logout")
    def logout(request: Request) -> Response:
        if not _same_origin(request):
            return HTMLResponse("sign-out is accepted only from this server's own pages", status_code=403)
        resp = RedirectResponse("/ui/login", status_code=303)
        resp.delete_cookie("forge_key", path="/")
        return resp

    def viewing(p: Principal, agent: str, groups: str) -> Principal:
        """An admin may look through any agent's eyes; an agent only through its own."""
        if agent.strip() and p.admin:
            return Principal(agent.strip(), frozenset(g.strip() for g in groups.split(",") if g.strip()), False, p.key_id, by=p.actor)
        return p

    @router.get("/", response_class=HTMLResponse)
    def search_page(request: Request, p: Who, q: str = "", agent: str = "", groups: str = "", kind: str = "", status: str = "active",
                    min_score: str = MIN_SCORE, page_no: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1) -> HTMLResponse:
        ctx = _search(service, viewing(p, agent, groups), q, kind, status, min_score, page_no, request)
        return page(request, "search.html", p, q=q, agent=agent, groups=groups, kind=kind, status=status, min_score=min_score, **ctx)

    @router.get("/search", response_class=HTMLResponse)
    def search_results(request: Request, p: Who, q: str = "", agent: str = "", groups: str = "", kind: str = "", status: str = "active",
                       min_score: str = MIN_SCORE, page_no: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1) -> HTMLResponse:
        ctx = _search(service, viewing(p, agent, groups), q, kind, status, min_score, page_no, request, at="/ui/")
        return page(request, "_results.html", p, **ctx)

    @router.get("/units/{unit_id}", response_class=HTMLResponse)
    def unit_page(request: Request, unit_id: str, p: Who) -> HTMLResponse:
        try:
            trace = service.trace(p, unit_id)
        except ForgeError as exc:
            return page(request, "error.html", p, code=404, message=str(exc))
        rels = service.relations(p, unit_id)
        others = {u.id: u for u in service.store.get_many([r.dst if r.src == unit_id else r.src for r in rels], viewer=p.viewer)}
        related = [{"rel": r, "other": others.get(r.dst if r.src == unit_id else r.src), "outgoing": r.src == unit_id} for r in rels]
        return page(request, "unit.html", p, t=trace, u=trace["unit"], rels=rels, related=related, graph=_graph(service, p, unit_id, rels))

    @router.get("/quarantine", response_class=HTMLResponse)
    def quarantine_page(request: Request, p: Who, page_no: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1) -> HTMLResponse:
        units = service.quarantine(p, limit=PER_PAGE + 1, offset=(page_no - 1) * PER_PAGE)
        return page(request, "quarantine.html", p, units=units[:PER_PAGE], pager=_pager(request, page_no, more=len(units) > PER_PAGE))

    @router.post("/units/{unit_id}/review", response_class=HTMLResponse)
    def review(request: Request, unit_id: str, p: Who, decision: Annotated[str, Form()], reason: Annotated[str, Form(max_length=1000)] = "") -> HTMLResponse:
        """Approve (-> active) or reject (-> archived) a quarantined unit, with a reason."""
        if request.headers.get("hx-request") != "true":
            return HTMLResponse("state changes need the HX-Request header", status_code=403)
        target = {"approve": "active", "reject": "archived"}.get(decision)
        try:
            if target is None:
                raise ValidationError("decision is approve or reject")
            if not reason.strip():
                reason = f"{decision}d in review by {p.agent}"
            unit = service.set_status(p, unit_id, target, reason=f"review: {reason.strip()}")
        except (AccessError, ForgeError) as exc:
            return page(request, "_review_row.html", p, error=str(exc), unit=None, unit_id=unit_id)
        return page(request, "_review_row.html", p, unit=unit, unit_id=unit_id, error="")

    @router.post("/units/{unit_id}/erase", response_class=HTMLResponse)
    def erase(request: Request, unit_id: str, p: Who, reason: Annotated[str, Form(max_length=1000)] = "") -> Response:
        """Erase a unit for good (admins), with a reason; then the audit log's erase entries."""
        if request.headers.get("hx-request") != "true":
            return HTMLResponse("state changes need the HX-Request header", status_code=403)
        try:
            if not reason.strip():
                raise ValidationError("give a reason: it is kept in the tombstone")
            service.erase(p, unit_id, reason=reason.strip())
        except ForgeError as exc:
            return HTMLResponse(f'<p class="error" id="erase-error">{escape(str(exc))}</p>')
        return HTMLResponse("", headers={"HX-Redirect": "/ui/events?op=erase"})

    @router.get("/conflicts", response_class=HTMLResponse)
    def conflicts_page(request: Request, p: Who, page_no: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1,
                       resolved_page: Annotated[int, Query(ge=1, le=100_000)] = 1,
                       decisions_page: Annotated[int, Query(ge=1, le=100_000)] = 1) -> HTMLResponse:
        rels = _contradictions(service, p, upto=page_no * PER_PAGE + 1)
        shown = rels[(page_no - 1) * PER_PAGE : page_no * PER_PAGE]
        resolved, total = _resolved(service, p, page=resolved_page)
        decisions = service.decisions(p, limit=decisions_page * PER_PAGE + 1) if p.admin else []
        return page(request, "conflicts.html", p, rels=shown, resolved=resolved, decisions=decisions[(decisions_page - 1) * PER_PAGE : decisions_page * PER_PAGE],
                    pager=_pager(request, page_no, more=len(rels) > page_no * PER_PAGE),
                    resolved_pager=_pager(request, resolved_page, more=resolved_page * PER_PAGE < total, param="resolved_page", total=total),
                    decisions_pager=_pager(request, decisions_page, more=len(decisions) > decisions_page * PER_PAGE, param="decisions_page"))

    @router.get("/agents", response_class=HTMLResponse)
    def agents_page(request: Request, p: Who, page_no: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1) -> HTMLResponse:
        if not p.admin:
            return page(request, "error.html", p, code=403, message="only an admin key can list agents")
        agents = service.agents(p)
        return page(request, "agents.html", p, agents=agents[(page_no - 1) * PER_PAGE : page_no * PER_PAGE], reputations=service.reputations(p),
                    pager=_pager(request, page_no, more=page_no * PER_PAGE < len(agents), total=len(agents)))

    @router.get("/runs", response_class=HTMLResponse)
    def runs_page(request: Request, p: Who, page_no: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1) -> HTMLResponse:
        rows = []
        every = service.runs(p)
        for r in every[(page_no - 1) * PER_PAGE : page_no * PER_PAGE]:
            summary = None
            if r["finished"]:
                try:
                    summary = service.run(p, r["name"])
                except ForgeError:
                    summary = None
            rows.append({**r, "summary": summary, "curve": _curve(summary["curve"]) if summary else None})
        return page(request, "runs.html", p, runs=rows, pager=_pager(request, page_no, more=page_no * PER_PAGE < len(every), total=len(every)))

    @router.get("/runs/{name:path}/report", response_class=HTMLResponse)
    def run_report(name: str, p: Who) -> HTMLResponse:
        """A run's report, at the dashboard's own address: ``/v1`` takes the cookie from no link.
        The report is one page with its styles inline and no script."""
        return HTMLResponse(service.run_report(p, name), headers={"Content-Security-Policy": _REPORT_CSP})

    @router.get("/learned", response_class=HTMLResponse)
    def learned_page(request: Request, p: Who, status: str = "all", author: str = "", run: str = "",
                     page_no: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1) -> HTMLResponse:
        """What agents learned (rules, lessons, procedures) and where it went: here, or in an
        evolution run's memory (``run``, admins)."""
        from forge.share.ledger import ledger_decisions

        status = status if status in ("all", "active", "retired") else "all"
        start, stop = (page_no - 1) * PER_PAGE, page_no * PER_PAGE
        runs = [r["name"] for r in service.runs(p)] if p.admin else []
        if run:
            if not p.admin:
                return page(request, "error.html", p, code=403, message="only an admin key can read an evolution run's memory")
            data = _run_learned(service, p, run, status, author.strip(), start, stop)
        else:
            service.flush()
            data = {"error": "", **learned_rows(service.store, p.viewer, status=status, author=author.strip(), start=start, stop=stop,
                                                decisions=ledger_decisions(service.store) if p.admin else ())}
        total = data.get("totals", {}).get("rows", 0)
        return page(request, "learned.html", p, rows=data["rows"], totals=data.get("totals", {}), truncated=data.get("truncated", False),
                    scan=LEARNED_SCAN, error=data["error"], status=status, author=author, run=run, runs=runs,
                    pager=_pager(request, page_no, more=stop < total, total=total))

    @router.get("/events", response_class=HTMLResponse)
    def events_page(request: Request, p: Who, actor: str = "", op: str = "",
                    before: Annotated[float | None, Query(ge=0, le=1e11)] = None) -> HTMLResponse:
        """Newest first, a page at a time; older pages are the entries before the last one shown."""
        evs = service.events(p, actor=actor or None, ops=[op] if op else (), until=before, limit=PER_PAGE + 1, newest_first=True)
        rows = [event_dict(e) for e in evs[:PER_PAGE]]
        older = _link(request, before=rows[-1]["ts"]) if len(evs) > PER_PAGE else None
        return page(request, "events.html", p, events=rows, actor=actor, op=op,
                    pager={"label": "newest first" if before is None else f"before {_ts(before)}", "prev": _link(request, before=None) if before else None,
                           "next": older})

    @app.get("/ui", include_in_schema=False)
    def ui_root() -> Response:
        """``/ui`` (the address the server's banner prints) is the dashboard's home page too."""
        return RedirectResponse("/ui/", status_code=307)

    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=str(_HERE / "static")), name="ui-static")


def _same_origin(request: Request) -> bool:
    """A form post from this server's own pages: its Origin (else its Referer) names this
    host. A browser sends one of them on a cross-site post, so another site cannot sign a
    visitor in with its own key, or out; a client that sends neither is not a browser form."""
    from urllib.parse import urlsplit

    claimed = request.headers.get("origin") or request.headers.get("referer")
    if not claimed:
        return True
    if claimed == "null":  # sandboxed frames, file: pages, some redirects
        return False
    here = request.headers.get("host", "")
    return urlsplit(claimed).netloc.lower() == here.lower() and bool(here)


#: The search page's default least score: on 23 unrelated facts and the local embedder, the
#: facts a query was about scored 0.54-1.0 and the rest 0.04-0.15 (recall scores are 0-1).
MIN_SCORE = "0.1"


#: A run report's policy: its inline styles, nothing else (no script, no requests, no frames).
_REPORT_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; frame-ancestors 'none'; "
               "base-uri 'none'")

#: Rows per page on every list; a search with a query pages through a recall at most this deep.
PER_PAGE = 25
MAX_RECALL_DEPTH = 200


def _link(request: Request, **changes: Any) -> str:
    """This page's address with some query parameters changed (None drops one)."""
    params = {k: v for k, v in request.query_params.items()}
    for k, v in changes.items():
        if v is None:
            params.pop(k, None)
        else:
            params[k] = str(v)
    return str(request.url.path) + ("?" + urlencode(params) if params else "")


def _pager(request: Request, page: int, *, more: bool, param: str = "page", total: int | None = None, at: str | None = None) -> dict[str, Any]:
    """Previous / next links for page ``page`` of a list (``more``: there is a next page)."""
    def go(n: int) -> str:
        url = _link(request, **{param: n if n > 1 else None})
        return url.replace(str(request.url.path), at, 1) if at else url

    pages = f" of {max(1, -(-total // PER_PAGE))}" if total is not None else ""
    return {"label": f"page {page}{pages}" + (f" ({total} in all)" if total is not None else ""),
            "prev": go(page - 1) if page > 1 else None, "next": go(page + 1) if more else None}


def _search(service: Service, p: Principal, q: str, kind: str, status: str, min_score: str = MIN_SCORE, page_no: int = 1,
            request: Request | None = None, *, at: str | None = None) -> dict[str, Any]:
    try:
        least = float(min_score or 0)
        if not 0 <= least <= 1:
            raise ValueError
    except ValueError:
        return {"results": [], "error": f"min score {min_score!r}: give a number from 0 to 1", "viewer": p, "least": None, "pager": None}
    f = Filter.make(kinds=[kind] if kind else (), status=[status] if status else None)
    try:
        if q.strip():  # recall ranks the top k: a page is the next PER_PAGE of a longer recall (at most 200 deep)
            k = min(MAX_RECALL_DEPTH, page_no * PER_PAGE)
            found = service.recall(p, q, k=k, filter=f, touch=False, min_score=least)
            results = [{"unit": r.unit, "score": r.score, "reasons": r.reasons} for r in found[(page_no - 1) * PER_PAGE :]]
            more, total = len(found) == k and k < MAX_RECALL_DEPTH, None
        else:
            units, total = service.list(p, filter=f, limit=PER_PAGE, offset=(page_no - 1) * PER_PAGE)
            results = [{"unit": u, "score": None, "reasons": []} for u in units]
            more = page_no * PER_PAGE < total
        pager = _pager(request, page_no, more=more, total=total, at=at) if request is not None else None
        return {"results": results, "error": "", "viewer": p, "least": least if q.strip() else None, "pager": pager}
    except ForgeError as exc:
        return {"results": [], "error": str(exc), "viewer": p, "least": None, "pager": None}


def _graph(service: Service, p: Principal, center: str, rels: list[Any]) -> dict[str, Any]:
    """A radial layout: the unit in the middle, its related units around it (SVG coordinates)."""
    others = list(dict.fromkeys(r.dst if r.src == center else r.src for r in rels))[:24]
    units = {u.id: u for u in service.store.get_many([center, *others], viewer=p.viewer)}
    cx, cy, radius = 300, 200, 150
    nodes = [{"id": center, "x": cx, "y": cy, "label": _short(units[center].content) if center in units else center, "center": True}]
    pos = {center: (cx, cy)}
    for i, oid in enumerate(others):
        a = 2 * math.pi * i / max(1, len(others)) - math.pi / 2
        x, y = cx + radius * math.cos(a), cy + radius * math.sin(a)
        pos[oid] = (x, y)
        nodes.append({"id": oid, "x": round(x, 1), "y": round(y, 1), "label": _short(units[oid].content) if oid in units else oid, "center": False})
    edges = [{"x1": pos[r.src][0], "y1": pos[r.src][1], "x2": pos[r.dst][0], "y2": pos[r.dst][1], "type": r.type.value}
             for r in rels if r.src in pos and r.dst in pos]
    return {"nodes": nodes, "edges": edges}


def _contradictions(service: Service, p: Principal, *, upto: int) -> list[dict[str, Any]]:
    """Open contradictions (``contradicts`` links), oldest unit first: the first ``upto`` found,
    reading the store 500 units and one neighbour query at a time (no cap on how far)."""
    from forge.model import RelationType

    f = Filter.make(status=["active", "superseded", "archived"])
    out: list[dict[str, Any]] = []
    offset = 0
    while len(out) < upto:
        units = service.store.list(viewer=p.viewer, filter=f, limit=500, offset=offset)
        if not units:
            break
        by_id = {u.id: u for u in units}
        links = [rel for _, rel in service.store.neighbors(list(by_id), viewer=p.viewer, types=[RelationType.CONTRADICTS], filter=f)
                 if rel.src in by_id]
        others = {u.id: u for u in service.store.get_many(sorted({r.dst for r in links}), viewer=p.viewer)}
        seen = set()
        for r in links:
            if (r.src, r.dst) not in seen and r.dst in others:
                seen.add((r.src, r.dst))
                out.append({"a": by_id[r.src], "b": others[r.dst], "note": r.note})
        offset += len(units)
    return out[:upto]


def _resolved(service: Service, p: Principal, *, page: int) -> tuple[list[dict[str, Any]], int]:
    """Contradictions settled by superseding the old unit (admission, consensus, curation):
    each superseded unit with the one that replaced it and why, newest page first."""
    f = Filter.make(status=["superseded"])
    total = service.store.count(viewer=p.viewer, filter=f)
    old = service.store.list(viewer=p.viewer, filter=f, limit=PER_PAGE, offset=(page - 1) * PER_PAGE)
    new = {u.id: u for u in service.store.get_many(sorted({str(u.meta.get("superseded_by")) for u in old if u.meta.get("superseded_by")}),
                                                    viewer=p.viewer)}
    rows = []
    for u in old:
        by = new.get(str(u.meta.get("superseded_by", "")))
        note = next((r.note for r in service.store.relations(u.id, viewer=p.viewer) if r.type.value == "supersedes" and r.dst == u.id), "")
        rows.append({"old": u, "new": by, "at": u.meta.get("valid_to"), "note": note})
    return rows, total


def _curve(values: list[Any]) -> dict[str, Any] | None:
    pts = [(i, v) for i, v in enumerate(values) if v is not None]
    if not pts:
        return None
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    span = (hi - lo) or 1.0
    w, h = 240, 60
    n = max(1, len(values) - 1)
    points = " ".join(f"{10 + i * (w - 20) / n:.1f},{h - 8 - (v - lo) / span * (h - 16):.1f}" for i, v in pts)
    return {"points": points, "lo": lo, "hi": hi, "w": w, "h": h}


def _short(text: str, n: int = 28) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _ts(value: Any) -> str:
    import datetime as dt

    if value is None:
        return "-"
    return dt.datetime.fromtimestamp(float(value), tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


# -- what agents learned ------------------------------------------------------------------------

#: The kinds learning writes (rules, lessons, procedures that worked).
LEARNED_KINDS = ("rule", "lesson", "procedure")
#: Most learned units one page reads (newest first); a store with more says so on the page.
LEARNED_SCAN = 5000
#: Statuses a learned unit leaves recall by, and the word the page uses for them.
RETIRED = ("archived", "superseded", "quarantined")


def _learned_source(source: str) -> str | None:
    """The author a provenance source names when learning wrote the unit ("learned:<agent>"),
    "" for a protocol's reflection (its owner wrote it), None for anything else."""
    if source.startswith("learned:"):
        return source.split(":", 1)[1]
    if source == "reflection":
        return ""
    return None


#: Meta keys that say what a learned unit was learned from (a job, its task and outcome).
LEARNED_FROM = ("job", "job_id", "task", "kind", "success", "score", "feedback", "recall_id", "outcome")


def _learned_from(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What ``meta`` says a unit was learned from: its ``learned_from`` record, else those of
    :data:`LEARNED_FROM` it holds at the top."""
    where = meta.get("learned_from")
    src = where if isinstance(where, Mapping) else meta
    return {k: src[k] for k in LEARNED_FROM if k in src and src[k] not in (None, "", [], {})}


def _why_retired(store: Any, viewer: Any, unit: Any) -> dict[str, Any] | None:
    """The newest status change that took ``unit`` out of recall: when, by whom, why."""
    if unit.status.value not in RETIRED:
        return None
    evs = store.events(unit_id=unit.id, ops=("status",), viewer=viewer, limit=20, newest_first=True)
    for e in evs:
        if e.data.get("to") == unit.status.value:
            return {"at": e.ts, "actor": e.actor, "reason": str(e.data.get("reason") or ""), "status": unit.status.value}
    q = unit.meta.get("quarantine") if isinstance(unit.meta.get("quarantine"), Mapping) else None
    return {"at": (q or {}).get("at"), "actor": "", "reason": str((q or {}).get("reason") or "no reason recorded"), "status": unit.status.value}


def learned_rows(store: Any, viewer: Any, *, status: str = "all", author: str = "", decisions: Sequence[Any] = (),
                 start: int = 0, stop: int | None = None, scan: int = LEARNED_SCAN) -> dict[str, Any]:
    """Every rule, lesson and procedure learning wrote that ``viewer`` may see, newest first,
    one row per original: its author, when and from what it was learned, the copies its peers
    received (``broadcast:<author>`` units whose ``remote_id`` is it) and the exchange's
    decisions about it (``decisions``: ledger rulings, matched by origin and content hash),
    how often it was recalled, its counted outcomes and validation, and, once retired, why.
    A received copy whose original ``viewer`` cannot see is a row of its own. Only rows
    ``start:stop`` are filled in (their history read); ``totals`` count them all."""
    from forge.model import origin_of
    from forge.share.capsule import content_hash

    f = Filter.make(kinds=LEARNED_KINDS, status=["active", *RETIRED])
    total = store.count(viewer=viewer, filter=f)
    units = store.list(viewer=viewer, filter=f, limit=scan, offset=max(0, total - scan))  # oldest first: the newest ``scan``
    copies: dict[str, list[Any]] = {}
    originals, orphans = [], []
    for u in units:
        src = u.provenance.source
        if src.startswith("broadcast:"):
            copies.setdefault(str(u.meta.get("remote_id") or ""), []).append(u)
        elif _learned_source(src) is not None:
            originals.append(u)
    ids = {u.id for u in originals}
    by_text = {(_learned_source(u.provenance.source) or u.owner, content_hash(u)): u.id for u in originals}
    for rid in list(copies):
        if rid in ids:
            continue
        for c in copies.pop(rid):  # its original was merged into another, or is out of sight: match by author and text
            home = by_text.get((origin_of(c), content_hash(c)))
            if home:
                copies.setdefault(home, []).append(c)
            else:
                orphans.append(c)
    rows = []
    for u in sorted([*originals, *orphans], key=lambda x: x.created_at, reverse=True):
        received = u.provenance.source.startswith("broadcast:")
        who = origin_of(u) if received else (_learned_source(u.provenance.source) or u.owner)
        if author and who != author:
            continue
        if status == "active" and u.status.value != "active" or status == "retired" and u.status.value not in RETIRED:
            continue
        rows.append({"unit": u, "author": who, "received_from": u.meta.get("sender") if received else None, "holder": u.owner,
                     "copies": copies.get(u.id, [])})
    totals = {"rows": len(rows), "active": sum(r["unit"].status.value == "active" for r in rows),
              "retired": sum(r["unit"].status.value in RETIRED for r in rows),
              "copies": sum(len(r["copies"]) for r in rows), "authors": len({r["author"] for r in rows})}
    ruled: dict[tuple[str, str], list[Any]] = {}
    for d in decisions:
        if d.outcome in ("accepted", "merged", "corroborated", "quarantined", "rejected", "conflict"):
            ruled.setdefault((d.origin, d.hash), []).append(d)
    shown = rows[start:stop]
    for r in shown:
        u, c = r["unit"], r["unit"].counts
        got = [{"agent": x.owner, "status": x.status.value, "validation": x.validation, "uses": x.counts.uses,
                "successes": x.counts.successes, "failures": x.counts.failures, "id": x.id,
                "retired": _why_retired(store, viewer, x)} for x in r["copies"]]
        holders = {g["agent"] for g in got}
        r.update(
            rule=u.rule, episodes=list(u.provenance.episodes), copies=got,
            rulings=list({(d.agent, d.outcome, d.reason): {"agent": d.agent, "outcome": d.outcome, "reason": d.reason, "at": d.at}
                          for d in ruled.get((r["author"], content_hash(u)), []) if d.agent not in holders or d.outcome not in ("accepted", "quarantined")}.values()),
            learned_from=_learned_from(u.meta),
            recalled=u.access_count, uses=c.uses, successes=c.successes, failures=c.failures, validation=u.validation,
            retired=_why_retired(store, viewer, u),
        )
    return {"rows": shown, "totals": totals, "truncated": total > scan, "scan": scan}


def _run_learned(service: Service, p: Principal, name: str, status: str, author: str, start: int, stop: int) -> dict[str, Any]:
    """What the instances of evolution run ``name`` learned, read from its ``memory.db``
    (read-only; every instance's memory, so an admin's view)."""
    from forge.model import Viewer
    from forge.store import SQLiteStore

    if name not in {r["name"] for r in service.runs(p)} or service.runs_dir is None:
        return {"error": f"no run named {name!r}", "rows": [], "totals": {}}
    db = service.runs_dir.joinpath(*name.split("/")) / "memory.db"
    if not db.is_file():
        return {"error": f"run {name!r} has no memory.db yet", "rows": [], "totals": {}}
    try:
        store = SQLiteStore(db, create=False, readonly=True)
    except (ForgeError, OSError, sqlite3.Error) as exc:
        return {"error": f"run {name!r}: cannot read its memory ({exc})", "rows": [], "totals": {}}
    try:
        return {"error": "", **learned_rows(store, Viewer.admin(), status=status, author=author, start=start, stop=stop)}
    finally:
        store.close()
