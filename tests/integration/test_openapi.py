"""The OpenAPI document tells the truth: each error status an operation documents is provoked
against the real app (real PostgreSQL) and the body it really sends is validated against the
schema /openapi.json gives for that operation and status. Plus readable operation ids, the
security scheme, enums, and an example for every request and response that fits its schema."""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import jsonschema_rs
import pytest
from sqlalchemy import text

from app.api.examples import ROUNDS
from app.memory.policies import POLICY_NAMES
from tests.integration.conftest import App, AppFactory, Launch

ACME = "acme-key-0123456789abcdef"
BETA = "beta-key-0123456789abcdef"
KEY = {"X-API-Key": ACME}
MAX_BODY = 4096
# Settings that make every limit reachable with small requests.
LIMITS: dict[str, Any] = {
    "MEMORY_API_KEYS": f"acme:{ACME},beta:{BETA}",
    "MEMORY_SUMMARIZER": "offline",
    "MEMORY_MAX_BODY_BYTES": MAX_BODY,
    "MEMORY_MAX_MESSAGES_PER_REQUEST": 2,
    "MEMORY_MAX_METADATA_KEYS": 4,
    "MEMORY_MAX_MESSAGE_CHARS": 1000,
    "MEMORY_HEADER_TIMEOUT_SECONDS": 0.3,
    "DATABASE_STATEMENT_TIMEOUT_SECONDS": 0.2,
    "DATABASE_CONNECT_TIMEOUT_SECONDS": 0.5,
    "MEMORY_REAPER_INTERVAL_SECONDS": 3600,
    "MEMORY_MAX_IMPORT_BYTES": MAX_BODY,
    "MEMORY_MAX_IMPORT_ENTRIES": 5,
}
ONE_ROUND = {"messages": ROUNDS[0]}


def document(conversation_id: str) -> dict[str, Any]:
    """The smallest export document: one entry, no memory."""
    when = "2026-04-01T09:00:00.000000Z"
    return {
        "format": "memory-service.conversation",
        "version": 1,
        "conversation": {
            "conversation_id": conversation_id,
            "created_at": when,
            "memory_policy": {"name": "sliding_window"},
            "metadata": {},
        },
        "entries": [
            {
                "sequence": 0,
                "round": 0,
                "type": "message",
                "role": "user",
                "content": "hi",
                "tokens": 8,
                "created_at": when,
            }
        ],
        "memories": [],
    }


# ---- reading the document ----------------------------------------------------------------------


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, op) for path, item in doc["paths"].items() for method, op in item.items()]


def validate(doc: dict[str, Any], schema: dict[str, Any], value: Any) -> list[str]:
    """Errors of ``value`` against ``schema`` (JSON Schema 2020-12, refs into the document)."""
    root = {**schema, "components": doc.get("components", {})}
    validator = jsonschema_rs.Draft202012Validator(root, validate_formats=True)
    return [f"{error.instance_path}: {error.message}" for error in validator.iter_errors(value)]


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def examples_of(doc: dict[str, Any], media: dict[str, Any]) -> list[Any]:
    """A media type's examples: its own, else its schema's (an array's from its items')."""
    if "example" in media:
        return [media["example"]]
    if "examples" in media:
        return [example["value"] for example in media["examples"].values()]
    schema = resolve(doc, media.get("schema", {}))
    if "examples" in schema:
        return list(schema["examples"])
    if schema.get("type") == "array" and "examples" in resolve(doc, schema["items"]):
        return [resolve(doc, schema["items"])["examples"][:1]]
    return []


