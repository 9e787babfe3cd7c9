"""SQL for the memory table (seed 004), including the context read and the ops queries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.memory.types import MemoryRef, SummaryPlan

_MEMORY_COLUMNS = (
    "memory_id, conversation_id, kind, memory_text, start_sequence, end_sequence, start_round, "
    "end_round, input_start_sequence, base_memory_id, status, created_at, generation_time_ms, "
    "completed_at, lease_expires_at, attempts, error"
)


# The newest row of each status, each one index probe on idx_memory_conversation_status (an
# ORDER BY over all statuses would read every row of the conversation).
_NEWEST_BY_STATUS = " UNION ALL ".join(
    f"""(SELECT memory_id, kind, status, start_sequence, end_sequence, start_round, end_round
        FROM memory WHERE conversation_id = :conversation_id AND status = '{status}'
        ORDER BY end_sequence DESC, memory_id DESC LIMIT 1)"""
    for status in ("completed", "processing", "failed")
)


async def newest_refs(
    conn: AsyncConnection, *, conversation_id: str
) -> tuple[MemoryRef | None, MemoryRef | None]:
    """(the latest completed memory, the memory with the newest range whatever its status)."""
    rows = await conn.execute(text(_NEWEST_BY_STATUS), {"conversation_id": conversation_id})
    refs = [MemoryRef(**dict(r._mapping)) for r in rows]
    latest = next((r for r in refs if r.status == "completed"), None)
    newest = max(refs, key=lambda r: (r.end_sequence, r.memory_id), default=None)
    return latest, newest


async def insert_processing(
    conn: AsyncConnection,
    *,
    conversation_id: str,
    plan: SummaryPlan,
    lease_seconds: float,
) -> dict[str, Any] | None:
    """Insert the 'processing' row of ``plan``, or nothing when one already exists for the
    conversation.

    The plan is in rounds; its sequences are looked up here (the first message of a round is the
    one after the last message of the rounds before it), each a short backward scan of the
    primary key from the newest message. The partial unique index makes this the one place that
    decides, across replicas, who starts the summary: the loser of a race gets None and starts
    no task. The NOT EXISTS pre-check only spares a memory_id (a sequence value) in the common,
    race-free case, so ids stay consecutive.
    """
    row = (
        await conn.execute(
            text(
                f"""
                WITH bounds AS (
                    SELECT
                        coalesce((SELECT sequence + 1 FROM messages
                                  WHERE conversation_id = :conversation_id AND round < :start_round
                                  ORDER BY sequence DESC LIMIT 1), 0) AS start_sequence,
                        coalesce((SELECT sequence + 1 FROM messages
                                  WHERE conversation_id = :conversation_id AND round < :input_round
                                  ORDER BY sequence DESC LIMIT 1), 0) AS input_start_sequence,
                        (SELECT sequence FROM messages
                         WHERE conversation_id = :conversation_id AND round <= :end_round
                         ORDER BY sequence DESC LIMIT 1) AS end_sequence
                )
                INSERT INTO memory (conversation_id, memory_text, kind, start_sequence, end_sequence,
                                    start_round, end_round, input_start_sequence, base_memory_id,
                                    status, lease_expires_at)
                SELECT CAST(:conversation_id AS varchar), '', :kind, b.start_sequence, b.end_sequence,
                       :start_round, :end_round, b.input_start_sequence, :base, 'processing',
                       now() + make_interval(secs => :lease)
                FROM bounds b
                WHERE NOT EXISTS (SELECT 1 FROM memory
                                  WHERE conversation_id = :conversation_id AND status = 'processing')
                ON CONFLICT (conversation_id) WHERE status = 'processing' DO NOTHING
                RETURNING {_MEMORY_COLUMNS}
                """
            ),
            {
                "conversation_id": conversation_id,
                "kind": plan.kind,
                "start_round": plan.start_round,
                "end_round": plan.end_round,
                "input_round": plan.input_start_round,
                "base": plan.base_memory_id,
                "lease": lease_seconds,
            },
        )
    ).one_or_none()
    return None if row is None else dict(row._mapping)


async def get(conn: AsyncConnection, *, memory_id: int) -> dict[str, Any] | None:
    row = (
        await conn.execute(
            text(f"SELECT {_MEMORY_COLUMNS} FROM memory WHERE memory_id = :memory_id"),
            {"memory_id": memory_id},
        )
    ).one_or_none()
    return None if row is None else dict(row._mapping)


async def complete(
    conn: AsyncConnection, *, memory_id: int, memory_text: str, generation_time_ms: int
) -> bool:
    """Mark a processing row completed and end its conversation's failure streak. False when it
    is no longer processing (reaped or its conversation deleted): the result is discarded."""
    done = await conn.scalar(
        text(
            """
            WITH done AS (
                UPDATE memory
                SET status = 'completed', memory_text = :memory_text,
                    generation_time_ms = :ms, completed_at = now(), lease_expires_at = NULL,
                    error = NULL
                WHERE memory_id = :memory_id AND status = 'processing'
                RETURNING conversation_id
            ), reset AS (
                UPDATE conversations c SET summary_failures = 0, summary_retry_at = NULL
                FROM done WHERE c.conversation_id = done.conversation_id AND c.summary_failures > 0
            )
            SELECT 1 FROM done
            """
        ),
        {"memory_id": memory_id, "memory_text": memory_text, "ms": generation_time_ms},
    )
    return done is not None


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long a conversation waits after its n-th failure in a row: nothing after the first
    (the next round retries, as seed 004 does), then base * 2^(n-2), capped."""

    base_seconds: float
    max_seconds: float


