"""A model that answers a byte at a time never trips a per-read timeout: the whole call is
bounded (MEMORY_LLM_CALL_TIMEOUT_SECONDS), and a summary wedged past that bound stops having its
lease renewed, so a reaper (on any replica) fails it."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from tests.fakellm import FakeLLM
from tests.integration.conftest import AppFactory, eventually


async def memory_row(db: asyncpg.Connection) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await db.fetchrow(
        "SELECT status, error, attempts, memory_text FROM memory WHERE memory_id = 1"
    )
    return row


async def test_a_trickling_model_is_cut_off_at_the_call_timeout(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    # Each byte arrives well within the 0.5 s read timeout; the whole reply would take ~25 s.
    llm.trickle_seconds = 0.1
    api = await make_app(MEMORY_LLM_TIMEOUT_SECONDS=0.5, MEMORY_LLM_CALL_TIMEOUT_SECONDS=1)
    for n in (1, 2, 3):
        await api.post_round("drip", n)
    await asyncio.to_thread(llm.wait_for_calls, 1)
    started = time.monotonic()

    async def failed() -> bool:
        row = await memory_row(db)
        return row is not None and row["status"] == "failed"

    await eventually(failed, within=6, what="the trickling call to be cut off")
    elapsed = time.monotonic() - started
    row = await memory_row(db)
    assert row is not None
    assert "LLM call exceeded 1 s" in row["error"], row["error"]
    assert elapsed < 6
    # Requests were never held up by it.
    assert (await api.client.get("/conversations/drip/context")).status_code == 200


async def test_a_wedged_summary_stops_renewing_its_lease_and_is_reaped(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    """The runner's backstop, for a summary stuck outside anything a timeout covers: here a
    model call allowed far longer than the runner's run limit (shortened to 1 s for the test;
    the service sets it to MEMORY_LLM_CALL_TIMEOUT_SECONDS plus a margin)."""
    llm.hold = True  # never answers
    api = await make_app(
        MEMORY_LLM_TIMEOUT_SECONDS=60,
        MEMORY_LLM_CALL_TIMEOUT_SECONDS=60,
        MEMORY_PROCESSING_TIMEOUT_SECONDS=1.5,  # the lease
        MEMORY_REAPER_INTERVAL_SECONDS=0.2,
        MEMORY_SUMMARY_MAX_ATTEMPTS=1,  # no second attempt: reaped as soon as the lease expires
    )
    api.service.runner.max_run_seconds = 1.0
    for n in (1, 2, 3):
        await api.post_round("wedged", n)
    await asyncio.to_thread(llm.wait_for_calls, 1)

    async def reaped() -> bool:
        row = await memory_row(db)
        return row is not None and row["status"] == "failed"

    # Renewed for ~1 s, then left to expire (1.5 s), then reaped at the next tick.
    await eventually(reaped, within=10, what="the wedged summary to be reaped")
    row = await memory_row(db)
    assert row is not None and "lease expired" in row["error"], row
    assert api.service.runner.running == 1  # the task itself is still stuck in the call


async def test_a_summary_whose_runner_stopped_renewing_is_claimed_again_and_the_late_result_dropped(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    """A lease that expires is not the end of a summary: another runner claims the row again
    (counting the attempt, after the backoff) and completes it; when the first runner's call
    finally returns, its result is dropped, since the row is no longer its own."""
    llm.hold = True
    settings = {
        "MEMORY_PROCESSING_TIMEOUT_SECONDS": 1.0,
        "MEMORY_REAPER_INTERVAL_SECONDS": 0.2,
        "MEMORY_SUMMARY_BACKOFF_SECONDS": 0,
        "MEMORY_CLAIM_INTERVAL_SECONDS": 0.1,
    }
    first = await make_app(**settings)
    first.service.runner.max_run_seconds = 0.5  # wedged after 0.5 s: stops renewing
    for n in (1, 2, 3):
        await first.post_round("handover", n)
    await asyncio.to_thread(llm.wait_for_calls, 1)
    await make_app(**settings)  # a second replica, whose claims pick the row up again
    calls = await asyncio.to_thread(llm.wait_for_calls, 2)
    assert [c.memory_id for c in calls] == [1, 1]
    row = await memory_row(db)
    assert row is not None and (row["status"], row["attempts"]) == ("processing", 2)
    llm.release(1, answer="Second attempt's summary.")

    async def completed() -> bool:
        row = await memory_row(db)
        return row is not None and row["status"] == "completed"

    await eventually(completed, what="the second attempt to complete")
    llm.release(0, answer="First attempt's late summary.")
    await first.idle()
    row = await memory_row(db)
    assert row is not None and row["memory_text"] == "Second attempt's summary."
