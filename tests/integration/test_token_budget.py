"""Seed 003's token-budget memory over HTTP: compressions exactly where its rules put them,
folding, the text rendering, updateConfig (PATCH) and manual compression."""

from __future__ import annotations

from typing import Any

import asyncpg

from tests.fakellm import FakeLLM
from tests.integration.conftest import App, AppFactory

POLICY = {"name": "token_budget", "max_entries": 6, "recent_window": 2, "min_entries_to_compress": 2}


async def create(api: App, cid: str, **policy: Any) -> None:
    response = await api.client.post(
        "/conversations", json={"conversation_id": cid, "memory_policy": {**POLICY, **policy}}
    )
    assert response.status_code == 201, response.text


async def say(api: App, cid: str, text: str) -> None:
    response = await api.client.post(
        f"/conversations/{cid}/messages", json={"messages": [{"role": "user", "content": text}]}
    )
    assert response.status_code == 201, response.text


async def rows(db: asyncpg.Connection) -> list[tuple[str, int, int, str]]:
    found = await db.fetch("SELECT kind, start_sequence, end_sequence, status FROM memory ORDER BY memory_id")
    return [tuple(r) for r in found]


async def test_compressions_come_where_the_seed_puts_them(api: App, db: asyncpg.Connection) -> None:
    await create(api, "agent")
    made = []
    for n in range(20):
        await say(api, "agent", f"Message {n}. Some detail about step {n}.")
        await api.idle()
        made.append(len(await rows(db)))
    # Active entries pass 6 at the 7th entry (seq 6): entries 0-4 are compressed (all but the
    # last 2). Then 5-6 stay active; they pass 6 again at seq 11 (5-11): 5-9; then at 16: 10-14.
    assert await rows(db) == [
        ("compression", 0, 4, "completed"),
        ("compression", 5, 9, "completed"),
        ("compression", 10, 14, "completed"),
    ]
    assert (made[5], made[6], made[10], made[11], made[15], made[16]) == (0, 1, 1, 2, 2, 3)
    context = await api.context("agent")
    assert [s["end_sequence"] for s in context["summaries"]] == [14, 9, 4]  # newest first
    assert [m["sequence"] for m in context["messages"]] == [15, 16, 17, 18, 19]
    stored = await db.fetchrow("SELECT input_tokens, tokens, from_at, to_at FROM memory WHERE memory_id = 1")
    assert stored["input_tokens"] > 0 and stored["tokens"] > 0 and stored["from_at"] <= stored["to_at"]


async def test_the_text_form_is_the_seeds(api: App) -> None:
    await create(api, "text")
    for n in range(8):
        await say(api, "text", f"Question {n}?")
    await api.idle()
    text = (await api.client.get("/conversations/text/context", params={"format": "text"})).text
    assert text.startswith("=== Previous Conversation Summaries ===\n[20")
    assert "\n\n=== Recent Conversation ===\nUser: Question 6?\nUser: Question 7?" in text


