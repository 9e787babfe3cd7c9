"""SQL for the conversations table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection

from app.memory.types import ContextSpec, Wake
from app.repositories.statements import Db, Statement, sql
from app.repositories.tenants import of_tenant

_COLUMNS_OF = """
    c.conversation_id, c.created_at, {metadata} AS metadata, c.memory_policy,
    c.next_sequence AS message_count, c.next_round AS round_count,
    (SELECT count(*) FROM memory m WHERE m.conversation_id = c.conversation_id) AS memory_count,
    c.summary_failures, c.summary_retry_at, c.user_id, c.ended_at, c.archived_at, c.last_message_at
"""
_COLUMNS = _COLUMNS_OF.format(metadata="c.metadata")
# Listings leave metadata out unless asked for, so a page stays small.
_LIST_COLUMNS = _COLUMNS_OF.format(metadata="CASE WHEN :metadata THEN c.metadata END")


async def create(
    conn: AsyncConnection,
    *,
    conversation_id: str,
    tenant_id: str,
    metadata: dict[str, Any] | None,
    memory_policy: dict[str, Any],
    context: ContextSpec,
    wake: Wake,
    user_id: str | None = None,
) -> dict[str, Any] | None:
    """Create an empty conversation; None when the id is taken (by any tenant)."""
    row = (
        await conn.execute(
            sql(
                f"""
                WITH c AS (
                    INSERT INTO conversations (conversation_id, tenant_id, metadata, memory_policy,
                                               context_summaries, context_recent_rounds,
                                               context_max_summary_tokens,
                                               wake_round, wake_sequence, wake_tokens, user_id, last_event_id)
                    VALUES (:conversation_id, :tenant_id, CAST(:metadata AS jsonb),
                            CAST(:memory_policy AS jsonb), :context_summaries, :context_recent_rounds,
                            CAST(:context_max_summary_tokens AS integer), :wake_round, :wake_sequence,
                            :wake_tokens, :user_id,
                            -- Created again after a DELETE: its events go on after the old ones.
                            (SELECT coalesce(max(event_id), 0) FROM events
                             WHERE conversation_id = CAST(:conversation_id AS varchar)))
                    ON CONFLICT (conversation_id) DO NOTHING
                    RETURNING *
                )
                SELECT {_COLUMNS}, octet_length(c.metadata::text) AS metadata_bytes,
                       (SELECT count(*) FROM jsonb_object_keys(c.metadata)) AS metadata_keys
                FROM c
                """
            ),
            {
                "conversation_id": conversation_id,
                "tenant_id": tenant_id,
                "metadata": orjson.dumps(metadata or {}).decode(),
                "memory_policy": orjson.dumps(memory_policy).decode(),
                "context_summaries": context.summaries,
                "context_recent_rounds": context.recent_rounds,
                "context_max_summary_tokens": context.max_summary_tokens,
                "wake_round": wake.round,
                "wake_sequence": wake.sequence,
                "wake_tokens": wake.tokens,
                "user_id": user_id,
            },
        )
    ).one_or_none()
    return None if row is None else dict(row._mapping)


async def get(conn: AsyncConnection, *, conversation_id: str, tenant_id: str) -> dict[str, Any] | None:
    row = (
        await conn.execute(
            sql(
                f"""
                SELECT {_COLUMNS} FROM conversations c
                WHERE c.conversation_id = :conversation_id AND c.tenant_id = :tenant_id
                """
            ),
            {"conversation_id": conversation_id, "tenant_id": tenant_id},
        )
    ).one_or_none()
    return None if row is None else dict(row._mapping)


@dataclass(frozen=True, slots=True)
class Position:
    """Where a conversation stands: its newest message and round (-1 while empty), its stored
    policy, and whether its summaries are backing off after failures."""

    tenant_id: str
    last_sequence: int
    last_round: int
    memory_policy: dict[str, Any]
    backing_off: bool


_POSITION = Statement(
    """
    SELECT tenant_id, next_sequence - 1 AS last_sequence, next_round - 1 AS last_round,
           memory_policy,
           coalesce(summary_retry_at > now(), false) AS backing_off
    FROM conversations
    WHERE conversation_id = :conversation_id
      AND (CAST(:tenant_id AS varchar) IS NULL OR tenant_id = :tenant_id)
    FOR KEY SHARE
    """
)


async def position(conn: Db, *, conversation_id: str, tenant_id: str | None = None) -> Position | None:
    """Where the conversation stands (last_sequence is -1 while it is empty); None when it does
    not exist (for ``tenant_id``, when given). Takes a key-share lock on the row until the
    transaction ends, so a DELETE of the conversation waits for the summary row the caller may
    insert (instead of the insert failing on the foreign key)."""
    row = await _POSITION.fetchrow(conn, {"conversation_id": conversation_id, "tenant_id": tenant_id})
    if row is None:
        return None
    return Position(
        tenant_id=row["tenant_id"],
        last_sequence=int(row["last_sequence"]),
        last_round=int(row["last_round"]),
        memory_policy=row["memory_policy"],
        backing_off=bool(row["backing_off"]),
    )


async def update_policy(
    conn: AsyncConnection,
    *,
    conversation_id: str,
    memory_policy: dict[str, Any],
    context: ContextSpec,
) -> None:
    """Store a conversation's new policy parameters. Its wake point goes back to 0, so its next
    round asks the policy, with the new parameters, whether a summary is due."""
    await conn.execute(
        sql(
            """
            UPDATE conversations
            SET memory_policy = CAST(:memory_policy AS jsonb), context_summaries = :context_summaries,
                context_recent_rounds = :context_recent_rounds,
                context_max_summary_tokens = CAST(:context_max_summary_tokens AS integer),
                wake_round = 0, wake_sequence = 0,
                wake_tokens = NULL
            WHERE conversation_id = :conversation_id
            """
        ),
        {
            "conversation_id": conversation_id,
            "memory_policy": orjson.dumps(memory_policy).decode(),
            "context_summaries": context.summaries,
            "context_recent_rounds": context.recent_rounds,
            "context_max_summary_tokens": context.max_summary_tokens,
        },
    )


async def end(conn: AsyncConnection, *, conversation_id: str) -> dict[str, Any]:
    """Mark a (locked) conversation ended, once: a later call keeps the first time."""
    row = (
        await conn.execute(
            sql(
                f"""
                WITH c AS (
                    UPDATE conversations SET ended_at = coalesce(ended_at, now())
                    WHERE conversation_id = :conversation_id
                    RETURNING *
                )
                SELECT {_COLUMNS} FROM c
                """
            ),
            {"conversation_id": conversation_id},
        )
    ).one()
    return dict(row._mapping)


async def exists(conn: AsyncConnection, *, conversation_id: str, tenant_id: str | None) -> bool:
    """Whether the conversation exists for ``tenant_id`` (None: for any tenant)."""
    found = await conn.scalar(
        sql(
            "SELECT 1 FROM conversations "
            f"WHERE conversation_id = :conversation_id AND {of_tenant('tenant_id', tenant_id)}"
        ),
        {"conversation_id": conversation_id, "tenant_id": tenant_id},
    )
    return found is not None


async def list_page(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    after: str | None,
    limit: int,
    include_metadata: bool,
    archived: bool | None = False,
) -> list[dict[str, Any]]:
    """Keyset pagination by conversation_id (stable under concurrent inserts); ``archived``:
    only those not archived (False), only archived ones (True), or all (None)."""
    which = {False: "c.archived_at IS NULL", True: "c.archived_at IS NOT NULL", None: "TRUE"}[archived]
    rows = await conn.execute(
        sql(
            f"""
            SELECT {_LIST_COLUMNS} FROM conversations c
            WHERE tenant_id = :tenant_id AND (CAST(:after AS varchar) IS NULL OR conversation_id > :after)
              AND {which}
            ORDER BY conversation_id
            LIMIT :limit
            """
        ),
        {"tenant_id": tenant_id, "after": after, "limit": limit, "metadata": include_metadata},
    )
    return [dict(r._mapping) for r in rows]


async def archive_idle(conn: AsyncConnection, *, older_than_days: float, batch: int) -> list[str]:
    """Archive up to ``batch`` conversations with no new message for ``older_than_days``,
    oldest first. Rows another transaction holds (a round being stored, another replica's batch)
    are skipped, so replicas archive side by side without waiting or archiving one twice, and a
    round racing the archive is either stored first (and the conversation is no longer idle) or
    refused after. Run in a transaction: it gives up on a lock after 100 ms (behind a
    migration's or an operator's table lock, the next tick tries again) rather than hold a
    pooled connection a request may need."""
    await conn.execute(sql("SET LOCAL lock_timeout = '100ms'"))
    rows = await conn.execute(
        sql(
            """
            WITH picked AS (
                SELECT conversation_id FROM conversations
                WHERE archived_at IS NULL
                  AND last_message_at < now() - make_interval(secs => CAST(:days AS double precision) * 86400)
                ORDER BY last_message_at
                LIMIT :batch
                FOR NO KEY UPDATE SKIP LOCKED
            )
            UPDATE conversations c SET archived_at = now()
            FROM picked
            WHERE c.conversation_id = picked.conversation_id
              AND c.last_message_at < now() - make_interval(secs => CAST(:days AS double precision) * 86400)
            RETURNING c.conversation_id
            """
        ),
        {"days": older_than_days, "batch": batch},
    )
    return [str(r.conversation_id) for r in rows]


async def restore(
    conn: AsyncConnection, *, conversation_id: str, tenant_id: str | None
) -> dict[str, Any] | str | None:
    """Restore an archived conversation: writable again, and its archive clock restarts now.
    None when the tenant has no such conversation; 'not_archived' when it is not archived."""
    row = (
        await conn.execute(
            sql(
                f"""
                WITH c AS (
                    UPDATE conversations SET archived_at = NULL, last_message_at = now()
                    WHERE conversation_id = :conversation_id AND {of_tenant("tenant_id", tenant_id)}
                      AND archived_at IS NOT NULL
                    RETURNING *
                )
                SELECT {_COLUMNS} FROM c
                """
            ),
            {"conversation_id": conversation_id, "tenant_id": tenant_id},
        )
    ).one_or_none()
    if row is not None:
        return dict(row._mapping)
    return (
        "not_archived" if await exists(conn, conversation_id=conversation_id, tenant_id=tenant_id) else None
    )


async def failing(conn: AsyncConnection, *, tenant_id: str | None, limit: int) -> list[dict[str, Any]]:
    """Conversations whose latest summaries failed, the longest streak first."""
    rows = await conn.execute(
        sql(
            f"""
            SELECT c.conversation_id, c.tenant_id, c.summary_failures, c.summary_retry_at,
                   (SELECT m.error FROM memory m
                    WHERE m.conversation_id = c.conversation_id AND m.status = 'failed'
                    ORDER BY m.completed_at DESC NULLS LAST, m.memory_id DESC LIMIT 1) AS last_error
            FROM conversations c
            WHERE {of_tenant("c.tenant_id", tenant_id)} AND c.summary_failures > 0
            ORDER BY c.summary_failures DESC, c.conversation_id
            LIMIT :limit
            """
        ),
        {"tenant_id": tenant_id, "limit": limit},
    )
    return [dict(r._mapping) for r in rows]


async def delete(conn: AsyncConnection, *, conversation_id: str, tenant_id: str) -> bool:
    """Delete a conversation with its messages and memories (ON DELETE CASCADE)."""
    deleted = await conn.scalar(
        sql(
            "DELETE FROM conversations "
            "WHERE conversation_id = :conversation_id AND tenant_id = :tenant_id "
            "RETURNING 1"
        ),
        {"conversation_id": conversation_id, "tenant_id": tenant_id},
    )
    return deleted is not None
