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
    PlainRendering,
    keep_newest,
    message_line,
    name_required,
    safe_end,
    user_prompt,
)
from app.memory.types import ContextSpec, ConversationState, Prompt, SummaryJob, SummaryPlan, Trigger, Wake

KIND = "window"


class SlidingWindowConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, json_schema_extra=name_required)

    name: Literal["sliding_window"] = "sliding_window"
    window_size: int = Field(
        default=14, ge=2, le=100_000, description="Messages a summary covers (seed 004: 14, 7 rounds)."
    )
    summarize_after_seq: int = Field(
        default=5, ge=0, le=2**31 - 1, description="Summaries start once this sequence is saved."
    )
    summarize_every: int = Field(
        default=1,
        ge=1,
        le=100_000,
        description="Rounds between summaries: 1 summarizes after every round (seed 004); more "
        "trades freshness for fewer model calls.",
    )
    catch_up_on_completion: bool = Field(
        default=True,
        description="When a summary completes and rounds arrived meanwhile, start the next one at "
        "once, covering all of them; false waits for the next round's end (seed 002's flow).",
    )


def should_trigger_summary(last_saved_seq: int, summarize_after_seq: int) -> bool:
    """Seed 004's trigger condition, minus the processing check (done by the database)."""
    return last_saved_seq >= summarize_after_seq


def calculate_summary_range(
    last_saved_seq: int, window_size: int, round_starts: Sequence[tuple[int, int]], last_round: int
) -> tuple[int, int]:
    """Seed 004's sliding window, in rounds: (first round, last round) of the window ending at
    ``last_saved_seq`` in round ``last_round``. The window starts at the first boundary (a round
    start where no tool call waits for its result) within the last ``window_size`` messages, so
    neither a round nor a tool exchange is ever split (seed 004's "even start" is the case of
    two-message rounds). When none is that recent, the window reaches back to the last boundary
    before it: a last round, or exchange, longer than the window is kept whole.

    ``round_starts`` holds (round, first sequence) of every boundary within the last
    ``window_size`` messages and of the last one before them, oldest first.
    """
    lowest = last_saved_seq - window_size + 1
    candidates = [(r, first) for r, first in round_starts if r <= last_round]
    inside = next((r for r, first in candidates if first >= lowest), None)
    if inside is not None:
        return (inside, last_round)
    before = [r for r, first in candidates if first < lowest]
    return (before[-1] if before else last_round, last_round)


class SlidingWindowPolicy(PlainRendering):
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

    def boundary_after(self, state: ConversationState) -> int | None:
        return None

    def plan(self, state: ConversationState, trigger: Trigger) -> SummaryPlan | None:
        if trigger is Trigger.COMPLETED and not self._config.catch_up_on_completion:
            return None
        end = safe_end(state)
        if end is None:
            return None  # the window would separate tool calls from their results
        end_round, end_sequence = end
        if trigger is not Trigger.MANUAL and not should_trigger_summary(
            end_sequence, self._config.summarize_after_seq
        ):
            return None
        latest = state.latest_completed
        if latest is not None and latest.end_sequence >= end_sequence:
            return None  # nothing new since the latest summary
        if (
            trigger is not Trigger.MANUAL
            and latest is not None
            and end_round - latest.end_round < self._config.summarize_every
        ):
            return None  # fewer than summarize_every rounds since the latest summary
        start_round, end_round = calculate_summary_range(
            end_sequence,
            self._config.window_size,
            [start for start in state.round_starts if start[0] <= end_round],
            end_round,
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

    def wake(self, state: ConversationState) -> Wake:
        latest = state.latest_completed
        return Wake(
            round=0 if latest is None else latest.end_round + self._config.summarize_every,
            sequence=self._config.summarize_after_seq,
        )

    def reads_summaries(self, kind: str) -> bool:
        return False

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
