"""MemoryService: the rules. Stores rounds, asks the conversation's policy when to summarize,
runs summaries in the background and serves the context. SQL lives in app.repositories; what
each policy decides lives in app.memory.policies, and nothing here names a policy."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import asyncpg
import orjson
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app import logs, metrics
from app.db import classify_db_error, describe_db_error, is_database_error
from app.errors import Conflict, Invalid, NotFound, PayloadTooLarge
from app.events import EventHub, wait_until
from app.memory import export, formats, user_summary
from app.memory.breaker import CircuitBreaker
from app.memory.llm import ChatModel, EmptySummaryError, LLMCallTimeoutError, LLMRequestError
from app.memory.policies import (
    MemoryPolicy,
    ParameterDefaults,
    PolicyConfig,
    build_policy,
    load_policy,
    parse_config,
    policy_dump,
    renderer,
    resolve,
)
from app.memory.runner import RUN_LIMIT_MARGIN_SECONDS, SummaryRunner
from app.memory.tokens import TokenCounter
from app.memory.transfer import plan_import, renumber
from app.memory.types import ConversationState, MemoryRef, Prompt, SummaryJob, SummaryPlan, Trigger
from app.repositories import (
    conversations,
    events,
    idempotency,
    memory,
    messages,
    rounds,
    statements,
    transfer,
    users,
    webhooks,
    work,
)
from app.repositories.memory import Backoff
from app.repositories.messages import NewMessage
from app.repositories.rounds import Refused
from app.repositories.statements import Db
from app.repositories.work import Locked
from app.schemas import ConversationExport, content_chars
from app.webhooks import new_secret

# Rounds larger than this (characters of content and tool calls) are counted in a thread.
COUNT_IN_THREAD_CHARS = 16_384

# The keys a round's tool calls and results may fail on (app.repositories.rounds).
TOOL_CALL_KEYS = ("pk_tool_calls", "pk_tool_results", "fk_tool_results_conversation_id_tool_calls")
# A round that failed on one of these is run once more (see append_messages).
RETRIED_KEYS = ("pk_idempotency_keys", "pk_events")

# Due conversations a runner plans at once (each holds a pooled connection while it does): a
# whole claim (runner.CLAIM_BATCH). A plan is a few sequential statements, each waiting its turn
# on a busy event loop; planned 8 at a time, a claim of 16 took two plans' time and left a
# worker's slots half empty (bench: 48 -> 60 summaries/s at cap 64, LLM 0.5 s).
CLAIM_PARALLELISM = 16

# How many tenants a runner remembers serving, for its round robin (the least recent is forgotten,
# which only makes it look never served: first in line).
SERVED_TENANTS = 10_000
# How many conversations remember the request id of the round that made their summary due, for
# the summary's log lines when it runs in this process (work claimed elsewhere is forgotten).
DUE_REQUESTS = 10_000

# Archiving: conversations per transaction, and transactions per maintenance tick.
ARCHIVE_BATCH = 500
ARCHIVE_BATCHES = 20
# PostgreSQL's lock_not_available: a lock_timeout expired.
LOCK_NOT_AVAILABLE = "55P03"

# A conversation with no messages and no memory: where a new conversation's wake point comes from.
EMPTY = ConversationState(last_sequence=-1, last_round=-1, latest_completed=None, newest=None)

logger = logging.getLogger("app.memory")


# How long drain() waits before looking again while the database is unavailable.
DRAIN_RETRY_SECONDS = 1.0


class WorkKey(NamedTuple):
    """What a runner runs: a conversation's summary is a memory row, a user's
    cross-conversation summary a user_memory row; the runner knows neither. ``attempt`` is the
    attempt this runner claimed: the row's completion, failure or release names it, so a runner
    whose lease ran out cannot overwrite the next one's work."""

    kind: str
    row_id: int
    attempt: int


MEMORY_WORK = "memory"
USER_WORK = "user_memory"


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what one conversation can make the service store or return."""

    max_context_messages: int
    max_context_bytes: int
    max_page_bytes: int
    max_metadata_bytes: int
    max_metadata_keys: int
    # An import document's entries and memory rows (each), and one entry's content.
    max_import_entries: int = 50_000
    max_message_chars: int = 100_000


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The response body of a stored round (JSON text, built by the database) and whether it is
    the replay of an earlier request with the same Idempotency-Key."""

    body: str
    replayed: bool


@dataclass(frozen=True, slots=True)
class Retries:
    """How failed or abandoned summaries are tried again: each conversation's failure streak
    and each summary's attempts (claims after its runner died) stop at ``max_attempts``."""

    backoff: Backoff
    max_attempts: int


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


def failure_reason(exc: BaseException) -> str:
    """The class of a summary's failure, for metrics (app.metrics.FAILURE_REASONS)."""
    if isinstance(exc, LLMCallTimeoutError) or (isinstance(exc, LLMRequestError) and exc.timed_out):
        return "timeout"
    if isinstance(exc, LLMRequestError):
        return "llm_error"
    if isinstance(exc, EmptySummaryError):
        return "empty"
    if is_database_error(exc) or classify_db_error(exc) is not None:
        return "database"
    return "error"


def unavailable(exc: BaseException) -> bool:
    """Whether a summary's failure says the model or the database was unavailable (timeouts,
    connection errors, 429, 5xx, a misconfigured key or model) rather than that this summary
    cannot be made (a refused request, an empty answer, a bug). Such a failure backs its
    conversation off but keeps it due however long the outage lasts: a quiet conversation still
    gets its summary once the model is back."""
    if isinstance(exc, LLMRequestError):
        return not exc.rejected
    # A database that is unreachable, restarting or busy; not an error of the statement itself.
    return isinstance(exc, LLMCallTimeoutError) or classify_db_error(exc) is not None


def _database_unavailable(exc: Exception) -> str | None:
    """The database being unavailable, in one line (the runner's loops retry it without a
    traceback), or None for any other failure."""
    if classify_db_error(exc) is None:
        return None
    return f"the database is unavailable: {describe_db_error(exc)}"


def _with_started(state: ConversationState, row: dict[str, Any] | None) -> ConversationState:
    """The state as the policy sees it once ``row`` (just inserted, processing) exists."""
    if row is None:
        return state
    ref = MemoryRef(**{f: row[f] for f in MemoryRef.__dataclass_fields__})
    return replace(state, newest=ref)


