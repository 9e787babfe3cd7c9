"""memory_client.agents: the OpenAI Agents SDK's own Runner keeps its transcript in a real service
and reads the bounded context back, its model being the fake OpenAI server (Chat Completions)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
from agents.memory import Session
from memory_client import AsyncClient, ConflictError
from memory_client.agents import MemoryServiceSession, UnsupportedSessionOperation
from openai import AsyncOpenAI

from tests.fakellm import FakeLLM
from tests.integration.conftest import TENANT_KEY, eventually
from tests.integration.servers import ServerProcess

NO_TRACING = RunConfig(tracing_disabled=True)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: 17C, rain"


def weather_agent(llm: FakeLLM) -> Agent[Any]:
    model = OpenAIChatCompletionsModel(
        model="gpt-4.1-mini", openai_client=AsyncOpenAI(base_url=llm.base_url, api_key="sk-test")
    )
    return Agent(name="assistant", instructions="Be brief.", model=model, tools=[get_weather])


def agent_calls(llm: FakeLLM) -> list[list[dict[str, Any]]]:
    """The messages of each call the agent (not the summarizer) made."""
    return [call.body["messages"] for call in llm.calls if not call.job]


@pytest.fixture
async def client(service: ServerProcess) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(service.url, api_key=TENANT_KEY) as c:
        yield c


async def test_a_runner_keeps_its_transcript_in_the_service(client: AsyncClient, llm: FakeLLM) -> None:
    llm.agent_replies.extend(
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_w1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Kyoto"}'},
                    }
                ],
            },
            {"role": "assistant", "content": "Kyoto: 17C and rain."},
            {"role": "assistant", "content": "You asked about Kyoto."},
        ]
    )
    agent = weather_agent(llm)
    session = MemoryServiceSession("agent-7", client)
    assert isinstance(session, Session)

    first = await Runner.run(agent, "Weather in Kyoto?", session=session, run_config=NO_TRACING)
    assert first.final_output == "Kyoto: 17C and rain."
    stored = [m async for m in client.iter_messages("agent-7")]
    assert [(m.role, m.type) for m in stored] == [
        ("user", "message"),
        ("assistant", "tool_call"),
        ("tool", "tool_result"),
        ("assistant", "message"),
    ]
    assert stored[1].tool_calls is not None and stored[1].tool_calls[0].id == "call_w1"
    assert stored[2].content == "Kyoto: 17C, rain"

    second = await Runner.run(agent, "What did I ask?", session=session, run_config=NO_TRACING)
    assert second.final_output == "You asked about Kyoto."
    # The second run's model call got the transcript back from the service, tool exchange intact.
    history = agent_calls(llm)[-1]
    assert [m["role"] for m in history] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert history[2]["tool_calls"][0]["id"] == "call_w1" and history[3]["tool_call_id"] == "call_w1"
    assert (await client.get_conversation("agent-7")).message_count == 6


async def test_the_session_reads_the_bounded_context(client: AsyncClient, llm: FakeLLM) -> None:
    """Once a summary covers the first rounds, they come back as one leading system item."""
    await client.create_conversation(
        "agent-8", memory_policy={"name": "sliding_window", "window_size": 4, "summarize_after_seq": 3}
    )
    session = MemoryServiceSession("agent-8", client)
    for n in range(3):
        await session.add_items(
            [{"role": "user", "content": f"Question {n}?"}, {"role": "assistant", "content": f"Answer {n}."}]
        )

    async def summarized() -> bool:
        context = await client.get_context("agent-8")
        return context.memory is not None and context.processing is None

    await eventually(summarized, what="a summary of the first rounds")
    items = await session.get_items()
    assert items[0]["role"] == "system" and "Summary of messages" in str(items[0]["content"])  # type: ignore[typeddict-item]
    assert len(items) < 6
    assert await session.get_items(limit=1) == items[-1:]


async def test_pop_item_is_refused_and_clear_session_starts_over(client: AsyncClient) -> None:
    await client.create_conversation(
        "agent-9", memory_policy={"name": "token_budget"}, metadata={"user": "ana"}
    )
    session = MemoryServiceSession("agent-9", client)
    await session.add_items(
        [
            {"role": "developer", "content": "Use metric units."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
        ]
    )
    assert [m.role async for m in client.iter_messages("agent-9")] == ["system", "user", "assistant"]
    with pytest.raises(UnsupportedSessionOperation, match="append-only"):
        await session.pop_item()
    assert len(await session.get_items()) == 3  # nothing was removed

    await session.clear_session()
    assert await session.get_items() == []
    conversation = await client.get_conversation("agent-9")
    assert conversation.memory_policy["name"] == "token_budget" and conversation.metadata == {"user": "ana"}
    await MemoryServiceSession("never-written", client).clear_session()


async def test_a_call_waiting_for_its_output_is_a_conflict_until_the_output_is_stored(
    client: AsyncClient,
) -> None:
    session = MemoryServiceSession("agent-10", client)
    call = {"type": "function_call", "call_id": "call_9", "name": "get_weather", "arguments": "{}"}
    await session.add_items([{"role": "user", "content": "Weather?"}, call])  # type: ignore[list-item]
    with pytest.raises(ConflictError, match="call_9"):
        await session.get_items()
    await session.add_items([{"type": "function_call_output", "call_id": "call_9", "output": "17C"}])
    assert [item.get("type", "message") for item in await session.get_items()] == [
        "message",
        "function_call",
        "function_call_output",
    ]
