"""SQL for due summary work: what runners claim, across the conversations and memory tables.

Work is of two kinds, both durable in PostgreSQL:
- a conversation whose summary is due (``summary_due_at`` has come) and not yet planned: a
  runner locks it, asks its policy for the plan and inserts the 'processing' row it then owns;
- a 'processing' row no runner owns: queued (``lease_expires_at`` NULL: planned when a summary
  completed, or asked for by an operator), or left by a runner that died (lease expired), which
  is claimed again after a backoff until it has used its attempts (then the reaper fails it).

Claims use row locks with SKIP LOCKED and conditional updates, so any number of replicas and
workers can claim at once and each piece of work goes to one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from app.memory.types import MemoryRef, Wake
from app.repositories.memory import NEWEST_BY_STATUS, REF_COLUMNS, Backoff, chain_cte, retry_delay_sql
from app.repositories.statements import Db, Row, Statement, sql

# Work in a fair order. A tenant's turn is the number of summaries it already has running plus
# its position among its own waiting work (oldest first); among equal turns, the tenant this
# runner served least recently goes first (:served_tenants / :served_turns, the runner's own
# record), then the oldest work. So a free slot goes to the tenant with the least running, in
# round robin, and one tenant's backlog cannot hold back another's work.
#
# Only each tenant's :limit oldest due conversations can be among the first :limit pieces, so
# those are all that is read: the tenants with due conversations by a skip scan of
# ix_conversations_due_by_tenant, then each one's oldest from the same index. A claim's cost
# grows with the tenants and the summaries in flight, not with the backlog.
_CANDIDATES = Statement(
    f"""
    WITH RECURSIVE tenants AS (
        (SELECT tenant_id FROM conversations WHERE summary_due_at IS NOT NULL
         ORDER BY tenant_id LIMIT 1)
        UNION ALL
        SELECT (SELECT c.tenant_id FROM conversations c
                WHERE c.summary_due_at IS NOT NULL AND c.tenant_id > t.tenant_id
                ORDER BY c.tenant_id LIMIT 1)
        FROM tenants t WHERE t.tenant_id IS NOT NULL
    ), running AS (
        SELECT c.tenant_id, count(*) AS n
        FROM memory m JOIN conversations c USING (conversation_id)
        WHERE m.status = 'processing' AND m.lease_expires_at > now()
        GROUP BY c.tenant_id
    ), waiting AS (
        SELECT m.memory_id, m.conversation_id, c.tenant_id,
               coalesce(m.lease_expires_at, m.created_at) AS since
        FROM memory m JOIN conversations c USING (conversation_id)
        WHERE m.status = 'processing'
          AND (m.lease_expires_at IS NULL
               OR (m.attempts < :max_attempts
                   AND m.lease_expires_at
                       < now() - make_interval(secs => {retry_delay_sql("m.attempts")})))
        UNION ALL
        SELECT d.* FROM tenants t CROSS JOIN LATERAL (
            SELECT CAST(NULL AS integer), c.conversation_id, c.tenant_id, c.summary_due_at
            FROM conversations c
            WHERE c.tenant_id = t.tenant_id AND c.summary_due_at <= now()
              AND NOT EXISTS (SELECT 1 FROM memory m
                              WHERE m.conversation_id = c.conversation_id AND m.status = 'processing')
            ORDER BY c.summary_due_at, c.conversation_id
            LIMIT :limit
        ) d
        WHERE t.tenant_id IS NOT NULL
    )
    SELECT w.memory_id, w.conversation_id, w.tenant_id
    FROM waiting w
    LEFT JOIN running r USING (tenant_id)
    LEFT JOIN unnest(CAST(:served_tenants AS varchar[]), CAST(:served_turns AS bigint[]))
              AS s(tenant_id, turn) USING (tenant_id)
    ORDER BY row_number() OVER (PARTITION BY w.tenant_id ORDER BY w.since, w.conversation_id)
             + coalesce(r.n, 0),
             s.turn NULLS FIRST, w.since, w.conversation_id
    LIMIT :limit
    """
)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A piece of work to try to claim: a 'processing' row (``memory_id``) or a due
    conversation (``memory_id`` None)."""

    conversation_id: str
    tenant_id: str
    memory_id: int | None


