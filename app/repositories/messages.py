"""SQL for the messages table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.memory.summarizers import Message


async def insert_many(
    conn: AsyncConnection,
    *,
    conversation_id: str,
    first_sequence: int,
    items: Sequence[tuple[str, str]],
) -> list[dict[str, Any]]:
    """Insert (role, content) pairs with consecutive sequences in one round trip."""
    rows = await conn.execute(
        text(
            """
            INSERT INTO messages (conversation_id, sequence, role, content)
            SELECT :conversation_id, :first + t.ord - 1, t.role, t.content
            FROM unnest(CAST(:roles AS varchar[]), CAST(:contents AS text[]))
                 WITH ORDINALITY AS t(role, content, ord)
            RETURNING sequence, role, content, created_at
            """
        ),
        {
            "conversation_id": conversation_id,
            "first": first_sequence,
            "roles": [role for role, _ in items],
            "contents": [content for _, content in items],
        },
    )
    return sorted((dict(r._mapping) for r in rows), key=lambda m: m["sequence"])


async def between(conn: AsyncConnection, *, conversation_id: str, start: int, end: int) -> list[Message]:
    """Messages with start <= sequence <= end, oldest first."""
    rows = await conn.execute(
        text(
            """
            SELECT sequence, role, content FROM messages
            WHERE conversation_id = :conversation_id AND sequence BETWEEN :start AND :end
            ORDER BY sequence
            """
        ),
        {"conversation_id": conversation_id, "start": start, "end": end},
    )
    return [Message(sequence=r.sequence, role=r.role, content=r.content) for r in rows]


async def page(
    conn: AsyncConnection, *, conversation_id: str, after_sequence: int, limit: int
) -> list[dict[str, Any]]:
    rows = await conn.execute(
        text(
            """
            SELECT sequence, role, content, created_at FROM messages
            WHERE conversation_id = :conversation_id AND sequence > :after
            ORDER BY sequence
            LIMIT :limit
            """
        ),
        {"conversation_id": conversation_id, "after": after_sequence, "limit": limit},
    )
    return [dict(r._mapping) for r in rows]
