"""SQL for the memory table (seed 004), including the context read and the ops queries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection

from app.memory.types import SummaryPlan
from app.repositories.events import (
    COMPRESSED,
    NOTIFIED,
    SUMMARY_COMPLETED,
    SUMMARY_FAILED,
    SUMMARY_STARTED,
    emit_ctes,
    reserve_returning,
)
from app.repositories.messages import OUT_COLUMNS
from app.repositories.statements import Db, Statement, sql
from app.repositories.tenants import of_tenant

MEMORY_COLUMNS = (
    "memory_id, conversation_id, kind, memory_text, start_sequence, end_sequence, start_round, "
    "end_round, input_start_sequence, base_memory_id, status, created_at, generation_time_ms, "
    "completed_at, lease_expires_at, attempts, error, tokens, input_tokens, from_at, to_at"
)


# The newest row of each status, each one index probe on idx_memory_conversation_status (an
# ORDER BY over all statuses would read every row of the conversation).
NEWEST_BY_STATUS = " UNION ALL ".join(
    f"""(SELECT memory_id, kind, status, start_sequence, end_sequence, start_round, end_round, tokens
        FROM memory WHERE conversation_id = :conversation_id AND status = '{status}'
        ORDER BY end_sequence DESC, memory_id DESC LIMIT 1)"""
    for status in ("completed", "processing", "failed")
)


def _summary_data(m: str, **extra: str) -> str:
    """The data of a summary event: which memory row, of what kind, over which messages."""
    fields = {
        "memory_id": f"{m}.memory_id",
        "kind": f"{m}.kind",
        "start_sequence": f"{m}.start_sequence",
        "end_sequence": f"{m}.end_sequence",
        **extra,
    }
    return "json_build_object(" + ", ".join(f"'{k}', {v}" for k, v in fields.items()) + ")"


def _started_events(rows: str, *, retry: bool) -> str:
    """CTEs recording summary:started for the memory row of the CTE ``rows`` (its conversation's
    row is locked by the caller, or here)."""
    return f"""reserved AS (
        UPDATE conversations c SET last_event_id = c.last_event_id + 1
        FROM {rows} WHERE c.conversation_id = {rows}.conversation_id
        RETURNING {reserve_returning("1")}
    ), source AS (
        SELECT r.conversation_id, r.tenant_id, r.events_before + 1 AS event_id,
               '{SUMMARY_STARTED}' AS type, {_summary_data("n", retry=str(retry).lower())} AS data, r.watched
        FROM reserved r JOIN {rows} n USING (conversation_id)
    ), {emit_ctes("source")}"""


def chain_cte(name: str, columns: str, *, conversation: str, limit: str, within: str = "") -> str:
    """A recursive CTE ``name`` of the completed summaries a context shows, newest first: the
    newest, then the newest ending before its start, and so on, ``limit`` of them at most (an
    SQL expression). Summaries folded into a later one (inside its range) are never reached, and
    the summaries of the sliding window (each covering the last) reduce to the newest. Each
    step is one probe of idx_memory_conversation_status. ``within`` filters the summaries (SQL
    on the alias m); ``columns`` must include start_sequence."""
    return f"""{name} AS (
        (SELECT {columns}, 1 AS depth FROM memory m
         WHERE m.conversation_id = {conversation} AND m.status = 'completed' {within}
         ORDER BY m.end_sequence DESC, m.memory_id DESC LIMIT 1)
        UNION ALL
        SELECT n.*, c.depth + 1 FROM {name} c CROSS JOIN LATERAL (
            SELECT {columns} FROM memory m
            WHERE m.conversation_id = {conversation} AND m.status = 'completed'
              AND m.end_sequence < c.start_sequence {within}
            ORDER BY m.end_sequence DESC, m.memory_id DESC LIMIT 1) n
        WHERE c.depth < {limit}
    )"""


REF_COLUMNS = (
    "m.memory_id, m.kind, m.status, m.start_sequence, m.end_sequence, m.start_round, m.end_round, m.tokens"
)


_FOLDED = Statement(
    "WITH RECURSIVE "
    + chain_cte(
        "chain",
        "m.memory_id, m.start_sequence, m.end_sequence, m.memory_text",
        conversation=":conversation_id",
        limit="100000",
        within="AND m.start_sequence >= :start AND m.end_sequence <= :end",
    )
    + " SELECT start_sequence, end_sequence, memory_text FROM chain ORDER BY depth DESC"
)


async def folded(conn: Db, *, conversation_id: str, start: int, end: int) -> list[tuple[int, int, str]]:
    """The completed summaries a summary of summaries over ``start``-``end`` (sequences) folds:
    the chain within that range, oldest first, as (first sequence, last sequence, text)."""
    rows = await _FOLDED.fetch(conn, {"conversation_id": conversation_id, "start": start, "end": end})
    return [(int(r["start_sequence"]), int(r["end_sequence"]), str(r["memory_text"])) for r in rows]


_INSERT_PROCESSING = Statement(
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
    ), inserted AS (
    INSERT INTO memory (conversation_id, memory_text, kind, start_sequence, end_sequence,
                        start_round, end_round, input_start_sequence, base_memory_id,
                        status, lease_expires_at, attempts, input_tokens, from_at, to_at)
    SELECT CAST(:conversation_id AS varchar), '', :kind, b.start_sequence, b.end_sequence,
           :start_round, :end_round, b.input_start_sequence, :base, 'processing',
           now() + make_interval(secs => CAST(:lease AS double precision)),
           CASE WHEN CAST(:lease AS double precision) IS NULL THEN 0 ELSE 1 END,
           e.tokens_before + e.tokens - f.tokens_before, f.created_at, e.created_at
    FROM bounds b
    JOIN messages f ON f.conversation_id = :conversation_id AND f.sequence = b.start_sequence
    JOIN messages e ON e.conversation_id = :conversation_id AND e.sequence = b.end_sequence
    WHERE NOT EXISTS (SELECT 1 FROM memory
                      WHERE conversation_id = :conversation_id AND status = 'processing')
    ON CONFLICT (conversation_id) WHERE status = 'processing' DO NOTHING
    RETURNING {MEMORY_COLUMNS}
    ), {_started_events("inserted", retry=False)}
    SELECT {MEMORY_COLUMNS} FROM inserted WHERE {NOTIFIED}
    """
)


