"""Importing an exported conversation: the consistency rules of a document and the rows it
becomes, as pure code.

A document (app.schemas.ConversationExport) is checked for what its fields alone cannot say:
entries numbered 0, 1, 2, ... with rounds that start at 0 and never skip; tool calls and results
in Chat Completions order across the whole transcript (each result answers a call waiting for it,
no other message comes between an assistant's calls and their results, a call id is used once);
memory rows with unique ids, ranges of whole rounds within the entries, the token count of their
range, and a base that is an earlier, not in-flight row of the document. The first problem found
is raised as :class:`app.errors.Invalid` naming where it is (``loc``), so nothing is written.

Summaries that were in flight when the document was exported ('processing') are not imported:
their runner is another deployment's, and the importing conversation's policy plans again.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from app.errors import Invalid


class ToolCallLike(Protocol):
    @property
    def id(self) -> str: ...


class EntryLike(Protocol):
    @property
    def sequence(self) -> int: ...
    @property
    def round(self) -> int: ...
    @property
    def role(self) -> str: ...
    @property
    def tokens(self) -> int: ...
    @property
    def tool_call_id(self) -> str | None: ...
    @property
    def tool_calls(self) -> Sequence[ToolCallLike] | None: ...


class MemoryLike(Protocol):
    @property
    def memory_id(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def start_sequence(self) -> int: ...
    @property
    def end_sequence(self) -> int: ...
    @property
    def start_round(self) -> int: ...
    @property
    def end_round(self) -> int: ...
    @property
    def input_start_sequence(self) -> int: ...
    @property
    def base_memory_id(self) -> int | None: ...
    @property
    def text(self) -> str: ...
    @property
    def input_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ImportPlan:
    """What a checked document becomes: per entry, the running token total before it and whether
    a window may start at it (the first entry of a round with no call waiting for a result); the
    tool calls made and answered, as (call id, sequence); the memory rows kept, by their ids in
    the document; and the conversation's counters."""

    tokens_before: list[int]
    boundaries: list[bool]
    calls: list[tuple[str, int]]
    results: list[tuple[str, int]]
    kept_memories: list[int]  # indexes into the document's memories, in memory_id order
    dropped_processing: int
    next_sequence: int
    next_round: int
    next_tokens: int
    open_tool_calls: int


def _entries(
    entries: Sequence[EntryLike],
) -> tuple[list[bool], list[tuple[str, int]], list[tuple[str, int]], int]:
    boundaries: list[bool] = []
    calls: list[tuple[str, int]] = []
    results: list[tuple[str, int]] = []
    waiting: dict[str, int] = {}  # call id -> sequence of the call, while it has no result
    used: set[str] = set()
    previous_round = -1
    for index, entry in enumerate(entries):
        where: list[str | int] = ["body", "entries", index]
        if entry.sequence != index:
            raise Invalid(
                f"entries must be numbered 0, 1, 2, ... in order, without gaps or repeats: entry {index} "
                f"has sequence {entry.sequence}",
                loc=[*where, "sequence"],
            )
        if entry.round not in (previous_round, previous_round + 1) or (index == 0 and entry.round != 0):
            expected = "0" if index == 0 else f"{previous_round} or {previous_round + 1}"
            raise Invalid(
                f"rounds start at 0 and never skip one: entry {index} has round {entry.round}, "
                f"not {expected}",
                loc=[*where, "round"],
            )
        boundaries.append(entry.round != previous_round and not waiting)
        previous_round = entry.round
        answer = entry.tool_call_id
        if answer is not None:
            if answer not in waiting:
                reason = "already has its result" if answer in used else "is not made before it"
                raise Invalid(
                    f"entry {index} answers tool call {answer!r}, which {reason}",
                    loc=[*where, "tool_call_id"],
                )
            del waiting[answer]
            results.append((answer, index))
            continue
        if waiting:
            open_ids = ", ".join(repr(i) for i in sorted(waiting))
            raise Invalid(
                f"entry {index} comes before the results of tool calls {open_ids}: a tool message for "
                "each call follows the assistant message that made it",
                loc=where,
            )
        for position, call in enumerate(entry.tool_calls or ()):
            if call.id in used:
                raise Invalid(
                    f"tool call id {call.id!r} is used twice",
                    loc=[*where, "tool_calls", position, "id"],
                )
            used.add(call.id)
            waiting[call.id] = index
            calls.append((call.id, index))
    return boundaries, calls, results, len(waiting)


