"""Idempotency, tenant isolation, deletion mid-summary, the summary cap, and log hygiene."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from tests.fakellm import FakeLLM
from tests.integration.conftest import App, AppFactory

ROUND = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


async def test_idempotent_retry_returns_the_original_and_stores_nothing_twice(
    api: App, db: asyncpg.Connection
) -> None:
    headers = {"Idempotency-Key": "round-1-attempt"}
    first = await api.client.post("/conversations/i/messages", json=ROUND, headers=headers)
    retry = await api.client.post("/conversations/i/messages", json=ROUND, headers=headers)
    assert first.status_code == retry.status_code == 201
    assert retry.json() == first.json()
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert await db.fetchval("SELECT count(*) FROM messages") == 2

    other = await api.client.post(
        "/conversations/i/messages",
        json={"messages": [{"role": "user", "content": "different"}]},
        headers=headers,
    )
    assert other.status_code == 409 and "different request body" in other.json()["detail"]
    # The sequence range reserved by the replays was given back: no hole.
    nxt = await api.client.post("/conversations/i/messages", json=ROUND)
    assert [m["sequence"] for m in nxt.json()["messages"]] == [2, 3]


async def test_concurrent_retries_with_one_key_store_once(api: App, db: asyncpg.Connection) -> None:
    headers = {"Idempotency-Key": "same"}
    responses = await asyncio.gather(
        *(api.client.post("/conversations/j/messages", json=ROUND, headers=headers) for _ in range(8))
    )
    assert {r.status_code for r in responses} == {201}
    assert len({r.text for r in responses}) == 1
    assert await db.fetchval("SELECT count(*) FROM messages") == 2


async def test_idempotency_keys_expire_after_their_ttl(api: App, db: asyncpg.Connection) -> None:
    headers = {"Idempotency-Key": "old"}
    await api.client.post("/conversations/x/messages", json=ROUND, headers=headers)
    await api.client.post("/conversations/x/messages", json=ROUND, headers={"Idempotency-Key": "new"})
    await db.execute(
        "UPDATE idempotency_keys SET created_at = now() - interval '25 hours' WHERE idempotency_key = 'old'"
    )
    await api.service.maintain([])
    assert [r["idempotency_key"] for r in await db.fetch("SELECT idempotency_key FROM idempotency_keys")] == [
        "new"
    ]
    again = await api.client.post("/conversations/x/messages", json=ROUND, headers=headers)
    assert "Idempotent-Replayed" not in again.headers
    assert [m["sequence"] for m in again.json()["messages"]] == [4, 5]


async def test_bad_idempotency_key_is_422(api: App) -> None:
    response = await api.client.post(
        "/conversations/i/messages", json=ROUND, headers={"Idempotency-Key": "x" * 300}
    )
    assert response.status_code == 422


ACME = "acme-key-0123456789"
BETA = "beta-key-9876543210"


async def test_api_keys_isolate_tenants(make_app: AppFactory, db: asyncpg.Connection) -> None:
    api = await make_app(MEMORY_API_KEYS=f"acme:{ACME},beta:{BETA}")
    client = api.client
    acme = {"Authorization": f"Bearer {ACME}"}
    beta = {"X-API-Key": BETA}

    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/readyz")).status_code == 200
    missing = await client.get("/conversations")
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
    assert (
        await client.get("/conversations", headers={"X-API-Key": "wrong-key-000000000"})
    ).status_code == 401
    assert (await client.post("/conversations/a/messages", json=ROUND)).status_code == 401
    assert await db.fetchval("SELECT count(*) FROM messages") == 0

    for _n in range(3):
        assert (
            await client.post("/conversations/secret/messages", json=ROUND, headers=acme)
        ).status_code == 201
    await api.idle()

    # Beta can neither read, write, delete nor discover acme's conversation: 404, as if absent.
    for method, path in [
        ("GET", "/conversations/secret"),
        ("GET", "/conversations/secret/memories"),
        ("GET", "/conversations/secret/messages"),
        ("DELETE", "/conversations/secret"),
        ("GET", "/ops/conversations/secret/memory-chain"),
        ("POST", "/ops/conversations/secret/summarize"),
    ]:
        response = await client.request(method, path, headers=beta)
        assert response.status_code == 404, (method, path, response.text)
    # The context reads as a never-written conversation's: nothing of acme's shows.
    empty = (await client.get("/conversations/secret/context", headers=beta)).json()
    assert (empty["messages"], empty["summaries"], empty["last_sequence"]) == ([], [], None)
    write = await client.post("/conversations/secret/messages", json=ROUND, headers=beta)
    assert write.status_code == 404
    assert (await client.get("/conversations", headers=beta)).json()["conversations"] == []
    assert (await client.get("/ops/memories/window-progression", headers=beta)).json() == []
    assert (await client.get("/ops/memories/generation-stats", headers=beta)).json()["total_summaries"] == 0
    await db.execute("UPDATE memory SET status = 'failed'")
    assert (await client.post("/ops/memories/1/retry", headers=beta)).status_code == 404
    assert (await client.get("/ops/memories/failed", headers=beta)).json() == []

    # Acme still sees everything of its own, unchanged.
    assert await db.fetchval("SELECT count(*) FROM messages WHERE conversation_id = 'secret'") == 6
    listed = (await client.get("/conversations", headers=acme)).json()["conversations"]
    assert [c["conversation_id"] for c in listed] == ["secret"]
    assert len((await client.get("/ops/memories/failed", headers=acme)).json()) == 1


async def test_deleting_a_conversation_while_it_summarizes(
    api: App, llm: FakeLLM, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    llm.hold = True
    for n in range(3):
        await api.post_round("bye", n)
    await asyncio.to_thread(llm.wait_for_calls, 1)
    assert (await api.client.delete("/conversations/bye")).status_code == 204
    llm.release(0)
    await api.idle()
    for table in ("conversations", "messages", "memory"):
        assert await db.fetchval(f"SELECT count(*) FROM {table}") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_summaries_in_flight_are_capped_and_due_work_waits_in_the_database(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_MAX_CONCURRENT_SUMMARIES=2)
    llm.hold = True
    for cid in ("c1", "c2", "c3", "c4", "c5"):
        for n in range(3):
            await api.post_round(cid, n)
    await asyncio.to_thread(llm.wait_for_calls, 2)
    runner = (await api.client.get("/ops/runner")).json()
    assert (runner["running"], runner["queued"], runner["due"]) == (2, 0, 3)
    assert len(llm.calls) == 2  # at most two LLM calls at once
    # Past the bound no row is started; the other conversations stay due, durably.
    assert await db.fetchval("SELECT count(*) FROM memory") == 2
    # No further round comes, and still every due conversation gets its summary.
    llm.hold = False
    llm.release_all()
    await api.idle()
    assert await db.fetchval("SELECT count(*) FROM memory WHERE status = 'completed'") == 5
    assert await db.fetchval("SELECT count(*) FROM conversations WHERE summary_due_at IS NOT NULL") == 0


async def test_message_content_is_not_logged_at_info(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    api = await make_app(LOG_LEVEL="DEBUG")
    secret = "my-credit-card-4111111111111111"
    for n in range(4):
        await api.client.post(
            "/conversations/private/messages",
            json={
                "messages": [
                    {"role": "user", "content": f"{secret} {n}"},
                    {"role": "assistant", "content": "ok"},
                ]
            },
        )
        await api.idle()
    messages = [r.getMessage() for r in caplog.records]
    assert any("Summarized messages 0-5 for private" in m for m in messages)
    assert any(
        "Summarization already in progress" in m or "status updated to completed" in m for m in messages
    )
    assert not [
        m for r, m in zip(caplog.records, messages, strict=True) if secret in m and r.levelno >= logging.INFO
    ]
