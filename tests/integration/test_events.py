"""Events (issue 9): written with what they report, streamed as Server-Sent Events over real HTTP
servers, once and in order across two app instances, resumable, expiring; and reads that wait
for a pending summary (issue 11), woken by the same LISTEN connection."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import orjson
import uvicorn

from app.cli import uvicorn_options
from app.main import create_app
from app.repositories import events
from app.settings import Settings
from tests.fakellm import FakeLLM
from tests.integration.conftest import AppFactory, eventually, settings_for
from tests.integration.servers import free_port


@dataclass
class Served:
    url: str
    settings: Settings
    app: Any


@asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[Served]:
    """The app behind a real uvicorn server (the options `serve` uses) on a free port, in this
    event loop, with its own engine and LISTEN connection."""
    app = create_app(settings)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=free_port(), timeout_graceful_shutdown=1, **uvicorn_options(settings)
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())

    async def started() -> bool:
        if task.done():
            task.result()
        return server.started

    await eventually(started, what="the server to start")
    await eventually(lambda: _true(app.state.hub.connected.is_set()), what="the LISTEN connection")
    try:
        yield Served(f"http://127.0.0.1:{config.port}", settings, app)
    finally:
        server.should_exit = True
        await task


async def _true(value: bool) -> bool:
    return value


@dataclass
class Stream:
    """An open SSE stream, its events (parsed) and comments collected as they come."""

    events: list[dict[str, Any]] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    status: int = 0

    async def until(self, count: int, within: float = 20.0) -> list[dict[str, Any]]:
        await eventually(lambda: _true(len(self.events) >= count), within=within, what=f"{count} events")
        return self.events


@asynccontextmanager
async def stream(
    url: str,
    conversation_id: str,
    *,
    headers: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
) -> AsyncIterator[Stream]:
    collected = Stream()
    opened = asyncio.Event()

    async def read() -> None:
        async with (
            httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(5, read=60)) as client,
            client.stream(
                "GET", f"/conversations/{conversation_id}/events", headers=headers, params=params
            ) as response,
        ):
            collected.status = response.status_code
            opened.set()
            if response.status_code != 200:
                return
            current: dict[str, str] = {}
            async for line in response.aiter_lines():
                if line.startswith(":"):
                    collected.comments.append(line)
                elif line == "":
                    if "data" in current:
                        event = orjson.loads(current["data"])
                        assert event["event_id"] == int(current["id"])
                        assert event["type"] == current["event"]
                        collected.events.append(event)
                    current = {}
                else:
                    name, _, value = line.partition(": ")
                    current[name] = value

    task = asyncio.create_task(read())
    await asyncio.wait([task, asyncio.ensure_future(opened.wait())], return_when=asyncio.FIRST_COMPLETED)
    try:
        yield collected
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def round_body(n: int) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": f"Round {n} question."},
            {"role": "assistant", "content": f"Round {n} answer."},
        ]
    }


async def post_round(url: str, conversation_id: str, n: int) -> None:
    async with httpx.AsyncClient(base_url=url) as client:
        response = await client.post(f"/conversations/{conversation_id}/messages", json=round_body(n))
    assert response.status_code == 201, response.text


async def stored_events(db: asyncpg.Connection, conversation_id: str) -> list[tuple[int, str]]:
    rows = await db.fetch(
        "SELECT event_id, type FROM events WHERE conversation_id = $1 ORDER BY event_id", conversation_id
    )
    return [(r["event_id"], r["type"]) for r in rows]


async def test_every_event_once_and_in_order_across_two_servers(
    database_url: str, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    # No heartbeat within the test: each event must come by its NOTIFY, not by the beat's read.
    settings = settings_for(database_url, llm, MEMORY_EVENTS_HEARTBEAT_SECONDS=300)
    async with served(settings) as a, served(settings) as b:
        async with stream(a.url, "trip") as on_a:
            assert on_a.status == 200
            # The stream opened before the conversation existed: its creation wakes the stream,
            # which then marks it watched. Rounds alternate between the replicas; round 3 makes a
            # summary due (sequence 5).
            for n in range(3):
                await post_round((a, b)[n % 2].url, "trip", n)
                await on_a.until(2 * (n + 1), within=5)
            events = await on_a.until(8, within=5)
        expected = [(i, "entry:added") for i in range(1, 7)]
        expected += [(7, "summary:started"), (8, "summary:completed")]
        assert [(e["event_id"], e["type"]) for e in events] == expected
        assert await stored_events(db, "trip") == expected
        assert [e["data"]["sequence"] for e in events[:6]] == list(range(6))
        assert events[6]["data"] == {
            "memory_id": 1,
            "kind": "window",
            "start_sequence": 0,
            "end_sequence": 5,
            "retry": False,
        }
        assert events[7]["data"]["tokens"] > 0

        # Resumption on the other replica: after the 5th event (Last-Event-ID), then by ?after=.
        async with stream(b.url, "trip", headers={"Last-Event-ID": "5"}) as resumed:
            await post_round(a.url, "trip", 3)
            got = await resumed.until(5)
            assert [e["event_id"] for e in got[:5]] == [6, 7, 8, 9, 10]
        async with stream(a.url, "trip", params={"after": 9}) as by_query:
            got = await by_query.until(1)
            assert got[0]["event_id"] == 10 and got[0]["data"]["sequence"] == 7


async def test_a_refused_request_records_no_event_and_deletion_outlives_the_conversation(
    database_url: str, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    async with served(settings_for(database_url, llm, MEMORY_SUMMARIZE_AFTER_SEQ=1000)) as a:
        await post_round(a.url, "c1", 0)
        async with httpx.AsyncClient(base_url=a.url) as client:
            orphan = {"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]}
            refused = await client.post("/conversations/c1/messages", json=orphan)
            assert refused.status_code == 422
            bad_role = await client.post("/conversations/c1/messages", json={"messages": [{"role": "x"}]})
            assert bad_role.status_code == 422
            assert await stored_events(db, "c1") == [(1, "entry:added"), (2, "entry:added")]

            async with stream(a.url, "c1") as watching:
                await watching.until(2)
                assert (await client.delete("/conversations/c1")).status_code == 204
                got = await watching.until(3)
                assert got[2]["type"] == "conversation:deleted" and got[2]["event_id"] == 3
                assert await db.fetchval("SELECT count(*) FROM conversations") == 0
                assert await stored_events(db, "c1") == [
                    (1, "entry:added"),
                    (2, "entry:added"),
                    (3, "conversation:deleted"),
                ]
                # Created again, the conversation goes on numbering: a stream never goes back.
                await post_round(a.url, "c1", 0)
                got = await watching.until(5)
                assert [e["event_id"] for e in got] == [1, 2, 3, 4, 5]


async def test_old_events_expire(make_app: AppFactory, db: asyncpg.Connection) -> None:
    api = await make_app(MEMORY_EVENTS_TTL_HOURS=1, MEMORY_SUMMARIZE_AFTER_SEQ=1000)
    await api.post_round("old", 0)
    await api.post_round("old", 1)
    await db.execute(
        "UPDATE events SET created_at = now() - interval '2 hours' "
        "WHERE conversation_id = 'old' AND event_id <= 2"
    )
    await api.service.maintain([])
    assert await stored_events(db, "old") == [(3, "entry:added"), (4, "entry:added")]


async def test_streams_are_bounded_and_survive_the_edge_timeouts(database_url: str, llm: FakeLLM) -> None:
    settings = settings_for(
        database_url,
        llm,
        MEMORY_EVENTS_MAX_STREAMS=1,
        MEMORY_EVENTS_HEARTBEAT_SECONDS=0.2,
        MEMORY_HEADER_TIMEOUT_SECONDS=0.5,
        MEMORY_KEEPALIVE_TIMEOUT_SECONDS=0.5,
        MEMORY_SUMMARIZE_AFTER_SEQ=1000,
    )
    async with served(settings) as a, stream(a.url, "quiet") as first:
        assert first.status == 200
        async with httpx.AsyncClient(base_url=a.url) as client:
            full = await client.get("/conversations/quiet/events")
        assert full.status_code == 429
        assert full.json()["code"] == "too_many_requests" and full.headers["Retry-After"] == "5"
        # Well past the body and keep-alive timeouts, heartbeats keep coming and so do events.
        await eventually(lambda: _true(len(first.comments) >= 8), what="heartbeats")
        await post_round(a.url, "quiet", 0)
        assert [e["event_id"] for e in await first.until(2)] == [1, 2]


async def test_a_lost_listen_connection_reconnects_and_catches_up(
    database_url: str, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    settings = settings_for(database_url, llm, MEMORY_SUMMARIZE_AFTER_SEQ=1000)
    async with served(settings) as a, stream(a.url, "lost") as watching:
        hub = a.app.state.hub
        await post_round(a.url, "lost", 0)
        await watching.until(2)
        connections = hub.connects
        assert await db.fetchval("SELECT pg_terminate_backend($1)", hub.server_pid)
        # Posted while the connection is down or just back: delivered either way.
        await post_round(a.url, "lost", 1)
        await eventually(lambda: _true(hub.connects > connections), what="the LISTEN connection again")
        assert [e["event_id"] for e in await watching.until(4)] == [1, 2, 3, 4]


async def test_only_watched_conversations_notify(make_app: AppFactory, plain_database_url: str) -> None:
    api = await make_app(MEMORY_SUMMARIZE_AFTER_SEQ=1000)
    await api.post_round("unwatched", 0)
    await api.post_round("watched", 0)
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(plain_database_url)
    try:
        await listener.add_listener("memory_events", lambda *args: heard.put_nowait(args[3]))
        async with api.app.state.hub.subscribe("watched"):
            await api.post_round("unwatched", 1)
            await api.post_round("watched", 1)
            # Notifications come in commit order: the watched one came, the other never did.
            assert await asyncio.wait_for(heard.get(), 10) == "watched"
        # A new conversation always notifies (no stream could have marked it).
        await api.post_round("brand-new", 0)
        assert await asyncio.wait_for(heard.get(), 10) == "brand-new"
    finally:
        await listener.close()


async def test_wait_for_pending_waits_for_the_summary_or_the_time(make_app: AppFactory, llm: FakeLLM) -> None:
    api = await make_app(MEMORY_CONTEXT_MAX_WAIT_SECONDS=30)
    idle = (await api.client.get("/conversations/w/context", params={"wait_for_pending": 5})).json()
    assert (idle["waited"], idle["pending"]) == (False, False)
    llm.hold = True
    for n in range(3):
        await api.post_round("w", n)
    await asyncio.to_thread(llm.wait_for_calls, 1)

    started = time.monotonic()
    response = await api.client.get("/conversations/w/context", params={"wait_for_pending": 0.3})
    body = response.json()
    assert (body["waited"], body["pending"]) == (True, True)
    assert body["processing"]["memory_id"] == 1 and body["summaries"] == []
    assert response.headers["X-Context-Pending"] == "true"
    assert time.monotonic() - started < 5

    waiting = asyncio.create_task(api.client.get("/conversations/w/context", params={"wait_for_pending": 20}))
    hub = api.app.state.hub
    await eventually(lambda: _true(hub.subscribers("w") == 1), what="the read to wait")
    llm.release_all()
    body = (await asyncio.wait_for(waiting, 15)).json()
    assert (body["waited"], body["pending"]) == (True, False)
    assert body["processing"] is None and body["summaries"][0]["memory_id"] == 1


async def test_wait_for_pending_waits_for_a_due_summary_a_worker_has_not_started(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    """With summaries on workers a round's summary is due, not processing, until a worker claims
    it: the context says so (summary_due), and a read waits for it to start and end."""
    api = await make_app(MEMORY_RUN_SUMMARIES=False)
    for n in range(3):
        await api.post_round("due", n)
    body = (await api.client.get("/conversations/due/context", params={"wait_for_pending": 0.3})).json()
    assert (body["summary_due"], body["processing"], body["waited"], body["pending"]) == (
        True,
        None,
        True,
        True,
    )

    waiting = asyncio.create_task(
        api.client.get("/conversations/due/context", params={"wait_for_pending": 20})
    )
    hub = api.app.state.hub
    await eventually(lambda: _true(hub.subscribers("due") == 1), what="the read to wait")
    await make_app()  # a replica that runs summaries: it claims the due one
    body = (await asyncio.wait_for(waiting, 15)).json()
    assert (body["waited"], body["pending"], body["summary_due"]) == (True, False, False)
    assert body["processing"] is None and body["summaries"][0]["end_sequence"] == 5
    assert len(llm.calls) == 1


async def test_wait_for_pending_is_capped_by_the_setting(make_app: AppFactory, llm: FakeLLM) -> None:
    api = await make_app(MEMORY_CONTEXT_MAX_WAIT_SECONDS=0.2)
    llm.hold = True
    for n in range(3):
        await api.post_round("capped", n)
    await asyncio.to_thread(llm.wait_for_calls, 1)
    started = time.monotonic()
    response = await api.client.get("/conversations/capped/context", params={"wait_for_pending": 600})
    assert response.json()["pending"] is True
    assert time.monotonic() - started < 5


async def test_wait_for_pending_must_be_a_finite_number(make_app: AppFactory) -> None:
    api = await make_app()
    for value in ("NaN", "nan", "inf", "-inf", "Infinity"):
        response = await api.client.get("/conversations/w/context", params={"wait_for_pending": value})
        assert response.status_code == 422, (value, response.text)
        body = response.json()
        assert body["code"] == "invalid_request"
        assert body["detail"][0]["loc"] == ["query", "wait_for_pending"]
        assert body["detail"][0]["msg"] == "Input should be a finite number"


async def test_an_event_id_past_a_bigint_is_a_422_before_the_stream(make_app: AppFactory) -> None:
    """Event ids are bigints: a larger resume point is refused up front, not by the database
    once the stream has started."""
    api = await make_app(MEMORY_SUMMARIZE_AFTER_SEQ=1000)
    await api.post_round("big", 0)
    for value, where in (
        ("9223372036854775808", "header"),
        ("99999999999999999999", "header"),
        ("9223372036854775808", "query"),
        ("99999999999999999999", "query"),
    ):
        if where == "header":
            response = await api.client.get("/conversations/big/events", headers={"Last-Event-ID": value})
            loc = ["header", "last-event-id"]
        else:
            response = await api.client.get("/conversations/big/events", params={"after": value})
            loc = ["query", "after"]
        assert response.status_code == 422, (value, where, response.text)
        body = response.json()
        assert body["code"] == "invalid_request"
        assert [e["loc"] for e in body["detail"]] == [loc]


async def test_the_largest_event_id_streams(database_url: str, llm: FakeLLM) -> None:
    settings = settings_for(
        database_url, llm, MEMORY_SUMMARIZE_AFTER_SEQ=1000, MEMORY_EVENTS_HEARTBEAT_SECONDS=0.05
    )
    async with served(settings) as a:
        await post_round(a.url, "top", 0)
        for headers, params in (({"Last-Event-ID": str(2**63 - 1)}, None), (None, {"after": 2**63 - 1})):
            async with stream(a.url, "top", headers=headers, params=params) as watching:
                assert watching.status == 200
                # A keepalive comes after the read of the events past the id: the read went well.
                await eventually(
                    lambda: _true(": keepalive" in watching.comments), what="a keepalive after the read"
                )
                assert watching.events == []


async def test_compression_failure_retry_and_a_recorded_event(
    make_app: AppFactory, llm: FakeLLM, db: asyncpg.Connection
) -> None:
    """compressed comes with summary:completed (tokens saved); a failure and its retry are
    events; record() writes an event with the caller's transaction, or not at all."""
    api = await make_app()
    policy = {"name": "token_budget", "max_entries": 6, "recent_window": 2, "min_entries_to_compress": 2}
    created = await api.client.post("/conversations", json={"conversation_id": "tb", "memory_policy": policy})
    assert created.status_code == 201
    llm.fail_next(1)
    for n in range(7):
        response = await api.client.post(
            "/conversations/tb/messages", json={"messages": [{"role": "user", "content": f"Step {n}."}]}
        )
        assert response.status_code == 201
    await api.idle()
    assert (await api.client.post("/ops/memories/1/retry")).status_code == 202
    await api.idle()
    found = await db.fetch(
        "SELECT event_id, type, data::text FROM events WHERE conversation_id = 'tb' ORDER BY event_id"
    )
    assert [(r["event_id"], r["type"]) for r in found] == [(i, "entry:added") for i in range(1, 8)] + [
        (8, "summary:started"),
        (9, "summary:failed"),
        (10, "summary:started"),
        (11, "summary:completed"),
        (12, "compressed"),
    ]
    failed, retried, compressed = (orjson.loads(found[i]["data"]) for i in (8, 9, 11))
    assert failed["memory_id"] == 1 and "500" in failed["error"]
    assert retried == {
        "memory_id": 1,
        "kind": "compression",
        "start_sequence": 0,
        "end_sequence": 4,
        "retry": True,
    }
    stored = await db.fetchrow("SELECT input_tokens, tokens FROM memory WHERE memory_id = 1")
    assert compressed["original_tokens"] == stored["input_tokens"]
    assert compressed["tokens_saved"] == stored["input_tokens"] - stored["tokens"]

    async with api.service.engine.connect() as conn:
        transaction = await conn.begin()
        assert await events.record(conn, conversation_id="tb", type=events.SESSION_CLEARED, data={}) == 13
        await transaction.rollback()
    async with api.service.engine.begin() as conn:
        assert await events.record(conn, conversation_id="tb", type=events.SESSION_CLEARED, data={}) == 13
        nobody = await events.record(conn, conversation_id="nobody", type=events.SESSION_CLEARED, data={})
        assert nobody is None
    assert await db.fetchval("SELECT max(event_id) FROM events WHERE conversation_id = 'tb'") == 13


