"""LLM faults: failed rows, retries with backoff, the context still served, recovery."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from tests.fakellm import FakeLLM
from tests.integration.conftest import App, AppFactory, eventually


async def statuses(db: asyncpg.Connection) -> list[tuple[int, str]]:
    return [tuple(r) for r in await db.fetch("SELECT memory_id, status FROM memory ORDER BY memory_id")]


async def first_summary_refused(make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection, cid: str) -> App:
    """A service whose first summary (memory 1, of ``cid``) the model refused (HTTP 400)."""
    api = await make_app()
    llm.fail_next(1, status=400)
    for n in (1, 2, 3):
        await api.post_round(cid, n)
    await api.idle()
    assert await statuses(db) == [(1, "failed")]
    return api


async def test_llm_error_fails_the_row_and_the_next_round_triggers_again(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = await make_app()
    for n in (1, 2, 3):
        await api.post_round("f", n)
        await api.idle()
    assert await statuses(db) == [(1, "completed")]

    llm.fail_next(1, status=500)
    await api.post_round("f", 4)
    await api.idle()
    assert await statuses(db) == [(1, "completed"), (2, "failed")]
    error = await db.fetchval("SELECT error FROM memory WHERE memory_id = 2")
    assert "InternalServerError" in error and "500" in error

    # The context is still served from the last completed memory, with the gap after it.
    ctx = await api.context("f")
    assert ctx["memory"]["memory_id"] == 1
    assert [m["sequence"] for m in ctx["messages"]] == [6, 7]

    # The failed row does not block; the next summary builds on the last completed one.
    await api.post_round("f", 5)
    await api.idle()
    assert await statuses(db) == [(1, "completed"), (2, "failed"), (3, "completed")]
    assert await db.fetchval("SELECT base_memory_id FROM memory WHERE memory_id = 3") == 1
    assert llm.calls[-1].message_sequences == [6, 7, 8, 9]

    failed = (await api.client.get("/ops/memories/failed")).json()
    assert [f["memory_id"] for f in failed] == [2]


async def test_failed_memory_can_be_retried(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = await first_summary_refused(make_app, llm, db, "r")
    response = await api.client.post("/ops/memories/1/retry")
    assert response.status_code == 202
    await api.idle()
    assert await db.fetchrow("SELECT status, attempts, error FROM memory WHERE memory_id = 1") == (
        "completed",
        2,
        None,
    )
    again = await api.client.post("/ops/memories/1/retry")
    assert again.status_code == 409 and "is completed" in again.json()["detail"]
    assert (await api.client.post("/ops/memories/999/retry")).status_code == 404


async def test_a_retry_locks_the_conversation_before_the_failed_row(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection, plain_database_url: str
) -> None:
    """A retry used to lock the failed row first, then the conversation's (for its event),
    the reverse of a round's or a plan's order: under concurrent rounds PostgreSQL aborted one
    side of the deadlock (a 500 for the retry, or for the round). Here a transaction holds the
    conversation's row as a round does, and then reaches for the failed row: with the retry
    waiting on the conversation's row first, there is nothing to deadlock."""
    api = await first_summary_refused(make_app, llm, db, "order")
    watcher = await asyncpg.connect(plain_database_url)
    try:
        async with db.transaction():
            await db.execute("SELECT 1 FROM conversations WHERE conversation_id = 'order' FOR UPDATE")
            retry = asyncio.create_task(api.client.post("/ops/memories/1/retry"))

            async def retry_waits_for_a_lock() -> bool:
                waiting = await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND pid <> $1",
                    db.get_server_pid(),
                )
                return bool(waiting)

            await eventually(retry_waits_for_a_lock, what="the retry to wait for the conversation's row")
            await db.execute("SET LOCAL lock_timeout = '10s'")
            await db.execute("SELECT 1 FROM memory WHERE memory_id = 1 FOR UPDATE")
        response = await retry
    finally:
        await watcher.close()
    assert response.status_code == 202, response.text
    await api.idle()
    assert await db.fetchval("SELECT status FROM memory WHERE memory_id = 1") == "completed"


async def test_transient_errors_are_retried_with_backoff_honouring_retry_after(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_LLM_MAX_RETRIES=2)
    llm.fail_next(1, status=429, retry_after="1")
    llm.fail_next(1, status=503)
    for n in (1, 2, 3):
        await api.post_round("t", n)
    started = time.monotonic()
    await api.idle()
    assert await statuses(db) == [(1, "completed")]
    assert len(llm.calls) == 3
    assert time.monotonic() - started >= 1.0  # waited as Retry-After asked


async def test_retries_are_bounded_then_the_row_fails(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_LLM_MAX_RETRIES=1)
    llm.fail_next(5, status=502)
    for n in (1, 2, 3):
        await api.post_round("b", n)
    await api.idle()
    assert await statuses(db) == [(1, "failed")]
    assert len(llm.calls) == 2


