"""Seed 000 over HTTP: a rolling_blocks conversation replayed for 85 interactions, checked
against the seed's acceptance criteria after every one; failures, retries and JSON content."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg

from tests.fakellm import FakeLLM
from tests.integration.conftest import App, eventually


def interaction(n: int) -> dict[str, Any]:
    """Seed 000's stored shape: the full userRequest and aiResponse objects."""
    return {
        "messages": [
            {
                "role": "user",
                "content": {
                    "query": f"Question {n}: what about topic {n}?",
                    "context": {"page": f"/topics/{n}", "locale": "en-GB"},
                    "options": {"temperature": 0.5, "tools": ["search"], "max_tokens": None},
                },
                "metadata": {"ts": f"2026-11-23T10:{n % 60:02d}:00Z"},
            },
            {
                "role": "assistant",
                "content": {"answer": f"Answer {n}.", "citations": [n, n + 1], "confidence": 0.75},
            },
        ]
    }


def shown_interactions(context: dict[str, Any]) -> list[tuple[int, int]]:
    return [(s["start_round"] + 1, s["end_round"] + 1) for s in context["summaries"]]


def window_interactions(context: dict[str, Any]) -> list[int]:
    return sorted({m["round"] + 1 for m in context["messages"]})


async def create(api: App, cid: str, **policy: Any) -> dict[str, Any]:
    response = await api.client.post(
        "/conversations", json={"conversation_id": cid, "memory_policy": {"name": "rolling_blocks", **policy}}
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_seed_000_replayed_for_85_interactions(api: App, llm: FakeLLM, db: asyncpg.Connection) -> None:
    created = await create(api, "seed-000")
    assert created["memory_policy"] == {"name": "rolling_blocks", "window": 21, "max_summaries": 3}
    blocks: list[tuple[int, int]] = []
    for n in range(1, 86):
        posted = await api.client.post("/conversations/seed-000/messages", json=interaction(n))
        assert posted.status_code == 201, posted.text
        # A summary is due, and created, every time a block fills: at interactions 22, 43, 64, 85.
        assert posted.json()["summary_due"] is (n in (22, 43, 64, 85)), n
        before = await db.fetchval("SELECT count(*) FROM memory")
        await api.idle()
        made = await db.fetch(
            "SELECT kind, start_round, end_round, base_memory_id FROM memory OFFSET $1", before
        )
        if n in (22, 43, 64, 85):
            assert [(r["kind"], r["base_memory_id"]) for r in made] == [("block", None)], n
            blocks.append((made[0]["start_round"] + 1, made[0]["end_round"] + 1))
        else:
            assert made == [], (n, made)
        context = await api.context("seed-000")
        window = window_interactions(context)
        # After any interaction the window holds the newest interactions, at most 21 of them.
        assert window == list(range(max(1, n - 20), n + 1)), (n, window)
        # At most 3 summaries, newest first, the oldest dropped first.
        assert shown_interactions(context) == list(reversed(blocks))[:3], n
        assert context["memory"] == (context["summaries"][0] if blocks else None)
    assert blocks == [(1, 22), (23, 43), (44, 64), (65, 85)]

    # Given 85 interactions: exactly 3 summaries (23-43, 44-64, 65-85), the window 65-85.
    context = await api.context("seed-000")
    assert shown_interactions(context) == [(65, 85), (44, 64), (23, 43)]
    assert window_interactions(context) == list(range(65, 86))
    assert context["policy"] == "rolling_blocks" and context["processing"] is None
    assert [s["text"] for s in context["summaries"]] == [
        f"Summary of messages #{2 * a - 2}-#{2 * b - 1}." for a, b in [(65, 85), (44, 64), (23, 43)]
    ]
    # The dropped summary stays in the version chain, marked as no longer shown.
    chain = (await api.client.get("/conversations/seed-000/memories")).json()["memories"]
    assert [(m["start_round"] + 1, m["end_round"] + 1, m["shown"]) for m in chain] == [
        (65, 85, True),
        (44, 64, True),
        (23, 43, True),
        (1, 22, False),
    ]
    # Each block summary was asked for its own interactions only.
    assert [c.message_sequences for c in llm.calls] == [
        list(range(0, 44)),
        list(range(44, 86)),
        list(range(86, 128)),
        list(range(128, 170)),
    ]
    conversation = (await api.client.get("/conversations/seed-000")).json()
    assert (conversation["round_count"], conversation["message_count"]) == (85, 170)


async def test_json_content_round_trips_exactly(api: App, db: asyncpg.Connection) -> None:
    await create(api, "json")
    body = interaction(1)
    # Key order, nesting, nulls, floats, unicode and big (64-bit) integers come back as posted.
    # NUL is fine inside JSON strings (json, unlike jsonb, stores it).
    body["messages"][1]["content"] = {
        "z": 1,
        "a": [1.5, None, True, {"é": "ü\u0000"}],
        "big": 2**63 - 1,
        "m": {},
    }
    # Per-message metadata keeps its numbers as posted too (jsonb would turn 6.9e98 into a
    # 99-digit integer).
    body["messages"][0]["metadata"] = {"ts": "2026-11-23T10:01:00Z", "score": 6.978388485431241e98}
    key = {"Idempotency-Key": "json-1"}
    posted = await api.client.post("/conversations/json/messages", json=body, headers=key)
    assert posted.status_code == 201, posted.text
    replayed = await api.client.post("/conversations/json/messages", json=body, headers=key)
    assert replayed.headers["Idempotent-Replayed"] == "true" and replayed.json() == posted.json()
    sent = [m["content"] for m in body["messages"]]

    def contents(text: str, key: str) -> list[Any]:
        document = json.loads(text, object_pairs_hook=lambda pairs: pairs)
        return [dict(m)["content"] for m in dict(document)[key]]

    as_pairs = [json.loads(json.dumps(c), object_pairs_hook=lambda pairs: pairs) for c in sent]
    assert contents(posted.text, "messages") == as_pairs
    assert contents(replayed.text, "messages") == as_pairs
    context = await api.client.get("/conversations/json/context")
    assert contents(context.text, "messages") == as_pairs
    page = await api.client.get("/conversations/json/messages")
    assert contents(page.text, "messages") == as_pairs
    assert page.json()["messages"][0]["metadata"] == {
        "ts": "2026-11-23T10:01:00Z",
        "score": 6.978388485431241e98,
    }
    assert page.json()["messages"][1]["metadata"] is None
    # Stored as json (not jsonb), so the text in the table keeps the client's order too.
    stored = await db.fetchval(
        "SELECT content::text FROM messages WHERE conversation_id = 'json' AND sequence = 1"
    )
    assert stored.startswith('{"z":1,"a":[1.5')


async def test_a_failed_block_keeps_its_range_raw_the_next_comes_on_time_and_it_can_be_retried(
    api: App, llm: FakeLLM
) -> None:
    await create(api, "fail", window=2, max_summaries=3)
    # Blocks of window 2: interactions 1-3, 4-5, 6-7, ...
    llm.fail_next(1)
    for n in range(1, 4):
        await api.client.post("/conversations/fail/messages", json=interaction(n))
    await api.idle()
    chain = (await api.client.get("/conversations/fail/memories")).json()["memories"]
    assert [(m["memory_id"], m["status"]) for m in chain] == [(1, "failed")]
    context = await api.context("fail")
    assert context["summaries"] == [] and window_interactions(context) == [1, 2, 3]

    for n in range(4, 6):
        await api.client.post("/conversations/fail/messages", json=interaction(n))
    await api.idle()
    context = await api.context("fail")
    # The next block came on time; the failed one's interactions stay in the raw part.
    assert shown_interactions(context) == [(4, 5)]
    assert window_interactions(context) == [1, 2, 3, 4, 5]

    retried = await api.client.post("/ops/memories/1/retry")
    assert retried.status_code == 202, retried.text
    await api.idle()
    context = await api.context("fail")
    assert shown_interactions(context) == [(4, 5), (1, 3)]
    assert window_interactions(context) == [4, 5]


async def test_a_block_boundary_passed_while_a_summary_runs_starts_on_completion(
    api: App, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    await create(api, "slow", window=2)
    llm.hold = True
    for n in range(1, 6):  # block 1-3 starts at 3; its boundary 5 passes while it runs
        await api.client.post("/conversations/slow/messages", json=interaction(n))
        if n == 3:
            await asyncio.to_thread(llm.wait_for_calls, 1)
    await api.settle()
    assert await db.fetchval("SELECT count(*) FROM memory") == 1
    llm.hold = False
    llm.release_all()

    async def both_done() -> bool:
        rows = await db.fetch("SELECT status, start_round, end_round FROM memory ORDER BY memory_id")
        return [tuple(r) for r in rows] == [("completed", 0, 2), ("completed", 3, 4)]

    await eventually(both_done, what="the second block to start when the first completed")


async def test_manual_summary_starts_only_a_full_block(api: App) -> None:
    await create(api, "manual", window=2)
    await api.client.post("/conversations/manual/messages", json=interaction(1))
    refused = await api.client.post("/ops/conversations/manual/summarize")
    assert refused.status_code == 409
    assert refused.json()["detail"] == (
        "nothing to summarize: the next block (interactions 1-3) is not full yet "
        "(1 of its 3 interactions stored)"
    )


async def test_create_conversation_errors(api: App) -> None:
    await create(api, "taken")
    again = await api.client.post("/conversations", json={"conversation_id": "taken"})
    assert again.status_code == 409 and again.json()["code"] == "conflict"
    for policy, field in [
        ({"name": "nope"}, "memory_policy"),
        ({"name": "rolling_blocks", "window": 0}, "window"),
        ({"name": "rolling_blocks", "max_summary": 2}, "max_summary"),
        ({"name": "sliding_window", "window_size": 1}, "window_size"),
    ]:
        response = await api.client.post(
            "/conversations", json={"conversation_id": "x", "memory_policy": policy}
        )
        assert response.status_code == 422, response.text
        assert any(field in ".".join(map(str, e["loc"])) for e in response.json()["detail"]), response.text
    assert (await api.client.get("/conversations/x")).status_code == 404
    default = await api.client.post(
        "/conversations", json={"conversation_id": "d", "metadata": {"team": "a"}}
    )
    assert default.json()["memory_policy"] == {
        "name": "sliding_window",
        "window_size": 14,
        "summarize_after_seq": 5,
        "summarize_every": 1,
        "catch_up_on_completion": True,
    }
