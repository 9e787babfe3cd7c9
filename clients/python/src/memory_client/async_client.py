"""The asynchronous client: ``Client``'s methods as coroutines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

import httpx

from memory_client import _base, _core, models
from memory_client._core import Call, ExportFormat, Json, Retries, TextFormat
from memory_client.errors import MemoryServiceError

T = TypeVar("T")


class AsyncClient:
    """The memory service over HTTP, asynchronously: see ``Client`` for the arguments."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.retries = Retries(max_retries=max_retries)
        self._owned = http_client is None
        self.http = http_client or httpx.AsyncClient(
            base_url=_base.base_url(base_url), headers=_base.headers(api_key), timeout=timeout
        )

    async def aclose(self) -> None:
        if self._owned:
            await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _send(self, call: Call[T]) -> T:
        return call.parse(await self._respond(call))

    async def _respond(self, call: Call[Any], *, stream: bool = False) -> httpx.Response:
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
                response = await self.http.send(request, stream=stream)
            except httpx.TransportError as error:
                if not self.retries.should_retry(call, attempt, None, error):
                    raise
            else:
                if response.is_success:
                    return response
                if stream:
                    await response.aread()
                    await response.aclose()
                if not self.retries.should_retry(call, attempt, response, None):
                    raise MemoryServiceError.from_response(response)
            await asyncio.sleep(self.retries.delay(attempt, response))
            attempt += 1

    async def iter_messages(
        self, conversation_id: str, *, page_size: int = 100
    ) -> AsyncIterator[models.Message]:
        """Every message of the conversation, oldest first, page by page."""
        after: int | None = None
        while True:
            page = await self.list_messages(conversation_id, after_sequence=after, limit=page_size)
            for message in page.messages:
                yield message
            if page.next_after_sequence is None:
                return
            after = page.next_after_sequence

    async def append_messages(
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
        return await self._send(
            _core.append_messages(
                conversation_id, messages, metadata=metadata, idempotency_key=idempotency_key
            )
        )

    async def list_messages(
        self, conversation_id: str, *, after_sequence: int | None = None, limit: int | None = None
    ) -> models.MessagesPage:
        """A page of messages by sequence (``next_after_sequence`` continues)."""
        return await self._send(
            _core.list_messages(conversation_id, after_sequence=after_sequence, limit=limit)
        )

    async def create_conversation(
        self,
        conversation_id: str,
        *,
        memory_policy: Json | None = None,
        metadata: Json | None = None,
        user_id: str | None = None,
    ) -> models.Conversation:
        """Create a conversation with a memory policy, of a user if given (``ConflictError`` if
        the id is taken)."""
        return await self._send(
            _core.create_conversation(
                conversation_id, memory_policy=memory_policy, metadata=metadata, user_id=user_id
            )
        )

    async def list_conversations(
        self,
        *,
        after: str | None = None,
        limit: int | None = None,
        include_metadata: bool | None = None,
        include_archived: bool | None = None,
    ) -> models.ConversationsPage:
        """A page of conversations by id (``next_after`` continues); archived ones only with
        ``include_archived``."""
        return await self._send(
            _core.list_conversations(
                after=after, limit=limit, include_metadata=include_metadata, include_archived=include_archived
            )
        )

    async def end_conversation(self, conversation_id: str) -> models.EndConversation:
        """End a session: a final summary starts, and new messages are refused (``ConflictError``)."""
        return await self._send(_core.end_conversation(conversation_id))

    async def get_conversation(self, conversation_id: str) -> models.Conversation:
        """One conversation: its policy and counts."""
        return await self._send(_core.get_conversation(conversation_id))

    async def update_conversation(self, conversation_id: str, *, memory_policy: Json) -> models.Conversation:
        """New parameters for the conversation's policy, from the next round on."""
        return await self._send(_core.update_conversation(conversation_id, memory_policy=memory_policy))

    async def delete_conversation(self, conversation_id: str) -> None:
        """Delete a conversation with its messages and memories."""
        return await self._send(_core.delete_conversation(conversation_id))

    async def compress(self, conversation_id: str) -> models.MemoryStarted:
        """Summarize now what the policy would on request (seed 003's manual compression)."""
        return await self._send(_core.compress(conversation_id))

    async def get_stats(self, conversation_id: str) -> models.Stats:
        """Entries, summaries and tokens, compressed and active (seed 003's getStats)."""
        return await self._send(_core.get_stats(conversation_id))

    @overload
    async def export_conversation(
        self, conversation_id: str, *, format: Literal["json"] = "json"
    ) -> dict[str, Any]: ...

    @overload
    async def export_conversation(self, conversation_id: str, *, format: Literal["markdown"]) -> str: ...

    async def export_conversation(
        self, conversation_id: str, *, format: ExportFormat = "json"
    ) -> dict[str, Any] | str:
        """``json``: the conversation as one document (policy, metadata, every entry and memory
        row); ``markdown``: the session as text for people."""
        if format == "markdown":
            return await self._send(_core.export_conversation(conversation_id, format="markdown"))
        return await self._send(_core.export_conversation(conversation_id, format="json"))

    async def import_conversation(
        self, document: Json, *, conversation_id: str | None = None
    ) -> models.Imported:
        """Store an export document, under its own id or ``conversation_id``."""
        return await self._send(_core.import_conversation(document, conversation_id=conversation_id))

    async def clear_messages(self, conversation_id: str) -> models.Cleared:
        """Delete every entry and summary; the conversation and its policy stay (clearSession)."""
        return await self._send(_core.clear_messages(conversation_id))

    async def get_context(
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
        return await self._send(
            _core.get_context(
                conversation_id,
                max_tokens=max_tokens,
                context_window=context_window,
                wait_for_pending=wait_for_pending,
            )
        )

    async def get_openai_context(
        self, conversation_id: str, *, max_tokens: int | None = None
    ) -> models.OpenAIContext:
        """The context as Chat Completions ``messages`` (``format=openai``)."""
        return await self._send(_core.get_openai_context(conversation_id, max_tokens=max_tokens))

    async def get_anthropic_context(
        self, conversation_id: str, *, max_tokens: int | None = None
    ) -> models.AnthropicContext:
        """The context as the Messages API's ``system`` and ``messages`` (``format=anthropic``)."""
        return await self._send(_core.get_anthropic_context(conversation_id, max_tokens=max_tokens))

    async def get_text_context(
        self, conversation_id: str, *, format: TextFormat = "text", max_tokens: int | None = None
    ) -> str:
        """The policy's rendering of the context for a prompt (``text`` or ``markdown``)."""
        return await self._send(_core.get_text_context(conversation_id, format=format, max_tokens=max_tokens))

    async def list_memories(self, conversation_id: str) -> models.Memories:
        """The version chain: every memory of the conversation."""
        return await self._send(_core.list_memories(conversation_id))

    async def stream_events(self, conversation_id: str, *, after: int | None = None) -> AsyncEventStream:
        """The conversation's events after event id ``after`` (all those kept, if None), then
        each new one as it is committed: an async iterator over a connection opened now, which
        stays open until closed (see ``AsyncEventStream``)."""
        stream = AsyncEventStream(self, conversation_id, after)
        await stream._open()
        return stream

    async def get_user_context(self, user_id: str) -> models.UserContext:
        """The user's latest cross-conversation summary, and whether a newer one is being built."""
        return await self._send(_core.get_user_context(user_id))

    async def list_user_memories(self, user_id: str) -> models.UserMemories:
        """Every version of the user's cross-conversation summary, newest first."""
        return await self._send(_core.list_user_memories(user_id))

    async def create_webhook(self, url: str) -> models.WebhookCreated:
        """Send every event of the tenant's conversations to ``url``, signed with ``secret`` (shown
        only in this answer)."""
        return await self._send(_core.create_webhook(url))

    async def list_webhooks(self) -> list[models.Webhook]:
        """The tenant's webhooks (without their secrets)."""
        return await self._send(_core.list_webhooks())

    async def delete_webhook(self, webhook_id: int) -> None:
        """Stop sending to this endpoint."""
        return await self._send(_core.delete_webhook(webhook_id))

    async def get_memory_chain(self, conversation_id: str) -> models.Memories:
        """Seed 004's version-chain query."""
        return await self._send(_core.get_memory_chain(conversation_id))

    async def list_archived_conversations(
        self, *, after: str | None = None, limit: int | None = None
    ) -> models.ConversationsPage:
        """A page of archived conversations by id (``next_after`` continues)."""
        return await self._send(_core.list_archived_conversations(after=after, limit=limit))

    async def restore_conversation(self, conversation_id: str) -> models.Conversation:
        """Take an archived conversation back: it accepts new messages again."""
        return await self._send(_core.restore_conversation(conversation_id))

    async def list_stuck_memories(
        self, *, older_than_seconds: float | None = None
    ) -> list[models.StuckMemory]:
        """``processing`` summaries older than that."""
        return await self._send(_core.list_stuck_memories(older_than_seconds=older_than_seconds))

    async def list_failed_memories(self, *, limit: int | None = None) -> list[models.FailedMemory]:
        """Failed summaries with their reasons."""
        return await self._send(_core.list_failed_memories(limit=limit))

    async def list_failing_conversations(
        self, *, limit: int | None = None
    ) -> list[models.FailingConversation]:
        """Conversations whose summaries keep failing."""
        return await self._send(_core.list_failing_conversations(limit=limit))

    async def get_window_progression(self, *, limit: int | None = None) -> list[models.WindowRow]:
        """The latest completed windows and their sizes."""
        return await self._send(_core.get_window_progression(limit=limit))

    async def get_generation_stats(self) -> models.GenerationStats:
        """Summary generation times."""
        return await self._send(_core.get_generation_stats())

    async def retry_memory(self, memory_id: int) -> models.MemoryStarted:
        """Queue a failed memory again."""
        return await self._send(_core.retry_memory(memory_id))

    async def summarize_now(self, conversation_id: str) -> models.MemoryStarted:
        """Queue the summary the policy would make now."""
        return await self._send(_core.summarize_now(conversation_id))

    async def get_runner_stats(self) -> models.RunnerStats:
        """Summary work across replicas and this replica's runner."""
        return await self._send(_core.get_runner_stats())

    async def list_dead_deliveries(self, *, limit: int | None = None) -> list[models.DeadDelivery]:
        """Webhook deliveries that failed every attempt, newest first."""
        return await self._send(_core.list_dead_deliveries(limit=limit))

    async def retry_delivery(
        self, webhook_id: int, conversation_id: str, event_id: int
    ) -> models.RetriedDelivery:
        """Send a dead delivery again, with a fresh set of attempts."""
        return await self._send(_core.retry_delivery(webhook_id, conversation_id, event_id))

    async def admin_memory_chain(self, conversation_id: str) -> models.Memories:
        """Admin key: any tenant's version chain."""
        return await self._send(_core.admin_memory_chain(conversation_id))

    async def admin_stuck_memories(
        self, *, older_than_seconds: float | None = None
    ) -> list[models.AdminStuckMemory]:
        """Admin key: stuck summaries of every tenant."""
        return await self._send(_core.admin_stuck_memories(older_than_seconds=older_than_seconds))

    async def admin_failed_memories(self, *, limit: int | None = None) -> list[models.AdminFailedMemory]:
        """Admin key: failed summaries of every tenant."""
        return await self._send(_core.admin_failed_memories(limit=limit))

    async def admin_failing_conversations(
        self, *, limit: int | None = None
    ) -> list[models.AdminFailingConversation]:
        """Admin key: failing conversations of every tenant."""
        return await self._send(_core.admin_failing_conversations(limit=limit))

    async def admin_window_progression(self, *, limit: int | None = None) -> list[models.AdminWindowRow]:
        """Admin key: the latest windows of every tenant."""
        return await self._send(_core.admin_window_progression(limit=limit))

    async def admin_generation_stats(self) -> models.GenerationStats:
        """Admin key: generation times over every tenant."""
        return await self._send(_core.admin_generation_stats())

    async def admin_retry_memory(self, memory_id: int) -> models.MemoryStarted:
        """Admin key: queue any tenant's failed memory again."""
        return await self._send(_core.admin_retry_memory(memory_id))

    async def admin_summarize_now(self, conversation_id: str) -> models.MemoryStarted:
        """Admin key: queue any tenant's summary now."""
        return await self._send(_core.admin_summarize_now(conversation_id))

    async def admin_runner_stats(self) -> models.AdminRunnerStats:
        """Admin key: the runner and the work per tenant."""
        return await self._send(_core.admin_runner_stats())

    async def admin_dead_deliveries(self, *, limit: int | None = None) -> list[models.AdminDeadDelivery]:
        """Admin key: dead webhook deliveries of every tenant."""
        return await self._send(_core.admin_dead_deliveries(limit=limit))

    async def admin_retry_delivery(
        self, webhook_id: int, conversation_id: str, event_id: int
    ) -> models.RetriedDelivery:
        """Admin key: send any tenant's dead delivery again."""
        return await self._send(_core.admin_retry_delivery(webhook_id, conversation_id, event_id))

    async def healthz(self) -> models.Health:
        """The process is up."""
        return await self._send(_core.healthz())

    async def readyz(self) -> models.Ready:
        """The database is reachable and migrated (``UnavailableError`` otherwise)."""
        return await self._send(_core.readyz())


class AsyncEventStream:
    """A conversation's events as they come (``AsyncClient.stream_events``), over a connection
    that stays open.

    A connection that drops, or stays silent past the client's read timeout, is opened again
    to resume after the last event received (``Last-Event-ID``), with the client's retries. Stop
    it with ``aclose()``, an ``async with`` block or by cancelling the task that iterates: the
    iteration ends then; from another task, at the next line the service sends (a keepalive
    comes every MEMORY_EVENTS_HEARTBEAT_SECONDS)."""

    def __init__(self, client: AsyncClient, conversation_id: str, after: int | None) -> None:
        self.last_event_id = after
        self._client = client
        self._conversation_id = conversation_id
        self._closed = False
        self._iterating = False
        self._response: httpx.Response | None = None
        self._parser = _core.EventParser()
        self._events = self._read()

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> models.Event:
        self._iterating = True
        try:
            return await anext(self._events)
        finally:
            self._iterating = False

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        if not self._iterating:  # else another task iterates: it sees _closed
            await self._events.aclose()
            if self._response is not None:
                await self._response.aclose()

    async def _open(self) -> httpx.Response:
        call = _core.stream_events(self._conversation_id, after=self.last_event_id)
        self._response = response = await self._client._respond(call, stream=True)
        self._parser = call.parse(response)
        return response

    async def _read(self) -> AsyncGenerator[models.Event, None]:
        try:
            while True:
                response = self._response if self._response is not None else await self._open()
                try:
                    async for line in response.aiter_lines():
                        if self._closed:
                            return
                        if (event := self._parser.feed(line)) is not None:
                            self.last_event_id = event.event_id
                            yield event
                except httpx.TransportError:
                    pass  # dropped or silent: opened again below, after the last event
                await response.aclose()
                self._response = None
                if self._closed:
                    return
                await asyncio.sleep(self._client.retries.delay(0, None))
        finally:
            if self._response is not None:
                await self._response.aclose()
