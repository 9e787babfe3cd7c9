"""Webhooks (issue 12) against a real local HTTP receiver that fails, times out and recovers:
signed bodies, at-least-once delivery with the event id, backoff, dead letters and their retry."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import asyncpg
import orjson
import pytest

from app.repositories.webhooks import MAX_PER_TENANT
from app.webhooks import SIGNATURE_HEADER, verify
from tests.integration.conftest import App, AppFactory, eventually

FAST = {
    "MEMORY_WEBHOOK_TIMEOUT_SECONDS": 0.5,
    "MEMORY_WEBHOOK_BACKOFF_SECONDS": 0.05,
    "MEMORY_WEBHOOK_BACKOFF_MAX_SECONDS": 0.2,
    "MEMORY_WEBHOOK_MAX_ATTEMPTS": 3,
    "MEMORY_WEBHOOK_INTERVAL_SECONDS": 0.05,
    "MEMORY_SUMMARIZE_AFTER_SEQ": 1000,
}


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int  # the status sent (0: kept waiting past the sender's timeout)

    @property
    def json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = orjson.loads(self.body)
        return parsed


class Receiver:
    """A webhook endpoint: answers 200, or ``status`` to the next ``failures`` requests, or
    keeps the next ``stalls`` requests waiting until released (past the sender's timeout)."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.failures = 0
        self.status = 500
        self.stalls = 0
        self._release = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver._lock:
                    if receiver.stalls:
                        receiver.stalls -= 1
                        answer = 0
                    elif receiver.failures:
                        receiver.failures -= 1
                        answer = receiver.status
                    else:
                        answer = 200
                    receiver.requests.append(Received(dict(self.headers.items()), body, answer))
                if answer == 0:
                    receiver._release.wait(30)
                    answer = 200
                self.send_response(answer)
                self.send_header("content-length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def stop(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.stop()


async def subscribe(api: App, url: str) -> dict[str, Any]:
    response = await api.client.post("/webhooks", json={"url": url})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    assert created["secret"].startswith("whsec_")
    return created


async def statuses(db: asyncpg.Connection) -> list[tuple[str, int, str, int]]:
    rows = await db.fetch(
        "SELECT conversation_id, event_id, status, attempts FROM webhook_deliveries "
        "ORDER BY conversation_id, event_id"
    )
    return [tuple(r) for r in rows]


async def all_delivered(db: asyncpg.Connection, count: int) -> None:
    async def check() -> bool:
        return [s for _, _, s, _ in await statuses(db)] == ["delivered"] * count

    await eventually(check, what=f"{count} deliveries")


async def test_events_are_delivered_signed_once_each(
    make_app: AppFactory, receiver: Receiver, db: asyncpg.Connection
) -> None:
    api = await make_app(**FAST)
    webhook = await subscribe(api, receiver.url)
    listed = (await api.client.get("/webhooks")).json()
    assert listed == [{key: webhook[key] for key in ("webhook_id", "url", "created_at")}]
    await api.post_round("hooked", 0)
    refused = await api.client.post("/conversations/hooked/messages", json={"messages": [{"role": "x"}]})
    assert refused.status_code == 422
    await all_delivered(db, 2)
    # Deliveries go concurrently: a receiver orders them by event_id (README, Webhooks).
    got = sorted(receiver.requests, key=lambda r: int(r.json["event_id"]))
    assert [r.json["id"] for r in got] == ["hooked:1", "hooked:2"]
    first = got[0]
    assert first.json["type"] == "entry:added" and first.json["data"]["sequence"] == 0
    assert verify(webhook["secret"], first.headers[SIGNATURE_HEADER], first.body, now=time.time())
    assert not verify("whsec_other", first.headers[SIGNATURE_HEADER], first.body, now=time.time())
    assert not verify(webhook["secret"], first.headers[SIGNATURE_HEADER], first.body + b" ", now=time.time())
    assert not verify(webhook["secret"], first.headers[SIGNATURE_HEADER], first.body, now=time.time() + 600)

    # Deleted, the endpoint gets nothing more.
    assert (await api.client.delete(f"/webhooks/{webhook['webhook_id']}")).status_code == 204
    assert (await api.client.delete(f"/webhooks/{webhook['webhook_id']}")).status_code == 404
    await api.post_round("hooked", 1)
    assert await statuses(db) == []


async def test_failures_and_timeouts_are_retried_until_the_receiver_recovers(
    make_app: AppFactory, receiver: Receiver, db: asyncpg.Connection
) -> None:
    api = await make_app(**FAST)
    await subscribe(api, receiver.url)
    receiver.failures, receiver.stalls = 1, 1  # the first request stalls, the next gets a 500
    await api.post_round("flaky", 0)
    await all_delivered(db, 2)
    ids = [r.json["id"] for r in receiver.requests]
    # At least once: a retried event comes again with the same id, and each is answered 200 once.
    assert sorted(set(ids)) == ["flaky:1", "flaky:2"]
    assert len(ids) == 4
    assert sorted(r.json["id"] for r in receiver.requests if r.answered == 200) == ["flaky:1", "flaky:2"]
    assert sum(attempts for *_, attempts in await statuses(db)) == 4


async def test_dead_letters_are_listed_and_retried(
    make_app: AppFactory, receiver: Receiver, db: asyncpg.Connection
) -> None:
    api = await make_app(**FAST)
    webhook = await subscribe(api, receiver.url)
    receiver.failures, receiver.status = 6, 503
    await api.post_round("down", 0)

    async def dead() -> bool:
        return [s for _, _, s, _ in await statuses(db)] == ["dead", "dead"]

    await eventually(dead, what="dead deliveries")
    letters = (await api.client.get("/ops/webhooks/dead")).json()
    assert [(d["event_id"], d["attempts"], d["last_error"]) for d in letters] == [
        (2, 3, "HTTP 503"),
        (1, 3, "HTTP 503"),
    ]
    retry = f"/ops/webhooks/{webhook['webhook_id']}/deliveries/down/1/retry"
    assert (await api.client.post(retry)).status_code == 202
    await eventually(
        lambda: _is(statuses(db), [("down", 1, "delivered", 1), ("down", 2, "dead", 3)]),
        what="the retried delivery",
    )
    assert receiver.requests[-1].json["id"] == "down:1" and receiver.requests[-1].answered == 200
    assert (await api.client.post(retry)).status_code == 409
    missing = await api.client.post(f"/ops/webhooks/{webhook['webhook_id']}/deliveries/down/99/retry")
    assert missing.status_code == 404
    assert [d["event_id"] for d in (await api.client.get("/ops/webhooks/dead")).json()] == [2]


async def _is(found: Any, expected: Any) -> bool:
    return bool(await found == expected)


async def test_the_admin_key_sees_and_retries_every_tenants_dead_letters(
    make_app: AppFactory, receiver: Receiver, db: asyncpg.Connection
) -> None:
    keys = {"acme": "acme-key-0123456789", "beta": "beta-key-0123456789"}
    admin = {"X-API-Key": "admin-key-0123456789"}
    api = await make_app(
        **FAST,
        MEMORY_API_KEYS=",".join(f"{tenant}:{key}" for tenant, key in keys.items()),
        MEMORY_ADMIN_KEY=admin["X-API-Key"],
    )
    receiver.failures, receiver.status = 12, 500
    hooks = {}
    for tenant, key in keys.items():
        created = await api.client.post("/webhooks", json={"url": receiver.url}, headers={"X-API-Key": key})
        assert created.status_code == 201, created.text
        hooks[tenant] = created.json()["webhook_id"]
        await api.post_round(f"{tenant}-1", 0, headers={"X-API-Key": key})

    async def dead() -> bool:
        return [s for _, _, s, _ in await statuses(db)] == ["dead"] * 4

    await eventually(dead, what="dead deliveries")
    letters = (await api.client.get("/admin/ops/webhooks/dead", headers=admin)).json()
    assert sorted((d["tenant_id"], d["conversation_id"], d["event_id"]) for d in letters) == [
        ("acme", "acme-1", 1),
        ("acme", "acme-1", 2),
        ("beta", "beta-1", 1),
        ("beta", "beta-1", 2),
    ]
    # A tenant sees its own, without the tenant column; it cannot use the admin view.
    own = (await api.client.get("/ops/webhooks/dead", headers={"X-API-Key": keys["acme"]})).json()
    assert {d["conversation_id"] for d in own} == {"acme-1"} and "tenant_id" not in own[0]
    refused = await api.client.get("/admin/ops/webhooks/dead", headers={"X-API-Key": keys["acme"]})
    assert refused.status_code == 403
    # The admin retries beta's first event; a tenant's key cannot retry another tenant's.
    path = f"/webhooks/{hooks['beta']}/deliveries/beta-1/1/retry"
    assert (await api.client.post(f"/ops{path}", headers={"X-API-Key": keys["acme"]})).status_code == 404
    retried = await api.client.post(f"/admin/ops{path}", headers=admin)
    assert retried.status_code == 202, retried.text
    await eventually(
        lambda: _is(
            statuses(db),
            [
                ("acme-1", 1, "dead", 3),
                ("acme-1", 2, "dead", 3),
                ("beta-1", 1, "delivered", 1),
                ("beta-1", 2, "dead", 3),
            ],
        ),
        what="the retried delivery",
    )
    assert (await api.client.post(f"/admin/ops{path}", headers=admin)).status_code == 409


async def test_the_webhook_limit_holds_under_concurrent_creations(
    make_app: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_app(**FAST)
    answers = await asyncio.gather(
        *(api.client.post("/webhooks", json={"url": f"http://127.0.0.1:9/hook{n}"}) for n in range(25))
    )
    codes = sorted(a.status_code for a in answers)
    assert codes == [201] * MAX_PER_TENANT + [409] * (25 - MAX_PER_TENANT), [a.text for a in answers]
    refused = next(a for a in answers if a.status_code == 409).json()
    assert refused["code"] == "conflict" and str(MAX_PER_TENANT) in refused["detail"]
    assert await db.fetchval("SELECT count(*) FROM webhooks") == MAX_PER_TENANT
    assert len((await api.client.get("/webhooks")).json()) == MAX_PER_TENANT
