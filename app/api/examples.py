"""Example values of the HTTP contract, for the OpenAPI document: the README's walk-through
(conversation ``demo``: three rounds about a trip to Japan, the first summary starting after the
third) and its ``trip-42`` conversation with rolling blocks. The values are what the service
answered to those requests, with the offline summarizer."""

from __future__ import annotations

from typing import Any

ROUNDS = [
    [
        {"role": "user", "content": "I am planning a trip to Japan in April. What should I see?"},
        {"role": "assistant", "content": "April is cherry blossom season. Kyoto and Tokyo are the classics."},
    ],
    [
        {"role": "user", "content": "I only have 5 days and I hate crowds."},
        {"role": "assistant", "content": "Then pick Kyoto early mornings and a day in Nara."},
    ],
    [
        {"role": "user", "content": "Budget is about 2000 dollars. Is that enough?"},
        {"role": "assistant", "content": "Yes, with mid-range hotels and a 7-day JR pass."},
    ],
]
ROUND_TIMES = ["2026-04-01T09:00:00.000000Z", "2026-04-01T09:01:30.000000Z", "2026-04-01T09:03:10.000000Z"]
COMPLETED_AT = "2026-04-01T09:03:12.150000Z"
GENERATION_TIME_MS = 2150


# Each example message's tokens for gpt-4.1-mini (o200k_base), as the service counts them.
TOKENS = [[19, 17], [15, 16], [16, 18]]


def _messages(round_number: int) -> list[dict[str, Any]]:
    return [
        {
            "sequence": 2 * round_number + index,
            "round": round_number,
            "type": "message",
            "role": message["role"],
            "content": message["content"],
            "name": None,
            "tool_calls": None,
            "tool_call_id": None,
            "source": None,
            "tokens": TOKENS[round_number][index],
            "metadata": None,
            "created_at": ROUND_TIMES[round_number],
        }
        for index, message in enumerate(ROUNDS[round_number])
    ]


MESSAGES = [message for number in range(len(ROUNDS)) for message in _messages(number)]

# The third round's POST: sequence 5 is saved, so the first summary starts.
APPEND_MESSAGES_IN = {"messages": ROUNDS[2], "metadata": {"channel": "web"}}
MESSAGE_IN = ROUNDS[0][0]
UPDATE_CONVERSATION_IN = {"memory_policy": {"name": "sliding_window", "summarize_every": 3}}
MEMORY_STARTED = {
    "memory_id": 1,
    "kind": "window",
    "start_sequence": 0,
    "end_sequence": 5,
    "start_round": 0,
    "end_round": 2,
    "base_memory_id": None,
    "status": "processing",
    "created_at": ROUND_TIMES[2],
}
APPEND_MESSAGES_OUT = {
    "conversation_id": "demo",
    "created": False,
    "round": 2,
    "messages": _messages(2),
    "summary_due": True,
}

SUMMARY_TEXT = (
    "#0 user: I am planning a trip to Japan in April.\n"
    "#1 assistant: April is cherry blossom season.\n"
    "#2 user: I only have 5 days and I hate crowds.\n"
    "#3 assistant: Then pick Kyoto early mornings and a day in Nara.\n"
    "#4 user: Budget is about 2000 dollars.\n"
    "#5 assistant: Yes, with mid-range hotels and a 7-day JR pass."
)
CONTEXT_SUMMARY = {
    "memory_id": 1,
    "kind": "window",
    "text": SUMMARY_TEXT,
    "start_sequence": 0,
    "end_sequence": 5,
    "start_round": 0,
    "end_round": 2,
    "base_memory_id": None,
    "tokens": 52,
    "input_tokens": sum(sum(round_tokens) for round_tokens in TOKENS),
    "from_at": ROUND_TIMES[0],
    "to_at": ROUND_TIMES[2],
    "created_at": ROUND_TIMES[2],
    "completed_at": COMPLETED_AT,
    "generation_time_ms": GENERATION_TIME_MS,
}
PROCESSING_MEMORY = {key: MEMORY_STARTED[key] for key in ("memory_id", "kind", "start_sequence")} | {
    "end_sequence": 5,
    "base_memory_id": None,
    "created_at": ROUND_TIMES[2],
}
# After the first summary completed: the summary, nothing after it.
CONTEXT = {
    "conversation_id": "demo",
    "policy": "sliding_window",
    "summaries": [CONTEXT_SUMMARY],
    "memory": CONTEXT_SUMMARY,
    "messages": [],
    "truncated": False,
    "omitted_messages": None,
    "processing": None,
    "summary_due": False,
    "summary_backoff": None,
    "last_sequence": 5,
    "tokens": {"summaries": 52, "messages": 0, "total": 52},
    "context_window": None,
    "memory_lag_messages": 0,
}
# While it was still running: no summary yet, so every message (the gap fallback).
CONTEXT_WHILE_PROCESSING = CONTEXT | {
    "summaries": [],
    "memory": None,
    "messages": MESSAGES,
    "processing": PROCESSING_MEMORY,
    "tokens": {"summaries": 0, "messages": 101, "total": 101},
    "memory_lag_messages": 6,
}

