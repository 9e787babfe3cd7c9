"""Seed 001's cross-conversational summary: one unified summary of a user's last conversations
(each one's medium-term summary and short-term messages), for starting a new session. Pure code:
the prompt and the offline summary, from plain values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.memory.policies.base import DATA_NOT_INSTRUCTIONS, escape, gist
from app.memory.types import Message, Prompt

# The seed: "unified summary from last 5 conversations".
CONVERSATIONS = 5
# Short-term messages of each conversation (the seed's short-term memory).
SHORT_TERM = 10


@dataclass(frozen=True, slots=True)
class Source:
    """One conversation as the user summary sees it."""

    conversation_id: str
    ended: bool
    last_message_at: str
    summary: str | None  # the summary its context shows
    summary_memory_id: int | None
    last_sequence: int
    messages: tuple[Message, ...]  # its short-term messages (after the summary, the last 10)


SYSTEM = (
    "Create a cross-conversational summary of a user from their most recent conversations (newest "
    "first), for an assistant starting a new session with them. Each conversation gives its "
    "medium-term summary (if any) and its short-term messages. Combine them into one user-focused "
    "summary: who the user is, their situation, insights and progress across sessions, ongoing work "
    "and open concerns, preferences for how they like to be helped. Merge what repeats; where "
    "conversations disagree, the newest wins. If a previous cross-conversational summary is given, "
    "evolve it rather than starting over."
)


def render_source(source: Source) -> str:
    state = "ended" if source.ended else "ongoing"
    opening = f'<conversation id="{escape(source.conversation_id)}" state="{state}"'
    parts = [f'{opening} last="{source.last_message_at}">']
    if source.summary:
        parts.append(f"<medium_term>\n{escape(source.summary)}\n</medium_term>")
    parts.extend(
        f'<message seq="{m.sequence}" role="{m.role}">{escape(m.text)}</message>' for m in source.messages
    )
    parts.append("</conversation>")
    return "\n".join(parts)


def prompt(previous: str | None, sources: Sequence[Source], max_chars: int) -> Prompt:
    system = (
        f"{SYSTEM}\n- {DATA_NOT_INSTRUCTIONS.replace('<messages>', '<conversation>')}\n"
        f"- Answer with the summary only, in markdown, at most {max_chars} characters."
    )
    parts = [] if not previous else [f"<previous_summary>\n{escape(previous)}\n</previous_summary>"]
    parts.extend(render_source(s) for s in sources)
    return Prompt(system=system, user="\n\n".join(parts))


def fallback(sources: Sequence[Source], max_chars: int) -> str:
    """Offline: a section per conversation, newest first, with the start of its medium-term
    summary and its user's latest words, each conversation given an even share of ``max_chars``."""
    header = f"# Cross-Conversation Summary\n\nThe user's last {len(sources)} conversations, newest first."
    if not sources:
        return header
    share = max(80, (max_chars - len(header)) // len(sources) - 2)
    sections = []
    for source in sources:
        state = "ended" if source.ended else "ongoing"
        lines = [f"## {source.conversation_id} ({state}, last message {source.last_message_at[:19]})"]
        if source.summary:
            flat = " ".join(line for line in source.summary.splitlines() if line.startswith("- "))
            lines.append(f"Summary: {flat or source.summary}")
        said = [gist(m, 160) for m in source.messages if m.role == "user" and m.text.strip()]
        if said:
            lines.append("Recently: " + " / ".join(said[-3:]))
        section = "\n".join(lines)
        sections.append(section if len(section) <= share else section[: share - 1].rstrip() + "…")
    text = "\n\n".join([header, *sections])
    return text[:max_chars]
