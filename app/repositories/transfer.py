"""SQL that moves a whole conversation: its export document, an import in bulk, and clearing
it (seed 003's clearSession), across conversations, messages, tool_calls, tool_results, memory
and idempotency_keys."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection

from app.memory.transfer import ImportPlan
from app.memory.types import ContextSpec, Wake
from app.repositories.statements import sql

FORMAT = "memory-service.conversation"
VERSION = 1


def _ts(column: str) -> str:
    """A timestamp as ISO 8601 in UTC with microseconds, whatever the session's time zone, so an
    export is the same text wherever it is made."""
    return f"""to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


# The document, built by PostgreSQL in one statement (one snapshot): content, tool calls and
# metadata are the stored json text, so they come out exactly as posted.
_EXPORT = sql(
    f"""
    WITH conv AS (
        SELECT conversation_id, created_at, memory_policy, metadata, user_id, ended_at FROM conversations
        WHERE conversation_id = :conversation_id AND tenant_id = :tenant_id
    )
    SELECT json_build_object(
        'format', CAST(:format AS text),
        'version', CAST(:version AS int),
        'conversation', json_build_object(
            'conversation_id', conv.conversation_id, 'created_at', {_ts("conv.created_at")},
            'memory_policy', conv.memory_policy, 'metadata', conv.metadata, 'user_id', conv.user_id,
            'ended_at', {_ts("conv.ended_at")}),
        'entries', coalesce((
            SELECT json_agg(json_build_object(
                'sequence', m.sequence, 'round', m.round, 'type', m.kind, 'role', m.role,
                'content', m.content, 'name', m.name, 'tool_calls', m.tool_calls,
                'tool_call_id', m.tool_call_id, 'source', m.source, 'tokens', m.tokens,
                'metadata', m.metadata, 'created_at', {_ts("m.created_at")}) ORDER BY m.sequence)
            FROM messages m WHERE m.conversation_id = conv.conversation_id), '[]'::json),
        'memories', coalesce((
            SELECT json_agg(json_build_object(
                'memory_id', r.memory_id, 'kind', r.kind, 'status', r.status,
                'start_sequence', r.start_sequence, 'end_sequence', r.end_sequence,
                'start_round', r.start_round, 'end_round', r.end_round,
                'input_start_sequence', r.input_start_sequence, 'base_memory_id', r.base_memory_id,
                'text', r.memory_text, 'created_at', {_ts("r.created_at")},
                'completed_at', {_ts("r.completed_at")}, 'generation_time_ms', r.generation_time_ms,
                'attempts', r.attempts, 'error', r.error, 'tokens', r.tokens,
                'input_tokens', r.input_tokens, 'from_at', {_ts("r.from_at")}, 'to_at', {_ts("r.to_at")})
                ORDER BY r.memory_id)
            FROM memory r WHERE r.conversation_id = conv.conversation_id), '[]'::json)
    )::text
    FROM conv
    """
)


async def size(conn: AsyncConnection, *, conversation_id: str, tenant_id: str) -> tuple[int, int] | None:
    """(entries, memory rows) of the conversation, or None when the tenant has no such one."""
    row = (
        await conn.execute(
            sql(
                """
                SELECT c.next_sequence,
                       (SELECT count(*) FROM memory m WHERE m.conversation_id = c.conversation_id) AS rows
                FROM conversations c
                WHERE c.conversation_id = :conversation_id AND c.tenant_id = :tenant_id
                """
            ),
            {"conversation_id": conversation_id, "tenant_id": tenant_id},
        )
    ).one_or_none()
    return None if row is None else (int(row.next_sequence), int(row.rows))


async def export_json(conn: AsyncConnection, *, conversation_id: str, tenant_id: str) -> str | None:
    """The conversation's export document as JSON text, or None when the tenant has no such one."""
    found: str | None = await conn.scalar(
        _EXPORT,
        {"conversation_id": conversation_id, "tenant_id": tenant_id, "format": FORMAT, "version": VERSION},
    )
    return found


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


@dataclass(frozen=True, slots=True)
class NewConversation:
    conversation_id: str
    tenant_id: str
    created_at: datetime
    metadata: dict[str, Any]
    memory_policy: dict[str, Any]
    context: ContextSpec
    user_id: str | None
    ended_at: datetime | None
    last_message_at: datetime  # its newest entry's time (archiving and listings go by it)


