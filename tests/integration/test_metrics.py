"""/metrics, in-process: requests by route template and status, summaries by policy and failure
reason, summary lag and generation time, the model's calls, tokens and circuit, the runner,
pools and the database's work counts; and who may read it. (Several worker processes:
test_metrics_processes.)"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from prometheus_client import generate_latest

from app import metrics
from tests.fakellm import FakeLLM
from tests.integration.conftest import App, AppFactory, eventually, running_app, settings_for
from tests.integration.scrapes import Scrape

POSTS = "/conversations/{conversation_id}/messages"
CONTEXT = "/conversations/{conversation_id}/context"
ACME = "acme-key-0123456789"
ADMIN = "admin-key-0123456789"


async def scrape(api: App, **headers: str) -> Scrape:
    response = await api.client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return Scrape(response.text)


async def test_rounds_and_summaries_move_the_metrics_with_their_labels(
    make_app: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_MAX_CONCURRENT_SUMMARIES=7)
    await api.client.post(
        "/conversations",
        json={"conversation_id": "blocks", "memory_policy": {"name": "rolling_blocks", "window": 2}},
    )
    before = await scrape(api)

    for n in range(4):  # sliding window: a summary after round 3 (rounds 0-2), then one per round
        await api.post_round("slide", n)
        await api.idle()
    for n in range(3):  # rolling blocks, window 2: block 0 is rounds 0-2
        await api.post_round("blocks", n)
    await api.idle()
    await api.context("slide")
    assert (await api.client.get("/conversations/nobody-here")).status_code == 404
    assert (await api.client.get("/no/such/path")).status_code == 404
    after = await scrape(api)
    delta = after - before

    # Requests by route template and status, never by raw path.
    http = "memory_http_request_duration_seconds_count"
    assert delta.value(http, method="POST", route=POSTS, status="201") == 7
    assert delta.value(http, method="GET", route=CONTEXT, status="200") == 1
    assert delta.value(http, method="GET", route="/conversations/{conversation_id}", status="404") == 1
    assert delta.value(http, method="GET", route="unmatched", status="404") == 1
    assert delta.value(http, method="POST", route="/conversations", status="201") == 0  # before
    assert "slide" not in after.text and "nobody-here" not in after.text and "/no/such" not in after.text
    assert (
        delta.value(
            "memory_http_request_duration_seconds_bucket", method="POST", route=POSTS, status="201", le="+Inf"
        )
        == 7
    )

    # Summaries by policy: 2 sliding windows, 1 block; the lag has one sample per newly covered
    # round (3 + 1 for the windows, 3 for the block), each from its POST to the completion.
    rows = await db.fetch("SELECT memory_id, status FROM memory ORDER BY memory_id")
    assert [r["status"] for r in rows] == ["completed"] * 3
    for policy, count, rounds in (("sliding_window", 2, 4), ("rolling_blocks", 1, 3)):
        assert delta.value("memory_summaries_started_total", policy=policy) == count
        assert delta.value("memory_summaries_completed_total", policy=policy) == count
        assert delta.total("memory_summaries_failed_total", policy=policy) == 0
        assert delta.value("memory_summary_generation_seconds_count", policy=policy) == count
        assert delta.value("memory_summary_lag_seconds_count", policy=policy) == rounds
        lag = delta.value("memory_summary_lag_seconds_sum", policy=policy)
        assert 0 < lag < 30 * rounds
    # The first window's first round waited for two more rounds (and their summaries' waits).
    assert delta.value("memory_summary_lag_seconds_bucket", policy="sliding_window", le="+Inf") == 4

    # The model: one call per summary, no retries, tokens from the response's usage.
    assert delta.value("memory_llm_calls_total", outcome="ok") == 3
    assert delta.total("memory_llm_calls_total") == 3
    assert delta.value("memory_llm_retries_total") == 0
    assert delta.value("memory_llm_tokens_total", direction="input") > 50
    assert delta.value("memory_llm_tokens_total", direction="output") > 0

    # This process: its runner, its pools (DATABASE_POOL_SIZE 5 + overflow 5; read pool 10), its
    # closed circuit.
    assert after.value("memory_runner_slots") == 7
    assert after.value("memory_runner_running") == 0
    assert after.value("memory_db_pool_max", pool="engine") == 10
    assert after.value("memory_db_pool_max", pool="read") == 10
    assert 1 <= after.value("memory_db_pool_open", pool="read") <= 10
    assert after.value("memory_db_pool_in_use", pool="engine") == 0
    assert after.value("memory_llm_circuit_state") == 0
    assert after.value("memory_llm_consecutive_failures") == 0
    # Every known label is there from the start, at 0 until counted.
    assert after.has("memory_summaries_failed_total", policy="rolling_blocks", reason="lease_expired")


async def test_work_counts_come_from_the_database(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    """Due, queued, running, stuck and failed work of every process, read every
    MEMORY_METRICS_REFRESH_SECONDS."""
    api = await make_app(MEMORY_METRICS_REFRESH_SECONDS=0.05, MEMORY_MAX_CONCURRENT_SUMMARIES=1)
    llm.hold = True
    for cid in ("a", "b"):
        for n in range(3):
            await api.post_round(cid, n)
    await asyncio.to_thread(llm.wait_for_calls, 1)
    # One summary runs (one slot), made stuck here; the other two conversations are due, and one
    # has a failed row.
    await db.execute("UPDATE memory SET created_at = now() - interval '1 hour'")
    for n in range(3):
        await api.post_round("c", n)
    await db.execute(
        """
        INSERT INTO memory (conversation_id, memory_text, kind, start_sequence, end_sequence,
                            start_round, end_round, input_start_sequence, status, attempts, error)
        VALUES ('c', '', 'window', 0, 1, 0, 0, 0, 'failed', 1, 'x')
        """
    )

    async def counted() -> bool:
        now = await scrape(api)
        return (
            now.value("memory_work_running"),
            now.value("memory_work_due"),
            now.value("memory_work_stuck"),
            now.value("memory_work_failed"),
            now.value("memory_runner_running"),
        ) == (1, 2, 1, 1, 1)

    await eventually(counted, what="the work counts")
    assert (await scrape(api)).value("memory_work_oldest_due_seconds") >= 0
    llm.hold = False
    llm.release_all()


async def test_a_failing_model_counts_failures_by_reason_and_opens_the_circuit(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    api = await make_app(
        MEMORY_LLM_BREAKER_FAILURES=3, MEMORY_LLM_BREAKER_OPEN_SECONDS=600, MEMORY_LLM_TIMEOUT_SECONDS=0.3
    )
    before = await scrape(api)

    # A model that never answers: the read times out.
    llm.hold = True
    for n in range(3):
        await api.post_round("slow", n)
    await api.idle()
    llm.hold = False
    llm.release_all()
    # Two server errors: the third failure in a row opens the circuit.
    llm.fail_next(2, status=500)
    for cid in ("err-1", "err-2"):
        for n in range(3):
            await api.post_round(cid, n)
        await api.idle()
    after = await scrape(api)
    delta = after - before

    failed = "memory_summaries_failed_total"
    assert delta.value(failed, policy="sliding_window", reason="timeout") == 1
    assert delta.value(failed, policy="sliding_window", reason="llm_error") == 2
    assert delta.total(failed) == 3
    assert delta.value("memory_summaries_started_total", policy="sliding_window") == 3
    assert delta.value("memory_summaries_completed_total", policy="sliding_window") == 0
    assert delta.value("memory_llm_calls_total", outcome="timeout") == 1
    assert delta.value("memory_llm_calls_total", outcome="error") == 2
    assert after.value("memory_llm_circuit_state") == 2  # open
    assert after.value("memory_llm_consecutive_failures") == 3
    runner = (await api.client.get("/ops/runner")).json()
    assert runner["llm_circuit"] == "open"


async def test_empty_answers_retries_and_shutdowns_are_counted(
    database_url: str, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    settings = settings_for(database_url, llm, MEMORY_LLM_MAX_RETRIES=2)
    async with running_app(settings) as api:
        before = await scrape(api)
        llm.hold = True
        for n in range(3):
            await api.post_round("empty", n)
        await asyncio.to_thread(llm.wait_for_calls, 1)
        llm.release(0, answer="   ")
        await api.idle()
        # A 503 then an answer: one call, one retry.
        llm.hold = False
        llm.fail_next(1, status=503, retry_after="0")
        for n in range(3):
            await api.post_round("retried", n)
        await api.idle()
        # Shutting down with a summary in flight (no grace): it goes back to the queue.
        llm.hold = True
        for n in range(3):
            await api.post_round("stopped", n)
        await asyncio.to_thread(llm.wait_for_calls, 4)  # empty, 503, ok, held
        middle = await scrape(api)
    after = Scrape(generate_latest(metrics.scrape_registry()).decode())
    llm.release_all()
    delta = middle - before
    assert delta.value("memory_summaries_failed_total", policy="sliding_window", reason="empty") == 1
    assert delta.value("memory_llm_calls_total", outcome="empty") == 1
    assert delta.value("memory_llm_calls_total", outcome="ok") == 1
    assert delta.value("memory_llm_retries_total") == 1
    assert (after - middle).value(
        "memory_summaries_failed_total", policy="sliding_window", reason="shutdown_requeued"
    ) == 1
    assert await db.fetchval("SELECT lease_expires_at IS NULL FROM memory WHERE conversation_id = 'stopped'")


async def test_requests_refused_at_the_edge_are_counted_by_route_template(make_app: AppFactory) -> None:
    api = await make_app(
        MEMORY_API_KEYS=f"acme:{ACME}", MEMORY_METRICS_PUBLIC=True, MEMORY_MAX_BODY_BYTES=1024
    )
    before = await scrape(api)
    assert (await api.client.get("/conversations/secret-id/context")).status_code == 401
    big = await api.client.post(
        "/conversations/secret-id/messages", content=b"x" * 2048, headers={"X-API-Key": ACME}
    )
    assert big.status_code == 413
    assert (await api.client.get("/ops/memories/9/retry", headers={"X-API-Key": ACME})).status_code == 405
    after = await scrape(api)
    delta = after - before
    http = "memory_http_request_duration_seconds_count"
    assert delta.value(http, method="GET", route=CONTEXT, status="401") == 1
    assert delta.value(http, method="POST", route=POSTS, status="413") == 1
    assert delta.value(http, method="GET", route="/ops/memories/{memory_id}/retry", status="405") == 1
    assert "secret-id" not in after.text


# ---- who may read /metrics -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "headers", "status"),
    [
        ({}, {}, 200),  # no keys at all: public, like the docs
        ({"MEMORY_METRICS_PUBLIC": False}, {}, 401),
        ({"MEMORY_API_KEYS": f"acme:{ACME}"}, {}, 401),
        ({"MEMORY_API_KEYS": f"acme:{ACME}"}, {"X-API-Key": ACME}, 403),  # a tenant sees no totals
        ({"MEMORY_API_KEYS": f"acme:{ACME}"}, {"X-API-Key": "wrong-key-0123456789"}, 401),
        ({"MEMORY_API_KEYS": f"acme:{ACME}", "MEMORY_METRICS_PUBLIC": True}, {}, 200),
        ({"MEMORY_API_KEYS": f"acme:{ACME}", "MEMORY_ADMIN_KEY": ADMIN}, {"X-API-Key": ADMIN}, 200),
        (
            {"MEMORY_API_KEYS": f"acme:{ACME}", "MEMORY_ADMIN_KEY": ADMIN},
            {"Authorization": f"Bearer {ADMIN}"},
            200,
        ),
        ({"MEMORY_API_KEYS": f"acme:{ACME}", "MEMORY_ADMIN_KEY": ADMIN}, {"X-API-Key": ACME}, 403),
        ({"MEMORY_ADMIN_KEY": ADMIN}, {}, 401),  # an admin key alone closes it too
        ({"MEMORY_ADMIN_KEY": ADMIN}, {"X-API-Key": ADMIN}, 200),
    ],
)
async def test_metrics_need_the_admin_key_when_keys_are_set(
    make_app: AppFactory, settings: dict[str, Any], headers: dict[str, str], status: int
) -> None:
    api = await make_app(**settings)
    response = await api.client.get("/metrics", headers=headers)
    assert response.status_code == status, response.text
    if status != 200:
        assert response.json()["code"] == ("forbidden" if status == 403 else "unauthorized")
    # /metrics is not part of the API's document.
    assert "/metrics" not in (await api.client.get("/openapi.json", headers=headers)).text
