"""Bulk seeding with COPY (never through the API): conversations, their messages (two per round,
user then assistant), and the completed memories a real conversation of that length would have
under its memory policy.

Each conversation stores what the service would store for it: its resolved policy, the context
spec and the wake point, all from the service's own policy code (app.memory.policies) with the
deployment defaults the service runs with. Nothing is seeded as due (``summary_due_at`` NULL), so
no runner touches a seeded conversation until a round is posted to it (or a scenario marks it due).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from app.memory.policies import (
    MemoryPolicy,
    ParameterDefaults,
    build_policy,
    parse_config,
    policy_dump,
    resolve,
)
from app.memory.policies.rolling_blocks import RollingBlocksConfig
from app.memory.policies.sliding_window import SlidingWindowConfig
from app.memory.types import ConversationState, MemoryRef, Wake
from bench.textgen import message, rng_for

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")

SLIDING_WINDOW = "sliding_window"
ROLLING_BLOCKS = "rolling_blocks"
POLICIES = (SLIDING_WINDOW, ROLLING_BLOCKS)
# Scenario 1's conversations: f"{CONTEXT_PREFIXES[policy]}-{messages}".
CONTEXT_PREFIXES = {SLIDING_WINDOW: "ctx", ROLLING_BLOCKS: "blocks"}
MESSAGES_PER_ROUND = 2  # every seeded round is a user message and the assistant's answer


@dataclass(frozen=True)
class ConversationSeed:
    conversation_id: str
    messages: int
    # sliding_window: messages after the latest completed memory (the gap GET context returns).
    # rolling_blocks ignores it: every full block has its completed summary.
    gap: int = 4
    policy: str = SLIDING_WINDOW


@dataclass(frozen=True)
class PlannedMemory:
    kind: str
    start_sequence: int
    end_sequence: int
    input_start_sequence: int
    chained: bool  # base_memory_id is the conversation's previous seeded memory

    @property
    def start_round(self) -> int:
        return round_of(self.start_sequence)

    @property
    def end_round(self) -> int:
        return round_of(self.end_sequence)


def round_of(sequence: int) -> int:
    return sequence // MESSAGES_PER_ROUND


def rounds_of(messages: int) -> int:
    """Rounds stored for ``messages`` messages (a last odd message is a round of its own)."""
    return -(-messages // MESSAGES_PER_ROUND)


def window(end_sequence: int, window_size: int) -> tuple[int, int]:
    """The service's sliding window: the last ``window_size`` messages, starting on a user turn."""
    start = max(0, end_sequence - window_size + 1)
    if start % 2:
        start += 1
    return start, end_sequence


def block_end(start_round: int, block_window: int) -> int:
    """Rolling blocks: block 0 is rounds 0..W, block k >= 1 is rounds kW+1..(k+1)W."""
    return block_window if start_round == 0 else start_round + block_window - 1


def _first_sentence(text: str, limit: int = 160) -> str:
    return _SENTENCE_END.split(" ".join(text.split()), maxsplit=1)[0][:limit]


def _shorten(sentence: str, limit: int) -> str:
    return sentence if len(sentence) <= limit else sentence[: limit - 1].rstrip() + "…"