async def insert_conversation(
    conn: AsyncConnection, *, new: NewConversation, plan: ImportPlan
) -> tuple[int, int] | None:
    """The imported conversation's row with its counters; None when the id is taken (by any
    tenant), else the size of its metadata (bytes, keys) as the limits measure it. Its wake
    point is 0 (ask the policy at once) until the import settles it."""
    inserted = (
        await conn.execute(
            sql(
                """
                INSERT INTO conversations (conversation_id, tenant_id, created_at, metadata, memory_policy,
                                           context_summaries, context_recent_rounds,
                                           context_max_summary_tokens, user_id, ended_at, next_sequence,
                                           next_round, next_tokens, open_tool_calls, last_message_at,
                                           last_event_id)
                VALUES (:conversation_id, :tenant_id, :created_at, CAST(:metadata AS jsonb),
                        CAST(:memory_policy AS jsonb), :context_summaries, :context_recent_rounds,
                        CAST(:context_max_summary_tokens AS integer), :user_id, :ended_at,
                        :next_sequence, :next_round, :next_tokens, :open_tool_calls, :last_message_at,
                        -- Imported under the id of a deleted one: its events go on after the old ones.
                        (SELECT coalesce(max(event_id), 0) FROM events
                         WHERE conversation_id = CAST(:conversation_id AS varchar)))
                ON CONFLICT (conversation_id) DO NOTHING
                RETURNING octet_length(metadata::text) AS bytes,
                          (SELECT count(*) FROM jsonb_object_keys(metadata)) AS keys
                """
            ),
            {
                "conversation_id": new.conversation_id,
                "tenant_id": new.tenant_id,
                "created_at": new.created_at,
                "metadata": _json(new.metadata),
                "memory_policy": _json(new.memory_policy),
                "context_summaries": new.context.summaries,
                "context_recent_rounds": new.context.recent_rounds,
                "context_max_summary_tokens": new.context.max_summary_tokens,
                "user_id": new.user_id,
                "ended_at": new.ended_at,
                "next_sequence": plan.next_sequence,
                "next_round": plan.next_round,
                "next_tokens": plan.next_tokens,
                "open_tool_calls": plan.open_tool_calls,
                "last_message_at": new.last_message_at,
            },
        )
    ).one_or_none()
    return None if inserted is None else (int(inserted.bytes), int(inserted.keys))


_MESSAGE_COLUMNS = (
    "conversation_id",
    "sequence",
    "round",
    "role",
    "content",
    "metadata",
    "content_bytes",
    "kind",
    "name",
    "tool_calls",
    "tool_call_id",
    "source",
    "tokens",
    "tokens_before",
    "boundary",
    "created_at",
)


async def insert_entries(
    conn: AsyncConnection, *, conversation_id: str, entries: Sequence[Any], plan: ImportPlan
) -> None:
    """Every entry with COPY (in the caller's transaction: half as long as an INSERT of arrays
    for 10,000 entries), then its tool calls and their results."""
    records = []
    for entry, before, boundary in zip(entries, plan.tokens_before, plan.boundaries, strict=True):
        content, metadata = _json(entry.content), _json(entry.metadata)
        calls = None if entry.tool_calls is None else _json([c.model_dump() for c in entry.tool_calls])
        # What the append stores: the bytes the entry adds to a response.
        size = sum(len(part.encode()) for part in (content, metadata, calls) if part is not None)
        records.append(
            (
                conversation_id,
                entry.sequence,
                entry.round,
                entry.role,
                content,
                metadata,
                size,
                entry.type,
                entry.name,
                calls,
                entry.tool_call_id,
                entry.source,
                entry.tokens,
                before,
                boundary,
                entry.created_at,
            )
        )
    if records:
        raw = await conn.get_raw_connection()
        await raw.driver_connection.copy_records_to_table(  # type: ignore[union-attr]
            "messages", records=records, columns=_MESSAGE_COLUMNS
        )
    for table, pairs in (("tool_calls", plan.calls), ("tool_results", plan.results)):
        if pairs:
            await conn.execute(
                sql(
                    f"INSERT INTO {table} (conversation_id, call_id, sequence) "
                    "SELECT :conversation_id, t.call_id, t.sequence "
                    "FROM unnest(CAST(:ids AS varchar[]), CAST(:sequences AS int[])) AS t(call_id, sequence)"
                ),
                {
                    "conversation_id": conversation_id,
                    "ids": [call_id for call_id, _ in pairs],
                    "sequences": [sequence for _, sequence in pairs],
                },
            )


async def new_memory_ids(conn: AsyncConnection, *, count: int) -> list[int]:
    """``count`` fresh memory ids from the table's sequence, ascending."""
    rows = await conn.execute(
        sql("SELECT nextval(pg_get_serial_sequence('memory', 'memory_id')) FROM generate_series(1, :n)"),
        {"n": count},
    )
    return sorted(int(r[0]) for r in rows)


