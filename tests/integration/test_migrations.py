"""Migration 0002 on a database that already holds conversations: nothing lost, rounds and
policies backfilled, and the downgrade gives the text back."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from alembic import command
from sqlalchemy.engine import make_url

from app.db import alembic_config


@pytest.fixture
async def scratch_database(postgres_server_url: str) -> AsyncIterator[str]:
    name = f"memory_migration_{uuid.uuid4().hex[:8]}"
    admin = make_url(postgres_server_url).set(drivername="postgresql").render_as_string(False)
    conn = await asyncpg.connect(admin)
    await conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(postgres_server_url).set(database=name).render_as_string(False)
    finally:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()


async def test_0002_backfills_rounds_and_policies_and_downgrades(
    scratch_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = alembic_config(scratch_database)
    await asyncio.to_thread(command.upgrade, config, "0001")
    plain = make_url(scratch_database).set(drivername="postgresql").render_as_string(False)
    conn = await asyncpg.connect(plain)
    try:
        await conn.execute("INSERT INTO conversations (conversation_id, next_sequence) VALUES ('old', 5)")
        # Three POSTs, each its own transaction (and so its own now()): rounds of 2, 2 and 1.
        for first, count in ((0, 2), (2, 2), (4, 1)):
            async with conn.transaction():
                for sequence in range(first, first + count):
                    await conn.execute(
                        "INSERT INTO messages (conversation_id, sequence, role, content) "
                        "VALUES ('old', $1, $2, $3)",
                        sequence,
                        "user" if sequence % 2 == 0 else "assistant",
                        f"message {sequence}",
                    )
        await conn.execute(
            "INSERT INTO memory (conversation_id, memory_text, start_sequence, end_sequence, status) "
            "VALUES ('old', 'first', 0, 1, 'completed')"
        )
        await conn.execute(
            "INSERT INTO memory (conversation_id, memory_text, start_sequence, end_sequence, "
            "base_memory_id, status) VALUES ('old', 'second', 0, 3, 1, 'completed')"
        )
        monkeypatch.setenv("MEMORY_ROLLING_WINDOW_SIZE", "8")
        await asyncio.to_thread(command.upgrade, config, "head")

        rows = await conn.fetch("SELECT sequence, round, content::text FROM messages ORDER BY sequence")
        assert [(r["sequence"], r["round"]) for r in rows] == [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2)]
        assert rows[0]["content"] == '"message 0"'
        conversation = await conn.fetchrow("SELECT * FROM conversations")
        assert conversation["next_round"] == 3
        assert conversation["memory_policy"] == (
            '{"name": "sliding_window", "window_size": 8, "summarize_after_seq": 5, '
            '"catch_up_on_completion": false}'
        )
        assert (conversation["context_summaries"], conversation["context_recent_rounds"]) == (1, 0)
        memories = await conn.fetch(
            "SELECT kind, start_round, end_round, input_start_sequence FROM memory ORDER BY memory_id"
        )
        assert [tuple(m) for m in memories] == [("window", 0, 0, 0), ("window", 0, 1, 2)]

        await asyncio.to_thread(command.downgrade, config, "0001")
        text = await conn.fetch("SELECT content FROM messages ORDER BY sequence")
        assert [r["content"] for r in text] == [f"message {n}" for n in range(5)]
    finally:
        await conn.close()
