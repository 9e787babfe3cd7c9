"""SQL for the idempotency_keys table."""

from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


async def get(conn: AsyncConnection, *, conversation_id: str, key: str) -> dict[str, Any] | None:
    row = (
        await conn.execute(
            text(
                "SELECT request_hash, response::text AS response FROM idempotency_keys "
                "WHERE conversation_id = :conversation_id AND idempotency_key = :key"
            ),
            {"conversation_id": conversation_id, "key": key},
        )
    ).one_or_none()
    if row is None:
        return None
    return {"request_hash": row.request_hash, "response": orjson.loads(row.response)}


async def put(
    conn: AsyncConnection,
    *,
    conversation_id: str,
    key: str,
    request_hash: str,
    response: dict[str, Any],
) -> None:
    await conn.execute(
        text(
            "INSERT INTO idempotency_keys (conversation_id, idempotency_key, request_hash, response) "
            "VALUES (:conversation_id, :key, :hash, CAST(:response AS json))"
        ),
        {
            "conversation_id": conversation_id,
            "key": key,
            "hash": request_hash,
            "response": orjson.dumps(response).decode(),
        },
    )


async def expire(conn: AsyncConnection, *, older_than_hours: float, batch: int = 5000) -> int:
    """Delete keys older than the TTL, a bounded batch at a time (runs on every replica)."""
    result = await conn.execute(
        text(
            """
            DELETE FROM idempotency_keys WHERE ctid IN (
                SELECT ctid FROM idempotency_keys
                WHERE created_at < now() - make_interval(secs => :ttl)
                LIMIT :batch FOR UPDATE SKIP LOCKED)
            """
        ),
        {"ttl": older_than_hours * 3600, "batch": batch},
    )
    return int(result.rowcount)
