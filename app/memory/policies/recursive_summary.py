"""Seed 001: the recursive, user-focused medium-term memory.

One evolving summary per conversation (the medium-term memory) plus the short-term memory, the
newest ``short_term`` messages. The seed's example flow ("at message 11 summarize 1-10, then
short-term is 2-11") contradicts its own "no duplication" rule; the reading used here: when the
message count reaches 11, 21, 31, ... (1-based, as the seed counts), the messages after the
summary's end that have left the last-10 window are integrated into it. That is message 1 at 11,
messages 2-11 at 21 and 12-21 at 31, the seed's own steps at 21 and 31. In general an update is
due once ``update_every`` messages after the summary's end have left the short-term window (the
first, once any message has); it ends at a boundary (never splitting a round or a tool exchange),
so the raw part always holds at least the last ``short_term`` messages, and every message after
the summary (never one in both, never one missing).

Each summary row covers everything from the first message to its end and is built from the
previous one plus only the newly integrated messages (``base_memory_id``). When a summary passes
``max_summary_tokens - target_max_tokens`` (less room than one more update may add), the next
summary is a compaction (kind ``compaction``): the same range, rewritten from the summary alone
near the target size. The context never shows a summary over ``max_summary_tokens``: until its
compaction completes, it shows the previous summary and every message after that one.

Once the conversation has ended (``POST /conversations/{id}/end``) the final summary integrates
every message, the short-term ones included.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.memory.policies.base import (
    DATA_NOT_INSTRUCTIONS,
    PlainRendering,
    entry_line,
    escape,
    gist,
    name_required,
    render_messages,
    safe_end,
)
from app.memory.types import (
    ContextSpec,
    ConversationState,
    Message,
    Prompt,
    SummaryJob,
    SummaryPlan,
    Trigger,
    Wake,
)

MEDIUM_TERM = "medium_term"
COMPACTION = "compaction"
NEVER = 2**31 - 1

# The seed's sections of the medium-term summary, in its order.
SECTIONS = (
    "User's Journey & Insights",
    "Current Situation & Context",
    "Ongoing Work & Interests",
    "Preferences & Patterns",
)

SEED_INITIAL = (
    "Create an initial medium-term memory summary focusing on USER content and insights from the "
    "conversation so far."
    """

Since the agent generates most text, extract and preserve:
1. User's insights, breakthroughs, and realizations
2. User's emotional journey and current state
3. Important personal context and situation
4. User's spiritual/therapeutic work and preferences
5. User's ongoing concerns and questions"""
)

SEED_UPDATE = (
    "Update the existing medium-term memory by integrating new user content with the previous summary."
    """

Create an evolved summary that:
1. Integrates new insights with previous understanding
2. Consolidates patterns and recurring themes
3. Updates user's journey and emotional evolution
4. Maintains focus on user content (not agent responses)
5. Preserves essential context while staying concise"""
)

COMPACT = (
    "The medium-term memory below has grown close to its limit. Consolidate and compress it while "
    "preserving the user's essential insights and patterns: merge repeated points, drop detail that "
    "later content superseded, keep names, facts, decisions and open concerns."
)

# Offline: which section a user's sentence goes to (the first that matches; else the situation).
_CUES = (
    (SECTIONS[3], re.compile(r"\b(prefer|like|love|hate|dislike|want|rather|please|don't|do not)\b", re.I)),
    (SECTIONS[0], re.compile(r"\b(realiz|realis|understand|learn|noticed|insight|feel|felt)\w*", re.I)),
    (SECTIONS[2], re.compile(r"\b(working on|practic|explor|studying|interest|plan|goal|project)\w*", re.I)),
)
_FOOTER = re.compile(r"^\*Updated: .* \| Version: (\d+)\*$", re.M)
_HEADING = re.compile(r"^## (.+)$")
# Characters per token the offline summary assumes when it keeps to a token target (English
# averages about 4; fewer keeps the estimate on the safe side).
CHARS_PER_TOKEN = 3


class RecursiveSummaryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, json_schema_extra=name_required)

    name: Literal["recursive_summary"] = "recursive_summary"
    short_term: int = Field(
        default=10, ge=1, le=10_000, description="The newest messages always kept raw (seed 001: 10)."
    )
    update_every: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description="Messages that must leave the short-term window before the summary integrates them.",
    )
    max_summary_tokens: int = Field(
        default=7000, ge=100, le=1_000_000, description="The summary's cap; compacted when approaching it."
    )
    target_min_tokens: int = Field(default=500, ge=10, le=1_000_000, description="An update's target, low.")
    target_max_tokens: int = Field(
        default=1000, ge=10, le=1_000_000, description="An update's target, high; a compaction's size."
    )

    @model_validator(mode="after")
    def _targets_fit(self) -> Self:
        if self.target_min_tokens > self.target_max_tokens:
            raise ValueError("target_min_tokens must not exceed target_max_tokens")
        if self.target_max_tokens * 2 > self.max_summary_tokens:
            raise ValueError("max_summary_tokens must be at least twice target_max_tokens")
        return self


