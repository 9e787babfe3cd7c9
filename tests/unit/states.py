"""Building ConversationState values for policy tests: conversations of fixed-size rounds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from app.memory.policies import MemoryPolicy
from app.memory.types import ConversationState, MemoryRef


def round_starts(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """(round, first sequence) of every round, given each round's message count."""
    starts, sequence = [], 0
    for number, size in enumerate(sizes):
        starts.append((number, sequence))
        sequence += size
    return starts


def state(
    sizes: Sequence[int],
    *,
    lookback: int,
    latest: MemoryRef | None = None,
    newest: MemoryRef | None = None,
) -> ConversationState:
    """The state after every round of ``sizes`` was stored, with the round starts a policy of
    that lookback is given (as the repository's round_starts: those within the last ``lookback``
    messages and the last one before them)."""
    last_sequence = sum(sizes) - 1
    lowest = last_sequence - lookback + 1
    starts = round_starts(sizes)
    floor = max((s for _, s in starts if s <= lowest), default=0)
    return ConversationState(
        last_sequence=last_sequence,
        last_round=len(sizes) - 1,
        latest_completed=latest,
        newest=newest if newest is not None else latest,
        round_starts=tuple((r, s) for r, s in starts if lookback and s >= floor),
    )


def ref(
    memory_id: int,
    start: int,
    end: int,
    *,
    status: str = "completed",
    kind: str = "window",
    rounds: tuple[int, int] | None = None,
) -> MemoryRef:
    """A memory row; with two-message rounds its rounds follow from its sequences."""
    start_round, end_round = rounds if rounds is not None else (start // 2, end // 2)
    return MemoryRef(
        memory_id=memory_id,
        kind=kind,
        status=status,
        start_sequence=start,
        end_sequence=end,
        start_round=start_round,
        end_round=end_round,
    )


def observed(policy: MemoryPolicy, current: ConversationState) -> ConversationState:
    """``current`` with what the service adds for ``policy``: the first boundary after the round
    the policy asks about (every round starts at a boundary in these transcripts of plain
    messages; the round's first sequence is taken from ``round_starts`` when listed)."""
    after = policy.boundary_after(current)
    if after is None or after + 1 > current.last_round:
        return current
    first = dict(current.round_starts).get(after + 1, -1)
    return replace(current, next_boundary=(after + 1, first))
