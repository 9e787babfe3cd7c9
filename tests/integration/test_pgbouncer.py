"""The service behind PgBouncer in transaction pooling mode (Debian's pgbouncer): two replicas
sharing two server connections, concurrent rounds, contexts and summaries, no error. Skipped
where pgbouncer is not installed."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from sqlalchemy.engine import URL, make_url

from tests.fakellm import FakeLLM
from tests.integration.conftest import Launch, eventually
from tests.integration.servers import free_port
from tests.integration.test_events import post_round, stream

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("pgbouncer") is None, reason="pgbouncer is not installed"),
]


@pytest.fixture
def pgbouncer(database_url: str) -> Iterator[str]:
    """A PgBouncer in transaction mode in front of the test database, with a server pool of
    two connections, so that clients keep changing server connections; its URL."""
    # A folder of its own that the postgres user can reach (PgBouncer refuses to run as root).
    tmp_path = Path(tempfile.mkdtemp(prefix="memory-pgbouncer-"))
    try:
        yield from _run_pgbouncer(tmp_path, make_url(database_url))
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _run_pgbouncer(tmp_path: Path, target: URL) -> Iterator[str]:
    tmp_path.chmod(0o777)
    # The embedded server's URL names its socket folder (?host=/tmp/...) and port in its query.
    host = str(target.host or target.query.get("host") or "127.0.0.1")
    port_of_target = target.port or target.query.get("port") or 5432
    port = free_port()
    config = tmp_path / "pgbouncer.ini"
    config.write_text(
        f"""
[databases]
{target.database} = host={host} port={port_of_target} user={target.username}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
idle_transaction_timeout = 60
default_pool_size = 2
max_client_conn = 200
logfile = {tmp_path / "pgbouncer.log"}
pidfile = {tmp_path / "pgbouncer.pid"}
"""
    )
    command = ["pgbouncer", str(config)]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root: it switches to postgres, or to the owner of the
        # socket folder it must reach (the embedded server's data folder, 0700).
        user = Path(host).owner() if host.startswith("/") else "postgres"
        command[1:1] = ["-u", user]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = target.set(host="127.0.0.1", port=port, query={}).render_as_string(hide_password=False)
    deadline = time.monotonic() + 10
    while True:
        try:
            asyncio.run(_ping(url))
            break
        except (OSError, asyncpg.PostgresError) as exc:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                log = tmp_path / "pgbouncer.log"
                raise RuntimeError(
                    f"pgbouncer did not start: {log.read_text() if log.exists() else ''}"
                ) from exc
            time.sleep(0.05)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(10)


async def _ping(url: str) -> None:
    conn = await asyncpg.connect(url.replace("+asyncpg", ""), statement_cache_size=0)
    await conn.close()


async def test_two_replicas_through_pgbouncer_transaction_mode(
    pgbouncer: str, database_url: str, launch: Launch, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    settings = {
        "DATABASE_URL": pgbouncer,
        "DATABASE_PGBOUNCER": "true",
        "DATABASE_POOL_SIZE": "4",
        # LISTEN (and the start-up migration) on PostgreSQL itself.
        "DATABASE_DIRECT_URL": database_url,
        # No heartbeat within the test: an event must come by its NOTIFY.
        "MEMORY_EVENTS_HEARTBEAT_SECONDS": "300",
    }
    replicas = [launch(**settings), launch(**settings)]
    # An event stream on one replica hears a round posted on the other.
    async with stream(replicas[0].url, "heard") as watching:
        assert watching.status == 200
        await post_round(replicas[1].url, "heard", 0)
        events = await watching.until(2, within=10)
    assert [e["type"] for e in events] == ["entry:added", "entry:added"]
    llm.latency_seconds = 0.01
    statuses: list[int] = []

    async def client_work(client: httpx.AsyncClient, cid: str) -> None:
        for n in range(10):
            body = {
                "messages": [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": f"a{n}"}]
            }
            posted = await client.post(
                f"/conversations/{cid}/messages", json=body, headers={"Idempotency-Key": f"{cid}-{n}"}
            )
            context = await client.get(f"/conversations/{cid}/context")
            listed = await client.get(f"/conversations/{cid}/messages")
            statuses.extend((posted.status_code, context.status_code, listed.status_code))

    clients = [httpx.AsyncClient(base_url=r.url, timeout=30) for r in replicas]
    try:
        await asyncio.gather(*(client_work(clients[i % 2], f"pgb-{i}") for i in range(12)))
        assert set(statuses) == {200, 201}, sorted(set(statuses))

        async def summarized() -> bool:
            due = await db.fetchval("SELECT count(*) FROM conversations WHERE summary_due_at IS NOT NULL")
            busy = await db.fetchval("SELECT count(*) FROM memory WHERE status = 'processing'")
            return bool(due == 0 and busy == 0)

        await eventually(summarized, within=30, what="every due summary to complete through PgBouncer")
        assert await db.fetchval("SELECT count(*) FROM memory WHERE status = 'failed'") == 0
        assert (
            await db.fetchval("SELECT count(*) FROM messages WHERE conversation_id LIKE 'pgb-%'")
            == 12 * 10 * 2
        )
        context = (await clients[0].get("/conversations/pgb-0/context")).json()
        assert context["memory"]["end_sequence"] == 19 and context["messages"] == []
    finally:
        for client in clients:
            await client.aclose()
