"""The floor: the least an HTTP service can do to answer GET context from this schema.

Starlette + an asyncpg pool, one route, and the service's own context statement (a copy of
``CONTEXT_SQL`` in app/repositories/memory.py, which has PostgreSQL build the whole response as
JSON), its text returned as the body. No validation, no dependency injection, no ORM, no
transaction. Served by uvicorn exactly like the service:
``FLOOR_DATABASE_URL=postgresql://... python -m uvicorn bench.floor_app:app --no-access-log``.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

# Copied from app/repositories/memory.py (CONTEXT_SQL); the harness reports when the two drift.
# $1 = conversation_id, $2 = tenant_id; NULL for an unknown conversation.
CONTEXT_SQL = """
WITH conv AS (
    SELECT next_sequence FROM conversations
    WHERE conversation_id = $1 AND tenant_id = $2
), mem AS (
    SELECT memory_id, memory_text AS text, start_sequence, end_sequence, base_memory_id,
           created_at, completed_at, generation_time_ms
    FROM memory
    WHERE conversation_id = $1 AND status = 'completed' AND EXISTS (SELECT 1 FROM conv)
    ORDER BY end_sequence DESC, memory_id DESC
    LIMIT 1
), proc AS (
    SELECT memory_id, start_sequence, end_sequence, base_memory_id, created_at
    FROM memory
    WHERE conversation_id = $1 AND status = 'processing' AND EXISTS (SELECT 1 FROM conv)
), gap AS (
    SELECT sequence, role, content, created_at
    FROM messages
    WHERE conversation_id = $1 AND EXISTS (SELECT 1 FROM conv)
      AND sequence > coalesce((SELECT end_sequence FROM mem), -1)
      AND sequence < (SELECT next_sequence FROM conv)
)
SELECT json_build_object(
    'conversation_id', $1::text,
    'memory', (SELECT row_to_json(mem) FROM mem),
    'messages', coalesce((SELECT json_agg(gap ORDER BY gap.sequence) FROM gap), '[]'::json),
    'processing', (SELECT row_to_json(proc) FROM proc),
    'last_sequence', nullif((SELECT next_sequence FROM conv) - 1, -1),
    'memory_lag_messages',
        (SELECT next_sequence FROM conv) - coalesce((SELECT end_sequence FROM mem) + 1, 0)
)::text
WHERE EXISTS (SELECT 1 FROM conv)
"""

_NAMED = re.compile(r":(conversation_id|tenant_id)\b")


def normalize_sql(sql: str) -> str:
    """Whitespace-folded text, named parameters as positional ones, for the drift check."""
    sql = _NAMED.sub(lambda m: "$1" if m.group(1) == "conversation_id" else "$2", sql)
    return " ".join(sql.split())


def _dsn() -> str:
    url = os.environ["FLOOR_DATABASE_URL"]
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    size = int(os.environ.get("FLOOR_POOL_SIZE", "10"))
    # UTC like the service's connections, so timestamps in the JSON read the same.
    pool = await asyncpg.create_pool(
        _dsn(), min_size=size, max_size=size, server_settings={"timezone": "UTC"}
    )
    app.state.pool = pool
    try:
        yield
    finally:
        await pool.close()


async def context(request: Request) -> Response:
    pool: asyncpg.Pool = request.app.state.pool
    async with pool.acquire() as conn:
        body: str | None = await conn.fetchval(CONTEXT_SQL, request.path_params["conversation_id"], "default")
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