MEMORY = {
    "memory_id": 1,
    "kind": "window",
    "start_sequence": 0,
    "end_sequence": 5,
    "start_round": 0,
    "end_round": 2,
    "input_start_sequence": 0,
    "base_memory_id": None,
    "status": "completed",
    "created_at": ROUND_TIMES[2],
    "completed_at": COMPLETED_AT,
    "generation_time_ms": GENERATION_TIME_MS,
    "attempts": 1,
    "error": None,
    "text": SUMMARY_TEXT,
    "base_end_seq": None,
    "shown": True,
}
MEMORIES = {"conversation_id": "demo", "memories": [MEMORY]}
MESSAGES_PAGE = {"conversation_id": "demo", "messages": _messages(0), "next_after_sequence": 1}

SLIDING_WINDOW = {
    "name": "sliding_window",
    "window_size": 14,
    "summarize_after_seq": 5,
    "catch_up_on_completion": False,
}
ROLLING_BLOCKS = {"name": "rolling_blocks", "window": 21, "max_summaries": 3}
CREATE_CONVERSATION_IN = {
    "conversation_id": "trip-42",
    "memory_policy": {"name": "rolling_blocks", "window": 21},
    "metadata": {"user": "ana"},
}
CONVERSATION = {
    "conversation_id": "trip-42",
    "created_at": "2026-04-01T10:00:00.000000Z",
    "metadata": {"user": "ana"},
    "memory_policy": ROLLING_BLOCKS,
    "message_count": 0,
    "round_count": 0,
    "summary_failures": 0,
    "summary_retry_at": None,
    "memory_count": 0,
}
DEMO_CONVERSATION = CONVERSATION | {
    "conversation_id": "demo",
    "created_at": ROUND_TIMES[0],
    "metadata": {"channel": "web"},
    "memory_policy": SLIDING_WINDOW,
    "message_count": 6,
    "round_count": 3,
    "memory_count": 1,
}
CONVERSATIONS_PAGE = {
    "conversations": [DEMO_CONVERSATION | {"metadata": None}, CONVERSATION | {"metadata": None}],
    "next_after": None,
}

# Ops.
FAILED_MEMORY = {
    "conversation_id": "demo",
    "memory_id": 2,
    "start_sequence": 0,
    "end_sequence": 7,
    "created_at": "2026-04-01T09:05:00.000000Z",
    "completed_at": "2026-04-01T09:08:00.000000Z",
    "attempts": 1,
    "error": "LLM call exceeded 180 s",
}
FAILING_CONVERSATION = {
    "conversation_id": "demo",
    "summary_failures": 2,
    "summary_retry_at": "2026-04-01T09:08:30.000000Z",
    "last_error": "LLM call exceeded 180 s",
}
STUCK_MEMORY = {
    "conversation_id": "demo",
    "memory_id": 2,
    "created_at": "2026-04-01T09:05:00.000000Z",
    "lease_expires_at": "2026-04-01T09:10:00.000000Z",
    "age_seconds": 312.5,
}
WINDOW_ROW = {
    "conversation_id": "demo",
    "memory_id": 1,
    "start_sequence": 0,
    "end_sequence": 5,
    "window_size": 6,
    "generation_time_ms": GENERATION_TIME_MS,
}
GENERATION_STATS = {
    "avg_ms": 2150.0,
    "max_ms": 2150,
    "p50_ms": 2150.0,
    "p95_ms": 2150.0,
    "total_summaries": 1,
}
RUNNER_STATS = {
    "running": 1,
    "queued": 0,
    "due": 2,
    "oldest_due_seconds": 0.4,
    "runs_summaries": True,
    "max_concurrent": 64,
    "llm_circuit": "closed",
    "llm_consecutive_failures": 0,
    "llm_circuit_retry_in_seconds": 0.0,
}

