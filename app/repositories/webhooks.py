"""SQL for webhooks (issue 12): a tenant's endpoints, and the deliveries of its events.

A delivery row is written with its event (app.repositories.events.emit_ctes), so an event is
delivered if and only if it was committed. Any replica or worker claims due deliveries with
SKIP LOCKED; a claim counts the attempt and pushes ``next_attempt_at`` a lease ahead, so a
delivery whose sender died is claimed again once the lease is over (at least once). After
``max_attempts`` failures a delivery is dead: listed in ops, retried on request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from app.repositories.statements import sql

# At most this many endpoints per tenant.
MAX_PER_TENANT = 10


async def create(conn: AsyncConnection, *, tenant_id: str, url: str, secret: str) -> dict[str, Any] | None:
    """A new endpoint, or None when the tenant has MAX_PER_TENANT already. Run it in a
    transaction: the tenant's lock, held until the transaction ends, makes concurrent creations
    count one after another (READ COMMITTED: each count sees the rows committed before it)."""
    await conn.execute(
        sql("SELECT pg_advisory_xact_lock(hashtext('webhooks'), hashtext(:tenant_id))"),
        {"tenant_id": tenant_id},
    )
    row = (
        await conn.execute(
            sql(
                """
                INSERT INTO webhooks (tenant_id, url, secret)
                SELECT CAST(:tenant_id AS varchar), CAST(:url AS varchar), CAST(:secret AS varchar)
                WHERE (SELECT count(*) FROM webhooks WHERE tenant_id = :tenant_id) < :most
                RETURNING webhook_id, url, secret, created_at
                """
            ),
            {"tenant_id": tenant_id, "url": url, "secret": secret, "most": MAX_PER_TENANT},
        )
    ).one_or_none()
    return None if row is None else dict(row._mapping)


async def list_for(conn: AsyncConnection, *, tenant_id: str) -> list[dict[str, Any]]:
    rows = await conn.execute(
        sql(
            "SELECT webhook_id, url, created_at FROM webhooks "
            "WHERE tenant_id = :tenant_id ORDER BY webhook_id"
        ),
        {"tenant_id": tenant_id},
    )
    return [dict(r._mapping) for r in rows]


async def delete(conn: AsyncConnection, *, tenant_id: str, webhook_id: int) -> bool:
    """Delete an endpoint and its deliveries (pending ones are not sent)."""
    found = await conn.scalar(
        sql(
            """
            WITH gone AS (
                DELETE FROM webhooks WHERE webhook_id = :webhook_id AND tenant_id = :tenant_id
                RETURNING webhook_id
            ), deliveries AS (
                DELETE FROM webhook_deliveries d USING gone WHERE d.webhook_id = gone.webhook_id
            )
            SELECT count(*) FROM gone
            """
        ),
        {"tenant_id": tenant_id, "webhook_id": webhook_id},
    )
    return bool(found)


@dataclass(frozen=True, slots=True)
class Delivery:
    """A claimed delivery: which event to which endpoint, the attempt it is, and what to send."""

    conversation_id: str
    event_id: int
    webhook_id: int
    attempt: int
    url: str
    secret: str
    type: str
    data: str
    created_at: Any


async def claim(conn: AsyncConnection, *, limit: int, lease_seconds: float) -> list[Delivery]:
    """Claim up to ``limit`` due deliveries, oldest due first; rows another sender holds are
    skipped. Deliveries of expired events are dropped."""
    rows = await conn.execute(
        sql(
            """
            WITH due AS (
                SELECT conversation_id, event_id, webhook_id FROM webhook_deliveries
                WHERE status = 'pending' AND next_attempt_at <= now()
                ORDER BY next_attempt_at
                LIMIT :limit
                FOR UPDATE SKIP LOCKED
            ), claimed AS (
                UPDATE webhook_deliveries d
                SET attempts = d.attempts + 1, next_attempt_at = now() + make_interval(secs => :lease)
                FROM due
                WHERE d.conversation_id = due.conversation_id AND d.event_id = due.event_id
                  AND d.webhook_id = due.webhook_id
                RETURNING d.conversation_id, d.event_id, d.webhook_id, d.attempts
            )
            SELECT c.conversation_id, c.event_id, c.webhook_id, c.attempts, w.url, w.secret, e.type,
                   e.data::text AS data, e.created_at
            FROM claimed c
            JOIN webhooks w ON w.webhook_id = c.webhook_id
            JOIN events e ON e.conversation_id = c.conversation_id AND e.event_id = c.event_id
            ORDER BY c.conversation_id, c.event_id
            """
        ),
        {"limit": limit, "lease": lease_seconds},
    )
    return [
        Delivery(
            conversation_id=r.conversation_id,
            event_id=int(r.event_id),
            webhook_id=int(r.webhook_id),
            attempt=int(r.attempts),
            url=r.url,
            secret=r.secret,
            type=r.type,
            data=r.data,
            created_at=r.created_at,
        )
        for r in rows
    ]


_KEY = "conversation_id = :conversation_id AND event_id = :event_id AND webhook_id = :webhook_id"


def _key(delivery: Delivery) -> dict[str, Any]:
    return {
        "conversation_id": delivery.conversation_id,
        "event_id": delivery.event_id,
        "webhook_id": delivery.webhook_id,
        "attempt": delivery.attempt,
    }


async def delivered(conn: AsyncConnection, *, delivery: Delivery) -> None:
    await conn.execute(
        sql(
            f"""
            UPDATE webhook_deliveries SET status = 'delivered', delivered_at = now(), last_error = NULL
            WHERE {_KEY} AND attempts = :attempt AND status = 'pending'
            """
        ),
        _key(delivery),
    )


async def failed(
    conn: AsyncConnection,
    *,
    delivery: Delivery,
    error: str,
    max_attempts: int,
    backoff_seconds: float,
    backoff_max_seconds: float,
) -> bool:
    """Record a failed attempt: due again after backoff * 2^(attempt-1) (capped), or dead after
    ``max_attempts``. Returns whether it is dead."""
    dead = await conn.scalar(
        sql(
            f"""
            UPDATE webhook_deliveries
            SET status = CASE WHEN attempts >= :max_attempts THEN 'dead' ELSE 'pending' END,
                next_attempt_at = now() + make_interval(
                    secs => least(:backoff_max, :backoff * power(2, least(attempts - 1, 30)))),
                last_error = :error
            WHERE {_KEY} AND attempts = :attempt AND status = 'pending'
            RETURNING status = 'dead'
            """
        ),
        {
            **_key(delivery),
            "error": error[:1000],
            "max_attempts": max_attempts,
            "backoff": backoff_seconds,
            "backoff_max": backoff_max_seconds,
        },
    )
    return bool(dead)


async def dead(conn: AsyncConnection, *, tenant_id: str | None, limit: int) -> list[dict[str, Any]]:
    """The tenant's dead deliveries (the dead-letter view), newest first; every tenant's when
    ``tenant_id`` is None (the admin view)."""
    rows = await conn.execute(
        sql(
            """
            SELECT d.tenant_id, d.conversation_id, d.event_id, d.webhook_id, w.url, e.type, d.attempts,
                   d.last_error, d.created_at
            FROM webhook_deliveries d
            JOIN webhooks w ON w.webhook_id = d.webhook_id
            LEFT JOIN events e ON e.conversation_id = d.conversation_id AND e.event_id = d.event_id
            WHERE (CAST(:tenant_id AS varchar) IS NULL OR d.tenant_id = :tenant_id) AND d.status = 'dead'
            ORDER BY d.created_at DESC, d.conversation_id, d.event_id DESC
            LIMIT :limit
            """
        ),
        {"tenant_id": tenant_id, "limit": limit},
    )
    return [dict(r._mapping) for r in rows]


async def retry_dead(
    conn: AsyncConnection, *, tenant_id: str | None, webhook_id: int, conversation_id: str, event_id: int
) -> str | None:
    """Make a dead delivery due now, with its attempts reset. Returns its status before (so
    'dead' means it was retried), or None when the tenant (any, when None) has no such delivery."""
    found = await conn.scalar(
        sql(
            f"""
            WITH before AS (
                SELECT status FROM webhook_deliveries
                WHERE {_KEY} AND (CAST(:tenant_id AS varchar) IS NULL OR tenant_id = :tenant_id)
                FOR UPDATE
            ), retried AS (
                UPDATE webhook_deliveries
                SET status = 'pending', attempts = 0, next_attempt_at = now()
                WHERE {_KEY} AND (CAST(:tenant_id AS varchar) IS NULL OR tenant_id = :tenant_id)
                  AND status = 'dead'
            )
            SELECT status FROM before
            """
        ),
        {
            "tenant_id": tenant_id,
            "webhook_id": webhook_id,
            "conversation_id": conversation_id,
            "event_id": event_id,
        },
    )
    return None if found is None else str(found)


async def expire(conn: AsyncConnection, *, older_than_hours: float, batch: int = 10_000) -> int:
    """Delete up to ``batch`` deliveries of events older than the events' TTL (they go together)."""
    result = await conn.execute(
        sql(
            """
            DELETE FROM webhook_deliveries WHERE ctid = ANY(ARRAY(
                SELECT ctid FROM webhook_deliveries
                WHERE created_at < now() - make_interval(secs => :hours * 3600)
                LIMIT :batch))
            """
        ),
        {"hours": older_than_hours, "batch": batch},
    )
    return int(result.rowcount)
