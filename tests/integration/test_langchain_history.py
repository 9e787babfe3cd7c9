"""memory_client.langchain: LangChain's own RunnableWithMessageHistory and ChatOpenAI (against the
fake OpenAI server) keep their history in a real service. LangChain publishes no standard tests
for chat message histories (langchain-tests has none), so the contract of BaseChatMessageHistory
is checked here: messages in order, add_messages, clear, and the async variants."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_openai import ChatOpenAI
from memory_client import AsyncClient, Client
from memory_client.langchain import MemoryServiceChatMessageHistory

from tests.fakellm import FakeLLM
from tests.integration.conftest import TENANT_KEY, eventually
from tests.integration.servers import ServerProcess

# BaseChatMessageHistory is deprecated since langchain-core 1.6.4 (see memory_client.langchain).
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def client(service: ServerProcess) -> Iterator[Client]:
    with Client(service.url, api_key=TENANT_KEY) as c:
        yield c


def history(service: ServerProcess, conversation_id: str) -> MemoryServiceChatMessageHistory:
    return MemoryServiceChatMessageHistory(conversation_id, base_url=service.url, api_key=TENANT_KEY)


def test_runnable_with_message_history_keeps_the_chat_in_the_service(
    service: ServerProcess, client: Client, llm: FakeLLM
) -> None:
    llm.agent_replies.extend(
        [
            {"role": "assistant", "content": "Kyoto in April."},
            {"role": "assistant", "content": "You said Kyoto."},
        ]
    )
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Be brief."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    model = ChatOpenAI(model="gpt-4.1-mini", base_url=llm.base_url, api_key="sk-test")
    chain = RunnableWithMessageHistory(
        prompt | model,
        lambda session_id: history(service, session_id),
        input_messages_key="question",
        history_messages_key="history",
    )
    config = {"configurable": {"session_id": "lc-1"}}
    assert chain.invoke({"question": "Where to go?"}, config=config).content == "Kyoto in April."  # type: ignore[arg-type]
    assert chain.invoke({"question": "Where did I say?"}, config=config).content == "You said Kyoto."  # type: ignore[arg-type]

    stored = [(m.role, m.content) for m in client.iter_messages("lc-1")]
    assert stored == [
        ("user", "Where to go?"),
        ("assistant", "Kyoto in April."),
        ("user", "Where did I say?"),
        ("assistant", "You said Kyoto."),
    ]
    second = [call.body["messages"] for call in llm.calls if not call.job][-1]
    assert [m["content"] for m in second] == [
        "Be brief.",
        "Where to go?",
        "Kyoto in April.",
        "Where did I say?",
    ]


async def test_messages_round_trip_tool_calls_and_summaries(service: ServerProcess, client: Client) -> None:
    client.create_conversation(
        "lc-2", memory_policy={"name": "sliding_window", "window_size": 4, "summarize_after_seq": 5}
    )
    chat = history(service, "lc-2")
    assert chat.messages == []
    exchange = [
        HumanMessage("Weather in Kyoto?"),
        AIMessage("", tool_calls=[{"id": "call_1", "name": "weather", "args": {"city": "Kyoto"}}]),
        ToolMessage("17C, rain", tool_call_id="call_1"),
        AIMessage("17C with rain."),
    ]
    chat.add_messages(exchange)
    read = chat.messages
    assert [type(m) for m in read] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    assert read[1].tool_calls[0]["args"] == {"city": "Kyoto"}  # type: ignore[attr-defined]
    assert read[2].tool_call_id == "call_1"  # type: ignore[attr-defined]

    chat.add_user_message("And Nara?")
    chat.add_ai_message("18C and clear.")

    async def summarized() -> bool:
        context = client.get_context("lc-2")  # the service is another process: blocking is fine
        return context.memory is not None and context.processing is None

    await eventually(summarized, what="a summary of the first rounds")
    bounded = chat.messages
    assert isinstance(bounded[0], SystemMessage) and "Summary of messages" in str(bounded[0].content)
    assert len(bounded) < 6


async def test_the_async_methods_and_clear(service: ServerProcess) -> None:
    async with AsyncClient(service.url, api_key=TENANT_KEY) as async_client:
        await async_client.create_conversation("lc-3", memory_policy={"name": "token_budget"})
        chat = MemoryServiceChatMessageHistory("lc-3", async_client=async_client)
        await chat.aadd_messages([HumanMessage("Hi"), AIMessage("Hello.")])
        assert [m.content for m in await chat.aget_messages()] == ["Hi", "Hello."]
        await chat.aclear()
        assert await chat.aget_messages() == []
        assert (await async_client.get_conversation("lc-3")).memory_policy["name"] == "token_budget"
    sync_chat = history(service, "lc-4")
    sync_chat.add_messages([HumanMessage("Hi")])
    sync_chat.clear()
    assert sync_chat.messages == []
    history(service, "never-written").clear()
