"""Bulk seeding with COPY (never through the API): conversations, their messages, and the
completed memories a real conversation of that length would have."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench.textgen import message, rng_for

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


@dataclass(frozen=True)
class ConversationSeed:
    conversation_id: str
    messages: int
    gap: int = 4  # messages after the latest completed memory (the gap GET context returns)


def window(end_sequence: int, window_size: int) -> tuple[int, int]:
    """The service's sliding window: the last ``window_size`` messages, starting on a user turn."""
    start = max(0, end_sequence - window_size + 1)
    if start % 2:
        start += 1
    return start, end_sequence


def _first_sentence(text: str, limit: int = 160) -> str:
    return _SENTENCE_END.split(" ".join(text.split()), maxsplit=1)[0][:limit]


class Seeder:
    """Message texts come from a fixed pool (seeded), so 100,000 messages cost little to make."""

    def __init__(
        self, *, window_size: int, summarize_after_seq: int, history: bool, pool_size: int = 512
    ) -> None:
        self.window_size = window_size
        self.summarize_after_seq = summarize_after_seq
        self.history = history
        rng = rng_for("bench-seed-pool")
        self._texts = {role: [message(rng, role) for _ in range(pool_size)] for role in ("user", "assistant")}
        self._firsts = {role: [_first_sentence(t) for t in texts] for role, texts in self._texts.items()}
        self._pool_size = pool_size

    def _pick(self, conv_index: int, seq: int) -> tuple[str, int]:
        role = "user" if seq % 2 == 0 else "assistant"
        return role, (seq * 7919 + conv_index * 104_729) % self._pool_size

    def _memory_text(self, conv_index: int, start: int, end: int) -> str:
        lines = []
        for seq in range(start, end + 1):
            role, pick = self._pick(conv_index, seq)
            lines.append(f"#{seq} {role}: {self._firsts[role][pick]}")
        return "\n".join(lines)

    def memory_ends(self, seed: ConversationSeed) -> list[int]:
        last = seed.messages - 1 - seed.gap
        if last < self.summarize_after_seq:
            return []
        if not self.history:
            return [last]
        # One completed summary per round from the trigger on, as the policy produces them.
        first = self.summarize_after_seq if self.summarize_after_seq % 2 else self.summarize_after_seq + 1
        ends = list(range(first, last + 1, 2))
        if not ends or ends[-1] != last:
            ends.append(last)
        return ends

    async def seed(
        self, conn: asyncpg.Connection, conversations: Sequence[ConversationSeed]
    ) -> dict[str, int]:
        now = dt.datetime.now(dt.UTC)
        step = dt.timedelta(seconds=5)
        conv_rows: list[tuple[Any, ...]] = []
        msg_rows: list[tuple[Any, ...]] = []
        plans: list[tuple[int, ConversationSeed, list[int], dt.datetime]] = []
        for index, seed in enumerate(conversations):
            t0 = now - step * (seed.messages + 1)
            conv_rows.append((seed.conversation_id, "default", t0, "{}", seed.messages))
            for seq in range(seed.messages):
                role, pick = self._pick(index, seq)
                msg_rows.append((seed.conversation_id, seq, role, self._texts[role][pick], t0 + step * seq))
            plans.append((index, seed, self.memory_ends(seed), t0))
        total_memories = sum(len(ends) for _, _, ends, _ in plans)
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
        for index, seed, ends, t0 in plans:
            base: int | None = None
            for end in ends:
                memory_id = next(id_iter)
                start, _ = window(end, self.window_size)
                created = t0 + step * end + dt.timedelta(milliseconds=50)
                mem_rows.append(
                    (
                        memory_id,
                        seed.conversation_id,
                        self._memory_text(index, start, end),
                        start,
                        end,
                        base,
                        "completed",
                        created,
                        1200,
                        created + dt.timedelta(milliseconds=1200),
                        None,
                        1,
                        None,
                    )
                )
                base = memory_id
        async with conn.transaction():
            await conn.copy_records_to_table(
                "conversations",
                records=conv_rows,
                columns=["conversation_id", "tenant_id", "created_at", "metadata", "next_sequence"],
            )
            await conn.copy_records_to_table(
                "messages",
                records=msg_rows,
                columns=["conversation_id", "sequence", "role", "content", "created_at"],
            )
            if mem_rows:
                await conn.copy_records_to_table(
                    "memory",
                    records=mem_rows,
                    columns=[
                        "memory_id",
                        "conversation_id",
                        "memory_text",
                        "start_sequence",
                        "end_sequence",
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
