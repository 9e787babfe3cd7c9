"""Request and response models: the HTTP contract."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    AfterValidator,
    AnyHttpUrl,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from app.api import examples
from app.memory.policies import PolicyConfig
from app.memory.types import Content

Role = Literal["user", "assistant", "system", "tool"]
EntryType = Literal["message", "tool_call", "tool_result", "context"]
# The names the policies, the memory table and the circuit breaker use (tests/unit check they agree).
PolicyName = Literal["sliding_window", "rolling_blocks", "token_budget", "recursive_summary"]
MemoryKind = Literal["window", "block", "compression", "fold", "medium_term", "compaction"]
MemoryStatus = Literal["processing", "completed", "failed"]
CircuitState = Literal["closed", "open", "half_open"]
# PostgreSQL's jsonb cannot store U+0000, so metadata strings exclude it (a 422, not a 500).
_NO_NUL = r"^[^\x00]*$"
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=_NO_NUL)]
_INT_RANGE = (-(2**63), 2**63 - 1)


def _exact_number(value: object) -> object:
    """Integers within 64 bits and finite floats: what JSON, orjson and PostgreSQL all store."""
    if isinstance(value, int) and not isinstance(value, bool) and not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
        raise ValueError("integers must fit in signed 64 bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("numbers must be finite (no NaN or Infinity)")
    return value


MetadataValue = Annotated[
    Annotated[str, StringConstraints(max_length=1000, pattern=_NO_NUL)] | int | float | bool | None,
    AfterValidator(_exact_number),
]
# The most messages one POST may hold (MEMORY_MAX_MESSAGES_PER_REQUEST is at most this).
MAX_MESSAGES_PER_REQUEST = 1000
CONVERSATION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,49}$"
USER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}$"


# Bounds of JSON content: what every layer (orjson, PostgreSQL's json, clients) handles exactly.
MAX_JSON_DEPTH = 64


def _check_text(value: str) -> None:
    try:
        value.encode()
    except UnicodeEncodeError:
        # JSON's \uD800-\uDFFF escapes can name half a character, which UTF-8 cannot store.
        raise ValueError("content holds an unpaired surrogate (a lone \\uD800-\\uDFFF escape)") from None


def _check_json(value: Any, depth: int = 0) -> None:
    """``depth`` counts the objects and arrays around ``value``."""
    if isinstance(value, str):
        _check_text(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise ValueError("JSON content holds an integer outside the signed 64-bit range")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("JSON content holds NaN or Infinity, which JSON cannot represent")
    elif isinstance(value, dict | list):
        if depth + 1 > MAX_JSON_DEPTH:
            raise ValueError(f"JSON content nests objects and arrays deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, dict):
            for key in value:
                _check_text(key)
        for item in value.values() if isinstance(value, dict) else value:
            _check_json(item, depth + 1)


def content_chars(content: Content) -> int:
    """The size a message's content is limited by: its characters, or its compact JSON's."""
    return len(content) if isinstance(content, str) else len(orjson.dumps(content).decode())


def _content(value: object) -> Content:
    """One clear error per kind of bad content (a union of types would report one per type)."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("content must not be empty or blank")
        if "\x00" in value:
            raise ValueError("content must not contain NUL characters")
        _check_text(value)
        return value
    if isinstance(value, dict | list):
        _check_json(value)
        return value
    raise ValueError("content must be a string, a JSON object or a JSON array")


def _examples(*values: Any) -> ConfigDict:
    """A model's example values in its JSON schema (the docs pages show the first)."""
    return ConfigDict(json_schema_extra={"examples": list(values)})


_NON_BLANK = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"
_CONTENT_SCHEMA = {
    "anyOf": [
        {"type": "string", "minLength": 1, "pattern": _NON_BLANK},
        {"type": "object"},
        {"type": "array"},
    ],
    "description": "Text, or a JSON object or array returned as posted.",
}


