"""SQL for the messages table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection

from app.memory.types import Content, Message
from app.repositories.statements import Db, Statement, sql

# Columns a message is returned with, in order (the append and the context read build the same
# shape in SQL: OUT_COLUMNS).
OUT_COLUMNS = (
    "sequence, round, kind AS type, role, content, name, tool_calls, tool_call_id, source, tokens, "
    "metadata, created_at"
)


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to store: the chat message as posted, its entry type and its token count."""

    role: str
    content: Content | None
    metadata: dict[str, Any] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    source: str | None = None
    kind: str = "message"
    tokens: int = 0

    @property
    def size(self) -> int:
        """Roughly what counting it costs: the characters of its content and tool calls."""
        content = self.content if isinstance(self.content, str) else orjson.dumps(self.content)
        calls = sum(len(c["function"]["arguments"]) for c in self.tool_calls or ())
        return len(content) + calls

    def as_posted(self) -> dict[str, Any]:
        """The chat message as the client sent it (what is counted and hashed)."""
        posted: dict[str, Any] = {"role": self.role, "content": self.content}
        for key in ("name", "tool_calls", "tool_call_id", "source"):
            if getattr(self, key) is not None:
                posted[key] = getattr(self, key)
        if self.kind == "context":
            posted["type"] = "context"
        return posted


_BETWEEN = Statement(
    """
    SELECT sequence, round, role, content, kind, name, tool_calls, tool_call_id FROM messages
    WHERE conversation_id = :conversation_id AND sequence BETWEEN :start AND :end
    ORDER BY sequence
    """
)


async def between(conn: Db, *, conversation_id: str, start: int, end: int) -> list[Message]:
    """Messages with start <= sequence <= end, oldest first."""
    rows = await _BETWEEN.fetch(conn, {"conversation_id": conversation_id, "start": start, "end": end})
    return [Message(**r) for r in rows]


_BOUNDARIES_AFTER = Statement(
    """
    SELECT round, sequence FROM messages
    WHERE conversation_id = :conversation_id AND boundary AND round > :after
    ORDER BY round
    LIMIT :limit
    """
)


async def boundaries_after(
    conn: Db, *, conversation_id: str, after_round: int, limit: int
) -> tuple[tuple[int, int], ...]:
    """(round, first sequence) of the first ``limit`` boundaries after round ``after_round``
    (where a window may start), oldest first; an index probe (ix_messages_boundary_round)."""
    rows = await _BOUNDARIES_AFTER.fetch(
        conn, {"conversation_id": conversation_id, "after": after_round, "limit": limit}
    )
    return tuple((int(r["round"]), int(r["sequence"])) for r in rows)


async def page(
    conn: AsyncConnection, *, conversation_id: str, after_sequence: int, limit: int, max_bytes: int
) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``limit`` messages after ``after_sequence``, oldest first, cut to ``max_bytes`` of
    content (always at least one message). Returns the page and whether more messages follow.

    Sizes come from content_bytes, so only the messages returned are read in full."""
    rows = await conn.execute(
        sql(
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
            SELECT {OUT_COLUMNS}, s.candidates
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