async def candidates(
    conn: Db,
    *,
    limit: int,
    max_attempts: int,
    backoff: Backoff,
    served: Mapping[str, int] | None = None,
) -> list[Candidate]:
    """Up to ``limit`` pieces of work, in the fair order; ``served`` maps tenants to when this
    runner last claimed work of theirs (a counter: higher is more recent). Read without locks:
    claiming is a separate, conditional step that may find a piece taken meanwhile."""
    served = served or {}
    rows = await _CANDIDATES.fetch(
        conn,
        {
            "limit": limit,
            "max_attempts": max_attempts,
            "served_tenants": list(served),
            "served_turns": list(served.values()),
            **backoff.params(),
        },
    )
    return [
        Candidate(conversation_id=r["conversation_id"], tenant_id=r["tenant_id"], memory_id=r["memory_id"])
        for r in rows
    ]


def claim_rows_sql(table: str) -> str:
    """The claim of queued or abandoned 'processing' rows of ``table`` (memory, user_memory: the
    same columns): set their leases and count the attempts, in one statement. A row another
    transaction has locked (a runner completing or failing it, or a frozen process's) is skipped,
    not waited for: the rest of the batch is claimed, and the row is looked at again next time."""
    claimable = f"""status = 'processing'
          AND (lease_expires_at IS NULL
               OR (attempts < :max_attempts
                   AND lease_expires_at < now() - make_interval(secs => {retry_delay_sql("attempts")})))"""
    return f"""
        UPDATE {table}
        SET lease_expires_at = now() + make_interval(secs => :lease), attempts = attempts + 1
        WHERE memory_id IN (SELECT memory_id FROM {table}
                            WHERE memory_id = ANY(CAST(:ids AS integer[])) AND {claimable}
                            FOR UPDATE SKIP LOCKED)
          AND {claimable}
        RETURNING memory_id, attempts
    """


_CLAIM_ROWS = Statement(claim_rows_sql("memory"))


async def claim_rows(
    conn: Db, *, memory_ids: list[int], lease_seconds: float, max_attempts: int, backoff: Backoff
) -> dict[int, int]:
    """Own queued or abandoned 'processing' memory rows. Returns the ids this runner got
    (another may have taken some first), each with its attempt."""
    rows = await _CLAIM_ROWS.fetch(
        conn, {"ids": memory_ids, "lease": lease_seconds, "max_attempts": max_attempts, **backoff.params()}
    )
    return {int(r["memory_id"]): int(r["attempts"]) for r in rows}


# What a plan observes of a conversation, in one statement: the newest memory row of each
# status, the completed summaries the context shows (chain_cte), the tokens up to the latest
# completed summary's end, and the boundaries within the policy's lookback (with :starts) with the
# last one before it. One row per item, told apart by ``part``, in order within each part.
_OBSERVE = Statement(
    "WITH RECURSIVE "
    + chain_cte("chain", REF_COLUMNS, conversation=":conversation_id", limit=":shown")
    + f""", newest AS ({NEWEST_BY_STATUS})
    SELECT 'newest' AS part, 0 AS ord, memory_id, kind, status, start_sequence, end_sequence,
           start_round, end_round, tokens
    FROM newest
    UNION ALL
    SELECT 'shown', depth, memory_id, kind, status, start_sequence, end_sequence, start_round,
           end_round, tokens
    FROM chain
    UNION ALL
    SELECT 'covered', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, tokens_before + tokens
    FROM messages
    WHERE conversation_id = :conversation_id
      AND sequence = (SELECT end_sequence FROM newest WHERE status = 'completed')
    UNION ALL
    SELECT 'start', sequence, NULL, NULL, NULL, sequence, NULL, round, NULL, NULL
    FROM messages
    WHERE CAST(:starts AS boolean) AND conversation_id = :conversation_id AND boundary
      AND sequence <= :last
      AND sequence >= coalesce((SELECT max(sequence) FROM messages
                                WHERE conversation_id = :conversation_id AND boundary
                                  AND sequence <= :lowest), 0)
    ORDER BY part, ord
    """
)


@dataclass(frozen=True, slots=True)
class Observed:
    """What a plan observes of a conversation (app.memory.types.ConversationState's parts)."""

    latest_completed: MemoryRef | None
    newest: MemoryRef | None
    shown: tuple[MemoryRef, ...]
    covered_tokens: int
    round_starts: tuple[tuple[int, int], ...]