class RequestBody(BaseModel):
    """A request body: strict, and unknown fields refused with one error per object, naming a
    few (pydantic would report each of them, and a 4 MiB body can hold 300,000)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _unknown_fields(cls, value: object) -> object:
        if isinstance(value, dict):
            known = cls.model_fields  # a property: read once, not per key
            unknown = [key for key in value if key not in known]
            if unknown:
                named = ", ".join(repr(key)[:40] for key in unknown[:5])
                more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
                raise ValueError(f"unknown fields: {named}{more}")
        return value


ToolCallId = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=r"^[\x21-\x7e]+$")]


def _json_arguments(value: str) -> str:
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError:
        raise ValueError("function.arguments must be a JSON text (as the model wrote it)") from None
    return value


class ToolFunctionIn(RequestBody):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    arguments: Annotated[str, StringConstraints(max_length=100_000), AfterValidator(_json_arguments)] = Field(
        description="The call's arguments, a JSON text, as the model wrote it."
    )


class ToolCallIn(RequestBody):
    id: ToolCallId
    type: Literal["function"] = "function"
    function: ToolFunctionIn


class MessageIn(RequestBody):
    """A chat message as OpenAI's Chat Completions API takes it (role, content, name, an
    assistant's tool_calls, a tool message's tool_call_id), or seed 003's added context
    (``type: "context"`` with its ``source``); returned exactly as posted."""

    model_config = _examples(examples.MESSAGE_IN)

    role: Role
    # A string, an array of content parts, or a JSON object stored as posted (e.g. seed 000's
    # userRequest and aiResponse objects); null only for an assistant message that calls tools.
    content: Annotated[Content, PlainValidator(_content), WithJsonSchema(_CONTENT_SCHEMA)] | None = None
    name: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    tool_calls: list[ToolCallIn] | None = Field(
        default=None, min_length=1, max_length=128, description="An assistant's tool calls."
    )
    tool_call_id: ToolCallId | None = Field(default=None, description="The call a tool message answers.")
    type: Literal["message", "context"] = Field(
        default="message",
        description="`context` marks added context (a file, a document) rather than conversation.",
    )
    source: str | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        pattern=_NO_NUL,
        description="Where a context entry comes from.",
    )
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        default=None,
        max_length=64,
        description="Flat labels (strings, numbers, booleans, null) kept with the message.",
    )

    @model_validator(mode="after")
    def _shape(self) -> MessageIn:
        if self.tool_calls is not None:
            if self.role != "assistant":
                raise ValueError("only an assistant message may have tool_calls")
            ids = [call.id for call in self.tool_calls]
            if len(set(ids)) != len(ids):
                raise ValueError("tool_calls repeat an id")
        if self.role == "tool":
            if self.tool_call_id is None:
                raise ValueError("a tool message needs the tool_call_id of the call it answers")
        elif self.tool_call_id is not None:
            raise ValueError("only a tool message may have a tool_call_id")
        if self.content is None and self.tool_calls is None:
            raise ValueError("content is required (null only for an assistant message with tool_calls)")
        if self.type == "context":
            if self.role not in ("system", "user"):
                raise ValueError("a context entry has role system or user")
        elif self.source is not None:
            raise ValueError("source is for context entries (type: context)")
        return self

    @property
    def entry_type(self) -> EntryType:
        """Seed 003's type of the entry."""
        if self.type == "context":
            return "context"
        if self.tool_calls is not None:
            return "tool_call"
        return "tool_result" if self.role == "tool" else "message"


