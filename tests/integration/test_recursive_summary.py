"""Seed 001 over HTTP: a recursive_summary conversation replayed message by message against the
corrected flow (11, 21, 31), its invariants checked before every round; the cap held through
1,000 messages by a model writing long summaries; the Markdown rendering; and the completion
that re-plans under the conversation's row lock."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import asyncpg

from tests.fakellm import FakeLLM
from tests.integration.conftest import App, AppFactory, eventually


async def create(api: App, cid: str, **policy: Any) -> dict[str, Any]:
    response = await api.client.post(
        "/conversations",
        json={"conversation_id": cid, "memory_policy": {"name": "recursive_summary", **policy}},
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def post(api: App, cid: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    response = await api.client.post(f"/conversations/{cid}/messages", json={"messages": messages})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def message(n: int) -> dict[str, Any]:
    """The seed's message n (1-based): the user's, then the assistant's, in turn."""
    role = "user" if n % 2 == 1 else "assistant"
    return {"role": role, "content": f"Message {n} from the {role}. More about it."}


def check_invariants(context: dict[str, Any], count: int, short_term: int = 10) -> None:
    """The medium-term summary plus every message after its end: none in both, none missing,
    never fewer than the last ``short_term`` raw."""
    end = context["summaries"][0]["end_sequence"] if context["summaries"] else -1
    sequences = [m["sequence"] for m in context["messages"]]
    assert sequences == list(range(end + 1, count)), (count, end, sequences)
    assert len(sequences) >= min(short_term, count), (count, sequences)
    assert len(context["summaries"]) <= 1
    if context["summaries"]:
        assert context["summaries"][0]["start_sequence"] == 0


async def test_seed_001_flow_at_messages_11_21_31(api: App, llm: FakeLLM, db: asyncpg.Connection) -> None:
    created = await create(api, "seed-001")
    assert created["memory_policy"] == {
        "name": "recursive_summary",
        "short_term": 10,
        "update_every": 10,
        "max_summary_tokens": 7000,
        "target_min_tokens": 500,
        "target_max_tokens": 1000,
    }
    made: dict[int, tuple[int, int, int | None]] = {}
    for n in range(1, 36):
        check_invariants(await api.context("seed-001"), n - 1)  # at the start of round n
        posted = await post(api, "seed-001", [message(n)])
        assert posted["summary_due"] is (n in (11, 21, 31)), n
        before = await db.fetchval("SELECT count(*) FROM memory")
        await api.idle()
        rows = await db.fetch(
            "SELECT start_sequence, end_sequence, base_memory_id, kind FROM memory OFFSET $1", before
        )
        for row in rows:
            assert row["kind"] == "medium_term"
            made[n] = (row["start_sequence"] + 1, row["end_sequence"] + 1, row["base_memory_id"])
        check_invariants(await api.context("seed-001"), n)
    # (first, last message covered, 1-based; base): 1 at 11, then 2-11 at 21, 12-21 at 31.
    assert made == {11: (1, 1, None), 21: (1, 11, 1), 31: (1, 21, 2)}
    # Each update was given only the messages that left the short-term window.
    assert [[s + 1 for s in c.message_sequences] for c in llm.calls] == [
        [1],
        list(range(2, 12)),
        list(range(12, 22)),
    ]
    assert llm.calls[0].system.startswith("Create an initial medium-term memory summary")
    assert llm.calls[1].system.startswith("Update the existing medium-term memory")
    assert "messages 2 to 11" in llm.calls[1].system and "messages 12 to 21" in llm.calls[2].system
    # After 35 messages: short-term is 22-35 (14 raw, between 10 and 19 as the reading says).
    context = await api.context("seed-001")
    assert [m["sequence"] + 1 for m in context["messages"]] == list(range(22, 36))

    rendered = await api.client.get("/conversations/seed-001/context", params={"format": "markdown"})
    assert rendered.status_code == 200
    assert rendered.text.startswith(
        "# Current Conversation Context\n\n## Medium-Term Memory (User Context from Earlier)\n\n"
        "Summary of messages #0-#20."
    )
    assert (
        "## Short-Term Memory (Recent Messages)\n\n- Message 22 (Assistant): Message 22 from" in rendered.text
    )
    assert rendered.text.endswith("- Message 35 (User): Message 35 from the user. More about it.")


