"""The client package (clients/python) against a real `memory-service serve`: every operation of
the OpenAPI document has a method in both clients and a model that matches its schema; calls,
errors, tenants and retries behave as documented."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import asyncpg
import httpx
import pytest
from memory_client import (
    AsyncClient,
    AuthenticationError,
    Client,
    ConflictError,
    InvalidRequestError,
    MemoryServiceError,
    NotFoundError,
    UnavailableError,
    models,
)
from memory_client.models import Event

from tests.fakellm import FakeLLM
from tests.integration.conftest import ADMIN_KEY, OTHER_TENANT_KEY, TENANT_KEY, Launch, eventually
from tests.integration.proxies import FaultyProxy
from tests.integration.servers import ServerProcess, free_port

ROUND: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Kyoto?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Kyoto"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "17C, rain"},
    {"role": "assistant", "content": "17C with rain."},
]


def rounds(n: int) -> list[list[dict[str, Any]]]:
    return [
        [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"Answer {i}."}]
        for i in range(n)
    ]


@pytest.fixture
def client(service: ServerProcess) -> Iterator[Client]:
    with Client(service.url, api_key=TENANT_KEY, max_retries=0) as c:
        yield c


@pytest.fixture
def openapi(service: ServerProcess) -> dict[str, Any]:
    schema: dict[str, Any] = httpx.get(
        f"{service.url}/openapi.json", headers={"X-API-Key": TENANT_KEY}
    ).json()
    return schema


def operations(openapi: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        operation["operationId"]: operation
        for path in openapi["paths"].values()
        for operation in path.values()
    }


def test_every_operation_has_a_method_in_both_clients(openapi: dict[str, Any]) -> None:
    """A new endpoint of the service fails this until it has a function in memory_client._core and
    a method in each client (named after its operation id)."""
    ids = set(operations(openapi))
    assert len(ids) >= 30
    for kind in (Client, AsyncClient):
        missing = sorted(i for i in ids if not callable(getattr(kind, i, None)))
        assert not missing, f"{kind.__name__} has no method for {missing}"
    for name in ids:
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name
        assert not inspect.iscoroutinefunction(getattr(Client, name)), name


def test_every_model_matches_the_service_schema(openapi: dict[str, Any]) -> None:
    """Each client model has the fields of the service's schema of the same name (less ``Out``):
    the service cannot add, drop or make optional a field unnoticed."""
    schemas = openapi["components"]["schemas"]
    checked = 0
    for name, kind in vars(models).items():
        if not (isinstance(kind, type) and issubclass(kind, models.Model)) or kind is models.Model:
            continue
        schema = schemas.get(f"{name}Out") or schemas.get(name)
        # The forms of the context (format=openai, anthropic) and the events of the text/event-stream
        # have no schema.
        if schema is None:
            assert name in {"OpenAIContext", "AnthropicContext", "Event"}, name
            continue
        fields = {f for f in kind.model_fields if f != "replayed"}
        assert fields == set(schema["properties"]), name
        required = {f for f, info in kind.model_fields.items() if info.is_required()}
        assert required <= set(schema.get("required", [])), name
        checked += 1
    assert checked >= 25


def test_a_conversation_round_trip(client: Client) -> None:
    created = client.create_conversation(
        "trip-1", memory_policy={"name": "sliding_window", "window_size": 4}, metadata={"user": "ana"}
    )
    assert created.memory_policy["window_size"] == 4 and created.metadata == {"user": "ana"}
    first = client.append_messages("trip-1", ROUND, metadata={"channel": "web"})
    assert (first.round, first.created, first.replayed) == (0, False, False)
    assert [m.type for m in first.messages] == ["message", "tool_call", "tool_result", "message"]
    assert [m.to_openai() for m in first.messages] == ROUND

    context = client.get_context("trip-1", context_window=1000)
    assert [m.sequence for m in context.messages] == [0, 1, 2, 3]
    assert context.tokens.total > 0 and context.context_window is not None
    assert client.get_openai_context("trip-1").messages == ROUND
    anthropic = client.get_anthropic_context("trip-1")
    assert anthropic.messages[0]["role"] == "user"
    assert "Kyoto" in client.get_text_context("trip-1", format="markdown")

    for messages in rounds(3):
        client.append_messages("trip-1", messages)
    assert client.get_context("trip-1", max_tokens=40).truncated
    page = client.list_messages("trip-1", limit=3)
    assert len(page.messages) == 3 and page.next_after_sequence == 2
    assert [m.sequence for m in client.iter_messages("trip-1", page_size=4)] == list(range(10))
    assert client.get_conversation("trip-1").round_count == 4
    updated = client.update_conversation("trip-1", memory_policy={"name": "sliding_window", "window_size": 6})
    assert updated.memory_policy["window_size"] == 6
    assert [c.conversation_id for c in client.list_conversations(include_metadata=True).conversations] == [
        "trip-1"
    ]
    assert client.list_memories("trip-1").conversation_id == "trip-1"
    assert client.get_memory_chain("trip-1").conversation_id == "trip-1"
    client.delete_conversation("trip-1")
    with pytest.raises(NotFoundError):
        client.get_conversation("trip-1")


def test_stats_export_import_and_clear(client: Client) -> None:
    client.append_messages("move-1", ROUND)
    stats = client.get_stats("move-1")
    assert (stats.total_entries, stats.active_entries, stats.summaries) == (4, 4, 0)
    document = client.export_conversation("move-1")
    imported = client.import_conversation(document, conversation_id="move-2")
    assert (imported.conversation_id, imported.entries, imported.memories) == ("move-2", 4, 0)
    copy = client.export_conversation("move-2")
    assert copy["entries"] == document["entries"]
    with pytest.raises(ConflictError) as taken:
        client.import_conversation(document)  # move-1 exists
    assert taken.value.code == "conflict"
    cleared = client.clear_messages("move-1")
    assert (cleared.entries, cleared.memories, cleared.dropped_processing) == (4, 0, None)
    assert client.get_stats("move-1").total_entries == 0
    assert client.append_messages("move-1", ROUND).round == 0


def test_summaries_and_ops(client: Client, llm: FakeLLM) -> None:
    llm.hold = True
    client.create_conversation("ops-1", memory_policy={"name": "sliding_window", "summarize_after_seq": 50})
    for messages in rounds(2):
        client.append_messages("ops-1", messages)
    started = client.summarize_now("ops-1")
    assert (started.status, started.end_sequence) == ("processing", 3)
    llm.wait_for_calls(1)
    with pytest.raises(ConflictError):
        client.compress("ops-1")  # one is processing
    assert [m.memory_id for m in client.list_stuck_memories(older_than_seconds=0)] == [started.memory_id]
    assert client.get_context("ops-1").processing is not None
    llm.release_all()
    assert client.list_failed_memories(limit=5) == []
    assert client.list_failing_conversations() == []
    assert isinstance(client.get_window_progression(limit=5), list)
    assert client.get_generation_stats().total_summaries >= 0
    assert client.get_runner_stats().runs_summaries
    with pytest.raises(NotFoundError):
        client.retry_memory(999_999)
    assert client.healthz().status == "ok"
    assert client.readyz().status == "ready"


def test_the_admin_operations(service: ServerProcess, client: Client) -> None:
    client.append_messages("admin-1", rounds(1)[0])
    with Client(service.url, api_key=ADMIN_KEY) as admin:
        assert admin.admin_memory_chain("admin-1").memories == []
        assert admin.admin_stuck_memories() == []
        assert admin.admin_failed_memories(limit=3) == []
        assert admin.admin_failing_conversations(limit=3) == []
        assert admin.admin_window_progression(limit=3) == []
        assert admin.admin_generation_stats().total_summaries == 0
        assert isinstance(admin.admin_runner_stats().tenants, list)
        with pytest.raises(NotFoundError):
            admin.admin_retry_memory(999_999)
        assert admin.admin_summarize_now("admin-1").end_sequence == 1
    with pytest.raises(AuthenticationError) as forbidden:
        client.admin_runner_stats()
    assert forbidden.value.status_code == 403


def test_errors_carry_status_code_and_detail(service: ServerProcess, client: Client) -> None:
    client.create_conversation("taken")
    with pytest.raises(ConflictError) as conflict:
        client.create_conversation("taken")
    assert (conflict.value.status_code, conflict.value.code) == (409, "conflict")
    assert "taken" in conflict.value.detail
    with pytest.raises(InvalidRequestError) as invalid:
        client.append_messages("taken", [{"role": "robot", "content": "hi"}])
    assert invalid.value.code == "invalid_request"
    assert invalid.value.detail[0]["loc"][:3] == ["body", "messages", 0]
    with pytest.raises(NotFoundError) as missing:
        client.list_memories("never-written")
    assert missing.value.code == "not_found" and missing.value.request_id
    with (
        Client(service.url, api_key="not-a-key-0123456789") as stranger,
        pytest.raises(AuthenticationError) as unauthorized,
    ):
        stranger.list_conversations()
    assert (unauthorized.value.status_code, unauthorized.value.code) == (401, "unauthorized")


def test_each_tenant_sees_its_own_conversations(service: ServerProcess, client: Client) -> None:
    client.append_messages("shared-id", rounds(1)[0])
    with Client(service.url, api_key=OTHER_TENANT_KEY) as other:
        assert other.list_conversations().conversations == []
        assert other.get_context("shared-id").messages == []  # reads as never written
        with pytest.raises(NotFoundError):
            other.get_conversation("shared-id")


def test_the_environment_configures_the_client(
    service: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORY_SERVICE_URL", service.url)
    monkeypatch.setenv("MEMORY_SERVICE_API_KEY", TENANT_KEY)
    with Client() as client:
        assert client.list_conversations().conversations == []


async def test_the_async_client(service: ServerProcess) -> None:
    async with AsyncClient(service.url, api_key=TENANT_KEY) as client:
        appended = await client.append_messages("async-1", ROUND)
        assert appended.created
        context = await client.get_context("async-1")
        assert [m.to_openai() for m in context.messages] == ROUND
        assert [m.sequence async for m in client.iter_messages("async-1", page_size=3)] == [0, 1, 2, 3]
        with pytest.raises(NotFoundError) as missing:
            await client.get_conversation("nope")
        assert missing.value.status_code == 404


def wait_for(check: Callable[[], bool], *, within: float = 15.0, what: str = "condition") -> None:
    """Poll ``check`` until it is true; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# ---- Sessions, users, exports ----


