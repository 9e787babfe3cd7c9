"""A session of the OpenAI Agents SDK backed by the memory service (extra ``agents``).

``Runner.run(agent, input, session=MemoryServiceSession("trip-7"))`` reads the conversation's
bounded context at the start of each run (the summaries as one leading system item, then the
raw messages after them, as ``format=openai`` renders it) and stores each batch of new items as
one round. The agent sees a context of bounded size however long the conversation runs.

The service keeps messages append-only, so:

- ``pop_item`` raises ``UnsupportedSessionOperation``: a stored message cannot be removed, and
  faking it (hiding the item on this side) would leave the service's summaries and every other
  reader with the message. The SDK itself only pops to rewind a retried turn of a
  server-managed conversation, best effort, and logs a warning when it cannot.
- ``clear_session`` deletes the conversation (its messages and summaries) and creates it again
  with the same memory policy and metadata, so the next run starts empty.
- ``get_items`` returns the bounded context, not the full transcript: the messages a summary
  covers come back as that summary (``memory_client.Client.iter_messages`` reads them all). While
  the last round's function calls wait for their outputs (a run stopped between the two), it
  raises ``ConflictError``: no model would take that history; store the outputs first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

from agents.items import TResponseInputItem
from agents.memory.session_settings import SessionSettings
from agents.models.chatcmpl_converter import Converter

from memory_client import _chat
from memory_client.async_client import AsyncClient
from memory_client.errors import NotFoundError


class UnsupportedSessionOperation(NotImplementedError):
    """The service cannot do this: its messages are append-only."""


class MemoryServiceSession:
    """The Agents SDK's ``Session`` protocol over the memory service; ``session_id`` is the
    conversation id. ``max_tokens`` fits the context read at each run into that many tokens
    (oldest raw rounds first, never the newest); ``client`` defaults to an ``AsyncClient`` from
    ``base_url``/``api_key`` (or ``MEMORY_SERVICE_URL``/``MEMORY_SERVICE_API_KEY``)."""

    def __init__(
        self,
        session_id: str,
        client: AsyncClient | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = session_settings
        self.client = client or AsyncClient(base_url, api_key=api_key)
        self.max_tokens = max_tokens

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The bounded context as input items (the latest ``limit`` of them when given)."""
        context = await self.client.get_openai_context(self.session_id, max_tokens=self.max_tokens)
        items = list(input_items(context.messages))
        return items if limit is None else items[-limit:] if limit > 0 else []

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store the items as one round (Chat Completions messages: function calls become an
        assistant's ``tool_calls``, their outputs ``tool`` messages, developer messages system
        ones), of at most the service's ``MEMORY_MAX_MESSAGES_PER_REQUEST`` messages."""
        messages = cast(list[dict[str, Any]], Converter.items_to_messages(items))
        for message in messages:
            if message["role"] == "developer":  # the service stores Chat Completions' four roles
                message["role"] = "system"
        if messages:
            await self.client.append_messages(self.session_id, messages)

    async def pop_item(self) -> TResponseInputItem | None:
        raise UnsupportedSessionOperation(
            "the memory service keeps a conversation's messages append-only: a stored item cannot be "
            "removed (clear_session() deletes the whole conversation)"
        )

    async def clear_session(self) -> None:
        """Delete the conversation and create it again with the same policy and metadata."""
        try:
            conversation = await self.client.get_conversation(self.session_id)
        except NotFoundError:
            return  # never written to: already empty
        await self.client.delete_conversation(self.session_id)
        await self.client.create_conversation(
            self.session_id, memory_policy=conversation.memory_policy, metadata=conversation.metadata
        )


def input_items(messages: list[dict[str, Any]]) -> Iterator[TResponseInputItem]:
    """Chat Completions messages as the Responses input items the SDK keeps."""
    for message in messages:
        role, content = message["role"], message.get("content")
        if role == "tool":
            yield cast(
                TResponseInputItem,
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": _chat.text_of(content),
                },
            )
            continue
        if content is not None or not message.get("tool_calls"):
            yield cast(TResponseInputItem, {"role": role, "content": _chat.text_of(content)})
        for call in message.get("tool_calls") or []:
            arguments = call["function"]["arguments"]
            yield cast(
                TResponseInputItem,
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            )
