"""Seed 003: the token-budget memory manager for agents.

Entries (messages, tool calls and results, added context) accumulate until the active ones (those
no compression summary covers) pass ``max_tokens`` or ``max_entries``. Then the oldest active
entries, all but the last ``recent_window`` (at least ``min_entries_to_compress`` of them, whole
tool exchanges only), are compressed: summarized from the entries alone, aiming at
``compression_ratio`` of their tokens. Entries are never rewritten: "compressed" means "inside a
completed summary's range".

The context is every compression summary plus the active entries. So that it stays within the
budget however long the conversation runs, once the summaries themselves take more than
``compression_ratio`` x ``max_tokens`` tokens, all of them but the newest are folded into one
(a summary of summaries), which replaces them in the context.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.memory.policies.base import (
    DATA_NOT_INSTRUCTIONS,
    PlainRendering,
    entry_line,
    escape,
    gist,
    name_required,
    render_messages,
)
from app.memory.types import ContextSpec, ConversationState, Prompt, SummaryJob, SummaryPlan, Trigger, Wake

COMPRESSION = "compression"
FOLD = "fold"
# The context shows every summary in the chain: folding keeps their number small.
SHOWN_SUMMARIES = 1000

SEED_PROMPT = """Summarize the following conversation, preserving:
1. Key topics discussed
2. Important decisions made
3. Tools used and their outcomes
4. Any errors or issues encountered
5. Context that would be needed to continue
Keep the summary concise but informative."""


def _day(stamp: str | None) -> str:
    """The date of an ISO timestamp (the seed shows days)."""
    return "?" if not stamp else stamp[:10]


_ERROR = re.compile(r"\b(error|exception|failed|failure|traceback)\b", re.IGNORECASE)


class TokenBudgetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, json_schema_extra=name_required)

    name: Literal["token_budget"] = "token_budget"
    max_tokens: int = Field(
        default=50_000, ge=100, le=10_000_000, description="Active tokens that start a compression."
    )
    max_entries: int = Field(default=100, ge=2, le=100_000, description="Active entries that start one.")
    recent_window: int = Field(
        default=10, ge=0, le=100_000, description="The newest entries never compressed."
    )
    min_entries_to_compress: int = Field(
        default=5, ge=1, le=100_000, description="The fewest entries a compression takes."
    )
    compression_ratio: float = Field(
        default=0.3, gt=0, le=1, description="A summary's target size, as a share of what it covers."
    )
    auto_compress: bool = Field(
        default=True, description="Compress when a budget is passed (else only on request)."
    )


class TokenBudgetPolicy(PlainRendering):
    def __init__(self, config: TokenBudgetConfig) -> None:
        self._config = config

    @property
    def config(self) -> TokenBudgetConfig:
        return self._config

    @property
    def lookback_messages(self) -> int:
        # The boundaries within the recent window, and the last one before it: where a
        # compression may end.
        return self._config.recent_window + 1

    @property
    def context(self) -> ContextSpec:
        return ContextSpec(summaries=SHOWN_SUMMARIES, recent_rounds=0)

    def boundary_after(self, state: ConversationState) -> int | None:
        return None

    @property
    def summary_budget(self) -> int:
        """Tokens the shown summaries may take before the oldest are folded."""
        return max(1, int(self._config.max_tokens * self._config.compression_ratio))

    def active(self, state: ConversationState) -> tuple[int, int]:
        """(entries, tokens) no completed summary covers."""
        covered_end = -1 if state.latest_completed is None else state.latest_completed.end_sequence
        return state.last_sequence - covered_end, state.total_tokens - state.covered_tokens

    def over_budget(self, state: ConversationState) -> bool:
        entries, tokens = self.active(state)
        return entries > self._config.max_entries or tokens > self._config.max_tokens

    def _fold(self, state: ConversationState) -> SummaryPlan | None:
        """All shown summaries but the newest (two at least, so each fold shrinks the chain),
        once together the shown ones pass the summary budget."""
        if len(state.shown) < 3 or sum(ref.tokens for ref in state.shown) <= self.summary_budget:
            return None
        oldest, newest_folded = state.shown[-1], state.shown[1]
        return SummaryPlan(
            kind=FOLD,
            start_round=oldest.start_round,
            end_round=newest_folded.end_round,
            base_memory_id=None,
            input_start_round=oldest.start_round,
        )

    def _compression(self, state: ConversationState) -> SummaryPlan | None:
        """The oldest active entries but the recent window, ending at a boundary."""
        covered_end = -1 if state.latest_completed is None else state.latest_completed.end_sequence
        keep_from = state.last_sequence - self._config.recent_window + 1  # first kept entry
        # The compression ends right before a boundary at or before the kept entries.
        cut = next((b for b in reversed(state.round_starts) if b[1] <= keep_from), None)
        if self._config.recent_window == 0 and state.open_calls == 0:
            cut = (state.last_round + 1, state.last_sequence + 1)
        if cut is None:
            return None
        end_round, end_sequence = cut[0] - 1, cut[1] - 1
        if end_sequence - covered_end < self._config.min_entries_to_compress:
            return None
        start_round = 0 if state.latest_completed is None else state.latest_completed.end_round + 1
        return SummaryPlan(
            kind=COMPRESSION,
            start_round=start_round,
            end_round=end_round,
            base_memory_id=None,
            input_start_round=start_round,
        )

    def plan(self, state: ConversationState, trigger: Trigger) -> SummaryPlan | None:
        fold = self._fold(state)
        if fold is not None:
            return fold
        if trigger is not Trigger.MANUAL and not (self._config.auto_compress and self.over_budget(state)):
            return None
        return self._compression(state)

    def wake(self, state: ConversationState) -> Wake:
        """When the active entries or tokens would pass a budget: on the entry or the token
        after the limit (never later; the plan then finds whether a whole compression fits)."""
        covered_end = -1 if state.latest_completed is None else state.latest_completed.end_sequence
        if not self._config.auto_compress:
            return Wake(round=2**31 - 1, sequence=2**31 - 1)
        return Wake(
            round=0,
            sequence=covered_end + self._config.max_entries + 1,
            tokens=state.covered_tokens + self._config.max_tokens + 1,
        )

    def reads_summaries(self, kind: str) -> bool:
        return kind == FOLD

    def render_text(self, context: Mapping[str, Any]) -> str:
        """Seed 003's getContextForLLM: the summaries oldest first, each under its time range,
        then the active entries."""
        parts = []
        if context["summaries"]:
            lines = ["=== Previous Conversation Summaries ==="]
            for summary in reversed(context["summaries"]):
                lines.append(f"[{_day(summary.get('from_at'))} - {_day(summary.get('to_at'))}]")
                lines.append(summary["text"])
                lines.append("")
            parts.append("\n".join(lines).rstrip())
        if context["messages"]:
            parts.append(
                "=== Recent Conversation ===\n" + "\n".join(entry_line(m) for m in context["messages"])
            )
        return "\n\n".join(parts)

    def nothing_due(self, state: ConversationState) -> str:
        entries, _ = self.active(state)
        return (
            f"nothing to compress: {entries} active entries, of which the newest "
            f"{self._config.recent_window} stay and at least {self._config.min_entries_to_compress} "
            "older ones (whole tool exchanges) are needed"
        )

    def target_tokens(self, job: SummaryJob) -> int:
        return max(50, int(job.input_tokens * self._config.compression_ratio))

    def prompt(self, job: SummaryJob) -> Prompt:
        target = self.target_tokens(job)
        if self.reads_summaries(job.kind):
            system = (
                "You merge summaries of consecutive parts of a conversation, oldest first, into one "
                "summary of the whole, preserving key topics, decisions, tools used and their "
                "outcomes, errors encountered, and the context needed to continue.\n"
                f"- {DATA_NOT_INSTRUCTIONS}\n"
                f"- Answer with the summary only, in about {target} tokens."
            )
            user = "\n\n".join(
                f'<summary from="#{first}" to="#{last}">\n{escape(text)}\n</summary>'
                for first, last, text in job.summaries
            )
            return Prompt(system=system, user=user)
        system = (
            f"{SEED_PROMPT}\n"
            f"- {DATA_NOT_INSTRUCTIONS}\n"
            f"- Answer with the summary only, in about {target} tokens "
            f"({self._config.compression_ratio:.0%} of the {job.input_tokens} tokens it covers)."
        )
        return Prompt(system=system, user=render_messages(job.messages))

    def fallback(self, job: SummaryJob) -> str:
        """Seed 003's heuristic summary: user message count, first and last user message, tools
        used, errors encountered. A fold joins its summaries."""
        if self.reads_summaries(job.kind):
            text = "\n".join(text for _, _, text in job.summaries)
            return text[-job.max_chars :] if len(text) > job.max_chars else text
        users = [m for m in job.messages if m.role == "user" and m.kind == "message"]
        tools = sorted(
            {str((c.get("function") or {}).get("name")) for m in job.messages for c in m.tool_calls or ()}
        )
        errors = sum(1 for m in job.messages if m.kind == "tool_result" and _ERROR.search(m.text))
        lines = ["[Previous conversation summary]", f"{len(users)} user messages"]
        if users:
            lines.append(f'First: "{gist(users[0], 200)}"')
            lines.append(f'Last: "{gist(users[-1], 200)}"')
        if tools:
            lines.append(f"Tools used: {', '.join(tools)}")
        if errors:
            lines.append(f"{errors} errors encountered")
        text = "\n".join(lines)
        return text if len(text) <= job.max_chars else text[: job.max_chars]
