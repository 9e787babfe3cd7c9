"""The HTTP edge, in-process: body limits before parsing, API keys before the body, request ids,
JSON 500s, docs access and no trailing-slash redirects. (Socket-level behaviour: test_edge_server.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import orjson
import pytest

from tests.integration.conftest import App, AppFactory

ROUND = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
ACME = "acme-key-0123456789"
LIMIT = 2048


class Body:
    """A request body streamed in chunks, counting how many chunks the app pulled."""

    def __init__(self, chunk: bytes, count: int) -> None:
        self.chunk = chunk
        self.count = count
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.count):
            self.pulled += 1
            yield self.chunk


def round_of_size(size: int) -> bytes:
    """A valid round whose JSON is exactly ``size`` bytes."""
    empty = orjson.dumps({"messages": [{"role": "user", "content": ""}]})
    body = orjson.dumps({"messages": [{"role": "user", "content": "x" * (size - len(empty))}]})
    assert len(body) == size
    return body


def assert_too_large(response: Any) -> None:
    assert response.status_code == 413, response.text
    body = response.json()
    assert body["code"] == "payload_too_large"
    assert str(LIMIT) in body["detail"] and "MEMORY_MAX_BODY_BYTES" in body["detail"]


async def test_a_declared_oversized_body_is_413_before_it_is_read(
    make_app: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_MAX_BODY_BYTES=LIMIT)
    body = Body(b"x" * 1024, 64)
    response = await api.client.post(
        "/conversations/big/messages",
        content=body,
        headers={"Content-Length": str(64 * 1024), "Content-Type": "application/json"},
    )
    assert_too_large(response)
    assert body.pulled == 0
    assert await db.fetchval("SELECT count(*) FROM conversations") == 0


async def test_a_chunked_body_is_cut_off_at_the_limit(make_app: AppFactory, db: asyncpg.Connection) -> None:
    api = await make_app(MEMORY_MAX_BODY_BYTES=LIMIT)
    body = Body(b" " * 512, 1000)  # 500 KB, no Content-Length: Transfer-Encoding: chunked
    response = await api.client.post(
        "/conversations/big/messages", content=body, headers={"Content-Type": "application/json"}
    )
    assert_too_large(response)
    assert body.pulled <= LIMIT // 512 + 1
    assert await db.fetchval("SELECT count(*) FROM conversations") == 0


async def test_a_body_of_exactly_the_limit_is_accepted(make_app: AppFactory) -> None:
    api = await make_app(MEMORY_MAX_BODY_BYTES=LIMIT)
    exact = round_of_size(LIMIT)
    declared = await api.client.post(
        "/conversations/edge/messages", content=exact, headers={"Content-Type": "application/json"}
    )
    assert declared.status_code == 201, declared.text
    chunked = await api.client.post(
        "/conversations/edge/messages",
        content=Body(exact, 1),
        headers={"Content-Type": "application/json"},
    )
    assert chunked.status_code == 201, chunked.text
    over = await api.client.post(
        "/conversations/edge/messages",
        content=round_of_size(LIMIT + 1),
        headers={"Content-Type": "application/json"},
    )
    assert_too_large(over)


async def test_an_unauthenticated_request_is_401_before_its_body_is_read(
    make_app: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_API_KEYS=f"acme:{ACME}", MEMORY_MAX_BODY_BYTES=LIMIT)
    for headers in ({}, {"X-API-Key": "wrong-key-000000000"}, {"Authorization": "Bearer nope"}):
        body = Body(orjson.dumps(ROUND), 1)
        response = await api.client.post(
            "/conversations/a/messages",
            content=body,
            headers={"Content-Type": "application/json", **headers},
        )
        assert response.status_code == 401, response.text
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert response.json()["code"] == "unauthorized"
        assert body.pulled == 0, headers
    # Without a key, an oversized body is a 401 too: nothing about the service is told.
    big = Body(b"x" * 1024, 64)
    response = await api.client.post(
        "/conversations/a/messages", content=big, headers={"Content-Length": str(64 * 1024)}
    )
    assert response.status_code == 401 and big.pulled == 0
    assert await db.fetchval("SELECT count(*) FROM conversations") == 0

    # Health checks stay open; a good key gets through, with the tenant it maps to.
    assert (await api.client.get("/healthz")).status_code == 200
    assert (await api.client.get("/readyz")).status_code == 200
    for headers in ({"X-API-Key": ACME}, {"Authorization": f"Bearer {ACME}"}):
        ok = await api.client.post("/conversations/a/messages", json=ROUND, headers=headers)
        assert ok.status_code == 201, ok.text
    assert await db.fetchval("SELECT tenant_id FROM conversations WHERE conversation_id = 'a'") == "acme"


def broken_route(api: App) -> None:
    """A component that fails in a way nothing expects (registered on this test's app only)."""

    async def broken() -> None:
        quoted = "user wrote: my password is hunter2"
        raise RuntimeError(quoted)

    api.app.add_api_route("/broken", broken, methods=["GET"])


async def test_an_unexpected_exception_is_a_json_500_with_the_request_id(
    api: App, caplog: pytest.LogCaptureFixture
) -> None:
    broken_route(api)
    caplog.set_level(logging.DEBUG)
    response = await api.client.get("/broken", headers={"X-Request-ID": "req-42.a:b"})
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "detail": "internal error",
        "code": "internal_error",
        "request_id": "req-42.a:b",
    }
    assert response.headers["X-Request-ID"] == "req-42.a:b"
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    logged = record.getMessage()
    assert "req-42.a:b" in logged and "GET /broken" in logged
    # The traceback, down to the failing line, but not the error's message: it may quote request
    # data, and message content is never logged, at DEBUG either.
    assert "Traceback" in logged and "in broken" in logged and logged.endswith("builtins.RuntimeError")
    assert "hunter2" not in logged

    # Without an id (or with an insane one) the service makes one up, the same in body and header.
    for headers in ({}, {"X-Request-ID": "x" * 129}, {"X-Request-ID": "bad\tid"}):
        response = await api.client.get("/broken", headers=headers)
        generated = response.headers["X-Request-ID"]
        assert response.json()["request_id"] == generated
        assert generated not in (headers.get("X-Request-ID"), "")
        assert len(generated) <= 128 and generated.isprintable()
    # And the app keeps serving.
    assert (await api.client.get("/healthz")).status_code == 200