class AppendMessagesIn(RequestBody):
    model_config = _examples(examples.APPEND_MESSAGES_IN)

    # The schema's bound fails at once on a huge list, before any item is validated; the
    # deployment's (smaller) MEMORY_MAX_MESSAGES_PER_REQUEST is checked after. Both are a 413.
    messages: list[MessageIn] = Field(
        min_length=1, max_length=MAX_MESSAGES_PER_REQUEST, description="One round, oldest first."
    )
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        default=None,
        max_length=64,
        description="Flat key/value labels, merged into the conversation's metadata.",
    )

    @model_validator(mode="after")
    def _pairing(self) -> AppendMessagesIn:
        """Tool calls and results in Chat Completions order: an assistant's calls are followed
        by one tool message per call (in any order) before any other message. A round may end
        with calls unanswered; the next round then starts with their results. (Results of an
        earlier round's calls are checked against the conversation when the round is stored.)"""
        made: set[str] = set()
        made_later = {call.id for message in self.messages for call in message.tool_calls or ()}
        open_calls: set[str] = set()
        leading = True  # still in the round's leading tool messages
        for index, message in enumerate(self.messages):
            answer = message.tool_call_id
            if answer is not None:
                if answer in open_calls:
                    open_calls.discard(answer)
                elif answer in made_later - made:
                    raise ValueError(f"messages[{index}] answers tool call {answer!r} before it is made")
                elif not leading or answer in made:
                    raise ValueError(
                        f"messages[{index}] answers tool call {answer!r}, which is not waiting for a "
                        "result here (a tool message follows the assistant message that made the call)"
                    )
                continue
            leading = False
            if open_calls:
                raise ValueError(
                    f"messages[{index}] comes before the results of tool calls "
                    f"{', '.join(repr(c) for c in sorted(open_calls))}: a tool message for each call "
                    "follows the assistant message that made it"
                )
            for call in message.tool_calls or ():
                if call.id in made:
                    raise ValueError(f"tool call id {call.id!r} is used twice")
                made.add(call.id)
                open_calls.add(call.id)
        return self


class CreateConversationIn(RequestBody):
    model_config = _examples(examples.CREATE_CONVERSATION_IN)

    conversation_id: str = Field(pattern=CONVERSATION_ID_PATTERN)
    memory_policy: PolicyConfig | None = Field(
        default=None,
        description="The conversation's memory policy: a name and any parameters; the ones left "
        "out take the deployment's defaults. Unset: the deployment's MEMORY_POLICY.",
    )
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=64)
    user_id: str | None = Field(
        default=None,
        pattern=USER_ID_PATTERN,
        description="The user the conversation belongs to (one namespace per tenant); set once, here. "
        "Their conversations feed GET /users/{user_id}/context.",
    )


class UpdateConversationIn(RequestBody):
    model_config = _examples(examples.UPDATE_CONVERSATION_IN)

    memory_policy: PolicyConfig = Field(
        description="New parameters for the conversation's policy (its name, and the parameters to "
        "change; the others keep their values). Applies from the next round. Another name is a 409."
    )


class ToolFunctionOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"]
    function: ToolFunctionOut


class MessageOut(BaseModel):
    model_config = _examples(examples.MESSAGES[0])

    sequence: int
    round: int = Field(description="The round (POST) the message came in, from 0.")
    type: EntryType = Field(description="Seed 003's entry type: message, tool_call, tool_result or context.")
    role: Role
    content: Any = Field(
        description="As posted: a string, an array of content parts, a JSON object, or null."
    )
    name: str | None
    tool_calls: list[ToolCallOut] | None = Field(description="An assistant's tool calls, as posted.")
    tool_call_id: str | None
    source: str | None = Field(description="Where a context entry comes from.")
    tokens: int = Field(description="The message's tokens for the deployment's model (MEMORY_MODEL).")
    metadata: dict[str, Any] | None
    created_at: datetime


class MemoryStarted(BaseModel):
    model_config = _examples(examples.MEMORY_STARTED)

    memory_id: int
    kind: MemoryKind
    start_sequence: int
    end_sequence: int
    start_round: int
    end_round: int
    base_memory_id: int | None
    status: MemoryStatus
    created_at: datetime


class AppendMessagesOut(BaseModel):
    model_config = _examples(examples.APPEND_MESSAGES_OUT)

    conversation_id: str
    created: bool = Field(description="True when this request created the conversation.")
    round: int = Field(description="This round's number, from 0.")
    messages: list[MessageOut]
    summary_due: bool = Field(
        description="Whether a summary of the conversation is due after this round: a runner (this "
        "replica, another, or a worker) claims and starts it; GET .../context shows it as "
        "`processing` once it runs."
    )


