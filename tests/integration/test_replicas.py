"""Two service processes on one database: concurrent writers, kill -9 recovery, SIGTERM."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import httpx
import pytest

from tests.fakellm import FakeLLM
from tests.integration.conftest import Launch, eventually
from tests.integration.servers import ServerProcess

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "policy",
    [
        '{"name": "sliding_window", "window_size": 6, "summarize_after_seq": 1}',
        '{"name": "rolling_blocks", "window": 2, "max_summaries": 2}',
    ],
    ids=["sliding_window", "rolling_blocks"],
)
async def test_concurrent_posts_from_two_processes(
    launch: Launch, llm: FakeLLM, db: asyncpg.Connection, policy: str
) -> None:
    """Every message stored once, sequences and rounds unique and gap-free, each request
    contiguous, no 5xx, at most one processing row per conversation at any instant, and a
    context that never skips a message."""
    a = launch(MEMORY_POLICY=policy)
    b = launch(MEMORY_POLICY=policy)
    llm.latency_seconds = 0.01
    conversations = ["hot-0", "hot-1", "hot-2"]
    requests_per_conversation = 60
    max_processing_seen = 0
    skipped_context: list[str] = []
    statuses: list[int] = []
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal max_processing_seen
        while not done.is_set():
            most = await db.fetchval(
                "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM memory "
                "WHERE status = 'processing' GROUP BY conversation_id) t"
            )
            max_processing_seen = max(max_processing_seen, most)
            await asyncio.sleep(0.005)

    async def writer(client: httpx.AsyncClient, cid: str, i: int) -> None:
        size = 1 + i % 3  # 1..3 messages per request
        body = {
            "messages": [
                {"role": "user" if k % 2 == 0 else "assistant", "content": f"{cid} req {i} msg {k}"}
                for k in range(size)
            ]
        }
        response = await client.post(f"/conversations/{cid}/messages", json=body)
        statuses.append(response.status_code)
        if response.status_code == 201:
            seqs = [m["sequence"] for m in response.json()["messages"]]
            assert seqs == list(range(seqs[0], seqs[0] + size)), seqs  # contiguous
        context = await client.get(f"/conversations/{cid}/context")
        ctx = context.json()
        # The raw part starts at the latest right after the newest summary (earlier when the
        # policy also shows recent rounds) and runs without a hole to the newest message.
        latest_start = ctx["memory"]["end_sequence"] + 1 if ctx["memory"] else 0
        gap = [m["sequence"] for m in ctx["messages"]]
        first = gap[0] if gap else latest_start
        if (
            first > latest_start
            or gap != list(range(first, first + len(gap)))
            or (gap and gap[-1] != ctx["last_sequence"])
        ):
            skipped_context.append(f"{cid}: {gap}")

    limits = httpx.Limits(max_connections=20)
    async with (
        httpx.AsyncClient(base_url=a.url, limits=limits, timeout=30) as ca,
        httpx.AsyncClient(base_url=b.url, limits=limits, timeout=30) as cb,
    ):
        watcher = asyncio.create_task(watch())
        await asyncio.gather(
            *(
                writer(ca if i % 2 == 0 else cb, cid, i)
                for cid in conversations
                for i in range(requests_per_conversation)
            )
        )
        done.set()
        await watcher

    sent = len(conversations) * requests_per_conversation
    assert statuses.count(201) == sent, sorted(set(statuses))
    assert skipped_context == []
    assert max_processing_seen <= 1
    expected_messages = sum(1 + i % 3 for i in range(requests_per_conversation))
    for cid in conversations:
        rows = await db.fetch(
            "SELECT sequence, round, content FROM messages WHERE conversation_id = $1 ORDER BY sequence",
            cid,
        )
        assert [r["sequence"] for r in rows] == list(range(expected_messages))  # gap-free, unique
        assert len({r["content"] for r in rows}) == expected_messages  # each stored exactly once
        # One round per request, numbered without gaps, each round's messages contiguous.
        rounds = [r["round"] for r in rows]
        assert sorted(set(rounds)) == list(range(requests_per_conversation))
        assert rounds == sorted(rounds)
        assert (
            await db.fetchval("SELECT next_sequence FROM conversations WHERE conversation_id = $1", cid)
            == expected_messages
        )
    if "rolling_blocks" in policy:
        # Once the summaries drain, every full block has exactly one summary, in order, none
        # overlapping (blocks of 2 rounds after the first of 3: rounds 0-2, 3-4, 5-6, ...).
        expected_blocks = [(0, 2)] + [(s, s + 1) for s in range(3, requests_per_conversation - 1, 2)]

        async def drained() -> bool:
            for cid in conversations:
                rows = await db.fetch(
                    "SELECT status, start_round, end_round FROM memory WHERE conversation_id = $1 "
                    "ORDER BY start_round",
                    cid,
                )
                if [(r["start_round"], r["end_round"]) for r in rows] != expected_blocks:
                    return False
                if any(r["status"] != "completed" for r in rows):
                    return False
            return True

        await eventually(drained, within=30, what="every full block to have one completed summary")
    print(
        f"\nconcurrency ({policy}): {sent} requests over 2 processes, "
        f"{expected_messages * len(conversations)} messages, 0 lost, 0 duplicates, "
        f"most processing rows at once per conversation: "
        f"{max_processing_seen}"
    )


async def post_rounds(server: ServerProcess, cid: str, rounds: range) -> dict[str, Any]:
    """POST one round per number; returns the last response body."""
    async with httpx.AsyncClient(base_url=server.url) as client:
        for n in rounds:
            body = {
                "messages": [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": f"a{n}"}]
            }
            response = await client.post(f"/conversations/{cid}/messages", json=body)
            assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.mark.parametrize(
    ("policy", "after_restart"),
    [
        # The next round summarizes again, on the recovered memory: seq 0-7.
        ("sliding_window", (range(3, 4), (2, 0, 7))),
        # Blocks of 2 after the first of 3: the next block (rounds 3-4, seq 6-9) comes on time.
        ('{"name": "rolling_blocks", "window": 2}', (range(3, 5), (2, 6, 9))),
    ],
    ids=["sliding_window", "rolling_blocks"],
)
async def test_kill_9_mid_summary_is_claimed_again_by_another_replica(
    launch: Launch,
    llm: FakeLLM,
    db: asyncpg.Connection,
    policy: str,
    after_restart: tuple[range, tuple[int, int, int]],
) -> None:
    lease = {
        "MEMORY_PROCESSING_TIMEOUT_SECONDS": "2",
        "MEMORY_REAPER_INTERVAL_SECONDS": "0.2",
        "MEMORY_SUMMARY_BACKOFF_SECONDS": "0",
        "MEMORY_CLAIM_INTERVAL_SECONDS": "0.2",
        "MEMORY_POLICY": policy,
    }
    first = launch(**lease)
    llm.hold = True
    await post_rounds(first, "k", range(3))
    await asyncio.to_thread(llm.wait_for_calls, 1)
    first_lease = await db.fetchval("SELECT lease_expires_at FROM memory WHERE memory_id = 1")

    # A live worker renews its lease, so its row outlives the first lease and is never reaped.
    async def outlived_first_lease() -> bool:
        row = await db.fetchrow(
            "SELECT status, lease_expires_at, now() AS now FROM memory WHERE memory_id = 1"
        )
        assert row["status"] == "processing"
        return bool(row["now"] > first_lease and row["lease_expires_at"] > first_lease)

    await eventually(outlived_first_lease, within=10, what="the row to outlive its first lease")

    first.kill()
    killed_at = time.monotonic()
    second = launch(**lease)

    # The dead runner's lease expires and the surviving replica claims the row again: the same
    # summary, its second attempt, not a failure.
    calls = await asyncio.to_thread(llm.wait_for_calls, 2)
    recovery = time.monotonic() - killed_at  # reported, not asserted: timing is the machine's
    assert [c.memory_id for c in calls] == [1, 1]
    assert await db.fetchval("SELECT attempts FROM memory WHERE memory_id = 1") == 2
    llm.hold = False
    llm.release_all()

    async def completed(memory_id: int) -> bool:
        status: str | None = await db.fetchval("SELECT status FROM memory WHERE memory_id = $1", memory_id)
        return status == "completed"

    await eventually(lambda: completed(1), what="the second attempt to complete")
    rounds, expected = after_restart
    await post_rounds(second, "k", rounds)
    await eventually(lambda: completed(2), what="the next summary to complete after the restart")
    row = await db.fetchrow("SELECT memory_id, start_sequence, end_sequence FROM memory WHERE memory_id = 2")
    assert tuple(row) == expected
    print(f"\nkill -9 recovery ({policy}): claimed again {recovery:.2f}s after the kill (lease 2 s)")


async def test_sigterm_lets_running_summaries_finish(
    launch: Launch, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    server = launch(MEMORY_SHUTDOWN_GRACE_SECONDS="20")
    llm.hold = True
    await post_rounds(server, "t", range(3))
    await asyncio.to_thread(llm.wait_for_calls, 1)
    server.terminate()

    async def shutting_down() -> bool:
        return "Waiting up to 20s for 1 summaries" in server.log_text()

    await eventually(shutting_down, what="the server to start its graceful shutdown")
    llm.release(0)
    # uvicorn re-raises SIGTERM after a clean shutdown, so the exit status is -15.
    assert await asyncio.to_thread(server.wait, 20) in (0, -15)
    assert await db.fetchval("SELECT status FROM memory WHERE memory_id = 1") == "completed"


async def test_sigterm_past_the_grace_period_gives_the_rest_back_to_the_queue(
    launch: Launch, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    server = launch(MEMORY_SHUTDOWN_GRACE_SECONDS="0.2")
    llm.hold = True
    await post_rounds(server, "g", range(3))
    await asyncio.to_thread(llm.wait_for_calls, 1)
    server.terminate()
    # uvicorn re-raises SIGTERM after a clean shutdown, so the exit status is -15.
    assert await asyncio.to_thread(server.wait, 20) in (0, -15)
    row = await db.fetchrow("SELECT status, attempts, lease_expires_at FROM memory WHERE memory_id = 1")
    assert tuple(row) == ("processing", 0, None)  # queued for any runner, the attempt not counted
