"""The HTTP contract: shapes, pagination, deletion, ops, health, and precise 4xx for bad input."""

from __future__ import annotations

import json
import re
from typing import Any

import asyncpg
import pytest

from app.db import head_revision
from tests.fakellm import FakeLLM
from tests.integration.conftest import App, AppFactory

ROUND = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


async def test_post_creates_conversation_and_numbers_messages(api: App) -> None:
    first = await api.client.post("/conversations/conv-1/messages", json=ROUND)
    assert first.status_code == 201
    body = first.json()
    assert body["created"] is True and body["summary_due"] is False
    assert [(m["sequence"], m["role"], m["content"]) for m in body["messages"]] == [
        (0, "user", "hi"),
        (1, "assistant", "hello"),
    ]
    second = await api.client.post(
        "/conversations/conv-1/messages",
        json={"messages": [{"role": "system", "content": "t"}], "metadata": {"app": "x"}},
    )
    assert second.json()["created"] is False
    assert second.json()["messages"][0]["sequence"] == 2

    conv = (await api.client.get("/conversations/conv-1")).json()
    assert conv["message_count"] == 3 and conv["metadata"] == {"app": "x"} and conv["memory_count"] == 0


async def test_context_of_new_conversation_has_all_messages(api: App) -> None:
    await api.client.post("/conversations/c/messages", json=ROUND)
    ctx = await api.context("c")
    assert ctx["memory"] is None and ctx["processing"] is None
    assert [m["sequence"] for m in ctx["messages"]] == [0, 1]
    assert ctx["last_sequence"] == 1 and ctx["memory_lag_messages"] == 2


@pytest.mark.parametrize(
    "path",
    [
        "/conversations/nope/memories",
        "/conversations/nope/messages",
        "/conversations/nope",
        "/ops/conversations/nope/memory-chain",
    ],
)
async def test_unknown_conversation_is_404(api: App, path: str) -> None:
    response = await api.client.get(path)
    assert response.status_code == 404
    assert response.json() == {"detail": "conversation 'nope' not found", "code": "not_found"}
    assert (await api.client.delete("/conversations/nope")).status_code == 404


async def test_a_conversation_never_written_reads_as_an_empty_context(api: App) -> None:
    """An agent's first round needs no special case: 200, no summaries, no messages."""
    response = await api.client.get("/conversations/never/context", params={"context_window": 1000})
    assert response.status_code == 200
    body = response.json()
    assert (body["summaries"], body["messages"], body["last_sequence"], body["memory"]) == (
        [],
        [],
        None,
        None,
    )
    assert body["tokens"] == {"summaries": 0, "messages": 0, "total": 0}
    assert body["context_window"] == {"tokens": 1000, "used_percent": 0.0}
    assert (await api.client.get("/conversations/never")).status_code == 404  # nothing was created


