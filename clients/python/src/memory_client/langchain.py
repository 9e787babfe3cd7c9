"""A LangChain chat message history backed by the memory service (extra ``langchain``).

``messages`` is the conversation's bounded context (the summaries as one leading
``SystemMessage``, then the raw messages after them, as ``format=openai`` renders it), so a chain
that prepends the history sends a context of bounded size however long the conversation runs.
``add_messages`` stores one round; ``clear`` deletes the conversation and creates it again with
the same memory policy and metadata (the service keeps messages append-only: there is no removing
single messages). The async methods use an ``AsyncClient``, the sync ones a ``Client``.

LangChain marks ``BaseChatMessageHistory`` deprecated since langchain-core 1.6.4 (to be removed
in 2.0); it is still what ``RunnableWithMessageHistory`` and most integrations take.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage, convert_to_messages, convert_to_openai_messages

from memory_client.async_client import AsyncClient
from memory_client.client import Client
from memory_client.errors import NotFoundError
from memory_client.models import Conversation


class MemoryServiceChatMessageHistory(BaseChatMessageHistory):
    """The chat history of conversation ``conversation_id`` in the memory service. ``max_tokens``
    fits the history read into that many tokens (the oldest raw rounds go first, never the
    newest). Clients default to ``base_url``/``api_key`` (else ``MEMORY_SERVICE_URL`` and
    ``MEMORY_SERVICE_API_KEY``)."""

    def __init__(
        self,
        conversation_id: str,
        *,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.conversation_id = conversation_id
        self.max_tokens = max_tokens
        self._base_url, self._api_key = base_url, api_key
        self._client = client
        self._async_client = async_client

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self._base_url, api_key=self._api_key)
        return self._client

    @property
    def async_client(self) -> AsyncClient:
        if self._async_client is None:
            self._async_client = AsyncClient(self._base_url, api_key=self._api_key)
        return self._async_client

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The bounded context as LangChain messages."""
        context = self.client.get_openai_context(self.conversation_id, max_tokens=self.max_tokens)
        return convert_to_messages(context.messages)

    async def aget_messages(self) -> list[BaseMessage]:
        context = await self.async_client.get_openai_context(self.conversation_id, max_tokens=self.max_tokens)
        return convert_to_messages(context.messages)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Store the messages as one round (as Chat Completions messages, tool calls included)."""
        if messages:
            self.client.append_messages(self.conversation_id, _openai(messages))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if messages:
            await self.async_client.append_messages(self.conversation_id, _openai(messages))

    def clear(self) -> None:
        """Delete the conversation and create it again with the same policy and metadata."""
        try:
            conversation = self.client.get_conversation(self.conversation_id)
        except NotFoundError:
            return
        self.client.delete_conversation(self.conversation_id)
        self.client.create_conversation(self.conversation_id, **_same_as(conversation))

    async def aclear(self) -> None:
        try:
            conversation = await self.async_client.get_conversation(self.conversation_id)
        except NotFoundError:
            return
        await self.async_client.delete_conversation(self.conversation_id)
        await self.async_client.create_conversation(self.conversation_id, **_same_as(conversation))


def _openai(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    converted: list[dict[str, Any]] = convert_to_openai_messages(list(messages))
    for message in converted:
        # An assistant message that only calls tools: the service (as Chat Completions) takes null.
        if message.get("tool_calls") and message.get("content") == "":
            message["content"] = None
    return converted


def _same_as(conversation: Conversation) -> dict[str, Any]:
    return {"memory_policy": conversation.memory_policy, "metadata": conversation.metadata}