# The conversation's streak grows by one and, from the second failure on, its next summary
# waits; used by every failure path. (c.summary_failures is the streak before this failure.)
_BACK_OFF = """
    UPDATE conversations c
    SET summary_failures = c.summary_failures + 1,
        summary_retry_at = CASE WHEN c.summary_failures = 0 THEN NULL ELSE now() + make_interval(
            secs => least(:backoff_max, :backoff_base * power(2, least(c.summary_failures - 1, 30))))
            END
    FROM failed WHERE c.conversation_id = failed.conversation_id
"""


async def fail(
    conn: AsyncConnection,
    *,
    memory_id: int,
    error: str,
    generation_time_ms: int | None,
    backoff: Backoff | None,
) -> bool:
    """Mark a processing row failed. With ``backoff``, the conversation's failure streak grows
    and its next summary waits; without (a shutdown interrupted it), the streak is untouched."""
    streak = f", streak AS ({_BACK_OFF})" if backoff is not None else ""
    done = await conn.scalar(
        text(
            f"""
            WITH failed AS (
                UPDATE memory
                SET status = 'failed', error = :error, generation_time_ms = :ms,
                    completed_at = now(), lease_expires_at = NULL
                WHERE memory_id = :memory_id AND status = 'processing'
                RETURNING conversation_id
            ){streak}
            SELECT 1 FROM failed
            """
        ),
        {
            "memory_id": memory_id,
            "error": error[:2000],
            "ms": generation_time_ms,
            **(
                {}
                if backoff is None
                else {"backoff_base": backoff.base_seconds, "backoff_max": backoff.max_seconds}
            ),
        },
    )
    return done is not None


async def renew_leases(conn: AsyncConnection, *, memory_ids: list[int], lease_seconds: float) -> int:
    result = await conn.execute(
        text(
            """
            UPDATE memory SET lease_expires_at = now() + make_interval(secs => :lease)
            WHERE memory_id = ANY(CAST(:ids AS integer[])) AND status = 'processing'
            """
        ),
        {"ids": memory_ids, "lease": lease_seconds},
    )
    return int(result.rowcount)


async def reap_expired(conn: AsyncConnection, *, backoff: Backoff) -> list[dict[str, Any]]:
    """Fail processing rows whose lease expired (their worker died) and back their conversations
    off. Safe to run from every replica at once: each row moves once, and rows whose owner
    renews its lease are untouched."""
    rows = await conn.execute(
        text(
            f"""
            WITH failed AS (
                UPDATE memory
                SET status = 'failed', completed_at = now(), lease_expires_at = NULL,
                    error = 'lease expired: the worker stopped renewing it (crash, kill or redeploy)'
                WHERE status = 'processing' AND lease_expires_at < now()
                RETURNING memory_id, conversation_id, start_sequence, end_sequence
            ), streak AS ({_BACK_OFF})
            SELECT * FROM failed
            """
        ),
        {"backoff_base": backoff.base_seconds, "backoff_max": backoff.max_seconds},
    )
    return [dict(r._mapping) for r in rows]