async def insert_processing(
    conn: Db,
    *,
    conversation_id: str,
    plan: SummaryPlan,
    lease_seconds: float | None,
) -> dict[str, Any] | None:
    """Insert the 'processing' row of ``plan``, or nothing when one already exists for the
    conversation. With ``lease_seconds`` the caller owns the row (its first attempt); with None
    it is queued for any runner to claim (app.repositories.work).

    The plan is in rounds; its sequences are looked up here (the first message of a round is the
    one after the last message of the rounds before it), each a short backward scan of the
    primary key from the newest message. The partial unique index makes this the one place that
    decides, across replicas, who starts the summary: the loser of a race gets None and starts
    no task. The NOT EXISTS pre-check only spares a memory_id (a sequence value) in the common,
    race-free case, so ids stay consecutive.
    """
    row = await _INSERT_PROCESSING.fetchrow(
        conn,
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
    return None if row is None else dict(row)


_GET = Statement(f"SELECT {MEMORY_COLUMNS} FROM memory WHERE memory_id = :memory_id")


async def get(conn: Db, *, memory_id: int) -> dict[str, Any] | None:
    row = await _GET.fetchrow(conn, {"memory_id": memory_id})
    return None if row is None else dict(row)


_RUNNING = Statement(
    f"""
    SELECT {", ".join(f"m.{column}" for column in MEMORY_COLUMNS.split(", "))},
           c.memory_policy, b.memory_text AS base_text, b.end_sequence AS base_end_sequence
    FROM memory m
    JOIN conversations c ON c.conversation_id = m.conversation_id
    LEFT JOIN memory b ON b.conversation_id = m.conversation_id AND b.memory_id = m.base_memory_id
    WHERE m.memory_id = :memory_id AND m.status = 'processing' AND m.attempts = :attempt
    """
)


async def running(conn: Db, *, memory_id: int, attempt: int) -> dict[str, Any] | None:
    """A summary's row with what its job starts from, in one statement: its conversation's
    policy (``memory_policy``) and the text and end of the summary it builds on (``base_text``,
    ``base_end_sequence``; None without one). None when the row is not this ``attempt`` of a
    processing summary any more (reaped, claimed again, or deleted with its conversation)."""
    row = await _RUNNING.fetchrow(conn, {"memory_id": memory_id, "attempt": attempt})
    return None if row is None else dict(row)


_COMPLETE = Statement(
    f"""
    WITH done AS (
        UPDATE memory
        SET status = 'completed', memory_text = :memory_text, tokens = :tokens,
            generation_time_ms = :ms, completed_at = now(), lease_expires_at = NULL,
            error = NULL
        WHERE memory_id = :memory_id AND status = 'processing' AND attempts = :attempt
        RETURNING memory_id, kind, conversation_id, input_start_sequence, start_sequence,
                  end_sequence, completed_at, tokens, input_tokens, generation_time_ms
    ), reserved AS (
        -- Ends the failure streak; a compression also reports its tokens saved.
        UPDATE conversations c SET summary_failures = 0, summary_retry_at = NULL,
            last_event_id = c.last_event_id
                + CASE WHEN done.kind = 'compression' THEN 2 ELSE 1 END
        FROM done WHERE c.conversation_id = done.conversation_id
        RETURNING c.conversation_id, c.tenant_id, c.last_event_id AS last_id,
                  coalesce(c.events_watched_until > now(), false) AS watched
    ), source AS (
        SELECT r.conversation_id, r.tenant_id,
               r.last_id - CASE WHEN d.kind = 'compression' THEN 1 ELSE 0 END AS event_id,
               '{SUMMARY_COMPLETED}' AS type,
               {_summary_data("d", tokens="d.tokens", generation_time_ms="d.generation_time_ms")}
                   AS data, r.watched
        FROM reserved r JOIN done d USING (conversation_id)
        UNION ALL
        SELECT r.conversation_id, r.tenant_id, r.last_id, '{COMPRESSED}',
               {
        _summary_data(
            "d",
            original_tokens="d.input_tokens",
            tokens="d.tokens",
            tokens_saved="d.input_tokens - d.tokens",
        )
    },
               r.watched
        FROM reserved r JOIN done d USING (conversation_id)
        WHERE d.kind = 'compression'
    ), {emit_ctes("source")}
    SELECT extract(epoch FROM done.completed_at - min(m.created_at)) AS lag
    FROM done
    LEFT JOIN messages m ON m.conversation_id = done.conversation_id
        AND m.sequence BETWEEN done.input_start_sequence AND done.end_sequence
    WHERE {NOTIFIED}
    GROUP BY done.completed_at, m.round
    """
)


async def complete(
    conn: Db,
    *,
    memory_id: int,
    attempt: int,
    memory_text: str,
    tokens: int,
    generation_time_ms: int,
) -> list[float] | None:
    """Mark a processing row completed and end its conversation's failure streak. None when it
    is no longer processing (reaped or its conversation deleted) or another runner claimed it
    since ``attempt`` (its lease expired): the result is discarded. Else the summary lag of each
    round it newly covers (the rounds of its input messages): seconds from the round's POST to
    this completion, by the database's clock."""
    rows = await _COMPLETE.fetch(
        conn,
        {
            "memory_id": memory_id,
            "attempt": attempt,
            "memory_text": memory_text,
            "tokens": tokens,
            "ms": generation_time_ms,
        },
    )
    if not rows:
        return None
    return [float(r["lag"]) for r in rows if r["lag"] is not None]


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long work waits after its n-th failure in a row, capped at max: a conversation's
    next round starts a summary at once after its first failure, then waits base * 2^(n-2); a
    quiet conversation is due again base * 2^(n-1) after it; a summary whose runner died is
    claimed again base * 2^(n-1) after its n-th attempt's lease expired."""

    base_seconds: float
    max_seconds: float

    def params(self) -> dict[str, float]:
        return {"backoff_base": self.base_seconds, "backoff_max": self.max_seconds}


def retry_delay_sql(failures: str) -> str:
    """Seconds to wait after the ``failures``-th failure in a row (an SQL expression of it):
    base * 2^(n-1), capped, with the parameters of :meth:`Backoff.params`."""
    return f"least(:backoff_max, :backoff_base * power(2, least({failures} - 1, 30)))"


# The conversation's streak grows by one and, from the second failure on, its next summary waits
# (a new round retries at once after the first failure, as seed 004 does). While the streak is
# under :max_attempts, or always after a failure of the model's or the database's availability
# (:keep_due), the conversation is also due again after base * 2^(n-1) (capped) whether or not a
# round comes, so a quiet conversation is retried too. Used by every failure path.
# (c.summary_failures is the streak before this failure.)
_BACK_OFF = f"""
    UPDATE conversations c
    SET summary_failures = c.summary_failures + 1,
        summary_retry_at = CASE WHEN c.summary_failures = 0 THEN NULL
            ELSE now() + make_interval(secs => {retry_delay_sql("c.summary_failures")}) END,
        summary_due_at = CASE WHEN c.summary_failures + 1 < :max_attempts OR CAST(:keep_due AS boolean)
            THEN greatest(c.summary_due_at,
                          now() + make_interval(secs => {retry_delay_sql("c.summary_failures + 1")}))
            ELSE c.summary_due_at END,
        last_event_id = c.last_event_id + 1
    FROM failed WHERE c.conversation_id = failed.conversation_id
    RETURNING {reserve_returning("1")}
"""

# summary:failed for each row of ``failed`` (memory_id, kind, sequences, error), numbered by
# _BACK_OFF's update of its conversation (CTE ``streak``).
_FAILED_EVENTS = f"""source AS (
        SELECT s.conversation_id, s.tenant_id, s.events_before + 1 AS event_id, '{SUMMARY_FAILED}' AS type,
               {_summary_data("f", error="f.error")} AS data, s.watched
        FROM streak s JOIN failed f USING (conversation_id)
    ), {emit_ctes("source")}"""


async def fail(
    conn: AsyncConnection,
    *,
    memory_id: int,
    attempt: int,
    error: str,
    generation_time_ms: int | None,
    backoff: Backoff,
    max_attempts: int,
    keep_due: bool,
) -> bool:
    """Mark a processing row failed (unless another runner claimed it since ``attempt``); the
    conversation's failure streak grows and its next summary waits. With ``keep_due`` (the model
    or the database was unavailable) it is due again after its backoff however long the streak."""
    done = await conn.scalar(
        sql(
            f"""
            WITH failed AS (
                UPDATE memory
                SET status = 'failed', error = :error, generation_time_ms = :ms,
                    completed_at = now(), lease_expires_at = NULL
                WHERE memory_id = :memory_id AND status = 'processing' AND attempts = :attempt
                RETURNING memory_id, kind, conversation_id, start_sequence, end_sequence, error
            ), streak AS ({_BACK_OFF}), {_FAILED_EVENTS}
            SELECT 1 FROM failed WHERE {NOTIFIED}
            """
        ),
        {
            "memory_id": memory_id,
            "attempt": attempt,
            "error": error[:2000],
            "ms": generation_time_ms,
            "max_attempts": max_attempts,
            "keep_due": keep_due,
            **backoff.params(),
        },
    )
    return done is not None


def release_sql(table: str) -> str:
    """Giving an owned row of ``table`` (memory, user_memory: the same columns) back to the
    queue, its attempt not counted (:memory_id, :attempt)."""
    return f"""
        UPDATE {table} SET lease_expires_at = NULL, attempts = attempts - 1
        WHERE memory_id = :memory_id AND status = 'processing' AND attempts = :attempt
        RETURNING 1
    """


def renew_leases_sql(table: str) -> str:
    """Renewing the leases of owned rows of ``table`` (:ids, :lease seconds)."""
    return f"""
        UPDATE {table} SET lease_expires_at = now() + make_interval(secs => :lease)
        WHERE memory_id = ANY(CAST(:ids AS integer[])) AND status = 'processing'
          AND lease_expires_at IS NOT NULL
    """


async def release(conn: AsyncConnection, *, memory_id: int, attempt: int) -> bool:
    """Give an owned row back to the queue (this runner is shutting down): another runner
    claims it at once, and the attempt is not counted."""
    done = await conn.scalar(sql(release_sql("memory")), {"memory_id": memory_id, "attempt": attempt})
    return done is not None


async def renew_leases(conn: AsyncConnection, *, memory_ids: list[int], lease_seconds: float) -> int:
    result = await conn.execute(sql(renew_leases_sql("memory")), {"ids": memory_ids, "lease": lease_seconds})
    return int(result.rowcount)


async def reap_expired(conn: AsyncConnection, *, backoff: Backoff, max_attempts: int) -> list[dict[str, Any]]:
    """Fail processing rows whose lease expired (their runner died) after their last attempt,
    and back their conversations off; rows with attempts left are claimed again instead
    (app.repositories.work). Safe to run from every replica at once: each row moves once, and
    rows whose owner renews its lease are untouched."""
    rows = await conn.execute(
        sql(
            f"""
            WITH failed AS (
                UPDATE memory
                SET status = 'failed', completed_at = now(), lease_expires_at = NULL,
                    error = 'lease expired on every attempt: the runner stopped renewing it '
                            '(crash, kill or redeploy)'
                WHERE status = 'processing' AND lease_expires_at < now() AND attempts >= :max_attempts
                RETURNING memory_id, kind, conversation_id, start_sequence, end_sequence, attempts, error
            ), streak AS ({_BACK_OFF}), {_FAILED_EVENTS}
            SELECT failed.*, c.memory_policy ->> 'name' AS policy
            FROM failed LEFT JOIN conversations c USING (conversation_id)
            WHERE {NOTIFIED}
            """
        ),
        {"max_attempts": max_attempts, "keep_due": False, **backoff.params()},
    )
    return [dict(r._mapping) for r in rows]


async def owner(conn: AsyncConnection, *, memory_id: int, tenant_id: str | None) -> tuple[str, str] | None:
    """(conversation_id, status) of a memory of ``tenant_id`` (None: any tenant), or None."""
    row = (
        await conn.execute(
            sql(
                f"""
                SELECT m.conversation_id, m.status FROM memory m JOIN conversations c USING (conversation_id)
                WHERE m.memory_id = :memory_id AND {of_tenant("c.tenant_id", tenant_id)}
                """
            ),
            {"memory_id": memory_id, "tenant_id": tenant_id},
        )
    ).one_or_none()
    return None if row is None else (str(row.conversation_id), str(row.status))


async def restart_failed(conn: AsyncConnection, *, memory_id: int) -> dict[str, Any] | None:
    """Queue a failed row again for a retry (same window and base) and return it; None when it
    is not failed any more or its conversation already has a summary processing. The caller
    holds the conversation's row lock (app.repositories.work.lock), taken before this row's as
    on every path that starts a summary: the other order deadlocks with them."""
    row = (
        await conn.execute(
            sql(
                f"""
                WITH restarted AS (
                UPDATE memory
                SET status = 'processing', error = NULL, completed_at = NULL,
                    generation_time_ms = NULL, lease_expires_at = NULL
                WHERE memory_id = :memory_id AND status = 'failed'
                  AND NOT EXISTS (
                      SELECT 1 FROM memory p
                      WHERE p.conversation_id = memory.conversation_id AND p.status = 'processing')
                RETURNING {MEMORY_COLUMNS}
                ), {_started_events("restarted", retry=True)}
                SELECT {MEMORY_COLUMNS} FROM restarted WHERE {NOTIFIED}
                """
            ),
            {"memory_id": memory_id},
        )
    ).one_or_none()
    return None if row is None else dict(row._mapping)


# GET /context in one round trip, with the whole response built by PostgreSQL as JSON: the
# conversation (tenant-checked), the newest K completed summaries its policy shows, the memory in
# flight, and the raw messages. The hot read path skips SQLAlchemy and pydantic: it runs this on
# a plain asyncpg pool (app.db.create_read_pool). bench/floor_app.py runs this same statement.
# Plain asyncpg placeholders: $1 = conversation_id, $2 = tenant_id, $3 = most raw messages,
# $4 = most raw bytes (content_bytes). Returns NULL for an unknown conversation.
#
# The raw part starts at the earliest of: the message after the newest shown summary (nothing is
# ever missing), the first message of the last R rounds (the policy's recent window), and the
# first input message of a failed summary newer than the oldest shown one that no shown summary
# covers (it would otherwise be in neither part). Every lookup is an index probe, or a backward
# scan of the primary key over the last R rounds, so the cost does not grow with history; the
# failed summaries read (idx_memory_conversation_status) grow only with failed attempts.
_SHOWN_COLUMNS = (
    "m.memory_id, m.kind, m.memory_text AS text, m.start_sequence, m.end_sequence, m.start_round, "
    "m.end_round, m.base_memory_id, m.tokens, m.input_tokens, m.from_at, m.to_at, m.created_at, "
    "m.completed_at, m.generation_time_ms"
)
CONTEXT_SQL = f"""
WITH RECURSIVE conv AS (
    SELECT next_sequence, next_round, next_tokens, context_summaries, context_recent_rounds,
           context_max_summary_tokens, memory_policy ->> 'name' AS policy, summary_failures,
           summary_retry_at, summary_due_at, user_id
    FROM conversations
    WHERE conversation_id = $1 AND tenant_id = $2
), {
    chain_cte(
        "chain",
        _SHOWN_COLUMNS,
        conversation="$1",
        limit="(SELECT context_summaries FROM conv)",
        within="AND EXISTS (SELECT 1 FROM conv) AND m.tokens <= coalesce("
        "(SELECT context_max_summary_tokens FROM conv), m.tokens)",
    )
}, shown AS (
    SELECT memory_id, kind, text, start_sequence, end_sequence, start_round, end_round,
           base_memory_id, tokens, input_tokens, from_at, to_at, created_at, completed_at,
           generation_time_ms
    FROM chain
), proc AS (
    SELECT memory_id, kind, start_sequence, end_sequence, base_memory_id, created_at
    FROM memory
    WHERE conversation_id = $1 AND status = 'processing' AND EXISTS (SELECT 1 FROM conv)
), bounds AS (
    SELECT
        coalesce((SELECT max(end_sequence) FROM shown), -1) AS newest_end,
        least(
            coalesce((SELECT max(end_sequence) FROM shown), -1) + 1,
            -- The first message of the last R rounds, moved back to a boundary if it is not one.
            (SELECT CASE WHEN r.first >= (SELECT next_sequence FROM conv) THEN r.first
                    ELSE coalesce((SELECT m.sequence FROM messages m
                                   WHERE m.conversation_id = $1 AND m.boundary AND m.sequence <= r.first
                                   ORDER BY m.sequence DESC LIMIT 1), 0) END
             FROM (SELECT coalesce((SELECT m.sequence + 1 FROM messages m
                                    WHERE m.conversation_id = $1
                                      AND m.round < (SELECT next_round - context_recent_rounds FROM conv)
                                    ORDER BY m.sequence DESC LIMIT 1), 0) AS first) AS r),
            -- The first message of a failed attempt's input that no shown summary covers: its
            -- first message, or the one after a shown summary ending inside it (shown summaries
            -- do not overlap). None when they cover it all (retried and completed, or folded).
            (SELECT min(u.first) FROM memory f
             CROSS JOIN LATERAL (
                 SELECT min(c.seq) AS first
                 FROM (SELECT f.input_start_sequence AS seq
                       UNION ALL
                       SELECT s.end_sequence + 1 FROM shown s
                       WHERE s.end_sequence + 1 BETWEEN f.input_start_sequence AND f.end_sequence) AS c
                 WHERE NOT EXISTS (SELECT 1 FROM shown s
                                   WHERE c.seq BETWEEN s.start_sequence AND s.end_sequence)) AS u
             WHERE f.conversation_id = $1 AND f.status = 'failed'
               AND f.end_sequence > CASE
                   WHEN (SELECT count(*) FROM shown) < (SELECT context_summaries FROM conv) THEN -1
                   ELSE (SELECT min(end_sequence) FROM shown) END)
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
), capped_start AS (
    -- Cut only where a window may start, so no tool result is kept without its call: the first
    -- boundary within what fits; if none, the last boundary before it (over the caps).
    SELECT coalesce(
        (SELECT m.sequence FROM messages m
         WHERE m.conversation_id = $1 AND m.boundary AND m.sequence >= (SELECT min(sequence) FROM kept)
         ORDER BY m.sequence LIMIT 1),
        (SELECT m.sequence FROM messages m
         WHERE m.conversation_id = $1 AND m.boundary AND m.sequence <= (SELECT min(sequence) FROM kept)
           AND m.sequence >= (SELECT raw_start FROM bounds)
         ORDER BY m.sequence DESC LIMIT 1),
        (SELECT min(sequence) FROM kept)) AS sequence
    WHERE EXISTS (SELECT 1 FROM kept)
), budget_start AS (
    -- ?max_tokens ($5): the oldest boundary from which the raw messages fit in what the summaries
    -- leave (running totals: no sum over rows); if even the newest exchange does not fit, that
    -- exchange (the newest round is never left out). NULL when there is no budget.
    SELECT coalesce(
        (SELECT m.sequence FROM messages m
         WHERE m.conversation_id = $1 AND m.boundary AND m.sequence >= (SELECT raw_start FROM bounds)
           AND m.tokens_before >= (SELECT next_tokens FROM conv)
                                  - (CAST($5 AS bigint) - (SELECT coalesce(sum(tokens), 0) FROM shown))
         ORDER BY m.sequence LIMIT 1),
        (SELECT m.sequence FROM messages m
         WHERE m.conversation_id = $1 AND m.boundary AND m.sequence >= (SELECT raw_start FROM bounds)
         ORDER BY m.sequence DESC LIMIT 1)) AS sequence
    WHERE $5 IS NOT NULL
), kept_start AS (
    SELECT greatest(c.sequence, (SELECT sequence FROM budget_start)) AS sequence FROM capped_start c
), raw AS (
    SELECT {OUT_COLUMNS}
    FROM messages
    WHERE conversation_id = $1 AND sequence >= (SELECT sequence FROM kept_start)
), tokens AS (
    SELECT (SELECT coalesce(sum(tokens), 0) FROM shown) AS summaries,
           coalesce((SELECT (SELECT next_tokens FROM conv) - m.tokens_before FROM messages m
                     WHERE m.conversation_id = $1 AND m.sequence = (SELECT sequence FROM kept_start)), 0)
               AS messages
), omitted AS (
    SELECT (SELECT raw_start FROM bounds) AS start_sequence, k.sequence - 1 AS end_sequence,
           k.sequence - (SELECT raw_start FROM bounds) AS count
    FROM kept_start k
    WHERE k.sequence > (SELECT raw_start FROM bounds)
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
    'summary_due', coalesce((SELECT summary_due_at <= now() FROM conv), false),
    'summary_backoff', (SELECT json_build_object('failures', summary_failures, 'retry_at', summary_retry_at)
                        FROM conv WHERE summary_failures > 0),
    'last_sequence', nullif((SELECT next_sequence FROM conv) - 1, -1),
    'tokens', (SELECT json_build_object('summaries', t.summaries, 'messages', t.messages,
                                        'total', t.summaries + t.messages) FROM tokens t),
    'context_window', (SELECT json_build_object(
                           'tokens', $6::bigint,
                           'used_percent', round((t.summaries + t.messages) * 100.0 / $6, 1))
                       FROM tokens t WHERE $6 IS NOT NULL),
    'memory_lag_messages', (SELECT next_sequence FROM conv) - (SELECT newest_end FROM bounds) - 1,
    'user_summary', (SELECT json_build_object('memory_id', u.memory_id, 'text', u.memory_text,
                                              'completed_at', u.completed_at)
                     FROM user_memory u
                     WHERE u.tenant_id = $2 AND u.user_id = (SELECT user_id FROM conv)
                       AND u.status = 'completed'
                     ORDER BY u.memory_id DESC LIMIT 1)
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
    max_tokens: int | None = None,
    context_window: int | None = None,
    in_transaction: bool = False,
) -> str | None:
    """The context response as JSON text, or None for an unknown conversation. The raw part is
    capped to the newest ``max_messages`` messages and ``max_bytes`` of content, and with
    ``max_tokens`` to what fits beside the summaries (flagged as truncated, with the omitted
    range); ``context_window`` adds the share of a model's window the context takes. The pool
    bounds the wait for a connection (app.db.BoundedPool). ``in_transaction`` (behind PgBouncer
    in transaction mode) keeps the statement's preparation and execution on one server
    connection."""
    args = (conversation_id, tenant_id, max_messages, max_bytes, max_tokens, context_window)
    async with pool.acquire() as conn:
        if not in_transaction:
            result: str | None = await conn.fetchval(CONTEXT_SQL, *args)
            return result
        async with conn.transaction():
            result = await conn.fetchval(CONTEXT_SQL, *args)
        return result


# Summaries over the conversation's cap (ContextSpec.max_summary_tokens) are never shown.
_WITHIN_CAP = (
    "AND m.tokens <= coalesce((SELECT context_max_summary_tokens FROM conversations "
    "WHERE conversation_id = :conversation_id), m.tokens)"
)


# Seed 003's getStats, from the context read's pieces: the conversation's running totals and the
# summaries it shows (chain_cte, as CONTEXT_SQL), with the entries up to the newest one's end
# counted as compressed. Each value is an index probe: the cost does not grow with history.
STATS_SQL = sql(
    f"""
    WITH RECURSIVE conv AS (
        SELECT next_sequence, next_tokens, context_summaries, context_max_summary_tokens,
               memory_policy ->> 'name' AS policy
        FROM conversations
        WHERE conversation_id = :conversation_id AND tenant_id = :tenant_id
    ), {
        chain_cte(
            "chain",
            "m.memory_id, m.start_sequence, m.end_sequence, m.tokens",
            conversation=":conversation_id",
            limit="(SELECT context_summaries FROM conv)",
            within="AND EXISTS (SELECT 1 FROM conv) AND m.tokens <= coalesce("
            "(SELECT context_max_summary_tokens FROM conv), m.tokens)",
        )
    }, covered AS (
        SELECT coalesce(max(end_sequence), -1) AS end_sequence, count(*) AS summaries,
               coalesce(sum(tokens), 0) AS summary_tokens
        FROM chain
    )
    SELECT conv.policy, conv.next_sequence AS total_entries, covered.end_sequence + 1 AS compressed_entries,
           covered.summaries, conv.next_tokens AS total_tokens, covered.summary_tokens,
           coalesce((SELECT m.tokens_before + m.tokens FROM messages m
                     WHERE m.conversation_id = :conversation_id AND m.sequence = covered.end_sequence), 0)
               AS compressed_tokens,
           EXISTS (SELECT 1 FROM memory p
                   WHERE p.conversation_id = :conversation_id AND p.status = 'processing') AS processing
    FROM conv, covered
    """
)


async def stats(conn: AsyncConnection, *, conversation_id: str, tenant_id: str) -> dict[str, Any] | None:
    """Seed 003's stats of a conversation (None when the tenant has no such one): entries and
    tokens in all, compressed (up to the newest summary the context shows) and active (after
    it), the shown summaries and their tokens, and what they save."""
    row = (
        await conn.execute(STATS_SQL, {"conversation_id": conversation_id, "tenant_id": tenant_id})
    ).one_or_none()
    if row is None:
        return None
    total_entries, compressed_entries = int(row.total_entries), int(row.compressed_entries)
    total_tokens, compressed_tokens = int(row.total_tokens), int(row.compressed_tokens)
    summary_tokens = int(row.summary_tokens)
    active_tokens = total_tokens - compressed_tokens
    return {
        "conversation_id": conversation_id,
        "policy": row.policy,
        "total_entries": total_entries,
        "active_entries": total_entries - compressed_entries,
        "compressed_entries": compressed_entries,
        "summaries": int(row.summaries),
        "total_tokens": total_tokens,
        "active_tokens": active_tokens,
        "compressed_tokens": compressed_tokens,
        "summary_tokens": summary_tokens,
        "context_tokens": summary_tokens + active_tokens,
        "tokens_saved": compressed_tokens - summary_tokens,
        "processing": bool(row.processing),
    }


_CHAIN_OF_ONE = chain_cte(
    "chain",
    "m.memory_id, m.start_sequence",
    conversation=":conversation_id",
    limit="(SELECT context_summaries FROM conversations WHERE conversation_id = :conversation_id)",
    within=_WITHIN_CAP,
)


async def chain(conn: AsyncConnection, *, conversation_id: str) -> list[dict[str, Any]]:
    """Seed 004's version-chain query: every memory with its base's end sequence, and whether the
    context shows it (chain_cte; the others stay here for audit)."""
    rows = await conn.execute(
        sql(
            f"""
            WITH RECURSIVE {_CHAIN_OF_ONE}
            SELECT m.memory_id, m.kind, m.start_sequence, m.end_sequence, m.start_round, m.end_round,
                   m.input_start_sequence, m.base_memory_id, m.status, m.created_at, m.completed_at,
                   m.generation_time_ms, m.attempts, m.error, m.memory_text AS text, m.tokens,
                   m.input_tokens, m.from_at, m.to_at, b.end_sequence AS base_end_seq,
                   EXISTS (SELECT 1 FROM chain WHERE chain.memory_id = m.memory_id) AS shown
            FROM memory m
            LEFT JOIN memory b ON b.conversation_id = m.conversation_id AND b.memory_id = m.base_memory_id
            WHERE m.conversation_id = :conversation_id
            ORDER BY m.end_sequence DESC, m.memory_id DESC
            """
        ),
        {"conversation_id": conversation_id},
    )
    return [dict(r._mapping) for r in rows]


async def stuck(
    conn: AsyncConnection, *, tenant_id: str | None, older_than_seconds: float
) -> list[dict[str, Any]]:
    """Seed 004's stuck-task query, with the lease so ops can tell dead workers from slow ones
    (of one tenant, or of all with ``tenant_id`` None)."""
    rows = await conn.execute(
        sql(
            f"""
            SELECT m.conversation_id, c.tenant_id, m.memory_id, m.created_at, m.lease_expires_at,
                   extract(epoch FROM now() - m.created_at) AS age_seconds
            FROM memory m JOIN conversations c USING (conversation_id)
            WHERE {of_tenant("c.tenant_id", tenant_id)} AND m.status = 'processing'
              AND m.created_at < now() - make_interval(secs => :older)
            ORDER BY m.created_at
            """
        ),
        {"tenant_id": tenant_id, "older": older_than_seconds},
    )
    return [dict(r._mapping) for r in rows]


async def failures(conn: AsyncConnection, *, tenant_id: str | None, limit: int) -> list[dict[str, Any]]:
    rows = await conn.execute(
        sql(
            f"""
            SELECT m.conversation_id, c.tenant_id, m.memory_id, m.start_sequence, m.end_sequence,
                   m.created_at, m.completed_at, m.attempts, m.error
            FROM memory m JOIN conversations c USING (conversation_id)
            WHERE {of_tenant("c.tenant_id", tenant_id)} AND m.status = 'failed'
            ORDER BY m.memory_id DESC
            LIMIT :limit
            """
        ),
        {"tenant_id": tenant_id, "limit": limit},
    )
    return [dict(r._mapping) for r in rows]


async def window_progression(
    conn: AsyncConnection, *, tenant_id: str | None, limit: int
) -> list[dict[str, Any]]:
    """Seed 004's sliding-window progression query."""
    rows = await conn.execute(
        sql(
            f"""
            SELECT m.conversation_id, c.tenant_id, m.memory_id, m.start_sequence, m.end_sequence,
                   m.end_sequence - m.start_sequence + 1 AS window_size, m.generation_time_ms
            FROM memory m JOIN conversations c USING (conversation_id)
            WHERE {of_tenant("c.tenant_id", tenant_id)} AND m.status = 'completed'
            ORDER BY m.created_at DESC, m.memory_id DESC
            LIMIT :limit
            """
        ),
        {"tenant_id": tenant_id, "limit": limit},
    )
    return [dict(r._mapping) for r in rows]


async def generation_stats(conn: AsyncConnection, *, tenant_id: str | None) -> dict[str, Any]:
    """Seed 004's average-summarization-time query, plus p50/p95."""
    row = (
        await conn.execute(
            sql(
                f"""
                SELECT AVG(m.generation_time_ms)::float AS avg_ms,
                       MAX(m.generation_time_ms) AS max_ms,
                       percentile_cont(0.5) WITHIN GROUP (ORDER BY m.generation_time_ms) AS p50_ms,
                       percentile_cont(0.95) WITHIN GROUP (ORDER BY m.generation_time_ms) AS p95_ms,
                       COUNT(*) AS total_summaries
                FROM memory m JOIN conversations c USING (conversation_id)
                WHERE {of_tenant("c.tenant_id", tenant_id)} AND m.status = 'completed'
                  AND m.generation_time_ms IS NOT NULL
                """
            ),
            {"tenant_id": tenant_id},
        )
    ).one()
    return dict(row._mapping)
