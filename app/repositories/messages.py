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
            INSERT INTO messages (conversation_id, sequence, round, role, content, metadata, content_bytes)
            SELECT :conversation_id, :first + t.ord - 1, :round, t.role, t.content::json, t.metadata::json,
                   octet_length(t.content) + coalesce(octet_length(t.metadata), 0)
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
    conn: AsyncConnection, *, conversation_id: str, after_sequence: int, limit: int, max_bytes: int
) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``limit`` messages after ``after_sequence``, oldest first, cut to ``max_bytes`` of
    content (always at least one message). Returns the page and whether more messages follow.

    Sizes come from content_bytes, so only the messages returned are read in full."""
    rows = await conn.execute(
        text(
            f"""
            WITH candidates AS (
                SELECT sequence, content_bytes FROM messages
                WHERE conversation_id = :conversation_id AND sequence > :after
                ORDER BY sequence
                LIMIT :limit + 1
            ), sized AS (
                SELECT sequence, sum(content_bytes) OVER (ORDER BY sequence) AS bytes,
                       row_number() OVER (ORDER BY sequence) AS n, count(*) OVER () AS candidates
                FROM candidates
            )
            SELECT {_OUT}, s.candidates
            FROM sized s JOIN messages m USING (sequence)
            WHERE m.conversation_id = :conversation_id AND s.n <= :limit
              AND (s.n = 1 OR s.bytes <= :max_bytes)
            ORDER BY sequence
            """
        ),
        {"conversation_id": conversation_id, "after": after_sequence, "limit": limit, "max_bytes": max_bytes},
    )
    found = [dict(r._mapping) for r in rows]
    more = bool(found) and found[0]["candidates"] > len(found)
    for row in found:
        del row["candidates"]
    return found, more