async def restart_failed(
    conn: AsyncConnection, *, memory_id: int, tenant_id: str, lease_seconds: float
) -> dict[str, Any] | str | None:
    """Move a failed row back to processing for a retry. Returns the row; None when the tenant
    has no such memory; its status when it is not failed; or 'busy' when the conversation
    already has a summary processing."""
    owned = await conn.scalar(
        text(
            """
            SELECT m.status FROM memory m JOIN conversations c USING (conversation_id)
            WHERE m.memory_id = :memory_id AND c.tenant_id = :tenant_id
            """
        ),
        {"memory_id": memory_id, "tenant_id": tenant_id},
    )
    if owned is None:
        return None
    if owned != "failed":
        return str(owned)
    row = (
        await conn.execute(
            text(
                f"""
                UPDATE memory
                SET status = 'processing', error = NULL, completed_at = NULL,
                    generation_time_ms = NULL, attempts = attempts + 1,
                    lease_expires_at = now() + make_interval(secs => :lease)
                WHERE memory_id = :memory_id AND status = 'failed'
                  AND NOT EXISTS (
                      SELECT 1 FROM memory p
                      WHERE p.conversation_id = memory.conversation_id AND p.status = 'processing')
                RETURNING {_MEMORY_COLUMNS}
                """
            ),
            {"memory_id": memory_id, "lease": lease_seconds},
        )
    ).one_or_none()
    return "busy" if row is None else dict(row._mapping)


