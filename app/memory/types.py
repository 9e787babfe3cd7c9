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

    ROUND_END = "round_end"  # rounds reached the policy's wake point (a runner claimed it)
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
    tokens: int = 0  # of its text (0 until it completes)


@dataclass(frozen=True, slots=True)
class ConversationState:
    """What a policy may see when it plans.

    ``round_starts`` maps each round that starts within the last ``policy.lookback_messages``
    messages at a boundary to its first sequence (oldest first); a policy that needs none sets a
    lookback of 0 and gets an empty tuple. A boundary is the start of a round before which no
    tool call waits for a result: the only places a window may start or end, so no summary and
    no context separates an assistant's tool calls from their results.
    """

    last_sequence: int
    last_round: int
    latest_completed: MemoryRef | None
    newest: MemoryRef | None  # the row with the newest range, whatever its status
    round_starts: tuple[tuple[int, int], ...] = ()
    # Tool calls the last round left waiting for their results (the next round starts with them).
    open_calls: int = 0
    # The first boundary (round, first sequence) after the round the policy asked about
    # (policy.boundary_after), or None when there is none yet.
    next_boundary: tuple[int, int] | None = None
    # Tokens of every message, and of the messages up to the latest completed summary's end.
    total_tokens: int = 0
    covered_tokens: int = 0
    # The completed summaries the context shows, newest first (each ending before the next
    # one's start), at most the policy's context.summaries of them.
    shown: tuple[MemoryRef, ...] = ()
    # The conversation was ended (POST /conversations/{id}/end): no message comes any more.
    ended: bool = False


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
class Wake:
    """When a policy next wants to be asked (trigger 'round_end'): once the conversation's last
    round reaches ``round`` and its last sequence reaches ``sequence``, or its tokens reach
    ``tokens``. It may be early (the
    plan then finds nothing due and a new wake is set), never late: a round for which the
    policy would plan a summary always reaches it. Stored with the conversation, so a POST
    decides whether a summary became due in the statement that stores the round."""

    round: int
    sequence: int
    # Or, whatever the rounds, once the conversation's tokens reach this (None: never).
    tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ContextSpec:
    """What a policy's context shows: the newest ``summaries`` completed summaries, and at least
    the messages of the last ``recent_rounds`` rounds (always every message after the newest
    summary). Stored with the conversation, so the read path needs no policy code."""

    summaries: int
    recent_rounds: int
    # Completed summaries over this many tokens are never shown (the previous one and the
    # messages after it are, until a smaller one completes); None: no cap.
    max_summary_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """A stored message as a summarizer sees it: a chat message with its entry type (seed 003:
    message, tool_call, tool_result, context)."""

    sequence: int
    round: int
    role: str
    content: Content | None
    kind: str = "message"
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        """The content as a summarizer sees it: strings as they are, JSON compactly, and each
        tool call as ``[calls name(arguments)]``."""
        parts = []
        if isinstance(self.content, str):
            parts.append(self.content)
        elif self.content is not None:
            parts.append(json.dumps(self.content, ensure_ascii=False, separators=(",", ":")))
        for call in self.tool_calls or ():
            function = call.get("function") or {}
            parts.append(f"[calls {function.get('name')}({function.get('arguments')})]")
        return " ".join(parts)


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
    # The tokens of the entries the summary covers.
    input_tokens: int = 0
    # For a summary of summaries (policy.reads_summaries(kind)): the completed summaries it
    # folds, oldest first, as (first sequence, last sequence, text); it gets no messages.
    summaries: tuple[tuple[int, int, str], ...] = ()
    # When the newest message the summary covers was stored (ISO 8601), for summaries that date
    # themselves.
    covered_until: str | None = None


@dataclass(frozen=True, slots=True)
class Prompt:
    system: str
    user: str
