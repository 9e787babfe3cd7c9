"""Request and response models: the HTTP contract."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

Role = Literal["user", "assistant", "system", "tool"]
# PostgreSQL's jsonb cannot store U+0000, so metadata strings exclude it (a 422, not a 500).
_NO_NUL = r"^[^\x00]*$"
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=_NO_NUL)]
MetadataValue = (
    Annotated[str, StringConstraints(max_length=1000, pattern=_NO_NUL)] | int | float | bool | None
)
CONVERSATION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,49}$"


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Role
    # The pattern (no NUL, at least one non-blank character) is checked by the validator below,
    # which says precisely what is wrong; it is in the schema so clients and fuzzers know it.
    content: str = Field(min_length=1, json_schema_extra={"pattern": "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"})

    @field_validator("content")
    @classmethod
    def _content(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("content must not be blank")
        if "\x00" in value:
            raise ValueError("content must not contain NUL characters")
        return value


class AppendMessagesIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    messages: list[MessageIn] = Field(min_length=1)
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        default=None,
        max_length=64,
        description="Flat key/value labels, merged into the conversation's metadata.",
    )


class MessageOut(BaseModel):
    sequence: int
    role: str
    content: str
    created_at: datetime


class MemoryStarted(BaseModel):
    memory_id: int
    start_sequence: int
    end_sequence: int
    base_memory_id: int | None
    status: str
    created_at: datetime


class AppendMessagesOut(BaseModel):
    conversation_id: str
    created: bool = Field(description="True when this request created the conversation.")
    messages: list[MessageOut]
    memory: MemoryStarted | None = Field(description="The summary this round started, if the trigger fired.")


class ContextMemory(BaseModel):
    memory_id: int
    text: str
    start_sequence: int
    end_sequence: int
    base_memory_id: int | None
    created_at: datetime
    completed_at: datetime | None
    generation_time_ms: int | None


class ProcessingMemory(BaseModel):
    memory_id: int
    start_sequence: int
    end_sequence: int
    base_memory_id: int | None
    created_at: datetime


class ContextOut(BaseModel):
    conversation_id: str
    memory: ContextMemory | None = Field(description="The latest completed memory.")
    messages: list[MessageOut] = Field(
        description="The gap: every message after memory.end_sequence (all when memory is null)."
    )
    processing: ProcessingMemory | None = Field(description="A newer summary still running.")
    last_sequence: int | None = Field(description="Sequence of the newest stored message.")
    memory_lag_messages: int = Field(
        description="How many stored messages the memory does not cover (the gap's length)."
    )


class MemoryOut(BaseModel):
    memory_id: int
    start_sequence: int
    end_sequence: int
    base_memory_id: int | None
    status: str
    created_at: datetime
    completed_at: datetime | None
    generation_time_ms: int | None
    attempts: int
    error: str | None
    text: str
    base_end_seq: int | None


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
    metadata: dict[str, Any]
    message_count: int
    memory_count: int | None = None


class ConversationsPageOut(BaseModel):
    conversations: list[ConversationOut]
    next_after: str | None = Field(description="Pass as after for the next page.")


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
    running: int
    waiting: int
    max_concurrent: int
    max_pending: int


class ErrorOut(BaseModel):
    detail: Any
    code: str
