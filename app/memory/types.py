"""Value types shared by the policies, the summary job and the repositories.

Everything here is plain data: policies read a :class:`ConversationState` and answer with a
:class:`SummaryPlan`; the generic summary job hands a policy a :class:`SummaryJob` and gets a
:class:`Prompt` (or, offline, the summary text) back. No I/O, no database types.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# A message's content: a string, or any JSON object or array stored as posted.
Content = str | dict[str, Any] | list[Any]


class Trigger(StrEnum):
    """Why a policy is asked whether a summary is due."""

    ROUND_END = "round_end"  # a POST of messages (one round) was stored
    COMPLETED = "completed"  # a summary of the conversation just completed
    MANUAL = "manual"  # an operator asked for a summary now (POST /ops/.../summarize)


@dataclass(frozen=True, slots=True)
class MemoryRef:
    """The fields of a memory row a policy decides on."""

    memory_id: int
    kind: str
    status: str
    start_sequence: int
    end_sequence: int
    start_round: int
    end_round: int


@dataclass(frozen=True, slots=True)
class ConversationState:
    """What a policy may see when it plans.

    ``round_starts`` maps each round that starts within the last ``policy.lookback_messages``
    messages to its first sequence (oldest first); a policy that needs no round boundaries sets
    a lookback of 0 and gets an empty tuple.
    """

    last_sequence: int
    last_round: int
    latest_completed: MemoryRef | None
    newest: MemoryRef | None  # the row with the newest range, whatever its status
    round_starts: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class SummaryPlan:
    """A summary to start, in whole rounds (so a round is never split).

    The summarizer is given the base memory's text (if any) and the messages of rounds
    ``input_start_round`` to ``end_round``; the new memory covers ``start_round`` to
    ``end_round``.
    """

    kind: str
    start_round: int
    end_round: int
    base_memory_id: int | None
    input_start_round: int

    def __post_init__(self) -> None:
        if not 0 <= self.start_round <= self.input_start_round <= self.end_round:
            raise ValueError(f"inconsistent plan: {self}")


@dataclass(frozen=True, slots=True)
class ContextSpec:
    """What a policy's context shows: the newest ``summaries`` completed summaries, and at least
    the messages of the last ``recent_rounds`` rounds (always every message after the newest
    summary). Stored with the conversation, so the read path needs no policy code."""

    summaries: int
    recent_rounds: int


@dataclass(frozen=True, slots=True)
class Message:
    sequence: int
    round: int
    role: str
    content: Content

    @property
    def text(self) -> str:
        """The content as a summarizer sees it: strings as they are, JSON compactly."""
        if isinstance(self.content, str):
            return self.content
        return json.dumps(self.content, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class SummaryJob:
    """One summary to produce: its range, its base memory and its input messages."""

    memory_id: int
    conversation_id: str
    kind: str
    start_sequence: int
    end_sequence: int
    start_round: int
    end_round: int
    base_text: str | None
    base_end_sequence: int | None
    messages: tuple[Message, ...]
    max_chars: int


@dataclass(frozen=True, slots=True)
class Prompt:
    system: str
    user: str