def _memories(
    memories: Sequence[MemoryLike], entries: Sequence[EntryLike], tokens_before: Sequence[int]
) -> tuple[list[int], int]:
    last = len(entries) - 1
    seen: dict[int, str] = {}  # memory_id -> status
    order = sorted(range(len(memories)), key=lambda i: memories[i].memory_id)
    if order != list(range(len(memories))):
        first = next(i for i, j in enumerate(order) if i != j)
        raise Invalid(
            "memories must be in memory_id order without repeats",
            loc=["body", "memories", first, "memory_id"],
        )
    kept: list[int] = []
    dropped = 0
    for index, row in enumerate(memories):
        where: list[str | int] = ["body", "memories", index]
        if row.memory_id in seen:
            raise Invalid(f"memory_id {row.memory_id} is used twice", loc=[*where, "memory_id"])
        seen[row.memory_id] = row.status
        if not 0 <= row.start_sequence <= row.input_start_sequence <= row.end_sequence <= last:
            raise Invalid(
                f"memory {row.memory_id} covers entries {row.start_sequence}-{row.end_sequence} (input from "
                f"{row.input_start_sequence}), outside the document's entries 0-{last} or out of order",
                loc=where,
            )
        start, end = entries[row.start_sequence], entries[row.end_sequence]
        whole = (row.start_sequence == 0 or entries[row.start_sequence - 1].round != start.round) and (
            row.end_sequence == last or entries[row.end_sequence + 1].round != end.round
        )
        if (row.start_round, row.end_round) != (start.round, end.round) or not whole:
            raise Invalid(
                f"memory {row.memory_id} must cover whole rounds: entries {row.start_sequence}-"
                f"{row.end_sequence} are not rounds {row.start_round}-{row.end_round}",
                loc=[*where, "start_round"],
            )
        covered = tokens_before[row.end_sequence] + end.tokens - tokens_before[row.start_sequence]
        if row.input_tokens != covered:
            raise Invalid(
                f"memory {row.memory_id} says its entries have {row.input_tokens} tokens; "
                f"they have {covered}",
                loc=[*where, "input_tokens"],
            )
        base = row.base_memory_id
        if base is not None and (base >= row.memory_id or seen.get(base) in (None, "processing")):
            raise Invalid(
                f"memory {row.memory_id} is based on memory {base}, which is not an earlier completed or "
                "failed memory of this document",
                loc=[*where, "base_memory_id"],
            )
        if row.status == "processing":
            dropped += 1
            continue
        if row.status == "completed" and not row.text.strip():
            raise Invalid(f"completed memory {row.memory_id} has no text", loc=[*where, "text"])
        kept.append(index)
    return kept, dropped


def plan_import(entries: Sequence[EntryLike], memories: Sequence[MemoryLike]) -> ImportPlan:
    """Check a document's entries and memories (raising Invalid on the first problem) and say
    what they become."""
    boundaries, calls, results, open_calls = _entries(entries)
    tokens_before = list(itertools.accumulate((e.tokens for e in entries), initial=0))
    kept, dropped = _memories(memories, entries, tokens_before)
    return ImportPlan(
        tokens_before=tokens_before[:-1],
        boundaries=boundaries,
        calls=calls,
        results=results,
        kept_memories=kept,
        dropped_processing=dropped,
        next_sequence=len(entries),
        next_round=entries[-1].round + 1 if entries else 0,
        next_tokens=tokens_before[-1],
        open_tool_calls=open_calls,
    )


def renumber(memory_ids: Sequence[int], new_ids: Sequence[int]) -> dict[int, int]:
    """The document's memory ids mapped to the ones the database gave, in the same order (so a
    base stays older than what is built on it)."""
    return dict(zip(memory_ids, sorted(new_ids), strict=True))