class Seeder:
    """Message texts come from a fixed pool (seeded), so 100,000 messages cost little to make."""

    def __init__(
        self,
        *,
        policy_defaults: ParameterDefaults,
        history: bool,
        max_chars: int = 4000,
        pool_size: int = 512,
    ) -> None:
        # Each policy as the service resolves it for a conversation created without parameters.
        self.policies: dict[str, MemoryPolicy] = {
            name: build_policy(resolve(parse_config(name), policy_defaults)) for name in POLICIES
        }
        window = self.policies[SLIDING_WINDOW].config
        blocks = self.policies[ROLLING_BLOCKS].config
        assert isinstance(window, SlidingWindowConfig) and isinstance(blocks, RollingBlocksConfig)
        self.window_size = window.window_size
        self.summarize_after_seq = window.summarize_after_seq
        self.summarize_every = window.summarize_every
        self.block_window = blocks.window
        self.max_summaries = blocks.max_summaries
        self.max_chars = max_chars
        self.history = history
        rng = rng_for("bench-seed-pool")
        self._texts = {role: [message(rng, role) for _ in range(pool_size)] for role in ("user", "assistant")}
        self._firsts = {role: [_first_sentence(t) for t in texts] for role, texts in self._texts.items()}
        self._pool_size = pool_size

    # ---- policies -------------------------------------------------------------------------------

    def policy_config(self, policy: str) -> dict[str, Any]:
        """The conversation's stored (resolved) policy, as the service would store it."""
        return policy_dump(self.policies[policy].config)

    def context_spec(self, policy: str) -> tuple[int, int]:
        """(context_summaries, context_recent_rounds) the service derives from the policy."""
        spec = self.policies[policy].context
        return spec.summaries, spec.recent_rounds

    def wake(self, seed: ConversationSeed, planned: Sequence[PlannedMemory]) -> Wake:
        """The policy's wake point for the seeded conversation (its newest memory completed)."""
        newest = (
            MemoryRef(
                memory_id=0,  # the policies decide on ranges, not ids
                kind=planned[-1].kind,
                status="completed",
                start_sequence=planned[-1].start_sequence,
                end_sequence=planned[-1].end_sequence,
                start_round=planned[-1].start_round,
                end_round=planned[-1].end_round,
            )
            if planned
            else None
        )
        state = ConversationState(
            last_sequence=seed.messages - 1,
            last_round=rounds_of(seed.messages) - 1,
            latest_completed=newest,
            newest=newest,
        )
        return self.policies[seed.policy].wake(state)

    # ---- what a conversation of that length has -----------------------------------------------

    def memory_ends(self, seed: ConversationSeed) -> list[int]:
        """sliding_window: the end sequences of the completed memories, oldest first."""
        last = seed.messages - 1 - seed.gap
        if last % MESSAGES_PER_ROUND == 0:
            last -= 1  # a summary covers whole rounds: end on an assistant message
        if last < self.summarize_after_seq:
            return []
        if not self.history:
            return [last]
        # One completed summary every summarize_every rounds from the trigger on, as the policy
        # produces them when summaries keep up.
        first = self.summarize_after_seq if self.summarize_after_seq % 2 else self.summarize_after_seq + 1
        ends = list(range(first, last + 1, MESSAGES_PER_ROUND * self.summarize_every))
        if not ends or ends[-1] != last:
            ends.append(last)
        return ends

    def memories(self, seed: ConversationSeed) -> list[PlannedMemory]:
        """The completed memories, oldest first."""
        planned: list[PlannedMemory] = []
        if seed.policy == SLIDING_WINDOW:
            previous_end: int | None = None
            for end in self.memory_ends(seed):
                start, _ = window(end, self.window_size)
                # Incremental: the summarizer was given only the messages after its base.
                input_start = start if previous_end is None else max(start, previous_end + 1)
                planned.append(PlannedMemory("window", start, end, input_start, previous_end is not None))
                previous_end = end
            return planned
        if seed.policy == ROLLING_BLOCKS:
            # Every full block has its summary (a block is full once its last round has both messages).
            last_full_round = seed.messages // MESSAGES_PER_ROUND - 1
            start = 0
            while (end := block_end(start, self.block_window)) <= last_full_round:
                first, last = MESSAGES_PER_ROUND * start, MESSAGES_PER_ROUND * (end + 1) - 1
                planned.append(PlannedMemory("block", first, last, first, False))
                start = end + 1
            # Without history only the blocks the context shows, so the response is the same.
            return planned if self.history else planned[-self.max_summaries :]
        raise ValueError(f"unknown memory policy {seed.policy!r}")

    def expected_context(self, seed: ConversationSeed) -> dict[str, Any]:
        """What GET context must return for the seeded conversation (CONTEXT_SQL's rule: the raw
        part starts at the earliest of the message after the newest shown summary and the first
        message of the last R rounds)."""
        summaries, recent_rounds = self.context_spec(seed.policy)
        shown = self.memories(seed)[-summaries:]
        newest_end = shown[-1].end_sequence if shown else -1
        first_recent_round = max(0, rounds_of(seed.messages) - recent_rounds)
        raw_start = min(newest_end + 1, MESSAGES_PER_ROUND * first_recent_round, seed.messages)
        return {
            "summaries": len(shown),
            "memory_end_sequence": shown[-1].end_sequence if shown else None,
            "raw_messages": seed.messages - raw_start,
        }

    # ---- rows ----------------------------------------------------------------------------------

    def _pick(self, conv_index: int, seq: int) -> tuple[str, int]:
        role = "user" if seq % 2 == 0 else "assistant"
        return role, (seq * 7919 + conv_index * 104_729) % self._pool_size

    def _window_text(self, conv_index: int, start: int, end: int) -> str:
        lines = []
        for seq in range(start, end + 1):
            role, pick = self._pick(conv_index, seq)
            lines.append(f"#{seq} {role}: {self._firsts[role][pick]}")
        return "\n".join(lines)

    def _block_text(self, conv_index: int, memory: PlannedMemory) -> str:
        """Like the service's offline block summary: a header naming the block, then one
        ``#seq role: key sentence`` line per message, sentences shortened evenly to fit."""
        header = f"Interactions {memory.start_round + 1}-{memory.end_round + 1}:"
        sequences = range(memory.start_sequence, memory.end_sequence + 1)
        picks = [self._pick(conv_index, seq) for seq in sequences]
        prefixes = [f"#{seq} {role}: " for seq, (role, _) in zip(sequences, picks, strict=True)]
        room = self.max_chars - len(header) - 1
        per_sentence = max(8, (room - sum(len(p) + 1 for p in prefixes)) // max(1, len(picks)))
        lines = [header]
        lines += [
            prefix + _shorten(self._firsts[role][pick], per_sentence)
            for prefix, (role, pick) in zip(prefixes, picks, strict=True)
        ]
        text = "\n".join(lines)
        return text if len(text) <= self.max_chars else text[: self.max_chars - 1].rstrip() + "…"

    def _memory_text(self, conv_index: int, memory: PlannedMemory) -> str:
        if memory.kind == "block":
            return self._block_text(conv_index, memory)
        return self._window_text(conv_index, memory.start_sequence, memory.end_sequence)

    async def seed(
        self, conn: asyncpg.Connection, conversations: Sequence[ConversationSeed]
    ) -> dict[str, int]:
        now = dt.datetime.now(dt.UTC)
        step = dt.timedelta(seconds=5)
        conv_rows: list[tuple[Any, ...]] = []
        msg_rows: list[tuple[Any, ...]] = []
        plans: list[tuple[int, ConversationSeed, list[PlannedMemory], dt.datetime]] = []
        policies = {p: orjson.dumps(self.policy_config(p)).decode() for p in POLICIES}
        contents = {role: [orjson.dumps(t).decode() for t in texts] for role, texts in self._texts.items()}
        for index, seed in enumerate(conversations):
            rounds = rounds_of(seed.messages)
            t0 = now - step * (rounds + 1)
            summaries, recent_rounds = self.context_spec(seed.policy)
            planned = self.memories(seed)
            wake = self.wake(seed, planned)
            conv_rows.append(
                (
                    seed.conversation_id,
                    "default",
                    t0,
                    "{}",
                    seed.messages,
                    rounds,
                    policies[seed.policy],
                    summaries,
                    recent_rounds,
                    wake.round,
                    wake.sequence,
                )
            )
            for seq in range(seed.messages):
                role, pick = self._pick(index, seq)
                rnd = round_of(seq)
                # the messages of a round share created_at (one transaction), as the service's do
                content = contents[role][pick]
                msg_rows.append(
                    (
                        seed.conversation_id,
                        seq,
                        rnd,
                        role,
                        content,
                        None,
                        len(content.encode()),
                        t0 + step * rnd,
                    )
                )
            plans.append((index, seed, planned, t0))
        total_memories = sum(len(planned) for _, _, planned, _ in plans)
        ids: list[int] = []
        if total_memories:
            ids = sorted(
                r[0]
                for r in await conn.fetch(
                    "SELECT nextval(pg_get_serial_sequence('memory', 'memory_id')) "
                    "FROM generate_series(1, $1)",
                    total_memories,
                )
            )
        mem_rows: list[tuple[Any, ...]] = []
        id_iter = iter(ids)
        for index, seed, planned, t0 in plans:
            previous: int | None = None
            for memory in planned:
                memory_id = next(id_iter)
                created = t0 + step * memory.end_round + dt.timedelta(milliseconds=50)
                mem_rows.append(
                    (
                        memory_id,
                        seed.conversation_id,
                        memory.kind,
                        self._memory_text(index, memory),
                        memory.start_sequence,
                        memory.end_sequence,
                        memory.start_round,
                        memory.end_round,
                        memory.input_start_sequence,
                        previous if memory.chained else None,
                        "completed",
                        created,
                        1200,
                        created + dt.timedelta(milliseconds=1200),
                        None,
                        1,
                        None,
                    )
                )
                previous = memory_id
        async with conn.transaction():
            await conn.copy_records_to_table(
                "conversations",
                records=conv_rows,
                columns=[
                    "conversation_id",
                    "tenant_id",
                    "created_at",
                    "metadata",
                    "next_sequence",
                    "next_round",
                    "memory_policy",
                    "context_summaries",
                    "context_recent_rounds",
                    "wake_round",
                    "wake_sequence",
                ],
            )
            await conn.copy_records_to_table(
                "messages",
                records=msg_rows,
                columns=[
                    "conversation_id",
                    "sequence",
                    "round",
                    "role",
                    "content",
                    "metadata",
                    "content_bytes",
                    "created_at",
                ],
            )
            # Seeded messages hold no tool calls: every round starts at a boundary (a window may
            # start there), as the append statement would have marked it.
            await conn.execute(
                "UPDATE messages m SET boundary = true "
                "WHERE m.conversation_id = ANY($1::varchar[]) AND (m.sequence = 0 OR m.round <> "
                "(SELECT p.round FROM messages p WHERE p.conversation_id = m.conversation_id "
                "AND p.sequence = m.sequence - 1))",
                sorted({row[0] for row in msg_rows}),
            )
            if mem_rows:
                await conn.copy_records_to_table(
                    "memory",
                    records=mem_rows,
                    columns=[
                        "memory_id",
                        "conversation_id",
                        "kind",
                        "memory_text",
                        "start_sequence",
                        "end_sequence",
                        "start_round",
                        "end_round",
                        "input_start_sequence",
                        "base_memory_id",
                        "status",
                        "created_at",
                        "generation_time_ms",
                        "completed_at",
                        "lease_expires_at",
                        "attempts",
                        "error",
                    ],
                )
        return {"conversations": len(conv_rows), "messages": len(msg_rows), "memories": len(mem_rows)}


async def vacuum_analyze(conn: asyncpg.Connection) -> None:
    """What autovacuum would have done to tables this old: statistics and the visibility map."""
    await conn.execute("VACUUM (ANALYZE) conversations, messages, memory")
