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
    # 3: mixed traffic
    mixed_conversations: int
    mixed_clients: int
    mixed_rounds: int
    mixed_llm_latency: float
    # 5: tokens
    token_rounds: int
    # waiting for background summaries to finish after a load run
    drain_timeout_seconds: float


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
        mixed_llm_latency=0.05,
        token_rounds=24,
        drain_timeout_seconds=60.0,
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
        mixed_llm_latency=1.0,
        token_rounds=300,
        drain_timeout_seconds=900.0,
    ),
}
