"""Liveness and readiness."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import current_revision

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "Database unreachable or not migrated"}})
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