def test_an_ended_conversation_refuses_messages(client: Client) -> None:
    created = client.create_conversation("end-1", user_id="ana")
    assert (created.user_id, created.ended_at, created.archived_at) == ("ana", None, None)
    assert created.last_message_at is not None
    client.append_messages("end-1", ROUND)
    ended = client.end_conversation("end-1")
    assert ended.ended_at is not None and ended.user_id == "ana" and ended.message_count == 4
    assert client.get_conversation("end-1").ended_at == ended.ended_at
    with pytest.raises(ConflictError) as refused:
        client.append_messages("end-1", rounds(1)[0])
    assert refused.value.code == "conflict" and "was ended" in refused.value.detail
    again = client.end_conversation("end-1")
    assert again.ended_at == ended.ended_at and again.final_summary is None
    assert client.get_stats("end-1").total_entries == 4
    with pytest.raises(NotFoundError):
        client.end_conversation("never-written")


def test_a_users_context_and_memories_across_conversations(client: Client) -> None:
    for cid in ("u-1", "u-2"):
        client.create_conversation(cid, user_id="bo", memory_policy={"name": "recursive_summary"})
        for messages in rounds(2):
            client.append_messages(cid, messages)
        client.end_conversation(cid)

    def built() -> bool:
        context = client.get_user_context("bo")
        return context.summary is not None and context.freshness.fresh

    wait_for(built, what="the user's summary of both conversations")
    context = client.get_user_context("bo")
    assert context.user_id == "bo" and context.processing is None and context.freshness.behind is None
    assert context.summary is not None and context.summary.status == "completed"
    assert {source["conversation_id"] for source in context.summary.sources} == {"u-1", "u-2"}
    memories = client.list_user_memories("bo")
    assert memories.user_id == "bo" and memories.memories[0].memory_id == context.summary.memory_id
    assert all(m.status == "completed" for m in memories.memories)

    # A new session of the user carries the summary in its context.
    client.create_conversation("u-3", user_id="bo")
    brief = client.get_context("u-3").user_summary
    assert brief is not None and (brief.memory_id, brief.text) == (
        context.summary.memory_id,
        context.summary.text,
    )
    assert client.get_context("trip-none").user_summary is None
    with pytest.raises(NotFoundError):
        client.get_user_context("nobody")
    with pytest.raises(NotFoundError):
        client.list_user_memories("nobody")


