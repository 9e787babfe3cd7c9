"""SQL for the idempotency_keys table."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from app.repositories.statements import sql


async def expire(conn: AsyncConnection, *, older_than_hours: float, batch: int = 5000) -> int:
    """Delete keys older than the TTL, a bounded batch at a time (runs on every replica)."""
    result = await conn.execute(
        sql(
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
