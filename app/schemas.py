"""Request and response models: the HTTP contract."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

Role = Literal["user", "assistant", "system", "tool"]
CONVERSATION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,49}$"
ConversationId = Annotated[str, StringConstraints(pattern=CONVERSATION_ID_PATTERN)]


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Role
    content: str = Field(min_length=1)

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
    metadata: dict[str, Any] | None = Field(
        default=None, description="Merged into the conversation's metadata (shallow)."
    )

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # PostgreSQL's jsonb cannot store U+0000; refuse it here rather than fail on insert.
        if value is not None and _contains_nul(value):
            raise ValueError("metadata must not contain NUL characters")
        return value


def _contains_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_contains_nul(k) or _contains_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_contains_nul(v) for v in value)
    return False


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
