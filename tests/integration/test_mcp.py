"""`memory-service mcp` against a real service, driven by the official `mcp` client library: over
stdio (the client starts the command as a subprocess) and over streamable HTTP, with API keys and
tenants honoured."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client as MCPClient
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent
from memory_client import Client

from tests.integration.conftest import OTHER_TENANT_KEY, TENANT_KEY
from tests.integration.servers import ROOT, ServerProcess, free_port

# Subprocesses: the service, the MCP server.
pytestmark = pytest.mark.slow

TOOLS = {"add_messages", "get_context", "list_memories", "summarize_now"}
ROUND = [
    {"role": "user", "content": "Plan a day in Kyoto."},
    {"role": "assistant", "content": "Fushimi Inari at dawn, then Gion."},
]


def text(result: CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, TextContent)
    return block.text


def structured(result: CallToolResult) -> Any:
    assert not result.is_error, text(result)
    return result.structured_content


def stdio_server(service: ServerProcess, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "app.cli", "mcp"],
        cwd=ROOT,
        env={**os.environ, "MEMORY_SERVICE_URL": service.url, **env},
    )


async def test_the_stdio_server_runs_each_tool_as_the_configured_tenant(service: ServerProcess) -> None:
    async with MCPClient(stdio_server(service, MEMORY_SERVICE_API_KEY=TENANT_KEY)) as mcp:
        assert {tool.name for tool in (await mcp.list_tools()).tools} == TOOLS
        added = structured(
            await mcp.call_tool("add_messages", {"conversation_id": "mcp-1", "messages": ROUND})
        )
        assert (added["round"], len(added["messages"])) == (0, 2)

        markdown = await mcp.call_tool("get_context", {"conversation_id": "mcp-1"})
        assert "Fushimi Inari" in text(markdown)
        openai = structured(
            await mcp.call_tool("get_context", {"conversation_id": "mcp-1", "format": "openai"})
        )
        assert openai["result"]["messages"] == ROUND
        later = [
            {"role": "user", "content": "And the evening?"},
            {"role": "assistant", "content": "Pontocho."},
        ]
        structured(await mcp.call_tool("add_messages", {"conversation_id": "mcp-1", "messages": later}))
        fitted = structured(
            await mcp.call_tool(
                "get_context", {"conversation_id": "mcp-1", "format": "json", "max_tokens": 30}
            )
        )["result"]
        assert fitted["truncated"] and fitted["omitted_messages"]["count"] == 2
        assert [m["content"] for m in fitted["messages"]] == ["And the evening?", "Pontocho."]

        started = structured(await mcp.call_tool("summarize_now", {"conversation_id": "mcp-1"}))
        assert (started["status"], started["end_sequence"]) == ("processing", 3)
        memories = structured(await mcp.call_tool("list_memories", {"conversation_id": "mcp-1"}))
        assert [m["memory_id"] for m in memories["memories"]] == [started["memory_id"]]

        missing = await mcp.call_tool("list_memories", {"conversation_id": "never-written"})
        assert missing.is_error and "404 not_found" in text(missing)
        invalid = await mcp.call_tool(
            "add_messages", {"conversation_id": "mcp-1", "messages": [{"role": "robot"}]}
        )
        assert invalid.is_error and "422 invalid_request" in text(invalid)

    # The rounds are the configured tenant's, and only its.
    with (
        Client(service.url, api_key=TENANT_KEY) as mine,
        Client(service.url, api_key=OTHER_TENANT_KEY) as theirs,
    ):
        assert mine.get_conversation("mcp-1").message_count == 4
        assert theirs.list_conversations().conversations == []


@pytest.fixture
def http_mcp(service: ServerProcess, tmp_path: Path) -> Iterator[str]:
    """`memory-service mcp --transport streamable-http` with no key of its own."""
    port = free_port()
    log = (tmp_path / "mcp.log").open("wb")
    env = {k: v for k, v in os.environ.items() if k != "MEMORY_SERVICE_API_KEY"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "mcp",
            "--transport",
            "streamable-http",
            "--port",
            str(port),
            "--url",
            service.url,
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (tmp_path / "mcp.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the MCP server did not listen"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(15)
        log.close()


async def test_over_http_each_mcp_client_acts_with_its_own_key(service: ServerProcess, http_mcp: str) -> None:
    for key in (TENANT_KEY, OTHER_TENANT_KEY):
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as http,
            MCPClient(streamable_http_client(http_mcp, http_client=http)) as mcp,
        ):
            conversation = f"mcp-{key[:8]}"
            structured(
                await mcp.call_tool("add_messages", {"conversation_id": conversation, "messages": ROUND})
            )
            context = structured(
                await mcp.call_tool("get_context", {"conversation_id": conversation, "format": "anthropic"})
            )
            assert context["result"]["messages"][0]["role"] == "user"
    for key in (TENANT_KEY, OTHER_TENANT_KEY):
        with Client(service.url, api_key=key) as client:
            assert [c.conversation_id for c in client.list_conversations().conversations] == [
                f"mcp-{key[:8]}"
            ]

    async with MCPClient(http_mcp) as anonymous:  # no key here, none configured: the service says 401
        refused = await anonymous.call_tool("list_memories", {"conversation_id": "mcp-x"})
    assert refused.is_error and "401 unauthorized" in text(refused)
