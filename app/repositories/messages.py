"""SQL for the messages table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.memory.types import Content, Message

# Columns a message is returned with (the context read builds the same shape in SQL).
_OUT = "sequence, round, role, content, metadata, created_at"


@dataclass(frozen=True, slots=True)
class NewMessage:
    role: str
    content: Content
    metadata: dict[str, Any] | None = None


async def insert_round(
    conn: AsyncConnection,
    *,
    conversation_id: str,
    round: int,
    first_sequence: int,
    items: Sequence[NewMessage],
) -> list[dict[str, Any]]:
    """Insert one round's messages with consecutive sequences in one round trip.

    Content goes in as JSON text and is stored as ``json`` (not jsonb), so objects come back
    with the client's key order.
    """
    rows = await conn.execute(
        text(
            f"""
            INSERT INTO messages (conversation_id, sequence, round, role, content, metadata)
            SELECT :conversation_id, :first + t.ord - 1, :round, t.role, t.content::json, t.metadata::json
            FROM unnest(CAST(:roles AS varchar[]), CAST(:contents AS text[]), CAST(:metadata AS text[]))
                 WITH ORDINALITY AS t(role, content, metadata, ord)
            RETURNING {_OUT}
            """
        ),
        {
            "conversation_id": conversation_id,
            "first": first_sequence,
            "round": round,
            "roles": [m.role for m in items],
            "contents": [orjson.dumps(m.content).decode() for m in items],
            "metadata": [None if m.metadata is None else orjson.dumps(m.metadata).decode() for m in items],
        },
    )
    return sorted((dict(r._mapping) for r in rows), key=lambda m: m["sequence"])


async def between(conn: AsyncConnection, *, conversation_id: str, start: int, end: int) -> list[Message]:
    """Messages with start <= sequence <= end, oldest first."""
    rows = await conn.execute(
        text(
            """
            SELECT sequence, round, role, content FROM messages
            WHERE conversation_id = :conversation_id AND sequence BETWEEN :start AND :end
            ORDER BY sequence
            """
        ),
        {"conversation_id": conversation_id, "start": start, "end": end},
    )
    return [Message(sequence=r.sequence, round=r.round, role=r.role, content=r.content) for r in rows]


async def round_starts(
    conn: AsyncConnection, *, conversation_id: str, lookback: int, last_sequence: int
) -> tuple[tuple[int, int], ...]:
    """(round, first sequence) of every round that starts within the last ``lookback`` messages
    (up to ``last_sequence``), oldest first. Reads at most ``lookback + 1`` rows."""
    lowest = last_sequence - lookback + 1
    rows = await conn.execute(
        text(
            """
            SELECT round, sequence FROM (
                SELECT round, sequence, lag(round) OVER (ORDER BY sequence) AS previous
                FROM messages
                WHERE conversation_id = :conversation_id AND sequence BETWEEN :lowest - 1 AND :last
            ) AS t
            WHERE sequence >= :lowest AND previous IS DISTINCT FROM round
            ORDER BY sequence
            """
        ),
        {"conversation_id": conversation_id, "lowest": lowest, "last": last_sequence},
    )
    return tuple((int(r.round), int(r.sequence)) for r in rows)


async def page(
    conn: AsyncConnection, *, conversation_id: str, after_sequence: int, limit: int
) -> list[dict[str, Any]]:
    rows = await conn.execute(
        text(
            f"""
            SELECT {_OUT} FROM messages
            WHERE conversation_id = :conversation_id AND sequence > :after
            ORDER BY sequence
            LIMIT :limit
            """
        ),
        {"conversation_id": conversation_id, "after": after_sequence, "limit": limit},
    )
    return [dict(r._mapping) for r in rows]
