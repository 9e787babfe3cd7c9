"""SQL for users and user_memory: seed 001's cross-conversation summary of a user's last
conversations, with the guarantees of conversation memory.

A user is due (``users.summary_due_at``) when one of their conversations ends or its summary
advances. A runner locks the due user (SKIP LOCKED), inserts the 'processing' row it then owns
(the partial unique index allows one per user, across replicas), and clears the mark. A mark
made while the row runs (a conversation advanced meanwhile) is claimed once it completes.
Leases, attempts and the reaper work as for memory rows (app.repositories.memory).

Keys lead with (tenant_id, user_id): a user's rows span conversations, so these tables would be
distributed by user (tests/integration/test_schema_keys.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection

from app.repositories.memory import Backoff, release_sql, renew_leases_sql, retry_delay_sql
from app.repositories.statements import Db, Statement, sql
from app.repositories.work import claim_rows_sql

USER_MEMORY_COLUMNS = (
    "tenant_id, user_id, memory_id, memory_text AS text, sources, base_memory_id, status, created_at, "
    "completed_at, generation_time_ms, attempts, error, tokens"
)


@dataclass(frozen=True, slots=True)
class UserWork:
    """A piece of user work to try to claim: a 'processing' row (``memory_id``) or a due user."""

    tenant_id: str
    user_id: str
    memory_id: int | None


_MARK_DUE = Statement(
    """
    INSERT INTO users (tenant_id, user_id, summary_due_at) VALUES (:tenant_id, :user_id, now())
    ON CONFLICT (tenant_id, user_id)
        DO UPDATE SET summary_due_at = coalesce(users.summary_due_at, now())
    """
)


async def mark_due(conn: Db, *, tenant_id: str, user_id: str) -> None:
    """The user's summary is due now (an earlier mark keeps its time)."""
    await _MARK_DUE.execute(conn, {"tenant_id": tenant_id, "user_id": user_id})


async def candidates(
    conn: AsyncConnection, *, limit: int, max_attempts: int, backoff: Backoff
) -> list[UserWork]:
    """Queued or abandoned 'processing' rows and due users without one, oldest first."""
    rows = await conn.execute(
        sql(
            f"""
            SELECT * FROM (
                SELECT m.tenant_id, m.user_id, m.memory_id,
                       coalesce(m.lease_expires_at, m.created_at) AS since
                FROM user_memory m
                WHERE m.status = 'processing'
                  AND (m.lease_expires_at IS NULL
                       OR (m.attempts < :max_attempts
                           AND m.lease_expires_at
                               < now() - make_interval(secs => {retry_delay_sql("m.attempts")})))
                UNION ALL
                SELECT u.tenant_id, u.user_id, NULL, u.summary_due_at
                FROM users u
                WHERE u.summary_due_at <= now()
                  AND NOT EXISTS (SELECT 1 FROM user_memory p WHERE p.tenant_id = u.tenant_id
                                  AND p.user_id = u.user_id AND p.status = 'processing')
            ) w
            ORDER BY since, tenant_id, user_id
            LIMIT :limit
            """
        ),
        {"limit": limit, "max_attempts": max_attempts, **backoff.params()},
    )
    return [UserWork(tenant_id=r.tenant_id, user_id=r.user_id, memory_id=r.memory_id) for r in rows]


async def claim_rows(
    conn: AsyncConnection, *, memory_ids: list[int], lease_seconds: float, max_attempts: int, backoff: Backoff
) -> dict[int, int]:
    """Own queued or abandoned rows (app.repositories.work.claim_rows, for user_memory)."""
    rows = await conn.execute(
        sql(claim_rows_sql("user_memory")),
        {"ids": memory_ids, "lease": lease_seconds, "max_attempts": max_attempts, **backoff.params()},
    )
    return {int(r.memory_id): int(r.attempts) for r in rows}


