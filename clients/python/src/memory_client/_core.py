"""What the sync and async clients share: each operation as a description of its request
(``Call``), and when to retry.

An operation is defined once here, as a function that builds its ``Call``; ``Client`` and
``AsyncClient`` each add a one-line method that sends it. Adding an endpoint of the service means
one function here and one method in each client (a test fails until every operation of the
service's OpenAPI document has both)."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, Generic, Literal, TypeVar, overload
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from memory_client import models

T = TypeVar("T")

Json = Mapping[str, Any]
TextFormat = Literal["text", "markdown"]
ExportFormat = Literal["json", "markdown"]

# The service answers 503 when it refused a request whole (the database is unavailable): any call
# may be sent again. A gateway's 502 and 504 may come after the service did the work, so only a
# replayable call is sent again after them.
REFUSED = 503
GATEWAY_ERRORS = frozenset({502, 504})


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer.

    ``replayable`` says whether sending it twice is safe: reads, and an append carrying an
    Idempotency-Key (the service stores the round once and answers the retry with the first
    answer). Other writes are retried only when the service cannot have seen them (the connection
    was never made) or refused them whole (503)."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    replayable: bool = False
    # Seconds the service may hold the answer on purpose (?wait_for_pending), added to the read
    # timeout so that a wait it was asked for does not time out.
    waits: float = 0.0

    def timeout(self, base: httpx.Timeout) -> httpx.Timeout:
        if not self.waits or base.read is None:
            return base
        return httpx.Timeout(
            connect=base.connect, read=base.read + self.waits, write=base.write, pool=base.pool
        )


@dataclass(frozen=True)
class Retries:
    """Retry up to ``max_retries`` times, waiting ``backoff * 2**attempt`` seconds (at most
    ``max_backoff``, with full jitter) or the ``Retry-After`` the service sent: any call after a
    503 or a connection that could not be made; a replayable call also after a lost answer
    (timeout, dropped connection) or a gateway's 502/504."""

    max_retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 8.0

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None and (after := _retry_after(response)) is not None:
            return min(after, self.max_backoff)
        return random.uniform(0, min(self.max_backoff, self.backoff * 2**attempt))

    def should_retry(
        self, call: Call[Any], attempt: int, response: httpx.Response | None, error: httpx.HTTPError | None
    ) -> bool:
        if attempt >= self.max_retries:
            return False
        if response is not None:
            status = response.status_code
            return status == REFUSED or (call.replayable and status in GATEWAY_ERRORS)
        if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
            return True  # never reached the service
        return call.replayable and isinstance(error, httpx.TransportError)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(value) - dt.datetime.now(dt.UTC)).total_seconds())
    except (TypeError, ValueError):
        return None


def _model(kind: type[T]) -> Callable[[httpx.Response], T]:
    adapter = TypeAdapter(kind)
    return lambda response: adapter.validate_json(response.content)


def _none(response: httpx.Response) -> None:
    return None


def _text(response: httpx.Response) -> str:
    return response.text