def _nested(levels: int) -> list[Any]:
    """``levels`` arrays, each inside the next."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


async def test_json_content_may_nest_64_levels(api: App) -> None:
    for content in (_nested(64), {"a": _nested(63)}):
        response = await api.client.post(
            "/conversations/deep/messages", json={"messages": [{"role": "user", "content": content}]}
        )
        assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"messages": []}, 422, "at least 1 item"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 422, "role"),
        ({"messages": [{"role": "user", "content": ""}]}, 422, "empty or blank"),
        ({"messages": [{"role": "user", "content": "   "}]}, 422, "blank"),
        ({"messages": [{"role": "user", "content": "a\u0000b"}]}, 422, "NUL"),
        ({"messages": [{"role": "user", "content": 5}]}, 422, "a string, a JSON object or a JSON array"),
        ({"messages": [{"role": "user", "content": "a\udb0eb"}]}, 422, "unpaired surrogate"),
        ({"messages": [{"role": "user", "content": "x", "extra": 1}]}, 422, "unknown fields: 'extra'"),
        ({"messages": "hi"}, 422, "list"),
        ({}, 422, "Field required"),
        (
            {"messages": [{"role": "user", "content": "x"}], "metadata": {"k": "\u0000"}},
            422,
            "string_pattern_mismatch",
        ),
        ({"messages": [{"role": "user", "content": {"v": float("nan")}}]}, 422, "NaN or Infinity"),
        ({"messages": [{"role": "user", "content": [2**64]}]}, 422, "64-bit range"),
        ({"messages": [{"role": "user", "content": {"k\udb0e": 1}}]}, 422, "unpaired surrogate"),
        ({"messages": [{"role": "user", "content": ["\udb0e"]}]}, 422, "unpaired surrogate"),
        ({"messages": [{"role": "user", "content": _nested(65)}]}, 422, "deeper than 64"),
        ({"messages": [{"role": "user", "content": {"a": _nested(64)}}]}, 422, "deeper than 64"),
        ({"messages": [{"role": "user", "content": None}]}, 422, "content"),
        (
            {"messages": [{"role": "user", "content": "x"}], "metadata": {"k": 2**64}},
            422,
            "64 bits",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "metadata": {"k": float("inf")}}, 422, "finite"),
        ({"messages": [{"role": "user", "content": "x", "metadata": {"k": [1]}}]}, 422, "metadata"),
        ({"messages": [{"role": "user", "content": "x" * 101}]}, 413, "limit is 100"),
        ({"messages": [{"role": "user", "content": {"k": "x" * 100}}]}, 413, "limit is 100"),
        ({"messages": [{"role": "user", "content": "x"}] * 4}, 413, "at most 3 messages"),
    ],
)
async def test_bad_bodies_get_precise_errors_and_write_nothing(
    make_app: AppFactory, db: asyncpg.Connection, body: dict[str, Any], status: int, fragment: str
) -> None:
    api = await make_app(MEMORY_MAX_MESSAGE_CHARS=100, MEMORY_MAX_MESSAGES_PER_REQUEST=3)
    # Serialized by hand: httpx refuses NaN and lone surrogates, which JSON parsers accept.
    response = await api.client.post(
        "/conversations/c/messages", content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    assert fragment in response.text
    assert await db.fetchval("SELECT count(*) FROM conversations") == 0
    assert await db.fetchval("SELECT count(*) FROM messages") == 0


async def test_malformed_json_is_400(api: App) -> None:
    response = await api.client.post(
        "/conversations/c/messages", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json() == {"detail": "the request body is not valid JSON", "code": "bad_request"}


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_not_sent_as_json_is_415(
    api: App, db: asyncpg.Connection, content_type: str | None
) -> None:
    """FastAPI parses only a JSON Content-Type as JSON: anything else is the wrong media type,
    not a 422 about the body's fields."""
    headers = {"content-type": content_type} if content_type else {}
    for path, body in (("/conversations/c/messages", ROUND), ("/conversations", {"conversation_id": "c"})):
        response = await api.client.post(path, content=json.dumps(body), headers=headers)
        assert response.status_code == 415, response.text
        assert response.json() == {
            "detail": "send the body as JSON, with 'Content-Type: application/json'",
            "code": "unsupported_media_type",
        }
    assert await db.fetchval("SELECT count(*) FROM conversations") == 0
    ok = await api.client.post(
        "/conversations/c/messages",
        content=json.dumps(ROUND),
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 201


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/conversations/x/context", "GET"),
        ("PUT", "/conversations/x", "GET, PATCH, DELETE"),
        ("PUT", "/conversations", "GET, POST"),
        ("PUT", "/conversations/x/messages", "GET, POST, DELETE"),
        ("GET", "/ops/conversations/x/summarize", "POST"),
        ("GET", "/ops/memories/1/retry", "POST"),
        ("POST", "/healthz", "GET"),
    ],
)
async def test_405_lists_every_allowed_method(api: App, method: str, path: str, allow: str) -> None:
    response = await api.client.request(method, path)
    assert response.status_code == 405
    assert response.headers["Allow"] == allow
    assert response.json()["code"] == "method_not_allowed"


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")  # the order of Allow
# The docs pages and their files are no operations of the document; /openapi.json is
# Starlette's own route, which answers HEAD too.
DOCS_SHAPES = {
    "/docs": "GET",
    "/redoc": "GET",
    "/docs/assets/swagger-ui.css": "GET",
    "/openapi.json": "GET, HEAD",
}


async def test_405_on_every_route_shape_lists_the_methods_it_serves(api: App) -> None:
    """Every path of the OpenAPI document, with every method it does not serve: a JSON 405 whose
    Allow lists exactly the methods the document gives for that path, with a body or without."""
    paths = (await api.client.get("/openapi.json")).json()["paths"]
    ids = {
        "{conversation_id}": "c",
        "{memory_id}": "1",
        "{webhook_id}": "1",
        "{event_id}": "1",
        "{user_id}": "u",
    }
    concrete = {path: re.sub(r"\{\w+\}", lambda found: ids[found.group()], path) for path in paths}
    # A path may match several templates (/conversations/import is also the conversation
    # "import"): Allow names the methods of all of them.
    shapes = {
        shape: ", ".join(
            method
            for method in METHODS
            if any(
                method.lower() in paths[template]
                for template in paths
                if re.fullmatch(re.sub(r"\{[a-z_]+\}", "[^/]+", template), shape)
            )
        )
        for shape in concrete.values()
    }
    assert len(shapes) == len(paths) == 30
    for path, allow in (shapes | DOCS_SHAPES).items():
        for method in METHODS:
            if method in allow.split(", "):
                continue
            for body in (None, ROUND):
                response = await api.client.request(method, path, json=body)
                assert response.status_code == 405, (method, path, response.text)
                assert response.headers["Allow"] == allow, (method, path)
                if method != "HEAD":
                    assert response.json() == {"detail": "Method Not Allowed", "code": "method_not_allowed"}


@pytest.mark.parametrize("cid", ["a" * 51, "has space", "-leading", "semi;colon", "%00"])
async def test_bad_conversation_ids_are_rejected(api: App, db: asyncpg.Connection, cid: str) -> None:
    response = await api.client.post(f"/conversations/{cid}/messages", json=ROUND)
    assert response.status_code in (404, 422), response.text
    assert await db.fetchval("SELECT count(*) FROM conversations") == 0