async def start_due(
    conn: AsyncConnection, *, tenant_id: str, user_id: str, lease_seconds: float | None, skip_locked: bool
) -> dict[str, Any] | None:
    """Lock a due user (skipping one another runner holds, with ``skip_locked``), insert its
    'processing' row on the latest completed one (owned with ``lease_seconds``, else queued) and
    clear the mark. None when the user is not due, is locked, or has a row processing."""
    due = await conn.scalar(
        sql(
            f"""
            SELECT 1 FROM users u
            WHERE tenant_id = :tenant_id AND user_id = :user_id AND summary_due_at <= now()
              AND NOT EXISTS (SELECT 1 FROM user_memory p WHERE p.tenant_id = u.tenant_id
                              AND p.user_id = u.user_id AND p.status = 'processing')
            FOR NO KEY UPDATE {"SKIP LOCKED" if skip_locked else ""}
            """
        ),
        {"tenant_id": tenant_id, "user_id": user_id},
    )
    if due is None:
        return None
    row = (
        await conn.execute(
            sql(
                f"""
                INSERT INTO user_memory (tenant_id, user_id, base_memory_id, status, lease_expires_at,
                                         attempts)
                SELECT CAST(:tenant_id AS varchar), CAST(:user_id AS varchar),
                       (SELECT memory_id FROM user_memory WHERE tenant_id = :tenant_id AND user_id = :user_id
                          AND status = 'completed' ORDER BY memory_id DESC LIMIT 1),
                       'processing', now() + make_interval(secs => CAST(:lease AS double precision)),
                       CASE WHEN CAST(:lease AS double precision) IS NULL THEN 0 ELSE 1 END
                ON CONFLICT (tenant_id, user_id) WHERE status = 'processing' DO NOTHING
                RETURNING {USER_MEMORY_COLUMNS}
                """
            ),
            {"tenant_id": tenant_id, "user_id": user_id, "lease": lease_seconds},
        )
    ).one_or_none()
    if row is None:
        return None
    await conn.execute(
        sql("UPDATE users SET summary_due_at = NULL WHERE tenant_id = :tenant_id AND user_id = :user_id"),
        {"tenant_id": tenant_id, "user_id": user_id},
    )
    return dict(row._mapping)


async def get(conn: AsyncConnection, *, memory_id: int) -> dict[str, Any] | None:
    row = (
        await conn.execute(
            sql(f"SELECT {USER_MEMORY_COLUMNS} FROM user_memory WHERE memory_id = :memory_id"),
            {"memory_id": memory_id},
        )
    ).one_or_none()
    return None if row is None else dict(row._mapping)


async def base_text(conn: AsyncConnection, *, tenant_id: str, user_id: str, memory_id: int) -> str | None:
    found = await conn.scalar(
        sql(
            "SELECT memory_text FROM user_memory "
            "WHERE tenant_id = :tenant_id AND user_id = :user_id AND memory_id = :memory_id"
        ),
        {"tenant_id": tenant_id, "user_id": user_id, "memory_id": memory_id},
    )
    return None if found is None else str(found)


async def recent_conversations(
    conn: AsyncConnection, *, tenant_id: str, user_id: str, limit: int
) -> list[dict[str, Any]]:
    """The user's ``limit`` most recently active conversations, newest first, each with the
    summary its context shows (the newest completed within its cap) and its message count."""
    rows = await conn.execute(
        sql(
            """
            SELECT c.conversation_id, c.ended_at, c.last_message_at, c.next_sequence - 1 AS last_sequence,
                   s.memory_id, s.memory_text, s.end_sequence
            FROM conversations c
            LEFT JOIN LATERAL (
                SELECT m.memory_id, m.memory_text, m.end_sequence FROM memory m
                WHERE m.conversation_id = c.conversation_id AND m.status = 'completed'
                  AND m.tokens <= coalesce(c.context_max_summary_tokens, m.tokens)
                ORDER BY m.end_sequence DESC, m.memory_id DESC LIMIT 1) s ON true
            WHERE c.tenant_id = :tenant_id AND c.user_id = :user_id
            ORDER BY c.last_message_at DESC, c.conversation_id
            LIMIT :limit
            """
        ),
        {"tenant_id": tenant_id, "user_id": user_id, "limit": limit},
    )
    return [dict(r._mapping) for r in rows]


