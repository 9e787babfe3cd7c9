"""Seed 001 across conversations: ending a session (a final summary, then read-only), and the
user's cross-conversation summary of their last 5 conversations, built in the background with
the guarantees of conversation memory, and handed to their new sessions."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from tests.fakellm import FakeLLM
from tests.integration.conftest import App, AppFactory


async def create(api: App, cid: str, user_id: str | None = "ana") -> dict[str, Any]:
    body: dict[str, Any] = {"conversation_id": cid, "memory_policy": {"name": "recursive_summary"}}
    if user_id is not None:
        body["user_id"] = user_id
    response = await api.client.post("/conversations", json=body)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def chat(api: App, cid: str, messages: int) -> None:
    for n in range(messages // 2):
        await api.post_round(cid, n)


async def test_end_makes_a_final_summary_of_everything_then_refuses_messages(
    api: App, db: asyncpg.Connection
) -> None:
    created = await create(api, "session-1")
    assert created["user_id"] == "ana" and created["ended_at"] is None
    await chat(api, "session-1", 24)
    await api.idle()
    before = await api.context("session-1")
    assert before["summaries"][0]["end_sequence"] <= 13 and len(before["messages"]) >= 10
    ended = await api.client.post("/conversations/session-1/end")
    assert ended.status_code == 200, ended.text
    body = ended.json()
    assert body["ended_at"] is not None
    assert (body["final_summary"]["start_sequence"], body["final_summary"]["end_sequence"]) == (0, 23)
    await api.idle()
    context = await api.context("session-1")
    assert context["summaries"][0]["end_sequence"] == 23 and context["messages"] == []
    refused = await api.client.post(
        "/conversations/session-1/messages", json={"messages": [{"role": "user", "content": "more?"}]}
    )
    assert refused.status_code == 409
    assert refused.json()["code"] == "conflict" and "was ended" in refused.json()["detail"]
    assert await db.fetchval("SELECT count(*) FROM messages") == 24
    again = await api.client.post("/conversations/session-1/end")
    assert again.status_code == 200 and again.json()["ended_at"] == body["ended_at"]
    assert again.json()["final_summary"] is None
    assert (await api.client.post("/conversations/nope/end")).status_code == 404


async def test_a_new_session_gets_the_summary_of_the_users_last_5(
    api: App, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    for i in range(1, 7):
        await create(api, f"s{i}")
        await chat(api, f"s{i}", 4)
        await db.execute(  # each conversation a day after the last, s6 the newest
            "UPDATE conversations SET last_message_at = now() - make_interval(days => $1) "
            "WHERE conversation_id = $2",
            10 - i,
            f"s{i}",
        )
        assert (await api.client.post(f"/conversations/s{i}/end")).status_code == 200
        await api.idle()
    await create(api, "other-user", user_id="bob")
    context = (await api.client.get("/users/ana/context")).json()
    summary = context["summary"]
    assert summary["status"] == "completed" and context["freshness"] == {"fresh": True, "behind": None}
    # The last 5 conversations, newest first, each read with its final summary.
    assert [s["conversation_id"] for s in summary["sources"]] == ["s6", "s5", "s4", "s3", "s2"]
    assert all(s["summary_memory_id"] is not None and s["last_sequence"] == 3 for s in summary["sources"])
    user_calls = [c for c in llm.calls if c.job["kind"] == "user"]
    assert "Create a cross-conversational summary" in user_calls[-1].system
    newest = user_calls[-1].user
    assert '<conversation id="s6"' in newest and '<conversation id="s1"' not in newest
    assert "<previous_summary>" in newest  # it evolves the previous version
    chain = (await api.client.get("/users/ana/memories")).json()["memories"]
    assert [m["memory_id"] for m in chain] == list(range(len(chain), 0, -1))
    assert [m["base_memory_id"] for m in chain] == [*range(len(chain) - 1, 0, -1), None]

    # A new session of hers carries it in its context, with no second call.
    await create(api, "s7")
    new_context = await api.context("s7")
    assert new_context["user_summary"]["memory_id"] == summary["memory_id"]
    assert new_context["user_summary"]["text"] == summary["text"]
    assert (await api.context("other-user"))["user_summary"] is None
    assert (await api.client.get("/users/nobody/context")).status_code == 404
    assert (await api.client.get("/users/nobody/memories")).status_code == 404
    # The forms sent to a model carry it too, in their system part.
    await api.post_round("s7", 0)
    openai = (await api.client.get("/conversations/s7/context", params={"format": "openai"})).json()
    assert openai["messages"][0]["role"] == "system" and summary["text"] in openai["messages"][0]["content"]
    anthropic = (await api.client.get("/conversations/s7/context", params={"format": "anthropic"})).json()
    assert summary["text"] in anthropic["system"]


async def test_deleting_or_clearing_a_users_conversations_takes_them_out_of_the_user_summary(
    api: App, db: asyncpg.Connection
) -> None:
    for cid in ("d1", "d2"):
        await create(api, cid, user_id="eve")
        await chat(api, cid, 4)
        assert (await api.client.post(f"/conversations/{cid}/end")).status_code == 200
        await api.idle()
    sources = (await api.client.get("/users/eve/context")).json()["summary"]["sources"]
    assert {s["conversation_id"] for s in sources} == {"d1", "d2"}
    # One of two deleted: the summary is built again without it.
    assert (await api.client.delete("/conversations/d1")).status_code == 204
    await api.idle()
    sources = (await api.client.get("/users/eve/context")).json()["summary"]["sources"]
    assert [s["conversation_id"] for s in sources] == ["d2"]
    # The last one deleted: the user and every summary of them go.
    assert (await api.client.delete("/conversations/d2")).status_code == 204
    assert (await api.client.get("/users/eve/context")).status_code == 404
    assert await db.fetchval("SELECT count(*) FROM user_memory WHERE user_id = 'eve'") == 0
    # A cleared conversation (not ended) leaves the summary too.
    await create(api, "d3", user_id="eve")
    await chat(api, "d3", 4)
    await create(api, "d4", user_id="eve")
    await chat(api, "d4", 4)
    assert (await api.client.post("/conversations/d4/end")).status_code == 200
    await api.idle()
    before = (await api.client.get("/users/eve/context")).json()["summary"]["memory_id"]
    assert (await api.client.delete("/conversations/d3/messages")).status_code == 200
    await api.idle()
    after = (await api.client.get("/users/eve/context")).json()["summary"]
    assert after["memory_id"] > before


async def test_ended_and_archived_conversations_refuse_every_write(api: App, db: asyncpg.Connection) -> None:
    await create(api, "closed")
    await chat(api, "closed", 4)
    assert (await api.client.post("/conversations/closed/end")).status_code == 200
    await api.idle()
    writes = [
        ("PATCH", "/conversations/closed", {"memory_policy": {"name": "recursive_summary", "short_term": 4}}),
        ("DELETE", "/conversations/closed/messages", None),
        ("POST", "/conversations/closed/messages", {"messages": [{"role": "user", "content": "more"}]}),
    ]
    for method, path, body in writes:
        refused = await api.client.request(method, path, json=body)
        assert refused.status_code == 409, (method, path, refused.text)
        assert "was ended" in refused.json()["detail"]
    assert await db.fetchval("SELECT count(*) FROM messages WHERE conversation_id = 'closed'") == 4

    await create(api, "idle", user_id=None)
    await chat(api, "idle", 4)
    await db.execute("UPDATE conversations SET archived_at = now() WHERE conversation_id = 'idle'")
    for method, path, body in [
        ("PATCH", "/conversations/idle", {"memory_policy": {"name": "recursive_summary", "short_term": 4}}),
        ("DELETE", "/conversations/idle/messages", None),
        ("POST", "/conversations/idle/compress", None),
    ]:
        refused = await api.client.request(method, path, json=body)
        assert refused.status_code == 409, (method, path, refused.text)
        assert "is archived" in refused.json()["detail"]


async def test_a_conversation_with_tool_calls_waiting_is_not_ended(api: App) -> None:
    await create(api, "tools")
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    waiting = {
        "messages": [{"role": "user", "content": "rain?"}, {"role": "assistant", "tool_calls": [call]}]
    }
    assert (await api.client.post("/conversations/tools/messages", json=waiting)).status_code == 201
    refused = await api.client.post("/conversations/tools/end")
    assert refused.status_code == 409 and "waiting for their results" in refused.json()["detail"]
    result = {"messages": [{"role": "tool", "tool_call_id": "call_1", "content": "rain"}]}
    assert (await api.client.post("/conversations/tools/messages", json=result)).status_code == 201
    assert (await api.client.post("/conversations/tools/end")).status_code == 200


async def test_the_previous_summary_is_served_while_the_next_is_built(
    api: App, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    await create(api, "a")
    await chat(api, "a", 4)
    await api.client.post("/conversations/a/end")
    await api.idle()
    first = (await api.client.get("/users/ana/context")).json()["summary"]
    llm.hold = True
    await create(api, "b")
    await chat(api, "b", 4)
    held = len(llm.calls)
    await api.client.post("/conversations/b/end")  # b's final summary, and the user's, are due
    calls = await asyncio.to_thread(llm.wait_for_calls, held + 2)
    assert sorted(c.job["kind"] for c in calls[held:]) == ["medium_term", "user"]
    context = (await api.client.get("/users/ana/context")).json()
    assert context["summary"]["memory_id"] == first["memory_id"]
    assert context["freshness"] == {"fresh": False, "behind": "processing"}
    assert context["processing"]["base_memory_id"] == first["memory_id"]
    # One in flight per user, whoever tries: the database refuses a second.
    with pytest.raises(asyncpg.UniqueViolationError):
        await db.execute(
            "INSERT INTO user_memory (tenant_id, user_id, status) VALUES ('default', 'ana', 'processing')"
        )
    llm.hold = False
    llm.release_all()
    await api.idle()
    # b's final summary completed meanwhile: one more version follows, on the held one.
    context = (await api.client.get("/users/ana/context")).json()
    assert context["freshness"]["fresh"] and context["processing"] is None
    chain = (await api.client.get("/users/ana/memories")).json()["memories"]
    newest_first = [(m["memory_id"], m["base_memory_id"]) for m in chain]
    assert newest_first[0][0] == context["summary"]["memory_id"]
    # Each version is built on the one before it (ids skip the one the refused insert took).
    assert [base for _, base in newest_first] == [m for m, _ in newest_first[1:]] + [None]
    assert len(chain) >= 3


async def test_user_summaries_whose_runner_died_are_claimed_again_then_reaped(
    api: App, db: asyncpg.Connection
) -> None:
    """Leases as for conversation memory: a row left by a dead runner (lease expired, attempts
    left) is claimed again and completed; one out of attempts is failed by the reaper."""
    await create(api, "a")
    await chat(api, "a", 2)
    await db.execute("INSERT INTO users (tenant_id, user_id) VALUES ('default', 'ana'), ('default', 'bob')")
    await db.execute(
        "INSERT INTO user_memory (tenant_id, user_id, status, lease_expires_at, attempts) VALUES "
        "('default', 'ana', 'processing', now() - interval '1 hour', 1), "
        "('default', 'bob', 'processing', now() - interval '1 hour', $1)",
        api.service.retries.max_attempts,
    )
    await api.service.maintain([])
    assert await db.fetchval("SELECT status FROM user_memory WHERE user_id = 'bob'") == "failed"
    await api.idle()
    row = await db.fetchrow("SELECT status, attempts, sources FROM user_memory WHERE user_id = 'ana'")
    assert (row["status"], row["attempts"]) == ("completed", 2)
    assert '"conversation_id": "a"' in row["sources"]


async def test_a_user_summary_failing_for_want_of_the_model_is_due_again(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    """As for conversations: a user summary that failed because the model was unavailable is
    due again after its backoff (here 0 s) until one completes; a refused request is not."""
    api = await make_app(MEMORY_SUMMARY_BACKOFF_SECONDS=0, MEMORY_LLM_BREAKER_FAILURES=100)
    await create(api, "a")
    await chat(api, "a", 4)
    await api.client.post("/conversations/a/end")
    await api.idle()
    statuses = "SELECT status FROM user_memory ORDER BY memory_id"
    before = [r[0] for r in await db.fetch(statuses)]
    assert before and set(before) == {"completed"}

    due = "UPDATE users SET summary_due_at = now()"  # as a conversation of the user advancing
    llm.fail_next(3, status=503)
    await db.execute(due)
    await api.idle()
    after = [r[0] for r in await db.fetch(statuses)]
    assert after == [*before, "failed", "failed", "failed", "completed"]

    llm.fail_next(1, status=400)
    await db.execute(due)
    await api.idle()
    assert [r[0] for r in await db.fetch(statuses)][-1] == "failed"
    assert await db.fetchval("SELECT summary_due_at FROM users") is None
