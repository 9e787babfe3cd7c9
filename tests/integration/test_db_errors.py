"""Database failures the way a hostile client (or a bad day) produces them, on a real PostgreSQL:
which are a 503 (retry) and which a 500, which may replace pooled connections and which must
keep a healthy pool, the per-process connection budget under a burst, and message content kept
out of logs and stored errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.db import connection_budget
from tests.fakellm import FakeLLM
from tests.integration.conftest import AppFactory, eventually

UNAVAILABLE = {"detail": "database unavailable, retry shortly", "code": "unavailable"}


def _plain(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json() == UNAVAILABLE
    assert response.headers["Retry-After"] == "1"


async def app_backends(db: asyncpg.Connection, database_url: str) -> list[int]:
    """Server-side sessions of the service (both pools) on the test database."""
    rows = await db.fetch(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'memory-service' AND datname = $1",
        make_url(database_url).database,
    )
    return sorted(r["pid"] for r in rows)


def round_body(n: int, content: str | None = None) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": content or f"question {n}"},
            {"role": "assistant", "content": f"answer {n}"},
        ]
    }


# ---- max_connections: TooManyConnectionsError --------------------------------------------------


# Enough for a request while the service's start-up work runs (its LISTEN connection, the first
# maintenance tick, a webhook sender's look for deliveries): the first request must succeed.
ROLE_CONNECTIONS = 5


@pytest.fixture
async def limited_role(plain_database_url: str) -> AsyncIterator[str]:
    """A login role with CONNECTION LIMIT ROLE_CONNECTIONS and the service's rights on the test
    database. (Superusers ignore connection limits, so the service must not connect as one here.)"""
    role = f"memory_limited_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(plain_database_url)
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT {ROLE_CONNECTIONS}')
        await admin.execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"'
        )
        await admin.execute(f'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
        yield role
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
        await admin.execute(f'DROP OWNED BY "{role}"')
        await admin.execute(f'DROP ROLE "{role}"')
    finally:
        await admin.close()


async def test_too_many_connections_is_a_503(
    limited_role: str,
    make_app: AppFactory,
    database_url: str,
    db: asyncpg.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = make_url(database_url).set(username=limited_role).render_as_string(hide_password=False)
    # The maintenance loop runs once at start-up, then not again during the test.
    api = await make_app(DATABASE_URL=url, MEMORY_SUMMARIZER="offline", MEMORY_REAPER_INTERVAL_SECONDS=3600)
    assert (await api.client.post("/conversations/c/messages", json=round_body(0))).status_code == 201

    # Someone else takes every connection the role may have: end the service's sessions (the
    # read pool may reconnect to keep its minimum, so repeat) and connect from here until all
    # ROLE_CONNECTIONS are ours.
    held: list[asyncpg.Connection] = []

    async def all_slots_taken() -> bool:
        await db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE usename = $1 AND application_name = 'memory-service'",
            limited_role,
        )
        with contextlib.suppress(asyncpg.TooManyConnectionsError):
            held.append(await asyncpg.connect(_plain(url)))
        return len(held) == ROLE_CONNECTIONS

    try:
        await eventually(all_slots_taken, what="the test to hold all of the role's connections")
        caplog.set_level(logging.WARNING, logger="app")
        seen: dict[str, int] = {"/conversations/c/messages": 0, "/conversations/c/context": 0}
        # The first use of each pooled connection finds it closed (a connection failure, also a
        # 503); once those are gone the pools try to connect and PostgreSQL says "too many
        # connections". Every answer on the way is a 503.
        for _ in range(20):
            assert_unavailable(await api.client.post("/conversations/c/messages", json=round_body(1)))
            assert_unavailable(await api.client.get("/conversations/c/context"))
            for path in seen:
                seen[path] = sum(
                    "TooManyConnectionsError" in r.getMessage() and path in r.getMessage()
                    for r in caplog.records
                )
            if all(seen.values()):
                break
        assert all(seen.values()), seen
    finally:
        for conn in held:
            await conn.close()

    async def recovered() -> bool:
        post = await api.client.post("/conversations/c/messages", json=round_body(2))
        context = await api.client.get("/conversations/c/context")
        return post.status_code == 201 and context.status_code == 200

    await eventually(recovered, what="requests to succeed once connections are free again")


# ---- a pool checkout timeout is a 503 that keeps the (healthy) pool ----------------------------


async def test_pool_exhaustion_is_a_503_that_keeps_the_pool(
    make_app: AppFactory, database_url: str, db: asyncpg.Connection
) -> None:
    api = await make_app(
        MEMORY_SUMMARIZER="offline",
        DATABASE_POOL_SIZE=1,
        DATABASE_MAX_OVERFLOW=0,
        DATABASE_READ_POOL_SIZE=1,
        DATABASE_CONNECT_TIMEOUT_SECONDS=0.5,
        MEMORY_REAPER_INTERVAL_SECONDS=3600,
    )
    assert (await api.client.post("/conversations/p/messages", json=round_body(0))).status_code == 201
    engine = api.app.state.engine
    pool = engine.pool
    backends = await app_backends(db, database_url)

    # A writer blocks on a lock, holding the only connection; the next one cannot check one out.
    lock = db.transaction()
    await lock.start()
    await db.execute("LOCK TABLE conversations IN ACCESS EXCLUSIVE MODE")
    blocked = asyncio.create_task(api.client.post("/conversations/p/messages", json=round_body(1)))
    try:

        async def waiting_on_lock() -> bool:
            n = await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'memory-service' "
                "AND wait_event_type = 'Lock'"
            )
            return bool(n >= 1)

        await eventually(waiting_on_lock, what="the first writer to wait on the lock")
        started = time.monotonic()
        assert_unavailable(await api.client.post("/conversations/p/messages", json=round_body(2)))
        assert time.monotonic() - started < 3
    finally:
        await lock.rollback()
    assert (await blocked).status_code == 201

    # Nothing was thrown away: same pool, same server sessions, and it serves at once.
    assert engine.pool is pool
    assert (await api.client.post("/conversations/p/messages", json=round_body(3))).status_code == 201
    assert await app_backends(db, database_url) == backends


# ---- which errors are "the database is unavailable" -------------------------------------------


async def closed_port() -> int:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port: int = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    return port


async def test_only_database_failures_are_503s(make_app: AppFactory, plain_database_url: str) -> None:
    """A connection refused or a missing socket inside the driver is a 503; the same OSError
    classes raised by anything else are bugs (500); a timeout is a 503 that keeps the pool; a
    deadlock is a 503 (retrying the request succeeds)."""
    api = await make_app(MEMORY_SUMMARIZER="offline")
    port = await closed_port()

    async def refused() -> None:
        await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{port}/x", timeout=2)

    async def no_socket() -> None:
        await asyncpg.connect("postgresql://postgres@/x?host=/nonexistent-memory-test-dir", timeout=2)

    async def missing_file() -> None:
        open("/nonexistent-memory-test-dir/settings.json").close()  # noqa: ASYNC230

    async def missing_file_in_a_transaction() -> None:
        async with api.app.state.engine.begin():
            open("/nonexistent-memory-test-dir/settings.json").close()  # noqa: ASYNC230

    async def refused_elsewhere() -> None:
        raise ConnectionRefusedError(111, "Connect call failed (not the database)")

    async def timeout() -> None:
        await asyncio.wait_for(asyncio.Event().wait(), 0.01)

    async def protocol_broken() -> None:
        # What asyncpg raises from a statement on a connection the server is shutting down.
        raise asyncpg.exceptions.InternalClientError()

    async def deadlock() -> None:
        # Two sessions, each holding the lock the other waits for: PostgreSQL aborts one.
        first = await asyncpg.connect(plain_database_url)
        second = await asyncpg.connect(plain_database_url)
        try:
            async with first.transaction(), second.transaction():
                await first.execute("SELECT pg_advisory_xact_lock(14001)")
                await second.execute("SELECT pg_advisory_xact_lock(14002)")
                results = await asyncio.gather(
                    first.execute("SELECT pg_advisory_xact_lock(14002)"),
                    second.execute("SELECT pg_advisory_xact_lock(14001)"),
                    return_exceptions=True,
                )
                raise next(r for r in results if isinstance(r, BaseException))
        finally:
            await first.close()
            await second.close()

    cases = {
        "refused": (refused, 503),
        "deadlock": (deadlock, 503),
        "no-socket": (no_socket, 503),
        "missing-file": (missing_file, 500),
        "missing-file-in-a-transaction": (missing_file_in_a_transaction, 500),
        "refused-elsewhere": (refused_elsewhere, 500),
        "timeout": (timeout, 503),
        "protocol-broken": (protocol_broken, 503),
    }
    for name, (route, _) in cases.items():
        api.app.add_api_route(f"/test-errors/{name}", route)
    engine = api.app.state.engine
    pool = engine.pool
    transport = httpx.ASGITransport(app=api.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://memory.test") as client:
        for name, (_, status) in cases.items():
            response = await client.get(f"/test-errors/{name}")
            assert response.status_code == status, (name, response.text)
            if status == 503:
                assert_unavailable(response)
    assert engine.pool is pool


# ---- the connection budget under a burst -------------------------------------------------------


async def test_connection_budget_holds_under_a_burst(
    make_app: AppFactory, database_url: str, db: asyncpg.Connection
) -> None:
    """Pool 3 + overflow 1 + read pool 2 + the LISTEN connection = 7 connections at most, whatever
    the load; what does not get a connection in time is a 503, never a 500."""
    settings = {
        "DATABASE_POOL_SIZE": 3,
        "DATABASE_MAX_OVERFLOW": 1,
        "DATABASE_READ_POOL_SIZE": 2,
        "DATABASE_CONNECT_TIMEOUT_SECONDS": 0.5,
    }
    api = await make_app(MEMORY_SUMMARIZER="offline", **settings)
    budget = connection_budget(api.app.state.settings)
    assert budget == 3 + 1 + 2 + 1
    for n in range(2):
        assert (await api.client.post("/conversations/b/messages", json=round_body(n))).status_code == 201

    most = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal most
        watcher = await asyncpg.connect(_plain(database_url))
        try:
            while not done.is_set():
                most = max(most, len(await app_backends(watcher, database_url)))
                await asyncio.sleep(0.002)
        finally:
            await watcher.close()

    statuses: list[int] = []

    async def call(i: int) -> None:
        if i % 2:
            response = await api.client.get("/conversations/b/context")
        else:
            response = await api.client.post("/conversations/b/messages", json=round_body(i))
        statuses.append(response.status_code)

    watcher = asyncio.create_task(watch())
    # Every request blocks on the lock while holding its connection, so both pools fill up and
    # the rest wait for a connection until they time out.
    lock = db.transaction()
    await lock.start()
    await db.execute("LOCK TABLE conversations IN ACCESS EXCLUSIVE MODE")
    calls = [asyncio.create_task(call(i)) for i in range(40)]
    stalled = False
    try:

        async def the_rest_answered() -> bool:
            return len(statuses) >= len(calls) - budget

        await eventually(the_rest_answered, within=10, what="the requests without a connection to answer")
    except AssertionError:
        stalled = True  # waiting for a connection without a bound: measure the rest anyway
    finally:
        await lock.rollback()
    await asyncio.gather(*calls)
    # And once more without the lock: a plain burst larger than the pools.
    await asyncio.gather(*(call(i) for i in range(40)))
    done.set()
    await watcher

    print(f"burst: at most {most} connections (budget {budget}); statuses {sorted(set(statuses))}")
    assert not stalled, "requests waited for a connection past DATABASE_CONNECT_TIMEOUT_SECONDS"
    assert set(statuses) <= {200, 201, 503}, statuses
    assert 503 in statuses and 200 in statuses and 201 in statuses
    assert 0 < most <= budget, most


# ---- message content stays out of logs and stored errors ---------------------------------------

SECRET = "s3cr3t-" + uuid.uuid4().hex


def leaked(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Log records (message, or traceback when one is attached) that contain the secret."""
    return [
        f"{r.name}: {r.getMessage()[:300]}"
        for r in caplog.records
        if SECRET in r.getMessage() or (r.exc_info and SECRET in caplog.handler.format(r))
    ]