def test_export_as_markdown(client: Client) -> None:
    client.append_messages("md-1", ROUND)
    markdown = client.export_conversation("md-1", format="markdown")
    assert isinstance(markdown, str) and markdown.startswith("# Session: ")
    assert "- Conversation: md-1" in markdown and "**Message 1 (User):** Weather in Kyoto?" in markdown
    document = client.export_conversation("md-1")
    assert document["conversation"]["conversation_id"] == "md-1" and len(document["entries"]) == 4


def test_wait_for_pending(service: ServerProcess, client: Client, llm: FakeLLM) -> None:
    idle = client.get_context("wait-1", wait_for_pending=5)
    assert (idle.waited, idle.pending) == (False, False)
    assert client.get_context("wait-1").waited is None  # only with wait_for_pending

    llm.hold = True
    client.create_conversation("wait-1", memory_policy={"name": "sliding_window", "summarize_after_seq": 50})
    for messages in rounds(2):
        client.append_messages("wait-1", messages)
    started = client.summarize_now("wait-1")
    llm.wait_for_calls(1)
    # The wait is added to the read timeout: a client timing out after 1 s still gets the answer
    # of a 2 s wait.
    with Client(service.url, api_key=TENANT_KEY, timeout=1, max_retries=0) as impatient:
        held = impatient.get_context("wait-1", wait_for_pending=2)
    assert (held.waited, held.pending) == (True, True)
    assert held.processing is not None and held.processing.memory_id == started.memory_id

    llm.release_all()
    done = client.get_context("wait-1", wait_for_pending=20)
    assert done.pending is False and done.processing is None
    assert [s.memory_id for s in done.summaries] == [started.memory_id]