async def test_llm_timeout_fails_the_row_without_blocking_requests(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_LLM_TIMEOUT_SECONDS=1.0)
    llm.hold = True  # never answers within the timeout
    for n in (1, 2, 3):
        await api.post_round("slow", n)
    # Requests do not wait for the LLM: the context is served while the call hangs.
    await asyncio.to_thread(llm.wait_for_calls, 1)
    ctx = await api.context("slow")
    assert ctx["processing"]["memory_id"] == 1 and len(ctx["messages"]) == 6

    async def failed() -> bool:
        return await statuses(db) == [(1, "failed")]

    await eventually(failed, what="the timed-out summary to fail")
    assert "Timeout" in await db.fetchval("SELECT error FROM memory WHERE memory_id = 1")


async def test_empty_answer_fails_the_row(make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection) -> None:
    api = await make_app()
    llm.hold = True
    for n in (1, 2, 3):
        await api.post_round("e", n)
    await asyncio.to_thread(llm.wait_for_calls, 1)
    llm.release(0, answer="   ")
    await api.idle()
    assert await statuses(db) == [(1, "failed")]


async def test_a_summary_whose_first_statement_fails_is_marked_failed_at_once(
    make_app: AppFactory, db: asyncpg.Connection
) -> None:
    """The runner knows the attempt it claimed, so a summary that fails before reading its row
    (its pooled connection was lost) is marked failed then, not left waiting for its lease."""
    api = await make_app(MEMORY_RUN_SUMMARIES=False)
    for n in range(3):
        await api.post_round("cut", n)
    [key] = await api.service.claim_work(1)
    # Its pooled connections (the event streams' LISTEN reconnects by itself: not waited for).
    pids = await db.fetch(
        "SELECT pg_terminate_backend(pid), pid FROM pg_stat_activity "
        "WHERE application_name = 'memory-service' AND pid <> pg_backend_pid()"
    )

    async def gone() -> bool:
        alive = await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::integer[])", [r["pid"] for r in pids]
        )
        return bool(alive == 0)

    await eventually(gone, what="the service's connections to be terminated")
    await asyncio.wait_for(api.service.run_work(key), timeout=10)
    row = await db.fetchrow("SELECT status, attempts, error, lease_expires_at FROM memory")
    assert (row["status"], row["attempts"], row["lease_expires_at"]) == ("failed", key.attempt, None)
    assert "connection" in row["error"].lower(), row["error"]


async def test_drain_waits_out_an_unavailable_database(
    make_app: AppFactory, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """`worker --drain` and the tests' drain retry while the database cannot answer (here: a
    lock makes every claim time out) instead of stopping with a traceback."""
    api = await make_app(DATABASE_STATEMENT_TIMEOUT_SECONDS=0.5)
    for n in range(3):
        await api.post_round("drained", n)
    lock = db.transaction()
    await lock.start()
    try:
        await db.execute("LOCK TABLE conversations IN ACCESS EXCLUSIVE MODE")
        draining = asyncio.create_task(api.service.drain())
        await eventually(
            lambda: _true("Draining: the database is unavailable" in caplog.text), what="drain to retry"
        )
        assert not draining.done()
    finally:
        await lock.rollback()
    await asyncio.wait_for(draining, timeout=15)
    assert await db.fetchval("SELECT status FROM memory") == "completed"


async def _true(value: bool) -> bool:
    return value


async def test_a_locked_queued_row_does_not_hold_back_the_claim_of_the_others(
    make_app: AppFactory, db: asyncpg.Connection
) -> None:
    """A row another transaction holds (a frozen process's) is skipped by the claim, which takes
    the rest of its batch at once instead of waiting on the lock (and timing out)."""
    api = await make_app(MEMORY_RUN_SUMMARIES=False, DATABASE_STATEMENT_TIMEOUT_SECONDS=2)
    for cid in ("held", "free"):
        for n in range(3):
            await api.post_round(cid, n)
        queued = await api.client.post(f"/ops/conversations/{cid}/summarize")
        assert queued.status_code == 202, queued.text
    lock = db.transaction()
    await lock.start()
    try:
        await db.execute("SELECT 1 FROM memory WHERE conversation_id = 'held' FOR UPDATE")
        claimed = await api.service.claim_work(10)
        rows = await db.fetch(
            "SELECT memory_id, conversation_id FROM memory WHERE memory_id = ANY($1::integer[])",
            [key.row_id for key in claimed],
        )
        assert [r["conversation_id"] for r in rows] == ["free"]
    finally:
        await lock.rollback()
    [key] = await api.service.claim_work(10)
    assert await db.fetchval("SELECT conversation_id FROM memory WHERE memory_id = $1", key.row_id) == "held"
