"""No policy separates an assistant's tool calls from their results: over random transcripts of
tool-using agents (parallel calls, results in any order, calls answered in the next round), every
summary starts and ends at a boundary, and the context (summaries + raw part, built as the
context read builds it) never holds a result without its call, nor a call without the results
already posted."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from app.memory.policies import MemoryPolicy
from app.memory.policies.rolling_blocks import RollingBlocksConfig, RollingBlocksPolicy
from app.memory.policies.sliding_window import SlidingWindowConfig, SlidingWindowPolicy
from app.memory.types import ConversationState, MemoryRef, Trigger


@dataclass(frozen=True)
class Stored:
    sequence: int
    round: int
    calls: tuple[str, ...]  # call ids an assistant message makes
    answers: str | None  # the call id a tool message answers
    boundary: bool


@st.composite
def transcripts(draw: st.DrawFn) -> list[list[tuple[tuple[str, ...], str | None]]]:
    """Rounds of (calls, answers) messages in Chat Completions order; a round may end with its
    calls unanswered, and the next round then starts with their results."""
    rounds: list[list[tuple[tuple[str, ...], str | None]]] = []
    pending: list[str] = []
    counter = 0
    for _ in range(draw(st.integers(min_value=1, max_value=40))):
        messages: list[tuple[tuple[str, ...], str | None]] = [((), answer) for answer in pending]
        pending = []
        messages.append(((), None))  # the user's message
        for _ in range(draw(st.integers(min_value=0, max_value=2))):  # tool-calling steps
            count = draw(st.integers(min_value=1, max_value=3))
            calls = tuple(f"c{counter + i}" for i in range(count))
            counter += count
            messages.append((calls, None))
            answered = draw(st.permutations(calls))
            if draw(st.integers(min_value=0, max_value=4)) == 0:  # left for the next round
                pending = list(answered)
                break
            messages.extend(((), answer) for answer in answered)
        else:
            messages.append(((), None))  # the assistant's answer
        rounds.append(messages)
    return rounds


def store(rounds: list[list[tuple[tuple[str, ...], str | None]]]) -> list[Stored]:
    """What the append statement stores: a boundary on a round's first message when no call
    before it waits for a result."""
    stored: list[Stored] = []
    open_calls = 0
    for number, messages in enumerate(rounds):
        for index, (calls, answer) in enumerate(messages):
            stored.append(Stored(len(stored), number, calls, answer, index == 0 and open_calls == 0))
            open_calls += len(calls) - (answer is not None)
    return stored


def observe(
    policy: MemoryPolicy, stored: list[Stored], rows: list[MemoryRef], lookback: int
) -> ConversationState:
    """The state the service builds from the tables (open calls: those after the last message)."""
    last = stored[-1]
    open_calls = sum(len(m.calls) for m in stored) - sum(m.answers is not None for m in stored)
    lowest = last.sequence - lookback + 1
    floor = max((m.sequence for m in stored if m.boundary and m.sequence <= lowest), default=0)
    starts = tuple((m.round, m.sequence) for m in stored if m.boundary and m.sequence >= floor)
    state = ConversationState(
        last_sequence=last.sequence,
        last_round=last.round,
        latest_completed=rows[-1] if rows else None,
        newest=rows[-1] if rows else None,
        round_starts=starts,
        open_calls=open_calls,
    )
    after = policy.boundary_after(state)
    if after is not None:
        following = next(((m.round, m.sequence) for m in stored if m.boundary and m.round > after), None)
        state = replace(state, next_boundary=following)
    return state


def context_raw(
    stored: list[Stored], rows: list[MemoryRef], summaries: int, recent_rounds: int
) -> list[Stored]:
    """The raw part as the context read computes it (no caps)."""
    shown = rows[-summaries:]
    start = shown[-1].end_sequence + 1 if shown else 0
    if recent_rounds:
        last_round = stored[-1].round
        first = next((m.sequence for m in stored if m.round > last_round - recent_rounds), len(stored))
        boundary = max((m.sequence for m in stored if m.boundary and m.sequence <= first), default=0)
        start = min(start, boundary)
    return [m for m in stored if m.sequence >= start]


def replay(
    policy: MemoryPolicy, rounds: list[list[tuple[tuple[str, ...], str | None]]], lookback: int
) -> None:
    rows: list[MemoryRef] = []
    spec = policy.context
    for upto in range(1, len(rounds) + 1):
        stored = store(rounds[:upto])
        boundaries = {m.sequence for m in stored if m.boundary}
        for trigger in (Trigger.ROUND_END, Trigger.COMPLETED, Trigger.COMPLETED):
            state = observe(policy, stored, rows, lookback)
            plan = policy.plan(state, trigger)
            if plan is None:
                continue
            first = min(m.sequence for m in stored if m.round == plan.start_round)
            last = max(m.sequence for m in stored if m.round == plan.end_round)
            assert first in boundaries, (plan, "starts inside a tool exchange")
            assert last + 1 in boundaries or (last == stored[-1].sequence and state.open_calls == 0), (
                plan,
                "ends inside a tool exchange",
            )
            rows.append(
                MemoryRef(len(rows) + 1, "x", "completed", first, last, plan.start_round, plan.end_round)
            )
        raw = context_raw(stored, rows, spec.summaries, spec.recent_rounds)
        made = {call for m in raw for call in m.calls}
        answered = {m.answers for m in raw if m.answers is not None}
        posted = {m.answers for m in stored if m.answers is not None}
        assert answered <= made, "a tool result without its call"
        assert made & posted <= answered, "a tool call without the results already posted"


@settings(max_examples=300, deadline=None)
@given(rounds=transcripts(), window=st.integers(min_value=2, max_value=12), after=st.integers(0, 6))
def test_sliding_window_never_separates_calls_from_results(
    rounds: list[list[tuple[tuple[str, ...], str | None]]], window: int, after: int
) -> None:
    policy = SlidingWindowPolicy(SlidingWindowConfig(window_size=window, summarize_after_seq=after))
    replay(policy, rounds, lookback=window)


@settings(max_examples=300, deadline=None)
@given(rounds=transcripts(), window=st.integers(min_value=1, max_value=6))
def test_rolling_blocks_never_separate_calls_from_results(
    rounds: list[list[tuple[tuple[str, ...], str | None]]], window: int
) -> None:
    policy = RollingBlocksPolicy(RollingBlocksConfig(window=window, max_summaries=2))
    replay(policy, rounds, lookback=0)
