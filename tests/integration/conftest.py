"""Integration fixtures: a clean database per test, the fake LLM, and the app over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI

from app.main import create_app
from app.memory.service import MemoryService
from app.repositories import work
from app.settings import Settings
from tests.fakellm import FakeLLM
from tests.integration.servers import ServerProcess


@pytest.fixture(autouse=True)
async def clean_database(plain_database_url: str) -> None:
    """Background tasks use their own connections, so tests are isolated by truncation
    (RESTART IDENTITY makes memory ids start at 1, as in the seeds' tables)."""
    conn = await asyncpg.connect(plain_database_url)
    try:
        # A server process shared by a module's tests may still be finishing a summary, whose
        # writes lock these tables in another order: PostgreSQL aborts one side of the deadlock.
        for attempt in range(5):
            try:
                await conn.execute(
                    "TRUNCATE conversations, messages, memory, idempotency_keys, events, webhooks, "
                    "webhook_deliveries, users, user_memory RESTART IDENTITY CASCADE"
                )
                break
            except asyncpg.DeadlockDetectedError:
                if attempt == 4:
                    raise
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def fake_llm_server() -> Iterator[FakeLLM]:
    server = FakeLLM().start()
    yield server
    server.stop()


@pytest.fixture
def llm(fake_llm_server: FakeLLM) -> Iterator[FakeLLM]:
    fake_llm_server.reset()
    yield fake_llm_server
    fake_llm_server.reset()


@pytest.fixture
async def db(plain_database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A direct connection for asserting on the tables."""
    conn = await asyncpg.connect(plain_database_url)
    yield conn
    await conn.close()


def settings_for(database_url: str, llm: FakeLLM, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "DATABASE_URL": database_url,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": llm.base_url,
        "MEMORY_SUMMARIZER": "openai",
        "MEMORY_LLM_MAX_RETRIES": 0,
        "MEMORY_LLM_TIMEOUT_SECONDS": 30,
        "MEMORY_SHUTDOWN_GRACE_SECONDS": 0,
        "DATABASE_POOL_SIZE": 5,
        "DATABASE_MAX_OVERFLOW": 5,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


class App:
    """The app running in-process with its lifespan, reached through a real HTTP client API."""

    def __init__(self, app: FastAPI, client: httpx.AsyncClient) -> None:
        self.app = app
        self.client = client

    @property
    def service(self) -> MemoryService:
        service: MemoryService = self.app.state.service
        return service

    async def post_round(self, conversation_id: str, n: int, **kwargs: Any) -> dict[str, Any]:
        response = await self.client.post(
            f"/conversations/{conversation_id}/messages",
            json={
                "messages": [
                    {"role": "user", "content": f"Round {n} question. Tell me about topic {n}."},
                    {"role": "assistant", "content": f"Round {n} answer. Topic {n} explained."},
                ]
            },
            **kwargs,
        )
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        return body

    async def context(self, conversation_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/conversations/{conversation_id}/context")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def idle(self) -> None:
        """Wait until no summary work is due and none runs (every due summary has completed or
        failed)."""
        await asyncio.wait_for(self.service.drain(), timeout=30)

    async def settle(self) -> None:
        """Wait until no due work is waiting for a runner: every summary the rounds so far made
        due has started (or its policy found nothing to do)."""
        service = self.service

        async def claimed() -> bool:
            async with service.engine.connect() as conn:
                waiting = await work.candidates(
                    conn, limit=1, max_attempts=service.retries.max_attempts, backoff=service.retries.backoff
                )
            return not waiting

        await eventually(claimed, what="due summary work to be claimed")


AppFactory = Callable[..., Awaitable[App]]


@asynccontextmanager
async def running_app(settings: Settings, headers: dict[str, str] | None = None) -> AsyncIterator[App]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://memory.test", headers=headers
        ) as client:
            yield App(app, client)


@pytest.fixture
async def make_app(database_url: str, llm: FakeLLM) -> AsyncIterator[AppFactory]:
    """Start apps with setting overrides; all are shut down at the end of the test."""
    stack: list[Any] = []

    async def factory(headers: dict[str, str] | None = None, **overrides: Any) -> App:
        cm = running_app(settings_for(database_url, llm, **overrides), headers)
        stack.append(cm)
        return await cm.__aenter__()

    yield factory
    llm.release_all()
    for cm in reversed(stack):
        await cm.__aexit__(None, None, None)


@pytest.fixture
async def api(make_app: AppFactory) -> App:
    return await make_app()


async def eventually(
    check: Callable[[], Awaitable[bool]], *, within: float = 15.0, what: str = "condition"
) -> None:
    """Wait until ``check()`` is true, polling; fails with ``what`` after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


Launch = Callable[..., ServerProcess]


@pytest.fixture
def launch(database_url: str, llm: FakeLLM, tmp_path: Path) -> Iterator[Launch]:
    servers: list[ServerProcess] = []

    def start(*, kind: type[ServerProcess] = ServerProcess, **env: str) -> ServerProcess:
        """Start ``kind`` (the HTTP service, or WorkerProcess) with these settings."""
        values = {
            "DATABASE_URL": database_url,
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": llm.base_url,
            "MEMORY_SUMMARIZER": "openai",
            "MEMORY_LLM_MAX_RETRIES": "0",
            "LOG_LEVEL": "INFO",
            **env,
        }
        server = kind(values, tmp_path / f"server-{len(servers)}.log")
        servers.append(server)
        return server.wait_ready()

    yield start
    llm.release_all()
    for server in servers:
        server.stop()


# Keys of the service that the client and adapter tests start (tests/integration/test_client.py).
TENANT_KEY = "tenant-a-key-0123456789"
OTHER_TENANT_KEY = "tenant-b-key-0123456789"
ADMIN_KEY = "admin-key-0123456789abc"


@pytest.fixture(scope="module")
def service(
    database_url: str, fake_llm_server: FakeLLM, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One `memory-service serve` for a module of client tests (each test's database is still
    truncated by clean_database), with API keys for two tenants and the admin key."""
    server = ServerProcess(
        {
            "DATABASE_URL": database_url,
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": fake_llm_server.base_url,
            "MEMORY_SUMMARIZER": "openai",
            "MEMORY_LLM_MAX_RETRIES": "0",
            "MEMORY_API_KEYS": f"a:{TENANT_KEY},b:{OTHER_TENANT_KEY}",
            "MEMORY_ADMIN_KEY": ADMIN_KEY,
        },
        tmp_path_factory.mktemp("service") / "server.log",
    )
    try:
        yield server.wait_ready()
    finally:
        fake_llm_server.release_all()
        server.stop()
