"""A Model Context Protocol server in front of the memory service (extra ``mcp``):
``memory-service mcp`` (or ``memory-service-mcp``), over stdio or streamable HTTP.

It is a client of the service: every tool is one call over HTTP (``memory_client.AsyncClient``)
to the service at ``--url`` (``MEMORY_SERVICE_URL``), with the API key ``--api-key``
(``MEMORY_SERVICE_API_KEY``), so the service's API keys and tenants apply as to any client. Over
streamable HTTP, an MCP client that sends its own key (``Authorization: Bearer <key>`` or
``X-API-Key``) acts as that key's tenant; the configured key serves the requests that carry none.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx
from mcp.server import MCPServer
from mcp.server.mcpserver.context import Context
from mcp.server.mcpserver.exceptions import ToolError

from memory_client import _base
from memory_client._version import __version__
from memory_client.async_client import AsyncClient
from memory_client.errors import MemoryServiceError

ContextFormat = Literal["json", "text", "markdown", "openai", "anthropic"]


class Clients:
    """An ``AsyncClient`` for each tool call, with the caller's key (or the configured one), all
    on one connection pool: nothing is kept per key, however many keys callers send."""

    def __init__(self, url: str, api_key: str | None) -> None:
        self.url, self.api_key = url, api_key
        self._transport = httpx.AsyncHTTPTransport()

    def for_headers(self, headers: Mapping[str, str] | None) -> AsyncClient:
        key = _key_in(headers) or self.api_key
        http = httpx.AsyncClient(
            base_url=self.url, headers=_base.headers(key or ""), timeout=30.0, transport=self._transport
        )
        return AsyncClient(http_client=http)

    async def aclose(self) -> None:
        await self._transport.aclose()


def _key_in(headers: Mapping[str, str] | None) -> str | None:
    if not headers:
        return None
    lowered = {name.lower(): value for name, value in headers.items()}
    bearer = lowered.get("authorization", "")
    if bearer.lower().startswith("bearer "):
        return bearer[7:].strip() or None
    return lowered.get("x-api-key") or None


def build_server(url: str, api_key: str | None) -> MCPServer[Any]:
    clients = Clients(url, api_key)

    @asynccontextmanager
    async def lifespan(server: MCPServer[Any]) -> AsyncIterator[None]:
        try:
            yield None
        finally:
            await clients.aclose()

    server: MCPServer[Any] = MCPServer(
        "memory-service",
        version=__version__,
        instructions="Conversation memory: store each round of a conversation with add_messages, and "
        "read a bounded context (summaries plus the latest messages) with get_context.",
        lifespan=lifespan,
    )

    def service(ctx: Context) -> AsyncClient:
        return clients.for_headers(ctx.headers)

    @server.tool()
    async def add_messages(
        conversation_id: str, messages: list[dict[str, Any]], ctx: Context
    ) -> dict[str, Any]:
        """Store one round of a conversation (created on first use). Messages are OpenAI Chat
        Completions messages: {"role": "user"|"assistant"|"system"|"tool", "content": ...}, with
        an assistant's "tool_calls" and a tool message's "tool_call_id"."""
        async with _errors():
            result = await service(ctx).append_messages(conversation_id, messages)
        return result.model_dump(mode="json")

    @server.tool()
    async def get_context(
        conversation_id: str, ctx: Context, format: ContextFormat = "markdown", max_tokens: int | None = None
    ) -> str | dict[str, Any]:
        """The conversation's bounded context: its summaries plus every message after them.
        format: markdown or text (for a prompt), openai (Chat Completions messages), anthropic
        (Messages API system and messages), json (everything, with token counts). max_tokens fits
        it into that many tokens (the oldest raw rounds go first, never the newest). A
        conversation never written to reads as empty."""
        client = service(ctx)
        async with _errors():
            if format in ("text", "markdown"):
                return await client.get_text_context(conversation_id, format=format, max_tokens=max_tokens)
            if format == "openai":
                return (await client.get_openai_context(conversation_id, max_tokens=max_tokens)).model_dump()
            if format == "anthropic":
                return (
                    await client.get_anthropic_context(conversation_id, max_tokens=max_tokens)
                ).model_dump()
            return (await client.get_context(conversation_id, max_tokens=max_tokens)).model_dump(mode="json")

    @server.tool()
    async def list_memories(conversation_id: str, ctx: Context) -> dict[str, Any]:
        """Every summary (memory) of the conversation, newest range first, with its status,
        range of messages, text and whether the context shows it."""
        async with _errors():
            return (await service(ctx).list_memories(conversation_id)).model_dump(mode="json")

    @server.tool()
    async def summarize_now(conversation_id: str, ctx: Context) -> dict[str, Any]:
        """Queue the summary the conversation's memory policy would make now (it runs in the
        background: list_memories shows it processing, then completed)."""
        async with _errors():
            return (await service(ctx).summarize_now(conversation_id)).model_dump(mode="json")

    return server


@asynccontextmanager
async def _errors() -> AsyncIterator[None]:
    """The service's refusals as tool errors the model can read (status, code, detail)."""
    try:
        yield
    except MemoryServiceError as error:
        raise ToolError(str(error)) from error


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--transport",
        choices=["stdio", "streamable-http"],
        default="stdio",
        help="stdio (an MCP host starts this command) or streamable-http (serve at http://HOST:PORT/mcp)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="streamable-http: address to listen on")
    parser.add_argument("--port", type=int, default=8001, help="streamable-http: port to listen on")
    parser.add_argument(
        "--url",
        default=None,
        help=f"the memory service (default: MEMORY_SERVICE_URL, else {_base.DEFAULT_URL})",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="a tenant's key for the service (default: MEMORY_SERVICE_API_KEY; prefer the variable, as "
        "a command line is visible to other users)",
    )


def run(args: argparse.Namespace) -> int:
    api_key = args.api_key if args.api_key is not None else os.environ.get("MEMORY_SERVICE_API_KEY")
    server = build_server(_base.base_url(args.url), api_key)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.port)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="memory-service-mcp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