# GET /context in one round trip, with the whole response built by PostgreSQL as JSON: the
# conversation (tenant-checked), the newest K completed summaries its policy shows, the memory in
# flight, and the raw messages. The hot read path skips SQLAlchemy and pydantic: it runs this on
# a plain asyncpg pool (app.db.create_read_pool). bench/floor_app.py runs this same statement.
# Plain asyncpg placeholders: $1 = conversation_id, $2 = tenant_id, $3 = most raw messages,
# $4 = most raw bytes (content_bytes). Returns NULL for an unknown conversation.
#
# The raw part starts at the earliest of: the message after the newest shown summary (nothing is
# ever missing), the first message of the last R rounds (the policy's recent window), and the
# first input message of the oldest failed summary newer than the oldest shown one (its range
# would otherwise be in neither part; failed ranges come in order, so the oldest is the first in
# idx_memory_conversation_status). Every lookup is an index probe, or a backward scan of the
# primary key over the last R rounds, so the cost does not grow with history.
CONTEXT_SQL = """
WITH conv AS (
    SELECT next_sequence, next_round, context_summaries, context_recent_rounds,
           memory_policy ->> 'name' AS policy, summary_failures, summary_retry_at
    FROM conversations
    WHERE conversation_id = $1 AND tenant_id = $2
), shown AS (
    SELECT memory_id, kind, memory_text AS text, start_sequence, end_sequence, start_round,
           end_round, base_memory_id, created_at, completed_at, generation_time_ms
    FROM memory
    WHERE conversation_id = $1 AND status = 'completed' AND EXISTS (SELECT 1 FROM conv)
    ORDER BY end_sequence DESC, memory_id DESC
    LIMIT (SELECT context_summaries FROM conv)
), proc AS (
    SELECT memory_id, kind, start_sequence, end_sequence, base_memory_id, created_at
    FROM memory
    WHERE conversation_id = $1 AND status = 'processing' AND EXISTS (SELECT 1 FROM conv)
), bounds AS (
    SELECT
        coalesce((SELECT max(end_sequence) FROM shown), -1) AS newest_end,
        least(
            coalesce((SELECT max(end_sequence) FROM shown), -1) + 1,
            coalesce((SELECT m.sequence + 1 FROM messages m
                      WHERE m.conversation_id = $1
                        AND m.round < (SELECT next_round - context_recent_rounds FROM conv)
                      ORDER BY m.sequence DESC LIMIT 1), 0),
            (SELECT f.input_start_sequence FROM memory f
             WHERE f.conversation_id = $1 AND f.status = 'failed'
               AND f.end_sequence > CASE
                   WHEN (SELECT count(*) FROM shown) < (SELECT context_summaries FROM conv) THEN -1
                   ELSE (SELECT min(end_sequence) FROM shown) END
             ORDER BY f.end_sequence LIMIT 1)
        ) AS raw_start
), newest AS (
    -- The newest $3 messages of the raw part with their sizes; only these rows are read.
    SELECT sequence, content_bytes FROM messages
    WHERE conversation_id = $1 AND EXISTS (SELECT 1 FROM conv)
      AND sequence >= (SELECT raw_start FROM bounds)
    ORDER BY sequence DESC
    LIMIT $3
), kept AS (
    -- Newest first while the running size fits in $4 bytes (the newest message always).
    SELECT sequence FROM (
        SELECT sequence, sum(content_bytes) OVER (ORDER BY sequence DESC) AS bytes,
               row_number() OVER (ORDER BY sequence DESC) AS n
        FROM newest
    ) AS sized
    WHERE n = 1 OR bytes <= $4
), raw AS (
    SELECT sequence, round, role, content, metadata, created_at
    FROM messages
    WHERE conversation_id = $1 AND sequence >= (SELECT coalesce(min(sequence), 0) FROM kept)
      AND EXISTS (SELECT 1 FROM kept)
), omitted AS (
    SELECT (SELECT raw_start FROM bounds) AS start_sequence, min(sequence) - 1 AS end_sequence,
           min(sequence) - (SELECT raw_start FROM bounds) AS count
    FROM kept
    HAVING min(sequence) > (SELECT raw_start FROM bounds)
)
SELECT json_build_object(
    'conversation_id', $1::text,
    'policy', (SELECT policy FROM conv),
    'summaries', coalesce(
        (SELECT json_agg(shown ORDER BY shown.end_sequence DESC, shown.memory_id DESC) FROM shown),
        '[]'::json),
    'memory', (SELECT row_to_json(shown) FROM shown ORDER BY end_sequence DESC, memory_id DESC LIMIT 1),
    'messages', coalesce((SELECT json_agg(raw ORDER BY raw.sequence) FROM raw), '[]'::json),
    'truncated', EXISTS (SELECT 1 FROM omitted),
    'omitted_messages', (SELECT row_to_json(omitted) FROM omitted),
    'processing', (SELECT row_to_json(proc) FROM proc),
    'summary_backoff', (SELECT json_build_object('failures', summary_failures, 'retry_at', summary_retry_at)
                        FROM conv WHERE summary_failures > 0),
    'last_sequence', nullif((SELECT next_sequence FROM conv) - 1, -1),
    'memory_lag_messages', (SELECT next_sequence FROM conv) - (SELECT newest_end FROM bounds) - 1
)::text
WHERE EXISTS (SELECT 1 FROM conv)
"""


async def context_json(
    pool: asyncpg.Pool,
    *,
    conversation_id: str,
    tenant_id: str,
    max_messages: int,
    max_bytes: int,
) -> str | None:
    """The context response as JSON text, or None for an unknown conversation. The raw part is
    capped to the newest ``max_messages`` messages and ``max_bytes`` of content (flagged as
    truncated, with the omitted range). The pool bounds the wait for a connection
    (app.db.BoundedPool)."""
    async with pool.acquire() as conn:
        result: str | None = await conn.fetchval(
            CONTEXT_SQL, conversation_id, tenant_id, max_messages, max_bytes
        )
    return result


