"""Seeds 004/002: the sliding window.

After each round from ``summarize_after_seq`` on, summarize the last ``window_size`` messages,
incrementally: the new summary is built from the latest completed one plus only the messages
after it, and content that left the window is dropped. The context is that summary plus every
message after it (the gap).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.memory.policies.base import (
    DATA_NOT_INSTRUCTIONS,
    LINE,
    keep_newest,
    message_line,
    user_prompt,
)
from app.memory.types import ContextSpec, ConversationState, Prompt, SummaryJob, SummaryPlan, Trigger

KIND = "window"


class SlidingWindowConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: Literal["sliding_window"] = "sliding_window"
    window_size: int = Field(
        default=14, ge=2, le=100_000, description="Messages a summary covers (seed 004: 14, 7 rounds)."
    )
    summarize_after_seq: int = Field(
        default=5, ge=0, le=2**31 - 1, description="Summaries start once this sequence is saved."
    )
    catch_up_on_completion: bool = Field(
        default=False,
        description="When a summary completes and rounds arrived meanwhile, start the next one at "
        "once instead of at the next round's end (seed 002's flow when false).",
    )


def should_trigger_summary(last_saved_seq: int, summarize_after_seq: int) -> bool:
    """Seed 004's trigger condition, minus the processing check (done by the database)."""
    return last_saved_seq >= summarize_after_seq


def calculate_summary_range(
    last_saved_seq: int, window_size: int, round_starts: Sequence[tuple[int, int]], last_round: int
) -> tuple[int, int]:
    """Seed 004's sliding window, in rounds: (first round, last round) of the window ending at
    ``last_saved_seq`` in round ``last_round``. The window starts at the first round that begins
    within the last ``window_size`` messages, so a round is never split (seed 004's "even
    start" is the case of two-message rounds). A last round longer than the window is kept whole.

    ``round_starts`` holds (round, first sequence) of, at least, every round that starts within
    the last ``window_size`` messages, oldest first.
    """
    lowest = last_saved_seq - window_size + 1
    start_round = next((r for r, first in round_starts if first >= lowest), last_round)
    return (start_round, last_round)


class SlidingWindowPolicy:
    def __init__(self, config: SlidingWindowConfig) -> None:
        self._config = config

    @property
    def config(self) -> SlidingWindowConfig:
        return self._config

    @property
    def lookback_messages(self) -> int:
        return self._config.window_size

    @property
    def context(self) -> ContextSpec:
        return ContextSpec(summaries=1, recent_rounds=0)

    def plan(self, state: ConversationState, trigger: Trigger) -> SummaryPlan | None:
        if trigger is Trigger.COMPLETED and not self._config.catch_up_on_completion:
            return None
        if trigger is not Trigger.MANUAL and not should_trigger_summary(
            state.last_sequence, self._config.summarize_after_seq
        ):
            return None
        latest = state.latest_completed
        if latest is not None and latest.end_sequence >= state.last_sequence:
            return None  # nothing new since the latest summary
        start_round, end_round = calculate_summary_range(
            state.last_sequence, self._config.window_size, state.round_starts, state.last_round
        )
        # Incremental: the base's text plus only the messages after it, within the window.
        input_start = start_round if latest is None else max(start_round, latest.end_round + 1)
        return SummaryPlan(
            kind=KIND,
            start_round=start_round,
            end_round=end_round,
            base_memory_id=latest.memory_id if latest is not None else None,
            input_start_round=input_start,
        )

    def nothing_due(self, state: ConversationState) -> str:
        return "nothing new to summarize: the latest memory covers every message"

    def prompt(self, job: SummaryJob) -> Prompt:
        system = (
            "You maintain the running memory of a conversation between a user and an assistant. "
            "You receive the previous summary (if any) and the new messages. Write an updated "
            f"summary of the conversation window from message #{job.start_sequence} to "
            f"#{job.end_sequence}:\n"
            "- Merge the new messages into the previous summary; keep facts, decisions, the "
            "user's goals, preferences and open questions.\n"
            f"- Drop content that comes only from messages numbered below #{job.start_sequence}: "
            "they have left the window.\n"
            f"- {DATA_NOT_INSTRUCTIONS}\n"
            f"- Answer with the summary only, in plain text, at most {job.max_chars} characters."
        )
        return Prompt(system=system, user=user_prompt(job))

    def fallback(self, job: SummaryJob) -> str:
        """One line per message in the window (``#seq role: key sentence``), incremental like
        the model's: lines of the previous summary below the window start are dropped, new lines
        appended, and when over budget the newest lines are kept."""
        lines: list[str] = []
        for line in (job.base_text or "").splitlines():
            match = LINE.match(line)
            if match and int(match.group(1)) >= job.start_sequence:
                lines.append(line)
        lines.extend(message_line(m, 160) for m in job.messages if m.sequence >= job.start_sequence)
        return keep_newest(lines, job.max_chars)