async def test_messages_and_conversations_are_paginated(api: App) -> None:
    for cid in ("b", "a", "c"):
        await api.client.post(f"/conversations/{cid}/messages", json=ROUND)
    await api.client.post("/conversations/a/messages", json=ROUND)

    page = (await api.client.get("/conversations/a/messages", params={"limit": 3})).json()
    assert [m["sequence"] for m in page["messages"]] == [0, 1, 2]
    assert page["next_after_sequence"] == 2
    page = (
        await api.client.get("/conversations/a/messages", params={"limit": 3, "after_sequence": 2})
    ).json()
    assert [m["sequence"] for m in page["messages"]] == [3]
    assert page["next_after_sequence"] is None

    convs = (await api.client.get("/conversations", params={"limit": 2})).json()
    assert [c["conversation_id"] for c in convs["conversations"]] == ["a", "b"]
    assert convs["next_after"] == "b"
    convs = (await api.client.get("/conversations", params={"after": "b"})).json()
    assert [c["conversation_id"] for c in convs["conversations"]] == ["c"]


async def test_delete_removes_everything(api: App, db: asyncpg.Connection) -> None:
    for n in range(4):
        await api.post_round("gone", n)
    await api.idle()
    assert await db.fetchval("SELECT count(*) FROM memory") > 0
    assert (await api.client.delete("/conversations/gone")).status_code == 204
    for table in ("conversations", "messages", "memory"):
        assert await db.fetchval(f"SELECT count(*) FROM {table}") == 0
    assert (await api.client.get("/conversations/gone")).status_code == 404
    assert (await api.client.get("/conversations/gone/context")).json()["messages"] == []  # as never written


async def test_memories_endpoint_is_the_version_chain(api: App) -> None:
    for n in range(1, 6):
        await api.post_round("chain", n)
        await api.idle()
    body = (await api.client.get("/conversations/chain/memories")).json()
    rows = [(m["memory_id"], m["base_memory_id"], m["status"], m["base_end_seq"]) for m in body["memories"]]
    assert rows == [(3, 2, "completed", 7), (2, 1, "completed", 5), (1, None, "completed", None)]
    assert body["memories"][0]["text"] == "Summary of messages #0-#9."
    assert all(m["generation_time_ms"] is not None for m in body["memories"])


async def test_ops_queries(api: App, llm: FakeLLM) -> None:
    for n in range(1, 5):
        await api.post_round("ops", n)
        await api.idle()
    stats = (await api.client.get("/ops/memories/generation-stats")).json()
    assert stats["total_summaries"] == 2 and stats["max_ms"] >= 0
    windows = (await api.client.get("/ops/memories/window-progression")).json()
    assert [(w["start_sequence"], w["end_sequence"], w["window_size"]) for w in windows] == [
        (0, 7, 8),
        (0, 5, 6),
    ]
    llm.hold = True
    await api.post_round("ops", 5)
    await api.settle()
    stuck = (await api.client.get("/ops/memories/stuck", params={"older_than_seconds": 0})).json()
    assert [(s["conversation_id"], s["memory_id"]) for s in stuck] == [("ops", 3)]
    assert (await api.client.get("/ops/memories/stuck")).json() == []  # younger than 300 s
    runner = (await api.client.get("/ops/runner")).json()
    assert (runner["running"], runner["queued"], runner["due"]) == (1, 0, 0)
    assert runner["runs_summaries"] is True and runner["max_concurrent"] == 64
    await api.post_round("ops", 6)  # due while id=3 runs: its completion plans the next
    assert (await api.client.get("/ops/runner")).json()["due"] == 0
    chain = (await api.client.get("/ops/conversations/ops/memory-chain")).json()
    assert chain["memories"][0]["status"] == "processing"


async def test_summarize_now(api: App, llm: FakeLLM) -> None:
    await api.post_round("now", 1)  # below the threshold: no trigger
    response = await api.client.post("/ops/conversations/now/summarize")
    assert response.status_code == 202
    assert (response.json()["start_sequence"], response.json()["end_sequence"]) == (0, 1)
    await api.idle()
    again = await api.client.post("/ops/conversations/now/summarize")
    assert again.status_code == 409 and "nothing new" in again.json()["detail"]
    assert (await api.client.post("/ops/conversations/nope/summarize")).status_code == 404


async def test_health(api: App) -> None:
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    ready = await api.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["migration"] == head_revision()


async def test_readyz_reports_an_unmigrated_database(make_app: AppFactory, postgres_server_url: str) -> None:
    from sqlalchemy.engine import make_url

    name = "memory_test_unmigrated"
    admin = make_url(postgres_server_url).set(drivername="postgresql").render_as_string(False)
    conn = await asyncpg.connect(admin)
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
    await conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = make_url(postgres_server_url).set(database=name).render_as_string(False)
        api = await make_app(DATABASE_URL=url)
        response = await api.client.get("/readyz")
        assert response.status_code == 503
        assert f"expected {head_revision()}" in response.json()["detail"]
        await api.app.state.engine.dispose()
    finally:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()
