"""`memory-service worker`: API replicas with summaries off, summaries run by worker processes,
and what happens when a worker dies or is stopped mid-summary."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest

from tests.fakellm import FakeLLM
from tests.integration.conftest import Launch, eventually
from tests.integration.servers import ServerProcess, WorkerProcess

pytestmark = pytest.mark.slow

FAST_RECOVERY = {
    "MEMORY_PROCESSING_TIMEOUT_SECONDS": "2",
    "MEMORY_REAPER_INTERVAL_SECONDS": "0.2",
    "MEMORY_SUMMARY_BACKOFF_SECONDS": "0",
    "MEMORY_CLAIM_INTERVAL_SECONDS": "0.1",
}


async def post_rounds(server: ServerProcess, cid: str, count: int) -> list[bool]:
    due = []
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        for n in range(count):
            response = await client.post(
                f"/conversations/{cid}/messages",
                json={
                    "messages": [
                        {"role": "user", "content": f"Question {n}."},
                        {"role": "assistant", "content": f"Answer {n}."},
                    ]
                },
            )
            assert response.status_code == 201, response.text
            due.append(response.json()["summary_due"])
    return due


async def status(db: asyncpg.Connection, memory_id: int) -> tuple[str, int, bool] | None:
    row = await db.fetchrow(
        "SELECT status, attempts, lease_expires_at IS NULL AS queued FROM memory WHERE memory_id = $1",
        memory_id,
    )
    return None if row is None else (row["status"], row["attempts"], row["queued"])


async def test_an_api_replica_with_summaries_off_leaves_them_to_a_worker(
    launch: Launch, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = launch(MEMORY_RUN_SUMMARIES="false", **FAST_RECOVERY)
    assert await post_rounds(api, "w", 3) == [False, False, True]
    async with httpx.AsyncClient(base_url=api.url) as client:
        runner = (await client.get("/ops/runner")).json()
    assert (runner["runs_summaries"], runner["due"], runner["running"]) == (False, 1, 0)
    assert await db.fetchval("SELECT count(*) FROM memory") == 0  # nobody claims it

    launch(kind=WorkerProcess, **FAST_RECOVERY)

    async def done() -> bool:
        return await status(db, 1) == ("completed", 1, True)

    await eventually(done, what="the worker to summarize the due conversation")
    assert await db.fetchval("SELECT summary_due_at FROM conversations") is None


async def test_a_killed_worker_s_summary_is_claimed_again_by_another(
    launch: Launch, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = launch(MEMORY_RUN_SUMMARIES="false", **FAST_RECOVERY)
    first = launch(kind=WorkerProcess, **FAST_RECOVERY)
    llm.hold = True
    await post_rounds(api, "k", 3)
    await asyncio.to_thread(llm.wait_for_calls, 1)
    first.kill()
    launch(kind=WorkerProcess, **FAST_RECOVERY)
    calls = await asyncio.to_thread(llm.wait_for_calls, 2)
    assert [c.memory_id for c in calls] == [1, 1]
    llm.hold = False
    llm.release_all()

    async def done() -> bool:
        return await status(db, 1) == ("completed", 2, True)

    await eventually(done, what="the second attempt to complete")


async def test_a_stopped_worker_gives_its_summary_back_to_the_queue(
    launch: Launch, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = launch(MEMORY_RUN_SUMMARIES="false", **FAST_RECOVERY)
    worker = launch(kind=WorkerProcess, MEMORY_SHUTDOWN_GRACE_SECONDS="0.2", **FAST_RECOVERY)
    llm.hold = True
    await post_rounds(api, "s", 3)
    await asyncio.to_thread(llm.wait_for_calls, 1)
    worker.terminate()
    assert await asyncio.to_thread(worker.wait, 20) == 0
    # Not failed: queued again, the interrupted attempt not counted.
    assert await status(db, 1) == ("processing", 0, True)
    llm.hold = False
    llm.release_all()
    launch(kind=WorkerProcess, **FAST_RECOVERY)

    async def done() -> bool:
        return await status(db, 1) == ("completed", 1, True)

    await eventually(done, what="another worker to complete the queued summary")