class EventParser:
    """Reads a text/event-stream line by line: ``feed`` returns the event a blank line completes.

    The service puts the whole event (its id and type too) on one ``data`` line, so the ``id`` and
    ``event`` fields are not needed; they, ``retry`` and comments (``: keepalive``) are skipped."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> models.Event | None:
        if not line:
            if not self._data:
                return None
            data, self._data = "\n".join(self._data), []
            return models.Event.model_validate_json(data)
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value.removeprefix(" "))
        return None


def _events(response: httpx.Response) -> EventParser:
    return EventParser()


def _appended(response: httpx.Response) -> models.AppendMessages:
    result = models.AppendMessages.model_validate_json(response.content)
    result.replayed = response.headers.get("idempotent-replayed") == "true"
    return result


def _id(value: str | int) -> str:
    return quote(str(value), safe="")


def _query(**values: Any) -> dict[str, Any]:
    """Query parameters, leaving out those not given (the service's defaults apply)."""
    return {
        key: ("true" if value else "false") if isinstance(value, bool) else value
        for key, value in values.items()
        if value is not None
    }


# ---- Conversations and their messages ----


def append_messages(
    conversation_id: str,
    messages: Sequence[Json],
    *,
    metadata: Json | None = None,
    idempotency_key: str | None = None,
) -> Call[models.AppendMessages]:
    """A round. With no key given, the client makes one, so its own retries store the round once."""
    body: dict[str, Any] = {"messages": [dict(m) for m in messages]}
    if metadata is not None:
        body["metadata"] = dict(metadata)
    return Call(
        "POST",
        f"/conversations/{_id(conversation_id)}/messages",
        _appended,
        json=body,
        headers={"Idempotency-Key": idempotency_key or str(uuid.uuid4())},
        replayable=True,
    )


def list_messages(
    conversation_id: str, *, after_sequence: int | None = None, limit: int | None = None
) -> Call[models.MessagesPage]:
    return Call(
        "GET",
        f"/conversations/{_id(conversation_id)}/messages",
        _model(models.MessagesPage),
        params=_query(after_sequence=after_sequence, limit=limit),
        replayable=True,
    )


def create_conversation(
    conversation_id: str,
    *,
    memory_policy: Json | None = None,
    metadata: Json | None = None,
    user_id: str | None = None,
) -> Call[models.Conversation]:
    body: dict[str, Any] = {"conversation_id": conversation_id}
    if memory_policy is not None:
        body["memory_policy"] = dict(memory_policy)
    if metadata is not None:
        body["metadata"] = dict(metadata)
    if user_id is not None:
        body["user_id"] = user_id
    return Call("POST", "/conversations", _model(models.Conversation), json=body)


def list_conversations(
    *,
    after: str | None = None,
    limit: int | None = None,
    include_metadata: bool | None = None,
    include_archived: bool | None = None,
) -> Call[models.ConversationsPage]:
    return Call(
        "GET",
        "/conversations",
        _model(models.ConversationsPage),
        params=_query(
            after=after, limit=limit, include_metadata=include_metadata, include_archived=include_archived
        ),
        replayable=True,
    )


def end_conversation(conversation_id: str) -> Call[models.EndConversation]:
    # Ending it again changes nothing (the second answer has no final_summary): safe to replay.
    return Call(
        "POST",
        f"/conversations/{_id(conversation_id)}/end",
        _model(models.EndConversation),
        replayable=True,
    )


def get_conversation(conversation_id: str) -> Call[models.Conversation]:
    return Call("GET", f"/conversations/{_id(conversation_id)}", _model(models.Conversation), replayable=True)


def update_conversation(conversation_id: str, *, memory_policy: Json) -> Call[models.Conversation]:
    # Setting parameters to given values: sending it twice leaves the same state.
    return Call(
        "PATCH",
        f"/conversations/{_id(conversation_id)}",
        _model(models.Conversation),
        json={"memory_policy": dict(memory_policy)},
        replayable=True,
    )


def delete_conversation(conversation_id: str) -> Call[None]:
    # Not replayed after a lost answer: the retry of a delete that went through is a 404.
    return Call("DELETE", f"/conversations/{_id(conversation_id)}", _none)


def compress(conversation_id: str) -> Call[models.MemoryStarted]:
    return Call("POST", f"/conversations/{_id(conversation_id)}/compress", _model(models.MemoryStarted))


def get_stats(conversation_id: str) -> Call[models.Stats]:
    return _read(f"/conversations/{_id(conversation_id)}/stats", models.Stats)


@overload
def export_conversation(
    conversation_id: str, *, format: Literal["json"] = "json"
) -> Call[dict[str, Any]]: ...


@overload
def export_conversation(conversation_id: str, *, format: Literal["markdown"]) -> Call[str]: ...


def export_conversation(
    conversation_id: str, *, format: ExportFormat = "json"
) -> Call[dict[str, Any]] | Call[str]:
    """``json``: the export document as the service wrote it, to give back to
    ``import_conversation``; ``markdown``: the session as text."""
    path = f"/conversations/{_id(conversation_id)}/export"
    if format == "markdown":
        return Call("GET", path, _text, params={"format": format}, replayable=True)
    return _read(path, dict[str, Any], format=format)


def import_conversation(document: Json, *, conversation_id: str | None = None) -> Call[models.Imported]:
    # Not replayed after a lost answer: the retry of an import that went through is a 409.
    return Call(
        "POST",
        "/conversations/import",
        _model(models.Imported),
        params=_query(conversation_id=conversation_id),
        json=dict(document),
    )


def clear_messages(conversation_id: str) -> Call[models.Cleared]:
    # Not replayed after a lost answer: a second clear could delete rounds posted in between.
    return Call("DELETE", f"/conversations/{_id(conversation_id)}/messages", _model(models.Cleared))


# ---- Context ----


def _context_params(format: str, max_tokens: int | None, context_window: int | None) -> dict[str, Any]:
    return _query(format=format, max_tokens=max_tokens, context_window=context_window)


def get_context(
    conversation_id: str,
    *,
    max_tokens: int | None = None,
    context_window: int | None = None,
    wait_for_pending: float | None = None,
) -> Call[models.Context]:
    return Call(
        "GET",
        f"/conversations/{_id(conversation_id)}/context",
        _model(models.Context),
        params=_context_params("json", max_tokens, context_window)
        | _query(wait_for_pending=wait_for_pending),
        replayable=True,
        waits=wait_for_pending or 0.0,
    )


def get_openai_context(conversation_id: str, *, max_tokens: int | None = None) -> Call[models.OpenAIContext]:
    return Call(
        "GET",
        f"/conversations/{_id(conversation_id)}/context",
        _model(models.OpenAIContext),
        params=_context_params("openai", max_tokens, None),
        replayable=True,
    )


def get_anthropic_context(
    conversation_id: str, *, max_tokens: int | None = None
) -> Call[models.AnthropicContext]:
    return Call(
        "GET",
        f"/conversations/{_id(conversation_id)}/context",
        _model(models.AnthropicContext),
        params=_context_params("anthropic", max_tokens, None),
        replayable=True,
    )


def get_text_context(
    conversation_id: str, *, format: TextFormat = "text", max_tokens: int | None = None
) -> Call[str]:
    return Call(
        "GET",
        f"/conversations/{_id(conversation_id)}/context",
        _text,
        params=_context_params(format, max_tokens, None),
        replayable=True,
    )


def list_memories(conversation_id: str) -> Call[models.Memories]:
    return Call(
        "GET", f"/conversations/{_id(conversation_id)}/memories", _model(models.Memories), replayable=True
    )


# ---- Events ----


def stream_events(conversation_id: str, *, after: int | None = None) -> Call[EventParser]:
    """The stream's request; its answer stays open and is read line by line with the parser."""
    return Call(
        "GET",
        f"/conversations/{_id(conversation_id)}/events",
        _events,
        headers={} if after is None else {"Last-Event-ID": str(after)},
        replayable=True,
    )


# ---- Users ----


def get_user_context(user_id: str) -> Call[models.UserContext]:
    return _read(f"/users/{_id(user_id)}/context", models.UserContext)


def list_user_memories(user_id: str) -> Call[models.UserMemories]:
    return _read(f"/users/{_id(user_id)}/memories", models.UserMemories)


# ---- Webhooks ----


def create_webhook(url: str) -> Call[models.WebhookCreated]:
    # Not replayed after a lost answer: the retry would make a second endpoint.
    return Call("POST", "/webhooks", _model(models.WebhookCreated), json={"url": url})


def list_webhooks() -> Call[list[models.Webhook]]:
    return _read("/webhooks", list[models.Webhook])


def delete_webhook(webhook_id: int) -> Call[None]:
    # Not replayed after a lost answer: the retry of a delete that went through is a 404.
    return Call("DELETE", f"/webhooks/{_id(webhook_id)}", _none)


# ---- Operations (/ops: the caller's tenant; /admin/ops: every tenant, with the admin key) ----


def _read(path: str, kind: type[T], **params: Any) -> Call[T]:
    return Call("GET", path, _model(kind), params=_query(**params), replayable=True)


def _start(path: str) -> Call[models.MemoryStarted]:
    return Call("POST", path, _model(models.MemoryStarted))


def get_memory_chain(conversation_id: str) -> Call[models.Memories]:
    return _read(f"/ops/conversations/{_id(conversation_id)}/memory-chain", models.Memories)


def list_archived_conversations(
    *, after: str | None = None, limit: int | None = None
) -> Call[models.ConversationsPage]:
    return _read("/ops/conversations/archived", models.ConversationsPage, after=after, limit=limit)


def restore_conversation(conversation_id: str) -> Call[models.Conversation]:
    # Not replayed after a lost answer: the retry of a restore that went through is a 409.
    return Call("POST", f"/ops/conversations/{_id(conversation_id)}/restore", _model(models.Conversation))


def list_stuck_memories(*, older_than_seconds: float | None = None) -> Call[list[models.StuckMemory]]:
    return _read("/ops/memories/stuck", list[models.StuckMemory], older_than_seconds=older_than_seconds)


def list_failed_memories(*, limit: int | None = None) -> Call[list[models.FailedMemory]]:
    return _read("/ops/memories/failed", list[models.FailedMemory], limit=limit)


def list_failing_conversations(*, limit: int | None = None) -> Call[list[models.FailingConversation]]:
    return _read("/ops/conversations/failing", list[models.FailingConversation], limit=limit)


def get_window_progression(*, limit: int | None = None) -> Call[list[models.WindowRow]]:
    return _read("/ops/memories/window-progression", list[models.WindowRow], limit=limit)


def get_generation_stats() -> Call[models.GenerationStats]:
    return _read("/ops/memories/generation-stats", models.GenerationStats)


def retry_memory(memory_id: int) -> Call[models.MemoryStarted]:
    return _start(f"/ops/memories/{_id(memory_id)}/retry")


def summarize_now(conversation_id: str) -> Call[models.MemoryStarted]:
    return _start(f"/ops/conversations/{_id(conversation_id)}/summarize")


def get_runner_stats() -> Call[models.RunnerStats]:
    return _read("/ops/runner", models.RunnerStats)


def list_dead_deliveries(*, limit: int | None = None) -> Call[list[models.DeadDelivery]]:
    return _read("/ops/webhooks/dead", list[models.DeadDelivery], limit=limit)


def retry_delivery(webhook_id: int, conversation_id: str, event_id: int) -> Call[models.RetriedDelivery]:
    # Not replayed after a lost answer: the retry of one that went through is a 409 (not dead).
    return Call(
        "POST",
        f"/ops/webhooks/{_id(webhook_id)}/deliveries/{_id(conversation_id)}/{_id(event_id)}/retry",
        _model(models.RetriedDelivery),
    )


def admin_memory_chain(conversation_id: str) -> Call[models.Memories]:
    return _read(f"/admin/ops/conversations/{_id(conversation_id)}/memory-chain", models.Memories)


def admin_stuck_memories(*, older_than_seconds: float | None = None) -> Call[list[models.AdminStuckMemory]]:
    return _read(
        "/admin/ops/memories/stuck", list[models.AdminStuckMemory], older_than_seconds=older_than_seconds
    )


def admin_failed_memories(*, limit: int | None = None) -> Call[list[models.AdminFailedMemory]]:
    return _read("/admin/ops/memories/failed", list[models.AdminFailedMemory], limit=limit)


def admin_failing_conversations(*, limit: int | None = None) -> Call[list[models.AdminFailingConversation]]:
    return _read("/admin/ops/conversations/failing", list[models.AdminFailingConversation], limit=limit)


def admin_window_progression(*, limit: int | None = None) -> Call[list[models.AdminWindowRow]]:
    return _read("/admin/ops/memories/window-progression", list[models.AdminWindowRow], limit=limit)


def admin_generation_stats() -> Call[models.GenerationStats]:
    return _read("/admin/ops/memories/generation-stats", models.GenerationStats)


def admin_retry_memory(memory_id: int) -> Call[models.MemoryStarted]:
    return _start(f"/admin/ops/memories/{_id(memory_id)}/retry")


def admin_summarize_now(conversation_id: str) -> Call[models.MemoryStarted]:
    return _start(f"/admin/ops/conversations/{_id(conversation_id)}/summarize")


def admin_runner_stats() -> Call[models.AdminRunnerStats]:
    return _read("/admin/ops/runner", models.AdminRunnerStats)


def admin_dead_deliveries(*, limit: int | None = None) -> Call[list[models.AdminDeadDelivery]]:
    return _read("/admin/ops/webhooks/dead", list[models.AdminDeadDelivery], limit=limit)


def admin_retry_delivery(
    webhook_id: int, conversation_id: str, event_id: int
) -> Call[models.RetriedDelivery]:
    # Not replayed after a lost answer, as retry_delivery.
    return Call(
        "POST",
        f"/admin/ops/webhooks/{_id(webhook_id)}/deliveries/{_id(conversation_id)}/{_id(event_id)}/retry",
        _model(models.RetriedDelivery),
    )


# ---- Health ----


def healthz() -> Call[models.Health]:
    return Call("GET", "/healthz", _model(models.Health), replayable=True)


def readyz() -> Call[models.Ready]:
    return Call("GET", "/readyz", _model(models.Ready), replayable=True)
