"""The dashboard at ``/ui``: server-rendered pages (Jinja2) with htmx for the interactive bits.

Pages: search (as any agent, for admins), a unit (relations as a graph, provenance chain,
change history), the quarantine review queue (approve / reject with a reason, written to
the audit log), conflicts and their resolutions, agents with reputations, and runs with
learning curves. No build step, no CDN: htmx 2 (0BSD licence, from the npm package
``htmx.org``) is vendored in ``static/``. Pages call the same :class:`Service` as the API.

The browser authenticates with the API key in a ``SameSite=Strict`` cookie set by
``/ui/login``; state-changing requests must also carry htmx's ``HX-Request`` header, which a
cross-site form cannot send.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

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
                    min_score: str = MIN_SCORE) -> HTMLResponse:
        ctx = _search(service, viewing(p, agent, groups), q, kind, status, min_score)
        return page(request, "search.html", p, q=q, agent=agent, groups=groups, kind=kind, status=status, min_score=min_score, **ctx)

    @router.get("/search", response_class=HTMLResponse)
    def search_results(request: Request, p: Who, q: str = "", agent: str = "", groups: str = "", kind: str = "", status: str = "active",
                       min_score: str = MIN_SCORE) -> HTMLResponse:
        return page(request, "_results.html", p, **_search(service, viewing(p, agent, groups), q, kind, status, min_score))

    @router.get("/units/{unit_id}", response_class=HTMLResponse)
    def unit_page(request: Request, unit_id: str, p: Who) -> HTMLResponse:
        try:
            trace = service.trace(p, unit_id)
        except ForgeError as exc:
            return page(request, "error.html", p, code=404, message=str(exc))
        rels = service.relations(p, unit_id)
        return page(request, "unit.html", p, t=trace, u=trace["unit"], rels=rels, graph=_graph(service, p, unit_id, rels))

    @router.get("/quarantine", response_class=HTMLResponse)
    def quarantine_page(request: Request, p: Who) -> HTMLResponse:
        return page(request, "quarantine.html", p, units=service.quarantine(p, limit=200))

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

    @router.get("/conflicts", response_class=HTMLResponse)
    def conflicts_page(request: Request, p: Who) -> HTMLResponse:
        rels = _contradictions(service, p)
        decisions = service.decisions(p) if p.admin else []
        return page(request, "conflicts.html", p, rels=rels, decisions=decisions)

    @router.get("/agents", response_class=HTMLResponse)
    def agents_page(request: Request, p: Who) -> HTMLResponse:
        if not p.admin:
            return page(request, "error.html", p, code=403, message="only an admin key can list agents")
        return page(request, "agents.html", p, agents=service.agents(p), reputations=service.reputations(p))

    @router.get("/runs", response_class=HTMLResponse)
    def runs_page(request: Request, p: Who) -> HTMLResponse:
        rows = []
        for r in service.runs(p):
            summary = None
            if r["finished"]:
                try:
                    summary = service.run(p, r["name"])
                except ForgeError:
                    summary = None
            rows.append({**r, "summary": summary, "curve": _curve(summary["curve"]) if summary else None})
        return page(request, "runs.html", p, runs=rows)

    @router.get("/events", response_class=HTMLResponse)
    def events_page(request: Request, p: Who, actor: str = "", op: str = "") -> HTMLResponse:
        evs = service.events(p, actor=actor or None, ops=[op] if op else (), limit=200, newest_first=True)
        return page(request, "events.html", p, events=[event_dict(e) for e in evs], actor=actor, op=op)

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


def _search(service: Service, p: Principal, q: str, kind: str, status: str, min_score: str = MIN_SCORE) -> dict[str, Any]:
    try:
        least = float(min_score or 0)
        if not 0 <= least <= 1:
            raise ValueError
    except ValueError:
        return {"results": [], "error": f"min score {min_score!r}: give a number from 0 to 1", "viewer": p, "least": None}
    f = Filter.make(kinds=[kind] if kind else (), status=[status] if status else None)
    try:
        if q.strip():
            results = [{"unit": r.unit, "score": r.score, "reasons": r.reasons}
                       for r in service.recall(p, q, k=25, filter=f, touch=False, min_score=least)]
        else:
            units, _ = service.list(p, filter=f, limit=50)
            results = [{"unit": u, "score": None, "reasons": []} for u in units]
        return {"results": results, "error": "", "viewer": p, "least": least if q.strip() else None}
    except ForgeError as exc:
        return {"results": [], "error": str(exc), "viewer": p, "least": None}


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


def _contradictions(service: Service, p: Principal) -> list[dict[str, Any]]:
    f = Filter.make(status=["active", "superseded", "archived"])
    out = []
    for u in service.store.list(viewer=p.viewer, filter=f, limit=2000):
        for r in service.store.relations(u.id, viewer=p.viewer):
            if r.type.value == "contradicts" and r.src == u.id:
                others = service.store.get_many([r.dst], viewer=p.viewer)
                if others:
                    out.append({"a": u, "b": others[0], "note": r.note})
    return out


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