async def observe(
    conn: Db, *, conversation_id: str, shown: int, lookback: int, last_sequence: int
) -> Observed:
    """The newest memory row of each status, the ``shown`` newest completed summaries the
    context shows, the tokens of the messages up to the latest completed summary's end, and
    (round, first sequence) of every boundary within the last ``lookback`` messages up to
    ``last_sequence`` and of the last one before them, oldest first (none when ``lookback`` is
    0). Each part is index probes or a short index range scan."""
    rows = await _OBSERVE.fetch(
        conn,
        {
            "conversation_id": conversation_id,
            "shown": shown,
            "starts": lookback > 0 and last_sequence >= 0,
            "last": last_sequence,
            "lowest": last_sequence - lookback + 1,
        },
    )
    refs: list[MemoryRef] = []
    chain: list[MemoryRef] = []
    starts: list[tuple[int, int]] = []
    covered = 0
    for r in rows:
        part = r["part"]
        if part == "start":
            starts.append((int(r["start_round"]), int(r["start_sequence"])))
        elif part == "covered":
            covered = int(r["tokens"])
        else:
            ref = MemoryRef(
                memory_id=r["memory_id"],
                kind=r["kind"],
                status=r["status"],
                start_sequence=r["start_sequence"],
                end_sequence=r["end_sequence"],
                start_round=r["start_round"],
                end_round=r["end_round"],
                tokens=r["tokens"],
            )
            (refs if part == "newest" else chain).append(ref)
    return Observed(
        latest_completed=next((r for r in refs if r.status == "completed"), None),
        newest=max(refs, key=lambda r: (r.end_sequence, r.memory_id), default=None),
        shown=tuple(chain),
        covered_tokens=covered,
        round_starts=tuple(starts),
    )


@dataclass(frozen=True, slots=True)
class Locked:
    """A conversation locked for planning: its tenant, newest message and round, stored policy,
    and the tool calls its last round left waiting for results."""

    tenant_id: str
    last_sequence: int
    last_round: int
    memory_policy: dict[str, Any]
    open_calls: int
    total_tokens: int
    ended: bool = False
    user_id: str | None = None
    archived: bool = False


_LOCK = """
    SELECT tenant_id, next_sequence - 1 AS last_sequence, next_round - 1 AS last_round, memory_policy,
           open_tool_calls, next_tokens, ended_at IS NOT NULL AS ended, user_id,
           archived_at IS NOT NULL AS archived
    FROM conversations c
    WHERE conversation_id = :conversation_id {condition}
    FOR NO KEY UPDATE {skip}
"""


_LOCK_DUE = Statement(
    _LOCK.format(
        condition="""AND summary_due_at <= now()
        AND NOT EXISTS (SELECT 1 FROM memory m
                        WHERE m.conversation_id = c.conversation_id AND m.status = 'processing')""",
        skip="SKIP LOCKED",
    )
)
_LOCK_WAIT = Statement(
    _LOCK.format(condition="AND (CAST(:tenant_id AS varchar) IS NULL OR tenant_id = :tenant_id)", skip="")
)


async def lock_due(conn: Db, *, conversation_id: str) -> Locked | None:
    """Lock a conversation whose summary is due and not in flight, skipping it when another
    runner (or a POST to it) holds its row. The lock makes a POST that arrives meanwhile wait
    and then compare its round against the wake point this transaction sets."""
    return _locked(await _LOCK_DUE.fetchrow(conn, {"conversation_id": conversation_id}))


async def lock(conn: Db, *, conversation_id: str, tenant_id: str | None = None) -> Locked | None:
    """Lock a conversation (of ``tenant_id``, when given) for planning, waiting for its row."""
    return _locked(
        await _LOCK_WAIT.fetchrow(conn, {"conversation_id": conversation_id, "tenant_id": tenant_id})
    )


def _locked(row: Row | None) -> Locked | None:
    if row is None:
        return None
    return Locked(
        tenant_id=row["tenant_id"],
        last_sequence=int(row["last_sequence"]),
        last_round=int(row["last_round"]),
        memory_policy=row["memory_policy"],
        open_calls=int(row["open_tool_calls"]),
        total_tokens=int(row["next_tokens"]),
        ended=bool(row["ended"]),
        user_id=row["user_id"],
        archived=bool(row["archived"]),
    )


_SETTLE = Statement(
    """
    UPDATE conversations
    SET summary_due_at = NULL, wake_round = :wake_round, wake_sequence = :wake_sequence,
        wake_tokens = :wake_tokens
    WHERE conversation_id = :conversation_id
    """
)