class ContextSummary(BaseModel):
    model_config = _examples(examples.CONTEXT_SUMMARY)

    memory_id: int
    kind: MemoryKind
    text: str
    start_sequence: int
    end_sequence: int
    start_round: int
    end_round: int
    base_memory_id: int | None
    tokens: int = Field(description="Tokens of the summary's text.")
    input_tokens: int = Field(description="Tokens of the messages it covers.")
    from_at: datetime | None = Field(description="When the first message it covers was stored.")
    to_at: datetime | None = Field(description="When the last one was.")
    created_at: datetime
    completed_at: datetime | None
    generation_time_ms: int | None


class ProcessingMemory(BaseModel):
    model_config = _examples(examples.PROCESSING_MEMORY)

    memory_id: int
    kind: MemoryKind
    start_sequence: int
    end_sequence: int
    base_memory_id: int | None
    created_at: datetime


class OmittedMessages(BaseModel):
    model_config = _examples({"start_sequence": 0, "end_sequence": 1999, "count": 2000})

    start_sequence: int
    end_sequence: int
    count: int


class SummaryBackoff(BaseModel):
    model_config = _examples({"failures": 2, "retry_at": "2026-04-01T09:08:30.000000Z"})

    failures: int = Field(description="Summaries that failed in a row.")
    retry_at: datetime | None


class ContextTokens(BaseModel):
    summaries: int
    messages: int
    total: int


class ContextWindow(BaseModel):
    tokens: int
    used_percent: float


class UserSummaryBrief(BaseModel):
    memory_id: int
    text: str
    completed_at: datetime


class UserSummaryOut(BaseModel):
    memory_id: int
    status: MemoryStatus
    text: str = Field(description="Empty until completed.")
    base_memory_id: int | None = Field(description="The previous summary it evolved (the version chain).")
    sources: list[dict[str, Any]] = Field(
        description="The conversations it was built from, newest first: conversation_id, the "
        "summary of theirs it read (summary_memory_id) and their last sequence then."
    )
    created_at: datetime
    completed_at: datetime | None
    generation_time_ms: int | None
    attempts: int
    error: str | None
    tokens: int


class UserProcessing(BaseModel):
    memory_id: int
    base_memory_id: int | None
    created_at: datetime


class UserFreshness(BaseModel):
    fresh: bool = Field(description="True when no newer summary is due or running.")
    behind: Literal["processing", "due"] | None = Field(
        description="Why it is not fresh: a newer one is running, or due (a conversation ended or "
        "its summary advanced since)."
    )


class UserContextOut(BaseModel):
    model_config = _examples(examples.USER_CONTEXT)

    user_id: str
    summary: UserSummaryOut | None = Field(
        description="The latest completed cross-conversation summary of the user's last 5 "
        "conversations; never one half-built (null until the first completes)."
    )
    processing: UserProcessing | None = Field(description="A newer one being built.")
    freshness: UserFreshness


class UserMemoriesOut(BaseModel):
    model_config = _examples(examples.USER_MEMORIES)

    user_id: str
    memories: list[UserSummaryOut] = Field(description="Every version, newest first.")


