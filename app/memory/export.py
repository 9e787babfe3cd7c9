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


def _utc(moment: datetime) -> datetime:
    """The moment in UTC. asyncpg reads PostgreSQL's -infinity and infinity (what it writes for
    0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999999Z) as naive datetime.min and .max: a naive
    moment is taken as UTC, never as local time (whose conversion fails at years 1 and 9999)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


# The date by isoformat: strftime's %Y is not zero-padded before year 1000 on every platform.
def _stamp(moment: datetime) -> str:
    at = _utc(moment)
    return f"{at.date().isoformat()}T{at:%H:%M:%S}Z"


def _title(moment: datetime) -> str:
    at = _utc(moment)
    return f"{at.date().isoformat()}_{at:%H%M%S}"


def session_markdown(session: Session) -> str:
    """The seed's session markdown. ``End`` is when the session was ended, else (still open or
    archived) its last message; messages are numbered from 1, as the seed counts."""
    end = session.ended_at or session.last_message_at
    lines = [
        f"# Session: {_title(session.started_at)}",
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
