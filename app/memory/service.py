"""MemoryService: the rules. Stores rounds, asks the conversation's policy when to summarize,
runs summaries in the background and serves the context. SQL lives in app.repositories; what
each policy decides lives in app.memory.policies, and nothing here names a policy."""

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

from app.db import describe_db_error, is_database_error
from app.errors import Conflict, NotFound, PayloadTooLarge
from app.memory.breaker import CircuitBreaker
from app.memory.llm import ChatModel
from app.memory.policies import (
    MemoryPolicy,
    ParameterDefaults,
    PolicyConfig,
    build_policy,
    load_policy,
    policy_dump,
    resolve,
)
from app.memory.runner import RUN_LIMIT_MARGIN_SECONDS, SummaryRunner
from app.memory.types import ConversationState, SummaryJob, SummaryPlan, Trigger
from app.repositories import conversations, idempotency, memory, messages
from app.repositories.memory import Backoff
from app.repositories.messages import NewMessage

logger = logging.getLogger("app.memory")


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what one conversation can make the service store or return."""

    max_context_messages: int
    max_context_bytes: int
    max_page_bytes: int
    max_metadata_bytes: int
    max_metadata_keys: int


@dataclass(frozen=True, slots=True)
class AppendResult:
    body: dict[str, Any]
    replayed: bool


def _memory_started(row: dict[str, Any]) -> dict[str, Any]:
    return {
        k: row[k]
        for k in (
            "memory_id",
            "kind",
            "start_sequence",
            "end_sequence",
            "start_round",
            "end_round",
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
        model: ChatModel | None,
        default_policy: PolicyConfig,
        parameter_defaults: ParameterDefaults,
        summary_max_chars: int,
        limits: Limits,
        backoff: Backoff,
        breaker: CircuitBreaker,
        lease_seconds: float,
        idempotency_ttl_hours: float,
        max_concurrent: int,
        max_pending: int,
        maintenance_interval: float,
    ) -> None:
        self.engine = engine
        self.read_pool = read_pool
        self.model = model
        self.parameter_defaults = parameter_defaults
        self.default_policy = build_policy(resolve(default_policy, parameter_defaults))
        self.default_policy_json = policy_dump(self.default_policy.config)
        self.summary_max_chars = summary_max_chars
        self.limits = limits
        self.backoff = backoff
        self.breaker = breaker
        self.lease_seconds = lease_seconds
        self.idempotency_ttl_hours = idempotency_ttl_hours
        self.runner = SummaryRunner(
            work=self.summarize,
            maintenance=self.maintain,
            max_concurrent=max_concurrent,
            max_pending=max_pending,
            maintenance_interval=min(maintenance_interval, lease_seconds / 3),
            # Past the model call's own bound a summary can only be wedged: stop renewing its
            # lease so that any replica's reaper fails it.
            max_run_seconds=(model.call_timeout_seconds if model is not None else 0.0)
            + RUN_LIMIT_MARGIN_SECONDS,
        )

    @property
    def summarizer_name(self) -> str:
        return self.model.name if self.model is not None else "offline"

    # ---- conversations ------------------------------------------------------------------

    async def create_conversation(
        self,
        *,
        tenant_id: str,
        conversation_id: str,
        memory_policy: PolicyConfig | None,
        metadata: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """Create an empty conversation with its policy resolved (every parameter filled in from
        the request, else the deployment defaults); 409 when the id is taken."""
        policy = (
            self.default_policy
            if memory_policy is None
            else build_policy(resolve(memory_policy, self.parameter_defaults))
        )
        async with self.engine.begin() as conn:
            row = await conversations.create(
                conn,
                conversation_id=conversation_id,
                tenant_id=tenant_id,
                metadata=metadata,
                memory_policy=policy_dump(policy.config),
                context=policy.context,
            )
            if row is None:
                raise Conflict(f"conversation {conversation_id!r} already exists")
            self._check_metadata(row.pop("metadata_bytes"), row.pop("metadata_keys"))
        return row

    def _check_metadata(self, size: int, keys: int) -> None:
        """Raised inside the writing transaction, so nothing of the request is stored."""
        if size > self.limits.max_metadata_bytes:
            raise PayloadTooLarge(
                f"the conversation's metadata would be {size} bytes; the limit is "
                f"{self.limits.max_metadata_bytes} (MEMORY_MAX_METADATA_BYTES)"
            )
        if keys > self.limits.max_metadata_keys:
            raise PayloadTooLarge(
                f"the conversation's metadata would have {keys} keys; the limit is "
                f"{self.limits.max_metadata_keys} (MEMORY_MAX_METADATA_KEYS)"
            )

    # ---- write path -------------------------------------------------------------------

    async def append_messages(
        self,
        *,
        tenant_id: str,
        conversation_id: str,
        items: Sequence[NewMessage],
        metadata: dict[str, Any] | None,
        idempotency_key: str | None,
    ) -> AppendResult:
        """Store a round atomically, then start a summary when the conversation's policy says so.

        Everything happens in one transaction: the round and its sequence range, the messages,
        the idempotency record and the 'processing' row commit together or not at all. The task
        is scheduled only after commit, so it always finds its row.
        """
        # (key, hash of the body), computed only when the client sent a key.
        idempotency_pair = (
            None
            if idempotency_key is None
            else (
                idempotency_key,
                hashlib.sha256(
                    orjson.dumps(
                        {"items": [[m.role, m.content, m.metadata] for m in items], "metadata": metadata},
                        option=orjson.OPT_SORT_KEYS,
                    )
                ).hexdigest(),
            )
        )
        async with self.engine.begin() as conn:
            allocated = await conversations.allocate_round(
                conn,
                conversation_id=conversation_id,
                tenant_id=tenant_id,
                count=len(items),
                metadata=metadata,
                default_policy=self.default_policy_json,
                default_context=self.default_policy.context,
            )
            if allocated is None:
                raise NotFound(f"conversation {conversation_id!r} not found")
            self._check_metadata(allocated.metadata_bytes, allocated.metadata_keys)
            if idempotency_pair is not None:
                stored = await idempotency.get(conn, conversation_id=conversation_id, key=idempotency_pair[0])
                if stored is not None:
                    await conn.rollback()  # give back the round and sequence range reserved above
                    if stored["request_hash"] != idempotency_pair[1]:
                        raise Conflict("Idempotency-Key was already used with a different request body")
                    return AppendResult(body=stored["response"], replayed=True)
            stored_messages = await messages.insert_round(
                conn,
                conversation_id=conversation_id,
                round=allocated.round,
                first_sequence=allocated.first_sequence,
                items=items,
            )
            _, _, plan = await self._plan(
                conn,
                conversation_id=conversation_id,
                stored_policy=allocated.memory_policy,
                last_sequence=allocated.first_sequence + len(items) - 1,
                last_round=allocated.round,
                trigger=Trigger.ROUND_END,
            )
            started = await self._start(
                conn,
                tenant_id=tenant_id,
                conversation_id=conversation_id,
                plan=plan,
                backing_off=allocated.backing_off,
            )
            body = {
                "conversation_id": conversation_id,
                "created": allocated.created,
                "round": allocated.round,
                "messages": stored_messages,
                "memory": None if started is None else _memory_started(started),
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
            self.runner.submit(started["memory_id"], tenant_id)
        return AppendResult(body=body, replayed=False)

    async def _plan(
        self,
        conn: AsyncConnection,
        *,
        conversation_id: str,
        stored_policy: dict[str, Any],
        last_sequence: int,
        last_round: int,
        trigger: Trigger,
    ) -> tuple[MemoryPolicy, ConversationState, SummaryPlan | None]:
        """Ask the conversation's policy which summary is due, given what it observes now."""
        policy = load_policy(stored_policy)
        state = await self._observe(
            conn,
            conversation_id=conversation_id,
            policy=policy,
            last_sequence=last_sequence,
            last_round=last_round,
        )
        return policy, state, policy.plan(state, trigger)

    async def _observe(
        self,
        conn: AsyncConnection,
        *,
        conversation_id: str,
        policy: MemoryPolicy,
        last_sequence: int,
        last_round: int,
    ) -> ConversationState:
        """What the policy may see, read in the caller's transaction."""
        latest, newest = await memory.newest_refs(conn, conversation_id=conversation_id)
        starts = (
            await messages.round_starts(
                conn,
                conversation_id=conversation_id,
                lookback=policy.lookback_messages,
                last_sequence=last_sequence,
            )
            if policy.lookback_messages > 0
            else ()
        )
        return ConversationState(
            last_sequence=last_sequence,
            last_round=last_round,
            latest_completed=latest,
            newest=newest,
            round_starts=starts,
        )

    async def _start(
        self,
        conn: AsyncConnection,
        *,
        tenant_id: str,
        conversation_id: str,
        plan: SummaryPlan | None,
        backing_off: bool,
    ) -> dict[str, Any] | None:
        """Insert the plan's 'processing' row (to submit after commit), unless there is no plan,
        the conversation is backing off after failures, the model's circuit is open, the runner
        is full, or another summary of the conversation is processing."""
        if plan is None:
            logger.debug("No new messages to summarize for %s", conversation_id)
            return None
        if backing_off:
            logger.debug("Summaries of %s are backing off after failures", conversation_id)
            return None
        if self.model is not None and not self.breaker.allow():
            logger.debug("The model's circuit is open; not starting a summary for %s", conversation_id)
            return None
        if not self.runner.has_capacity(tenant_id):
            logger.warning(
                "Summary queue full (%d running, %d waiting); not starting one for %s",
                self.runner.running,
                self.runner.waiting,
                conversation_id,
            )
            return None
        row = await memory.insert_processing(
            conn, conversation_id=conversation_id, plan=plan, lease_seconds=self.lease_seconds
        )
        if row is None:
            logger.debug("Summarization already in progress for %s", conversation_id)
        return row

    # ---- background summary -------------------------------------------------------------

    async def summarize(self, memory_id: int) -> None:
        """Seed 004's do_summarization, for a row of any policy; never raises."""
        started = time.perf_counter()
        try:
            async with self.engine.connect() as conn:
                row = await memory.get(conn, memory_id=memory_id)
                if row is None or row["status"] != "processing":
                    return  # deleted with its conversation, or reaped meanwhile
                conversation_id = row["conversation_id"]
                position = await conversations.position(conn, conversation_id=conversation_id)
                if position is None:
                    return  # deleted meanwhile
                base = (
                    await memory.get(conn, memory_id=row["base_memory_id"])
                    if row["base_memory_id"] is not None
                    else None
                )
                new_messages = await messages.between(
                    conn,
                    conversation_id=conversation_id,
                    start=row["input_start_sequence"],
                    end=row["end_sequence"],
                )
            policy = load_policy(position.memory_policy)
            job = SummaryJob(
                memory_id=memory_id,
                conversation_id=conversation_id,
                kind=row["kind"],
                start_sequence=row["start_sequence"],
                end_sequence=row["end_sequence"],
                start_round=row["start_round"],
                end_round=row["end_round"],
                base_text=base["memory_text"] if base else None,
                base_end_sequence=base["end_sequence"] if base else None,
                messages=tuple(new_messages),
                max_chars=self.summary_max_chars,
            )
            if base is not None and row["start_sequence"] > 0:
                logger.info(
                    "Sliding window: dropping seq 0-%d for %s", row["start_sequence"] - 1, conversation_id
                )
            if self.model is None:
                text = policy.fallback(job)
            else:
                try:
                    text = await self.model.summarize(policy.prompt(job), job)
                except Exception:
                    self.breaker.record_failure()
                    raise
                self.breaker.record_success()
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
                    conversation_id,
                    elapsed_ms,
                )
                logger.debug("Memory %d status updated to completed", memory_id)
                await self._after_completion(conversation_id)
            else:
                logger.info("Memory %d was reaped or deleted meanwhile; result dropped", memory_id)
        except asyncio.CancelledError:
            # Not the conversation's fault: its failure streak is left alone.
            await self._mark_failed(memory_id, "interrupted by shutdown", started, backoff=None)
            raise
        except Exception as exc:
            # A database error's message may quote parameter values (message content).
            reason = describe_db_error(exc) if is_database_error(exc) else f"{type(exc).__name__}: {exc}"
            logger.warning("Summary %d failed: %s", memory_id, reason)
            await self._mark_failed(memory_id, reason, started, backoff=self.backoff)

    async def _after_completion(self, conversation_id: str) -> None:
        """Ask the policy again now that a summary completed (trigger 'completed'): rounds stored
        while it ran would otherwise wait for the next POST (a block boundary passed meanwhile,
        or a sliding window with catch-up on)."""
        async with self.engine.begin() as conn:
            position = await conversations.position(conn, conversation_id=conversation_id)
            if position is None or position.last_sequence < 0:
                return
            _, _, plan = await self._plan(
                conn,
                conversation_id=conversation_id,
                stored_policy=position.memory_policy,
                last_sequence=position.last_sequence,
                last_round=position.last_round,
                trigger=Trigger.COMPLETED,
            )
            started = await self._start(
                conn,
                tenant_id=position.tenant_id,
                conversation_id=conversation_id,
                plan=plan,
                backing_off=position.backing_off,
            )
        if started is not None:
            self.runner.submit(started["memory_id"], position.tenant_id)

    async def _mark_failed(
        self, memory_id: int, reason: str, started: float, *, backoff: Backoff | None
    ) -> None:
        elapsed_ms = int((time.perf_counter() - started) * 1000)
        try:
            async with self.engine.begin() as conn:
                if await memory.fail(
                    conn, memory_id=memory_id, error=reason, generation_time_ms=elapsed_ms, backoff=backoff
                ):
                    logger.debug("Memory %d status updated to failed", memory_id)
        except Exception:
            # The database is unreachable: the lease expires and a reaper fails the row.
            logger.warning("Could not mark memory %d failed; leaving it to the reaper", memory_id)

    async def maintain(self, owned: list[int]) -> None:
        """Renew the leases of our rows, fail rows whose worker died, expire idempotency keys."""
        async with self.engine.begin() as conn:
            if owned:
                await memory.renew_leases(conn, memory_ids=owned, lease_seconds=self.lease_seconds)
            for row in await memory.reap_expired(conn, backoff=self.backoff):
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
        """The summaries the policy shows plus the raw part, as the response's JSON text; never
        waits on a summary."""
        found = await memory.context_json(
            self.read_pool,
            conversation_id=conversation_id,
            tenant_id=tenant_id,
            max_messages=self.limits.max_context_messages,
            max_bytes=self.limits.max_context_bytes,
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
    ) -> tuple[list[dict[str, Any]], bool]:
        """A page of messages (bounded by count and MEMORY_MAX_PAGE_BYTES) and whether more follow."""
        async with self.engine.connect() as conn:
            await self._require(conn, tenant_id=tenant_id, conversation_id=conversation_id)
            return await messages.page(
                conn,
                conversation_id=conversation_id,
                after_sequence=after_sequence,
                limit=limit,
                max_bytes=self.limits.max_page_bytes,
            )

    async def get_conversation(self, *, tenant_id: str, conversation_id: str) -> dict[str, Any]:
        async with self.engine.connect() as conn:
            found = await conversations.get(conn, conversation_id=conversation_id, tenant_id=tenant_id)
        if found is None:
            raise NotFound(f"conversation {conversation_id!r} not found")
        return found

    async def list_conversations(
        self, *, tenant_id: str, after: str | None, limit: int, include_metadata: bool
    ) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await conversations.list_page(
                conn, tenant_id=tenant_id, after=after, limit=limit, include_metadata=include_metadata
            )

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
        """Start the summary the policy makes on request (trigger 'manual'): for the sliding
        window, the window ending at the newest message whatever the threshold says. 409 when one
        is already running or the policy has nothing to summarize."""
        async with self.engine.begin() as conn:
            position = await conversations.position(
                conn, conversation_id=conversation_id, tenant_id=tenant_id
            )
            if position is None:
                raise NotFound(f"conversation {conversation_id!r} not found")
            if position.last_sequence < 0:
                raise Conflict("nothing to summarize: the conversation has no messages")
            policy, state, plan = await self._plan(
                conn,
                conversation_id=conversation_id,
                stored_policy=position.memory_policy,
                last_sequence=position.last_sequence,
                last_round=position.last_round,
                trigger=Trigger.MANUAL,
            )
            if plan is None:
                raise Conflict(policy.nothing_due(state))
            if not self.runner.has_capacity(tenant_id):
                raise Conflict("the summary queue is full; try again later")
            row = await memory.insert_processing(
                conn, conversation_id=conversation_id, plan=plan, lease_seconds=self.lease_seconds
            )
            if row is None:
                raise Conflict("a summary is already processing for this conversation")
        self.runner.submit(row["memory_id"], tenant_id)
        return _memory_started(row)

    async def retry_memory(self, *, tenant_id: str, memory_id: int) -> dict[str, Any]:
        """Run a failed memory again (same window and base)."""
        if not self.runner.has_capacity(tenant_id):
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
        self.runner.submit(row["memory_id"], tenant_id)
        return _memory_started(row)

    async def stuck(self, *, tenant_id: str, older_than_seconds: float) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await memory.stuck(conn, tenant_id=tenant_id, older_than_seconds=older_than_seconds)

    async def failing_conversations(self, *, tenant_id: str, limit: int) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await conversations.failing(conn, tenant_id=tenant_id, limit=limit)

    async def failures(self, *, tenant_id: str, limit: int) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await memory.failures(conn, tenant_id=tenant_id, limit=limit)

    async def window_progression(self, *, tenant_id: str, limit: int) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await memory.window_progression(conn, tenant_id=tenant_id, limit=limit)

    async def generation_stats(self, *, tenant_id: str) -> dict[str, Any]:
        async with self.engine.connect() as conn:
            return await memory.generation_stats(conn, tenant_id=tenant_id)