def read_only(conversation_id: str, *, ended: bool) -> Conflict:
    """The 409 for a write to an ended or archived conversation, saying which and what to do."""
    if ended:
        return Conflict(
            f"conversation {conversation_id!r} was ended (POST .../end) and is read-only: "
            "start a new conversation"
        )
    return Conflict(
        f"conversation {conversation_id!r} is archived and read-only: restore it "
        "with POST /ops/conversations/{id}/restore"
    )


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
        retries: Retries,
        breaker: CircuitBreaker,
        lease_seconds: float,
        idempotency_ttl_hours: float,
        events_ttl_hours: float,
        max_concurrent: int,
        claim_interval: float,
        maintenance_interval: float,
        token_counter: TokenCounter,
        pgbouncer: bool = False,
        archive_after_days: float = 30.0,
    ) -> None:
        self.engine = engine
        # The append is one statement, its own transaction: no BEGIN/COMMIT round trips. Behind
        # PgBouncer (transaction mode) a statement and its preparation must share a transaction,
        # or they may reach different server connections: there it runs in one.
        self.pgbouncer = pgbouncer
        self.append_engine = engine if pgbouncer else engine.execution_options(isolation_level="AUTOCOMMIT")
        self.read_pool = read_pool
        self.model = model
        self.parameter_defaults = parameter_defaults
        self.default_policy = build_policy(resolve(default_policy, parameter_defaults))
        self.default_policy_json = policy_dump(self.default_policy.config)
        self.default_wake = self.default_policy.wake(EMPTY)
        self.counter = token_counter
        self.summary_max_chars = summary_max_chars
        self.limits = limits
        self.retries = retries
        self.breaker = breaker
        self.lease_seconds = lease_seconds
        self.idempotency_ttl_hours = idempotency_ttl_hours
        self.events_ttl_hours = events_ttl_hours
        # This process's LISTEN connection, for reads that wait (set by the HTTP app; a worker
        # has none).
        self.hub: EventHub | None = None
        self.archive_after_days = archive_after_days
        # Tenants this runner gave a slot, least recent first, with when (a counter).
        self._served: dict[str, int] = {}
        self._turns = itertools.count()
        # Conversation -> the request id of the round (or ops request) that last made its summary
        # due here, oldest first.
        self._due_requests: dict[str, str] = {}
        self.runner: SummaryRunner[WorkKey] = SummaryRunner(
            claim=self.claim_work,
            work=self.run_work,
            maintenance=self.maintain,
            max_concurrent=max_concurrent,
            claim_interval=claim_interval,
            maintenance_interval=min(maintenance_interval, lease_seconds / 3),
            # Past the model call's own bound a summary can only be wedged: stop renewing its
            # lease so that another runner claims it again.
            max_run_seconds=(model.call_timeout_seconds if model is not None else 0.0)
            + RUN_LIMIT_MARGIN_SECONDS,
            expected_failure=_database_unavailable,
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
        user_id: str | None = None,
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
                wake=policy.wake(EMPTY),
                user_id=user_id,
            )
            if row is None:
                raise Conflict(f"conversation {conversation_id!r} already exists")
            self._check_metadata(row.pop("metadata_bytes"), row.pop("metadata_keys"))
        return row

    async def update_policy(
        self, *, tenant_id: str, conversation_id: str, memory_policy: PolicyConfig
    ) -> dict[str, Any]:
        """New parameters for the conversation's policy (seed 003's updateConfig), merged over the
        stored ones; from the next round on. Another policy is a 409: the conversation's summaries
        were made by its own policy's rules, which another cannot continue."""
        async with self.engine.begin() as conn:
            locked = await work.lock(conn, conversation_id=conversation_id, tenant_id=tenant_id)
            if locked is None:
                raise NotFound(f"conversation {conversation_id!r} not found")
            if locked.ended or locked.archived:
                raise read_only(conversation_id, ended=locked.ended)
            stored = locked.memory_policy
            if memory_policy.name != stored["name"]:
                raise Conflict(
                    f"the conversation's policy is {stored['name']!r}; switching to {memory_policy.name!r} "
                    "is not supported, as its summaries follow its own policy's rules: start a new "
                    "conversation with that policy instead"
                )
            given = memory_policy.model_dump(include=memory_policy.model_fields_set)
            policy = build_policy(parse_config({**stored, **given}))
            await conversations.update_policy(
                conn,
                conversation_id=conversation_id,
                memory_policy=policy_dump(policy.config),
                context=policy.context,
            )
            found = await conversations.get(conn, conversation_id=conversation_id, tenant_id=tenant_id)
        assert found is not None  # locked above
        return found

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
        """Store a round in one statement (app.repositories.rounds) and, when it made a summary
        due, tell this process's runner; any runner may claim it (the mark is durable)."""
        # (key, hash of the body), computed only when the client sent a key.
        idempotency_pair = (
            None
            if idempotency_key is None
            else (
                idempotency_key,
                hashlib.sha256(
                    orjson.dumps(
                        {
                            "items": [m.as_posted() | {"metadata": m.metadata} for m in items],
                            "metadata": metadata,
                        },
                        option=orjson.OPT_SORT_KEYS,
                    )
                ).hexdigest(),
            )
        )
        counted = (
            # Counting a large round takes milliseconds: off the event loop (tiktoken releases
            # the GIL), so other requests are not held up.
            await asyncio.to_thread(self._count, items)
            if sum(m.size for m in items) > COUNT_IN_THREAD_CHARS
            else self._count(items)
        )
        params = rounds.append_params(
            conversation_id=conversation_id,
            tenant_id=tenant_id,
            items=counted,
            metadata=metadata,
            idempotency=idempotency_pair,
            default_policy=self.default_policy_json,
            default_context=self.default_policy.context,
            default_wake=self.default_wake,
            max_metadata_bytes=self.limits.max_metadata_bytes,
            max_metadata_keys=self.limits.max_metadata_keys,
        )
        # A concurrent request with the same new Idempotency-Key makes one of the two statements
        # fail on the key's primary key; run again, it finds the other's response.
        for attempt in (1, 2):
            try:
                async with self.append_engine.begin() as conn:
                    outcome = await rounds.append(conn, params, transaction=self.pgbouncer)
                break
            except asyncpg.IntegrityConstraintViolationError as exc:
                constraint = str(exc.constraint_name or "")
                if any(name in constraint for name in TOOL_CALL_KEYS):
                    await self._refuse_tool_calls(conversation_id, counted)
                if "pk_events" in constraint and attempt == 1:
                    async with self.engine.begin() as conn:
                        await events.repair_counter(conn, conversation_id=conversation_id)
                # pk_events: the conversation was deleted and created again meanwhile, and its
                # events were numbered from before the deletion's event (repaired above).
                if attempt == 2 or not any(key in constraint for key in RETRIED_KEYS):
                    raise
        if isinstance(outcome, Refused):
            if outcome.foreign:
                raise NotFound(f"conversation {conversation_id!r} not found")
            if outcome.closed is not None:
                raise read_only(conversation_id, ended=outcome.closed == "ended")
            leading = rounds.leading_results(items)
            if outcome.open_calls > leading:
                raise Invalid(
                    f"the conversation's last {outcome.open_calls} tool call(s) have no result yet: "
                    f"this round must start with a tool message answering each (it starts with {leading})",
                    loc=["body", "messages", leading],
                )
            self._check_metadata(outcome.metadata_bytes, outcome.metadata_keys)
            raise Conflict("the conversation changed while the round was stored; retry the request")
        if outcome.outcome == "key_reused":
            raise Conflict("Idempotency-Key was already used with a different request body")
        if outcome.summary_due:
            self._remember_request(conversation_id)
            self.runner.poke()
        return AppendResult(body=outcome.body, replayed=outcome.outcome == "replayed")

    def _count(self, items: Sequence[NewMessage]) -> list[NewMessage]:
        return [replace(m, tokens=self.counter.message(m.as_posted())) for m in items]

    async def _refuse_tool_calls(self, conversation_id: str, items: Sequence[NewMessage]) -> None:
        """The round failed on a key of tool_calls or tool_results: say which call id, where."""
        async with self.engine.connect() as conn:
            problems = await rounds.tool_call_problems(
                conn,
                conversation_id=conversation_id,
                made=[call["id"] for m in items for call in m.tool_calls or ()],
                answers=[m.tool_call_id for m in items if m.tool_call_id is not None],
            )
        for index, message in enumerate(items):
            for position, call in enumerate(message.tool_calls or ()):
                if call["id"] in problems.reused:
                    raise Invalid(
                        f"tool call id {call['id']!r} is already used in this conversation",
                        loc=["body", "messages", index, "tool_calls", position, "id"],
                    )
            answer = message.tool_call_id
            if answer in problems.unknown:
                raise Invalid(
                    f"tool_call_id {answer!r} matches no earlier tool call of this conversation",
                    loc=["body", "messages", index, "tool_call_id"],
                )
            if answer in problems.answered:
                raise Invalid(
                    f"tool call {answer!r} already has its result",
                    loc=["body", "messages", index, "tool_call_id"],
                )
        # The keys say otherwise, but the diagnosis found nothing: a concurrent round changed it.
        raise Conflict("the conversation's tool calls changed while the round was stored; retry the request")

    def _driver(self, *, transaction: bool) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        """A pooled connection as its asyncpg connection, for the summary path's statements,
        always in a transaction behind PgBouncer (a statement's preparation and execution must
        reach the same server connection)."""
        return statements.connect(self.engine, transaction=transaction or self.pgbouncer)

    # ---- planning -----------------------------------------------------------------------

    async def _plan(
        self, conn: Db, *, conversation_id: str, locked: Locked, trigger: Trigger
    ) -> tuple[MemoryPolicy, ConversationState, SummaryPlan | None]:
        """Ask the conversation's policy which summary is due, given what it observes now."""
        policy = load_policy(locked.memory_policy)
        seen = await work.observe(
            conn,
            conversation_id=conversation_id,
            shown=policy.context.summaries,
            lookback=policy.lookback_messages,
            last_sequence=locked.last_sequence,
        )
        state = ConversationState(
            last_sequence=locked.last_sequence,
            last_round=locked.last_round,
            latest_completed=seen.latest_completed,
            newest=seen.newest,
            round_starts=seen.round_starts,
            open_calls=locked.open_calls,
            total_tokens=locked.total_tokens,
            covered_tokens=seen.covered_tokens,
            shown=seen.shown,
            ended=locked.ended,
        )
        after = policy.boundary_after(state)
        if after is not None:
            found = await messages.boundaries_after(
                conn, conversation_id=conversation_id, after_round=after, limit=1
            )
            state = replace(state, next_boundary=found[0] if found else None)
        return policy, state, policy.plan(state, trigger)

    async def _plan_and_start(
        self, conn: Db, *, conversation_id: str, locked: Locked, trigger: Trigger, own: bool
    ) -> dict[str, Any] | None:
        """Plan under the conversation's row lock; insert the plan's 'processing' row (owned by
        this runner with ``own``, else queued for any) and store the policy's next wake point.
        When a summary is already processing, the due mark stays for its completion to see."""
        policy, state, plan = await self._plan(
            conn, conversation_id=conversation_id, locked=locked, trigger=trigger
        )
        row = None
        if plan is not None:
            row = await memory.insert_processing(
                conn,
                conversation_id=conversation_id,
                plan=plan,
                lease_seconds=self.lease_seconds if own else None,
            )
            if row is None:
                logger.debug("Summarization already in progress for %s", conversation_id)
                return None
        else:
            logger.debug("No new messages to summarize for %s", conversation_id)
        await work.settle(conn, conversation_id=conversation_id, wake=policy.wake(_with_started(state, row)))
        return row

    # ---- claiming work (any replica or worker) ----------------------------------------

    async def claim_work(self, limit: int) -> list[WorkKey]:
        """Claim up to ``limit`` pieces of due work and return the keys this runner now owns:
        conversations' summaries in the fair order, then, with slots left, users' summaries
        (oldest first). Nothing is claimed while the model's circuit is open: the work stays due,
        and the first claim after the pause is the circuit's trial."""
        if self.model is not None and not self.breaker.allow():
            return []
        claimed = [
            WorkKey(MEMORY_WORK, memory_id, attempt)
            for memory_id, attempt in await self._claim_conversation_work(limit)
        ]
        if len(claimed) < limit:
            claimed += [
                WorkKey(USER_WORK, memory_id, attempt)
                for memory_id, attempt in await self._claim_user_work(limit - len(claimed))
            ]
        return claimed

    async def _claim_user_work(self, limit: int) -> list[tuple[int, int]]:
        async with self.engine.connect() as conn:
            found = await users.candidates(
                conn, limit=limit, max_attempts=self.retries.max_attempts, backoff=self.retries.backoff
            )
        running_here = {key.row_id for key in self.runner.owned() if key.kind == USER_WORK}
        rows = [w.memory_id for w in found if w.memory_id is not None and w.memory_id not in running_here]
        claimed: list[tuple[int, int]] = []
        if rows:
            async with self.engine.begin() as conn:
                owned = await users.claim_rows(
                    conn,
                    memory_ids=rows,
                    lease_seconds=self.lease_seconds,
                    max_attempts=self.retries.max_attempts,
                    backoff=self.retries.backoff,
                )
            claimed += owned.items()
        for due in (w for w in found if w.memory_id is None):
            async with self.engine.begin() as conn:
                row = await users.start_due(
                    conn,
                    tenant_id=due.tenant_id,
                    user_id=due.user_id,
                    lease_seconds=self.lease_seconds,
                    skip_locked=True,
                )
            if row is not None:
                claimed.append((row["memory_id"], row["attempts"]))
        return claimed

    async def _claim_conversation_work(self, limit: int) -> list[tuple[int, int]]:
        # The summary path's statements run on asyncpg directly (app.repositories.statements).
        async with self._driver(transaction=False) as conn:
            found = await work.candidates(
                conn,
                limit=limit,
                max_attempts=self.retries.max_attempts,
                backoff=self.retries.backoff,
                served=self._served,
            )
        running_here = {key.row_id for key in self.runner.owned() if key.kind == MEMORY_WORK}
        # Queued and abandoned rows: one conditional update claims them all.
        rows = [c for c in found if c.memory_id is not None and c.memory_id not in running_here]
        claimed: list[tuple[int, int]] = []
        if rows:
            async with self._driver(transaction=False) as conn:
                owned = await work.claim_rows(
                    conn,
                    memory_ids=[c.memory_id for c in rows if c.memory_id is not None],
                    lease_seconds=self.lease_seconds,
                    max_attempts=self.retries.max_attempts,
                    backoff=self.retries.backoff,
                )
            for candidate in rows:
                if candidate.memory_id in owned:
                    claimed.append((candidate.memory_id, owned[candidate.memory_id]))
                    self._serve(candidate.tenant_id)
        # Due conversations: each planned in its own short transaction, a few at a time.
        due = [c for c in found if c.memory_id is None]
        gate = asyncio.Semaphore(CLAIM_PARALLELISM)

        async def plan(candidate: work.Candidate) -> None:
            # One plan's failure (a lost connection) must not drop the rows the others already
            # inserted under this runner's lease: they would wait for it to expire, unrun. Its
            # own transaction rolled back, so its conversation stays due for the next claim.
            try:
                async with gate, self._driver(transaction=True) as conn:
                    locked = await work.lock_due(conn, conversation_id=candidate.conversation_id)
                    if locked is None:
                        return
                    row = await self._plan_and_start(
                        conn,
                        conversation_id=candidate.conversation_id,
                        locked=locked,
                        trigger=Trigger.ROUND_END,
                        own=True,
                    )
            except Exception as exc:
                reason = describe_db_error(exc) if is_database_error(exc) else f"{type(exc).__name__}: {exc}"
                logger.warning("Planning the summary of %s failed: %s", candidate.conversation_id, reason)
                return
            if row is not None:
                claimed.append((row["memory_id"], row["attempts"]))
                self._serve(candidate.tenant_id)

        await asyncio.gather(*(plan(c) for c in due))
        return claimed

    def _remember_request(self, conversation_id: str) -> None:
        """Note the request id of the request being served as the one that made the
        conversation's summary due, for that summary's log lines if it runs here."""
        request_id = logs.request_id()
        if request_id is None:
            return
        self._due_requests.pop(conversation_id, None)
        self._due_requests[conversation_id] = request_id
        if len(self._due_requests) > DUE_REQUESTS:
            del self._due_requests[next(iter(self._due_requests))]

    def _serve(self, tenant_id: str) -> None:
        """Record that this runner just gave ``tenant_id`` a slot (for the round robin),
        remembering the most recent SERVED_TENANTS tenants."""
        self._served.pop(tenant_id, None)
        self._served[tenant_id] = next(self._turns)
        if len(self._served) > SERVED_TENANTS:
            del self._served[next(iter(self._served))]

    # ---- background summary -------------------------------------------------------------

    async def run_work(self, key: WorkKey) -> None:
        """Run one piece of claimed work (never raises)."""
        if key.kind == USER_WORK:
            await self.summarize_user(key.row_id, key.attempt)
        else:
            await self.summarize(key.row_id, key.attempt)

    async def summarize(self, memory_id: int, attempt: int) -> None:
        """Seed 004's do_summarization, for a row this runner owns (its ``attempt``), of any
        policy; never raises. Its log lines carry the memory and conversation ids, and the id of
        the request that made it due when that request came to this process."""
        token = logs.bind(memory_id=memory_id)
        try:
            await self._summarize(memory_id, attempt)
        finally:
            logs.unbind(token)

    async def _summarize(self, memory_id: int, attempt: int) -> None:
        started = time.perf_counter()
        policy_name = metrics.UNKNOWN_POLICY
        try:
            # Reads only: each statement sees the latest committed data, no transaction needed.
            async with self._driver(transaction=False) as conn:
                row = await memory.running(conn, memory_id=memory_id, attempt=attempt)
                if row is None:
                    return  # reaped, claimed again, or deleted with its conversation meanwhile
                conversation_id = row["conversation_id"]
                policy_name = str(row["memory_policy"].get("name", metrics.UNKNOWN_POLICY))
                logs.bind(conversation_id=conversation_id)
                if request_id := self._due_requests.pop(conversation_id, None):
                    logs.bind(request_id=request_id)
                metrics.SUMMARIES_STARTED.labels(policy_name).inc()
                policy = load_policy(row["memory_policy"])
                folds = policy.reads_summaries(row["kind"])
                new_messages = (
                    []
                    if folds
                    else await messages.between(
                        conn,
                        conversation_id=conversation_id,
                        start=row["input_start_sequence"],
                        end=row["end_sequence"],
                    )
                )
                summaries = (
                    await memory.folded(
                        conn,
                        conversation_id=conversation_id,
                        start=row["start_sequence"],
                        end=row["end_sequence"],
                    )
                    if folds
                    else []
                )
            job = SummaryJob(
                memory_id=memory_id,
                conversation_id=conversation_id,
                kind=row["kind"],
                start_sequence=row["start_sequence"],
                end_sequence=row["end_sequence"],
                start_round=row["start_round"],
                end_round=row["end_round"],
                base_text=row["base_text"],
                base_end_sequence=row["base_end_sequence"],
                messages=tuple(new_messages),
                max_chars=self.summary_max_chars,
                input_tokens=row["input_tokens"],
                summaries=tuple(summaries),
                covered_until=row["to_at"].isoformat() if row["to_at"] is not None else None,
            )
            if row["base_memory_id"] is not None and row["start_sequence"] > 0:
                logger.info(
                    "Sliding window: dropping seq 0-%d for %s", row["start_sequence"] - 1, conversation_id
                )
            if self.model is None:
                text = policy.fallback(job)
            else:
                text = await self._ask_model(self.model, policy.prompt(job), job)
            if not text.strip():
                raise EmptySummaryError("the summarizer returned an empty summary")
            elapsed = time.perf_counter() - started
            elapsed_ms = int(elapsed * 1000)
            tokens = self.counter.count(text)
            # Completing and asking the policy again (trigger 'completed') is one transaction
            # under the conversation's row lock: a runner's claim loop (which locks due
            # conversations with SKIP LOCKED) can never plan in between, seeing the summary
            # completed but not what its completion plans (a compaction, a catch-up).
            async with self._driver(transaction=True) as conn:
                locked = await work.lock(conn, conversation_id=conversation_id)
                lags = await memory.complete(
                    conn,
                    memory_id=memory_id,
                    attempt=attempt,
                    memory_text=text,
                    tokens=tokens,
                    generation_time_ms=elapsed_ms,
                )
                if lags is not None and locked is not None and locked.user_id is not None:
                    # The user's cross-conversation summary draws on this one.
                    await users.mark_due(conn, tenant_id=locked.tenant_id, user_id=locked.user_id)
                queued = (
                    await self._plan_and_start(
                        conn,
                        conversation_id=conversation_id,
                        locked=locked,
                        trigger=Trigger.COMPLETED,
                        own=False,
                    )
                    if lags is not None and locked is not None
                    else None
                )
            if queued is not None:
                self.runner.poke()
            if lags is not None:
                logger.info(
                    "Summarized messages %d-%d for %s in %dms",
                    row["start_sequence"],
                    row["end_sequence"],
                    conversation_id,
                    elapsed_ms,
                )
                logger.debug("Memory %d status updated to completed", memory_id)
                metrics.SUMMARIES_COMPLETED.labels(policy_name).inc()
                metrics.SUMMARY_GENERATION_SECONDS.labels(policy_name).observe(elapsed)
                lag_histogram = metrics.SUMMARY_LAG_SECONDS.labels(policy_name)
                for lag in lags:
                    lag_histogram.observe(lag)
            else:
                logger.info("Memory %d was reaped, reclaimed or deleted meanwhile; result dropped", memory_id)
                metrics.SUMMARIES_FAILED.labels(policy_name, "superseded").inc()
        except asyncio.CancelledError:
            # Shutting down: not the summary's fault. Give the row back for another runner.
            metrics.SUMMARIES_FAILED.labels(policy_name, "shutdown_requeued").inc()
            await self._release(memory_id, attempt)
            raise
        except Exception as exc:
            # A database error's message may quote parameter values (message content).
            reason = describe_db_error(exc) if is_database_error(exc) else f"{type(exc).__name__}: {exc}"
            logger.warning("Summary %d failed: %s", memory_id, reason)
            metrics.SUMMARIES_FAILED.labels(policy_name, failure_reason(exc)).inc()
            await self._mark_failed(memory_id, attempt, reason, started, keep_due=unavailable(exc))

    # ---- users: the cross-conversation summary (seed 001) ---------------------------------

    async def summarize_user(self, memory_id: int, attempt: int) -> None:
        """Build a user's cross-conversation summary from their last conversations (each one's
        shown summary and short-term messages) and the previous one, for a row this runner owns
        (its ``attempt``); never raises. Completed, it replaces the previous one in
        GET /users/{id}/context."""
        started = time.perf_counter()
        try:
            async with self.engine.connect() as conn:
                row = await users.get(conn, memory_id=memory_id)
                if row is None or row["status"] != "processing" or row["attempts"] != attempt:
                    return
                tenant_id, user_id = row["tenant_id"], row["user_id"]
                previous = (
                    await users.base_text(
                        conn, tenant_id=tenant_id, user_id=user_id, memory_id=row["base_memory_id"]
                    )
                    if row["base_memory_id"] is not None
                    else None
                )
                sources = []
                for found in await users.recent_conversations(
                    conn, tenant_id=tenant_id, user_id=user_id, limit=user_summary.CONVERSATIONS
                ):
                    covered = -1 if found["end_sequence"] is None else found["end_sequence"]
                    recent = await messages.between(
                        conn,
                        conversation_id=found["conversation_id"],
                        start=max(covered + 1, found["last_sequence"] - user_summary.SHORT_TERM + 1),
                        end=found["last_sequence"],
                    )
                    sources.append(
                        user_summary.Source(
                            conversation_id=found["conversation_id"],
                            ended=found["ended_at"] is not None,
                            last_message_at=found["last_message_at"].isoformat(),
                            summary=found["memory_text"],
                            summary_memory_id=found["memory_id"],
                            last_sequence=found["last_sequence"],
                            messages=tuple(recent),
                        )
                    )
            if self.model is None:
                text = user_summary.fallback(sources, self.summary_max_chars)
            else:
                job = SummaryJob(
                    memory_id=memory_id,
                    conversation_id=f"user:{user_id}",
                    kind="user",
                    start_sequence=0,
                    end_sequence=0,
                    start_round=0,
                    end_round=0,
                    base_text=previous,
                    base_end_sequence=None,
                    messages=(),
                    max_chars=self.summary_max_chars,
                )
                text = await self._ask_model(
                    self.model, user_summary.prompt(previous, sources, self.summary_max_chars), job
                )
            if not text.strip():
                raise EmptySummaryError("the summarizer returned an empty summary")
            elapsed_ms = int((time.perf_counter() - started) * 1000)
            async with self.engine.begin() as conn:
                done = await users.complete(
                    conn,
                    memory_id=memory_id,
                    attempt=attempt,
                    memory_text=text,
                    sources=[
                        {
                            "conversation_id": s.conversation_id,
                            "summary_memory_id": s.summary_memory_id,
                            "last_sequence": s.last_sequence,
                        }
                        for s in sources
                    ],
                    tokens=self.counter.count(text),
                    generation_time_ms=elapsed_ms,
                )
            if done is not None:
                logger.info("User summary %d of %s completed in %dms", memory_id, user_id, elapsed_ms)
                self.runner.poke()  # the user may be due again (a conversation advanced meanwhile)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                async with self.engine.begin() as conn:
                    await users.release(conn, memory_id=memory_id, attempt=attempt)
            raise
        except Exception as exc:
            reason = describe_db_error(exc) if is_database_error(exc) else f"{type(exc).__name__}: {exc}"
            logger.warning("User summary %d failed: %s", memory_id, reason)
            with contextlib.suppress(Exception):
                async with self.engine.begin() as conn:
                    await users.fail(
                        conn,
                        memory_id=memory_id,
                        attempt=attempt,
                        error=reason,
                        generation_time_ms=int((time.perf_counter() - started) * 1000),
                        backoff=self.retries.backoff,
                        keep_due=unavailable(exc),
                    )

    async def _ask_model(self, model: ChatModel, prompt: Prompt, job: SummaryJob) -> str:
        """The model's answer, its success or failure counted by the circuit breaker."""
        try:
            text = await model.summarize(prompt, job)
        except Exception:
            self.breaker.record_failure()
            raise
        self.breaker.record_success()
        return text

    async def user_context(self, *, tenant_id: str, user_id: str) -> dict[str, Any]:
        """The user's latest completed cross-conversation summary (never one half-built), what is
        on its way, and how fresh it is. 404 for a user with no conversation."""
        async with self.engine.connect() as conn:
            found = await users.context(conn, tenant_id=tenant_id, user_id=user_id)
        if found is None:
            raise NotFound(f"user {user_id!r} not found")
        behind = "processing" if found["processing"] else ("due" if found["due_at"] is not None else None)
        return {
            "user_id": user_id,
            "summary": found["summary"],
            "processing": found["processing"],
            "freshness": {"fresh": behind is None, "behind": behind},
        }

    async def user_memories(self, *, tenant_id: str, user_id: str) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            if await users.context(conn, tenant_id=tenant_id, user_id=user_id) is None:
                raise NotFound(f"user {user_id!r} not found")
            return await users.chain(conn, tenant_id=tenant_id, user_id=user_id)

    async def end_conversation(self, *, tenant_id: str, conversation_id: str) -> dict[str, Any]:
        """End a session (seed 001): the conversation becomes read-only, its policy plans a final
        summary (for recursive_summary, one covering every message), and its user's
        cross-conversation summary is due. Ending it again changes nothing."""
        async with self.engine.begin() as conn:
            locked = await work.lock(conn, conversation_id=conversation_id, tenant_id=tenant_id)
            if locked is None:
                raise NotFound(f"conversation {conversation_id!r} not found")
            if not locked.ended and locked.open_calls > 0:
                raise Conflict(
                    f"conversation {conversation_id!r} has {locked.open_calls} tool call(s) waiting for "
                    "their results: post the results, then end it (an ended conversation takes no "
                    "more messages, and a provider refuses a history with unanswered calls)"
                )
            row = await conversations.end(conn, conversation_id=conversation_id)
            if row["archived_at"] is not None:
                raise Conflict(
                    f"conversation {conversation_id!r} is archived; restore it with "
                    "POST /ops/conversations/{id}/restore first"
                )
            started = None
            if locked.last_sequence >= 0:
                started = await self._plan_and_start(
                    conn,
                    conversation_id=conversation_id,
                    locked=replace(locked, ended=True),
                    trigger=Trigger.ROUND_END,
                    own=False,
                )
            if locked.user_id is not None:
                await users.mark_due(conn, tenant_id=locked.tenant_id, user_id=locked.user_id)
        self.runner.poke()
        return {**row, "final_summary": None if started is None else _memory_started(started)}

    async def _release(self, memory_id: int, attempt: int) -> None:
        try:
            async with self.engine.begin() as conn:
                if await memory.release(conn, memory_id=memory_id, attempt=attempt):
                    logger.info("Memory %d given back to the queue (shutting down)", memory_id)
        except Exception:
            logger.warning(
                "Could not give memory %d back; its lease expires and another runner claims it", memory_id
            )

    async def _mark_failed(
        self, memory_id: int, attempt: int, reason: str, started: float, *, keep_due: bool
    ) -> None:
        elapsed_ms = int((time.perf_counter() - started) * 1000)
        try:
            async with self.engine.begin() as conn:
                if await memory.fail(
                    conn,
                    memory_id=memory_id,
                    attempt=attempt,
                    error=reason,
                    generation_time_ms=elapsed_ms,
                    backoff=self.retries.backoff,
                    max_attempts=self.retries.max_attempts,
                    keep_due=keep_due,
                ):
                    logger.debug("Memory %d status updated to failed", memory_id)
        except Exception:
            # The database is unreachable: the lease expires and another runner claims the row.
            logger.warning("Could not mark memory %d failed; its lease expires instead", memory_id)

    async def maintain(self, owned: list[WorkKey]) -> None:
        """Renew the leases of our rows, fail rows whose runners died on every attempt, expire
        idempotency keys and old events."""
        mine = [key.row_id for key in owned if key.kind == MEMORY_WORK]
        users_mine = [key.row_id for key in owned if key.kind == USER_WORK]
        async with self.engine.begin() as conn:
            if mine:
                await memory.renew_leases(conn, memory_ids=mine, lease_seconds=self.lease_seconds)
            if users_mine:
                await users.renew_leases(conn, memory_ids=users_mine, lease_seconds=self.lease_seconds)
            for row in await memory.reap_expired(
                conn, backoff=self.retries.backoff, max_attempts=self.retries.max_attempts
            ):
                with logs.bound(memory_id=row["memory_id"], conversation_id=row["conversation_id"]):
                    logger.warning(
                        "Reaped memory %d (%d-%d) of %s: lease expired on all %d attempts",
                        row["memory_id"],
                        row["start_sequence"],
                        row["end_sequence"],
                        row["conversation_id"],
                        row["attempts"],
                    )
                policy_name = row["policy"] or metrics.UNKNOWN_POLICY
                metrics.SUMMARIES_FAILED.labels(policy_name, "lease_expired").inc()
            await idempotency.expire(conn, older_than_hours=self.idempotency_ttl_hours)
            await events.expire(conn, older_than_hours=self.events_ttl_hours)
            await webhooks.expire(conn, older_than_hours=self.events_ttl_hours)
        await self._give_way(self._reap_users, "reaping user summaries")
        await self.archive_idle()

    async def _give_way(self, work: Callable[[], Awaitable[object]], what: str) -> bool:
        """Run housekeeping that waits at most 100 ms for a lock (each statement runs with
        lock_timeout): behind an operator's or a migration's table lock it gives way until the
        next tick rather than hold a pooled connection a request may need. False if it gave way."""
        try:
            await work()
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
            logger.info("%s waits for the next tick: a table it needs is locked", what.capitalize())
            return False
        return True

    async def _reap_users(self) -> None:
        async with self.engine.begin() as conn:
            for row in await users.reap_expired(conn, max_attempts=self.retries.max_attempts):
                logger.warning(
                    "Reaped user memory %d of %s/%s: lease expired on all %d attempts",
                    row["memory_id"],
                    row["tenant_id"],
                    row["user_id"],
                    row["attempts"],
                )

    async def archive_idle(self) -> int:
        """Seed 001's cleanup: archive conversations idle for MEMORY_ARCHIVE_AFTER_DAYS, a
        batch per transaction (short row locks), at most ARCHIVE_BATCHES batches per tick."""
        archived = 0
        found: list[str] = []

        async def batch() -> None:
            async with self.engine.begin() as conn:
                found[:] = await conversations.archive_idle(
                    conn, older_than_days=self.archive_after_days, batch=ARCHIVE_BATCH
                )

        for _ in range(ARCHIVE_BATCHES):
            if not await self._give_way(batch, "archiving"):
                break
            archived += len(found)
            if len(found) < ARCHIVE_BATCH:
                break
        if archived:
            logger.info("Archived %d conversations idle for %g days", archived, self.archive_after_days)
        return archived

    async def drain(self) -> None:
        """Run until no work is due now and nothing runs here (tests, benchmarks, a worker's
        --drain): claim, wait for what was claimed, and look again. While the database is
        unavailable (restarting, out of connections) it waits and tries again, as the claim
        loop does."""
        while True:
            try:
                claimed = await self.runner.claim_now()
                await self.runner.wait_idle()
                if claimed:
                    continue
                async with self.engine.connect() as conn:
                    found = [
                        *await work.candidates(
                            conn,
                            limit=1,
                            max_attempts=self.retries.max_attempts,
                            backoff=self.retries.backoff,
                        ),
                        *await users.candidates(
                            conn,
                            limit=1,
                            max_attempts=self.retries.max_attempts,
                            backoff=self.retries.backoff,
                        ),
                    ]
            except Exception as exc:
                if (unavailable_db := _database_unavailable(exc)) is None:
                    raise
                logger.warning("Draining: %s; retrying", unavailable_db)
                await asyncio.sleep(DRAIN_RETRY_SECONDS)
                continue
            if not found and self.runner.idle:
                return
            if found:
                # Due, but not claimable by us right now (the model's circuit is open, or another
                # runner holds it): look again shortly.
                await asyncio.sleep(0.05)

    # ---- read path ----------------------------------------------------------------------

    async def get_context_json(
        self,
        *,
        tenant_id: str,
        conversation_id: str,
        max_tokens: int | None = None,
        context_window: int | None = None,
    ) -> str:
        """The summaries the policy shows plus the raw part, as the response's JSON text; never
        waits on a summary. A conversation never written to (or another tenant's) reads as an
        empty one, so an agent's first round needs no special case."""
        found = await memory.context_json(
            self.read_pool,
            conversation_id=conversation_id,
            tenant_id=tenant_id,
            max_messages=self.limits.max_context_messages,
            max_bytes=self.limits.max_context_bytes,
            max_tokens=max_tokens,
            context_window=context_window,
            in_transaction=self.pgbouncer,
        )
        if found is not None:
            return found
        return orjson.dumps(self._empty_context(conversation_id, context_window)).decode()

    def _empty_context(self, conversation_id: str, context_window: int | None) -> dict[str, Any]:
        """The context of a conversation with no messages yet (same shape as the read's)."""
        return {
            "conversation_id": conversation_id,
            "policy": self.default_policy_json["name"],
            "summaries": [],
            "memory": None,
            "messages": [],
            "truncated": False,
            "omitted_messages": None,
            "processing": None,
            "summary_due": False,
            "summary_backoff": None,
            "last_sequence": None,
            "tokens": {"summaries": 0, "messages": 0, "total": 0},
            "context_window": None
            if context_window is None
            else {"tokens": context_window, "used_percent": 0.0},
            "memory_lag_messages": 0,
            "user_summary": None,
        }

    async def get_context(
        self,
        *,
        tenant_id: str,
        conversation_id: str,
        format: str,
        max_tokens: int | None,
        context_window: int | None,
        wait_for_pending: float | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """The context in ``format`` (json, text, markdown, openai, anthropic) and what it holds
        (its JSON form). A rendering the provider would refuse is a 409 naming why. With
        ``wait_for_pending`` seconds, a summary processing when the request came is waited for
        (until it completes or fails, or the time is up), and the context says so."""

        async def read() -> str:
            return await self.get_context_json(
                tenant_id=tenant_id,
                conversation_id=conversation_id,
                max_tokens=max_tokens,
                context_window=context_window,
            )

        body = await read()
        context: dict[str, Any] = orjson.loads(body)
        if wait_for_pending is not None:
            context = await self._wait_for_pending(conversation_id, context, read, wait_for_pending)
            body = orjson.dumps(context).decode()
        if format == "json":
            return body, context
        policy = renderer(context["policy"])
        try:
            rendered = {
                "text": lambda: policy.render_text(context),
                "markdown": lambda: policy.render_markdown(context),
                "openai": lambda: orjson.dumps(formats.to_openai(context)).decode(),
                "anthropic": lambda: orjson.dumps(formats.to_anthropic(context)).decode(),
            }[format]()
        except formats.Unrenderable as exc:
            raise Conflict(f"the context cannot be rendered for {format}: {exc}") from None
        return rendered, context

    async def _wait_for_pending(
        self,
        conversation_id: str,
        context: dict[str, Any],
        read: Callable[[], Awaitable[str]],
        seconds: float,
    ) -> dict[str, Any]:
        """Wait up to ``seconds`` for the summary ``context`` shows processing to complete or
        fail, or, with none processing but one due (waiting for a runner: a worker's claim),
        for that one to start and then end; woken by the conversation's events (app.events).
        Returns the context read then, with ``waited`` and ``pending``."""
        processing = context["processing"]
        busy = processing is not None or context["summary_due"]
        if not busy or seconds <= 0 or self.hub is None:
            return context | {"waited": False, "pending": busy}
        awaited = None if processing is None else processing["memory_id"]
        latest = context

        async def settled() -> bool:
            nonlocal latest, awaited
            latest = orjson.loads(await read())
            now = latest["processing"]
            if awaited is None:  # the due summary has not started yet
                if now is not None:
                    awaited = now["memory_id"]
                    return False
                return not latest["summary_due"]
            return now is None or now["memory_id"] != awaited

        # The mark outlives the wait by a little: it only costs NOTIFYs.
        async with self.hub.subscribe(conversation_id, seconds=seconds + 5) as wake:
            done = await wait_until(wake, settled, seconds=seconds)
        return latest | {"waited": True, "pending": not done}

    async def list_memories(self, *, tenant_id: str | None, conversation_id: str) -> list[dict[str, Any]]:
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
        self,
        *,
        tenant_id: str,
        after: str | None,
        limit: int,
        include_metadata: bool,
        archived: bool | None = False,
    ) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await conversations.list_page(
                conn,
                tenant_id=tenant_id,
                after=after,
                limit=limit,
                include_metadata=include_metadata,
                archived=archived,
            )

    async def export_markdown(self, *, tenant_id: str, conversation_id: str) -> str:
        """Seed 001's session markdown of a conversation (archived ones included)."""
        async with self.engine.connect() as conn:
            found = await conversations.get(conn, conversation_id=conversation_id, tenant_id=tenant_id)
            if found is None:
                raise NotFound(f"conversation {conversation_id!r} not found")
            chain = await memory.chain(conn, conversation_id=conversation_id)
            count = found["message_count"]
            recent = await messages.between(
                conn, conversation_id=conversation_id, start=max(0, count - export.SHORT_TERM), end=count - 1
            )
        shown = next((m for m in chain if m["shown"]), None)
        return export.session_markdown(
            export.Session(
                conversation_id=conversation_id,
                started_at=found["created_at"],
                ended_at=found["ended_at"],
                last_message_at=found["last_message_at"],
                message_count=count,
                summary_version=sum(1 for m in chain if m["status"] == "completed"),
                summary=None if shown is None else shown["text"],
                messages=recent,
            )
        )

    async def restore_conversation(self, *, tenant_id: str | None, conversation_id: str) -> dict[str, Any]:
        """Make an archived conversation writable again (its archive clock restarts)."""
        async with self.engine.begin() as conn:
            row = await conversations.restore(conn, conversation_id=conversation_id, tenant_id=tenant_id)
        if row is None:
            raise NotFound(f"conversation {conversation_id!r} not found")
        if isinstance(row, str):
            raise Conflict(f"conversation {conversation_id!r} is not archived")
        return row

    async def delete_conversation(self, *, tenant_id: str, conversation_id: str) -> None:
        """Delete a conversation, recording ``conversation:deleted``; a summary still running for
        it finds its row gone and stops."""
        try:
            deleted = await self._delete(tenant_id=tenant_id, conversation_id=conversation_id, repair=False)
        except IntegrityError as exc:
            if "pk_events" not in str(exc.orig):
                raise
            deleted = await self._delete(tenant_id=tenant_id, conversation_id=conversation_id, repair=True)
        if deleted is None:
            raise NotFound(f"conversation {conversation_id!r} not found")
        if deleted.user_id is not None:
            self.runner.poke()

    async def _delete(self, *, tenant_id: str, conversation_id: str, repair: bool) -> events.Deleted | None:
        """The DELETE and, for a conversation of a user, its leaving the user's summaries, in one
        transaction; ``repair`` first fixes a stale event counter (see events.repair_counter)."""
        async with self.engine.begin() as conn:
            if repair:
                await events.repair_counter(conn, conversation_id=conversation_id)
            deleted = await events.delete_conversation(
                conn, conversation_id=conversation_id, tenant_id=tenant_id
            )
            if deleted is not None and deleted.user_id is not None:
                await users.conversation_gone(conn, tenant_id=tenant_id, user_id=deleted.user_id)
        return deleted

    async def _require(self, conn: AsyncConnection, *, tenant_id: str | None, conversation_id: str) -> None:
        if not await conversations.exists(conn, conversation_id=conversation_id, tenant_id=tenant_id):
            raise NotFound(f"conversation {conversation_id!r} not found")

    # ---- stats, export and import, clearing (seed 003) ----------------------------------------

    async def stats(self, *, tenant_id: str, conversation_id: str) -> dict[str, Any]:
        """Seed 003's getStats (app.repositories.memory.stats), for every policy."""
        async with self.engine.connect() as conn:
            found = await memory.stats(conn, conversation_id=conversation_id, tenant_id=tenant_id)
        if found is None:
            raise NotFound(f"conversation {conversation_id!r} not found")
        return found

    async def export_conversation(self, *, tenant_id: str, conversation_id: str) -> str:
        """The conversation as an export document (JSON text built by the database, one snapshot).
        One with more entries or memory rows than an import takes is refused (413)."""
        max_rows = self.limits.max_import_entries
        async with self.engine.connect() as conn:
            size = await transfer.size(conn, conversation_id=conversation_id, tenant_id=tenant_id)
            if size is None:
                raise NotFound(f"conversation {conversation_id!r} not found")
            if max(size) > max_rows:
                raise PayloadTooLarge(
                    f"the conversation has {size[0]} entries and {size[1]} memory rows; an export holds at "
                    f"most {max_rows} of each (MEMORY_MAX_IMPORT_ENTRIES)"
                )
            body = await transfer.export_json(conn, conversation_id=conversation_id, tenant_id=tenant_id)
        if body is None:  # deleted between the two statements
            raise NotFound(f"conversation {conversation_id!r} not found")
        return body

    async def import_conversation(
        self, *, tenant_id: str, document: ConversationExport, conversation_id: str | None
    ) -> dict[str, Any]:
        """Store an export document as a conversation (under ``conversation_id``, else the
        document's), in one transaction: checked first (app.memory.transfer: 422 naming the first
        problem), 409 when the id is taken, 413 past the metadata limits. Entries keep their
        sequences, rounds, times and token counts; memory rows get new ids; summaries that were
        in flight are dropped. Then the policy is asked, as after a round, whether a summary is
        due: if so a runner starts it, else the conversation's next wake point is stored."""
        self._check_import_size(document)
        plan = plan_import(document.entries, document.memories)
        target = conversation_id or document.conversation.conversation_id
        # Parameters a hand-written document leaves out take the deployment's defaults, as on create.
        policy = build_policy(resolve(document.conversation.memory_policy, self.parameter_defaults))
        kept = [document.memories[i] for i in plan.kept_memories]
        due = False
        async with self.engine.begin() as conn:
            metadata_size = await transfer.insert_conversation(
                conn,
                new=transfer.NewConversation(
                    conversation_id=target,
                    tenant_id=tenant_id,
                    created_at=document.conversation.created_at,
                    metadata=document.conversation.metadata,
                    memory_policy=policy_dump(policy.config),
                    context=policy.context,
                    user_id=document.conversation.user_id,
                    ended_at=document.conversation.ended_at,
                    last_message_at=max(
                        (e.created_at for e in document.entries), default=document.conversation.created_at
                    ),
                ),
                plan=plan,
            )
            if metadata_size is None:
                raise Conflict(f"conversation {target!r} already exists")
            self._check_metadata(*metadata_size)
            await transfer.insert_entries(conn, conversation_id=target, entries=document.entries, plan=plan)
            ids = await transfer.new_memory_ids(conn, count=len(kept))
            await transfer.insert_memories(
                conn, conversation_id=target, rows=kept, ids=renumber([r.memory_id for r in kept], ids)
            )
            locked = await work.lock(conn, conversation_id=target)
            assert locked is not None  # inserted above
            if locked.last_sequence < 0:
                await work.settle(conn, conversation_id=target, wake=policy.wake(EMPTY))
            else:
                policy, state, summary = await self._plan(
                    conn, conversation_id=target, locked=locked, trigger=Trigger.ROUND_END
                )
                due = summary is not None
                if due:
                    await transfer.mark_due(conn, conversation_id=target)
                else:
                    await work.settle(conn, conversation_id=target, wake=policy.wake(state))
            if document.conversation.user_id is not None:
                # The user's cross-conversation summary takes the imported conversation in.
                await users.mark_due(conn, tenant_id=tenant_id, user_id=document.conversation.user_id)
            await events.record(
                conn,
                conversation_id=target,
                type=events.CONVERSATION_IMPORTED,
                data={"entries": plan.next_sequence, "memories": len(kept)},
            )
        if due or document.conversation.user_id is not None:
            self.runner.poke()
        return {
            "conversation_id": target,
            "entries": plan.next_sequence,
            "memories": len(kept),
            "dropped_processing": plan.dropped_processing,
            "summary_due": due,
        }

    def _check_import_size(self, document: ConversationExport) -> None:
        limit = self.limits.max_import_entries
        for name, rows in (("entries", document.entries), ("memory rows", document.memories)):
            if len(rows) > limit:
                raise PayloadTooLarge(
                    f"the document has {len(rows)} {name}; the limit is {limit} (MEMORY_MAX_IMPORT_ENTRIES)"
                )
        for index, entry in enumerate(document.entries):
            size = 0 if entry.content is None else content_chars(entry.content)
            if size > self.limits.max_message_chars:
                raise PayloadTooLarge(
                    f"entries[{index}].content has {size} characters; "
                    f"the limit is {self.limits.max_message_chars} (MEMORY_MAX_MESSAGE_CHARS)"
                )

    async def clear_messages(self, *, tenant_id: str, conversation_id: str) -> dict[str, Any]:
        """Seed 003's clearSession: entries and summaries go, the conversation and its policy
        stay, and it starts again as a new one would (app.repositories.transfer.clear). A summary
        in flight is dropped: its completion finds no row and changes nothing."""
        async with self.engine.begin() as conn:
            locked = await work.lock(conn, conversation_id=conversation_id, tenant_id=tenant_id)
            if locked is None:
                raise NotFound(f"conversation {conversation_id!r} not found")
            if locked.ended or locked.archived:
                raise read_only(conversation_id, ended=locked.ended)
            policy = load_policy(locked.memory_policy)
            cleared = await transfer.clear(conn, conversation_id=conversation_id, wake=policy.wake(EMPTY))
            if locked.user_id is not None:
                await users.conversation_gone(conn, tenant_id=locked.tenant_id, user_id=locked.user_id)
            await events.record(
                conn,
                conversation_id=conversation_id,
                type=events.SESSION_CLEARED,
                data={
                    "entries": cleared.entries,
                    "memories": cleared.memories,
                    "dropped_processing": cleared.dropped_processing,
                },
            )
        if locked.user_id is not None:
            self.runner.poke()
        if cleared.dropped_processing is not None:
            logger.info(
                "Cleared %s: summary %d in flight dropped", conversation_id, cleared.dropped_processing
            )
        return {
            "conversation_id": conversation_id,
            "entries": cleared.entries,
            "memories": cleared.memories,
            "dropped_processing": cleared.dropped_processing,
        }

    # ---- webhooks (app.webhooks sends them) ------------------------------------------------

    async def create_webhook(self, *, tenant_id: str, url: str) -> dict[str, Any]:
        """A new endpoint for the tenant's events, with its signing secret (shown only here)."""
        async with self.engine.begin() as conn:
            created = await webhooks.create(conn, tenant_id=tenant_id, url=url, secret=new_secret())
        if created is None:
            raise Conflict(f"a tenant has at most {webhooks.MAX_PER_TENANT} webhooks; delete one first")
        return created

    async def list_webhooks(self, *, tenant_id: str) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await webhooks.list_for(conn, tenant_id=tenant_id)

    async def delete_webhook(self, *, tenant_id: str, webhook_id: int) -> None:
        async with self.engine.begin() as conn:
            if not await webhooks.delete(conn, tenant_id=tenant_id, webhook_id=webhook_id):
                raise NotFound(f"webhook {webhook_id} not found")

    async def dead_deliveries(self, *, tenant_id: str | None, limit: int) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await webhooks.dead(conn, tenant_id=tenant_id, limit=limit)

    async def retry_delivery(
        self, *, tenant_id: str | None, webhook_id: int, conversation_id: str, event_id: int
    ) -> None:
        """Make a dead delivery due again (404 when there is none, 409 when it is not dead)."""
        async with self.engine.begin() as conn:
            before = await webhooks.retry_dead(
                conn,
                tenant_id=tenant_id,
                webhook_id=webhook_id,
                conversation_id=conversation_id,
                event_id=event_id,
            )
        if before is None:
            raise NotFound(f"no delivery of event {event_id} of {conversation_id!r} to webhook {webhook_id}")
        if before != "dead":
            raise Conflict(f"the delivery is {before}, not dead: only dead deliveries are retried")

    # ---- ops (``tenant_id`` None: every tenant, for the admin key) -------------------------

    async def summarize_now(self, *, tenant_id: str | None, conversation_id: str) -> dict[str, Any]:
        """Queue the summary the policy makes on request (trigger 'manual'): for the sliding
        window, the window ending at the newest message whatever the threshold says. 409 when one
        is already processing or the policy has nothing to summarize."""
        async with self.engine.begin() as conn:
            locked = await work.lock(conn, conversation_id=conversation_id, tenant_id=tenant_id)
            if locked is None:
                raise NotFound(f"conversation {conversation_id!r} not found")
            if locked.archived:
                raise read_only(conversation_id, ended=False)
            if locked.last_sequence < 0:
                raise Conflict("nothing to summarize: the conversation has no messages")
            policy, state, plan = await self._plan(
                conn, conversation_id=conversation_id, locked=locked, trigger=Trigger.MANUAL
            )
            if plan is None:
                raise Conflict(policy.nothing_due(state))
            row = await memory.insert_processing(
                conn, conversation_id=conversation_id, plan=plan, lease_seconds=None
            )
            if row is None:
                raise Conflict("a summary is already processing for this conversation")
            await work.settle(
                conn, conversation_id=conversation_id, wake=policy.wake(_with_started(state, row))
            )
        self._remember_request(conversation_id)
        self.runner.poke()
        return _memory_started(row)

    async def retry_memory(self, *, tenant_id: str | None, memory_id: int) -> dict[str, Any]:
        """Queue a failed memory again (same window and base)."""
        async with self.engine.begin() as conn:
            found = await memory.owner(conn, memory_id=memory_id, tenant_id=tenant_id)
            if found is None:
                raise NotFound(f"memory {memory_id} not found")
            conversation_id, status = found
            row = None
            if status == "failed":
                # The conversation's row first, as a round and a plan take it: a summary cannot
                # start meanwhile, and the locks are taken in the one order that cannot deadlock.
                if await work.lock(conn, conversation_id=conversation_id) is None:
                    raise NotFound(f"memory {memory_id} not found")  # deleted meanwhile
                row = await memory.restart_failed(conn, memory_id=memory_id)
                if row is None:  # retried by another request meanwhile, or another is processing
                    found = await memory.owner(conn, memory_id=memory_id, tenant_id=tenant_id)
                    status = status if found is None else found[1]
            if row is None:
                if status == "failed":
                    raise Conflict("a summary is already processing for this conversation")
                raise Conflict(f"memory {memory_id} is {status}; only failed memories can be retried")
        self._remember_request(row["conversation_id"])
        self.runner.poke()
        return _memory_started(row)

    async def work_totals(self, *, stuck_after_seconds: float) -> dict[str, Any]:
        """Every tenant's work, for /metrics (app.repositories.work.totals)."""
        async with self.engine.begin() as conn:
            return await work.totals(conn, stuck_after_seconds=stuck_after_seconds)

    async def summary_load(self, *, tenant_id: str) -> dict[str, Any]:
        async with self.engine.connect() as conn:
            return await work.tenant_load(conn, tenant_id=tenant_id)

    async def summary_loads_by_tenant(self) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await work.loads_by_tenant(conn)

    async def stuck(self, *, tenant_id: str | None, older_than_seconds: float) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await memory.stuck(conn, tenant_id=tenant_id, older_than_seconds=older_than_seconds)

    async def failing_conversations(self, *, tenant_id: str | None, limit: int) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await conversations.failing(conn, tenant_id=tenant_id, limit=limit)

    async def failures(self, *, tenant_id: str | None, limit: int) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await memory.failures(conn, tenant_id=tenant_id, limit=limit)

    async def window_progression(self, *, tenant_id: str | None, limit: int) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            return await memory.window_progression(conn, tenant_id=tenant_id, limit=limit)

    async def generation_stats(self, *, tenant_id: str | None) -> dict[str, Any]:
        async with self.engine.connect() as conn:
            return await memory.generation_stats(conn, tenant_id=tenant_id)