async def complete(
    conn: AsyncConnection,
    *,
    memory_id: int,
    attempt: int,
    memory_text: str,
    sources: list[dict[str, Any]],
    tokens: int,
    generation_time_ms: int,
) -> dict[str, Any] | None:
    """Mark an owned row completed; None when it is no longer ours (reaped, or claimed again)."""
    row = (
        await conn.execute(
            sql(
                """
                UPDATE user_memory
                SET status = 'completed', memory_text = :memory_text, sources = CAST(:sources AS jsonb),
                    tokens = :tokens, generation_time_ms = :ms, completed_at = now(),
                    lease_expires_at = NULL, error = NULL
                WHERE memory_id = :memory_id AND status = 'processing' AND attempts = :attempt
                RETURNING tenant_id, user_id
                """
            ),
            {
                "memory_id": memory_id,
                "attempt": attempt,
                "memory_text": memory_text,
                "sources": orjson.dumps(sources).decode(),
                "tokens": tokens,
                "ms": generation_time_ms,
            },
        )
    ).one_or_none()
    return None if row is None else dict(row._mapping)


async def fail(
    conn: AsyncConnection,
    *,
    memory_id: int,
    attempt: int,
    error: str,
    generation_time_ms: int,
    backoff: Backoff,
    keep_due: bool,
) -> bool:
    """Mark an owned row failed; the user's next trigger (a conversation advancing) tries again.
    With ``keep_due`` (the model or the database was unavailable) the user is also due again
    after the backoff of its n-th failure in a row (an earlier due mark keeps its time)."""
    done = await conn.scalar(
        sql(
            f"""
            WITH failed AS (
                UPDATE user_memory
                SET status = 'failed', error = :error, generation_time_ms = :ms, completed_at = now(),
                    lease_expires_at = NULL
                WHERE memory_id = :memory_id AND status = 'processing' AND attempts = :attempt
                RETURNING tenant_id, user_id
            ), streak AS (
                -- Failed rows since the last completed one; this statement's own update is not
                -- visible here, so this failure is the one more.
                SELECT f.tenant_id, f.user_id, count(m.memory_id) + 1 AS failures
                FROM failed f
                LEFT JOIN user_memory m
                  ON m.tenant_id = f.tenant_id AND m.user_id = f.user_id AND m.status = 'failed'
                 AND m.memory_id > coalesce((SELECT max(c.memory_id) FROM user_memory c
                                             WHERE c.tenant_id = f.tenant_id AND c.user_id = f.user_id
                                               AND c.status = 'completed'), 0)
                GROUP BY f.tenant_id, f.user_id
            ), due AS (
                UPDATE users u
                SET summary_due_at = coalesce(
                    u.summary_due_at, now() + make_interval(secs => {retry_delay_sql("s.failures")}))
                FROM streak s
                WHERE CAST(:keep_due AS boolean) AND u.tenant_id = s.tenant_id AND u.user_id = s.user_id
            )
            SELECT 1 FROM failed
            """
        ),
        {
            "memory_id": memory_id,
            "attempt": attempt,
            "error": error[:2000],
            "ms": generation_time_ms,
            "keep_due": keep_due,
            **backoff.params(),
        },
    )
    return done is not None


async def release(conn: AsyncConnection, *, memory_id: int, attempt: int) -> bool:
    """Give an owned row back to the queue (shutting down); the attempt is not counted."""
    done = await conn.scalar(sql(release_sql("user_memory")), {"memory_id": memory_id, "attempt": attempt})
    return done is not None


