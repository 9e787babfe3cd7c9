"""Liveness and readiness."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.responses import PLAIN_503, TOO_MANY_CONNECTIONS
from app.db import current_revision
from app.schemas import HealthOut, NotReadyOut, ReadyOut

router = APIRouter(tags=["health"])

# Readiness answers in its own shape, not the API's error body, and without Retry-After.
NOT_READY = {
    "model": NotReadyOut,
    "description": "The database is unreachable or not migrated to this code's revision. "
    f"Or: {TOO_MANY_CONNECTIONS}",
    "content": {
        "application/json": {
            "example": {"status": "unavailable", "detail": "database unreachable: ConnectionRefusedError"}
        },
        **PLAIN_503,
    },
}


@router.get("/healthz", response_model=HealthOut)
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", response_model=ReadyOut, responses={503: NOT_READY})
async def readyz(request: Request) -> Any:
    """The database is reachable and migrated to the revision this code expects."""
    engine: AsyncEngine = request.app.state.engine
    expected: str | None = request.app.state.head_revision
    try:
        async with engine.connect() as conn:
            revision = await conn.run_sync(current_revision)
    except Exception as exc:
        return JSONResponse(
            status_code=503,
            content={
                "status": "unavailable",
                "detail": f"database unreachable: {type(exc).__name__}",
            },
        )
    if revision != expected:
        return JSONResponse(
            status_code=503,
            content={
                "status": "unavailable",
                "detail": f"database at migration {revision}, expected {expected}; "
                "run `memory-service migrate` or `alembic upgrade head`",
            },
        )
    return {"status": "ready", "migration": revision}
