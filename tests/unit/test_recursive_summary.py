"""Seed 001's recursive medium-term memory: when the summary is updated, over which messages,
compaction, the final summary, the prompts, the offline fallback and the Markdown rendering."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from app.memory.policies.recursive_summary import (
    COMPACTION,
    MEDIUM_TERM,
    SECTIONS,
    RecursiveSummaryConfig,
    RecursiveSummaryPolicy,
    parse_sections,
    version_of,
)
from app.memory.types import ContextSpec, MemoryRef, Message, SummaryJob, SummaryPlan, Trigger, Wake
from tests.unit.states import ref, state

POLICY = RecursiveSummaryPolicy(RecursiveSummaryConfig())


def replay(sizes: list[int], policy: RecursiveSummaryPolicy = POLICY) -> list[tuple[int, MemoryRef]]:
    """Store rounds of ``sizes`` one at a time, each summary completing before the next round;
    return (message count when it was made, the summary row) of every summary."""
    made: list[tuple[int, MemoryRef]] = []
    for n in range(1, len(sizes) + 1):
        latest = made[-1][1] if made else None
        current = state(sizes[:n], lookback=policy.lookback_messages, latest=latest)
        plan = policy.plan(current, Trigger.ROUND_END)
        wake = policy.wake(current)
        due_by_wake = current.last_round >= wake.round and current.last_sequence >= wake.sequence
        assert plan is None or due_by_wake, "the wake point came late"
        if plan is not None:
            starts = dict(_all_starts(sizes))
            end = starts.get(plan.end_round + 1, sum(sizes)) - 1
            made.append(
                (
                    current.last_sequence + 1,
                    MemoryRef(
                        memory_id=len(made) + 1,
                        kind=plan.kind,
                        status="completed",
                        start_sequence=0,
                        end_sequence=end,
                        start_round=plan.start_round,
                        end_round=plan.end_round,
                    ),
                )
            )
            # The invariants of the reading: the raw part keeps at least short_term messages.
            assert current.last_sequence - end >= 10
    return made


def _all_starts(sizes: list[int]) -> list[tuple[int, int]]:
    starts, sequence = [], 0
    for number, size in enumerate(sizes):
        starts.append((number, sequence))
        sequence += size
    return starts


def test_seed_001_flow_at_messages_11_21_31() -> None:
    made = replay([1] * 35)
    # (count when made, messages integrated so far, 1-based as the seed counts)
    assert [(count, row.end_sequence + 1) for count, row in made] == [(11, 1), (21, 11), (31, 21)]
    # At 21 the update integrates messages 2-11; at 31, 12-21 (the seed's own steps).


def test_the_first_update_has_no_base_and_later_ones_are_incremental() -> None:
    first = POLICY.plan(state([1] * 11, lookback=10), Trigger.ROUND_END)
    assert first == SummaryPlan(
        kind=MEDIUM_TERM, start_round=0, end_round=0, base_memory_id=None, input_start_round=0
    )
    latest = ref(1, 0, 0, kind=MEDIUM_TERM, rounds=(0, 0))
    assert POLICY.plan(state([1] * 20, lookback=10, latest=latest), Trigger.ROUND_END) is None
    update = POLICY.plan(state([1] * 21, lookback=10, latest=latest), Trigger.ROUND_END)
    assert update == SummaryPlan(
        kind=MEDIUM_TERM, start_round=0, end_round=10, base_memory_id=1, input_start_round=1
    )


def test_two_message_rounds_are_never_split() -> None:
    made = replay([2] * 20)
    # Counts 12, 22, 32: the first round end past 11, 21, 31; the raw part holds 10 or more.
    assert [(count, row.end_sequence + 1) for count, row in made] == [(12, 2), (22, 12), (32, 22)]


@given(st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=60))
def test_never_fewer_than_10_raw_and_nothing_missing(sizes: list[int]) -> None:
    made = replay(sizes)
    ends = [row.end_sequence for _, row in made]
    assert ends == sorted(set(ends))  # every update integrates something new
    total = sum(sizes)
    if made:
        assert total - 1 - made[-1][1].end_sequence >= 10
    if total > 20 + max(sizes) * 2:
        assert made, "a long conversation has a summary"


def test_wake_point_is_the_count_that_makes_the_update_due() -> None:
    assert POLICY.wake(state([1] * 3, lookback=10)) == Wake(round=0, sequence=10)  # message 11
    latest = ref(1, 0, 10, kind=MEDIUM_TERM, rounds=(0, 10))
    assert POLICY.wake(state([1] * 21, lookback=10, latest=latest)) == Wake(round=0, sequence=30)  # 31


def test_context_shows_one_summary_capped() -> None:
    assert POLICY.context == ContextSpec(summaries=1, recent_rounds=0, max_summary_tokens=7000)


def test_compaction_when_the_summary_leaves_less_room_than_one_update() -> None:
    big = replace(ref(4, 0, 30, kind=MEDIUM_TERM, rounds=(0, 30)), tokens=6001)
    current = state([1] * 35, lookback=10, latest=big)
    assert POLICY.plan(current, Trigger.COMPLETED) == SummaryPlan(
        kind=COMPACTION, start_round=0, end_round=30, base_memory_id=4, input_start_round=30
    )
    assert POLICY.wake(current) == Wake(round=0, sequence=0)
    fits = replace(big, tokens=6000)
    assert POLICY.plan(state([1] * 35, lookback=10, latest=fits), Trigger.COMPLETED) is None
    # A compaction that came back too big is not compacted again (a model ignoring its target
    # would loop): the next update comes on time, and the context never shows it over the cap.
    compacted = replace(big, kind=COMPACTION)
    assert POLICY.plan(state([1] * 35, lookback=10, latest=compacted), Trigger.COMPLETED) is None


def test_an_ended_conversation_gets_a_final_summary_of_everything() -> None:
    latest = ref(1, 0, 10, kind=MEDIUM_TERM, rounds=(0, 10))
    ended = replace(state([1] * 25, lookback=10, latest=latest), ended=True)
    plan = POLICY.plan(ended, Trigger.ROUND_END)
    assert plan == SummaryPlan(
        kind=MEDIUM_TERM, start_round=0, end_round=24, base_memory_id=1, input_start_round=11
    )
    done = ref(2, 0, 24, kind=MEDIUM_TERM, rounds=(0, 24))
    assert POLICY.plan(replace(ended, latest_completed=done), Trigger.COMPLETED) is None
    assert POLICY.wake(replace(ended, latest_completed=done)).round == 2**31 - 1


def test_manual_integrates_what_left_the_window() -> None:
    latest = ref(1, 0, 0, kind=MEDIUM_TERM, rounds=(0, 0))
    plan = POLICY.plan(state([1] * 14, lookback=10, latest=latest), Trigger.MANUAL)
    assert plan is not None and plan.end_round == 3
    assert POLICY.plan(state([1] * 11, lookback=10, latest=latest), Trigger.MANUAL) is None
    assert "covers messages 1-1" in POLICY.nothing_due(state([1] * 11, lookback=10, latest=latest))


def test_config_bounds() -> None:
    with pytest.raises(ValidationError, match="target_min_tokens"):
        RecursiveSummaryConfig(target_min_tokens=900, target_max_tokens=800)
    with pytest.raises(ValidationError, match="twice"):
        RecursiveSummaryConfig(max_summary_tokens=1500)


def job(kind: str = MEDIUM_TERM, base: str | None = None, messages: tuple[Message, ...] = ()) -> SummaryJob:
    return SummaryJob(
        memory_id=1,
        conversation_id="c",
        kind=kind,
        start_sequence=0,
        end_sequence=messages[-1].sequence if messages else 10,
        start_round=0,
        end_round=messages[-1].round if messages else 10,
        base_text=base,
        base_end_sequence=None if base is None else 0,
        messages=messages,
        max_chars=100_000,
        covered_until="2026-11-23T10:00:00+00:00",
    )


MESSAGES = (
    Message(sequence=1, round=1, role="user", content="I prefer short answers. Thanks."),
    Message(sequence=2, round=1, role="assistant", content="Noted, I will keep it brief."),
    Message(sequence=3, round=2, role="user", content="I realized my stress comes from work."),
    Message(sequence=4, round=3, role="user", content="My sister visits next week."),
)


def test_prompts_are_the_seeds() -> None:
    initial = POLICY.prompt(job(messages=MESSAGES))
    assert initial.system.startswith("Create an initial medium-term memory summary focusing on USER content")
    assert "Messages to analyze (1-5)" in initial.system and "Target: 500-1000 tokens" in initial.system
    assert "*Updated: 2026-11-23T10:00:00+00:00 | Version: 1*" in initial.system
    update = POLICY.prompt(
        job(base="# Medium-Term Memory\n\n---\n*Updated: x | Version: 2*", messages=MESSAGES)
    )
    assert update.system.startswith("Update the existing medium-term memory by integrating new user content")
    assert "messages 2 to 5" in update.system and "Version: 3*" in update.system
    assert "<previous_summary" in update.user and '<message seq="3"' in update.user
    compaction = POLICY.prompt(job(kind=COMPACTION, base="long summary"))
    assert "Consolidate and compress" in compaction.system and "long summary" in compaction.user


def test_fallback_keeps_the_seed_sections_and_counts_versions() -> None:
    first = POLICY.fallback(job(messages=MESSAGES))
    assert [line[3:] for line in first.splitlines() if line.startswith("## ")] == list(SECTIONS)
    sections = parse_sections(first)
    assert sections["Preferences & Patterns"] == ["I prefer short answers. (message 2)"]
    assert sections["User's Journey & Insights"] == ["I realized my stress comes from work. (message 4)"]
    assert sections["Current Situation & Context"] == ["My sister visits next week. (message 5)"]
    assert "Noted" not in first  # user-focused: the assistant's words are left out
    assert version_of(first) == 1
    later = (
        Message(sequence=5, round=4, role="user", content="I am working on a daily meditation practice."),
    )
    second = POLICY.fallback(job(base=first, messages=later))
    assert version_of(second) == 2
    assert parse_sections(second)["Ongoing Work & Interests"] == [
        "I am working on a daily meditation practice. (message 6)"
    ]
    assert parse_sections(second)["Preferences & Patterns"] == sections["Preferences & Patterns"]


def test_fallback_compaction_fits_the_target() -> None:
    many = tuple(
        Message(sequence=i, round=i, role="user", content=f"Fact number {i} about my life.")
        for i in range(600)
    )
    grown = POLICY.fallback(job(messages=many))
    assert len(grown) > 3000 * 3
    small = POLICY.fallback(job(kind=COMPACTION, base=grown))
    assert len(small) <= 1000 * 3
    assert [line[3:] for line in small.splitlines() if line.startswith("## ")] == list(SECTIONS)
    assert "Fact number 599" in small  # the newest points stay
    assert version_of(small) == version_of(grown) + 1


def test_markdown_is_the_seeds_current_conversation_context() -> None:
    context = {
        "summaries": [{"text": "# Medium-Term Memory\n..."}],
        "messages": [
            {"sequence": 25, "round": 25, "role": "user", "content": "Hello again"},
            {"sequence": 26, "round": 25, "role": "assistant", "content": "Welcome back"},
        ],
        "truncated": False,
    }
    assert POLICY.render_markdown(context) == (
        "# Current Conversation Context\n\n"
        "## Medium-Term Memory (User Context from Earlier)\n\n# Medium-Term Memory\n...\n\n"
        "## Short-Term Memory (Recent Messages)\n\n"
        "- Message 26 (User): Hello again\n- Message 27 (Assistant): Welcome back"
    )