async def fetch_openapi(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/openapi.json", headers=KEY)
    assert response.status_code == 200
    doc: dict[str, Any] = response.json()
    return doc


# ---- the document on its own -------------------------------------------------------------------


async def test_operation_ids_are_the_handlers_names(api: App) -> None:
    doc = await fetch_openapi(api.client)
    ids = {f"{method} {path}": op["operationId"] for method, path, op in operations(doc)}
    assert len(set(ids.values())) == len(ids)
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", op_id) for op_id in ids.values()), ids
    assert ids["POST /conversations/{conversation_id}/messages"] == "append_messages"
    assert ids["GET /conversations/{conversation_id}/context"] == "get_context"
    assert ids["POST /ops/memories/{memory_id}/retry"] == "retry_memory"


async def test_every_request_and_response_has_an_example_that_fits_its_schema(api: App) -> None:
    doc = await fetch_openapi(api.client)
    checked = 0
    for method, path, op in operations(doc):
        bodies = [("request", op["requestBody"]["content"])] if "requestBody" in op else []
        bodies += [(status, response.get("content", {})) for status, response in op["responses"].items()]
        for where, content in bodies:
            assert content or where == "204", (method, path, where)
            for media_type, media in content.items():
                found = examples_of(doc, media)
                assert found, f"{method} {path} {where} {media_type}: no example"
                for example in found:
                    assert validate(doc, media["schema"], example) == [], (method, path, where, example)
                    checked += 1
    assert checked > 150


async def test_statuses_kinds_policies_and_roles_are_enums(api: App) -> None:
    schemas = (await fetch_openapi(api.client))["components"]["schemas"]
    memory = schemas["MemoryOut"]["properties"]
    assert memory["status"]["enum"] == ["processing", "completed", "failed"]
    assert memory["kind"]["enum"] == ["window", "block", "compression", "fold", "medium_term", "compaction"]
    assert schemas["MemoryStarted"]["properties"]["status"]["enum"] == ["processing", "completed", "failed"]
    assert schemas["ContextOut"]["properties"]["policy"]["enum"] == list(POLICY_NAMES)
    assert schemas["MessageOut"]["properties"]["role"]["enum"] == ["user", "assistant", "system", "tool"]
    assert schemas["RunnerStats"]["properties"]["llm_circuit"]["enum"] == ["closed", "open", "half_open"]
    policy = schemas["ConversationOut"]["properties"]["memory_policy"]
    assert set(policy["discriminator"]["mapping"]) == set(POLICY_NAMES)
    for config in (
        "SlidingWindowConfig",
        "RollingBlocksConfig",
        "TokenBudgetConfig",
        "RecursiveSummaryConfig",
    ):
        assert "name" in schemas[config]["required"]  # the discriminator a request must send
    error_codes = schemas["ErrorOut"]["properties"]["code"]["enum"]
    assert {"bad_request", "not_found", "unsupported_media_type", "unavailable"} <= set(error_codes)


@pytest.mark.parametrize("keys", [False, True])
async def test_the_security_scheme_follows_the_api_keys(make_app: AppFactory, keys: bool) -> None:
    api = await make_app(**({"MEMORY_API_KEYS": f"acme:{ACME}"} if keys else {}))
    doc = await fetch_openapi(api.client)
    schemes = doc.get("components", {}).get("securitySchemes")
    if not keys:
        assert schemes is None and "security" not in doc
        assert all("401" not in op["responses"] for _, _, op in operations(doc))
        return
    assert schemes["apiKey"] == {**schemes["apiKey"], "type": "apiKey", "in": "header", "name": "X-API-Key"}
    assert schemes["bearer"] == {**schemes["bearer"], "type": "http", "scheme": "bearer"}
    assert doc["security"] == [{"apiKey": []}, {"bearer": []}]
    for method, path, op in operations(doc):
        if path in ("/healthz", "/readyz"):
            assert op["security"] == [] and "401" not in op["responses"]
        else:
            assert "security" not in op and "401" in op["responses"], (method, path)
    # Both ways the scheme names work (and nothing else does).
    for headers in ({"X-API-Key": ACME}, {"Authorization": f"Bearer {ACME}"}):
        assert (await api.client.get("/conversations", headers=headers)).status_code == 200
    assert (await api.client.get("/conversations", headers={"X-API-Key": "nope"})).status_code == 401


# ---- documented error bodies against real ones -------------------------------------------------


@dataclass
class Call:
    """A request meant to get ``status`` from the operation ``method template``."""

    method: str
    template: str
    status: int
    path: str = ""  # the concrete path; default: the template with the fixture's ids
    kwargs: dict[str, Any] = field(default_factory=dict)
    key: str | None = ACME

    def url(self) -> str:
        ids = {
            "{conversation_id}": "demo",
            "{memory_id}": "1",
            "{webhook_id}": "1",
            "{event_id}": "1",
            "{user_id}": "ana",
        }
        return self.path or functools.reduce(lambda path, id_: path.replace(*id_), ids.items(), self.template)


async def stalled_body() -> AsyncIterator[bytes]:
    """Half a body, then nothing for longer than MEMORY_HEADER_TIMEOUT_SECONDS."""
    yield b'{"messages": ['
    await asyncio.sleep(1)
    yield b"]}"


def json_body(raw: bytes, content_type: str = "application/json") -> dict[str, Any]:
    return {"content": raw, "headers": {"content-type": content_type}}


MESSAGES = "/conversations/{conversation_id}/messages"
ROUND_JSON = b'{"messages": [{"role": "user", "content": "hi"}]}'

# Statuses particular to an operation; the ones every operation gets are added by edge_calls.
EVENTS = "/conversations/{conversation_id}/events"
WEBHOOK = "/webhooks/{webhook_id}"
RETRY_DELIVERY = "/ops/webhooks/{webhook_id}/deliveries/{conversation_id}/{event_id}/retry"
CALLS = [
    Call("POST", MESSAGES, 400, kwargs=json_body(b"{not json")),
    Call(
        "POST", MESSAGES, 404, kwargs={"json": ONE_ROUND}, key=BETA
    ),  # acme's conversation, posted to by beta
    Call(
        "POST",
        MESSAGES,
        409,
        kwargs={"json": {"messages": ROUNDS[1]}, "headers": {"Idempotency-Key": "round-0"}},
    ),
    Call("POST", MESSAGES, 413, kwargs={"json": {"messages": ROUNDS[0] + ROUNDS[1]}}),
    Call("POST", MESSAGES, 413, kwargs={"json": {"messages": [{"role": "user", "content": "x" * 1001}]}}),
    Call("POST", MESSAGES, 415, kwargs=json_body(ROUND_JSON, "text/plain")),
    Call("POST", MESSAGES, 422, kwargs={"json": {"messages": [{"role": "robot", "content": "hi"}]}}),
    Call("POST", MESSAGES, 422, kwargs={"json": ONE_ROUND, "headers": {"Idempotency-Key": "x" * 300}}),
    Call(
        "POST",
        MESSAGES,
        408,
        kwargs={"content": stalled_body, "headers": {"content-type": "application/json"}},
    ),
    Call("POST", "/conversations", 400, kwargs=json_body(b'{"conversation_id": ')),
    Call("POST", "/conversations", 409, kwargs={"json": {"conversation_id": "demo"}}),
    Call(
        "POST",
        "/conversations",
        413,
        kwargs={"json": {"conversation_id": "labels", "metadata": {f"k{i}": i for i in range(5)}}},
    ),
    Call("POST", "/conversations", 415, kwargs=json_body(b'{"conversation_id": "x"}', "text/plain")),
    Call(
        "POST",
        "/conversations",
        422,
        kwargs={"json": {"conversation_id": "x", "memory_policy": {"name": "lru"}}},
    ),
    Call(
        "POST",
        "/conversations",
        408,
        kwargs={"content": stalled_body, "headers": {"content-type": "application/json"}},
    ),
    Call("GET", MESSAGES, 404, path="/conversations/nobody/messages"),
    Call("GET", MESSAGES, 422, path="/conversations/demo/messages?limit=0"),
    Call("GET", "/conversations", 422, path="/conversations?limit=0"),
    Call("GET", "/conversations", 422, path="/conversations?after=-bad"),
    Call("GET", "/conversations/{conversation_id}", 404, path="/conversations/nobody"),
    Call("GET", "/conversations/{conversation_id}", 422, path="/conversations/-bad"),
    Call("DELETE", "/conversations/{conversation_id}", 404, path="/conversations/nobody"),
    Call("DELETE", "/conversations/{conversation_id}", 422, path="/conversations/" + "x" * 51),
    Call(
        "GET",
        "/conversations/{conversation_id}/context",
        409,
        path="/conversations/open/context?format=openai",
    ),
    Call("GET", "/conversations/{conversation_id}/context", 422, path="/conversations/-bad/context"),
    Call("GET", EVENTS, 422, path="/conversations/demo/events", kwargs={"headers": {"Last-Event-ID": "x"}}),
    Call("GET", EVENTS, 422, path="/conversations/demo/events?after=-1"),
    Call("POST", "/webhooks", 400, kwargs=json_body(b'{"url": ')),
    Call("POST", "/webhooks", 415, kwargs=json_body(b'{"url": "http://127.0.0.1:9/"}', "text/plain")),
    Call("POST", "/webhooks", 422, kwargs={"json": {"url": "ftp://example.com/"}}),
    Call("DELETE", WEBHOOK, 404, path="/webhooks/999"),
    Call("DELETE", WEBHOOK, 422, path="/webhooks/0"),
    Call("GET", "/ops/webhooks/dead", 422, path="/ops/webhooks/dead?limit=0"),
    Call("POST", RETRY_DELIVERY, 422, path="/ops/webhooks/1/deliveries/demo/0/retry"),
    Call("POST", RETRY_DELIVERY, 404, path="/ops/webhooks/1/deliveries/demo/99999/retry"),
    Call("GET", "/conversations/{conversation_id}/memories", 404, path="/conversations/nobody/memories"),
    Call("GET", "/conversations/{conversation_id}/memories", 422, path="/conversations/a%20b/memories"),
    Call(
        "GET",
        "/ops/conversations/{conversation_id}/memory-chain",
        404,
        path="/ops/conversations/nobody/memory-chain",
    ),
    Call(
        "GET",
        "/ops/conversations/{conversation_id}/memory-chain",
        422,
        path="/ops/conversations/-bad/memory-chain",
    ),
    Call("GET", "/ops/memories/stuck", 422, path="/ops/memories/stuck?older_than_seconds=-1"),
    Call("GET", "/ops/memories/failed", 422, path="/ops/memories/failed?limit=0"),
    Call("GET", "/ops/conversations/failing", 422, path="/ops/conversations/failing?limit=x"),
    Call("GET", "/ops/memories/window-progression", 422, path="/ops/memories/window-progression?limit=1001"),
    Call("POST", "/ops/memories/{memory_id}/retry", 404, path="/ops/memories/999/retry"),
    Call("POST", "/ops/memories/{memory_id}/retry", 409),  # memory 1 completed: only failed ones
    Call("POST", "/ops/memories/{memory_id}/retry", 422, path="/ops/memories/0/retry"),
    Call(
        "POST",
        "/ops/conversations/{conversation_id}/summarize",
        404,
        path="/ops/conversations/nobody/summarize",
    ),
    Call("POST", "/ops/conversations/{conversation_id}/summarize", 409),  # nothing new since memory 1
    Call(
        "POST", "/ops/conversations/{conversation_id}/summarize", 422, path="/ops/conversations/-x/summarize"
    ),
    Call("GET", "/conversations/{conversation_id}/stats", 404, path="/conversations/nobody/stats"),
    Call("GET", "/conversations/{conversation_id}/stats", 422, path="/conversations/-bad/stats"),
    Call("GET", "/conversations/{conversation_id}/export", 404, path="/conversations/nobody/export"),
    Call("GET", "/conversations/{conversation_id}/export", 413),  # 6 entries, MEMORY_MAX_IMPORT_ENTRIES 5
    Call("GET", "/conversations/{conversation_id}/export", 422, path="/conversations/-bad/export"),
    Call("POST", "/conversations/import", 400, kwargs=json_body(b'{"format": ')),
    Call("POST", "/conversations/import", 409, kwargs={"json": document("demo")}),
    Call(
        "POST",
        "/conversations/import",
        413,
        kwargs={"json": document("many") | {"entries": document("many")["entries"] * 6}},
    ),
    Call("POST", "/conversations/import", 415, kwargs=json_body(b"{}", "text/plain")),
    Call("POST", "/conversations/import", 422, kwargs={"json": document("x") | {"version": 2}}),
    Call("POST", "/conversations/import", 422, path="/conversations/import?conversation_id=-bad"),
    Call("DELETE", MESSAGES, 404, path="/conversations/nobody/messages"),
    Call("DELETE", MESSAGES, 422, path="/conversations/-bad/messages"),
    Call("DELETE", MESSAGES, 409, path="/conversations/shelved/messages"),  # archived: read-only
    Call("POST", "/conversations/{conversation_id}/compress", 404, path="/conversations/nobody/compress"),
    Call("POST", "/conversations/{conversation_id}/compress", 409),  # nothing new since memory 1
    Call("POST", "/conversations/{conversation_id}/compress", 422, path="/conversations/-x/compress"),
    Call("POST", "/conversations/{conversation_id}/end", 404, path="/conversations/nobody/end"),
    Call("POST", "/conversations/{conversation_id}/end", 422, path="/conversations/-x/end"),
    Call("POST", "/conversations/{conversation_id}/end", 409, path="/conversations/shelved/end"),
    Call(
        "GET",
        "/conversations/{conversation_id}/export",
        404,
        path="/conversations/nobody/export?format=markdown",
    ),
    Call("GET", "/conversations/{conversation_id}/export", 422, path="/conversations/demo/export?format=pdf"),
    Call("GET", "/ops/conversations/archived", 422, path="/ops/conversations/archived?limit=0"),
    Call(
        "POST", "/ops/conversations/{conversation_id}/restore", 404, path="/ops/conversations/nobody/restore"
    ),
    Call("POST", "/ops/conversations/{conversation_id}/restore", 409),  # demo is not archived
    Call("POST", "/ops/conversations/{conversation_id}/restore", 422, path="/ops/conversations/-x/restore"),
    Call("GET", "/users/{user_id}/context", 404, path="/users/nobody/context"),
    Call("GET", "/users/{user_id}/context", 422, path="/users/-x/context"),
    Call("GET", "/users/{user_id}/memories", 404, path="/users/nobody/memories"),
    Call("GET", "/users/{user_id}/memories", 422, path="/users/-x/memories"),
    Call("PATCH", "/conversations/{conversation_id}", 400, kwargs=json_body(b'{"memory_policy": ')),
    Call(
        "PATCH",
        "/conversations/{conversation_id}",
        404,
        path="/conversations/nobody",
        kwargs={"json": {"memory_policy": {"name": "sliding_window"}}},
    ),
    Call(
        "PATCH",
        "/conversations/{conversation_id}",
        409,
        kwargs={"json": {"memory_policy": {"name": "token_budget"}}},
    ),
    Call(
        "PATCH",
        "/conversations/{conversation_id}",
        415,
        kwargs=json_body(b'{"memory_policy": {"name": "sliding_window"}}', "text/plain"),
    ),
    Call(
        "PATCH",
        "/conversations/{conversation_id}",
        422,
        kwargs={"json": {"memory_policy": {"name": "sliding_window", "window_size": 1}}},
    ),
]
# Documented but answered only by `memory-service serve`'s protocol or uvicorn, before the app:
# test_serve_only_answers_match_the_document provokes them.
SERVE_ONLY = {408, 503}


def edge_calls(method: str, template: str, responses: dict[str, Any]) -> list[Call]:
    """What every operation can get, provoked for this one."""
    calls = [
        Call(method, template, 413, kwargs={"content": b"x" * (MAX_BODY + 1)}),
        Call(method, template, 431, kwargs={"headers": {"X-Pad": "p" * 17_000}}),
    ]
    if "401" in responses:
        calls.append(Call(method, template, 401, key=None))
    return calls


@pytest.fixture
async def limited(make_app: AppFactory) -> AsyncIterator[App]:
    """Tenant acme's conversation `demo` with three rounds (the first with Idempotency-Key
    round-0) and its first summary completed (memory 1)."""
    api = await make_app(**LIMITS)
    for number, messages in enumerate(ROUNDS):
        headers = {**KEY, "Idempotency-Key": f"round-{number}"}
        response = await api.client.post(
            "/conversations/demo/messages", json={"messages": messages}, headers=headers
        )
        assert response.status_code == 201, response.text
    # `open`: a round that ends with a tool call waiting for its result (no provider takes it).
    waiting = {
        "messages": [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
                ],
            },
        ]
    }
    assert (
        await api.client.post("/conversations/open/messages", json=waiting, headers=KEY)
    ).status_code == 201
    await api.idle()
    # `shelved`: archived (idle past MEMORY_ARCHIVE_AFTER_DAYS, by a back-dated clock).
    assert (
        await api.client.post("/conversations", json={"conversation_id": "shelved"}, headers=KEY)
    ).is_success
    async with api.service.engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE conversations SET last_message_at = now() - interval '31 days' "
                "WHERE conversation_id = 'shelved'"
            )
        )
    assert await api.service.archive_idle() == 1

    async def boom() -> None:
        raise RuntimeError("a bug")

    api.app.add_api_route("/test-errors/boom", boom, include_in_schema=False)
    yield api


