"""Seed 001's cleanup: conversations idle for MEMORY_ARCHIVE_AFTER_DAYS are archived by the
maintenance loop (the clock is controlled by back-dating last_message_at in the database):
read-only, out of listings unless asked for, still readable and exportable, restorable; and the
session markdown export."""

from __future__ import annotations

import asyncio

import asyncpg

from tests.integration.conftest import App, AppFactory, eventually


async def age(db: asyncpg.Connection, conversation_id: str, days: float) -> None:
    """The conversation's newest message as if it were ``days`` old."""
    await db.execute(
        "UPDATE conversations SET last_message_at = now() - make_interval(secs => $1 * 86400) "
        "WHERE conversation_id = $2",
        days,
        conversation_id,
    )


async def test_idle_conversations_are_archived_read_only_and_restorable(
    api: App, db: asyncpg.Connection
) -> None:
    for cid in ("old", "recent"):
        await api.post_round(cid, 0)
    await age(db, "old", 31)
    await age(db, "recent", 29)
    assert await api.service.archive_idle() == 1
    assert await api.service.archive_idle() == 0  # once

    listed = (await api.client.get("/conversations")).json()["conversations"]
    assert [c["conversation_id"] for c in listed] == ["recent"]
    everything = (await api.client.get("/conversations", params={"include_archived": "true"})).json()
    assert [c["conversation_id"] for c in everything["conversations"]] == ["old", "recent"]
    archived = (await api.client.get("/ops/conversations/archived")).json()["conversations"]
    assert [c["conversation_id"] for c in archived] == ["old"] and archived[0]["archived_at"] is not None

    # Still readable and exportable; read-only.
    assert (await api.context("old"))["messages"][0]["content"].startswith("Round 0 question")
    exported = await api.client.get("/conversations/old/export", params={"format": "markdown"})
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("text/markdown")
    assert "**Message 1 (User):** Round 0 question." in exported.text
    refused = await api.client.post(
        "/conversations/old/messages", json={"messages": [{"role": "user", "content": "hi"}]}
    )
    assert refused.status_code == 409 and "archived" in refused.json()["detail"]
    assert await db.fetchval("SELECT count(*) FROM messages WHERE conversation_id = 'old'") == 2
    assert (await api.client.post("/conversations/old/end")).status_code == 409

    restored = await api.client.post("/ops/conversations/old/restore")
    assert restored.status_code == 200 and restored.json()["archived_at"] is None
    assert (await api.client.post("/ops/conversations/old/restore")).status_code == 409
    await api.post_round("old", 1)
    assert await api.service.archive_idle() == 0  # its clock restarted


async def test_the_maintenance_loop_archives_in_batches_across_replicas(
    make_app: AppFactory, db: asyncpg.Connection
) -> None:
    """Two replicas with a short maintenance interval and a 1-day archive age: 1,200 idle
    conversations (more than two batches of 500) are all archived, each once."""
    await db.execute(
        "INSERT INTO conversations (conversation_id, memory_policy, last_message_at) "
        "SELECT 'idle-' || i, '{\"name\": \"sliding_window\"}', now() - interval '2 days' "
        "FROM generate_series(1, 1200) i"
    )
    await db.execute(
        "INSERT INTO conversations (conversation_id, memory_policy) "
        "VALUES ('busy', '{\"name\": \"sliding_window\"}')"
    )
    settings = {"MEMORY_ARCHIVE_AFTER_DAYS": 1, "MEMORY_REAPER_INTERVAL_SECONDS": 0.05}
    await asyncio.gather(make_app(**settings), make_app(**settings))

    async def archived() -> bool:
        return bool(
            await db.fetchval("SELECT count(*) FROM conversations WHERE archived_at IS NOT NULL") == 1200
        )

    await eventually(archived, what="1,200 conversations to be archived")
    assert await db.fetchval("SELECT archived_at FROM conversations WHERE conversation_id = 'busy'") is None


async def test_session_markdown_after_an_ended_recursive_conversation(api: App) -> None:
    created = await api.client.post(
        "/conversations",
        json={"conversation_id": "session", "memory_policy": {"name": "recursive_summary"}, "user_id": "ana"},
    )
    assert created.status_code == 201
    for n in range(12):
        await api.post_round("session", n)
    await api.client.post("/conversations/session/end")
    await api.idle()
    exported = (await api.client.get("/conversations/session/export?format=markdown")).text
    title, head, short_term, summary = exported.split("\n## ")
    assert title.startswith("# Session: ")
    assert "\n- Conversation: session\n" in head and "- Message Count: 24" in head
    assert "- Summary Version: " in head and "(not ended" not in head
    assert short_term.startswith("Short-Term Messages (Last 10)\n**Message 15 (User):** Round 7 question.")
    assert short_term.rstrip().endswith("**Message 24 (Assistant):** Round 11 answer. Topic 11 explained.")
    assert summary.startswith("Medium-Term Summary\nSummary of messages #0-#23.")


async def test_archiving_gives_up_on_a_locked_table_until_the_next_tick(
    api: App, db: asyncpg.Connection
) -> None:
    """Behind an operator's (or a migration's) table lock, archiving waits 100 ms, not holding a
    pooled connection a request may need, and archives on a later tick."""
    await api.post_round("old", 0)
    await age(db, "old", 31)
    async with db.transaction():
        await db.execute("LOCK TABLE conversations IN ACCESS EXCLUSIVE MODE")
        assert await api.service.archive_idle() == 0
    # This call or the app's own maintenance tick (which may run first) archives it now.
    await api.service.archive_idle()
    archived = "SELECT archived_at IS NOT NULL FROM conversations WHERE conversation_id = 'old'"
    assert await db.fetchval(archived)
