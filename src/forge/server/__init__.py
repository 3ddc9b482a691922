"""The memory service: REST API, MCP endpoint and dashboard over one :class:`~forge.Memory`.

    forge keys create --agent scout --group ops       # prints the key once
    forge serve --host 0.0.0.0 --port 8765            # /v1 (docs at /docs), /mcp, /ui

Modules: :mod:`~forge.server.service` (every verb, with access rules and audit),
:mod:`~forge.server.app` (FastAPI), :mod:`~forge.server.mcp` (MCP tools and resources),
:mod:`~forge.server.dashboard` (Jinja2 + htmx pages), :mod:`~forge.server.keys` (API keys,
hashes only) and :mod:`~forge.server.auth` (principals and rate limits). FastAPI, uvicorn
and mcp come with the ``server`` extra; importing this package does not import them.
"""

from __future__ import annotations

__all__ = ["create_app"]


def create_app(*args, **kwargs):  # type: ignore[no-untyped-def]
    """See :func:`forge.server.app.create_app` (imported lazily: FastAPI is an optional extra)."""
    from forge.server.app import create_app as _create

    return _create(*args, **kwargs)