async def send(client: httpx.AsyncClient, call: Call) -> httpx.Response:
    kwargs = dict(call.kwargs)
    if callable(kwargs.get("content")):
        kwargs["content"] = kwargs["content"]()
    headers = {**({"X-API-Key": call.key} if call.key else {}), **kwargs.pop("headers", {})}
    return await client.request(call.method, call.url(), headers=headers, **kwargs)


def check_body(doc: dict[str, Any], call: Call, response: httpx.Response) -> None:
    """The real answer is a documented status with a body that fits the documented schema and
    the code of that status's example."""
    what = f"{call.method} {call.url()[:80]} -> {response.status_code}"
    assert response.status_code == call.status, f"{what}: {response.text[:300]}"
    documented = doc["paths"][call.template][call.method.lower()]["responses"].get(str(call.status))
    assert documented is not None, f"{what}: status not documented"
    media_type = response.headers["content-type"].split(";")[0]
    media = documented["content"].get(media_type)
    assert media is not None, f"{what}: {media_type} not documented"
    body = response.json()
    assert validate(doc, media["schema"], body) == [], (what, body)
    assert body["code"] == media["example"]["code"], (what, body)
    for header in documented.get("headers", {}):
        assert header in response.headers, (what, header)


async def test_documented_error_bodies_are_the_real_ones(
    limited: App, db: asyncpg.Connection, plain_database_url: str
) -> None:
    client = limited.client
    doc = await fetch_openapi(client)
    calls = [*CALLS]
    for method, template, op in operations(doc):
        calls += edge_calls(method, template, op["responses"])
    provoked: set[tuple[str, str, int]] = set()
    for call in calls:
        check_body(doc, call, await send(client, call))
        provoked.add((call.method, call.template, call.status))

    # Every stream slot taken (as if; test_events opens real streams up to the bound).
    hub = limited.app.state.hub
    hub.streams = hub.max_streams
    try:
        call = Call("GET", EVENTS, 429, path="/conversations/demo/events")
        check_body(doc, call, await send(client, call))
        provoked.add((call.method, call.template, call.status))
    finally:
        hub.streams = 0

    # The tenant's webhooks full (a port nobody listens on: deliveries fail at once), and a
    # delivery not dead yet.
    for _ in range(10):
        created = await client.post("/webhooks", json={"url": "http://127.0.0.1:9/"}, headers=KEY)
        assert created.status_code == 201
    event = (await client.post("/conversations/demo/messages", json=ONE_ROUND, headers=KEY)).json()
    last_event = await db.fetchval("SELECT max(event_id) FROM events WHERE conversation_id = 'demo'")
    assert event["round"] >= 0 and last_event is not None
    for call in (
        Call("POST", "/webhooks", 409, kwargs={"json": {"url": "http://127.0.0.1:9/"}}),
        Call("POST", RETRY_DELIVERY, 409, path=f"/ops/webhooks/1/deliveries/demo/{last_event}/retry"),
    ):
        check_body(doc, call, await send(client, call))
        provoked.add((call.method, call.template, call.status))

    # A database that does not answer: every operation that reads it gets its 503.
    await db.execute("BEGIN")
    tables = (
        "conversations, messages, memory, idempotency_keys, events, webhooks, webhook_deliveries, "
        "alembic_version"
    )
    await db.execute(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE")
    try:
        for method, template, op in operations(doc):
            if "application/json" not in op["responses"]["503"]["content"]:
                continue
            call = Call(method, template, 503)
            if method == "PATCH":
                call.kwargs = {"json": {"memory_policy": {"name": "sliding_window"}}}
            elif method == "POST" and "requestBody" in op:
                bodies = {
                    "/conversations": {"conversation_id": "new"},
                    "/conversations/import": document("new"),
                    "/webhooks": {"url": "http://127.0.0.1:9/"},
                }
                call.kwargs = {"json": bodies.get(template, ONE_ROUND)}
            response = await send(client, call)
            if template == "/readyz":
                assert response.status_code == 503 and response.json()["status"] == "unavailable"
                assert (
                    validate(
                        doc, op["responses"]["503"]["content"]["application/json"]["schema"], response.json()
                    )
                    == []
                )
            else:
                check_body(doc, call, response)
            provoked.add((method, template, 503))
    finally:
        await db.execute("ROLLBACK")

    # An unexpected error has the same body on every operation (app.edge): one route shows it.
    boom = await client.get("/test-errors/boom", headers=KEY)
    for method, template, _ in operations(doc):
        call = Call(method, template, 500)
        check_body(doc, call, httpx.Response(500, headers=boom.headers, content=boom.content))
        provoked.add((method, template, 500))

    documented = {
        (method, template, int(status))
        for method, template, op in operations(doc)
        for status in op["responses"]
        if int(status) >= 400
    }
    missing = sorted(documented - provoked)
    assert all(status in SERVE_ONLY for _, _, status in missing), missing


# ---- what only `memory-service serve` answers ----------------------------------------------------


async def stalled_head(port: int, method: str, path: str) -> httpx.Response:
    """Half a request head on a raw connection, then the server's answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ".encode())
        async with asyncio.timeout(10):
            head, _, body = (await reader.read(65536)).partition(b"\r\n\r\n")
    finally:
        writer.close()
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = [(name.strip(), value.strip()) for name, _, value in (line.partition(":") for line in lines)]
    return httpx.Response(int(status_line.split()[1]), headers=headers, content=body)


@pytest.mark.slow
async def test_serve_only_answers_match_the_document(launch: Launch) -> None:
    """A request head that stalls (408, from serve's protocol) and a connection past
    MEMORY_MAX_CONNECTIONS (503, plain text from uvicorn), on every operation."""
    server = launch(MEMORY_SUMMARIZER="offline", MEMORY_HEADER_TIMEOUT_SECONDS="0.5")
    async with httpx.AsyncClient(base_url=server.url) as client:
        doc = await fetch_openapi(client)
    calls = [Call(method, template, 408) for method, template, _ in operations(doc)]
    answers = await asyncio.gather(*(stalled_head(server.port, call.method, call.url()) for call in calls))
    for call, response in zip(calls, answers, strict=True):
        check_body(doc, call, response)

    full = launch(MEMORY_SUMMARIZER="offline", MEMORY_MAX_CONNECTIONS="2")
    idle = [await asyncio.open_connection("127.0.0.1", full.port) for _ in range(2)]
    try:
        async with httpx.AsyncClient(base_url=full.url) as client:
            for method, template, op in operations(doc):
                response = await client.request(method, Call(method, template, 503).url())
                assert response.status_code == 503, (method, template, response.text)
                assert response.headers["content-type"].startswith("text/plain")
                media = op["responses"]["503"]["content"]["text/plain"]
                assert validate(doc, media["schema"], response.text) == []
    finally:
        for _, writer in idle:
            writer.close()
