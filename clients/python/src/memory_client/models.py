"""The service's answers as typed models.

Each mirrors the service's schema of the same name less the ``Out`` suffix (a test compares
their fields with the service's OpenAPI document). Unknown fields are kept (``extra="allow"``), so
an older client keeps working against a newer service; enums are plain strings for the same
reason."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class ToolFunction(Model):
    name: str
    arguments: str


class ToolCall(Model):
    id: str
    type: str
    function: ToolFunction


class Message(Model):
    sequence: int
    round: int
    type: str
    role: str
    content: Any
    name: str | None
    tool_calls: list[ToolCall] | None
    tool_call_id: str | None
    source: str | None
    tokens: int
    metadata: dict[str, Any] | None
    created_at: datetime

    def to_openai(self) -> dict[str, Any]:
        """The message as posted: a Chat Completions message."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls is not None:
            message["tool_calls"] = [call.model_dump(exclude_unset=True) for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class MemoryStarted(Model):
    memory_id: int
    kind: str
    start_sequence: int
    end_sequence: int
    start_round: int
    end_round: int
    base_memory_id: int | None
    status: str
    created_at: datetime


class AppendMessages(Model):
    conversation_id: str
    created: bool
    round: int
    messages: list[Message]
    summary_due: bool
    replayed: bool = Field(
        default=False,
        description="Set by the client: the service answered a retry with the same Idempotency-Key "
        "(the round was stored once, by an earlier attempt).",
    )


class ContextSummary(Model):
    memory_id: int
    kind: str
    text: str
    start_sequence: int
    end_sequence: int
    start_round: int
    end_round: int
    base_memory_id: int | None
    tokens: int
    input_tokens: int
    from_at: datetime | None
    to_at: datetime | None
    created_at: datetime
    completed_at: datetime | None
    generation_time_ms: int | None


class ProcessingMemory(Model):
    memory_id: int
    kind: str
    start_sequence: int
    end_sequence: int
    base_memory_id: int | None
    created_at: datetime


class OmittedMessages(Model):
    start_sequence: int
    end_sequence: int
    count: int


class SummaryBackoff(Model):
    failures: int
    retry_at: datetime | None


class ContextTokens(Model):
    summaries: int
    messages: int
    total: int


class ContextWindow(Model):
    tokens: int
    used_percent: float


class UserSummaryBrief(Model):
    memory_id: int
    text: str
    completed_at: datetime


class Context(Model):
    conversation_id: str
    policy: str
    summaries: list[ContextSummary]
    memory: ContextSummary | None
    messages: list[Message]
    truncated: bool
    omitted_messages: OmittedMessages | None
    processing: ProcessingMemory | None
    summary_due: bool = False  # absent from servers before it was added
    summary_backoff: SummaryBackoff | None
    last_sequence: int | None
    tokens: ContextTokens
    context_window: ContextWindow | None
    memory_lag_messages: int
    waited: bool | None = None
    pending: bool | None = None
    user_summary: UserSummaryBrief | None = None


class Memory(Model):
    memory_id: int
    kind: str
    start_sequence: int
    end_sequence: int
    start_round: int
    end_round: int
    input_start_sequence: int
    base_memory_id: int | None
    status: str
    created_at: datetime
    completed_at: datetime | None
    generation_time_ms: int | None
    attempts: int
    error: str | None
    text: str
    base_end_seq: int | None
    shown: bool


class Memories(Model):
    conversation_id: str
    memories: list[Memory]


class MessagesPage(Model):
    conversation_id: str
    messages: list[Message]
    next_after_sequence: int | None


class Conversation(Model):
    conversation_id: str
    created_at: datetime
    metadata: dict[str, Any] | None
    memory_policy: dict[str, Any]
    message_count: int
    round_count: int
    summary_failures: int
    summary_retry_at: datetime | None
    memory_count: int | None = None
    user_id: str | None = None
    ended_at: datetime | None = None
    last_message_at: datetime | None = None
    archived_at: datetime | None = None


class EndConversation(Conversation):
    final_summary: MemoryStarted | None


class ConversationsPage(Model):
    conversations: list[Conversation]
    next_after: str | None


class FailingConversation(Model):
    conversation_id: str
    summary_failures: int
    summary_retry_at: datetime | None
    last_error: str | None


class StuckMemory(Model):
    conversation_id: str
    memory_id: int
    created_at: datetime
    lease_expires_at: datetime | None
    age_seconds: float


class FailedMemory(Model):
    conversation_id: str
    memory_id: int
    start_sequence: int
    end_sequence: int
    created_at: datetime
    completed_at: datetime | None
    attempts: int
    error: str | None


class WindowRow(Model):
    conversation_id: str
    memory_id: int
    start_sequence: int
    end_sequence: int
    window_size: int
    generation_time_ms: int | None


class GenerationStats(Model):
    avg_ms: float | None
    max_ms: int | None
    p50_ms: float | None
    p95_ms: float | None
    total_summaries: int


class RunnerStats(Model):
    running: int
    queued: int
    due: int
    oldest_due_seconds: float | None
    runs_summaries: bool
    max_concurrent: int
    llm_circuit: str
    llm_consecutive_failures: int
    llm_circuit_retry_in_seconds: float


class AdminStuckMemory(StuckMemory):
    tenant_id: str


class AdminFailedMemory(FailedMemory):
    tenant_id: str


class AdminFailingConversation(FailingConversation):
    tenant_id: str


class AdminWindowRow(WindowRow):
    tenant_id: str


class TenantLoad(Model):
    tenant_id: str
    running: int
    queued: int
    due: int
    oldest_due_seconds: float | None


class AdminRunnerStats(RunnerStats):
    tenants: list[TenantLoad]


class Health(Model):
    status: str


class Ready(Model):
    status: str
    migration: str | None


class Stats(Model):
    """Seed 003's stats, plus tokens saved: O(1) in the conversation's length."""

    conversation_id: str
    policy: str
    total_entries: int
    active_entries: int
    compressed_entries: int
    summaries: int
    total_tokens: int
    active_tokens: int
    compressed_tokens: int
    summary_tokens: int
    context_tokens: int
    tokens_saved: int
    processing: bool


class Imported(Model):
    conversation_id: str
    entries: int
    memories: int
    dropped_processing: int
    summary_due: bool


class Cleared(Model):
    conversation_id: str
    entries: int
    memories: int
    dropped_processing: int | None


class OpenAIContext(Model):
    """``format=openai``: ``messages`` for Chat Completions (the summaries as one leading system
    message, then the raw messages as posted)."""

    messages: list[dict[str, Any]]


class AnthropicContext(Model):
    """``format=anthropic``: ``system`` and ``messages`` for the Messages API."""

    system: str | None = None
    messages: list[dict[str, Any]]


class UserSummary(Model):
    memory_id: int
    status: str
    text: str
    base_memory_id: int | None
    sources: list[dict[str, Any]]
    created_at: datetime
    completed_at: datetime | None
    generation_time_ms: int | None
    attempts: int
    error: str | None
    tokens: int


class UserProcessing(Model):
    memory_id: int
    base_memory_id: int | None
    created_at: datetime


class UserFreshness(Model):
    fresh: bool
    behind: str | None


class UserContext(Model):
    user_id: str
    summary: UserSummary | None
    processing: UserProcessing | None
    freshness: UserFreshness


class UserMemories(Model):
    user_id: str
    memories: list[UserSummary]


class Webhook(Model):
    webhook_id: int
    url: str
    created_at: datetime


class WebhookCreated(Webhook):
    """The signing secret is in this answer only."""

    secret: str


class DeadDelivery(Model):
    conversation_id: str
    event_id: int
    webhook_id: int
    url: str
    type: str | None
    attempts: int
    last_error: str | None
    created_at: datetime


class AdminDeadDelivery(DeadDelivery):
    tenant_id: str


class RetriedDelivery(Model):
    conversation_id: str
    event_id: int
    webhook_id: int
    status: str


class Event(Model):
    """One event of ``GET /conversations/{id}/events`` (its ``data`` line): ``type`` is
    ``entry:added``, ``summary:started``, ``summary:completed``, ... and ``data`` what it reports.
    The stream is text/event-stream, so the OpenAPI document has no schema for it."""

    event_id: int
    type: str
    created_at: datetime
    data: dict[str, Any]