async def test_every_response_carries_a_request_id(make_app: AppFactory) -> None:
    api = await make_app(MEMORY_API_KEYS=f"acme:{ACME}", MEMORY_MAX_BODY_BYTES=LIMIT)
    key = {"X-API-Key": ACME}
    requests: list[tuple[str, str, dict[str, str], bytes | None]] = [
        ("GET", "/healthz", {}, None),
        ("GET", "/conversations", key, None),
        ("GET", "/conversations", {}, None),  # 401
        ("GET", "/conversations/nope", key, None),  # 404
        ("DELETE", "/healthz", key, None),  # 405
        ("POST", "/conversations/c/messages", key, b"{"),  # 422
        ("POST", "/conversations/c/messages", key, b"x" * (LIMIT + 1)),  # 413
    ]
    seen = set()
    for method, path, headers, content in requests:
        response = await api.client.request(method, path, headers=headers, content=content)
        seen.add(response.headers["X-Request-ID"])
        echoed = await api.client.request(
            method, path, headers={**headers, "X-Request-ID": "trace-1"}, content=content
        )
        assert echoed.headers["X-Request-ID"] == "trace-1", (method, path, echoed.status_code)
    assert len(seen) == len(requests)  # a fresh id per request


@pytest.mark.parametrize(
    ("keys", "docs_public", "anonymous", "with_key"),
    [
        (False, None, 200, 200),
        (False, True, 200, 200),
        (False, False, 404, 404),
        (True, None, 401, 200),
        (True, False, 401, 200),
        (True, True, 200, 200),
    ],
)
async def test_docs_follow_the_api_keys_unless_configured(
    make_app: AppFactory, keys: bool, docs_public: bool | None, anonymous: int, with_key: int
) -> None:
    overrides: dict[str, Any] = {"MEMORY_DOCS_PUBLIC": docs_public}
    if keys:
        overrides["MEMORY_API_KEYS"] = f"acme:{ACME}"
    api = await make_app(**overrides)
    for path in ("/docs", "/redoc", "/openapi.json"):
        response = await api.client.get(path)
        assert response.status_code == anonymous, (path, response.text)
        if anonymous != 200:
            assert response.headers["content-type"] == "application/json"
        assert (await api.client.get(path, headers={"X-API-Key": ACME})).status_code == with_key
    assert (await api.client.get("/healthz")).status_code == 200


@pytest.mark.parametrize(
    "path", ["/conversations/x/context/", "/conversations/", "/healthz/", "/ops/memories/failed/"]
)
async def test_a_trailing_slash_is_a_404_not_a_redirect(api: App, path: str) -> None:
    response = await api.client.get(path, headers={"Host": "evil.example"})
    assert response.status_code == 404
    assert "location" not in response.headers
    assert response.json() == {"detail": "Not Found", "code": "not_found"}


async def test_huge_lists_and_unknown_fields_are_refused_at_once_with_a_small_answer(api: App) -> None:
    """A 3 MB body of a million empty messages once produced a 234 MB list of errors."""
    million = b'{"messages": [' + b",".join([b"{}"] * 1_000_000) + b"]}"
    response = await api.client.post(
        "/conversations/amp/messages", content=million, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413, response.text[:300]
    assert "MEMORY_MAX_MESSAGES_PER_REQUEST" in response.json()["detail"] and len(response.content) < 200

    extra = {"role": "user", "content": "x", **{f"k{i}": 1 for i in range(300_000)}}
    response = await api.client.post("/conversations/amp/messages", json={"messages": [extra]})
    assert response.status_code == 422 and len(response.content) < 1000
    [error] = response.json()["detail"]
    assert "unknown fields: 'k0', 'k1', 'k2', 'k3', 'k4' and 299995 more" in error["msg"]

    many = {"messages": [{"content": "x"}] * 50}  # 50 errors: role missing in each
    detail = (await api.client.post("/conversations/amp/messages", json=many)).json()["detail"]
    assert len(detail) == 21 and detail[-1]["msg"] == "and 30 more errors"


async def test_a_head_over_16_kib_is_a_431_even_when_it_arrives_whole(api: App) -> None:
    response = await api.client.get("/conversations/x/context", headers={"X-Pad": "p" * 17_000})
    assert response.status_code == 431
    assert response.json()["code"] == "header_too_large"
    response = await api.client.get("/conversations/x/context?pad=" + "p" * 17_000)
    assert response.status_code == 431


async def test_a_body_that_stalls_is_a_408(make_app: AppFactory) -> None:
    api = await make_app(MEMORY_HEADER_TIMEOUT_SECONDS=0.2)

    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"messages": ['
        await asyncio.sleep(2)
        yield b"]}"

    response = await api.client.post(
        "/conversations/slow/messages", content=trickle(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 408, response.text
    assert response.json()["code"] == "request_timeout"
    assert "MEMORY_HEADER_TIMEOUT_SECONDS" in response.json()["detail"]
