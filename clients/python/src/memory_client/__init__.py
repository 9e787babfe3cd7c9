"""A typed client for the conversation memory service: ``Client`` (sync) and ``AsyncClient``.

Adapters, each behind an extra of this package: ``memory_client.agents`` (a Session of the
OpenAI Agents SDK, extra ``agents``), ``memory_client.langchain`` (a LangChain chat message
history, extra ``langchain``) and ``memory_client.mcp_server`` (a Model Context Protocol server, extra
``mcp``)."""

from __future__ import annotations

from memory_client import models
from memory_client._version import __version__
from memory_client.async_client import AsyncClient, AsyncEventStream
from memory_client.client import Client, EventStream
from memory_client.errors import (
    AuthenticationError,
    ConflictError,
    InvalidRequestError,
    MemoryServiceError,
    NotFoundError,
    UnavailableError,
)

__all__ = [
    "AsyncClient",
    "AsyncEventStream",
    "AuthenticationError",
    "Client",
    "ConflictError",
    "EventStream",
    "InvalidRequestError",
    "MemoryServiceError",
    "NotFoundError",
    "UnavailableError",
    "__version__",
    "models",
]
