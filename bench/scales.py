"""Run sizes. ``full`` is the issue's sizes; ``tiny`` exercises every code path in seconds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scale:
    name: str
    # 1 + 4: GET context (closed loop) against the service and the floor app
    context_sizes: tuple[int, ...]
    context_concurrency: int
    warmup_seconds: float
    duration_seconds: float
    repeats: int
    memory_history: bool  # seed one completed memory per round, as the policy would have
    # 2: POST a round (open loop at a fixed rate) with a fast and a slow LLM
    post_conversations: int
    post_rate: float
    post_duration_seconds: float
    post_concurrency: int
    fast_llm_latency: float
    slow_llm_latency: float
    # 3: mixed traffic, once per LLM latency (each on conversations of its own)
    mixed_conversations: int
    mixed_clients: int
    mixed_rounds: int
    mixed_llm_latencies: tuple[float, ...]
    # 5: tokens
    token_rounds: int
    # 6: append throughput per deployment (closed loop of POSTs)
    append_conversations: int
    append_concurrency: int
    append_warmup_seconds: float
    append_duration_seconds: float
    append_repeats: int
    append_llm_latency: float
    # 7: summaries/s of a worker per MEMORY_MAX_CONCURRENT_SUMMARIES, on a backlog
    sizing_caps: tuple[int, ...]
    sizing_llm_latency: float
    sizing_warmup_seconds: float
    sizing_seconds: float
    # waiting for background summaries to finish after a load run
    drain_timeout_seconds: float
    # 8: export and import of one token_budget conversation of this many entries
    transfer_entries: int = 10_000
    # 9: token counting on the append path: agent rounds counted in-process and POSTed
    counting_rounds: int = 2_000


SCALES: dict[str, Scale] = {
    "tiny": Scale(
        name="tiny",
        context_sizes=(10, 100, 1_000),
        context_concurrency=4,
        warmup_seconds=0.3,
        duration_seconds=1.0,
        repeats=1,
        memory_history=True,
        post_conversations=20,
        post_rate=20.0,
        post_duration_seconds=1.5,
        post_concurrency=8,
        fast_llm_latency=0.0,
        slow_llm_latency=0.3,
        mixed_conversations=20,
        mixed_clients=5,
        mixed_rounds=3,
        mixed_llm_latencies=(0.05, 0.1),
        token_rounds=24,
        append_conversations=40,
        append_concurrency=8,
        append_warmup_seconds=0.5,
        append_duration_seconds=1.5,
        append_repeats=1,
        append_llm_latency=0.05,
        sizing_caps=(2, 8),
        sizing_llm_latency=0.1,
        sizing_warmup_seconds=0.3,
        sizing_seconds=1.0,
        drain_timeout_seconds=60.0,
        transfer_entries=500,
        counting_rounds=100,
    ),
    "full": Scale(
        name="full",
        context_sizes=(10, 1_000, 100_000),
        context_concurrency=16,
        warmup_seconds=2.0,
        duration_seconds=8.0,
        repeats=3,
        memory_history=True,
        post_conversations=300,
        post_rate=100.0,
        post_duration_seconds=30.0,
        post_concurrency=32,
        fast_llm_latency=0.0,
        slow_llm_latency=2.0,
        mixed_conversations=1_000,
        mixed_clients=50,
        mixed_rounds=20,
        mixed_llm_latencies=(1.0, 2.0),
        token_rounds=300,
        append_conversations=1_000,
        append_concurrency=32,
        append_warmup_seconds=3.0,
        append_duration_seconds=15.0,
        append_repeats=2,
        append_llm_latency=1.0,
        sizing_caps=(8, 16, 32, 64, 128),
        sizing_llm_latency=1.0,
        sizing_warmup_seconds=4.0,
        sizing_seconds=12.0,
        drain_timeout_seconds=900.0,
        transfer_entries=10_000,
    ),
}


def mixed_prefix(k: int) -> str:
    """Conversations of the mixed run at the k-th LLM latency."""
    return f"mix{k}"


def sizing_prefix(cap: int) -> str:
    """Conversations made due for the sizing run at MEMORY_MAX_CONCURRENT_SUMMARIES=cap."""
    return f"size{cap}"


def sizing_backlog(scale: Scale, cap: int) -> int:
    """Due conversations for a sizing run: more than ``cap`` slots at the LLM's latency can
    finish in the run (with a margin), so the backlog never runs dry while it is measured."""
    seconds = scale.sizing_warmup_seconds + scale.sizing_seconds + 2.0
    return int(cap * seconds / max(scale.sizing_llm_latency, 0.01) * 1.2) + 2 * cap
