"""SQL for the event outbox (issue 9): the events table, and the ``last_event_id`` and
``events_watched_until`` columns of conversations.

An event is written by the very statement (or transaction) that makes the change it reports,
so an event exists if and only if its change was committed. Every writer of events takes the
conversation's row lock to number them (``last_event_id``), so a conversation's events commit in
id order: a reader that saw event n has seen every earlier one, and resuming after an id never
skips one. A NOTIFY on ``CHANNEL`` (payload: the conversation id) goes out only when a stream or
a waiting read watches the conversation (``events_watched_until``) or when the statement creates
the conversation: NOTIFY serializes commits on a server-wide lock, which the hot append path
should not pay for conversations nobody watches. The mark lives on the conversation's row, which
every writer locks and re-reads at its latest version, so a writer that commits after a watch was
set always sees it.

Event types follow seed 003's names: ``entry:added``, ``compressed``, ``session:cleared``, plus
``summary:started``, ``summary:completed``, ``summary:failed``, ``conversation:deleted`` and
``conversation:imported``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection

from app.repositories.statements import sql

CHANNEL = "memory_events"

ENTRY_ADDED = "entry:added"
COMPRESSED = "compressed"
SESSION_CLEARED = "session:cleared"
SUMMARY_STARTED = "summary:started"
SUMMARY_COMPLETED = "summary:completed"
SUMMARY_FAILED = "summary:failed"
CONVERSATION_DELETED = "conversation:deleted"
CONVERSATION_IMPORTED = "conversation:imported"
TYPES = (
    ENTRY_ADDED,
    COMPRESSED,
    SESSION_CLEARED,
    SUMMARY_STARTED,
    SUMMARY_COMPLETED,
    SUMMARY_FAILED,
    CONVERSATION_DELETED,
    CONVERSATION_IMPORTED,
)

# RETURNING columns of an UPDATE (or DELETE) of conversations ``c`` that reserves ``count``
# event ids: the id before the first, the tenant, and whether a NOTIFY is wanted.
WATCHED = "coalesce(c.events_watched_until > now(), false)"


def reserve_returning(count: str) -> str:
    """The RETURNING list of an UPDATE of conversations ``c`` that sets
    ``last_event_id = c.last_event_id + {count}``: use it with :func:`emit_ctes`."""
    return (
        f"c.conversation_id, c.tenant_id, c.last_event_id - ({count}) AS events_before, {WATCHED} AS watched"
    )


# A condition that always holds and makes the statement read ``ev_notified`` (see emit_ctes).
NOTIFIED = "(SELECT count(*) FROM ev_notified) >= 0"


def emit_ctes(source: str, *, prefix: str = "ev") -> str:
    """CTEs that store the events of the CTE ``source`` (columns conversation_id, tenant_id,
    event_id, type, data (JSON text or json), watched), queue their webhook deliveries, and
    NOTIFY the watched conversations.
    The statement must read ``{prefix}_notified`` (e.g. ``(SELECT count(*) FROM ev_notified)``):
    a SELECT in a WITH runs only when read, unlike an INSERT."""
    return f"""{prefix}_stored AS (
        INSERT INTO events (conversation_id, event_id, tenant_id, type, data)
        SELECT conversation_id, event_id, tenant_id, type, CAST(data AS json) FROM {source}
    ), {prefix}_webhooked AS (
        -- One delivery per endpoint of the tenant (app.webhooks sends them).
        INSERT INTO webhook_deliveries (conversation_id, event_id, webhook_id, tenant_id)
        SELECT s.conversation_id, s.event_id, w.webhook_id, s.tenant_id
        FROM {source} s JOIN webhooks w ON w.tenant_id = s.tenant_id
    ), {prefix}_notified AS (
        SELECT pg_notify('{CHANNEL}', w.conversation_id)
        FROM (SELECT DISTINCT conversation_id FROM {source} WHERE watched) AS w
    )"""


_RECORD = sql(
    f"""
    WITH reserved AS (
        UPDATE conversations c SET last_event_id = c.last_event_id + 1
        WHERE c.conversation_id = :conversation_id
        RETURNING {reserve_returning("1")}
    ), source AS (
        SELECT conversation_id, tenant_id, events_before + 1 AS event_id, CAST(:type AS varchar) AS type,
               CAST(:data AS text) AS data, watched
        FROM reserved
    ), {emit_ctes("source")}
    SELECT event_id, (SELECT count(*) FROM ev_notified) AS notified FROM source
    """
)


async def record(
    conn: AsyncConnection, *, conversation_id: str, type: str, data: dict[str, Any]
) -> int | None:
    """Record one event of a conversation in the caller's transaction (commit it with the change
    it reports, e.g. ``session:cleared`` with the DELETE of the messages): one statement, which
    locks the conversation's row until the transaction ends. Returns the event's id, or None
    when the conversation does not exist (nothing is recorded)."""
    row = (
        await conn.execute(
            _RECORD, {"conversation_id": conversation_id, "type": type, "data": orjson.dumps(data).decode()}
        )
    ).one_or_none()
    return None if row is None else int(row.event_id)


_DELETE_CONVERSATION = sql(
    f"""
    WITH c AS (
        DELETE FROM conversations c
        WHERE c.conversation_id = :conversation_id AND c.tenant_id = :tenant_id
        RETURNING c.conversation_id, c.tenant_id, c.last_event_id, c.events_watched_until, c.user_id
    ), source AS (
        SELECT c.conversation_id, c.tenant_id, c.last_event_id + 1 AS event_id,
               '{CONVERSATION_DELETED}' AS type, '{{}}' AS data, {WATCHED} AS watched
        FROM c
    ), {emit_ctes("source")}
    SELECT event_id, (SELECT count(*) FROM ev_notified) AS notified, (SELECT user_id FROM c) AS user_id
    FROM source
    """
)


@dataclass(frozen=True, slots=True)
class Deleted:
    user_id: str | None


async def delete_conversation(
    conn: AsyncConnection, *, conversation_id: str, tenant_id: str
) -> Deleted | None:
    """Delete a conversation (its messages and memories go with it, ON DELETE CASCADE) and
    record ``conversation:deleted`` in the same statement; the event outlives the conversation.
    None when the tenant has no such conversation."""
    row = (
        await conn.execute(_DELETE_CONVERSATION, {"conversation_id": conversation_id, "tenant_id": tenant_id})
    ).one_or_none()
    return None if row is None else Deleted(user_id=row.user_id)


async def repair_counter(conn: AsyncConnection, *, conversation_id: str) -> None:
    """Move the conversation's event counter past its newest stored event. Needed only when it
    was created again while its DELETE (whose event it did not see yet) committed: a statement
    that failed on pk_events runs this, then runs again."""
    await conn.execute(
        sql(
            """
            UPDATE conversations
            SET last_event_id = greatest(last_event_id, (SELECT coalesce(max(event_id), 0) FROM events
                                                         WHERE conversation_id = :conversation_id))
            WHERE conversation_id = :conversation_id
            """
        ),
        {"conversation_id": conversation_id},
    )


async def after(
    conn: AsyncConnection, *, conversation_id: str, tenant_id: str, after_id: int, limit: int
) -> list[dict[str, Any]]:
    """The tenant's events of a conversation after ``after_id``, oldest first (``data`` as JSON
    text)."""
    rows = await conn.execute(
        sql(
            """
            SELECT event_id, type, data::text AS data, created_at
            FROM events
            WHERE conversation_id = :conversation_id AND tenant_id = :tenant_id AND event_id > :after
            ORDER BY event_id
            LIMIT :limit
            """
        ),
        {"conversation_id": conversation_id, "tenant_id": tenant_id, "after": after_id, "limit": limit},
    )
    return [dict(r._mapping) for r in rows]


async def watch(conn: AsyncConnection, *, conversation_ids: list[str], seconds: float) -> int:
    """Mark conversations watched for ``seconds`` (never shortening a mark): their writes NOTIFY.
    Returns how many exist (a conversation not created yet cannot be marked)."""
    result = await conn.execute(
        sql(
            """
            UPDATE conversations
            SET events_watched_until = greatest(events_watched_until,
                                                now() + make_interval(secs => :seconds))
            WHERE conversation_id = ANY(CAST(:ids AS varchar[]))
            """
        ),
        {"ids": conversation_ids, "seconds": seconds},
    )
    return int(result.rowcount)


async def expire(conn: AsyncConnection, *, older_than_hours: float, batch: int = 10_000) -> int:
    """Delete up to ``batch`` events older than ``older_than_hours`` (the maintenance loop runs
    this often enough; a batch bounds each run's locks and WAL)."""
    result = await conn.execute(
        sql(
            """
            DELETE FROM events WHERE ctid = ANY(ARRAY(
                SELECT ctid FROM events
                WHERE created_at < now() - make_interval(secs => :hours * 3600)
                LIMIT :batch))
            """
        ),
        {"hours": older_than_hours, "batch": batch},
    )
    return int(result.rowcount)
