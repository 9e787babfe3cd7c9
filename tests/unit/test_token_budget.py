"""Seed 003's token-budget memory: when compressions start, over which entries, folding of
summaries, the heuristic fallback, and a context that stays within its budget forever."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from app.memory.policies.token_budget import COMPRESSION, FOLD, TokenBudgetConfig, TokenBudgetPolicy
from app.memory.types import ConversationState, MemoryRef, Message, SummaryJob, SummaryPlan, Trigger


def conversation(
    tokens: list[int], rows: list[MemoryRef], round_sizes: list[int] | None = None, lookback: int = 11
) -> ConversationState:
    """A conversation whose messages have these token counts (rounds of ``round_sizes``, one
    message each by default), with these completed summaries (oldest first)."""
    sizes = round_sizes or [1] * len(tokens)
    starts, first = [], 0
    for number, size in enumerate(sizes):
        starts.append((number, first))
        first += size
    last = len(tokens) - 1
    floor = max((s for _, s in starts if s <= last - lookback + 1), default=0)
    latest = rows[-1] if rows else None
    shown: list[MemoryRef] = []
    for row in reversed(rows):  # the chain: newest first, each ending before the next starts
        if not shown or row.end_sequence < shown[-1].start_sequence:
            shown.append(row)
    return ConversationState(
        last_sequence=last,
        last_round=len(sizes) - 1,
        latest_completed=latest,
        newest=latest,
        round_starts=tuple(s for s in starts if s[1] >= floor),
        total_tokens=sum(tokens),
        covered_tokens=0 if latest is None else sum(tokens[: latest.end_sequence + 1]),
        shown=tuple(shown),
    )


def row(memory_id: int, start: int, end: int, tokens: int, kind: str = COMPRESSION) -> MemoryRef:
    return MemoryRef(memory_id, kind, "completed", start, end, start, end, tokens)


def test_the_seed_defaults() -> None:
    config = TokenBudgetConfig()
    assert (config.max_tokens, config.max_entries, config.recent_window) == (50_000, 100, 10)
    assert (config.min_entries_to_compress, config.compression_ratio, config.auto_compress) == (5, 0.3, True)


def test_compression_starts_past_the_entry_budget_and_keeps_the_recent_window() -> None:
    policy = TokenBudgetPolicy(TokenBudgetConfig())
    assert policy.plan(conversation([10] * 100, []), Trigger.ROUND_END) is None  # 100: not past
    plan = policy.plan(conversation([10] * 101, []), Trigger.ROUND_END)
    assert plan == SummaryPlan(COMPRESSION, 0, 90, None, 0)  # all but the last 10 entries
    # Then the next compression starts after it, once the active entries pass 100 again.
    done = [row(1, 0, 90, 300)]
    assert policy.plan(conversation([10] * 191, done), Trigger.ROUND_END) is None
    assert policy.plan(conversation([10] * 192, done), Trigger.ROUND_END) == SummaryPlan(
        COMPRESSION, 91, 181, None, 91
    )


def test_compression_starts_past_the_token_budget() -> None:
    policy = TokenBudgetPolicy(TokenBudgetConfig(max_tokens=1000))
    assert policy.plan(conversation([100] * 10, []), Trigger.ROUND_END) is None
    assert policy.plan(conversation([100] * 11, []), Trigger.ROUND_END) is None  # only 1 eligible
    plan = policy.plan(conversation([200] * 15, []), Trigger.ROUND_END)
    assert plan == SummaryPlan(COMPRESSION, 0, 4, None, 0)  # 5 = min_entries_to_compress


def test_whole_rounds_only_and_manual_requests() -> None:
    policy = TokenBudgetPolicy(TokenBudgetConfig(max_entries=10, recent_window=4, min_entries_to_compress=2))
    # Rounds of 3 messages: the cut moves back to a round start, keeping at least 4 recent.
    plan = policy.plan(conversation([10] * 12, [], round_sizes=[3, 3, 3, 3]), Trigger.ROUND_END)
    assert plan == SummaryPlan(COMPRESSION, 0, 1, None, 0)  # entries 0-5; 6-11 stay
    # On request, whatever the budget, if enough is eligible.
    assert policy.plan(conversation([10] * 6, []), Trigger.MANUAL) == SummaryPlan(COMPRESSION, 0, 1, None, 0)
    assert policy.plan(conversation([10] * 5, []), Trigger.MANUAL) is None
    assert "nothing to compress" in policy.nothing_due(conversation([10] * 5, []))
    # auto_compress off: only on request.
    manual = TokenBudgetPolicy(TokenBudgetConfig(max_entries=10, auto_compress=False))
    assert manual.plan(conversation([10] * 50, []), Trigger.ROUND_END) is None
    assert manual.plan(conversation([10] * 50, []), Trigger.MANUAL) is not None


def test_summaries_past_their_budget_are_folded_into_one() -> None:
    policy = TokenBudgetPolicy(TokenBudgetConfig(max_tokens=1000, compression_ratio=0.3))  # budget 300
    rows = [row(1, 0, 9, 100), row(2, 10, 19, 100), row(3, 20, 29, 90)]
    assert policy.plan(conversation([10] * 35, rows), Trigger.COMPLETED) is None  # 290 <= 300
    rows.append(row(4, 30, 39, 100))
    fold = policy.plan(conversation([10] * 45, rows), Trigger.COMPLETED)
    assert fold == SummaryPlan(FOLD, 0, 29, None, 0)  # all but the newest
    assert policy.reads_summaries(FOLD) and not policy.reads_summaries(COMPRESSION)
    # The fold replaces what it covers in the chain the context shows.
    folded = [*rows, row(5, 0, 29, 120, kind=FOLD)]
    state = conversation([10] * 45, [*folded[:3], folded[4], folded[3]])
    assert [r.memory_id for r in state.shown] == [4, 5]


def test_the_seed_fallback_summary() -> None:
    messages = (
        Message(0, 0, "user", "Help me debug this API. It returns 500."),
        Message(
            1,
            0,
            "assistant",
            None,
            "tool_call",
            tool_calls=[{"function": {"name": "shell", "arguments": "{}"}}],
        ),
        Message(2, 0, "tool", "Error: connection refused", "tool_result", tool_call_id="a"),
        Message(3, 0, "assistant", "Fixed the port.", "message"),
        Message(4, 1, "user", "Thanks, that fixed it!"),
    )
    job = SummaryJob(1, "c", COMPRESSION, 0, 4, 0, 1, None, None, messages, 4000, input_tokens=80)
    assert TokenBudgetPolicy(TokenBudgetConfig()).fallback(job) == (
        "[Previous conversation summary]\n2 user messages\n"
        'First: "Help me debug this API."\nLast: "Thanks, that fixed it!"\n'
        "Tools used: shell\n1 errors encountered"
    )
    prompt = TokenBudgetPolicy(TokenBudgetConfig()).prompt(job)
    assert "Tools used and their outcomes" in prompt.system and "about 50 tokens" in prompt.system


@settings(max_examples=150, deadline=None)
@given(
    rounds=st.lists(
        st.lists(st.integers(min_value=5, max_value=400), min_size=1, max_size=4), min_size=1, max_size=250
    ),
    max_tokens=st.integers(min_value=500, max_value=5000),
    max_entries=st.integers(min_value=5, max_value=60),
    recent=st.integers(min_value=0, max_value=12),
)
def test_the_context_stays_within_its_budget_forever_and_wake_points_are_never_late(
    rounds: list[list[int]], max_tokens: int, max_entries: int, recent: int
) -> None:
    config = TokenBudgetConfig(
        max_tokens=max_tokens, max_entries=max_entries, recent_window=recent, min_entries_to_compress=1
    )
    policy = TokenBudgetPolicy(config)
    tokens: list[int] = []
    sizes: list[int] = []
    rows: list[MemoryRef] = []
    wake = policy.wake(conversation([0], [], [1]))
    largest_round = 4 * 400
    for round_tokens in rounds:
        tokens += round_tokens
        sizes.append(len(round_tokens))
        state = conversation(tokens, rows, sizes, lookback=recent + 1)
        if policy.plan(state, Trigger.ROUND_END) is not None:
            reached = (state.last_round >= wake.round and state.last_sequence >= wake.sequence) or (
                wake.tokens is not None and state.total_tokens >= wake.tokens
            )
            assert reached, "a due compression before its wake point"
        for trigger in (Trigger.ROUND_END, Trigger.COMPLETED, Trigger.COMPLETED, Trigger.COMPLETED):
            state = conversation(tokens, rows, sizes, lookback=recent + 1)
            plan = policy.plan(state, trigger)
            if plan is None:
                break
            first = sum(sizes[: plan.start_round])
            last = sum(sizes[: plan.end_round + 1]) - 1
            covered = (
                sum(tokens[first : last + 1])
                if plan.kind == COMPRESSION
                else sum(r.tokens for r in state.shown[1:])
            )
            made = max(50, int(covered * config.compression_ratio))
            rows.append(
                MemoryRef(
                    len(rows) + 1, plan.kind, "completed", first, last, plan.start_round, plan.end_round, made
                )
            )
        state = conversation(tokens, rows, sizes, lookback=recent + 1)
        wake = policy.wake(replace(state))
        context = sum(r.tokens for r in state.shown) + state.total_tokens - state.covered_tokens
        # Never kept raw: more than the budget, or the recent window if that is larger, and the
        # round that passed it; summaries: what folding allows. None of it grows with length.
        raw_bound = max(max_tokens, recent * 400) + largest_round
        assert context <= raw_bound + 3 * policy.summary_budget + 150, context