def version_of(text: str | None) -> int:
    """The version in a summary's footer (0 for none)."""
    if not text:
        return 0
    found = _FOOTER.findall(text)
    return int(found[-1]) if found else 0


def footer(job: SummaryJob) -> str:
    return f"*Updated: {job.covered_until or '-'} | Version: {version_of(job.base_text) + 1}*"


def parse_sections(text: str | None) -> dict[str, list[str]]:
    """The bullets of each seed section in a summary written in the seed's structure."""
    sections: dict[str, list[str]] = {name: [] for name in SECTIONS}
    current: str | None = None
    for line in (text or "").splitlines():
        heading = _HEADING.match(line)
        if heading:
            current = heading.group(1).strip() if heading.group(1).strip() in sections else None
        elif current is not None and line.startswith("- "):
            sections[current].append(line[2:])
    return sections


def section_of(sentence: str) -> str:
    return next((name for name, cue in _CUES if cue.search(sentence)), SECTIONS[1])


def render_sections(sections: Mapping[str, Sequence[str]], closing: str) -> str:
    parts = ["# Medium-Term Memory"]
    for name in SECTIONS:
        bullets = sections.get(name) or ()
        parts.append(
            f"## {name}\n" + ("\n".join(f"- {b}" for b in bullets) if bullets else "_(nothing yet)_")
        )
    parts.append(f"---\n{closing}")
    return "\n\n".join(parts)


def trim(sections: dict[str, list[str]], closing: str, max_chars: int) -> str:
    """The sections rendered within ``max_chars``: the oldest bullet of the longest section goes
    first, so every section keeps its newest points."""
    while True:
        text = render_sections(sections, closing)
        if len(text) <= max_chars or not any(sections.values()):
            return text if len(text) <= max_chars else text[:max_chars]
        longest = max(SECTIONS, key=lambda name: len(sections[name]))
        sections[longest].pop(0)


def previous(text: str, up_to: int | None) -> str:
    return f'<previous_summary up_to="#{up_to}">\n{escape(text)}\n</previous_summary>'


def message_number(sequence: int) -> int:
    """The seed counts messages from 1."""
    return sequence + 1