async def insert_memories(
    conn: AsyncConnection, *, conversation_id: str, rows: Sequence[Any], ids: dict[int, int]
) -> None:
    """The memory rows (completed and failed) under their new ids, bases renumbered: one
    statement, so a base inserted with the row built on it satisfies the foreign key."""
    if not rows:
        return
    await conn.execute(
        sql(
            """
            INSERT INTO memory (memory_id, conversation_id, memory_text, kind, status, start_sequence,
                                end_sequence, start_round, end_round, input_start_sequence, base_memory_id,
                                created_at, completed_at, generation_time_ms, attempts, error, tokens,
                                input_tokens, from_at, to_at)
            SELECT t.memory_id, :conversation_id, t.memory_text, t.kind, t.status, t.start_sequence,
                   t.end_sequence, t.start_round, t.end_round, t.input_start_sequence, t.base_memory_id,
                   t.created_at, t.completed_at, t.generation_time_ms, t.attempts, t.error, t.tokens,
                   t.input_tokens, t.from_at, t.to_at
            FROM unnest(CAST(:ids AS int[]), CAST(:texts AS text[]), CAST(:kinds AS varchar[]),
                        CAST(:statuses AS varchar[]), CAST(:starts AS int[]), CAST(:ends AS int[]),
                        CAST(:start_rounds AS int[]), CAST(:end_rounds AS int[]), CAST(:inputs AS int[]),
                        CAST(:bases AS int[]), CAST(:created AS timestamptz[]),
                        CAST(:completed AS timestamptz[]), CAST(:ms AS int[]), CAST(:attempts AS int[]),
                        CAST(:errors AS text[]), CAST(:tokens AS int[]), CAST(:input_tokens AS bigint[]),
                        CAST(:from_at AS timestamptz[]), CAST(:to_at AS timestamptz[]))
                 AS t(memory_id, memory_text, kind, status, start_sequence, end_sequence, start_round,
                      end_round, input_start_sequence, base_memory_id, created_at, completed_at,
                      generation_time_ms, attempts, error, tokens, input_tokens, from_at, to_at)
            """
        ),
        {
            "conversation_id": conversation_id,
            "ids": [ids[r.memory_id] for r in rows],
            "texts": [r.text for r in rows],
            "kinds": [r.kind for r in rows],
            "statuses": [r.status for r in rows],
            "starts": [r.start_sequence for r in rows],
            "ends": [r.end_sequence for r in rows],
            "start_rounds": [r.start_round for r in rows],
            "end_rounds": [r.end_round for r in rows],
            "inputs": [r.input_start_sequence for r in rows],
            "bases": [None if r.base_memory_id is None else ids[r.base_memory_id] for r in rows],
            "created": [r.created_at for r in rows],
            "completed": [r.completed_at for r in rows],
            "ms": [r.generation_time_ms for r in rows],
            "attempts": [r.attempts for r in rows],
            "errors": [r.error for r in rows],
            "tokens": [r.tokens for r in rows],
            "input_tokens": [r.input_tokens for r in rows],
            "from_at": [r.from_at for r in rows],
            "to_at": [r.to_at for r in rows],
        },
    )


async def mark_due(conn: AsyncConnection, *, conversation_id: str) -> None:
    """A summary of the conversation is due now: any runner claims it and asks its policy."""
    await conn.execute(
        sql("UPDATE conversations SET summary_due_at = now() WHERE conversation_id = :conversation_id"),
        {"conversation_id": conversation_id},
    )


@dataclass(frozen=True, slots=True)
class Cleared:
    entries: int
    memories: int
    dropped_processing: int | None


async def clear(conn: AsyncConnection, *, conversation_id: str, wake: Wake) -> Cleared:
    """Delete the conversation's entries, tool calls, memory rows (a summary in flight included)
    and idempotency keys, and start it again as new: sequences and rounds from 0, no tokens, no
    due work, no failure streak, the policy's first wake point. The conversation, its policy and
    its metadata stay.

    The caller holds the conversation's row lock (app.repositories.work.lock), so a round being
    stored finishes before, or waits and comes after, and each statement here sees it. A summary
    in flight finds its row gone when it completes (app.repositories.memory.complete matches the
    row's id, which is never reused) and its result is dropped."""
    params = {"conversation_id": conversation_id}
    rows = (
        await conn.execute(
            sql("DELETE FROM memory WHERE conversation_id = :conversation_id RETURNING memory_id, status"),
            params,
        )
    ).all()
    await conn.execute(sql("DELETE FROM tool_results WHERE conversation_id = :conversation_id"), params)
    await conn.execute(sql("DELETE FROM tool_calls WHERE conversation_id = :conversation_id"), params)
    entries = await conn.execute(sql("DELETE FROM messages WHERE conversation_id = :conversation_id"), params)
    await conn.execute(sql("DELETE FROM idempotency_keys WHERE conversation_id = :conversation_id"), params)
    await conn.execute(
        sql(
            """
            UPDATE conversations
            SET next_sequence = 0, next_round = 0, next_tokens = 0, open_tool_calls = 0,
                summary_failures = 0, summary_retry_at = NULL, summary_due_at = NULL,
                wake_round = :wake_round, wake_sequence = :wake_sequence, wake_tokens = :wake_tokens
            WHERE conversation_id = :conversation_id
            """
        ),
        {**params, "wake_round": wake.round, "wake_sequence": wake.sequence, "wake_tokens": wake.tokens},
    )
    in_flight = next((int(r.memory_id) for r in rows if r.status == "processing"), None)
    return Cleared(entries=int(entries.rowcount), memories=len(rows), dropped_processing=in_flight)
