"""The synchronous client."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

import httpx

from memory_client import _base, _core, models
from memory_client._core import Call, ExportFormat, Json, Retries, TextFormat
from memory_client.errors import MemoryServiceError

T = TypeVar("T")


class Client:
    """The memory service over HTTP, one method per operation (named after its OpenAPI
    operation id).

    ``base_url`` defaults to ``MEMORY_SERVICE_URL`` (else http://127.0.0.1:8000), ``api_key`` to
    ``MEMORY_SERVICE_API_KEY`` (a tenant's key: every call sees that tenant's conversations only).
    Pass ``http_client`` to bring your own ``httpx.Client`` (its base URL and headers are then
    yours to set). Errors raise ``MemoryServiceError`` (``status_code``, ``code``, ``detail``)."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.retries = Retries(max_retries=max_retries)
        self._owned = http_client is None
        self.http = http_client or httpx.Client(
            base_url=_base.base_url(base_url), headers=_base.headers(api_key), timeout=timeout
        )

    def close(self) -> None:
        if self._owned:
            self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _send(self, call: Call[T]) -> T:
        return call.parse(self._respond(call))

    def _respond(self, call: Call[Any], *, stream: bool = False) -> httpx.Response:
        """A successful response, after the retries ``call`` allows; with ``stream``, its body is
        left unread (the caller closes it)."""
        attempt = 0
        while True:
            response: httpx.Response | None = None
            try:
                request = self.http.build_request(
                    call.method,
                    call.path,
                    params=call.params,
                    json=call.json,
                    headers=call.headers,
                    timeout=call.timeout(self.http.timeout),
                )
                response = self.http.send(request, stream=stream)
            except httpx.TransportError as error:
                if not self.retries.should_retry(call, attempt, None, error):
                    raise
            else:
                if response.is_success:
                    return response
                if stream:
                    response.read()
                    response.close()
                if not self.retries.should_retry(call, attempt, response, None):
                    raise MemoryServiceError.from_response(response)
            time.sleep(self.retries.delay(attempt, response))
            attempt += 1

    def iter_messages(self, conversation_id: str, *, page_size: int = 100) -> Iterator[models.Message]:
        """Every message of the conversation, oldest first, page by page."""
        after: int | None = None
        while True:
            page = self.list_messages(conversation_id, after_sequence=after, limit=page_size)
            yield from page.messages
            if page.next_after_sequence is None:
                return
            after = page.next_after_sequence

    def append_messages(
        self,
        conversation_id: str,
        messages: Sequence[Json],
        *,
        metadata: Json | None = None,
        idempotency_key: str | None = None,
    ) -> models.AppendMessages:
        """Store one round (messages as Chat Completions messages). Retried with one Idempotency-Key
        (``idempotency_key``, or one the client makes), so the round is stored once; ``replayed``
        says whether the service answered a retry."""
        return self._send(
            _core.append_messages(
                conversation_id, messages, metadata=metadata, idempotency_key=idempotency_key
            )
        )

    def list_messages(
        self, conversation_id: str, *, after_sequence: int | None = None, limit: int | None = None
    ) -> models.MessagesPage:
        """A page of messages by sequence (``next_after_sequence`` continues)."""
        return self._send(_core.list_messages(conversation_id, after_sequence=after_sequence, limit=limit))

    def create_conversation(
        self,
        conversation_id: str,
        *,
        memory_policy: Json | None = None,
        metadata: Json | None = None,
        user_id: str | None = None,
    ) -> models.Conversation:
        """Create a conversation with a memory policy, of a user if given (``ConflictError`` if
        the id is taken)."""
        return self._send(
            _core.create_conversation(
                conversation_id, memory_policy=memory_policy, metadata=metadata, user_id=user_id
            )
        )

    def list_conversations(
        self,
        *,
        after: str | None = None,
        limit: int | None = None,
        include_metadata: bool | None = None,
        include_archived: bool | None = None,
    ) -> models.ConversationsPage:
        """A page of conversations by id (``next_after`` continues); archived ones only with
        ``include_archived``."""
        return self._send(
            _core.list_conversations(
                after=after, limit=limit, include_metadata=include_metadata, include_archived=include_archived
            )
        )

    def end_conversation(self, conversation_id: str) -> models.EndConversation:
        """End a session: a final summary starts, and new messages are refused (``ConflictError``)."""
        return self._send(_core.end_conversation(conversation_id))

    def get_conversation(self, conversation_id: str) -> models.Conversation:
        """One conversation: its policy and counts."""
        return self._send(_core.get_conversation(conversation_id))

    def update_conversation(self, conversation_id: str, *, memory_policy: Json) -> models.Conversation:
        """New parameters for the conversation's policy, from the next round on."""
        return self._send(_core.update_conversation(conversation_id, memory_policy=memory_policy))

    def delete_conversation(self, conversation_id: str) -> None:
        """Delete a conversation with its messages and memories."""
        return self._send(_core.delete_conversation(conversation_id))

    def compress(self, conversation_id: str) -> models.MemoryStarted:
        """Summarize now what the policy would on request (seed 003's manual compression)."""
        return self._send(_core.compress(conversation_id))

    def get_stats(self, conversation_id: str) -> models.Stats:
        """Entries, summaries and tokens, compressed and active (seed 003's getStats)."""
        return self._send(_core.get_stats(conversation_id))

    @overload
    def export_conversation(
        self, conversation_id: str, *, format: Literal["json"] = "json"
    ) -> dict[str, Any]: ...

    @overload
    def export_conversation(self, conversation_id: str, *, format: Literal["markdown"]) -> str: ...

    def export_conversation(
        self, conversation_id: str, *, format: ExportFormat = "json"
    ) -> dict[str, Any] | str:
        """``json``: the conversation as one document (policy, metadata, every entry and memory
        row); ``markdown``: the session as text for people."""
        if format == "markdown":
            return self._send(_core.export_conversation(conversation_id, format="markdown"))
        return self._send(_core.export_conversation(conversation_id, format="json"))

    def import_conversation(self, document: Json, *, conversation_id: str | None = None) -> models.Imported:
        """Store an export document, under its own id or ``conversation_id``."""
        return self._send(_core.import_conversation(document, conversation_id=conversation_id))

    def clear_messages(self, conversation_id: str) -> models.Cleared:
        """Delete every entry and summary; the conversation and its policy stay (clearSession)."""
        return self._send(_core.clear_messages(conversation_id))

    def get_context(
        self,
        conversation_id: str,
        *,
        max_tokens: int | None = None,
        context_window: int | None = None,
        wait_for_pending: float | None = None,
    ) -> models.Context:
        """The bounded context (``format=json``): summaries, raw messages, token counts. With
        ``wait_for_pending``, a summary processing or due is waited for up to that many seconds
        (``waited``, ``pending`` say what happened)."""
        return self._send(
            _core.get_context(
                conversation_id,
                max_tokens=max_tokens,
                context_window=context_window,
                wait_for_pending=wait_for_pending,
            )
        )

    def get_openai_context(
        self, conversation_id: str, *, max_tokens: int | None = None
    ) -> models.OpenAIContext:
        """The context as Chat Completions ``messages`` (``format=openai``)."""
        return self._send(_core.get_openai_context(conversation_id, max_tokens=max_tokens))

    def get_anthropic_context(
        self, conversation_id: str, *, max_tokens: int | None = None
    ) -> models.AnthropicContext:
        """The context as the Messages API's ``system`` and ``messages`` (``format=anthropic``)."""
        return self._send(_core.get_anthropic_context(conversation_id, max_tokens=max_tokens))

    def get_text_context(
        self, conversation_id: str, *, format: TextFormat = "text", max_tokens: int | None = None
    ) -> str:
        """The policy's rendering of the context for a prompt (``text`` or ``markdown``)."""
        return self._send(_core.get_text_context(conversation_id, format=format, max_tokens=max_tokens))

    def list_memories(self, conversation_id: str) -> models.Memories:
        """The version chain: every memory of the conversation."""
        return self._send(_core.list_memories(conversation_id))

    def stream_events(self, conversation_id: str, *, after: int | None = None) -> EventStream:
        """The conversation's events after event id ``after`` (all those kept, if None), then
        each new one as it is committed: an iterator over a connection opened now, which stays
        open until closed (see ``EventStream``)."""
        return EventStream(self, conversation_id, after)

    def get_user_context(self, user_id: str) -> models.UserContext:
        """The user's latest cross-conversation summary, and whether a newer one is being built."""
        return self._send(_core.get_user_context(user_id))

    def list_user_memories(self, user_id: str) -> models.UserMemories:
        """Every version of the user's cross-conversation summary, newest first."""
        return self._send(_core.list_user_memories(user_id))

    def create_webhook(self, url: str) -> models.WebhookCreated:
        """Send every event of the tenant's conversations to ``url``, signed with ``secret`` (shown
        only in this answer)."""
        return self._send(_core.create_webhook(url))

    def list_webhooks(self) -> list[models.Webhook]:
        """The tenant's webhooks (without their secrets)."""
        return self._send(_core.list_webhooks())

    def delete_webhook(self, webhook_id: int) -> None:
        """Stop sending to this endpoint."""
        return self._send(_core.delete_webhook(webhook_id))

    def get_memory_chain(self, conversation_id: str) -> models.Memories:
        """Seed 004's version-chain query."""
        return self._send(_core.get_memory_chain(conversation_id))

    def list_archived_conversations(
        self, *, after: str | None = None, limit: int | None = None
    ) -> models.ConversationsPage:
        """A page of archived conversations by id (``next_after`` continues)."""
        return self._send(_core.list_archived_conversations(after=after, limit=limit))

    def restore_conversation(self, conversation_id: str) -> models.Conversation:
        """Take an archived conversation back: it accepts new messages again."""
        return self._send(_core.restore_conversation(conversation_id))

    def list_stuck_memories(self, *, older_than_seconds: float | None = None) -> list[models.StuckMemory]:
        """``processing`` summaries older than that."""
        return self._send(_core.list_stuck_memories(older_than_seconds=older_than_seconds))

    def list_failed_memories(self, *, limit: int | None = None) -> list[models.FailedMemory]:
        """Failed summaries with their reasons."""
        return self._send(_core.list_failed_memories(limit=limit))

    def list_failing_conversations(self, *, limit: int | None = None) -> list[models.FailingConversation]:
        """Conversations whose summaries keep failing."""
        return self._send(_core.list_failing_conversations(limit=limit))

    def get_window_progression(self, *, limit: int | None = None) -> list[models.WindowRow]:
        """The latest completed windows and their sizes."""
        return self._send(_core.get_window_progression(limit=limit))

    def get_generation_stats(self) -> models.GenerationStats:
        """Summary generation times."""
        return self._send(_core.get_generation_stats())

    def retry_memory(self, memory_id: int) -> models.MemoryStarted:
        """Queue a failed memory again."""
        return self._send(_core.retry_memory(memory_id))

    def summarize_now(self, conversation_id: str) -> models.MemoryStarted:
        """Queue the summary the policy would make now."""
        return self._send(_core.summarize_now(conversation_id))

    def get_runner_stats(self) -> models.RunnerStats:
        """Summary work across replicas and this replica's runner."""
        return self._send(_core.get_runner_stats())

    def list_dead_deliveries(self, *, limit: int | None = None) -> list[models.DeadDelivery]:
        """Webhook deliveries that failed every attempt, newest first."""
        return self._send(_core.list_dead_deliveries(limit=limit))

    def retry_delivery(self, webhook_id: int, conversation_id: str, event_id: int) -> models.RetriedDelivery:
        """Send a dead delivery again, with a fresh set of attempts."""
        return self._send(_core.retry_delivery(webhook_id, conversation_id, event_id))

    def admin_memory_chain(self, conversation_id: str) -> models.Memories:
        """Admin key: any tenant's version chain."""
        return self._send(_core.admin_memory_chain(conversation_id))

    def admin_stuck_memories(
        self, *, older_than_seconds: float | None = None
    ) -> list[models.AdminStuckMemory]:
        """Admin key: stuck summaries of every tenant."""
        return self._send(_core.admin_stuck_memories(older_than_seconds=older_than_seconds))

    def admin_failed_memories(self, *, limit: int | None = None) -> list[models.AdminFailedMemory]:
        """Admin key: failed summaries of every tenant."""
        return self._send(_core.admin_failed_memories(limit=limit))

    def admin_failing_conversations(
        self, *, limit: int | None = None
    ) -> list[models.AdminFailingConversation]:
        """Admin key: failing conversations of every tenant."""
        return self._send(_core.admin_failing_conversations(limit=limit))

    def admin_window_progression(self, *, limit: int | None = None) -> list[models.AdminWindowRow]:
        """Admin key: the latest windows of every tenant."""
        return self._send(_core.admin_window_progression(limit=limit))

    def admin_generation_stats(self) -> models.GenerationStats:
        """Admin key: generation times over every tenant."""
        return self._send(_core.admin_generation_stats())

    def admin_retry_memory(self, memory_id: int) -> models.MemoryStarted:
        """Admin key: queue any tenant's failed memory again."""
        return self._send(_core.admin_retry_memory(memory_id))

    def admin_summarize_now(self, conversation_id: str) -> models.MemoryStarted:
        """Admin key: queue any tenant's summary now."""
        return self._send(_core.admin_summarize_now(conversation_id))

    def admin_runner_stats(self) -> models.AdminRunnerStats:
        """Admin key: the runner and the work per tenant."""
        return self._send(_core.admin_runner_stats())

    def admin_dead_deliveries(self, *, limit: int | None = None) -> list[models.AdminDeadDelivery]:
        """Admin key: dead webhook deliveries of every tenant."""
        return self._send(_core.admin_dead_deliveries(limit=limit))

    def admin_retry_delivery(
        self, webhook_id: int, conversation_id: str, event_id: int
    ) -> models.RetriedDelivery:
        """Admin key: send any tenant's dead delivery again."""
        return self._send(_core.admin_retry_delivery(webhook_id, conversation_id, event_id))

    def healthz(self) -> models.Health:
        """The process is up."""
        return self._send(_core.healthz())

    def readyz(self) -> models.Ready:
        """The database is reachable and migrated (``UnavailableError`` otherwise)."""
        return self._send(_core.readyz())


class EventStream:
    """A conversation's events as they come (``Client.stream_events``), over a connection that
    stays open.

    A connection that drops, or stays silent past the client's read timeout, is opened again
    to resume after the last event received (``Last-Event-ID``), with the client's retries. Stop
    it with ``close()`` or a ``with`` block: the iteration ends then; from another thread, at the
    next line the service sends (a keepalive comes every MEMORY_EVENTS_HEARTBEAT_SECONDS)."""

    def __init__(self, client: Client, conversation_id: str, after: int | None) -> None:
        self.last_event_id = after
        self._client = client
        self._conversation_id = conversation_id
        self._closed = False
        self._iterating = False
        self._response, self._parser = self._open()
        self._events = self._read()

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> models.Event:
        self._iterating = True
        try:
            return next(self._events)
        finally:
            self._iterating = False

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        if not self._iterating:  # else another thread iterates: it sees _closed
            self._events.close()
            self._response.close()

    def _open(self) -> tuple[httpx.Response, _core.EventParser]:
        call = _core.stream_events(self._conversation_id, after=self.last_event_id)
        response = self._client._respond(call, stream=True)
        return response, call.parse(response)

    def _read(self) -> Generator[models.Event, None, None]:
        try:
            while True:
                try:
                    for line in self._response.iter_lines():
                        if self._closed:
                            return
                        if (event := self._parser.feed(line)) is not None:
                            self.last_event_id = event.event_id
                            yield event
                except httpx.TransportError:
                    pass  # dropped or silent: opened again below, after the last event
                self._response.close()
                if self._closed:
                    return
                time.sleep(self._client.retries.delay(0, None))
                self._response, self._parser = self._open()
        finally:
            self._response.close()