class ContextOut(BaseModel):
    model_config = _examples(examples.CONTEXT, examples.CONTEXT_WHILE_PROCESSING)

    conversation_id: str
    policy: PolicyName = Field(description="The conversation's memory policy.")
    summaries: list[ContextSummary] = Field(
        description="The completed summaries the policy shows, newest first."
    )
    memory: ContextSummary | None = Field(description="The newest of summaries (null when none).")
    messages: list[MessageOut] = Field(
        description="The raw part, oldest first: every message after memory.end_sequence (all when "
        "memory is null), and at least the policy's recent rounds; capped to the newest "
        "MEMORY_MAX_CONTEXT_MESSAGES messages and MEMORY_MAX_CONTEXT_BYTES (then truncated)."
    )
    truncated: bool = Field(
        description="True when the caps (or ?max_tokens) left older raw messages out; "
        "omitted_messages says which."
    )
    omitted_messages: OmittedMessages | None = Field(description="The raw messages left out, if any.")
    processing: ProcessingMemory | None = Field(description="A newer summary still running.")
    summary_due: bool = Field(
        description="A summary is due and waits for a runner to start it (a worker's next claim); "
        "`processing` shows it once it runs. ?wait_for_pending waits for it too."
    )
    summary_backoff: SummaryBackoff | None = Field(
        description="Set while the conversation's summaries keep failing: no summary starts "
        "before retry_at (a manual one or a retry still can)."
    )
    last_sequence: int | None = Field(description="Sequence of the newest stored message.")
    tokens: ContextTokens = Field(description="The context's size in tokens, for the deployment's model.")
    context_window: ContextWindow | None = Field(
        description="With ?context_window=N: the share of a model's window of N tokens the context uses."
    )
    memory_lag_messages: int = Field(
        description="How many stored messages the newest summary does not cover."
    )
    waited: bool | None = Field(
        default=None,
        description="Only with ?wait_for_pending: true when a summary was processing or due and the "
        "read waited for it.",
    )
    pending: bool | None = Field(
        default=None,
        description="Only with ?wait_for_pending: true when the summary that was processing or due "
        "still is (the wait ran out); false when it completed or failed, or none was processing or due.",
    )
    user_summary: UserSummaryBrief | None = Field(
        default=None,
        description="For a conversation of a user: the user's latest completed cross-conversation "
        "summary (GET /users/{user_id}/context), so a new session needs no second call.",
    )


class OpenAIContextOut(BaseModel):
    """`?format=openai`: the body of a Chat Completions request's `messages`."""

    messages: list[dict[str, Any]] = Field(
        description="The summaries (after the user's cross-conversation summary, for a conversation of a "
        "user) as one leading system message, then the raw messages as posted "
        "(tool calls and results intact)."
    )


class AnthropicContextOut(BaseModel):
    """`?format=anthropic`: `system` and `messages` for the Messages API."""

    system: str | None = Field(
        default=None, description="The summaries and any system messages (absent when there are none)."
    )
    messages: list[dict[str, Any]] = Field(
        description="Strictly alternating, starting with the user; tool calls as tool_use and "
        "tool_result blocks."
    )


class MemoryOut(BaseModel):
    model_config = _examples(examples.MEMORY)

    memory_id: int
    kind: MemoryKind
    start_sequence: int
    end_sequence: int
    start_round: int
    end_round: int
    input_start_sequence: int = Field(description="The first message the summarizer was given.")
    base_memory_id: int | None
    status: MemoryStatus
    created_at: datetime
    completed_at: datetime | None
    generation_time_ms: int | None
    attempts: int
    error: str | None
    text: str
    base_end_seq: int | None
    shown: bool = Field(
        description="Whether the context shows it (completed and among the newest the policy shows)."
    )


class MemoriesOut(BaseModel):
    model_config = _examples(examples.MEMORIES)

    conversation_id: str
    memories: list[MemoryOut]


class MessagesPageOut(BaseModel):
    model_config = _examples(examples.MESSAGES_PAGE)

    conversation_id: str
    messages: list[MessageOut]
    next_after_sequence: int | None = Field(description="Pass as after_sequence for the next page.")


class ConversationOut(BaseModel):
    model_config = _examples(examples.CONVERSATION)

    conversation_id: str
    created_at: datetime
    metadata: dict[str, Any] | None = Field(description="Null in listings unless include_metadata.")
    memory_policy: PolicyConfig = Field(description="The resolved policy: its name and every parameter.")
    message_count: int
    round_count: int
    summary_failures: int = Field(description="Summaries that failed in a row (0 once one completes).")
    summary_retry_at: datetime | None = Field(description="No summary starts before this (backoff).")
    memory_count: int | None = None
    user_id: str | None = Field(default=None, description="The user it belongs to, if any.")
    ended_at: datetime | None = Field(
        default=None, description="When POST .../end ended it: read-only since (409 on new messages)."
    )
    last_message_at: datetime | None = Field(
        default=None,
        description="When its newest message was stored (creation, if none): the archive's clock.",
    )
    archived_at: datetime | None = Field(
        default=None,
        description="When it was archived (no message for MEMORY_ARCHIVE_AFTER_DAYS): read-only, "
        "out of listings unless asked for.",
    )


