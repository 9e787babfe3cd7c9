"""The README's client, OpenAI Agents SDK, LangChain and MCP examples run as written, against a
real service and the fake OpenAI server."""

from __future__ import annotations

import os
import time

import pytest
from memory_client import Client

from tests.fakellm import FakeLLM
from tests.integration.conftest import Launch
from tests.integration.test_readme_examples import example, run, three_rounds

pytestmark = pytest.mark.slow

SECTION = "Python client and agent frameworks"


def summarized_rounds(url: str) -> str:
    """Three rounds, which make the first summary due; waits until it completes and returns its
    text (what the context then holds instead of the rounds)."""
    three_rounds(url)
    deadline = time.monotonic() + 15
    with Client(url) as client:
        while (context := client.get_context("trip-7")).memory is None or context.processing:
            assert time.monotonic() < deadline, "the summary did not complete"
            time.sleep(0.02)
    return context.memory.text


def model_env(llm: FakeLLM) -> dict[str, str]:
    return {
        **os.environ,
        "OPENAI_BASE_URL": llm.base_url,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
    }


def test_the_client_example_runs(launch: Launch, llm: FakeLLM) -> None:
    server = launch()
    run(example(SECTION, 0).replace("http://127.0.0.1:8000", server.url), model_env(llm))
    with Client(server.url) as client:
        assert client.get_conversation("trip-7").message_count == 2


def test_the_agents_sdk_example_runs(launch: Launch, llm: FakeLLM) -> None:
    server = launch()
    summary = summarized_rounds(server.url)
    llm.agent_replies.append({"role": "assistant", "content": "Osaka: street food in Dotonbori."})
    run(example(SECTION, 1).replace("http://127.0.0.1:8000", server.url), model_env(llm))
    with Client(server.url) as client:
        stored = [m.content for m in client.iter_messages("trip-7")]
    assert stored[-2:] == ["And what about Osaka?", "Osaka: street food in Dotonbori."]
    # The model got the bounded context from the service (the summary of the rounds), then the question.
    (asked,) = [call.body["messages"] for call in llm.calls if not call.job]
    assert [m["role"] for m in asked] == ["system", "system", "user"]
    assert summary in asked[1]["content"] and asked[2]["content"] == "And what about Osaka?"


def test_the_langchain_example_runs(launch: Launch, llm: FakeLLM) -> None:
    server = launch()
    summary = summarized_rounds(server.url)
    llm.agent_replies.append({"role": "assistant", "content": "Yes, for a 7-day trip."})
    run(example(SECTION, 2).replace("http://127.0.0.1:8000", server.url), model_env(llm))
    with Client(server.url) as client:
        stored = [m.content for m in client.iter_messages("trip-7")]
    assert stored[-2:] == ["Is the JR pass worth it?", "Yes, for a 7-day trip."]
    (asked,) = [call.body["messages"] for call in llm.calls if not call.job]
    assert [m["role"] for m in asked] == ["system", "user"]
    assert summary in asked[0]["content"] and asked[1]["content"] == "Is the JR pass worth it?"


def test_the_mcp_example_runs(launch: Launch, llm: FakeLLM) -> None:
    server = launch()
    run(example(SECTION, 3).replace("http://127.0.0.1:8000", server.url), model_env(llm))
    with Client(server.url) as client:
        assert [m.content for m in client.iter_messages("trip-7")] == ["Where to eat in Osaka?", "Dotonbori."]
