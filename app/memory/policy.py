"""Memory policies: pure decisions about when to summarize and over which window.

The service asks a policy one question after each round ("given what was just saved and the
memory we have, should a summary start, and over which range?") and never branches on which
policy it holds, so new policies plug in by implementing :class:`MemoryPolicy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class SummaryPlan:
    """A summary to start: the window [start_sequence, end_sequence] and the memory it builds on."""

    start_sequence: int
    end_sequence: int
    base_memory_id: int | None


@dataclass(frozen=True, slots=True)
class MemoryRef:
    """The fields of a completed memory a policy needs."""

    memory_id: int
    start_sequence: int
    end_sequence: int


class MemoryPolicy(Protocol):
    """Decides whether a round's end starts a summary, and over which range."""

    def plan(self, *, last_saved_seq: int, latest_completed: MemoryRef | None) -> SummaryPlan | None:
        """Return the summary to start, or None. The 'already processing' check is not here:
        the database enforces it when the service inserts the row."""
        ...


def should_trigger_summary(last_saved_seq: int, summarize_after_seq: int) -> bool:
    """Seed 004's trigger condition, minus the processing check (done by the database)."""
    return last_saved_seq >= summarize_after_seq


def calculate_summary_range(last_saved_seq: int, window_size: int) -> tuple[int, int]:
    """Seed 004's sliding window: the last ``window_size`` messages ending at ``last_saved_seq``,
    with an even start so a user/assistant pair is never split."""
    end_seq = last_saved_seq
    start_seq = max(0, end_seq - window_size + 1)
    if start_seq % 2 != 0:
        start_seq += 1
    return (start_seq, end_seq)


@dataclass(frozen=True, slots=True)
class SlidingWindowPolicy:
    """Seeds 004/002: after each round from ``summarize_after_seq`` on, summarize the last
    ``window_size`` messages incrementally from the latest completed memory."""

    window_size: int = 14
    summarize_after_seq: int = 5

    def __post_init__(self) -> None:
        if self.window_size < 2:
            raise ValueError("window_size must be at least 2 (one user/assistant pair)")
        if self.summarize_after_seq < 0:
            raise ValueError("summarize_after_seq must be >= 0")

    def plan(self, *, last_saved_seq: int, latest_completed: MemoryRef | None) -> SummaryPlan | None:
        if not should_trigger_summary(last_saved_seq, self.summarize_after_seq):
            return None
        if latest_completed is not None and latest_completed.end_sequence >= last_saved_seq:
            return None  # nothing new since the latest summary
        start, end = calculate_summary_range(last_saved_seq, self.window_size)
        base = latest_completed.memory_id if latest_completed is not None else None
        return SummaryPlan(start_sequence=start, end_sequence=end, base_memory_id=base)