class EndConversationOut(ConversationOut):
    model_config = _examples(examples.ENDED_CONVERSATION)

    final_summary: MemoryStarted | None = Field(
        description="The final summary the policy started (for recursive_summary: one covering "
        "every message); null when none was due."
    )


class ConversationsPageOut(BaseModel):
    model_config = _examples(examples.CONVERSATIONS_PAGE)

    conversations: list[ConversationOut]
    next_after: str | None = Field(description="Pass as after for the next page.")


class FailingConversation(BaseModel):
    model_config = _examples(examples.FAILING_CONVERSATION)

    conversation_id: str
    summary_failures: int
    summary_retry_at: datetime | None
    last_error: str | None


class StuckMemory(BaseModel):
    model_config = _examples(examples.STUCK_MEMORY)

    conversation_id: str
    memory_id: int
    created_at: datetime
    lease_expires_at: datetime | None
    age_seconds: float


class FailedMemory(BaseModel):
    model_config = _examples(examples.FAILED_MEMORY)

    conversation_id: str
    memory_id: int
    start_sequence: int
    end_sequence: int
    created_at: datetime
    completed_at: datetime | None
    attempts: int
    error: str | None


class WindowRow(BaseModel):
    model_config = _examples(examples.WINDOW_ROW)

    conversation_id: str
    memory_id: int
    start_sequence: int
    end_sequence: int
    window_size: int
    generation_time_ms: int | None


class GenerationStats(BaseModel):
    model_config = _examples(examples.GENERATION_STATS)

    avg_ms: float | None
    max_ms: int | None
    p50_ms: float | None
    p95_ms: float | None
    total_summaries: int


class RunnerStats(BaseModel):
    model_config = _examples(examples.RUNNER_STATS)

    running: int = Field(description="Your summaries running now, on any replica or worker.")
    queued: int = Field(
        description="Your summaries planned and waiting for a runner (or for a retry after "
        "their runner stopped)."
    )
    due: int = Field(description="Your conversations whose next summary is due and not yet planned.")
    oldest_due_seconds: float | None = Field(description="How long the oldest of them has waited.")
    runs_summaries: bool = Field(
        description="Whether this replica claims and runs summaries (MEMORY_RUN_SUMMARIES)."
    )
    max_concurrent: int = Field(description="Summaries this replica runs at once at most.")
    llm_circuit: CircuitState = Field(description="closed, open (no summary starts) or half_open.")
    llm_consecutive_failures: int
    llm_circuit_retry_in_seconds: float


# ---- Stats, export and import, clearing -----------------------------------------------------------


class StatsOut(BaseModel):
    model_config = _examples(examples.STATS)

    conversation_id: str
    policy: PolicyName
    total_entries: int = Field(description="Every stored entry (message, tool call, tool result, context).")
    active_entries: int = Field(description="Entries after the newest summary the context shows: shown raw.")
    compressed_entries: int = Field(
        description="Entries up to the newest shown summary's end: the summaries stand for them."
    )
    summaries: int = Field(description="Completed summaries the context shows.")
    total_tokens: int
    active_tokens: int = Field(description="Tokens of the active entries.")
    compressed_tokens: int = Field(description="Tokens of the compressed entries.")
    summary_tokens: int = Field(description="Tokens of the summaries the context shows.")
    context_tokens: int = Field(description="summary_tokens + active_tokens: the context before any cap.")
    tokens_saved: int = Field(
        description="compressed_tokens - summary_tokens: what the summaries save (seed 003's tokensSaved)."
    )
    processing: bool = Field(description="Whether a summary of the conversation is in flight.")


_OUT_OF_RANGE = (
    "timestamp is out of range: in UTC it must fall strictly between 0001-01-01T00:00:00Z and "
    "9999-12-31T23:59:59.999999Z"
)


def _in_utc(value: datetime) -> datetime:
    """The instant in UTC; one whose UTC year falls outside 1..9999 (e.g. 0001-01-01T00:00+14:00)
    is refused here rather than failing to convert later, and so are the first and last instants,
    which asyncpg stores as -infinity and infinity (an export could not give them back)."""
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        raise ValueError(_OUT_OF_RANGE) from None
    if utc.replace(tzinfo=None) in (datetime.min, datetime.max):
        raise ValueError(_OUT_OF_RANGE)
    return utc


