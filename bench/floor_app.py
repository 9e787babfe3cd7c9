"""The floor: the least an HTTP service can do to answer GET context from this schema.

Starlette + an asyncpg pool, one route, the service's own context statement (a copy of
``_CONTEXT`` in app/repositories/memory.py, named parameters turned into $1/$2), and the response
assembled from the JSON text PostgreSQL returns, without parsing it. No validation, no ORM, no
transaction. Served by uvicorn exactly like the service:
``FLOOR_DATABASE_URL=postgresql://... python -m uvicorn bench.floor_app:app --no-access-log``.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

# Copied from app/repositories/memory.py (_CONTEXT); the harness reports when the two drift.
CONTEXT_SQL = """
    WITH conv AS (
        SELECT conversation_id, next_sequence FROM conversations
        WHERE conversation_id = $1 AND tenant_id = $2
    ), mem AS (
        SELECT memory_id, memory_text AS text, start_sequence, end_sequence, base_memory_id,
               created_at, completed_at, generation_time_ms
        FROM memory
        WHERE conversation_id = $1 AND status = 'completed'
          AND EXISTS (SELECT 1 FROM conv)
        ORDER BY end_sequence DESC, memory_id DESC
        LIMIT 1
    ), proc AS (
        SELECT memory_id, start_sequence, end_sequence, base_memory_id, created_at
        FROM memory
        WHERE conversation_id = $1 AND status = 'processing'
          AND EXISTS (SELECT 1 FROM conv)
    )
    SELECT
        (SELECT next_sequence FROM conv) AS next_sequence,
        (SELECT row_to_json(mem) FROM mem)::text AS memory,
        (SELECT row_to_json(proc) FROM proc)::text AS processing,
        (SELECT coalesce(json_agg(json_build_object(
                    'sequence', g.sequence, 'role', g.role, 'content', g.content,
                    'created_at', g.created_at) ORDER BY g.sequence), '[]')
         FROM messages g
         WHERE g.conversation_id = $1 AND EXISTS (SELECT 1 FROM conv)
           AND g.sequence > coalesce((SELECT end_sequence FROM mem), -1))::text AS messages
    """

_END_SEQUENCE = re.compile(rb'"end_sequence":(\d+)')


def normalize_sql(sql: str) -> str:
    """Whitespace-folded text with named parameters as positional ones, for the drift check."""
    sql = sql.replace(":conversation_id", "$1").replace(":tenant_id", "$2")
    return " ".join(sql.split())


def _dsn() -> str:
    url = os.environ["FLOOR_DATABASE_URL"]
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    size = int(os.environ.get("FLOOR_POOL_SIZE", "10"))
    pool = await asyncpg.create_pool(_dsn(), min_size=size, max_size=size)
    app.state.pool = pool
    try:
        yield
    finally:
        await pool.close()


async def context(request: Request) -> Response:
    conversation_id = request.path_params["conversation_id"]
    pool: asyncpg.Pool = request.app.state.pool
    async with pool.acquire() as conn:
        row = await conn.fetchrow(CONTEXT_SQL, conversation_id, "default")
    assert row is not None
    if row["next_sequence"] is None:
        return Response(b'{"detail":"not found","code":"not_found"}', 404, media_type="application/json")
    memory: str | None = row["memory"]
    last = int(row["next_sequence"]) - 1
    covered = -1
    if memory is not None:
        found = _END_SEQUENCE.search(memory.encode())
        covered = int(found.group(1)) if found else -1
    body = b"".join(
        (
            b'{"conversation_id":',
            orjson.dumps(conversation_id),
            b',"memory":',
            memory.encode() if memory is not None else b"null",
            b',"messages":',
            row["messages"].encode(),
            b',"processing":',
            row["processing"].encode() if row["processing"] is not None else b"null",
            b',"last_sequence":',
            str(last).encode() if last >= 0 else b"null",
            b',"memory_lag_messages":',
            str(last - covered).encode(),
            b"}",
        )
    )
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
