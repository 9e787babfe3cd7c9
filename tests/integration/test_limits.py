"""Bounds one conversation cannot push past (metadata, context, pages) and how a conversation,
or the model as a whole, that keeps failing is backed off instead of retried on every round."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from tests.fakellm import FakeLLM
from tests.integration.conftest import App, AppFactory


def labels(n: int, count: int) -> dict[str, Any]:
    return {f"k{n}-{i}": "v" * 100 for i in range(count)}


async def test_conversation_metadata_is_capped_and_a_refused_post_writes_nothing(
    make_app: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_MAX_METADATA_BYTES=20_000, MEMORY_MAX_METADATA_KEYS=100)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    statuses = []
    for n in range(10):  # 64 new keys per POST: the second already passes 100 keys
        response = await api.client.post(
            "/conversations/m/messages", json={**body, "metadata": labels(n, 64)}
        )
        statuses.append(response.status_code)
        if response.status_code == 413:
            assert response.json()["code"] == "payload_too_large"
            assert "limit is 100 (MEMORY_MAX_METADATA_KEYS)" in response.json()["detail"]
    assert statuses == [201] + [413] * 9
    row = await db.fetchrow("SELECT next_sequence, next_round, metadata FROM conversations")
    assert (row["next_sequence"], row["next_round"]) == (1, 1)  # the refused rounds left no trace
    assert await db.fetchval("SELECT count(*) FROM messages") == 1
    # Size: fewer, longer values hit the byte limit.
    big = {f"b{i}": "x" * 1000 for i in range(30)}
    response = await api.client.post("/conversations", json={"conversation_id": "big", "metadata": big})
    assert response.status_code == 413, response.text
    assert "(MEMORY_MAX_METADATA_BYTES)" in response.json()["detail"]
    assert (await api.client.get("/conversations/big")).status_code == 404


async def test_listings_leave_metadata_out_unless_asked(api: App) -> None:
    await api.client.post("/conversations", json={"conversation_id": "a", "metadata": {"team": "x"}})
    listed = (await api.client.get("/conversations")).json()["conversations"]
    assert listed[0]["metadata"] is None
    listed = (await api.client.get("/conversations?include_metadata=true")).json()["conversations"]
    assert listed[0]["metadata"] == {"team": "x"}
    assert (await api.client.get("/conversations/a")).json()["metadata"] == {"team": "x"}


async def test_the_context_is_capped_and_says_what_it_left_out(make_app: AppFactory, llm: FakeLLM) -> None:
    # Summaries failing for good: the raw part would grow without end.
    api = await make_app(MEMORY_MAX_CONTEXT_MESSAGES=6, MEMORY_SUMMARY_BACKOFF_SECONDS=3600)
    llm.fail_next(1000)
    for n in range(10):
        await api.post_round("capped", n)
    await api.idle()
    context = await api.context("capped")
    assert [m["sequence"] for m in context["messages"]] == list(range(14, 20))
    assert context["truncated"] is True
    assert context["omitted_messages"] == {"start_sequence": 0, "end_sequence": 13, "count": 14}
    assert context["last_sequence"] == 19 and context["memory_lag_messages"] == 20

    # Bytes: each message is 402 bytes of JSON text; a 1024-byte cap keeps the newest two.
    small = await make_app(MEMORY_MAX_CONTEXT_BYTES=1024, MEMORY_SUMMARIZER="offline")
    for _ in range(3):
        await small.client.post(
            "/conversations/bytes/messages", json={"messages": [{"role": "user", "content": "x" * 400}]}
        )
    context = await small.context("bytes")
    assert [m["sequence"] for m in context["messages"]] == [1, 2]
    assert context["omitted_messages"] == {"start_sequence": 0, "end_sequence": 0, "count": 1}
    # A single message over the cap is still returned: the newest is never left out.
    await small.client.post(
        "/conversations/one/messages", json={"messages": [{"role": "user", "content": "y" * 2000}]}
    )
    context = await small.context("one")
    assert [m["sequence"] for m in context["messages"]] == [0] and context["truncated"] is False


async def test_message_pages_are_bounded_by_bytes(make_app: AppFactory) -> None:
    api = await make_app(MEMORY_MAX_PAGE_BYTES=1024, MEMORY_SUMMARIZER="offline")
    for _ in range(5):
        await api.client.post(
            "/conversations/p/messages", json={"messages": [{"role": "user", "content": "z" * 300}]}
        )
    seen: list[int] = []
    after = -1
    while after is not None:
        page = (await api.client.get(f"/conversations/p/messages?after_sequence={after}&limit=100")).json()
        assert len(page["messages"]) <= 3  # 3 x ~302 bytes fit in 1024
        seen += [m["sequence"] for m in page["messages"]]
        after = page["next_after_sequence"]
    assert seen == [0, 1, 2, 3, 4]


async def test_a_conversation_that_keeps_failing_backs_off_and_is_flagged(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_SUMMARY_BACKOFF_SECONDS=3600, MEMORY_LLM_BREAKER_FAILURES=100)
    llm.fail_next(2)
    for n in range(3):
        await api.post_round("poison", n)
    await api.idle()
    # The first failure is retried at the next round, as seed 004 does.
    assert (await api.post_round("poison", 3))["summary_due"]
    await api.idle()
    assert await db.fetchval("SELECT count(*) FROM memory WHERE status = 'failed'") == 2
    context = await api.context("poison")
    assert context["summary_backoff"]["failures"] == 2 and context["summary_backoff"]["retry_at"]
    # After the second, rounds start nothing until the backoff ends: the summary stays due, for
    # when it does.
    for n in range(4, 8):
        await api.post_round("poison", n)
    await api.idle()
    assert await db.fetchval("SELECT count(*) FROM memory") == 2
    assert await db.fetchval("SELECT summary_due_at > now() + interval '59 minutes' FROM conversations")
    failing = (await api.client.get("/ops/conversations/failing")).json()
    assert [(f["conversation_id"], f["summary_failures"]) for f in failing] == [("poison", 2)]
    assert "injected 500" in failing[0]["last_error"]
    # An operator's summary still runs, and a completed one ends the streak.
    started = await api.client.post("/ops/conversations/poison/summarize")
    assert started.status_code == 202, started.text
    await api.idle()
    context = await api.context("poison")
    assert context["summary_backoff"] is None and context["memory"] is not None
    assert (await api.client.get("/ops/conversations/failing")).json() == []
    conversation = (await api.client.get("/conversations/poison")).json()
    assert (conversation["summary_failures"], conversation["summary_retry_at"]) == (0, None)


async def test_an_outage_longer_than_the_attempts_still_ends_in_a_summary_but_a_refusal_does_not(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    """A quiet conversation (no new rounds) whose summaries fail for want of a model stays due
    past MEMORY_SUMMARY_MAX_ATTEMPTS failures, so the outage's end brings its summary; one whose
    request the model refuses (400) stops at the limit, until a new round."""
    api = await make_app(
        MEMORY_SUMMARY_MAX_ATTEMPTS=2, MEMORY_SUMMARY_BACKOFF_SECONDS=0, MEMORY_LLM_BREAKER_FAILURES=100
    )
    llm.fail_next(5, status=503)
    for n in range(3):
        await api.post_round("outage", n)
    await api.idle()
    statuses = await db.fetch("SELECT status FROM memory WHERE conversation_id = 'outage' ORDER BY memory_id")
    assert [r[0] for r in statuses] == ["failed"] * 5 + ["completed"]
    assert (await api.client.get("/conversations/outage")).json()["summary_failures"] == 0

    llm.fail_next(5, status=400)
    for n in range(3):
        await api.post_round("refused", n)
    await api.idle()
    statuses = await db.fetch(
        "SELECT status FROM memory WHERE conversation_id = 'refused' ORDER BY memory_id"
    )
    assert [r[0] for r in statuses] == ["failed"] * 2
    row = await db.fetchrow(
        "SELECT summary_failures, summary_due_at FROM conversations WHERE conversation_id = 'refused'"
    )
    assert (row["summary_failures"], row["summary_due_at"]) == (2, None)
    assert "HTTP 400" in (await db.fetchval("SELECT error FROM memory ORDER BY memory_id DESC LIMIT 1"))


async def test_a_rolling_block_that_failed_in_an_outage_is_summarized_when_it_ends(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    """Rolling blocks start the next block after the newest row of any status; a failed newest
    block is tried again (same interactions) while the next one is not full, so a quiet
    conversation still gets it."""
    api = await make_app(
        MEMORY_SUMMARY_MAX_ATTEMPTS=2, MEMORY_SUMMARY_BACKOFF_SECONDS=0, MEMORY_LLM_BREAKER_FAILURES=100
    )
    created = await api.client.post(
        "/conversations",
        json={"conversation_id": "blocks", "memory_policy": {"name": "rolling_blocks", "window": 2}},
    )
    assert created.status_code == 201, created.text
    llm.fail_next(3, status=503)
    for n in range(3):  # the first block: interactions 1-3
        await api.post_round("blocks", n)
    await api.idle()
    rows = await db.fetch("SELECT status, start_round, end_round FROM memory ORDER BY memory_id")
    assert [tuple(r) for r in rows] == [("failed", 0, 2)] * 3 + [("completed", 0, 2)]
    context = await api.context("blocks")
    assert [s["end_round"] for s in context["summaries"]] == [2]
    # The failed attempts of a block that a shown summary now covers are no hole: the raw part is
    # the policy's recent window (the last 2 interactions), not the block again.
    assert [m["sequence"] for m in context["messages"]] == [2, 3, 4, 5]


async def test_the_model_circuit_opens_during_an_outage_and_closes_after(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_LLM_BREAKER_FAILURES=3, MEMORY_LLM_BREAKER_OPEN_SECONDS=3600)
    llm.fail_next(3)
    for cid in ("a", "b", "c"):
        for n in range(3):
            await api.post_round(cid, n)
        await api.idle()
    runner = (await api.client.get("/ops/runner")).json()
    assert runner["llm_circuit"] == "open" and runner["llm_consecutive_failures"] == 3
    assert 0 < runner["llm_circuit_retry_in_seconds"] <= 3600
    # While open, rounds start no summary at all (an outage costs no LLM calls and no rows); what
    # they made due stays due for when the circuit closes.
    calls = len(llm.calls)
    for cid in ("d", "e"):
        for n in range(3):
            await api.post_round(cid, n)
    assert await api.service.runner.claim_now() == 0
    assert len(llm.calls) == calls and await db.fetchval("SELECT count(*) FROM memory") == 3
    assert await db.fetchval("SELECT count(*) FROM conversations WHERE summary_due_at <= now()") == 2

    # A replica whose circuit is closed picks up what came due meanwhile: nothing was lost.
    closing = await make_app(MEMORY_LLM_BREAKER_FAILURES=1, MEMORY_LLM_BREAKER_OPEN_SECONDS=0.001)
    await closing.idle()
    done = await db.fetch("SELECT conversation_id FROM memory WHERE status = 'completed' ORDER BY 1")
    assert [r[0] for r in done] == ["d", "e"]
    # Half-open (the period over): summaries start again and the first success closes it.
    llm.fail_next(1)
    for n in range(3):
        await closing.post_round("f", n)
    await closing.idle()
    assert (await closing.client.get("/ops/runner")).json()["llm_circuit"] in ("open", "half_open")
    assert (await closing.post_round("f", 3))["summary_due"]
    await closing.idle()
    assert (await closing.client.get("/ops/runner")).json()["llm_circuit"] == "closed"
    assert await db.fetchval("SELECT status FROM memory ORDER BY memory_id DESC LIMIT 1") == "completed"


async def test_summarize_now_racing_delete_is_never_a_500(api: App, llm: FakeLLM) -> None:
    """The manual summary's insert used to fail on the foreign key when a DELETE of the same
    conversation committed in between (a 500); the conversation row is now locked first."""
    llm.hold = True
    seen: set[int] = set()
    for attempt in range(25):
        cid = f"race-{attempt}"
        await api.post_round(cid, 0)
        summarize, delete = await asyncio.gather(
            api.client.post(f"/ops/conversations/{cid}/summarize"),
            api.client.delete(f"/conversations/{cid}"),
        )
        seen.update((summarize.status_code, delete.status_code))
        assert summarize.status_code in (202, 404), summarize.text
        assert delete.status_code == 204, delete.text
    assert 500 not in seen
    llm.release_all()


async def test_one_tenants_burst_does_not_hold_back_anothers_summaries(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    keys = {"a": "a" * 16, "b": "b" * 16}
    api = await make_app(
        MEMORY_API_KEYS=",".join(f"{t}:{k}" for t, k in keys.items()),
        MEMORY_MAX_CONCURRENT_SUMMARIES=1,
    )
    llm.hold = True
    for cid in ("a1", "a2", "a3", "a4", "a5"):  # one running, four due
        for n in range(3):
            await api.post_round(cid, n, headers={"X-API-Key": keys["a"]})
        await asyncio.to_thread(llm.wait_for_calls, 1)
    for n in range(3):
        await api.post_round("b1", n, headers={"X-API-Key": keys["b"]})
    llm.release(0)
    calls = await asyncio.to_thread(llm.wait_for_calls, 2)
    # B's summary came due behind A's four, and ran next.
    assert [c.job["conversation_id"] for c in calls] == ["a1", "b1"]
    llm.hold = False
    llm.release_all()
    await api.idle()