# Timestamps are read leniently (ISO strings), the rest of a document strictly; each is kept in UTC.
Timestamp = Annotated[AwareDatetime, Field(strict=False), AfterValidator(_in_utc)]
_INT32 = 2**31 - 1


class ExportedConversation(RequestBody):
    conversation_id: str = Field(pattern=CONVERSATION_ID_PATTERN)
    created_at: Timestamp
    memory_policy: PolicyConfig = Field(description="The resolved policy: its name and every parameter.")
    metadata: dict[MetadataKey, MetadataValue]
    user_id: str | None = Field(default=None, pattern=USER_ID_PATTERN, description="The user it belongs to.")
    ended_at: Timestamp | None = Field(
        default=None, description="When it was ended (POST .../end): imported read-only, as it was."
    )


class ExportedEntry(MessageIn):
    """A stored entry: the chat message as posted, its place, type, tokens and time."""

    model_config = ConfigDict(json_schema_extra={"examples": [examples.MESSAGES[0]]})

    sequence: int = Field(ge=0, le=_INT32)
    round: int = Field(ge=0, le=_INT32)
    type: EntryType = Field(description="Seed 003's entry type; must agree with role and tool calls.")  # type: ignore[assignment]
    tokens: int = Field(ge=0, le=_INT32, description="As counted when the entry was first stored.")
    created_at: Timestamp

    @model_validator(mode="after")
    def _typed(self) -> ExportedEntry:
        if self.type != self.entry_type:
            raise ValueError(f"an entry with this role and these fields has type {self.entry_type!r}")
        return self


class ExportedMemory(RequestBody):
    """A memory row: a summary (or its failed attempt) over a range of entries."""

    model_config = _examples(examples.EXPORTED_MEMORY)

    memory_id: int = Field(ge=1, le=_INT32, description="Its id in this document (import gives new ones).")
    kind: MemoryKind
    status: MemoryStatus
    start_sequence: int = Field(ge=0, le=_INT32)
    end_sequence: int = Field(ge=0, le=_INT32)
    start_round: int = Field(ge=0, le=_INT32)
    end_round: int = Field(ge=0, le=_INT32)
    input_start_sequence: int = Field(ge=0, le=_INT32)
    base_memory_id: int | None = Field(default=None, ge=1, le=_INT32)
    text: str = Field(max_length=10_000_000, pattern=_NO_NUL)
    tokens: int = Field(ge=0, le=_INT32)
    input_tokens: int = Field(ge=0, le=2**62)
    from_at: Timestamp | None = None
    to_at: Timestamp | None = None
    created_at: Timestamp
    completed_at: Timestamp | None = None
    generation_time_ms: int | None = Field(default=None, ge=0, le=_INT32)
    attempts: int = Field(ge=0, le=_INT32)
    error: str | None = Field(default=None, max_length=10_000, pattern=_NO_NUL)


class ConversationExport(RequestBody):
    """A whole conversation: what GET .../export answers and POST /conversations/import takes."""

    model_config = _examples(examples.EXPORT)

    format: Literal["memory-service.conversation"]
    version: Literal[1]
    conversation: ExportedConversation
    entries: list[ExportedEntry] = Field(description="Every entry, by sequence from 0.")
    memories: list[ExportedMemory] = Field(description="Every memory row, by memory_id.")


class ImportedOut(BaseModel):
    model_config = _examples(examples.IMPORTED)

    conversation_id: str
    entries: int
    memories: int = Field(description="Memory rows stored (completed and failed).")
    dropped_processing: int = Field(
        description="Summaries that were in flight when exported: not imported; the policy plans again."
    )
    summary_due: bool = Field(description="Whether a summary is due at once (a runner starts it).")


