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
from sqlalchemy.engine import make_url

from tests.fakellm import FakeLLM
from tests.integration.conftest import Launch, eventually
from tests.integration.servers import free_port

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
    tmp_path.chmod(0o777)
    target = make_url(database_url)
    port = free_port()
    config = tmp_path / "pgbouncer.ini"
    config.write_text(
        f"""
[databases]
{target.database} = host={target.host or "127.0.0.1"} port={target.port or 5432} user={target.username}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 2
max_client_conn = 200
logfile = {tmp_path / "pgbouncer.log"}
pidfile = {tmp_path / "pgbouncer.pid"}
"""
    )
    command = ["pgbouncer", str(config)]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root: it switches to postgres
        command[1:1] = ["-u", "postgres"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = target.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
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
    yield url
    process.terminate()
    process.wait(10)
    shutil.rmtree(tmp_path, ignore_errors=True)


async def _ping(url: str) -> None:
    conn = await asyncpg.connect(url.replace("+asyncpg", ""), statement_cache_size=0)
    await conn.close()


async def test_two_replicas_through_pgbouncer_transaction_mode(
    pgbouncer: str, launch: Launch, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    settings = {"DATABASE_URL": pgbouncer, "DATABASE_PGBOUNCER": "true", "DATABASE_POOL_SIZE": "4"}
    replicas = [launch(**settings), launch(**settings)]
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
        assert await db.fetchval("SELECT count(*) FROM messages") == 12 * 10 * 2
        context = (await clients[0].get("/conversations/pgb-0/context")).json()
        assert context["memory"]["end_sequence"] == 19 and context["messages"] == []
    finally:
        for client in clients:
            await client.aclose()