async def chain(conn: AsyncConnection, *, conversation_id: str) -> list[dict[str, Any]]:
    """Seed 004's version-chain query: every memory with its base's end sequence, and whether the
    context shows it (the newest K completed ones; older ones stay here for audit)."""
    rows = await conn.execute(
        text(
            """
            SELECT m.memory_id, m.kind, m.start_sequence, m.end_sequence, m.start_round, m.end_round,
                   m.input_start_sequence, m.base_memory_id, m.status, m.created_at, m.completed_at,
                   m.generation_time_ms, m.attempts, m.error, m.memory_text AS text,
                   b.end_sequence AS base_end_seq,
                   m.status = 'completed' AND count(*) FILTER (WHERE m.status = 'completed') OVER (
                       ORDER BY m.end_sequence DESC, m.memory_id DESC) <= c.context_summaries AS shown
            FROM memory m
            JOIN conversations c USING (conversation_id)
            LEFT JOIN memory b ON m.base_memory_id = b.memory_id
            WHERE m.conversation_id = :conversation_id
            ORDER BY m.end_sequence DESC, m.memory_id DESC
            """
        ),
        {"conversation_id": conversation_id},
    )
    return [dict(r._mapping) for r in rows]


async def stuck(conn: AsyncConnection, *, tenant_id: str, older_than_seconds: float) -> list[dict[str, Any]]:
    """Seed 004's stuck-task query, with the lease so ops can tell dead workers from slow ones."""
    rows = await conn.execute(
        text(
            """
            SELECT m.conversation_id, m.memory_id, m.created_at, m.lease_expires_at,
                   extract(epoch FROM now() - m.created_at) AS age_seconds
            FROM memory m JOIN conversations c USING (conversation_id)
            WHERE c.tenant_id = :tenant_id AND m.status = 'processing'
              AND m.created_at < now() - make_interval(secs => :older)
            ORDER BY m.created_at
            """
        ),
        {"tenant_id": tenant_id, "older": older_than_seconds},
    )
    return [dict(r._mapping) for r in rows]


async def failures(conn: AsyncConnection, *, tenant_id: str, limit: int) -> list[dict[str, Any]]:
    rows = await conn.execute(
        text(
            """
            SELECT m.conversation_id, m.memory_id, m.start_sequence, m.end_sequence,
                   m.created_at, m.completed_at, m.attempts, m.error
            FROM memory m JOIN conversations c USING (conversation_id)
            WHERE c.tenant_id = :tenant_id AND m.status = 'failed'
            ORDER BY m.memory_id DESC
            LIMIT :limit
            """
        ),
        {"tenant_id": tenant_id, "limit": limit},
    )
    return [dict(r._mapping) for r in rows]


async def window_progression(conn: AsyncConnection, *, tenant_id: str, limit: int) -> list[dict[str, Any]]:
    """Seed 004's sliding-window progression query."""
    rows = await conn.execute(
        text(
            """
            SELECT m.conversation_id, m.memory_id, m.start_sequence, m.end_sequence,
                   m.end_sequence - m.start_sequence + 1 AS window_size, m.generation_time_ms
            FROM memory m JOIN conversations c USING (conversation_id)
            WHERE c.tenant_id = :tenant_id AND m.status = 'completed'
            ORDER BY m.created_at DESC, m.memory_id DESC
            LIMIT :limit
            """
        ),
        {"tenant_id": tenant_id, "limit": limit},
    )
    return [dict(r._mapping) for r in rows]


async def generation_stats(conn: AsyncConnection, *, tenant_id: str) -> dict[str, Any]:
    """Seed 004's average-summarization-time query, plus p50/p95."""
    row = (
        await conn.execute(
            text(
                """
                SELECT AVG(m.generation_time_ms)::float AS avg_ms,
                       MAX(m.generation_time_ms) AS max_ms,
                       percentile_cont(0.5) WITHIN GROUP (ORDER BY m.generation_time_ms) AS p50_ms,
                       percentile_cont(0.95) WITHIN GROUP (ORDER BY m.generation_time_ms) AS p95_ms,
                       COUNT(*) AS total_summaries
                FROM memory m JOIN conversations c USING (conversation_id)
                WHERE c.tenant_id = :tenant_id AND m.status = 'completed'
                  AND m.generation_time_ms IS NOT NULL
                """
            ),
            {"tenant_id": tenant_id},
        )
    ).one()
    return dict(row._mapping)