async def test_message_content_stays_out_of_logs_and_errors(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """At DEBUG, with SQLAlchemy's SQL logging on, a model that echoes the content (with a NUL
    and an unpaired surrogate, which PostgreSQL cannot store) and a gateway that echoes the
    request in its error message: the content appears in no log record and no memory.error."""
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")
    api = await make_app()
    llm.hold = True
    for n in range(3):
        response = await api.client.post("/conversations/priv/messages", json=round_body(n, f"{SECRET} #{n}"))
        assert response.status_code == 201
    await asyncio.to_thread(llm.wait_for_calls, 1)
    llm.release(0, answer=f"The user said {SECRET}\x00 and \ud800.")
    await api.idle()
    llm.hold = False
    llm.fail_next(1, status=400, message=f"invalid request: messages[1].content={SECRET!r}")
    response = await api.client.post("/conversations/priv/messages", json=round_body(3, f"{SECRET} #3"))
    assert response.status_code == 201 and response.json()["summary_due"]
    await api.idle()

    rows = await db.fetch("SELECT status, memory_text, error FROM memory ORDER BY memory_id")
    assert [r["status"] for r in rows] == ["completed", "failed"], rows
    # The model's text is kept, minus what PostgreSQL cannot store.
    assert rows[0]["memory_text"] == f"The user said {SECRET} and \ufffd."
    error = rows[1]["error"]
    assert "BadRequestError" in error and "400" in error, error
    assert SECRET not in error, error
    assert not leaked(caplog)


async def test_database_errors_are_500s_that_log_no_content(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A database error that is no outage (here a CHECK violation, whose DETAIL quotes the
    row) is a plain 500; the log, even at DEBUG, names the error and where it happened, never
    the values, and SQLAlchemy's SQL log hides the parameters."""
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")
    api = await make_app(MEMORY_SUMMARIZER="offline")

    async def failing_insert() -> None:
        async with api.app.state.engine.begin() as conn:
            await conn.execute(text("CREATE TEMP TABLE notes (body text, n int CHECK (n > 0))"))
            await conn.execute(text("INSERT INTO notes VALUES (:body, 0)"), {"body": SECRET})

    api.app.add_api_route("/test-errors/check", failing_insert)
    response = await api.client.get("/test-errors/check")
    assert response.status_code == 500
    assert {k: v for k, v in response.json().items() if k != "request_id"} == {
        "detail": "internal error",
        "code": "internal_error",
    }
    logged = [r.getMessage() for r in caplog.records if r.name == "app"]
    assert any("CheckViolationError" in m and "23514" in m and "failing_insert" in m for m in logged), logged
    assert not leaked(caplog)
