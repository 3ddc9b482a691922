"""The API's documentation pages, served offline: ``/docs`` (Swagger UI) and ``/redoc``.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so on a machine without network
``/docs`` was blank. Their assets come from the ``fastapi-offline`` package instead (MIT; it
ships Swagger UI's and ReDoc's release bundles; only its static files are used), served
under ``/docs/static`` (ReDoc's footer logo pointed at the local favicon, not Redocly's CDN). Without that package the same two paths answer a plain page of
every endpoint, written from the OpenAPI schema: no script, nothing fetched.
"""

from __future__ import annotations

import functools
import html
from importlib import util
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

__all__ = ["assets", "mount_docs"]

_STATIC = "/docs/static"


def assets() -> Path | None:
    """The folder of Swagger UI's and ReDoc's files, or None when fastapi-offline is not installed."""
    spec = util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "static"
    need = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js")
    return folder if all((folder / f).is_file() for f in need) else None


def mount_docs(app: FastAPI, *, title: str) -> None:
    """``/docs`` and ``/redoc`` for ``app`` (created with ``docs_url=None, redoc_url=None``)."""
    folder = assets()
    openapi = app.openapi_url or "/openapi.json"
    if folder is None:
        @app.get("/docs", include_in_schema=False)
        @app.get("/redoc", include_in_schema=False)
        def plain() -> HTMLResponse:
            return HTMLResponse(_plain(app.openapi(), openapi))

        return

    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=openapi, title=f"{title} · API", swagger_js_url=f"{_STATIC}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{_STATIC}/swagger-ui.css", swagger_favicon_url=f"{_STATIC}/favicon.png")

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=openapi, title=f"{title} · API", redoc_js_url=f"{_STATIC}/redoc.standalone.js",
                              redoc_favicon_url=f"{_STATIC}/favicon.png", with_google_fonts=False)

    @app.get(f"{_STATIC}/redoc.standalone.js", include_in_schema=False)
    def redoc_js() -> Response:
        return Response(_redoc_js(str(folder)), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    app.mount(_STATIC, StaticFiles(directory=str(folder)), name="docs-static")


#: ReDoc's footer shows a logo it loads from Redocly's CDN: pointed at the local favicon instead.
_REDOC_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"


@functools.cache
def _redoc_js(folder: str) -> bytes:
    return (Path(folder) / "redoc.standalone.js").read_bytes().replace(_REDOC_LOGO, f"{_STATIC}/favicon.png".encode())


def _plain(spec: dict[str, Any], openapi: str) -> str:
    """Every operation of ``spec`` as a table: method, path, summary and description."""
    rows = []
    for path, ops in sorted(spec.get("paths", {}).items()):
        for method, op in ops.items():
            if not isinstance(op, dict):
                continue
            text = html.escape(op.get("summary") or op.get("operationId") or "")
            desc = html.escape(op.get("description") or "")
            rows.append(f"<tr><td><code>{method.upper()}</code></td><td><code>{html.escape(path)}</code></td>"
                        f"<td><strong>{text}</strong><br>{desc}</td></tr>")
    info = spec.get("info", {})
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(info.get('title', 'API'))}</title></head>"
            f"<body><h1>{html.escape(info.get('title', 'API'))} {html.escape(str(info.get('version', '')))}</h1>"
            f"<p>{html.escape(info.get('description', ''))}</p><p>The schema: <a href=\"{openapi}\">{openapi}</a> "
            "(install fastapi-offline for Swagger UI and ReDoc here).</p>"
            f"<table id=operations><tr><th>method</th><th>path</th><th>what</th></tr>{''.join(rows)}</table></body></html>")