class RecursiveSummaryPolicy(PlainRendering):
    def __init__(self, config: RecursiveSummaryConfig) -> None:
        self._config = config

    @property
    def config(self) -> RecursiveSummaryConfig:
        return self._config

    @property
    def lookback_messages(self) -> int:
        # The boundaries within the short-term window and the last one before it: where an
        # update may end.
        return self._config.short_term

    @property
    def context(self) -> ContextSpec:
        return ContextSpec(summaries=1, recent_rounds=0, max_summary_tokens=self._config.max_summary_tokens)

    @property
    def compact_above(self) -> int:
        """Tokens past which the summary is compacted: less room is left than one update adds."""
        return self._config.max_summary_tokens - self._config.target_max_tokens

    def boundary_after(self, state: ConversationState) -> int | None:
        return None

    def _needs_compaction(self, state: ConversationState) -> bool:
        latest = state.latest_completed
        # A compaction that came back too large is not compacted again (a model ignoring its
        # target would loop); the next update is, and the context never shows one over the cap.
        return latest is not None and latest.kind != COMPACTION and latest.tokens > self.compact_above

    def _update_end(self, state: ConversationState, trigger: Trigger) -> tuple[int, int] | None:
        """(round, sequence) where the next update ends: the last message before the latest
        boundary that leaves at least ``short_term`` messages raw (every message once the
        conversation ended)."""
        if state.ended:
            return safe_end(state)
        keep_from = state.last_sequence - self._config.short_term + 1
        cut = next((b for b in reversed(state.round_starts) if b[1] <= keep_from and b[0] > 0), None)
        if cut is None:
            return None
        return cut[0] - 1, cut[1] - 1

    def _needed(self, state: ConversationState, trigger: Trigger) -> int:
        """Messages after the summary's end an update must integrate to be due."""
        if state.latest_completed is None or state.ended or trigger is Trigger.MANUAL:
            return 1
        return self._config.update_every

    def plan(self, state: ConversationState, trigger: Trigger) -> SummaryPlan | None:
        latest = state.latest_completed
        if latest is not None and self._needs_compaction(state):
            return SummaryPlan(
                kind=COMPACTION,
                start_round=0,
                end_round=latest.end_round,
                base_memory_id=latest.memory_id,
                input_start_round=latest.end_round,
            )
        end = self._update_end(state, trigger)
        if end is None:
            return None
        end_round, end_sequence = end
        covered = -1 if latest is None else latest.end_sequence
        if end_sequence - covered < self._needed(state, trigger):
            return None
        return SummaryPlan(
            kind=MEDIUM_TERM,
            start_round=0,
            end_round=end_round,
            base_memory_id=None if latest is None else latest.memory_id,
            input_start_round=0 if latest is None else latest.end_round + 1,
        )

    def wake(self, state: ConversationState) -> Wake:
        if self._needs_compaction(state):
            return Wake(round=0, sequence=0)
        if state.ended:
            return Wake(round=NEVER, sequence=NEVER)
        covered = -1 if state.latest_completed is None else state.latest_completed.end_sequence
        return Wake(
            round=0, sequence=covered + self._needed(state, Trigger.ROUND_END) + self._config.short_term
        )

    def reads_summaries(self, kind: str) -> bool:
        return kind == COMPACTION

    def render_markdown(self, context: Mapping[str, Any]) -> str:
        """Seed 001's "# Current Conversation Context": the medium-term summary, then the
        short-term messages as ``- Message N (Role): text``, numbered from 1 as the seed counts."""
        summary = context["summaries"][0]["text"] if context["summaries"] else "(none yet)"
        parts = [
            "# Current Conversation Context",
            f"## Medium-Term Memory (User Context from Earlier)\n\n{summary}",
        ]
        lines = []
        if context.get("truncated"):
            lines.append(f"- ({context['omitted_messages']['count']} older messages left out)")
        for m in context["messages"]:
            role, text = entry_line(m).split(": ", 1)
            lines.append(f"- Message {message_number(m['sequence'])} ({role}): {text}")
        parts.append("## Short-Term Memory (Recent Messages)\n\n" + ("\n".join(lines) or "(none)"))
        return "\n\n".join(parts)

    def nothing_due(self, state: ConversationState) -> str:
        covered = -1 if state.latest_completed is None else state.latest_completed.end_sequence
        return (
            f"nothing to integrate: the summary covers messages 1-{message_number(covered)} and "
            f"the newest {self._config.short_term} messages stay in short-term memory"
        )

    def _closing_rule(self, job: SummaryJob) -> str:
        return (
            "Format as structured markdown: '# Medium-Term Memory', then the sections "
            + ", ".join(f"'## {name}'" for name in SECTIONS)
            + f", each a list of '- ' points; then a line '---' and the line '{footer(job)}'."
        )

    def prompt(self, job: SummaryJob) -> Prompt:
        target = f"{self._config.target_min_tokens}-{self._config.target_max_tokens} tokens"
        first, last = message_number(job.start_sequence), message_number(job.end_sequence)
        rules = f"- {DATA_NOT_INSTRUCTIONS}\n- Answer with the summary only."
        if job.kind == COMPACTION:
            system = f"{COMPACT}\n\n{self._closing_rule(job)}\nTarget: {target}.\n{rules}"
            user = previous(job.base_text or "", job.end_sequence)
            return Prompt(system=system, user=user)
        if job.base_text is None:
            system = (
                f"{SEED_INITIAL}\n\nMessages to analyze ({first}-{last}) are given below.\n"
                f"{self._closing_rule(job)}\nTarget: {target}.\n{rules}"
            )
            return Prompt(system=system, user=render_messages(job.messages))
        new_first = message_number(job.messages[0].sequence) if job.messages else last
        system = (
            f"{SEED_UPDATE}\n\nThe previous summary and the new content (messages {new_first} to "
            f"{last}) are given below.\nKeep the same structure but evolve the content. "
            f"{self._closing_rule(job)}\nTarget: {target}.\n{rules}"
        )
        user = f"{previous(job.base_text, job.base_end_sequence)}\n\n{render_messages(job.messages)}"
        return Prompt(system=system, user=user)

    def fallback(self, job: SummaryJob) -> str:
        """The seed's sections, extractive: each user message's key sentence joins the section
        its wording suggests (preferences, insights, ongoing work, else the current situation),
        after the points of the previous summary. An update keeps within the compaction threshold,
        a compaction within the target (the oldest points of the longest section go first)."""
        sections = parse_sections(job.base_text)
        if job.kind == COMPACTION:
            budget = self._config.target_max_tokens * CHARS_PER_TOKEN
        else:
            budget = self.compact_above * CHARS_PER_TOKEN
            for message in _user_messages(job.messages):
                sentence = f"{gist(message, 200)} (message {message_number(message.sequence)})"
                sections[section_of(sentence)].append(sentence)
        return trim(sections, footer(job), min(job.max_chars, budget))


def _user_messages(messages: Sequence[Message]) -> list[Message]:
    """The user's own words (the seed: the agent writes most of the text)."""
    return [m for m in messages if m.role == "user" and m.kind == "message" and m.text.strip()]
