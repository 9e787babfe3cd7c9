"""The runner stops renewing the lease of a summary running past ``max_run_seconds`` (wedged),
and only of that one: a summary waiting for a slot has not started running."""

from __future__ import annotations

import asyncio

from app.memory.runner import DEFAULT_MAX_RUN_SECONDS, SummaryRunner


async def test_only_summaries_running_past_the_limit_lose_their_renewal() -> None:
    release = asyncio.Event()
    first_started = asyncio.Event()
    started: list[int] = []

    async def work(memory_id: int) -> None:
        started.append(memory_id)
        first_started.set()
        await release.wait()

    async def maintenance(_ids: list[int]) -> None:
        return None

    runner = SummaryRunner(
        work=work,
        maintenance=maintenance,
        max_concurrent=1,
        max_pending=5,
        maintenance_interval=3600,
        max_run_seconds=0.2,
    )
    runner.submit(1, "t")
    runner.submit(2, "t")  # waits for the only slot
    await asyncio.wait_for(first_started.wait(), 5)
    assert started == [1]
    assert runner.renewable() == [1, 2]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while runner.renewable() != [2]:
        assert loop.time() < deadline, runner.renewable()
        await asyncio.sleep(0.01)
    assert runner.owned() == [1, 2]  # still ours, still running: just not renewed
    release.set()
    await asyncio.wait_for(runner.wait_idle(), 5)
    assert started == [1, 2] and runner.renewable() == []


def test_the_default_limit_covers_the_default_call_bound() -> None:
    runner = SummaryRunner(
        work=lambda _id: asyncio.sleep(0),
        maintenance=lambda _ids: asyncio.sleep(0),
        max_concurrent=1,
        max_pending=1,
        maintenance_interval=1,
    )
    assert runner.max_run_seconds == DEFAULT_MAX_RUN_SECONDS > 180
