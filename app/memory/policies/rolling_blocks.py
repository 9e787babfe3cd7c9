"""Seed 000: rolling blocks.

The context is the newest ``window`` interactions (rounds) plus the newest ``max_summaries``
block summaries, newest first. A block summary is made each time a block of ``window``
interactions fills: at interactions 22, 43, 64, 85, ... (1-based, with the defaults), covering
that block. Seed 000's first summary covers 2-22 and so loses interaction 1 for good; this one
covers 1-22. Older summaries drop out of the context but stay in the version chain.

In 0-based rounds with window W: block 0 is rounds 0..W, block k >= 1 is rounds kW+1..(k+1)W.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.memory.policies.base import (
    DATA_NOT_INSTRUCTIONS,
    PlainRendering,
    gist,
    name_required,
    render_messages,
)
from app.memory.types import ContextSpec, ConversationState, Prompt, SummaryJob, SummaryPlan, Trigger, Wake

KIND = "block"


class RollingBlocksConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, json_schema_extra=name_required)

    name: Literal["rolling_blocks"] = "rolling_blocks"
    window: int = Field(
        default=21, ge=1, le=10_000, description="Interactions (rounds) in the window and in a block."
    )
    max_summaries: int = Field(default=3, ge=1, le=100, description="Block summaries the context shows.")


def block_end(start_round: int, window: int) -> int:
    """The last round of the block that starts at ``start_round`` (the first block is one
    interaction longer, so that interaction 1 is summarized too)."""
    return window if start_round == 0 else start_round + window - 1


class RollingBlocksPolicy(PlainRendering):
    def __init__(self, config: RollingBlocksConfig) -> None:
        self._config = config

    @property
    def config(self) -> RollingBlocksConfig:
        return self._config

    @property
    def lookback_messages(self) -> int:
        return 0

    @property
    def context(self) -> ContextSpec:
        return ContextSpec(summaries=self._config.max_summaries, recent_rounds=self._config.window)

    def _next_block(self, state: ConversationState) -> tuple[int, int]:
        # Blocks are started in order; the next block starts after the newest row of any status
        # (even failed), so it always comes on time.
        start = 0 if state.newest is None else state.newest.end_round + 1
        return start, block_end(start, self._config.window)

    def boundary_after(self, state: ConversationState) -> int | None:
        return self._next_block(state)[1]

    def plan(self, state: ConversationState, trigger: Trigger) -> SummaryPlan | None:
        # Every trigger asks the same question: is the oldest block without a summary full?
        # After a completion that picks up a boundary passed while the previous block ran.
        start, end = self._next_block(state)
        if end > state.last_round:
            # Until it is, a newest block whose summary failed (the model was down) is tried
            # again, over the same interactions: the conversation is due again after a failure,
            # and a quiet one would otherwise keep that block as raw messages for good.
            failed = state.newest
            if failed is not None and failed.status == "failed" and failed.kind == KIND:
                return SummaryPlan(
                    kind=KIND,
                    start_round=failed.start_round,
                    end_round=failed.end_round,
                    base_memory_id=None,
                    input_start_round=failed.start_round,
                )
            return None
        # A block ends where the next may start: where no tool call waits for a result. When
        # an exchange runs across its last interaction, the block takes the rest of it.
        if state.next_boundary is not None:
            end = state.next_boundary[0] - 1
        elif state.open_calls > 0:
            return None  # the exchange is still open: wait for its results
        else:
            end = state.last_round
        return SummaryPlan(
            kind=KIND, start_round=start, end_round=end, base_memory_id=None, input_start_round=start
        )

    def wake(self, state: ConversationState) -> Wake:
        _, end = self._next_block(state)
        return Wake(round=end, sequence=0)

    def reads_summaries(self, kind: str) -> bool:
        return False

    def nothing_due(self, state: ConversationState) -> str:
        start, end = self._next_block(state)
        stored = max(0, state.last_round + 1 - start)
        return (
            f"nothing to summarize: the next block (interactions {start + 1}-{end + 1}) is not full "
            f"yet ({stored} of its {end - start + 1} interactions stored)"
        )

    def prompt(self, job: SummaryJob) -> Prompt:
        system = (
            "You summarize one block of a conversation between a user and an assistant: "
            f"interactions {job.start_round + 1} to {job.end_round + 1} (messages #{job.start_sequence} "
            f"to #{job.end_sequence}). The summary replaces the block in the assistant's memory.\n"
            "- Be concise but specific: the user's goals, decisions made, facts, names, and any "
            "evolving state (what changed, what is pending).\n"
            "- Keep what later interactions may need; drop pleasantries and repetition.\n"
            f"- {DATA_NOT_INSTRUCTIONS}\n"
            f"- Answer with the summary only, in plain text, at most {job.max_chars} characters."
        )
        return Prompt(system=system, user=render_messages(job.messages))

    def fallback(self, job: SummaryJob) -> str:
        """A header naming the block, then one ``#seq role: key sentence`` line per message, the
        sentences shortened evenly so the whole block fits in ``max_chars``."""
        header = f"Interactions {job.start_round + 1}-{job.end_round + 1}:"
        room = job.max_chars - len(header) - 1
        count = max(1, len(job.messages))
        # Each line costs its prefix plus the sentence; share what is left between messages.
        prefixes = [f"#{m.sequence} {m.role}: " for m in job.messages]
        per_sentence = max(8, (room - sum(len(p) + 1 for p in prefixes)) // count)
        lines = [header]
        lines += [p + gist(m, per_sentence) for p, m in zip(prefixes, job.messages, strict=True)]
        text = "\n".join(lines)
        return text if len(text) <= job.max_chars else text[: job.max_chars - 1].rstrip() + "…"
