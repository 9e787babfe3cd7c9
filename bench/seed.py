"""Bulk seeding with COPY (never through the API): conversations, their messages (two per round,
user then assistant; token_budget conversations: agent rounds with tool calls, see
AgentTranscripts), and the completed memories a real conversation of that length would have
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
from dataclasses import dataclass, field
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
from app.memory.policies.token_budget import FOLD, TokenBudgetConfig
from app.memory.tokens import counter_for
from app.memory.types import ConversationState, MemoryRef, Trigger, Wake
from app.settings import Settings
from bench.textgen import message, rng_for

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")

SLIDING_WINDOW = "sliding_window"
ROLLING_BLOCKS = "rolling_blocks"
TOKEN_BUDGET = "token_budget"
POLICIES = (SLIDING_WINDOW, ROLLING_BLOCKS, TOKEN_BUDGET)
# Scenario 1's conversations: f"{CONTEXT_PREFIXES[policy]}-{messages}".
CONTEXT_PREFIXES = {SLIDING_WINDOW: "ctx", ROLLING_BLOCKS: "blocks", TOKEN_BUDGET: "budget"}
MESSAGES_PER_ROUND = 2  # every seeded round is a user message and the assistant's answer


# The memory columns every seeder fills (COPY); the token_budget seeder adds its token columns.
MEMORY_COLUMNS = (
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
)


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


# ---- token_budget: agent transcripts with their compression and fold summaries -----------------

# A seeded agent round: the user's request, the assistant's two tool calls, their two results
# (a few KB: file contents, search hits), the assistant's answer. Every round closes its calls,
# so each round's first entry is a boundary.
TOKEN_BUDGET_ROUND = ("user", "calls", "result", "result", "answer")
ENTRIES_PER_AGENT_ROUND = len(TOKEN_BUDGET_ROUND)
_AGENT_POOL = 64  # variants of each entry (their tokens are counted once)


@dataclass(frozen=True)
class BudgetMemory:
    kind: str  # compression or fold
    start_sequence: int
    end_sequence: int
    input_tokens: int
    text: str
    tokens: int
    after_round: int  # the round whose POST made it due (its timestamps follow that round)


@dataclass(frozen=True)
class BudgetHistory:
    """A token_budget conversation as the service would have stored it, summaries keeping up."""

    entries: int
    memories: tuple[BudgetMemory, ...]
    shown: tuple[BudgetMemory, ...]  # newest first, what the context shows
    total_tokens: int
    wake: Wake


class AgentTranscripts:
    """Entries of tool-using agents and the token_budget policy's summaries over them, planned by
    the policy's own code (plan() after every round, each summary completing before the next
    round: compressions, and folds once the summaries pass their budget). Token counts are the
    service's (app.memory.tokens, the deployment's model)."""

    def __init__(self, policy: MemoryPolicy, *, model: str, max_chars: int) -> None:
        self.policy = policy
        config = policy.config
        assert isinstance(config, TokenBudgetConfig)
        self.compression_ratio = config.compression_ratio
        self.max_chars = max_chars
        self.counter = counter_for(model)
        rng = rng_for("bench-seed-agent-pool")
        users = [message(rng, "user") for _ in range(_AGENT_POOL)]
        answers = [message(rng, "assistant") for _ in range(_AGENT_POOL)]
        files = [
            "\n".join(f"{i + 1:4d}  {message(rng, 'assistant')}" for i in range(6))
            for _ in range(_AGENT_POOL)
        ]
        self._sentences = [_first_sentence(t) for t in answers]
        self._pool: dict[str, list[tuple[str, int]]] = {}
        self._pool["user"] = [(orjson.dumps(t).decode(), self._count("user", t)) for t in users]
        self._pool["answer"] = [(orjson.dumps(t).decode(), self._count("assistant", t)) for t in answers]
        self._pool["result"] = [(orjson.dumps(t).decode(), self._count("tool", t)) for t in files]
        self._histories: dict[int, BudgetHistory] = {}

    def _count(self, role: str, content: Any, calls: list[dict[str, Any]] | None = None) -> int:
        return self.counter.message({"role": role, "content": content, "tool_calls": calls})

    @staticmethod
    def calls(rnd: int) -> list[dict[str, Any]]:
        return [
            {
                "id": f"call_{rnd}_{i}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": orjson.dumps({"path": f"src/module_{rnd % 97}/{name}_{i}.py"}).decode(),
                },
            }
            for i, name in enumerate(("read_file", "search_code"))
        ]

    def entry(self, seq: int) -> tuple[str, str, str | None, str | None, str | None, int]:
        """(kind, role, content JSON, tool_calls JSON, tool_call_id, tokens) of entry ``seq``."""
        rnd, slot = divmod(seq, ENTRIES_PER_AGENT_ROUND)
        what = TOKEN_BUDGET_ROUND[slot]
        pick = (seq * 7919) % _AGENT_POOL
        if what == "calls":
            calls = self.calls(rnd)
            return (
                "tool_call",
                "assistant",
                None,
                orjson.dumps(calls).decode(),
                None,
                self._count("assistant", None, calls),
            )
        content, tokens = self._pool[what][pick]
        if what == "result":
            return ("tool_result", "tool", content, None, f"call_{rnd}_{slot - 2}", tokens)
        return ("message", "user" if what == "user" else "assistant", content, None, None, tokens)

    def posted(self, seq: int) -> dict[str, Any]:
        """Entry ``seq`` as an agent POSTs it (OpenAI Chat Completions shape)."""
        _, role, content, calls, call_id, _ = self.entry(seq)
        message: dict[str, Any] = {
            "role": role,
            "content": None if content is None else orjson.loads(content),
        }
        if calls is not None:
            message["tool_calls"] = orjson.loads(calls)
        if call_id is not None:
            message["tool_call_id"] = call_id
        return message

    def _summary_text(self, start: int, end: int, target_tokens: int) -> str:
        """A compression as a model answers the policy's prompt: about the target, within the
        service's MEMORY_SUMMARY_MAX_CHARS."""
        limit = min(self.max_chars, 4 * target_tokens)
        lines = [f"Entries #{start}-#{end}: the agent read and searched files, then answered."]
        k = start
        while sum(len(x) + 1 for x in lines) < limit:
            lines.append(self._sentences[(k * 31) % _AGENT_POOL])
            k += 1
        return "\n".join(lines)[:limit]

    def history(self, entries: int) -> BudgetHistory:
        if entries not in self._histories:
            self._histories[entries] = self._simulate(entries)
        return self._histories[entries]

    def _simulate(self, entries: int) -> BudgetHistory:
        """Post the rounds one by one and ask the policy after each, as the service would."""
        per = ENTRIES_PER_AGENT_ROUND
        cumulative = [0]  # cumulative[s] = tokens of the entries before s
        for seq in range(entries):
            cumulative.append(cumulative[-1] + self.entry(seq)[5])
        memories: list[BudgetMemory] = []
        shown: list[tuple[MemoryRef, BudgetMemory]] = []  # newest first
        latest: MemoryRef | None = None
        lookback = self.policy.lookback_messages

        def state(last_seq: int) -> ConversationState:
            lowest = last_seq - lookback + 1
            first = max(0, lowest - lowest % per) if lowest > 0 else 0
            starts = tuple((s // per, s) for s in range(first, last_seq + 1, per))
            return ConversationState(
                last_sequence=last_seq,
                last_round=last_seq // per,
                latest_completed=latest,
                newest=latest,
                round_starts=starts,
                total_tokens=cumulative[last_seq + 1],
                covered_tokens=0 if latest is None else cumulative[latest.end_sequence + 1],
                shown=tuple(ref for ref, _ in shown),
            )

        last_seq = -1
        for rnd in range(-(-entries // per)):
            last_seq = min(entries, (rnd + 1) * per) - 1
            while (plan := self.policy.plan(state(last_seq), Trigger.ROUND_END)) is not None:
                start, end = plan.start_round * per, min(last_seq, plan.end_round * per + per - 1)
                input_tokens = cumulative[end + 1] - cumulative[start]
                if plan.kind == FOLD:
                    # as the service's job sees them: the shown summaries it folds, oldest first
                    folded = [
                        m
                        for ref, m in reversed(shown)
                        if ref.start_sequence >= start and ref.end_sequence <= end
                    ]
                    text = "\n".join(m.text for m in folded)[-self.max_chars :]
                else:
                    # TokenBudgetPolicy.target_tokens: compression_ratio of what it covers
                    target = max(50, int(input_tokens * self.compression_ratio))
                    text = self._summary_text(start, end, target)
                made = BudgetMemory(plan.kind, start, end, input_tokens, text, self.counter.count(text), rnd)
                ref = MemoryRef(
                    memory_id=len(memories),
                    kind=plan.kind,
                    status="completed",
                    start_sequence=start,
                    end_sequence=end,
                    start_round=plan.start_round,
                    end_round=plan.end_round,
                    tokens=made.tokens,
                )
                memories.append(made)
                if plan.kind == FOLD:
                    shown = [shown[0], (ref, made)]
                else:
                    shown = [(ref, made), *shown]
                    latest = ref
        final = state(last_seq)
        return BudgetHistory(
            entries=entries,
            memories=tuple(memories),
            shown=tuple(m for _, m in shown),
            total_tokens=cumulative[entries],
            wake=self.policy.wake(final),
        )


class Seeder:
    """Message texts come from a fixed pool (seeded), so 100,000 messages cost little to make."""

    def __init__(
        self,
        *,
        policy_defaults: ParameterDefaults,
        history: bool,
        max_chars: int = 4000,
        pool_size: int = 512,
        model: str = Settings.model_fields["MEMORY_MODEL"].default,
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
        self.agents = AgentTranscripts(self.policies[TOKEN_BUDGET], model=model, max_chars=max_chars)

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
        if seed.policy == TOKEN_BUDGET:
            budget = self.agents.history(seed.messages)
            newest = budget.shown[0].end_sequence if budget.shown else None
            return {
                "summaries": len(budget.shown),
                "memory_end_sequence": newest,
                "raw_messages": seed.messages - (-1 if newest is None else newest) - 1,
            }
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
        budget = _BudgetRows()
        for index, seed in enumerate(conversations):
            if seed.policy == TOKEN_BUDGET:
                conv_rows.append(self._budget_rows(seed, now, step, budget))
                continue
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
                    wake.tokens,
                    0,
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
                    "wake_tokens",
                    "next_tokens",
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
                    columns=list(MEMORY_COLUMNS),
                )
            await budget.copy(conn)
        return {
            "conversations": len(conv_rows),
            "messages": len(msg_rows) + len(budget.entries),
            "memories": len(mem_rows) + len(budget.memories),
        }

    def _budget_rows(
        self, seed: ConversationSeed, now: dt.datetime, step: dt.timedelta, rows: _BudgetRows
    ) -> tuple[Any, ...]:
        """A token_budget conversation's entries, tool call ids, summaries (``rows``) and its own
        row: running totals and the wake point as the service leaves them."""
        per = ENTRIES_PER_AGENT_ROUND
        history = self.agents.history(seed.messages)
        rounds = -(-seed.messages // per)
        t0 = now - step * (rounds + 1)
        cid = seed.conversation_id
        before = 0
        stamps: list[dt.datetime] = []
        for seq in range(seed.messages):
            kind, role, content, calls, call_id, tokens = self.agents.entry(seq)
            at = t0 + step * (seq // per)
            stamps.append(at)
            size = len(content.encode()) if content is not None else 0
            rows.entries.append(
                (
                    cid,
                    seq,
                    seq // per,
                    role,
                    content,
                    None,
                    size,
                    at,
                    kind,
                    calls,
                    call_id,
                    tokens,
                    before,
                    seq % per == 0,
                )
            )
            if calls is not None:
                rows.calls += [(cid, call["id"], seq) for call in orjson.loads(calls)]
            if call_id is not None:
                rows.results.append((cid, call_id, seq))
            before += tokens
        for memory in history.memories:
            created = t0 + step * memory.after_round + dt.timedelta(milliseconds=50)
            rows.memories.append(
                [
                    cid,
                    memory.kind,
                    memory.text,
                    memory.start_sequence,
                    memory.end_sequence,
                    memory.start_sequence // per,
                    memory.end_sequence // per,
                    memory.start_sequence,
                    None,
                    "completed",
                    created,
                    1200,
                    created + dt.timedelta(milliseconds=1200),
                    None,
                    1,
                    None,
                    memory.tokens,
                    memory.input_tokens,
                    stamps[memory.start_sequence],
                    stamps[memory.end_sequence],
                ]
            )
        assert before == history.total_tokens
        return (
            cid,
            "default",
            t0,
            "{}",
            seed.messages,
            rounds,
            orjson.dumps(self.policy_config(TOKEN_BUDGET)).decode(),
            *self.context_spec(TOKEN_BUDGET),
            history.wake.round,
            history.wake.sequence,
            history.wake.tokens,
            history.total_tokens,
        )


@dataclass
class _BudgetRows:
    """The token_budget conversations' rows, copied after the others'."""

    entries: list[tuple[Any, ...]] = field(default_factory=list)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    results: list[tuple[Any, ...]] = field(default_factory=list)
    memories: list[list[Any]] = field(default_factory=list)

    async def copy(self, conn: asyncpg.Connection) -> None:
        if self.entries:
            await conn.copy_records_to_table(
                "messages",
                records=self.entries,
                columns=[
                    "conversation_id",
                    "sequence",
                    "round",
                    "role",
                    "content",
                    "metadata",
                    "content_bytes",
                    "created_at",
                    "kind",
                    "tool_calls",
                    "tool_call_id",
                    "tokens",
                    "tokens_before",
                    "boundary",
                ],
            )
        if self.calls:
            await conn.copy_records_to_table(
                "tool_calls", records=self.calls, columns=["conversation_id", "call_id", "sequence"]
            )
        if self.results:
            await conn.copy_records_to_table(
                "tool_results", records=self.results, columns=["conversation_id", "call_id", "sequence"]
            )
        if self.memories:
            ids = await conn.fetch(
                "SELECT nextval(pg_get_serial_sequence('memory', 'memory_id')) FROM generate_series(1, $1)",
                len(self.memories),
            )
            records = [
                (memory_id, *row)
                for memory_id, row in zip(sorted(r[0] for r in ids), self.memories, strict=True)
            ]
            await conn.copy_records_to_table(
                "memory",
                records=records,
                columns=[*MEMORY_COLUMNS, "tokens", "input_tokens", "from_at", "to_at"],
            )


async def vacuum_analyze(conn: asyncpg.Connection) -> None:
    """What autovacuum would have done to tables this old: statistics and the visibility map."""
    await conn.execute("VACUUM (ANALYZE) conversations, messages, memory")