async def test_the_summary_stays_under_its_cap_through_1000_messages(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_SUMMARY_MAX_CHARS=200_000)
    await create(api, "long", max_summary_tokens=1000, target_min_tokens=100, target_max_tokens=300)
    llm.growth = 400  # every update adds about 400 tokens to the previous summary
    for n in range(1, 501):
        await post(api, "long", [message(2 * n - 1), message(2 * n)])
        await api.idle()
        context = await api.context("long")
        check_invariants(context, 2 * n)
        assert all(s["tokens"] <= 1000 for s in context["summaries"]), n
    rows = await db.fetch("SELECT kind, tokens, status FROM memory ORDER BY memory_id")
    assert {r["status"] for r in rows} == {"completed"}
    kinds = [r["kind"] for r in rows]
    assert kinds.count("compaction") >= 40 and kinds.count("medium_term") >= 90
    assert max(r["tokens"] for r in rows) <= 1000
    # A compaction follows every update that left less room than one more update (over 700).
    for row, after in itertools.pairwise(rows):
        if row["kind"] == "medium_term" and row["tokens"] > 700:
            assert after["kind"] == "compaction"


async def test_a_summary_over_the_cap_is_never_shown(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_SUMMARY_MAX_CHARS=200_000)
    await create(api, "over", max_summary_tokens=1000, target_min_tokens=100, target_max_tokens=300)
    for n in range(1, 12):
        await post(api, "over", [message(n)])
    await api.idle()
    assert (await api.context("over"))["summaries"][0]["end_sequence"] == 0
    # The update at 21 comes back far over the cap: the context keeps the previous summary and
    # every message after it while the compaction runs.
    llm.hold = True
    for n in range(12, 22):
        await post(api, "over", [message(n)])
    await asyncio.to_thread(llm.wait_for_calls, 2)
    llm.release(-1, answer=" ".join(["detail"] * 1500))
    compaction = (await asyncio.to_thread(llm.wait_for_calls, 3))[-1]
    assert compaction.job["kind"] == "compaction"
    context = await api.context("over")
    assert context["summaries"][0]["end_sequence"] == 0 and context["processing"]["kind"] == "compaction"
    check_invariants(context, 21)
    chain = (await api.client.get("/conversations/over/memories")).json()["memories"]
    assert [(m["kind"], m["status"], m["shown"]) for m in chain] == [
        ("compaction", "processing", False),
        ("medium_term", "completed", False),
        ("medium_term", "completed", True),
    ]
    llm.release(-1, answer="A compact summary.")
    await api.idle()
    context = await api.context("over")
    assert context["summaries"][0]["kind"] == "compaction" and context["summaries"][0]["end_sequence"] == 10
    check_invariants(context, 21)


async def test_completion_re_plans_under_the_conversations_row_lock(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    """The race of an earlier attempt: a runner's claim loop planning between a summary's
    completion and its re-plan. The completion waits for the conversation's row lock before it
    marks the summary completed, so while the test holds that lock, the summary is still
    'processing'; once it is released, completion and re-plan commit together (the compaction the
    over-cap summary needs is already queued when the summary reads as completed)."""
    api = await make_app(MEMORY_SUMMARY_MAX_CHARS=200_000)
    await create(api, "race", max_summary_tokens=1000, target_min_tokens=100, target_max_tokens=300)
    llm.hold = True
    for n in range(1, 12):
        await post(api, "race", [message(n)])
    await asyncio.to_thread(llm.wait_for_calls, 1)
    async with db.transaction():
        await db.execute("SELECT 1 FROM conversations WHERE conversation_id = 'race' FOR UPDATE")
        llm.release(-1, answer=" ".join(["detail"] * 800))

        async def waiting_for_the_lock() -> bool:
            found = await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND pid <> pg_backend_pid()"
            )
            return bool(found)

        await eventually(waiting_for_the_lock, what="the completion to wait for the conversation's lock")
        assert await db.fetchval("SELECT status FROM memory WHERE memory_id = 1") == "processing"
    # The completion and its re-plan commit as one: no moment shows the summary completed with
    # nothing planned after it.
    await asyncio.to_thread(llm.wait_for_calls, 2)
    rows = await db.fetch("SELECT memory_id, kind, status, base_memory_id FROM memory ORDER BY memory_id")
    assert [(r["kind"], r["status"], r["base_memory_id"]) for r in rows] == [
        ("medium_term", "completed", None),
        ("compaction", "processing", 1),
    ]
    llm.release_all()
    await api.idle()