async def settle(conn: Db, *, conversation_id: str, wake: Wake) -> None:
    """Nothing is due any more (a plan was made, or the policy found nothing): clear the mark
    and store when the policy next wants to be asked."""
    await _SETTLE.execute(
        conn,
        {
            "conversation_id": conversation_id,
            "wake_round": wake.round,
            "wake_sequence": wake.sequence,
            "wake_tokens": wake.tokens,
        },
    )


async def tenant_load(conn: AsyncConnection, *, tenant_id: str) -> dict[str, Any]:
    """A tenant's summary work across every replica: running (owned rows), queued (waiting for
    a runner, or for a retry after their runner died), due (conversations waiting to be planned),
    and how long the oldest due one has waited."""
    row = (
        await conn.execute(
            sql(
                """
                SELECT
                    count(*) FILTER (WHERE m.lease_expires_at > now()) AS running,
                    count(*) FILTER (WHERE m.lease_expires_at IS NULL OR m.lease_expires_at <= now())
                        AS queued,
                    (SELECT count(*) FROM conversations d
                     WHERE d.tenant_id = :tenant_id AND d.summary_due_at IS NOT NULL
                       AND NOT EXISTS (SELECT 1 FROM memory p WHERE p.conversation_id = d.conversation_id
                                         AND p.status = 'processing')) AS due,
                    (SELECT extract(epoch FROM now() - min(d.summary_due_at)) FROM conversations d
                     WHERE d.tenant_id = :tenant_id AND d.summary_due_at <= now()) AS oldest_due_seconds
                FROM memory m JOIN conversations c USING (conversation_id)
                WHERE c.tenant_id = :tenant_id AND m.status = 'processing'
                """
            ),
            {"tenant_id": tenant_id},
        )
    ).one()
    return dict(row._mapping)


async def loads_by_tenant(conn: AsyncConnection) -> list[dict[str, Any]]:
    """``tenant_load`` of every tenant that has summary work, by tenant id (the admin view)."""
    rows = await conn.execute(
        sql(
            """
            WITH leased AS (
                SELECT c.tenant_id,
                       count(*) FILTER (WHERE m.lease_expires_at > now()) AS running,
                       count(*) FILTER (WHERE m.lease_expires_at IS NULL OR m.lease_expires_at <= now())
                           AS queued
                FROM memory m JOIN conversations c USING (conversation_id)
                WHERE m.status = 'processing'
                GROUP BY c.tenant_id
            ), marked AS (
                SELECT tenant_id, count(*) AS due,
                       extract(epoch FROM now() - min(summary_due_at) FILTER (WHERE summary_due_at <= now()))
                           AS oldest_due_seconds
                FROM conversations
                WHERE summary_due_at IS NOT NULL
                GROUP BY tenant_id
            )
            SELECT tenant_id, coalesce(l.running, 0) AS running, coalesce(l.queued, 0) AS queued,
                   coalesce(d.due, 0) AS due, d.oldest_due_seconds
            FROM leased l FULL JOIN marked d USING (tenant_id)
            ORDER BY tenant_id
            """
        )
    )
    return [dict(r._mapping) for r in rows]


async def totals(conn: AsyncConnection, *, stuck_after_seconds: float) -> dict[str, Any]:
    """The work of every tenant, for /metrics: conversations due now and how long the oldest
    has waited, 'processing' rows queued, running (leased) and stuck (older than
    ``stuck_after_seconds``), and failed rows. Each count reads a partial index. Run in a
    transaction: it gives up on a lock after 100 ms, as a reading is not worth holding a pooled
    connection a request may need (behind a migration's or an operator's table lock)."""
    await conn.execute(sql("SET LOCAL lock_timeout = '100ms'"))
    row = (
        await conn.execute(
            sql(
                """
                SELECT
                    (SELECT count(*) FROM conversations WHERE summary_due_at <= now()) AS due,
                    (SELECT extract(epoch FROM now() - min(summary_due_at)) FROM conversations
                     WHERE summary_due_at <= now()) AS oldest_due_seconds,
                    count(*) FILTER (WHERE lease_expires_at IS NULL OR lease_expires_at <= now())
                        AS queued,
                    count(*) FILTER (WHERE lease_expires_at > now()) AS running,
                    count(*) FILTER (WHERE created_at < now() - make_interval(secs => :stuck)) AS stuck,
                    (SELECT count(*) FROM memory WHERE status = 'failed') AS failed
                FROM memory
                WHERE status = 'processing'
                """
            ),
            {"stuck": stuck_after_seconds},
        )
    ).one()
    return dict(row._mapping)
