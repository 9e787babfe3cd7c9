"""The floor: the least an HTTP service can do to answer GET context from this schema.

Starlette + an asyncpg pool, one route, and the service's own context statement
(``CONTEXT_SQL`` from app/repositories/memory.py, which has PostgreSQL build the whole response as
JSON), its text returned as the body. No validation, no dependency injection, no ORM, no
transaction. Served by uvicorn exactly like the service:
``FLOOR_DATABASE_URL=postgresql://... python -m uvicorn bench.floor_app:app --no-access-log``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

# The service's own statement, imported rather than copied so the two cannot drift.
# $1 = conversation_id, $2 = tenant_id, $3/$4 = the raw part's caps; NULL for an unknown conversation.
from app.db import READ_POOL_SERVER_SETTINGS
from app.repositories.memory import CONTEXT_SQL
from app.settings import Settings

# The service's default caps on the raw part (messages, bytes), so both run the same plan.
_DEFAULTS = Settings(_env_file=None)
CONTEXT_LIMITS = (_DEFAULTS.MEMORY_MAX_CONTEXT_MESSAGES, _DEFAULTS.MEMORY_MAX_CONTEXT_BYTES)


def _dsn() -> str:
    url = os.environ["FLOOR_DATABASE_URL"]
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    size = int(os.environ.get("FLOOR_POOL_SIZE", Settings.model_fields["DATABASE_POOL_SIZE"].default))
    # UTC like the service's connections, so timestamps in the JSON read the same.
    pool = await asyncpg.create_pool(
        _dsn(), min_size=size, max_size=size, server_settings=READ_POOL_SERVER_SETTINGS
    )
    app.state.pool = pool
    try:
        yield
    finally:
        await pool.close()


async def context(request: Request) -> Response:
    pool: asyncpg.Pool = request.app.state.pool
    async with pool.acquire() as conn:
        body: str | None = await conn.fetchval(
            CONTEXT_SQL, request.path_params["conversation_id"], "default", *CONTEXT_LIMITS
        )
    if body is None:
        return Response(b'{"detail":"not found","code":"not_found"}', 404, media_type="application/json")
    return Response(body, media_type="application/json")


async def healthz(_request: Request) -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")


app = Starlette(
    routes=[
        Route("/conversations/{conversation_id}/context", context, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ],
    lifespan=lifespan,
)