async def renew_leases(conn: AsyncConnection, *, memory_ids: list[int], lease_seconds: float) -> None:
    await conn.execute(sql(renew_leases_sql("user_memory")), {"ids": memory_ids, "lease": lease_seconds})


async def reap_expired(conn: AsyncConnection, *, max_attempts: int) -> list[dict[str, Any]]:
    """Fail rows whose lease expired on their last attempt (their runners died); the others are
    claimed again. Safe from every replica at once. Run in a transaction: it gives up on a lock
    after 100 ms (the next tick tries again)."""
    await conn.execute(sql("SET LOCAL lock_timeout = '100ms'"))
    rows = await conn.execute(
        sql(
            """
            UPDATE user_memory
            SET status = 'failed', completed_at = now(), lease_expires_at = NULL,
                error = 'lease expired on every attempt: the runner stopped renewing it '
                        '(crash, kill or redeploy)'
            WHERE status = 'processing' AND lease_expires_at < now() AND attempts >= :max_attempts
            RETURNING memory_id, tenant_id, user_id, attempts
            """
        ),
        {"max_attempts": max_attempts},
    )
    return [dict(r._mapping) for r in rows]


async def conversation_gone(conn: AsyncConnection, *, tenant_id: str, user_id: str) -> bool:
    """One of the user's conversations was deleted or cleared: its content must leave the user's
    summaries. With no conversation of the user left, the user and every summary go (True);
    else a new summary is due (False)."""
    gone = await conn.execute(
        sql(
            """
            DELETE FROM users
            WHERE tenant_id = :tenant_id AND user_id = :user_id
              AND NOT EXISTS (SELECT 1 FROM conversations WHERE tenant_id = :tenant_id AND user_id = :user_id)
            """
        ),
        {"tenant_id": tenant_id, "user_id": user_id},
    )
    if gone.rowcount:
        return True
    await mark_due(conn, tenant_id=tenant_id, user_id=user_id)
    return False


async def context(conn: AsyncConnection, *, tenant_id: str, user_id: str) -> dict[str, Any] | None:
    """The latest completed summary, the row in flight and whether a newer one is due; None for
    a user with neither a conversation nor a summary."""
    row = (
        await conn.execute(
            sql(
                f"""
                SELECT
                    (SELECT row_to_json(s) FROM (
                        SELECT {USER_MEMORY_COLUMNS} FROM user_memory
                        WHERE tenant_id = :tenant_id AND user_id = :user_id AND status = 'completed'
                        ORDER BY memory_id DESC LIMIT 1) s) AS summary,
                    (SELECT row_to_json(p) FROM (
                        SELECT memory_id, base_memory_id, created_at FROM user_memory
                        WHERE tenant_id = :tenant_id AND user_id = :user_id AND status = 'processing') p)
                        AS processing,
                    (SELECT summary_due_at FROM users WHERE tenant_id = :tenant_id AND user_id = :user_id)
                        AS due_at,
                    EXISTS (SELECT 1 FROM users WHERE tenant_id = :tenant_id AND user_id = :user_id)
                    OR EXISTS (SELECT 1 FROM conversations
                               WHERE tenant_id = :tenant_id AND user_id = :user_id)
                        AS known
                """
            ),
            {"tenant_id": tenant_id, "user_id": user_id},
        )
    ).one()
    if not row.known:
        return None
    return dict(row._mapping)


async def chain(conn: AsyncConnection, *, tenant_id: str, user_id: str) -> list[dict[str, Any]]:
    """Every cross-conversation summary of the user, newest first (the version chain)."""
    rows = await conn.execute(
        sql(
            f"""
            SELECT {USER_MEMORY_COLUMNS} FROM user_memory
            WHERE tenant_id = :tenant_id AND user_id = :user_id
            ORDER BY memory_id DESC
            """
        ),
        {"tenant_id": tenant_id, "user_id": user_id},
    )
    return [dict(r._mapping) for r in rows]
