"""Request and response models: the HTTP contract."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)

from app.memory.policies import PolicyConfig
from app.memory.types import Content

Role = Literal["user", "assistant", "system", "tool"]
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
            unknown = [key for key in value if key not in cls.model_fields]
            if unknown:
                named = ", ".join(repr(key)[:40] for key in unknown[:5])
                more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
                raise ValueError(f"unknown fields: {named}{more}")
        return value


class MessageIn(RequestBody):
    role: Role
    # A string, or a JSON object or array stored as posted (e.g. seed 000's userRequest and
    # aiResponse objects).
    content: Annotated[Content, PlainValidator(_content), WithJsonSchema(_CONTENT_SCHEMA)]
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        default=None,
        max_length=64,
        description="Flat labels (strings, numbers, booleans, null) kept with the message.",
    )


class AppendMessagesIn(RequestBody):
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


class CreateConversationIn(RequestBody):
    conversation_id: str = Field(pattern=CONVERSATION_ID_PATTERN)
    memory_policy: PolicyConfig | None = Field(
        default=None,
        description="The conversation's memory policy: a name and any parameters; the ones left "
        "out take the deployment's defaults. Unset: the deployment's MEMORY_POLICY.",
    )
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=64)


class MessageOut(BaseModel):
    sequence: int
    round: int = Field(description="The round (POST) the message came in, from 0.")
    role: str
    content: Any = Field(description="As posted: a string, or a JSON object or array.")
    metadata: dict[str, Any] | None
    created_at: datetime


class MemoryStarted(BaseModel):
    memory_id: int
    kind: str
    start_sequence: int
    end_sequence: int
    start_round: int
    end_round: int
    base_memory_id: int | None
    status: str
    created_at: datetime


class AppendMessagesOut(BaseModel):
    conversation_id: str
    created: bool = Field(description="True when this request created the conversation.")
    round: int = Field(description="This round's number, from 0.")
    messages: list[MessageOut]
    memory: MemoryStarted | None = Field(description="The summary this round started, if the trigger fired.")


class ContextSummary(BaseModel):
    memory_id: int
    kind: str
    text: str
    start_sequence: int
    end_sequence: int
    start_round: int
    end_round: int
    base_memory_id: int | None
    created_at: datetime
    completed_at: datetime | None
    generation_time_ms: int | None


class ProcessingMemory(BaseModel):
    memory_id: int
    kind: str
    start_sequence: int
    end_sequence: int
    base_memory_id: int | None
    created_at: datetime


class OmittedMessages(BaseModel):
    start_sequence: int
    end_sequence: int
    count: int


class SummaryBackoff(BaseModel):
    failures: int = Field(description="Summaries that failed in a row.")
    retry_at: datetime | None


class ContextOut(BaseModel):
    conversation_id: str
    policy: str = Field(description="The conversation's memory policy.")
    summaries: list[ContextSummary] = Field(
        description="The completed summaries the policy shows, newest first."
    )
    memory: ContextSummary | None = Field(description="The newest of summaries (null when none).")
    messages: list[MessageOut] = Field(
        description="The raw part, oldest first: every message after memory.end_sequence (all when "
        "memory is null), and at least the policy's recent rounds; capped to the newest "
        "MEMORY_MAX_CONTEXT_MESSAGES messages and MEMORY_MAX_CONTEXT_BYTES (then truncated)."
    )
    truncated: bool = Field(description="True when the caps left older raw messages out.")
    omitted_messages: OmittedMessages | None = Field(description="The raw messages left out, if any.")
    processing: ProcessingMemory | None = Field(description="A newer summary still running.")
    summary_backoff: SummaryBackoff | None = Field(
        description="Set while the conversation's summaries keep failing: no summary starts "
        "before retry_at (a manual one or a retry still can)."
    )
    last_sequence: int | None = Field(description="Sequence of the newest stored message.")
    memory_lag_messages: int = Field(
        description="How many stored messages the newest summary does not cover."
    )


class MemoryOut(BaseModel):
    memory_id: int
    kind: str
    start_sequence: int
    end_sequence: int
    start_round: int
    end_round: int
    input_start_sequence: int = Field(description="The first message the summarizer was given.")
    base_memory_id: int | None
    status: str
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
    conversation_id: str
    memories: list[MemoryOut]


class MessagesPageOut(BaseModel):
    conversation_id: str
    messages: list[MessageOut]
    next_after_sequence: int | None = Field(description="Pass as after_sequence for the next page.")


class ConversationOut(BaseModel):
    conversation_id: str
    created_at: datetime
    metadata: dict[str, Any] | None = Field(description="Null in listings unless include_metadata.")
    memory_policy: dict[str, Any] = Field(description="The resolved policy: its name and every parameter.")
    message_count: int
    round_count: int
    summary_failures: int = Field(description="Summaries that failed in a row (0 once one completes).")
    summary_retry_at: datetime | None = Field(description="No summary starts before this (backoff).")
    memory_count: int | None = None


class ConversationsPageOut(BaseModel):
    conversations: list[ConversationOut]
    next_after: str | None = Field(description="Pass as after for the next page.")


class FailingConversation(BaseModel):
    conversation_id: str
    summary_failures: int
    summary_retry_at: datetime | None
    last_error: str | None


class StuckMemory(BaseModel):
    conversation_id: str
    memory_id: int
    created_at: datetime
    lease_expires_at: datetime | None
    age_seconds: float


class FailedMemory(BaseModel):
    conversation_id: str
    memory_id: int
    start_sequence: int
    end_sequence: int
    created_at: datetime
    completed_at: datetime | None
    attempts: int
    error: str | None


class WindowRow(BaseModel):
    conversation_id: str
    memory_id: int
    start_sequence: int
    end_sequence: int
    window_size: int
    generation_time_ms: int | None


class GenerationStats(BaseModel):
    avg_ms: float | None
    max_ms: int | None
    p50_ms: float | None
    p95_ms: float | None
    total_summaries: int


class RunnerStats(BaseModel):
    accepting: bool
    llm_circuit: str = Field(description="closed, open (no summary starts) or half_open.")
    llm_consecutive_failures: int
    llm_circuit_retry_in_seconds: float
    running: int
    waiting: int
    max_concurrent: int
    max_pending: int


class ErrorOut(BaseModel):
    detail: Any
    code: str
