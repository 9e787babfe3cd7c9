"""The consistency rules of an import document (app.memory.transfer), over random agent
transcripts: every transcript the append path accepts is accepted, with the same boundaries and
running token totals the append statement stores; breaking its order or pairing is refused."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import Invalid
from app.memory.transfer import plan_import, renumber
from tests.unit.test_tool_exchanges import store, transcripts


@dataclass(frozen=True)
class Call:
    id: str


@dataclass(frozen=True)
class Entry:
    sequence: int
    round: int
    role: str
    tokens: int
    tool_call_id: str | None = None
    tool_calls: tuple[Call, ...] | None = None


@dataclass(frozen=True)
class Row:
    memory_id: int
    start_sequence: int
    end_sequence: int
    start_round: int
    end_round: int
    input_start_sequence: int
    input_tokens: int
    status: str = "completed"
    base_memory_id: int | None = None
    text: str = "A summary."


def entries_of(rounds: list[list[tuple[tuple[str, ...], str | None]]]) -> list[Entry]:
    return [
        Entry(
            sequence=s.sequence,
            round=s.round,
            role="tool" if s.answers else "assistant" if s.calls else "user",
            tokens=1 + s.sequence % 7,
            tool_call_id=s.answers,
            tool_calls=tuple(Call(c) for c in s.calls) or None,
        )
        for s in store(rounds)
    ]


def problem(entries: list[Entry], rows: list[Row] | None = None) -> list[str | int]:
    with pytest.raises(Invalid) as caught:
        plan_import(entries, rows or [])
    return caught.value.loc


@settings(max_examples=150, deadline=None)
@given(transcripts())
def test_what_the_append_path_stores_is_accepted_as_it_stored_it(
    rounds: list[list[tuple[tuple[str, ...], str | None]]],
) -> None:
    entries = entries_of(rounds)
    plan = plan_import(entries, [])
    assert plan.boundaries == [s.boundary for s in store(rounds)]
    assert plan.tokens_before == [sum(e.tokens for e in entries[:i]) for i in range(len(entries))]
    assert plan.next_sequence == len(entries) and plan.next_round == len(rounds)
    assert plan.next_tokens == sum(e.tokens for e in entries)
    assert len(plan.calls) == sum(len(e.tool_calls or ()) for e in entries)
    assert plan.open_tool_calls == len(plan.calls) - len(plan.results)


@settings(max_examples=150, deadline=None)
@given(transcripts(), st.data())
def test_moving_a_tool_result_or_reusing_a_call_id_is_refused(
    rounds: list[list[tuple[tuple[str, ...], str | None]]], data: st.DataObject
) -> None:
    entries = entries_of(rounds)
    results = [i for i, e in enumerate(entries) if e.tool_call_id is not None]
    calls = [i for i, e in enumerate(entries) if e.tool_calls]
    if results:
        # A result moved before its call (or to the very start) answers nothing waiting.
        index = data.draw(st.sampled_from(results))
        call = next(
            i for i in calls if any(c.id == entries[index].tool_call_id for c in entries[i].tool_calls or ())
        )
        moved = [*entries[:call], entries[index], *entries[call:index], *entries[index + 1 :]]
        moved = [replace(e, sequence=i) for i, e in enumerate(moved)]
        assert problem(moved)[:3] == ["body", "entries", call]
    if len(calls) >= 2:
        first, later = calls[0], data.draw(st.sampled_from(calls[1:]))
        reused = (Call(entries[first].tool_calls[0].id), *(entries[later].tool_calls or ())[1:])  # type: ignore[index]
        broken = [replace(e, tool_calls=reused) if i == later else e for i, e in enumerate(entries)]
        assert problem(broken) == ["body", "entries", later, "tool_calls", 0, "id"]


def simple(count: int) -> list[Entry]:
    """``count`` one-message rounds."""
    return [Entry(sequence=i, round=i, role="user", tokens=10) for i in range(count)]


def test_memory_rows_must_fit_the_entries() -> None:
    entries = simple(6)
    good = Row(1, 0, 2, 0, 2, 0, 30)
    assert plan_import(entries, [good]).kept_memories == [0]
    assert problem(entries, [replace(good, end_sequence=6, end_round=6)])[:3] == ["body", "memories", 0]
    assert problem(entries, [replace(good, end_round=1)]) == ["body", "memories", 0, "start_round"]
    assert problem(entries, [replace(good, input_tokens=29)]) == ["body", "memories", 0, "input_tokens"]
    assert problem(entries, [replace(good, input_start_sequence=3)])[:3] == ["body", "memories", 0]
    built = Row(2, 0, 4, 0, 4, 3, 50, base_memory_id=1)
    assert plan_import(entries, [good, built]).kept_memories == [0, 1]
    assert problem(entries, [good, replace(built, base_memory_id=7)]) == [
        "body",
        "memories",
        1,
        "base_memory_id",
    ]
    assert problem(entries, [good, replace(built, base_memory_id=2)]) == [
        "body",
        "memories",
        1,
        "base_memory_id",
    ]
    assert problem(entries, [built, good])[:3] == ["body", "memories", 0]  # not in id order
    assert problem(entries, [good, good]) == ["body", "memories", 1, "memory_id"]


def test_processing_rows_are_dropped_and_cannot_be_a_base() -> None:
    entries = simple(6)
    running = Row(1, 0, 2, 0, 2, 0, 30, status="processing", text="")
    plan = plan_import(entries, [running])
    assert (plan.kept_memories, plan.dropped_processing) == ([], 1)
    built = Row(2, 0, 4, 0, 4, 3, 50, base_memory_id=1)
    assert problem(entries, [running, built]) == ["body", "memories", 1, "base_memory_id"]
    assert problem(entries, [replace(running, status="completed")]) == ["body", "memories", 0, "text"]


def test_a_round_spanning_entries_is_covered_whole() -> None:
    entries = [Entry(sequence=i, round=i // 2, role="user", tokens=1) for i in range(6)]
    assert plan_import(entries, [Row(1, 0, 3, 0, 1, 0, 4)]).kept_memories == [0]
    assert problem(entries, [Row(1, 0, 2, 0, 1, 0, 3)]) == ["body", "memories", 0, "start_round"]
    assert problem(entries, [Row(1, 1, 3, 0, 1, 1, 3)]) == ["body", "memories", 0, "start_round"]


def test_empty_documents_and_renumbering() -> None:
    plan = plan_import([], [])
    assert (plan.next_sequence, plan.next_round, plan.next_tokens) == (0, 0, 0)
    assert renumber([3, 9, 12], [105, 103, 104]) == {3: 103, 9: 104, 12: 105}
