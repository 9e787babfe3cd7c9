"""The runner claims only as much work as it has free slots, and stops renewing the lease of a
summary running past ``max_run_seconds`` (wedged), and only of that one."""

from __future__ import annotations

import asyncio

import pytest

from app.memory.runner import CLAIM_BATCH, DEFAULT_MAX_RUN_SECONDS, SummaryRunner


async def test_claims_fill_free_slots_only_and_wedged_summaries_lose_their_renewal() -> None:
    release = asyncio.Event()
    queue = [1, 2, 3]
    asked: list[int] = []
    started: list[int] = []

    async def claim(limit: int) -> list[int]:
        asked.append(limit)
        taken, queue[:] = queue[:limit], queue[limit:]
        return taken

    async def work(memory_id: int) -> None:
        started.append(memory_id)
        if memory_id == 1:
            await release.wait()

    async def maintenance(_ids: list[int]) -> None:
        return None

    runner = SummaryRunner(
        claim=claim,
        work=work,
        maintenance=maintenance,
        max_concurrent=1,
        claim_interval=3600,
        maintenance_interval=3600,
        max_run_seconds=0.2,
    )
    runner.accepting = True
    assert await runner.claim_now() == 1  # one slot: one claimed, the others stay in the queue
    assert asked == [1] and queue == [2, 3] and runner.owned() == [1]
    assert await runner.claim_now() == 0 and asked == [1]  # no free slot: nothing asked
    assert runner.renewable() == [1]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while runner.renewable():
        assert loop.time() < deadline, runner.renewable()
        await asyncio.sleep(0.01)
    assert runner.owned() == [1]  # still ours, still running: just not renewed
    release.set()
    await asyncio.wait_for(runner.wait_idle(), 5)
    for _ in (2, 3):
        assert await runner.claim_now() == 1
        await asyncio.wait_for(runner.wait_idle(), 5)
    assert started == [1, 2, 3] and queue == [] and runner.renewable() == []


def test_the_default_limit_covers_the_default_call_bound() -> None:
    runner: SummaryRunner[int] = SummaryRunner(
        claim=lambda _n: asyncio.sleep(0, result=[]),
        work=lambda _id: asyncio.sleep(0),
        maintenance=lambda _ids: asyncio.sleep(0),
        max_concurrent=1,
        claim_interval=1,
        maintenance_interval=1,
    )
    assert runner.max_run_seconds == DEFAULT_MAX_RUN_SECONDS > 180


async def test_a_claim_asks_for_a_batch_at_a_time_and_its_summaries_start_before_the_next() -> None:
    queue = list(range(40))
    asked: list[int] = []
    running_when_asked: list[int] = []
    started: list[int] = []
    release = asyncio.Event()

    async def claim(limit: int) -> list[int]:
        await asyncio.sleep(0)  # a claim's statements: the summaries already spawned start
        asked.append(limit)
        running_when_asked.append(len(started))
        taken, queue[:] = queue[:limit], queue[limit:]
        return taken

    async def work(memory_id: int) -> None:
        started.append(memory_id)
        await release.wait()

    runner = SummaryRunner(
        claim=claim,
        work=work,
        maintenance=lambda _ids: asyncio.sleep(0),
        max_concurrent=64,
        claim_interval=3600,
        maintenance_interval=3600,
    )
    runner.accepting = True
    assert await runner.claim_now() == 40
    assert asked == [CLAIM_BATCH, CLAIM_BATCH, CLAIM_BATCH] and queue == []
    assert running_when_asked == [0, CLAIM_BATCH, 2 * CLAIM_BATCH]
    release.set()
    await asyncio.wait_for(runner.wait_idle(), 5)
    assert sorted(started) == list(range(40))


async def test_an_expected_claim_failure_is_one_line_an_unexpected_one_has_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While the database is down the claim loop fails every tick: one line each, not a
    traceback; anything else (a bug) keeps its traceback."""
    failures = [ConnectionRefusedError("refused"), ValueError("a bug")]
    tried = asyncio.Event()

    async def claim(_limit: int) -> list[int]:
        if not failures:
            tried.set()
            return []
        raise failures.pop(0)

    async def idle(_arg: object) -> None:
        return None

    runner: SummaryRunner[int] = SummaryRunner(
        claim=claim,
        work=idle,
        maintenance=idle,
        max_concurrent=1,
        claim_interval=0.01,
        maintenance_interval=3600,
        expected_failure=lambda exc: "down" if isinstance(exc, ConnectionRefusedError) else None,
    )
    runner.start()
    try:
        await asyncio.wait_for(tried.wait(), 5)
    finally:
        await runner.shutdown(0)
    lines = [r for r in caplog.records if "claiming summary work failed" in r.getMessage()]
    assert [(r.getMessage(), r.exc_info is not None) for r in lines] == [
        ("claiming summary work failed (down); retrying", False),
        ("claiming summary work failed; retrying", True),
    ]