async def test_summaries_past_their_budget_are_folded(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = await make_app()
    # Summaries may take 0.3 x 100 = 30 tokens; each of the fake model's is about 10.
    await create(api, "fold", max_tokens=100, compression_ratio=0.3)
    for n in range(40):
        await say(api, "fold", f"Entry {n} with a few words.")
        await api.idle()
    kinds = [r[0] for r in await rows(db)]
    assert "fold" in kinds
    context = await api.context("fold")
    shown = [(s["kind"], s["start_sequence"], s["end_sequence"]) for s in context["summaries"]]
    # The chain: non-overlapping, contiguous from 0, and no more than three summaries.
    starts = [start for _, start, _ in reversed(shown)]
    ends = [end for _, _, end in reversed(shown)]
    assert (
        starts[0] == 0 and all(s == e + 1 for s, e in zip(starts[1:], ends, strict=False)) and len(shown) <= 3
    )
    fold_call = next(c for c in llm.calls if c.job["kind"] == "fold")
    assert "<summary from=" in fold_call.user and "<message" not in fold_call.user


async def test_update_config_and_manual_compression(api: App, db: asyncpg.Connection) -> None:
    await create(api, "cfg", max_entries=100)
    for n in range(6):
        await say(api, "cfg", f"Note {n}.")
    await api.idle()
    assert await rows(db) == []
    changed = await api.client.patch(
        "/conversations/cfg", json={"memory_policy": {"name": "token_budget", "max_entries": 5}}
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["memory_policy"] == {
        **POLICY,
        "max_entries": 5,
        "max_tokens": 50000,
        "compression_ratio": 0.3,
        "auto_compress": True,
    }
    await say(api, "cfg", "Note 6.")  # 7 active entries > 5: compress 0-4
    await api.idle()
    assert await rows(db) == [("compression", 0, 4, "completed")]
    switch = await api.client.patch("/conversations/cfg", json={"memory_policy": {"name": "sliding_window"}})
    assert switch.status_code == 409 and "switching" in switch.json()["detail"]
    await say(api, "cfg", "Note 7.")
    await say(api, "cfg", "Note 8.")
    manual = await api.client.post("/conversations/cfg/compress")
    assert manual.status_code == 202 and (manual.json()["start_sequence"], manual.json()["end_sequence"]) == (
        5,
        6,
    )
    await api.idle()
    nothing = await api.client.post("/conversations/cfg/compress")
    assert nothing.status_code == 409 and "nothing to compress" in nothing.json()["detail"]


async def test_a_compression_that_failed_before_it_completed_leaves_no_hole(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    """The failed attempt stays in the chain, but the context does not send its entries raw
    again once the retry's summary covers them."""
    api = await make_app(MEMORY_SUMMARY_BACKOFF_SECONDS=0)
    await create(api, "retried")
    llm.fail_next(1, status=503)
    for n in range(7):
        await say(api, "retried", f"Message {n}. Some detail about step {n}.")
        await api.idle()
    assert await rows(db) == [("compression", 0, 4, "failed"), ("compression", 0, 4, "completed")]
    context = await api.context("retried")
    assert [s["end_sequence"] for s in context["summaries"]] == [4]
    assert [m["sequence"] for m in context["messages"]] == [5, 6]


async def test_a_failed_fold_over_shown_compressions_leaves_no_hole(api: App, db: asyncpg.Connection) -> None:
    """Shown summaries that together cover a failed attempt's range (a fold of three
    compressions that failed) leave nothing of it to send raw."""
    await create(api, "folded")
    for n in range(20):
        await say(api, "folded", f"Message {n}. Some detail about step {n}.")
        await api.idle()
    before = await api.context("folded")
    assert [s["end_sequence"] for s in before["summaries"]] == [14, 9, 4]
    await db.execute(
        """
        INSERT INTO memory (conversation_id, kind, memory_text, start_sequence, end_sequence,
                            start_round, end_round, input_start_sequence, status, error)
        SELECT conversation_id, 'fold', '', min(start_sequence), max(end_sequence), min(start_round),
               max(end_round), min(start_sequence), 'failed', 'the model was down'
        FROM memory WHERE conversation_id = 'folded' GROUP BY conversation_id
        """
    )
    after = await api.context("folded")
    assert [s["end_sequence"] for s in after["summaries"]] == [14, 9, 4]
    assert [m["sequence"] for m in after["messages"]] == [15, 16, 17, 18, 19]


async def test_a_failed_attempt_partly_covered_is_sent_raw_only_where_it_is_not(
    api: App, db: asyncpg.Connection
) -> None:
    """A failed compression that a later, shorter one covers only in part (the policy's
    recent_window was raised in between): the raw part starts at its first entry that no shown
    summary holds, not at its start, so no summarized entry is sent twice."""
    await create(api, "partly")
    for n in range(20):
        await say(api, "partly", f"Message {n}. Some detail about step {n}.")
        await api.idle()
    await db.execute(
        """
        INSERT INTO memory (conversation_id, kind, memory_text, start_sequence, end_sequence,
                            start_round, end_round, input_start_sequence, status, error)
        VALUES ('partly', 'compression', '', 10, 17, 10, 17, 10, 'failed', 'the model was down')
        """
    )
    context = await api.context("partly")
    assert [s["end_sequence"] for s in context["summaries"]] == [14, 9, 4]
    assert [m["sequence"] for m in context["messages"]] == [15, 16, 17, 18, 19]
    assert not context["truncated"]