async def test_a_conversation_created_again_goes_on_numbering(
    make_app: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_SUMMARIZE_AFTER_SEQ=1000)
    await api.post_round("again", 0)
    assert (await api.client.delete("/conversations/again")).status_code == 204
    created = await api.client.post("/conversations", json={"conversation_id": "again"})
    assert created.status_code == 201
    await api.post_round("again", 1)
    assert [i for i, _ in await stored_events(db, "again")] == [1, 2, 3, 4, 5]
    # A counter left behind (created while its DELETE committed) is repaired by the next write.
    await db.execute("UPDATE conversations SET last_event_id = 0 WHERE conversation_id = 'again'")
    await api.post_round("again", 2)
    await db.execute("UPDATE conversations SET last_event_id = 0 WHERE conversation_id = 'again'")
    assert (await api.client.delete("/conversations/again")).status_code == 204
    assert [t for _, t in await stored_events(db, "again")][-3:] == [
        "entry:added",
        "entry:added",
        "conversation:deleted",
    ]
    assert [i for i, _ in await stored_events(db, "again")] == list(range(1, 9))


async def test_clearing_records_session_cleared_and_an_import_goes_on_numbering(
    make_app: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_SUMMARIZE_AFTER_SEQ=1000)
    await api.post_round("cleared", 0)
    document = (await api.client.get("/conversations/cleared/export")).json()
    cleared = await api.client.delete("/conversations/cleared/messages")
    assert cleared.status_code == 200, cleared.text
    assert await stored_events(db, "cleared") == [
        (1, "entry:added"),
        (2, "entry:added"),
        (3, "session:cleared"),
    ]
    data = await db.fetchval(
        "SELECT data::text FROM events WHERE conversation_id = 'cleared' AND type = 'session:cleared'"
    )
    assert orjson.loads(data) == {"entries": 2, "memories": 0, "dropped_processing": None}

    assert (await api.client.delete("/conversations/cleared")).status_code == 204
    imported = await api.client.post("/conversations/import", json=document)
    assert imported.status_code == 201, imported.text
    await api.post_round("cleared", 1)
    assert await stored_events(db, "cleared") == [
        (1, "entry:added"),
        (2, "entry:added"),
        (3, "session:cleared"),
        (4, "conversation:deleted"),
        (5, "conversation:imported"),
        (6, "entry:added"),
        (7, "entry:added"),
    ]
