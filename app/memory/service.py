"""MemoryService: the rules. Stores rounds, decides (through the policy) when to summarize,
runs summaries in the background and serves the context. SQL lives in app.repositories."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.errors import Conflict, NotFound
from app.memory.policy import MemoryPolicy
from app.memory.runner import SummaryRunner
from app.memory.summarizers import Summarizer, SummaryRequest
from app.repositories import conversations, idempotency, memory, messages

logger = logging.getLogger("app.memory")


@dataclass(frozen=True, slots=True)
class AppendResult:
    body: dict[str, Any]
    replayed: bool


def _memory_started(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {
        k: row[k]
        for k in (
            "memory_id",
            "start_sequence",
            "end_sequence",
            "base_memory_id",
            "status",
            "created_at",
        )
    }


class MemoryService:
    def __init__(
        self,
        *,
        engine: AsyncEngine,
        read_pool: asyncpg.Pool,
        policy: MemoryPolicy,
        summarizer: Summarizer,
        lease_seconds: float,
        idempotency_ttl_hours: float,
        catch_up_on_completion: bool,
        max_concurrent: int,
        max_pending: int,
        maintenance_interval: float,
    ) -> None:
        self.engine = engine
        self.read_pool = read_pool
        self.policy = policy
        self.summarizer = summarizer
        self.lease_seconds = lease_seconds
        self.idempotency_ttl_hours = idempotency_ttl_hours
        self.catch_up_on_completion = catch_up_on_completion
        self.runner = SummaryRunner(
            work=self.summarize,
            maintenance=self.maintain,
            max_concurrent=max_concurrent,
            max_pending=max_pending,
            maintenance_interval=min(maintenance_interval, lease_seconds / 3),
        )

    # ---- write path -------------------------------------------------------------------

    async def append_messages(
        self,
        *,
        tenant_id: str,
        conversation_id: str,
        items: Sequence[tuple[str, str]],
        metadata: dict[str, Any] | None,
        idempotency_key: str | None,
    ) -> AppendResult:
        """Store a round atomically, then start a summary when the policy says so.

        Everything happens in one transaction: the sequence range, the messages, the
        idempotency record and the 'processing' row commit together or not at all. The task is
        scheduled only after commit, so it always finds its row.
        """
        # (key, hash of the body), computed only when the client sent a key.
        idempotency_pair = (
            None
            if idempotency_key is None
            else (
                idempotency_key,
                hashlib.sha256(
                    orjson.dumps({"items": list(items), "metadata": metadata}, option=orjson.OPT_SORT_KEYS)
                ).hexdigest(),
            )
        )
        async with self.engine.begin() as conn:
            allocated = await conversations.allocate_sequences(
                conn,
                conversation_id=conversation_id,
                tenant_id=tenant_id,
                count=len(items),
                metadata=metadata,
            )
            if allocated is None:
                raise NotFound(f"conversation {conversation_id!r} not found")
            first_sequence, created = allocated
            if idempotency_pair is not None:
                stored = await idempotency.get(conn, conversation_id=conversation_id, key=idempotency_pair[0])
                if stored is not None:
                    await conn.rollback()  # give back the sequence range reserved above
                    if stored["request_hash"] != idempotency_pair[1]:
                        raise Conflict("Idempotency-Key was already used with a different request body")
                    return AppendResult(body=stored["response"], replayed=True)
            stored_messages = await messages.insert_many(
                conn,
                conversation_id=conversation_id,
                first_sequence=first_sequence,
                items=items,
            )
            started = await self._maybe_start_summary(
                conn,
                conversation_id=conversation_id,
                last_saved_seq=first_sequence + len(items) - 1,
            )
            body = {
                "conversation_id": conversation_id,
                "created": created,
                "messages": stored_messages,
                "memory": _memory_started(started),
            }
            if idempotency_pair is not None:
                await idempotency.put(
                    conn,
                    conversation_id=conversation_id,
                    key=idempotency_pair[0],
                    request_hash=idempotency_pair[1],
                    response=body,
                )
        if started is not None:
            self.runner.submit(started["memory_id"])
        return AppendResult(body=body, replayed=False)

    async def _maybe_start_summary(
        self, conn: AsyncConnection, *, conversation_id: str, last_saved_seq: int
    ) -> dict[str, Any] | None:
        latest = await memory.latest_completed(conn, conversation_id=conversation_id)
        plan = self.policy.plan(last_saved_seq=last_saved_seq, latest_completed=latest)
        if plan is None:
            if latest is not None and latest.end_sequence >= last_saved_seq:
                logger.debug("No new messages to summarize for %s", conversation_id)
            return None
        if not self.runner.has_capacity():
            logger.warning(
                "Summary queue full (%d running, %d waiting); not starting one for %s",
                self.runner.running,
                self.runner.waiting,
                conversation_id,
            )
            return None
        row = await memory.insert_processing(
            conn,
            conversation_id=conversation_id,
            start_sequence=plan.start_sequence,
            end_sequence=plan.end_sequence,
            base_memory_id=plan.base_memory_id,
            lease_seconds=self.lease_seconds,
        )
        if row is None:
            logger.debug("Summarization already in progress for %s", conversation_id)
        return row

    # ---- background summary -------------------------------------------------------------

    async def summarize(self, memory_id: int) -> None:
        """Seed 004's do_summarization for one 'processing' row; never raises."""
        started = time.perf_counter()
        try:
            async with self.engine.connect() as conn:
                row = await memory.get(conn, memory_id=memory_id)
                if row is None or row["status"] != "processing":
                    return  # deleted with its conversation, or reaped meanwhile
                base = (
                    await memory.get(conn, memory_id=row["base_memory_id"])
                    if row["base_memory_id"] is not None
                    else None
                )
                start = row["start_sequence"]
                if base is not None:
                    # Incremental: only the messages after the base memory, within the window.
                    start = max(start, base["end_sequence"] + 1)
                new_messages = await messages.between(
                    conn,
                    conversation_id=row["conversation_id"],
                    start=start,
                    end=row["end_sequence"],
                )
            if row["start_sequence"] > 0:
                logger.info(
                    "Sliding window: dropping seq 0-%d for %s",
                    row["start_sequence"] - 1,
                    row["conversation_id"],
                )
            text = await self.summarizer.summarize(
                SummaryRequest(
                    conversation_id=row["conversation_id"],
                    window_start=row["start_sequence"],
                    window_end=row["end_sequence"],
                    previous_summary=base["memory_text"] if base else None,
                    previous_end=base["end_sequence"] if base else None,
                    new_messages=new_messages,
                )
            )
            if not text.strip():
                raise ValueError("the summarizer returned an empty summary")
            elapsed_ms = int((time.perf_counter() - started) * 1000)
            async with self.engine.begin() as conn:
                done = await memory.complete(
                    conn, memory_id=memory_id, memory_text=text, generation_time_ms=elapsed_ms
                )
            if done:
                logger.info(
                    "Summarized messages %d-%d for %s in %dms",
                    row["start_sequence"],
                    row["end_sequence"],
                    row["conversation_id"],
                    elapsed_ms,
                )
                logger.debug("Memory %d status updated to completed", memory_id)
                if self.catch_up_on_completion:
                    await self._catch_up(row["conversation_id"])
            else:
                logger.info("Memory %d was reaped or deleted meanwhile; result dropped", memory_id)
        except asyncio.CancelledError:
            await self._mark_failed(memory_id, "interrupted by shutdown", started)
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            logger.warning("Summary %d failed: %s", memory_id, reason)
            await self._mark_failed(memory_id, reason, started)

    async def _catch_up(self, conversation_id: str) -> None:
        """Ask the policy again now that a summary completed: rounds stored while it ran would
        otherwise wait for the next POST, and a conversation that went quiet would keep a
        growing gap."""
        async with self.engine.begin() as conn:
            last = await conversations.last_sequence(conn, conversation_id=conversation_id)
            started = (
                None
                if last is None
                else await self._maybe_start_summary(
                    conn, conversation_id=conversation_id, last_saved_seq=last
                )
            )
        if started is not None:
            self.runner.submit(started["memory_id"])

    async def _mark_failed(self, memory_id: int, reason: str, started: float) -> None:
        elapsed_ms = int((time.perf_counter() - started) * 1000)
        try:
            async with self.engine.begin() as conn:
                if await memory.fail(conn, memory_id=memory_id, error=reason, generation_time_ms=elapsed_ms):
                    logger.debug("Memory %d status updated to failed", memory_id)
        except Exception:
            # The database is unreachable: the lease expires and a reaper fails the row.
            logger.warning("Could not mark memory %d failed; leaving it to the reaper", memory_id)

    async def maintain(self, owned: list[int]) -> None:
        """Renew the leases of our rows, fail rows whose worker died, expire idempotency keys."""
        async with self.engine.begin() as conn:
            if owned:
                await memory.renew_leases(conn, memory_ids=owned, lease_seconds=self.lease_seconds)
            for row in await memory.reap_expired(conn):
                logger.warning(
                    "Reaped memory %d (%d-%d) of %s: lease expired",
                    row["memory_id"],
                    row["start_sequence"],
                    row["end_sequence"],
                    row["conversation_id"],
                )
            await idempotency.expire(conn, older_than_hours=self.idempotency_ttl_hours)

    # ---- read path ----------------------------------------------------------------------

    async def get_context_json(self, *, tenant_id: str, conversation_id: str) -> str:
        """The latest completed memory plus the gap after it, as the response's JSON text;
        never waits on a summary."""
        found = await memory.context_json(
            self.read_pool, conversation_id=conversation_id, tenant_id=tenant_id
        )
        if found is None:
            raise NotFound(f"conversation {conversation_id!r} not found")
        return found

    async def list_memories(self, *, tenant_id: str, conversation_id: str) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            await self._require(conn, tenant_id=tenant_id, conversation_id=conversation_id)
            return await memory.chain(conn, conversation_id=conversation_id)

    async def list_messages(
        self, *, tenant_id: str, conversation_id: str, after_sequence: int, limit: int
    ) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            await self._require(conn, tenant_id=tenant_id, conversation_id=conversation_id)
            return await messages.page(
                conn, conversation_id=conversation_id, after_sequence=after_sequence, limit=limit
            )

    async def get_conversation(self, *, tenant_id: str, conversation_id: str) -> dict[str, Any]:
        async with self.engine.connect() as conn:
            found = await conversations.get(conn, conversation_id=conversation_id, tenant_id=tenant_id)
        if found is None:
            raise NotFound(f"conversation {conversation_id!r} not found")
        return found

    async def list_conversations(
        self, *, tenant_id: str, after: str | None, limit: int
    ) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await conversations.list_page(conn, tenant_id=tenant_id, after=after, limit=limit)

    async def delete_conversation(self, *, tenant_id: str, conversation_id: str) -> None:
        """Delete a conversation; a summary still running for it finds its row gone and stops."""
        async with self.engine.begin() as conn:
            if not await conversations.delete(conn, conversation_id=conversation_id, tenant_id=tenant_id):
                raise NotFound(f"conversation {conversation_id!r} not found")

    async def _require(self, conn: AsyncConnection, *, tenant_id: str, conversation_id: str) -> None:
        if not await conversations.exists(conn, conversation_id=conversation_id, tenant_id=tenant_id):
            raise NotFound(f"conversation {conversation_id!r} not found")

    # ---- ops ----------------------------------------------------------------------------

    async def summarize_now(self, *, tenant_id: str, conversation_id: str) -> dict[str, Any]:
        """Start a summary over the window ending at the newest message, whatever the trigger
        threshold says. 409 when one is already running or there is nothing new."""
        async with self.engine.begin() as conn:
            found = await conversations.get(conn, conversation_id=conversation_id, tenant_id=tenant_id)
            if found is None:
                raise NotFound(f"conversation {conversation_id!r} not found")
            last = found["message_count"] - 1
            latest = await memory.latest_completed(conn, conversation_id=conversation_id)
            if last < 0 or (latest is not None and latest.end_sequence >= last):
                raise Conflict("nothing new to summarize: the latest memory covers every message")
            if not self.runner.has_capacity():
                raise Conflict("the summary queue is full; try again later")
            window = self.policy.plan(last_saved_seq=last, latest_completed=latest)
            start = window.start_sequence if window else 0
            row = await memory.insert_processing(
                conn,
                conversation_id=conversation_id,
                start_sequence=start,
                end_sequence=last,
                base_memory_id=latest.memory_id if latest else None,
                lease_seconds=self.lease_seconds,
            )
            if row is None:
                raise Conflict("a summary is already processing for this conversation")
        self.runner.submit(row["memory_id"])
        started = _memory_started(row)
        assert started is not None
        return started

    async def retry_memory(self, *, tenant_id: str, memory_id: int) -> dict[str, Any]:
        """Run a failed memory again (same window and base)."""
        if not self.runner.has_capacity():
            raise Conflict("the summary queue is full; try again later")
        async with self.engine.begin() as conn:
            row = await memory.restart_failed(
                conn, memory_id=memory_id, tenant_id=tenant_id, lease_seconds=self.lease_seconds
            )
        if row is None:
            raise NotFound(f"memory {memory_id} not found")
        if row == "busy":
            raise Conflict("a summary is already processing for this conversation")
        if isinstance(row, str):
            raise Conflict(f"memory {memory_id} is {row}; only failed memories can be retried")
        assert isinstance(row, dict)
        self.runner.submit(row["memory_id"])
        started = _memory_started(row)
        assert started is not None
        return started

    async def stuck(self, *, tenant_id: str, older_than_seconds: float) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await memory.stuck(conn, tenant_id=tenant_id, older_than_seconds=older_than_seconds)

    async def failures(self, *, tenant_id: str, limit: int) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await memory.failures(conn, tenant_id=tenant_id, limit=limit)

    async def window_progression(self, *, tenant_id: str, limit: int) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await memory.window_progression(conn, tenant_id=tenant_id, limit=limit)

    async def generation_stats(self, *, tenant_id: str) -> dict[str, Any]:
        async with self.engine.connect() as conn:
            return await memory.generation_stats(conn, tenant_id=tenant_id)
