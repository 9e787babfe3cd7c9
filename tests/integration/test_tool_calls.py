"""Transcripts of tool-using agents over HTTP: OpenAI Chat Completions messages stored and
returned as posted, typed and counted; bad tool pairing refused whole; windows that never split
a tool exchange."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from app.memory.tokens import counter_for
from tests.integration.conftest import App, AppFactory

WEATHER_CALLS = [
    {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Kyoto"}'},
    },
    {
        "id": "call_2",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Nara"}'},
    },
]
AGENT_ROUND: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Kyoto and Nara tomorrow?"},
    {"role": "assistant", "content": None, "tool_calls": WEATHER_CALLS},
    {"role": "tool", "tool_call_id": "call_2", "content": "Nara: 18C, clear"},
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "Kyoto: 17C, rain"}]},
    {"role": "assistant", "content": "Kyoto 17C with rain, Nara 18C and clear.", "name": "planner"},
]


async def post(api: App, cid: str, messages: list[dict[str, Any]]) -> Any:
    return await api.client.post(f"/conversations/{cid}/messages", json={"messages": messages})


async def test_an_agent_round_comes_back_as_posted_typed_and_counted(
    api: App, db: asyncpg.Connection
) -> None:
    response = await post(api, "agent", AGENT_ROUND)
    assert response.status_code == 201, response.text
    stored = response.json()["messages"]
    assert [m["type"] for m in stored] == ["message", "tool_call", "tool_result", "tool_result", "message"]
    for posted, got in zip(AGENT_ROUND, stored, strict=True):
        for key, value in posted.items():
            assert got[key] == value, key
    assert stored[1]["content"] is None and stored[4]["name"] == "planner"
    counter = counter_for("gpt-4.1-mini")
    assert [m["tokens"] for m in stored] == [counter.message(m) for m in AGENT_ROUND]
    context = await api.context("agent")
    assert [
        {k: m[k] for k in posted} for posted, m in zip(AGENT_ROUND, context["messages"], strict=True)
    ] == (AGENT_ROUND)
    # Totals over any range are differences of running totals.
    rows = await db.fetch("SELECT tokens, tokens_before FROM messages ORDER BY sequence")
    assert [r["tokens_before"] for r in rows] == [
        sum(r["tokens"] for r in rows[:i]) for i in range(len(rows))
    ]
    total = await db.fetchval("SELECT next_tokens FROM conversations")
    assert total == sum(r["tokens"] for r in rows)


async def test_context_entries_have_their_source(api: App) -> None:
    entry = {"role": "system", "type": "context", "source": "src/main.ts", "content": "export const x = 1;"}
    stored = (await post(api, "ctx", [entry])).json()["messages"][0]
    assert (stored["type"], stored["source"], stored["role"]) == ("context", "src/main.ts", "system")


async def test_bad_tool_pairing_is_refused_whole(api: App, db: asyncpg.Connection) -> None:
    cases: list[tuple[list[dict[str, Any]], str]] = [
        ([{"role": "tool", "tool_call_id": "nope", "content": "x"}], "matches no earlier tool call"),
        ([{"role": "tool", "content": "x"}], "tool_call_id"),
        ([{"role": "user", "content": "x", "tool_call_id": "a"}], "only a tool message"),
        ([{"role": "wizard", "content": "x"}], "role"),
        ([{"role": "assistant", "content": None}], "content is required"),
        (
            [
                {
                    "role": "assistant",
                    "tool_calls": [{**WEATHER_CALLS[0], "function": {"name": "f", "arguments": "{oops"}}],
                }
            ],
            "JSON",
        ),
        ([*AGENT_ROUND[:2], {"role": "user", "content": "and?"}], "comes before the results"),
        ([AGENT_ROUND[2], AGENT_ROUND[1]], "before it is made"),
    ]
    for messages, expected in cases:
        response = await post(api, "bad", messages)
        assert response.status_code == 422, (messages, response.text)
        assert expected in response.text, (expected, response.text)
    assert await db.fetchval("SELECT count(*) FROM messages") == 0
    # A call answered twice, or an id used again, across rounds: refused by the keys, naming the field.
    assert (await post(api, "bad", AGENT_ROUND)).status_code == 201
    again = await post(api, "bad", [{"role": "tool", "tool_call_id": "call_1", "content": "again"}])
    assert again.status_code == 422 and again.json()["detail"][0]["loc"] == [
        "body",
        "messages",
        0,
        "tool_call_id",
    ]
    reused = await post(api, "bad", AGENT_ROUND)
    assert reused.status_code == 422 and "already used" in reused.text
    assert await db.fetchval("SELECT count(*) FROM messages") == len(AGENT_ROUND)


async def test_calls_left_open_are_answered_first_in_the_next_round(
    make_app: AppFactory, db: asyncpg.Connection
) -> None:
    api = await make_app(MEMORY_ROLLING_WINDOW_SIZE=4, MEMORY_SUMMARIZE_AFTER_SEQ=0)
    assert (await post(api, "open", AGENT_ROUND[:2])).status_code == 201  # calls made, no results yet
    missing = await post(api, "open", [{"role": "user", "content": "hello?"}])
    assert missing.status_code == 422 and "have no result yet" in missing.text
    assert (await post(api, "open", AGENT_ROUND[2:])).status_code == 201
    await api.idle()
    # The round that answered the calls is not a boundary: no summary ended between them.
    boundaries = await db.fetch("SELECT round FROM messages WHERE boundary ORDER BY sequence")
    assert [r["round"] for r in boundaries] == [0]
    ends = await db.fetch("SELECT end_sequence FROM memory WHERE status = 'completed' ORDER BY memory_id")
    assert all(r["end_sequence"] != 1 for r in ends)
    context = await api.context("open")
    made = {c["id"] for m in context["messages"] for c in m["tool_calls"] or ()}
    answered = {m["tool_call_id"] for m in context["messages"] if m["tool_call_id"]}
    assert answered <= made


async def test_provider_formats_and_token_budgets_over_http(api: App) -> None:
    from anthropic.types import MessageParam
    from openai.types.chat import ChatCompletionMessageParam
    from pydantic import TypeAdapter

    # No summary yet (its threshold is far): the context is every message, raw.
    policy = {"name": "sliding_window", "summarize_after_seq": 100_000}
    created = await api.client.post(
        "/conversations", json={"conversation_id": "fmt", "memory_policy": policy}
    )
    assert created.status_code == 201
    for n in range(4):
        # Each round's calls get their own ids (a conversation uses an id once).
        renamed = json.loads(json.dumps(AGENT_ROUND).replace('"call_', f'"r{n}_call_'))
        renamed[0]["content"] = f"Question {n}?"
        assert (await post(api, "fmt", renamed)).status_code == 201
    await api.idle()  # the summaries settle, so every read below sees the same context
    openai = await api.client.get("/conversations/fmt/context", params={"format": "openai"})
    assert openai.status_code == 200 and openai.headers["X-Context-Truncated"] == "false"
    TypeAdapter(list[ChatCompletionMessageParam]).validate_python(openai.json()["messages"])
    anthropic = await api.client.get("/conversations/fmt/context", params={"format": "anthropic"})
    assert anthropic.status_code == 200
    TypeAdapter(list[MessageParam]).validate_python(anthropic.json()["messages"])
    full = (await api.context("fmt"))["tokens"]["total"]
    assert int(openai.headers["X-Context-Tokens"]) == full
    # A budget drops the oldest rounds, whole, and says so; the newest round always stays.
    fitted = (await api.client.get("/conversations/fmt/context", params={"max_tokens": full // 2})).json()
    assert fitted["truncated"] and fitted["tokens"]["total"] <= full // 2
    assert fitted["messages"][0]["type"] == "message" and fitted["messages"][0]["content"].startswith(
        "Question"
    )
    tiny = (
        await api.client.get("/conversations/fmt/context", params={"max_tokens": 1, "context_window": 1000})
    ).json()
    assert [m["round"] for m in tiny["messages"]] == [3] * 5 and tiny["truncated"]
    assert tiny["context_window"]["used_percent"] == round(tiny["tokens"]["total"] * 100 / 1000, 1)
    markdown = await api.client.get("/conversations/fmt/context", params={"format": "markdown"})
    assert markdown.headers["content-type"].startswith("text/markdown") and "## Messages" in markdown.text
