"""app.repositories.statements: a Statement reads the same through SQLAlchemy and on asyncpg
directly, and a raw connection that died or was cancelled mid-transaction never goes back to
the pool for the next caller."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import create_engine
from app.repositories import statements
from app.repositories.statements import Statement
from app.settings import Settings
from tests.integration.conftest import eventually

# What a statement on a terminated backend raises (asyncpg reports some as an internal error).
LOST = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    ConnectionError,
)

PROBE = Statement(
    "SELECT CAST(:n AS integer) + 1 AS next, CAST(:doc AS jsonb) AS doc, CAST(:names AS varchar[]) AS names, "
    "now() AS at, CAST(NULL AS text) AS nothing"
)


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """One pooled connection, so the next caller gets whatever the last one gave back."""
    engine = create_engine(
        database_url, Settings(_env_file=None, DATABASE_POOL_SIZE=1, DATABASE_MAX_OVERFLOW=0)
    )
    yield engine
    await engine.dispose()


async def test_a_statement_reads_the_same_both_ways(engine: AsyncEngine) -> None:
    params = {"n": 41, "doc": '{"a": [1, "b"]}', "names": ["x", "y"]}
    async with engine.connect() as conn:
        through_sqlalchemy = [dict(r) for r in await PROBE.fetch(conn, params)]
    async with statements.connect(engine, transaction=False) as raw:
        direct = [dict(r) for r in await PROBE.fetch(raw, params)]
        row = await PROBE.fetchrow(raw, params)
    assert through_sqlalchemy[0]["doc"] == {"a": [1, "b"]}
    assert [{k: v for k, v in r.items() if k != "at"} for r in direct] == [
        {k: v for k, v in r.items() if k != "at"} for r in through_sqlalchemy
    ]
    assert row is not None and row["next"] == 42 and row["names"] == ["x", "y"] and row["nothing"] is None


async def test_a_transaction_on_the_raw_connection_commits_or_rolls_back(
    engine: AsyncEngine, db: asyncpg.Connection
) -> None:
    insert = Statement("INSERT INTO conversations (conversation_id, memory_policy) VALUES (:cid, '{}')")
    async with statements.connect(engine, transaction=True) as raw:
        await insert.execute(raw, {"cid": "kept"})
    with pytest.raises(RuntimeError):
        async with statements.connect(engine, transaction=True) as raw:
            await insert.execute(raw, {"cid": "rolled-back"})
            raise RuntimeError("the caller failed")
    found = await db.fetch("SELECT conversation_id FROM conversations ORDER BY 1")
    assert [r["conversation_id"] for r in found] == ["kept"]


async def test_a_lost_connection_is_not_handed_out_again(engine: AsyncEngine, db: asyncpg.Connection) -> None:
    with pytest.raises(LOST):
        async with statements.connect(engine, transaction=True) as raw:
            await db.execute("SELECT pg_terminate_backend($1)", raw.get_server_pid())
            await PROBE.fetch(raw, {"n": 1, "doc": "{}", "names": []})
    async with statements.connect(engine, transaction=True) as raw:
        row = await PROBE.fetchrow(raw, {"n": 1, "doc": "{}", "names": []})
    assert row is not None and row["next"] == 2


async def test_a_cancelled_transaction_leaves_nothing_open(engine: AsyncEngine) -> None:
    started = asyncio.Event()

    async def slow() -> None:
        async with statements.connect(engine, transaction=True) as raw:
            started.set()
            await raw.execute("SELECT pg_sleep(30)")

    task = asyncio.create_task(slow())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(10), statements.connect(engine, transaction=False) as raw:
        assert not raw.is_in_transaction()
        assert await raw.fetchval("SELECT 1") == 1


async def test_a_lost_connection_makes_the_pool_replace_its_older_ones(
    database_url: str, db: asyncpg.Connection
) -> None:
    """A restart kills every pooled connection; after the first fails, the rest are replaced
    on checkout (the caller's error handling must not pick up another dead one)."""
    engine = create_engine(
        database_url, Settings(_env_file=None, DATABASE_POOL_SIZE=2, DATABASE_MAX_OVERFLOW=0)
    )
    try:
        async with (
            statements.connect(engine, transaction=False) as one,
            statements.connect(engine, transaction=False) as two,
        ):
            pids = [one.get_server_pid(), two.get_server_pid()]
        for pid in pids:
            await db.execute("SELECT pg_terminate_backend($1)", pid)
        with pytest.raises(LOST):
            async with statements.connect(engine, transaction=True) as raw:
                await raw.fetchval("SELECT 1")
        async with statements.connect(engine, transaction=True) as raw:
            assert await raw.fetchval("SELECT 1") == 1
    finally:
        await engine.dispose()


async def test_a_transaction_left_idle_is_ended_by_the_server(engine: AsyncEngine, database_url: str) -> None:
    """A frozen process's open transaction would hold its row locks forever: every session of
    the engine carries idle_in_transaction_session_timeout, except behind PgBouncer, which
    refuses that start-up parameter (its own idle_transaction_timeout does the job there)."""
    async with statements.connect(engine, transaction=False) as raw:
        assert await raw.fetchval("SHOW idle_in_transaction_session_timeout") == "1min"
        # Set lower for this session: a transaction left idle ends the session.
        await raw.execute("SET idle_in_transaction_session_timeout = '100ms'")
        pid = await raw.fetchval("SELECT pg_backend_pid()")
        transaction = raw.transaction()
        await transaction.start()
        observer = await asyncpg.connect(
            make_url(database_url).set(drivername="postgresql").render_as_string(False)
        )
        try:

            async def ended() -> bool:
                return not await observer.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid
                )

            await eventually(ended, what="the idle transaction's session to end")
        finally:
            await observer.close()
        with pytest.raises(LOST):
            await raw.fetchval("SELECT 1")
    bouncer = create_engine(database_url, Settings(_env_file=None, DATABASE_PGBOUNCER=True))
    try:
        async with statements.connect(bouncer, transaction=True) as direct:
            assert await direct.fetchval("SHOW idle_in_transaction_session_timeout") == "0"
    finally:
        await bouncer.dispose()