class ClearedOut(BaseModel):
    model_config = _examples(examples.CLEARED)

    conversation_id: str
    entries: int = Field(description="Entries deleted.")
    memories: int = Field(description="Memory rows deleted.")
    dropped_processing: int | None = Field(
        description="The summary that was in flight (dropped: its result is discarded), if any."
    )


# ---- Webhooks ----------------------------------------------------------------------------------


class WebhookIn(RequestBody):
    model_config = _examples(examples.WEBHOOK_IN)

    url: AnyHttpUrl = Field(description="Where the tenant's events are POSTed (http or https).")

    @field_validator("url")
    @classmethod
    def _short(cls, value: AnyHttpUrl) -> AnyHttpUrl:
        if len(str(value)) > 2000:
            raise ValueError("at most 2000 characters")
        return value


class WebhookOut(BaseModel):
    model_config = _examples(examples.WEBHOOK)

    webhook_id: int
    url: str
    created_at: datetime


class WebhookCreated(WebhookOut):
    model_config = _examples(examples.WEBHOOK_CREATED)

    secret: str = Field(
        description="The key of the Memory-Signature HMAC: shown only in this answer, so store it now."
    )


class RetriedDelivery(BaseModel):
    model_config = _examples(examples.RETRIED_DELIVERY)

    conversation_id: str
    event_id: int
    webhook_id: int
    status: Literal["pending"] = Field(description="Due now, with a fresh set of attempts.")


class DeadDelivery(BaseModel):
    model_config = _examples(examples.DEAD_DELIVERY)

    conversation_id: str
    event_id: int
    webhook_id: int
    url: str
    type: str | None = Field(description="The event's type (null once the event expired).")
    attempts: int
    last_error: str | None
    created_at: datetime


# ---- Errors: every error body is {"detail", "code"} (app.api.responses documents each status) ----

ErrorCode = Literal[
    "bad_request",
    "unauthorized",
    "not_found",
    "method_not_allowed",
    "request_timeout",
    "conflict",
    "payload_too_large",
    "unsupported_media_type",
    "invalid_request",
    "too_many_requests",
    "header_too_large",
    "internal_error",
    "unavailable",
    "http_error",
]


class ErrorOut(BaseModel):
    detail: str = Field(description="What went wrong, for a person (names the setting of a limit).")
    code: ErrorCode = Field(description="What went wrong, for a program: one per status.")


class FieldError(BaseModel):
    loc: list[str | int] = Field(description="Where: body, path, query or header, then the field's path.")
    msg: str
    type: str = Field(description="pydantic's error type (``more`` for the line counting the rest).")


class ValidationErrorOut(BaseModel):
    detail: list[FieldError] = Field(description="The first 20 errors, then one line counting the rest.")
    code: Literal["invalid_request"]


class InternalErrorOut(BaseModel):
    detail: Literal["internal error"]
    code: Literal["internal_error"]
    request_id: str | None = Field(description="The X-Request-ID the traceback is logged with.")


class HealthOut(BaseModel):
    model_config = _examples({"status": "ok"})

    status: Literal["ok"]


class ReadyOut(BaseModel):
    model_config = _examples({"status": "ready", "migration": "0003"})

    status: Literal["ready"]
    migration: str | None = Field(description="The database's Alembic revision (this code's head).")


class NotReadyOut(BaseModel):
    status: Literal["unavailable"]
    detail: str


# ---- The admin view (MEMORY_ADMIN_KEY): the ops rows of every tenant, each with its tenant ------


class AdminStuckMemory(StuckMemory):
    tenant_id: str


class AdminFailedMemory(FailedMemory):
    tenant_id: str


class AdminFailingConversation(FailingConversation):
    tenant_id: str


class AdminDeadDelivery(DeadDelivery):
    tenant_id: str


class AdminWindowRow(WindowRow):
    tenant_id: str


class TenantLoad(BaseModel):
    tenant_id: str
    running: int
    queued: int
    due: int
    oldest_due_seconds: float | None


class AdminRunnerStats(RunnerStats):
    """``running``, ``queued``, ``due`` and ``oldest_due_seconds`` over every tenant."""

    tenants: list[TenantLoad] = Field(description="Each tenant with summary work, by tenant id.")