# Stats, export and import, clearing: the walk-through's `demo` after its first summary.
DEMO_TOKENS = sum(sum(round_tokens) for round_tokens in TOKENS)
STATS = {
    "conversation_id": "demo",
    "policy": "sliding_window",
    "total_entries": 6,
    "active_entries": 0,
    "compressed_entries": 6,
    "summaries": 1,
    "total_tokens": DEMO_TOKENS,
    "active_tokens": 0,
    "compressed_tokens": DEMO_TOKENS,
    "summary_tokens": 52,
    "context_tokens": 52,
    "tokens_saved": DEMO_TOKENS - 52,
    "processing": False,
}
EXPORTED_MEMORY = {
    key: MEMORY[key]
    for key in (
        "memory_id",
        "kind",
        "status",
        "start_sequence",
        "end_sequence",
        "start_round",
        "end_round",
        "input_start_sequence",
        "base_memory_id",
        "text",
        "created_at",
        "completed_at",
        "generation_time_ms",
        "attempts",
        "error",
    )
} | {key: CONTEXT_SUMMARY[key] for key in ("tokens", "input_tokens", "from_at", "to_at")}
EXPORT = {
    "format": "memory-service.conversation",
    "version": 1,
    "conversation": {
        "conversation_id": "demo",
        "created_at": ROUND_TIMES[0],
        "memory_policy": SLIDING_WINDOW | {"summarize_every": 1},
        "metadata": {"channel": "web"},
    },
    "entries": MESSAGES,
    "memories": [EXPORTED_MEMORY],
}
IMPORTED = {
    "conversation_id": "demo-copy",
    "entries": 6,
    "memories": 1,
    "dropped_processing": 0,
    "summary_due": False,
}
CLEARED = {"conversation_id": "demo", "entries": 6, "memories": 1, "dropped_processing": None}

WEBHOOK_IN = {"url": "https://hooks.example.com/memory"}
WEBHOOK = {
    "webhook_id": 1,
    "url": "https://hooks.example.com/memory",
    "created_at": "2026-04-01T09:00:00.000000Z",
}
WEBHOOK_CREATED = {**WEBHOOK, "secret": "whsec_3q2-Vu4bW8Xv0pQzR9sT1uYw6aDcEfGh"}
RETRIED_DELIVERY = {"conversation_id": "demo", "event_id": 7, "webhook_id": 1, "status": "pending"}
DEAD_DELIVERY = {
    "conversation_id": "demo",
    "event_id": 7,
    "webhook_id": 1,
    "url": "https://hooks.example.com/memory",
    "type": "summary:started",
    "attempts": 10,
    "last_error": "HTTP 503",
    "created_at": "2026-04-01T09:00:00.000000Z",
}

# ---- seed 001: ending a session, users --------------------------------------------------

RECURSIVE_SUMMARY = {
    "name": "recursive_summary",
    "short_term": 10,
    "update_every": 10,
    "max_summary_tokens": 7000,
    "target_min_tokens": 500,
    "target_max_tokens": 1000,
}
ENDED_CONVERSATION = CONVERSATION | {
    "conversation_id": "session-7",
    "metadata": {},
    "memory_policy": RECURSIVE_SUMMARY,
    "message_count": 24,
    "round_count": 12,
    "memory_count": 2,
    "user_id": "ana",
    "ended_at": "2026-04-01T11:00:00.000000Z",
    "archived_at": None,
    "final_summary": MEMORY_STARTED
    | {"memory_id": 3, "kind": "medium_term", "end_sequence": 23, "end_round": 11, "base_memory_id": 2},
}
USER_SUMMARY = {
    "memory_id": 4,
    "status": "completed",
    "text": "# Cross-Conversation Summary\n\n## session-7 (ended, last message 2026-04-01T10:59:00)\n...",
    "base_memory_id": 3,
    "sources": [{"conversation_id": "session-7", "summary_memory_id": 3, "last_sequence": 23}],
    "created_at": "2026-04-01T11:00:00.100000Z",
    "completed_at": "2026-04-01T11:00:02.300000Z",
    "generation_time_ms": 2200,
    "attempts": 1,
    "error": None,
    "tokens": 640,
}
USER_CONTEXT = {
    "user_id": "ana",
    "summary": USER_SUMMARY,
    "processing": None,
    "freshness": {"fresh": True, "behind": None},
}
USER_MEMORIES = {"user_id": "ana", "memories": [USER_SUMMARY]}
