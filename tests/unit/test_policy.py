"""Seed 004's pure algorithms: trigger, sliding window, gap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.memory.policy import (
    MemoryRef,
    SlidingWindowPolicy,
    SummaryPlan,
    calculate_summary_range,
    should_trigger_summary,
)


@pytest.mark.parametrize(
    ("last_saved_seq", "expected", "messages_in_window"),
    [(5, (0, 5), 6), (13, (0, 13), 14), (15, (2, 15), 14), (19, (6, 19), 14)],
)
def test_seed_004_window_examples(
    last_saved_seq: int, expected: tuple[int, int], messages_in_window: int
) -> None:
    start, end = calculate_summary_range(last_saved_seq, 14)
    assert (start, end) == expected
    assert end - start + 1 == messages_in_window


def test_odd_start_is_moved_up_to_keep_pairs() -> None:
    # 16 - 14 + 1 = 3 would split round 2 (seq 2-3); the window starts at 4 instead.
    assert calculate_summary_range(16, 14) == (4, 16)


@pytest.mark.parametrize(("seq", "fires"), [(0, False), (3, False), (4, False), (5, True), (99, True)])
def test_trigger_threshold(seq: int, fires: bool) -> None:
    assert should_trigger_summary(seq, 5) is fires


@given(last=st.integers(min_value=0, max_value=10**7), window=st.integers(min_value=2, max_value=10**4))
def test_window_properties(last: int, window: int) -> None:
    start, end = calculate_summary_range(last, window)
    assert end == last  # ends at the last saved sequence
    assert start % 2 == 0  # never splits a user/assistant pair
    assert 0 <= start <= end
    assert end - start + 1 <= window  # never exceeds its size
    # and is as large as it can be: one more pair would overflow (or it starts at 0)
    assert start == 0 or end - (start - 2) + 1 > window


@given(
    last=st.integers(min_value=0, max_value=10**6),
    window=st.integers(min_value=2, max_value=200),
    after=st.integers(min_value=0, max_value=50),
    latest_end=st.none() | st.integers(min_value=0, max_value=10**6),
)
def test_plan_properties(last: int, window: int, after: int, latest_end: int | None) -> None:
    policy = SlidingWindowPolicy(window_size=window, summarize_after_seq=after)
    latest = None if latest_end is None else MemoryRef(memory_id=7, start_sequence=0, end_sequence=latest_end)
    plan = policy.plan(last_saved_seq=last, latest_completed=latest)
    if last < after or (latest_end is not None and latest_end >= last):
        assert plan is None
        return
    assert plan == SummaryPlan(*calculate_summary_range(last, window), None if latest is None else 7)


def test_plan_builds_on_latest_completed() -> None:
    policy = SlidingWindowPolicy()
    assert policy.plan(last_saved_seq=4, latest_completed=None) is None
    assert policy.plan(last_saved_seq=5, latest_completed=None) == SummaryPlan(0, 5, None)
    latest = MemoryRef(memory_id=3, start_sequence=0, end_sequence=11)
    assert policy.plan(last_saved_seq=15, latest_completed=latest) == SummaryPlan(2, 15, 3)
    assert policy.plan(last_saved_seq=11, latest_completed=latest) is None


def test_policy_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="window_size"):
        SlidingWindowPolicy(window_size=1)
    with pytest.raises(ValueError, match="summarize_after_seq"):
        SlidingWindowPolicy(summarize_after_seq=-1)
