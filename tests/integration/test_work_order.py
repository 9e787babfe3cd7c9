"""The claim order of app.repositories.work.candidates, against the rule it documents, on
random backlogs in real PostgreSQL.

The statement reads only each tenant's oldest due conversations (an index walk per tenant), so
these backlogs give tenants more due conversations than the claim's limit, queued and abandoned
rows, summaries running, backing-off and stuck rows, and a runner's record of the tenants it
served: the order must be the one the whole backlog ranked gives."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import asyncpg
import orjson
import pytest

from app.repositories import work
from app.repositories.memory import Backoff

MAX_ATTEMPTS = 3
BACKOFF = Backoff(base_seconds=30, max_seconds=300)
HOUR = 3600


@dataclass(frozen=True)
class Piece:
    """A piece of work as the reference ranks it."""

    tenant: str
    conversation_id: str
    memory_id: int | None
    since: int  # seconds from the insert's now()


def reference(
    pieces: list[Piece], running: Counter[str], served: dict[str, int], limit: int
) -> list[tuple[int | None, str, str]]:
    """The documented order: a tenant's turn is its running summaries plus the piece's position
    among the tenant's own waiting work (oldest first); then the tenant served least recently
    (never served first), then the oldest, then the conversation id."""
    position: dict[Piece, int] = {}
    for tenant in {p.tenant for p in pieces}:
        own = sorted((p for p in pieces if p.tenant == tenant), key=lambda p: (p.since, p.conversation_id))
        position.update({p: n for n, p in enumerate(own, 1)})
    ranked = sorted(
        pieces,
        key=lambda p: (
            position[p] + running[p.tenant],
            (0, 0) if p.tenant not in served else (1, served[p.tenant]),
            p.since,
            p.conversation_id,
        ),
    )
    return [(p.memory_id, p.conversation_id, p.tenant) for p in ranked[:limit]]


async def seed_backlog(db: asyncpg.Connection, rng: random.Random) -> tuple[list[Piece], Counter[str]]:
    """Insert a random backlog; return the claimable pieces and the running count per tenant."""
    tenants = [f"t{n}" for n in range(rng.randint(1, 4))]
    offsets = iter(rng.sample(range(-HOUR // 2, -1), 200))  # distinct past times
    conversations: list[tuple[str, str, int | None]] = []
    rows: list[tuple[str, int, int | None, int]] = []  # (cid, created, lease, attempts)
    for n in range(rng.randint(1, 40)):
        cid = f"c{n:02d}"
        tenant = rng.choice(tenants)
        state = rng.choice(["due", "due", "due", "later", "quiet", "queued", "running", "abandoned", "stuck"])
        due = next(offsets) if state in ("due", "running", "queued") else HOUR if state == "later" else None
        conversations.append((cid, tenant, due))
        if state == "queued":
            rows.append((cid, next(offsets), None, 0))
        elif state == "running":
            rows.append((cid, next(offsets), HOUR, 1))
        elif state == "abandoned":  # its runner died an hour ago: claimable again
            rows.append((cid, next(offsets), -HOUR, rng.randint(1, MAX_ATTEMPTS - 1)))
        elif state == "stuck":  # out of attempts: the reaper's, not a runner's
            rows.append((cid, next(offsets), -HOUR, MAX_ATTEMPTS))
    policy = orjson.dumps({"name": "sliding_window"}).decode()
    async with db.transaction():
        await db.executemany(
            "INSERT INTO conversations (conversation_id, tenant_id, memory_policy, summary_due_at) "
            "VALUES ($1, $2, CAST($3 AS jsonb), now() + make_interval(secs => $4))",
            [(cid, tenant, policy, due) for cid, tenant, due in conversations],
        )
        ids = [
            await db.fetchval(
                "INSERT INTO memory (conversation_id, memory_text, kind, start_sequence, end_sequence, "
                "start_round, end_round, input_start_sequence, status, created_at, lease_expires_at, "
                "attempts) VALUES ($1, '', 'window', 0, 0, 0, 0, 0, 'processing', "
                "now() + make_interval(secs => $2), now() + make_interval(secs => $3), $4) "
                "RETURNING memory_id",
                cid,
                created,
                lease,
                attempts,
            )
            for cid, created, lease, attempts in rows
        ]
    tenant_of = {cid: tenant for cid, tenant, _ in conversations}
    with_row = {cid for cid, *_ in rows}
    pieces = [
        Piece(tenant, cid, None, due)
        for cid, tenant, due in conversations
        if due is not None and due < 0 and cid not in with_row
    ]
    running: Counter[str] = Counter()
    for memory_id, (cid, created, lease, attempts) in zip(ids, rows, strict=True):
        if lease is None:
            pieces.append(Piece(tenant_of[cid], cid, memory_id, created))
        elif lease > 0:
            running[tenant_of[cid]] += 1
        elif attempts < MAX_ATTEMPTS:
            pieces.append(Piece(tenant_of[cid], cid, memory_id, lease))
    return pieces, running


@pytest.mark.parametrize("seed", range(40))
async def test_claim_order_is_the_whole_backlog_ranked(db: asyncpg.Connection, seed: int) -> None:
    rng = random.Random(seed)
    pieces, running = await seed_backlog(db, rng)
    tenants = sorted({p.tenant for p in pieces} | set(running))
    served = {t: rng.randint(1, 100) for t in tenants if rng.random() < 0.5}
    for limit in (1, 3, 16):
        found = await work.candidates(
            db, limit=limit, max_attempts=MAX_ATTEMPTS, backoff=BACKOFF, served=served
        )
        assert [(c.memory_id, c.conversation_id, c.tenant_id) for c in found] == reference(
            pieces, running, served, limit
        ), f"seed {seed}, limit {limit}"
