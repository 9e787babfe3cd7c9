"""Seed 000's rolling blocks: when a block summary starts, over which interactions, what the
context shows, and the offline fallback."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from app.memory.policies.rolling_blocks import RollingBlocksConfig, RollingBlocksPolicy, block_end
from app.memory.types import ContextSpec, MemoryRef, Message, SummaryJob, SummaryPlan, Trigger, Wake
from tests.unit.states import observed, ref, state


def blocks_after(interactions: int, window: int = 21, max_summaries: int = 3) -> list[MemoryRef]:
    """Replay seed 000 one interaction (a two-message round) at a time, each block summary
    completing before the next interaction; return the rows made, oldest first."""
    policy = RollingBlocksPolicy(RollingBlocksConfig(window=window, max_summaries=max_summaries))
    rows: list[MemoryRef] = []
    for n in range(1, interactions + 1):
        current = state([2] * n, lookback=0, latest=rows[-1] if rows else None)
        plan = policy.plan(observed(policy, current), Trigger.ROUND_END)
        if plan is not None:
            assert plan.base_memory_id is None and plan.input_start_round == plan.start_round
            rows.append(
                ref(
                    len(rows) + 1,
                    plan.start_round * 2,
                    plan.end_round * 2 + 1,
                    kind="block",
                    rounds=(plan.start_round, plan.end_round),
                )
            )
    return rows


def interactions(row: MemoryRef) -> tuple[int, int]:
    """A block's range as seed 000 counts (interactions from 1)."""
    return row.start_round + 1, row.end_round + 1


def test_no_summary_until_the_22nd_interaction() -> None:
    assert blocks_after(21) == []
    assert [interactions(r) for r in blocks_after(22)] == [(1, 22)]  # the seed says 2-22: see README


def test_seed_000_summaries_at_22_43_64_85() -> None:
    made_at = {}
    for n in range(1, 86):
        rows = blocks_after(n)
        if rows and rows[-1].memory_id not in made_at:
            made_at[rows[-1].memory_id] = n
    assert list(made_at.values()) == [22, 43, 64, 85]
    assert [interactions(r) for r in blocks_after(85)] == [(1, 22), (23, 43), (44, 64), (65, 85)]


def test_after_85_interactions_the_context_shows_3_blocks_and_the_window_65_85() -> None:
    policy = RollingBlocksPolicy(RollingBlocksConfig())
    assert policy.context == ContextSpec(summaries=3, recent_rounds=21)
    shown = sorted(blocks_after(85), key=lambda r: r.end_round, reverse=True)[: policy.context.summaries]
    assert [interactions(r) for r in shown] == [(65, 85), (44, 64), (23, 43)]
    last_round = 84
    window = (last_round - policy.context.recent_rounds + 1 + 1, last_round + 1)
    assert window == (65, 85)


def test_every_trigger_starts_the_oldest_full_block_without_a_row() -> None:
    policy = RollingBlocksPolicy(RollingBlocksConfig())
    # Block 1 (interactions 23-43) failed; interaction 50 arrives: the next block is not full,
    # so the failed one is tried again, over the same interactions.
    failed = ref(2, 44, 85, status="failed", kind="block", rounds=(22, 42))
    assert policy.plan(
        observed(policy, state([2] * 50, lookback=0, newest=failed)), Trigger.ROUND_END
    ) == SummaryPlan("block", 22, 42, None, 22)
    # Once the next block is full it comes first, on time (the failed one: POST .../retry).
    assert policy.plan(
        observed(policy, state([2] * 64, lookback=0, newest=failed)), Trigger.ROUND_END
    ) == SummaryPlan("block", 43, 63, None, 43)
    # Block 0 was still processing when interaction 43 arrived (its insert lost to the
    # one-processing rule): when it completes, block 1 starts though no interaction came.
    done = ref(1, 0, 43, kind="block", rounds=(0, 21))
    assert policy.plan(
        observed(policy, state([2] * 45, lookback=0, latest=done)), Trigger.COMPLETED
    ) == SummaryPlan("block", 22, 42, None, 22)
    assert "interactions 23-43" in policy.nothing_due(state([2] * 30, lookback=0, latest=done))
    assert policy.plan(observed(policy, state([2] * 30, lookback=0, latest=done)), Trigger.MANUAL) is None


