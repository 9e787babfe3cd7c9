"""Seed 001's session markdown (its "Session Data Format"): a conversation's metadata, its
short-term messages and its medium-term summary, as one Markdown document. Pure code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from app.memory.types import Message

# The seed's short-term memory: the last 10 messages.
SHORT_TERM = 10


@dataclass(frozen=True, slots=True)
class Session:
    conversation_id: str
    started_at: datetime
    ended_at: datetime | None  # when POST .../end ended it
    last_message_at: datetime
    message_count: int
    summary_version: int  # completed summaries so far
    summary: str | None  # the summary the context shows
    messages: Sequence[Message]  # the last SHORT_TERM messages, oldest first


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def session_markdown(session: Session) -> str:
    """The seed's session markdown. ``End`` is when the session was ended, else (still open or
    archived) its last message; messages are numbered from 1, as the seed counts."""
    end = session.ended_at or session.last_message_at
    lines = [
        f"# Session: {session.started_at.astimezone(UTC).strftime('%Y-%m-%d_%H%M%S')}",
        "",
        "## Metadata",
        f"- Conversation: {session.conversation_id}",
        f"- Start: {_stamp(session.started_at)}",
        f"- End: {_stamp(end)}" + ("" if session.ended_at else " (not ended: last message)"),
        f"- Message Count: {session.message_count}",
        f"- Summary Version: {session.summary_version}",
        "",
        f"## Short-Term Messages (Last {SHORT_TERM})",
    ]
    lines += [f"**Message {m.sequence + 1} ({m.role.capitalize()}):** {m.text}" for m in session.messages]
    if not session.messages:
        lines.append("(no messages)")
    lines += ["", "## Medium-Term Summary", session.summary or "(no summary yet)"]
    return "\n".join(lines) + "\n"
