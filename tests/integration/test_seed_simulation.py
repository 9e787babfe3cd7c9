"""Seeds 002 and 004 replayed over HTTP, with summaries released where the seeds put them.

The seeds' flow (a round that ends while a summary runs starts none) is the sliding window with
catch_up_on_completion off; after each POST the test waits for the runner to claim what the
round made due (api.settle) before reading the memory table."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from tests.fakellm import FakeLLM
from tests.integration.conftest import App, AppFactory, eventually

Row = tuple[int, int, int, int | None, str]


async def memory_table(db: asyncpg.Connection) -> list[Row]:
    rows = await db.fetch(
        "SELECT memory_id, start_sequence, end_sequence, base_memory_id, status "
        "FROM memory ORDER BY memory_id"
    )
    return [tuple(r) for r in rows]


async def complete(api: App, llm: FakeLLM, db: asyncpg.Connection, memory_id: int) -> None:
    """Let the LLM answer the call of ``memory_id`` and wait for the row to complete."""
    await asyncio.to_thread(llm.wait_for_calls, memory_id)
    llm.release(memory_id - 1)

    async def done() -> bool:
        status = await db.fetchval("SELECT status FROM memory WHERE memory_id = $1", memory_id)
        return bool(status == "completed")

    await eventually(done, what=f"memory {memory_id} to complete")


def gap(context: dict[str, Any]) -> list[int]:
    return [m["sequence"] for m in context["messages"]]


def used(context: dict[str, Any]) -> int | None:
    return context["memory"]["memory_id"] if context["memory"] else None


async def test_seed_002_rounds_1_to_10(make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection) -> None:
    api = await make_app(
        MEMORY_ROLLING_WINDOW_SIZE=14, MEMORY_SUMMARIZE_AFTER_SEQ=5, MEMORY_CATCH_UP_ON_COMPLETION=False
    )
    llm.hold = True
    cid = "seed-002"

    async def post(n: int) -> bool:
        due: bool = (await api.post_round(cid, n))["summary_due"]
        await api.settle()
        return due

    # Rounds 1-2: accumulation, no memory, the gap is every stored message.
    assert not await post(1)
    ctx = await api.context(cid)
    assert (used(ctx), gap(ctx)) == (None, [0, 1])
    assert not await post(2)
    assert await memory_table(db) == []

    # Round 3 ends: first trigger, seq 0-5.
    ctx = await api.context(cid)
    assert (used(ctx), gap(ctx)) == (None, [0, 1, 2, 3])
    assert await post(3)
    assert await memory_table(db) == [(1, 0, 5, None, "processing")]

    # Round 4: caught up (id=1 completed before it started); no gap.
    await complete(api, llm, db, 1)
    ctx = await api.context(cid)
    assert (used(ctx), gap(ctx), ctx["processing"]) == (1, [], None)
    await post(4)
    assert await memory_table(db) == [(1, 0, 5, None, "completed"), (2, 0, 7, 1, "processing")]

    # Round 5: not caught up; fallback to id=1 with gap 6-7; no summary starts.
    ctx = await api.context(cid)
    assert (used(ctx), gap(ctx)) == (1, [6, 7])
    assert ctx["processing"]["memory_id"] == 2
    assert ctx["memory_lag_messages"] == 2
    await post(5)
    assert await memory_table(db) == [(1, 0, 5, None, "completed"), (2, 0, 7, 1, "processing")]

    # Round 6: caught up with id=2; gap 8-9; trigger 0-11.
    await complete(api, llm, db, 2)
    ctx = await api.context(cid)
    assert (used(ctx), gap(ctx)) == (2, [8, 9])
    await post(6)
    assert (await memory_table(db))[2:] == [(3, 0, 11, 2, "processing")]

    # Round 7: not caught up; id=2 with gap 8-11.
    ctx = await api.context(cid)
    assert (used(ctx), gap(ctx)) == (2, [8, 9, 10, 11])
    await post(7)
    assert len(await memory_table(db)) == 3

    # Round 8: caught up with id=3 (end 11); gap 12-13; the window starts sliding: 2-15.
    await complete(api, llm, db, 3)
    ctx = await api.context(cid)
    assert (used(ctx), gap(ctx)) == (3, [12, 13])
    await post(8)
    assert (await memory_table(db))[2:] == [(3, 0, 11, 2, "completed"), (4, 2, 15, 3, "processing")]

    # Round 9: not caught up; id=3 with gap 12-15.
    ctx = await api.context(cid)
    assert (used(ctx), gap(ctx)) == (3, [12, 13, 14, 15])
    await post(9)
    assert len(await memory_table(db)) == 4

    # Round 10: caught up with id=4 (2-15); gap 16-17; trigger 6-19.
    await complete(api, llm, db, 4)
    ctx = await api.context(cid)
    assert (used(ctx), gap(ctx)) == (4, [16, 17])
    assert (ctx["memory"]["start_sequence"], ctx["memory"]["end_sequence"]) == (2, 15)
    await post(10)

    # Seed 002's final memory table.
    assert await memory_table(db) == [
        (1, 0, 5, None, "completed"),
        (2, 0, 7, 1, "completed"),
        (3, 0, 11, 2, "completed"),
        (4, 2, 15, 3, "completed"),
        (5, 6, 19, 4, "processing"),
    ]

    # Incremental summarization: each call got the base summary and only the newer messages,
    # and was told the window start below which content is dropped.
    calls = await asyncio.to_thread(llm.wait_for_calls, 5)
    assert [c.window for c in calls] == [(0, 5), (0, 7), (0, 11), (2, 15), (6, 19)]
    assert [c.message_sequences for c in calls] == [
        [0, 1, 2, 3, 4, 5],
        [6, 7],
        [8, 9, 10, 11],
        [12, 13, 14, 15],
        [16, 17, 18, 19],
    ]
    assert "<previous_summary" not in calls[0].user
    assert "Summary of messages #0-#11." in calls[3].user


async def test_seed_004_memory_table_evolution(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    """Summaries completing within a round: seed 004's Data Flow Timeline and table."""
    api = await make_app(MEMORY_CATCH_UP_ON_COMPLETION=False)
    llm.hold = True
    cid = "seed-004"

    async def post(n: int) -> list[Row]:
        await api.post_round(cid, n)
        await api.settle()
        return await memory_table(db)

    for n in (1, 2, 3):
        await post(n)
    assert await memory_table(db) == [(1, 0, 5, None, "processing")]
    # Round 4 ends while id=1 is still processing: skip.
    assert len(await post(4)) == 1
    # Round 5 starts: id=1 completed, gap seq 6-7 (round 4).
    await complete(api, llm, db, 1)
    ctx = await api.context(cid)
    assert (used(ctx), gap(ctx)) == (1, [6, 7])
    assert (await post(5))[-1][2] == 9
    assert len(await post(6)) == 2
    await complete(api, llm, db, 2)
    assert (await post(7))[-1][2] == 13
    await complete(api, llm, db, 3)
    assert (await post(8))[-1][1] == 2
    assert len(await post(9)) == 4
    await complete(api, llm, db, 4)
    await post(10)
    await complete(api, llm, db, 5)
    assert await memory_table(db) == [
        (1, 0, 5, None, "completed"),
        (2, 0, 9, 1, "completed"),
        (3, 0, 13, 2, "completed"),
        (4, 2, 15, 3, "completed"),
        (5, 6, 19, 4, "completed"),
    ]
    ctx = await api.context(cid)
    assert (used(ctx), gap(ctx), ctx["memory_lag_messages"]) == (5, [], 0)


async def test_catch_up_on_completion_summarizes_rounds_stored_meanwhile(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    """With catch-up (the default), a quiet conversation's memory still catches up: the rounds
    stored while a summary ran get one next summary, without waiting for another round."""
    api = await make_app()
    llm.hold = True
    for n in (1, 2, 3):
        await api.post_round("quiet", n)
    await api.settle()
    assert (await api.post_round("quiet", 4))["summary_due"]  # due, but id=1 is still processing
    await api.settle()
    assert len(await memory_table(db)) == 1
    # No more rounds come. Completing id=1 starts id=2 over the rounds stored meanwhile.
    await complete(api, llm, db, 1)
    await complete(api, llm, db, 2)
    await api.idle()
    assert await memory_table(db) == [(1, 0, 5, None, "completed"), (2, 0, 7, 1, "completed")]
    ctx = await api.context("quiet")
    assert (used(ctx), gap(ctx), ctx["memory_lag_messages"]) == (2, [], 0)