async def test_archived_conversations_are_listed_and_restored(launch: Launch, db: asyncpg.Connection) -> None:
    """A server that archives conversations idle for a day, checking every 50 ms (the clock is
    moved by back-dating last_message_at)."""
    server = launch(MEMORY_ARCHIVE_AFTER_DAYS="1", MEMORY_REAPER_INTERVAL_SECONDS="0.05")
    async with AsyncClient(server.url, max_retries=0) as plain:
        for cid in ("old", "recent"):
            await plain.append_messages(cid, rounds(1)[0])
        await db.execute(
            "UPDATE conversations SET last_message_at = now() - interval '2 days' "
            "WHERE conversation_id = 'old'"
        )

        async def archived() -> bool:
            return bool((await plain.list_archived_conversations()).conversations)

        await eventually(archived, what="the archive")
        page = await plain.list_archived_conversations(limit=5)
        assert [c.conversation_id for c in page.conversations] == ["old"]
        assert page.conversations[0].archived_at is not None and page.next_after is None
        assert [c.conversation_id for c in (await plain.list_conversations()).conversations] == ["recent"]
        everything = await plain.list_conversations(include_archived=True)
        assert [c.conversation_id for c in everything.conversations] == ["old", "recent"]
        with pytest.raises(ConflictError):
            await plain.append_messages("old", rounds(1)[0])

        restored = await plain.restore_conversation("old")
        assert restored.conversation_id == "old" and restored.archived_at is None
        assert (await plain.list_archived_conversations()).conversations == []
        with pytest.raises(ConflictError):
            await plain.restore_conversation("old")  # not archived
        assert (await plain.append_messages("old", rounds(1)[0])).round == 1


# ---- Webhooks ----


def test_webhooks_are_created_listed_and_deleted(client: Client) -> None:
    created = client.create_webhook("http://127.0.0.1:9/hooks/memory")
    assert created.url == "http://127.0.0.1:9/hooks/memory" and len(created.secret) >= 16
    listed = client.list_webhooks()
    assert [(w.webhook_id, w.url) for w in listed] == [(created.webhook_id, created.url)]
    assert "secret" not in listed[0].model_dump()
    with pytest.raises(InvalidRequestError):
        client.create_webhook("not a url")
    client.delete_webhook(created.webhook_id)
    assert client.list_webhooks() == []
    with pytest.raises(NotFoundError):
        client.delete_webhook(created.webhook_id)
    assert client.list_dead_deliveries(limit=10) == []
    with pytest.raises(NotFoundError):
        client.retry_delivery(created.webhook_id, "nope", 1)


