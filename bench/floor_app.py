"""The floor: the least an HTTP service can do to answer GET context and to store a round with
this schema.

Starlette + an asyncpg pool and the service's own statements, with no validation, no dependency
injection, no ORM, no explicit transaction:

- read floor, ``GET /conversations/{id}/context``: the context statement (``CONTEXT_SQL`` from
  app/repositories/memory.py, which has PostgreSQL build the whole response as JSON), its text
  returned as the body;
- write floor, ``POST /conversations/{id}/messages``: the append statement of
  app/repositories/rounds.py, compiled for asyncpg exactly as SQLAlchemy sends it for the
  service, with the parameters the service passes for a round without metadata or
  Idempotency-Key (its default policy, context spec and wake point, metadata limits); it answers
  201 with the JSON PostgreSQL builds. It marks conversations due like the service does, but
  starts no summary and pokes no runner.

Served by uvicorn exactly like the service:
``FLOOR_DATABASE_URL=postgresql://... python -m uvicorn bench.floor_app:app --no-access-log``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import asyncpg
import orjson
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

# The service's own statements, imported rather than copied so the floor and the service cannot drift.
# Context: $1 = conversation_id, $2 = tenant_id, $3/$4 = the raw part's caps; NULL for an unknown
# conversation.
from app.db import READ_POOL_SERVER_SETTINGS, SERVER_SETTINGS
from app.memory.policies import build_policy, policy_dump, resolve
from app.memory.service import EMPTY
from app.memory.tokens import counter_for
from app.repositories.memory import CONTEXT_SQL
from app.repositories.messages import NewMessage
from app.repositories.rounds import APPEND_SQL as _APPEND
from app.repositories.rounds import append_params
from app.settings import Settings

# The service's default caps on the raw part (messages, bytes), so both run the same plan.
_DEFAULTS = Settings(_env_file=None)
CONTEXT_LIMITS = (_DEFAULTS.MEMORY_MAX_CONTEXT_MESSAGES, _DEFAULTS.MEMORY_MAX_CONTEXT_BYTES)
# No ?max_tokens and no ?context_window: the context statement's last two parameters.
CONTEXT_PARAMS = (*CONTEXT_LIMITS, None, None)
_COUNTER = counter_for(_DEFAULTS.MEMORY_MODEL)

# The append statement as the service's engine sends it: SQLAlchemy compiles the named parameters
# of text() to $1..$n for asyncpg, in APPEND_PARAMS order.
_COMPILED_APPEND = _APPEND.compile(dialect=asyncpg_dialect())  # type: ignore[no-untyped-call]
APPEND_SQL = str(_COMPILED_APPEND)
APPEND_PARAMS: tuple[str, ...] = tuple(_COMPILED_APPEND.positiontup or ())

# What the service passes for a new conversation: its default policy, context spec and wake point.
_POLICY = build_policy(resolve(_DEFAULTS.default_policy, _DEFAULTS.policy_defaults))


def _dsn() -> str:
    url = os.environ["FLOOR_DATABASE_URL"]
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    size = int(os.environ.get("FLOOR_POOL_SIZE", Settings.model_fields["DATABASE_POOL_SIZE"].default))
    # UTC like the service's connections, so timestamps in the JSON read the same.
    # FLOOR_READ_POOL_MIN: a run that only writes need not hold the read pool's connections.
    read_min = int(os.environ.get("FLOOR_READ_POOL_MIN", size))
    pool = await asyncpg.create_pool(
        _dsn(), min_size=min(read_min, size), max_size=size, server_settings=READ_POOL_SERVER_SETTINGS
    )
    # The writes get a pool of their own, with the service's engine's session settings (the
    # read pool forces generic plans, which the service's write path does not).
    write_pool = await asyncpg.create_pool(_dsn(), min_size=1, max_size=size, server_settings=SERVER_SETTINGS)
    app.state.pool = pool
    app.state.write_pool = write_pool
    try:
        yield
    finally:
        await write_pool.close()
        await pool.close()


async def context(request: Request) -> Response:
    pool: asyncpg.Pool = request.app.state.pool
    async with pool.acquire() as conn:
        body: str | None = await conn.fetchval(
            CONTEXT_SQL, request.path_params["conversation_id"], "default", *CONTEXT_PARAMS
        )
    if body is None:
        return Response(b'{"detail":"not found","code":"not_found"}', 404, media_type="application/json")
    return Response(body, media_type="application/json")


async def append(request: Request) -> Response:
    pool: asyncpg.Pool = request.app.state.write_pool
    body = orjson.loads(await request.body())
    # The same parameters as the service's, token counts included (plain messages only).
    items = [
        NewMessage(role=m["role"], content=m["content"], metadata=m.get("metadata")) for m in body["messages"]
    ]
    items = [replace(m, tokens=_COUNTER.message(m.as_posted())) for m in items]
    params = append_params(
        conversation_id=request.path_params["conversation_id"],
        tenant_id="default",
        items=items,
        metadata=body.get("metadata"),
        idempotency=None,
        default_policy=policy_dump(_POLICY.config),
        default_context=_POLICY.context,
        default_wake=_POLICY.wake(EMPTY),
        max_metadata_bytes=_DEFAULTS.MEMORY_MAX_METADATA_BYTES,
        max_metadata_keys=_DEFAULTS.MEMORY_MAX_METADATA_KEYS,
    )
    async with pool.acquire() as conn:
        row = await conn.fetchrow(APPEND_SQL, *(params[name] for name in APPEND_PARAMS))
    if row is None:  # another tenant's id, or metadata over the limits: not in the floor's load
        return Response(b'{"detail":"refused","code":"conflict"}', 409, media_type="application/json")
    return Response(row["body"], 201, media_type="application/json")


async def healthz(_request: Request) -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")


app = Starlette(
    routes=[
        Route("/conversations/{conversation_id}/context", context, methods=["GET"]),
        Route("/conversations/{conversation_id}/messages", append, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ],
    lifespan=lifespan,
)
