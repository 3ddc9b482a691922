"""How the service answers an error: one JSON shape, and the status each exception stands for.

Shared by the REST app and the MCP mount, so neither imports the other to map an error.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from forge.errors import (
    AccessError,
    BackendError,
    ConflictError,
    DimensionError,
    NotFoundError,
    StoreError,
    UserError,
)
from forge.server.auth import RateLimited, Unauthorized

__all__ = ["error_response", "status_of"]


def status_of(exc: BaseException) -> tuple[int, str]:
    """HTTP status and error code for an exception (the CLI's blame split, in HTTP)."""
    if isinstance(exc, Unauthorized):
        return 401, "unauthorized"
    if isinstance(exc, RateLimited):
        return 429, "rate_limited"
    if isinstance(exc, AccessError):
        return 403, "forbidden"
    if isinstance(exc, NotFoundError):
        return 404, "not_found"
    if isinstance(exc, ConflictError):
        return 409, "conflict"
    if isinstance(exc, DimensionError | UserError):
        return 422, "invalid"
    if isinstance(exc, StoreError):
        return 503, "backend_unavailable"
    if isinstance(exc, BackendError):
        return 502, "backend_failed"
    return 500, "internal"


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"status": status, "code": code, "message": message}}, status_code=status, headers=headers)
