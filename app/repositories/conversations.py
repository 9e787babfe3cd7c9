"""SQL for the conversations table."""

from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

_ALLOCATE = text(
    """
    INSERT INTO conversations AS c (conversation_id, tenant_id, metadata, next_sequence)
    VALUES (:conversation_id, :tenant_id, CAST(:metadata AS jsonb), :count)
    ON CONFLICT (conversation_id) DO UPDATE
        SET next_sequence = c.next_sequence + :count,
            metadata = c.metadata || CAST(:metadata AS jsonb)
        WHERE c.tenant_id = :tenant_id
    RETURNING c.next_sequence - :count AS first_sequence, (xmax = 0) AS created
    """
)


async def allocate_sequences(
    conn: AsyncConnection,
    *,
    conversation_id: str,
    tenant_id: str,
    count: int,
    metadata: dict[str, Any] | None,
) -> tuple[int, bool] | None:
    """Create the conversation if needed and reserve ``count`` sequence numbers.

    One atomic statement: the row lock it takes serializes writers of the same conversation
    until commit, so ranges never overlap and never leave holes (a rolled-back request gives
    its range back). Returns (first sequence, created) or None when another tenant owns the id.
    """
    row = (
        await conn.execute(
            _ALLOCATE,
            {
                "conversation_id": conversation_id,
                "tenant_id": tenant_id,
                "count": count,
                "metadata": orjson.dumps(metadata or {}).decode(),
            },
        )
    ).one_or_none()
    if row is None:
        return None
    return int(row.first_sequence), bool(row.created)


async def get(conn: AsyncConnection, *, conversation_id: str, tenant_id: str) -> dict[str, Any] | None:
    row = (
        await conn.execute(
            text(
                """
                SELECT c.conversation_id, c.created_at, c.metadata, c.next_sequence AS message_count,
                       (SELECT count(*) FROM memory m WHERE m.conversation_id = c.conversation_id)
                           AS memory_count
                FROM conversations c
                WHERE c.conversation_id = :conversation_id AND c.tenant_id = :tenant_id
                """
            ),
            {"conversation_id": conversation_id, "tenant_id": tenant_id},
        )
    ).one_or_none()
    return None if row is None else dict(row._mapping)


async def last_sequence(conn: AsyncConnection, *, conversation_id: str) -> int | None:
    """Sequence of the newest message, None for an empty or deleted conversation."""
    value = await conn.scalar(
        text("SELECT next_sequence - 1 FROM conversations WHERE conversation_id = :conversation_id"),
        {"conversation_id": conversation_id},
    )
    return None if value is None or value < 0 else int(value)


async def exists(conn: AsyncConnection, *, conversation_id: str, tenant_id: str) -> bool:
    found = await conn.scalar(
        text(
            "SELECT 1 FROM conversations WHERE conversation_id = :conversation_id AND tenant_id = :tenant_id"
        ),
        {"conversation_id": conversation_id, "tenant_id": tenant_id},
    )
    return found is not None


async def list_page(
    conn: AsyncConnection, *, tenant_id: str, after: str | None, limit: int
) -> list[dict[str, Any]]:
    """Keyset pagination by conversation_id (stable under concurrent inserts)."""
    rows = await conn.execute(
        text(
            """
            SELECT c.conversation_id, c.created_at, c.metadata, c.next_sequence AS message_count,
                   (SELECT count(*) FROM memory m WHERE m.conversation_id = c.conversation_id)
                       AS memory_count
            FROM conversations c
            WHERE tenant_id = :tenant_id AND (CAST(:after AS varchar) IS NULL OR conversation_id > :after)
            ORDER BY conversation_id
            LIMIT :limit
            """
        ),
        {"tenant_id": tenant_id, "after": after, "limit": limit},
    )
    return [dict(r._mapping) for r in rows]


async def delete(conn: AsyncConnection, *, conversation_id: str, tenant_id: str) -> bool:
    """Delete a conversation with its messages and memories (ON DELETE CASCADE)."""
    deleted = await conn.scalar(
        text(
            "DELETE FROM conversations "
            "WHERE conversation_id = :conversation_id AND tenant_id = :tenant_id "
            "RETURNING 1"
        ),
        {"conversation_id": conversation_id, "tenant_id": tenant_id},
    )
    return deleted is not None
