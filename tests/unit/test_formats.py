"""Provider renderings of a context: valid for OpenAI Chat Completions and the Anthropic
Messages API, checked with the providers' own SDK request types, at every round of random agent
transcripts with parallel tool calls, for every policy, with and without a token budget."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import MessageParam, TextBlockParam
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageParam
from pydantic import TypeAdapter

from app.memory.formats import CONTINUED, RESUMED, Unrenderable, to_anthropic, to_openai
from app.memory.policies import MemoryPolicy
from app.memory.policies.recursive_summary import RecursiveSummaryConfig, RecursiveSummaryPolicy
from app.memory.policies.rolling_blocks import RollingBlocksConfig, RollingBlocksPolicy
from app.memory.policies.sliding_window import SlidingWindowConfig, SlidingWindowPolicy
from app.memory.policies.token_budget import TokenBudgetConfig, TokenBudgetPolicy
from app.memory.types import MemoryRef, Trigger
from tests.unit.test_tool_exchanges import Stored, context_raw, observe, store, transcripts

OPENAI = TypeAdapter(list[ChatCompletionMessageParam])
ANTHROPIC_MESSAGES = TypeAdapter(list[MessageParam])
ANTHROPIC_SYSTEM = TypeAdapter(str | list[TextBlockParam])


def message(m: Stored) -> dict[str, Any]:
    """A stored message as the context read returns it."""
    if m.answers is not None:
        role, content, calls = "tool", f"result of {m.answers}", None
    elif m.calls:
        role, content = "assistant", None
        calls = [
            {"id": c, "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"q": c})}}
            for c in m.calls
        ]
    else:
        role, content, calls = ("user" if m.sequence % 2 == 0 else "assistant"), f"text {m.sequence}", None
    return {
        "sequence": m.sequence,
        "round": m.round,
        "type": "tool_result" if m.answers else ("tool_call" if m.calls else "message"),
        "role": role,
        "content": content,
        "name": None,
        "tool_calls": calls,
        "tool_call_id": m.answers,
        "source": None,
        "tokens": 10,
        "metadata": None,
    }


def context_of(raw: list[Stored], rows: list[MemoryRef], shown: int) -> dict[str, Any]:
    summaries = [
        {
            "memory_id": r.memory_id,
            "kind": r.kind,
            "text": f"summary {r.memory_id}",
            "start_sequence": r.start_sequence,
            "end_sequence": r.end_sequence,
        }
        for r in reversed(rows[-shown:])
    ]
    return {"policy": "x", "summaries": summaries, "messages": [message(m) for m in raw], "truncated": False}


def budget_cut(raw: list[Stored], keep_tokens: int) -> list[Stored]:
    """The raw part under ?max_tokens, as the context read cuts it: from the oldest boundary
    whose remaining messages fit (10 tokens each), else the newest exchange."""
    starts = [i for i, m in enumerate(raw) if m.boundary]
    fitting = [i for i in starts if (len(raw) - i) * 10 <= keep_tokens]
    start = fitting[0] if fitting else (starts[-1] if starts else 0)
    return raw[start:]


def check_both(context: dict[str, Any], open_calls: bool) -> None:
    if open_calls:
        with pytest.raises(Unrenderable):
            to_openai(context)
        with pytest.raises(Unrenderable):
            to_anthropic(context)
        return
    openai = to_openai(context)
    OPENAI.validate_python(openai["messages"])
    anthropic = to_anthropic(context)
    ANTHROPIC_MESSAGES.validate_python(anthropic["messages"])
    if "system" in anthropic:
        ANTHROPIC_SYSTEM.validate_python(anthropic["system"])
    # Nothing dropped: every raw message's text and every call and result is in both.
    calls = {c["id"] for m in context["messages"] for c in m["tool_calls"] or ()}
    uses = {b["id"] for t in anthropic["messages"] for b in t["content"] if b["type"] == "tool_use"}
    results = {
        b["tool_use_id"] for t in anthropic["messages"] for b in t["content"] if b["type"] == "tool_result"
    }
    assert calls == uses == results
    assert len(openai["messages"]) == len(context["messages"]) + (1 if context["summaries"] else 0)


POLICIES: list[tuple[MemoryPolicy, int]] = [
    (SlidingWindowPolicy(SlidingWindowConfig(window_size=6, summarize_after_seq=3)), 6),
    (RollingBlocksPolicy(RollingBlocksConfig(window=3, max_summaries=2)), 0),
    (
        TokenBudgetPolicy(
            TokenBudgetConfig(max_tokens=100, max_entries=8, recent_window=3, min_entries_to_compress=2)
        ),
        4,
    ),
]
_RECURSIVE = RecursiveSummaryPolicy(
    RecursiveSummaryConfig(short_term=4, update_every=3, target_min_tokens=10, target_max_tokens=20)
)
POLICIES.append((_RECURSIVE, _RECURSIVE.lookback_messages))


@settings(max_examples=120, deadline=None)
@given(
    rounds=transcripts(),
    which=st.integers(0, len(POLICIES) - 1),
    budget=st.none() | st.integers(min_value=10, max_value=200),
)
def test_every_round_renders_valid_for_both_providers(
    rounds: list[list[tuple[tuple[str, ...], str | None]]], which: int, budget: int | None
) -> None:
    policy, lookback = POLICIES[which]
    spec = policy.context
    rows: list[MemoryRef] = []
    for upto in range(1, len(rounds) + 1):
        stored = store(rounds[:upto])
        for trigger in (Trigger.ROUND_END, Trigger.COMPLETED):
            state = observe(policy, stored, rows, lookback)
            plan = policy.plan(state, trigger)
            if plan is None:
                continue
            first = min(m.sequence for m in stored if m.round == plan.start_round)
            last = max(m.sequence for m in stored if m.round == plan.end_round)
            rows.append(
                MemoryRef(
                    len(rows) + 1, plan.kind, "completed", first, last, plan.start_round, plan.end_round, 5
                )
            )
        raw = context_raw(stored, rows, spec.summaries, spec.recent_rounds)
        if budget is not None:
            raw = budget_cut(raw, budget)
        open_calls = sum(len(m.calls) for m in stored) > sum(m.answers is not None for m in stored)
        check_both(context_of(raw, rows, min(spec.summaries, 3)), open_calls)


def test_anthropic_starts_with_the_user_and_keeps_system_messages_out_of_history() -> None:
    context = {
        "summaries": [{"text": "They planned a trip.", "start_sequence": 0, "end_sequence": 9}],
        "messages": [
            {
                "sequence": 10,
                "role": "assistant",
                "content": "Anything else?",
                "tool_calls": None,
                "tool_call_id": None,
            },
            {
                "sequence": 11,
                "role": "system",
                "type": "context",
                "source": "notes.md",
                "content": "Budget 2000",
                "tool_calls": None,
                "tool_call_id": None,
            },
            {
                "sequence": 12,
                "role": "user",
                "content": [{"type": "text", "text": "Hotels?"}],
                "tool_calls": None,
                "tool_call_id": None,
            },
            {
                "sequence": 13,
                "role": "user",
                "content": {"city": "Kyoto"},
                "tool_calls": None,
                "tool_call_id": None,
            },
        ],
    }
    payload = to_anthropic(context)
    assert payload["messages"][0] == {"role": "user", "content": [{"type": "text", "text": CONTINUED}]}
    assert [t["role"] for t in payload["messages"]] == ["user", "assistant", "user"]
    assert payload["messages"][2]["content"] == [
        {"type": "text", "text": "Hotels?"},
        {"type": "text", "text": '{"city": "Kyoto"}'},
    ]
    assert (
        "They planned a trip." in payload["system"]
        and "[context (notes.md) #11]\nBudget 2000" in payload["system"]
    )
    openai = to_openai(context)["messages"]
    assert openai[0]["role"] == "system" and openai[-1]["content"] == '{"city": "Kyoto"}'

    # With no summary and no system message, the opening turn does not point at a system prompt.
    bare = {"summaries": [], "messages": context["messages"][:1] + context["messages"][2:]}
    assert to_anthropic(bare)["messages"][0]["content"] == [{"type": "text", "text": RESUMED}]
    assert "system" not in to_anthropic(bare)