async def test_a_dead_delivery_is_listed_and_sent_again(launch: Launch) -> None:
    """A server that gives a delivery one attempt, to an endpoint where nothing listens."""
    server = launch(MEMORY_WEBHOOK_MAX_ATTEMPTS="1", MEMORY_WEBHOOK_INTERVAL_SECONDS="0.05")
    async with AsyncClient(server.url, max_retries=0) as plain:
        hook = await plain.create_webhook(f"http://127.0.0.1:{free_port()}/hook")
        assert [w.webhook_id for w in await plain.list_webhooks()] == [hook.webhook_id]
        await plain.append_messages("dead-1", [{"role": "user", "content": "hi"}])

        async def dead() -> bool:
            return bool(await plain.list_dead_deliveries())

        await eventually(dead, what="a dead delivery")
        delivery = (await plain.list_dead_deliveries(limit=1))[0]
        assert (delivery.conversation_id, delivery.webhook_id, delivery.attempts) == (
            "dead-1",
            hook.webhook_id,
            1,
        )
        assert delivery.url == hook.url and delivery.last_error
        retried = await plain.retry_delivery(hook.webhook_id, "dead-1", delivery.event_id)
        assert (retried.event_id, retried.status) == (delivery.event_id, "pending")
        await plain.delete_webhook(hook.webhook_id)
        assert await plain.list_webhooks() == []


# ---- Events ----


def test_the_event_stream_yields_new_events_and_resumes_after_an_id(client: Client) -> None:
    client.append_messages("ev-1", ROUND)
    with client.stream_events("ev-1") as stream:
        first = [next(stream) for _ in range(4)]
        assert [e.type for e in first] == ["entry:added"] * 4
        assert [e.data["sequence"] for e in first] == [0, 1, 2, 3]
        assert [e.event_id for e in first] == sorted({e.event_id for e in first})
        assert stream.last_event_id == first[-1].event_id
        # A round posted while the stream is open comes through it.
        client.append_messages("ev-1", rounds(1)[0])
        live = [next(stream) for _ in range(2)]
        assert [(e.type, e.data["sequence"], e.data["role"]) for e in live] == [
            ("entry:added", 4, "user"),
            ("entry:added", 5, "assistant"),
        ]
    with pytest.raises(StopIteration):
        next(stream)  # closed

    with client.stream_events("ev-1", after=first[1].event_id) as resumed:
        assert [next(resumed).event_id for _ in range(4)] == [e.event_id for e in first[2:] + live]


def test_a_silent_stream_is_opened_again_after_the_last_event(
    service: ServerProcess, client: Client, proxy: FaultyProxy
) -> None:
    """Through a proxy, with a 0.5 s read timeout: the silent stream times out and is opened again
    (the proxy answers that attempt 503, retried) with the last event's id, and then misses and
    repeats nothing. ``close()`` from another thread ends the iteration."""
    client.append_messages("ev-2", [{"role": "user", "content": "one"}])
    seen: list[Event] = []
    with Client(proxy.url, api_key=TENANT_KEY, timeout=0.5, max_retries=3) as flaky:
        stream = flaky.stream_events("ev-2")
        reader = threading.Thread(target=lambda: seen.extend(stream), daemon=True)
        reader.start()
        wait_for(lambda: len(seen) == 1, what="the first event")
        proxy.faults.append("unavailable")
        wait_for(lambda: len(proxy.requests) == 1, what="the stream to be opened again")
        assert f"last-event-id: {seen[0].event_id}".encode() in proxy.requests[0].lower()
        client.append_messages("ev-2", [{"role": "user", "content": "two"}])
        wait_for(lambda: len(seen) == 2, what="the event after the reconnection")
        assert seen[1].event_id > seen[0].event_id and seen[1].data["sequence"] == 1
        stream.close()
        reader.join(timeout=10)
        assert not reader.is_alive()
    assert [e.data["sequence"] for e in seen] == [0, 1]


