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
    row: asyncpg.Record | None = await db.fetchrow("SELECT status, error FROM memory WHERE memory_id = 1")
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