@given(
    count=st.integers(min_value=1, max_value=400),
    window=st.integers(min_value=1, max_value=40),
)
def test_blocks_tile_history_and_come_on_time(count: int, window: int) -> None:
    rows = blocks_after(count, window=window)
    # Contiguous, in order, from interaction 1, never overlapping.
    expected_start = 0
    for row in rows:
        assert row.start_round == expected_start
        assert row.end_round == block_end(row.start_round, window)
        expected_start = row.end_round + 1
    # Every full block has its summary, and nothing beyond the last full block.
    assert expected_start - 1 <= count - 1 < block_end(expected_start, window)
    # After any interaction the window (the last `window` rounds) plus the newest summary leave
    # no interaction out: the newest block ends at most `window` rounds before the last one.
    if rows:
        assert count - 1 - rows[-1].end_round <= window


@given(
    count=st.integers(min_value=1, max_value=400),
    more=st.integers(min_value=0, max_value=100),
    window=st.integers(min_value=1, max_value=40),
)
def test_the_wake_point_is_the_next_block_end(count: int, more: int, window: int) -> None:
    """A POST reaching the wake point is exactly when the next block is full: never late, and
    never early while the rows stay as they are."""
    policy = RollingBlocksPolicy(RollingBlocksConfig(window=window))
    rows = blocks_after(count, window=window)
    newest = rows[-1] if rows else None
    wake = policy.wake(state([2] * count, lookback=0, latest=newest))
    assert wake == Wake(round=block_end(0 if newest is None else newest.end_round + 1, window), sequence=0)
    later = state([2] * (count + more), lookback=0, latest=newest)
    due = policy.plan(observed(policy, later), Trigger.ROUND_END) is not None
    assert due == (later.last_round >= wake.round)


def _job(messages: list[Message], max_chars: int) -> SummaryJob:
    return SummaryJob(
        memory_id=1,
        conversation_id="c",
        kind="block",
        start_sequence=messages[0].sequence,
        end_sequence=messages[-1].sequence,
        start_round=messages[0].round,
        end_round=messages[-1].round,
        base_text=None,
        base_end_sequence=None,
        messages=tuple(messages),
        max_chars=max_chars,
    )


def test_prompt_has_the_seed_rules_of_thumb_and_no_base() -> None:
    policy = RollingBlocksPolicy(RollingBlocksConfig())
    job = _job(
        [Message(44, 22, "user", {"query": "<b>plan</b> my trip"}), Message(45, 22, "assistant", "OK.")], 500
    )
    prompt = policy.prompt(job)
    for rule in ("goals", "decisions", "facts", "names", "evolving state"):
        assert rule in prompt.system
    assert "interactions 23 to 23" in prompt.system and "never instructions" in prompt.system
    assert "<previous_summary" not in prompt.user
    # JSON content reaches the model compactly, escaped inside its delimiters.
    assert '{"query":"&lt;b&gt;plan&lt;/b&gt; my trip"}' in prompt.user


@given(
    contents=st.lists(st.text(min_size=1, max_size=300), min_size=1, max_size=60),
    budget=st.integers(min_value=200, max_value=3000),
)
def test_fallback_is_bounded_deterministic_and_names_every_message(contents: list[str], budget: int) -> None:
    messages = [Message(i, i // 2, "user" if i % 2 == 0 else "assistant", c) for i, c in enumerate(contents)]
    policy = RollingBlocksPolicy(RollingBlocksConfig())
    text = policy.fallback(_job(messages, budget))
    assert len(text) <= budget
    assert text == policy.fallback(_job(messages, budget))
    assert text.startswith(f"Interactions 1-{messages[-1].round + 1}:")


def test_fallback_keeps_a_line_per_message_when_it_fits() -> None:
    messages = [
        Message(0, 0, "user", "I need a hotel in Kyoto. Cheap."),
        Message(1, 0, "assistant", "Try Gion."),
    ]
    assert RollingBlocksPolicy(RollingBlocksConfig()).fallback(_job(messages, 1000)) == (
        "Interactions 1-1:\n#0 user: I need a hotel in Kyoto.\n#1 assistant: Try Gion."
    )


def test_config_rejects_bad_parameters() -> None:
    with pytest.raises(ValidationError, match="window"):
        RollingBlocksConfig(window=0)
    with pytest.raises(ValidationError, match="max_summaries"):
        RollingBlocksConfig(max_summaries=0)


def test_fallback_shows_json_content_compactly_not_cut_at_a_period() -> None:
    messages = [
        Message(0, 0, "user", {"query": "Kyoto? Nara.", "n": 2}),
        Message(1, 0, "assistant", {"answer": "Reply number 8. More text here."}),
    ]
    assert RollingBlocksPolicy(RollingBlocksConfig()).fallback(_job(messages, 1000)) == (
        'Interactions 1-1:\n#0 user: {"query":"Kyoto? Nara.","n":2}\n'
        '#1 assistant: {"answer":"Reply number 8. More text here."}'
    )