async def test_the_async_event_stream(service: ServerProcess) -> None:
    async with AsyncClient(service.url, api_key=TENANT_KEY) as client:
        await client.append_messages("ev-3", [{"role": "user", "content": "one"}])
        async with await client.stream_events("ev-3") as stream:
            first = await anext(stream)
            assert (first.type, first.data["sequence"]) == ("entry:added", 0)
            await client.append_messages("ev-3", [{"role": "user", "content": "two"}])
            second = await anext(stream)
            assert second.data["sequence"] == 1 and stream.last_event_id == second.event_id

            # Closed while another task waits on it: that task's iteration ends at the next line
            # (here the next event's), without yielding it.
            waiting = asyncio.create_task(anext(stream))
            await eventually(lambda: _true(stream._iterating), what="the task to wait")
            await stream.aclose()
            await client.append_messages("ev-3", [{"role": "user", "content": "three"}])
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(waiting, 10)

        resumed = await client.stream_events("ev-3", after=first.event_id)
        try:
            assert [(await anext(resumed)).data["sequence"] for _ in range(2)] == [1, 2]
        finally:
            await resumed.aclose()
        with pytest.raises(StopAsyncIteration):
            await anext(resumed)


async def _true(value: bool) -> bool:
    return value


# ---- Retries ----


@pytest.fixture
def proxy(service: ServerProcess) -> Iterator[FaultyProxy]:
    faulty = FaultyProxy(service.port)
    yield faulty
    faulty.close()


def test_a_lost_answer_is_retried_with_the_same_key_and_stored_once(
    client: Client, proxy: FaultyProxy
) -> None:
    proxy.faults.extend(["drop_response", "drop_response"])
    with Client(proxy.url, api_key=TENANT_KEY, max_retries=2) as flaky:
        result = flaky.append_messages("retry-1", ROUND)
    assert result.replayed and result.round == 0
    keys = {
        line
        for r in proxy.requests
        for line in r.split(b"\r\n")
        if line.lower().startswith(b"idempotency-key")
    }
    assert len(proxy.requests) == 2 and len(keys) == 1
    assert len(list(client.iter_messages("retry-1"))) == 4


async def test_the_async_client_retries_a_lost_answer_once_stored(client: Client, proxy: FaultyProxy) -> None:
    proxy.faults.append("drop_response")
    async with AsyncClient(proxy.url, api_key=TENANT_KEY, max_retries=1) as flaky:
        result = await flaky.append_messages("retry-2", ROUND, idempotency_key="my-key-1")
    assert result.replayed
    assert client.get_conversation("retry-2").message_count == 4


def test_a_503_is_retried_after_its_retry_after(client: Client, proxy: FaultyProxy) -> None:
    proxy.faults.extend(["unavailable", "unavailable"])
    with Client(proxy.url, api_key=TENANT_KEY, max_retries=2) as flaky:
        created = flaky.create_conversation("retry-3")
    assert created.conversation_id == "retry-3" and len(proxy.requests) == 2


def test_retries_give_up_with_the_last_error(proxy: FaultyProxy) -> None:
    proxy.faults.extend(["unavailable", "unavailable"])
    with (
        Client(proxy.url, api_key=TENANT_KEY, max_retries=1) as flaky,
        pytest.raises(UnavailableError) as unavailable,
    ):
        flaky.list_conversations()
    assert unavailable.value.code == "unavailable" and isinstance(unavailable.value, MemoryServiceError)


def test_a_write_without_a_key_is_not_retried_after_a_lost_answer(client: Client, proxy: FaultyProxy) -> None:
    """Creating a conversation carries no Idempotency-Key: a retry could not tell a lost answer
    from a taken id, so the transport error is raised and the conversation exists once."""
    proxy.faults.append("drop_response")
    with (
        Client(proxy.url, api_key=TENANT_KEY, max_retries=3) as flaky,
        pytest.raises(httpx.TransportError),
    ):
        flaky.create_conversation("retry-4")
    assert len(proxy.requests) == 1
    assert client.get_conversation("retry-4").conversation_id == "retry-4"
