"""Table definitions (SQLAlchemy Core). The Alembic migrations are the source of truth for DDL;
these mirror them so queries are typed and the naming convention keeps constraint names stable."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSON, JSONB

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


conversations = Table(
    "conversations",
    metadata,
    Column("conversation_id", String(50), primary_key=True),
    Column("tenant_id", String(64), nullable=False, server_default="default"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("metadata", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("next_sequence", Integer, nullable=False, server_default="0"),
    Column("next_round", Integer, nullable=False, server_default="0"),
    Column("memory_policy", JSONB, nullable=False),
    Column("context_summaries", Integer, nullable=False, server_default="1"),
    Column("context_recent_rounds", Integer, nullable=False, server_default="0"),
    Column("summary_failures", Integer, nullable=False, server_default="0"),
    Column("summary_retry_at", DateTime(timezone=True), nullable=True),
    Column("summary_due_at", DateTime(timezone=True), nullable=True),
    Column("next_tokens", BigInteger, nullable=False, server_default="0"),
    Column("open_tool_calls", Integer, nullable=False, server_default="0"),
    Column("wake_round", Integer, nullable=False, server_default="0"),
    Column("wake_sequence", Integer, nullable=False, server_default="0"),
    Column("wake_tokens", BigInteger, nullable=True),
    # The id of the conversation's newest event (app.repositories.events), and until when a
    # stream (or a waiting read) watches it: only then do its writes send a NOTIFY.
    Column("last_event_id", BigInteger, nullable=False, server_default="0"),
    Column("events_watched_until", DateTime(timezone=True), nullable=True),
    Column("context_max_summary_tokens", Integer, nullable=True),
    Column("user_id", String(64), nullable=True),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Column("archived_at", DateTime(timezone=True), nullable=True),
    Column("last_message_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("summary_failures >= 0", name="summary_failures"),
    CheckConstraint("context_summaries >= 1 AND context_recent_rounds >= 0", name="context"),
    Index("ix_conversations_tenant_id_conversation_id", "tenant_id", "conversation_id"),
    Index(
        "ix_conversations_summary_due_at",
        "summary_due_at",
        postgresql_where=text("summary_due_at IS NOT NULL"),
    ),
    # A claim's per-tenant walk of the oldest due conversations (app.repositories.work).
    Index(
        "ix_conversations_due_by_tenant",
        "tenant_id",
        "summary_due_at",
        "conversation_id",
        postgresql_where=text("summary_due_at IS NOT NULL"),
    ),
    Index(
        "ix_conversations_user",
        "tenant_id",
        "user_id",
        text("last_message_at DESC"),
        postgresql_where=text("user_id IS NOT NULL"),
    ),
    Index("ix_conversations_archivable", "last_message_at", postgresql_where=text("archived_at IS NULL")),
    Index(
        "ix_conversations_archived",
        "tenant_id",
        "conversation_id",
        postgresql_where=text("archived_at IS NOT NULL"),
    ),
)

messages = Table(
    "messages",
    metadata,
    Column(
        "conversation_id",
        String(50),
        ForeignKey("conversations.conversation_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("sequence", Integer, nullable=False),
    Column("round", Integer, nullable=False),
    Column("role", String(16), nullable=False),
    Column("content", JSON, nullable=True),
    Column("metadata", JSON, nullable=True),
    Column("content_bytes", Integer, nullable=False),
    Column("kind", String(16), nullable=False, server_default="message"),
    Column("name", String(64), nullable=True),
    Column("tool_calls", JSON, nullable=True),
    Column("tool_call_id", String(100), nullable=True),
    Column("source", String(1000), nullable=True),
    Column("tokens", Integer, nullable=False, server_default="0"),
    Column("tokens_before", BigInteger, nullable=False, server_default="0"),
    Column("boundary", Boolean, nullable=False, server_default=text("false")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("conversation_id", "sequence", name="uq_messages_conversation_sequence"),
    CheckConstraint("role IN ('user', 'assistant', 'system', 'tool')", name="role"),
    CheckConstraint("sequence >= 0", name="sequence_non_negative"),
    CheckConstraint("round >= 0", name="round_non_negative"),
    CheckConstraint("content_bytes >= 0", name="content_bytes_non_negative"),
    CheckConstraint("kind IN ('message', 'tool_call', 'tool_result', 'context')", name="kind"),
    CheckConstraint("tokens >= 0 AND tokens_before >= 0", name="tokens_non_negative"),
    Index("ix_messages_boundary", "conversation_id", "sequence", postgresql_where=text("boundary")),
    Index("ix_messages_boundary_round", "conversation_id", "round", postgresql_where=text("boundary")),
)

tool_calls = Table(
    "tool_calls",
    metadata,
    Column(
        "conversation_id",
        String(50),
        ForeignKey("conversations.conversation_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("call_id", String(100), nullable=False),
    Column("sequence", Integer, nullable=False),
    PrimaryKeyConstraint("conversation_id", "call_id", name="pk_tool_calls"),
)

# One result per call, and only for a call made earlier in the conversation: the keys decide.
tool_results = Table(
    "tool_results",
    metadata,
    Column("conversation_id", String(50), nullable=False),
    Column("call_id", String(100), nullable=False),
    Column("sequence", Integer, nullable=False),
    PrimaryKeyConstraint("conversation_id", "call_id", name="pk_tool_results"),
    ForeignKeyConstraint(
        ["conversation_id", "call_id"],
        ["tool_calls.conversation_id", "tool_calls.call_id"],
        name="fk_tool_results_conversation_id_tool_calls",
        ondelete="CASCADE",
    ),
)

memory = Table(
    "memory",
    metadata,
    Column("memory_id", Integer, nullable=False, autoincrement=True),
    Column(
        "conversation_id",
        String(50),
        ForeignKey("conversations.conversation_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("memory_text", Text, nullable=False),
    Column("kind", String(20), nullable=False),
    Column("start_sequence", Integer, nullable=False),
    Column("end_sequence", Integer, nullable=False),
    Column("start_round", Integer, nullable=False),
    Column("end_round", Integer, nullable=False),
    Column("input_start_sequence", Integer, nullable=False),
    Column("base_memory_id", Integer, nullable=True),
    Column("status", String(20), nullable=False, server_default="completed"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("generation_time_ms", Integer, nullable=True),
    Column("completed_at", DateTime(timezone=True), nullable=True),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("attempts", Integer, nullable=False, server_default="1"),
    Column("error", Text, nullable=True),
    Column("tokens", Integer, nullable=False, server_default="0"),
    Column("input_tokens", BigInteger, nullable=False, server_default="0"),
    Column("from_at", DateTime(timezone=True), nullable=True),
    Column("to_at", DateTime(timezone=True), nullable=True),
    # Every key leads with conversation_id, so the schema can be distributed by conversation.
    PrimaryKeyConstraint("conversation_id", "memory_id", name="pk_memory"),
    ForeignKeyConstraint(
        ["conversation_id", "base_memory_id"],
        ["memory.conversation_id", "memory.memory_id"],
        name="fk_memory_conversation_id_memory",
    ),
    CheckConstraint("status IN ('processing', 'completed', 'failed')", name="status"),
    CheckConstraint("tokens >= 0 AND input_tokens >= 0", name="tokens_non_negative"),
    CheckConstraint("0 <= start_sequence AND start_sequence <= end_sequence", name="window"),
    CheckConstraint(
        "kind IN ('window', 'block', 'compression', 'fold', 'medium_term', 'compaction')", name="kind"
    ),
    CheckConstraint("0 <= start_round AND start_round <= end_round", name="rounds"),
    CheckConstraint(
        "start_sequence <= input_start_sequence AND input_start_sequence <= end_sequence", name="input"
    ),
    Index(
        "idx_memory_conversation_status",
        "conversation_id",
        "status",
        text("end_sequence DESC"),
    ),
    Index(
        "uq_memory_one_processing_per_conversation",
        "conversation_id",
        unique=True,
        postgresql_where=text("status = 'processing'"),
    ),
    Index("ix_memory_memory_id", "memory_id"),
    Index(
        "ix_memory_processing_lease",
        "lease_expires_at",
        postgresql_where=text("status = 'processing'"),
    ),
    Index("ix_memory_failed", "memory_id", postgresql_where=text("status = 'failed'")),
)

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column(
        "conversation_id",
        String(50),
        ForeignKey("conversations.conversation_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("idempotency_key", String(255), nullable=False),
    Column("request_hash", String(64), nullable=False),
    Column("response", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("conversation_id", "idempotency_key", name="pk_idempotency_keys"),
    Index("ix_idempotency_keys_created_at", "created_at"),
)

# The event outbox: no foreign key, so a deleted conversation's last events outlive it.
events = Table(
    "events",
    metadata,
    Column("conversation_id", String(50), nullable=False),
    Column("event_id", BigInteger, nullable=False),
    Column("tenant_id", String(64), nullable=False),
    Column("type", String(40), nullable=False),
    Column("data", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("conversation_id", "event_id", name="pk_events"),
    CheckConstraint("event_id > 0", name="event_id_positive"),
    Index("ix_events_created_at", "created_at"),
)

# A tenant's webhook endpoints: tenant-wide configuration (a Citus reference table), the one
# table not keyed by conversation.
webhooks = Table(
    "webhooks",
    metadata,
    Column("webhook_id", BigInteger, Identity(), nullable=False),
    Column("tenant_id", String(64), nullable=False),
    Column("url", String(2000), nullable=False),
    Column("secret", String(100), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("webhook_id", name="pk_webhooks"),
    Index("ix_webhooks_tenant_id", "tenant_id"),
)

# One delivery of an event to an endpoint, written with the event (app.repositories.webhooks).
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("conversation_id", String(50), nullable=False),
    Column("event_id", BigInteger, nullable=False),
    Column("webhook_id", BigInteger, nullable=False),
    Column("tenant_id", String(64), nullable=False),
    Column("status", String(10), nullable=False, server_default="pending"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_error", Text, nullable=True),
    Column("delivered_at", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("conversation_id", "event_id", "webhook_id", name="pk_webhook_deliveries"),
    CheckConstraint("status IN ('pending', 'delivered', 'dead')", name="status"),
    Index("ix_webhook_deliveries_due", "next_attempt_at", postgresql_where=text("status = 'pending'")),
    Index("ix_webhook_deliveries_dead", "tenant_id", "created_at", postgresql_where=text("status = 'dead'")),
    Index("ix_webhook_deliveries_created_at", "created_at"),
)

# A user's rows span conversations: they are keyed (and would be distributed) by user.
users = Table(
    "users",
    metadata,
    Column("tenant_id", String(64), nullable=False),
    Column("user_id", String(64), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("summary_due_at", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint("tenant_id", "user_id", name="pk_users"),
    Index("ix_users_summary_due_at", "summary_due_at", postgresql_where=text("summary_due_at IS NOT NULL")),
)

user_memory = Table(
    "user_memory",
    metadata,
    Column("tenant_id", String(64), nullable=False),
    Column("user_id", String(64), nullable=False),
    Column("memory_id", Integer, nullable=False, autoincrement=True),
    Column("memory_text", Text, nullable=False, server_default=""),
    Column("sources", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("base_memory_id", Integer, nullable=True),
    Column("status", String(20), nullable=False, server_default="processing"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("completed_at", DateTime(timezone=True), nullable=True),
    Column("generation_time_ms", Integer, nullable=True),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("attempts", Integer, nullable=False, server_default="1"),
    Column("error", Text, nullable=True),
    Column("tokens", Integer, nullable=False, server_default="0"),
    PrimaryKeyConstraint("tenant_id", "user_id", "memory_id", name="pk_user_memory"),
    ForeignKeyConstraint(
        ["tenant_id", "user_id"],
        ["users.tenant_id", "users.user_id"],
        name="fk_user_memory_tenant_id_users",
        ondelete="CASCADE",
    ),
    ForeignKeyConstraint(
        ["tenant_id", "user_id", "base_memory_id"],
        ["user_memory.tenant_id", "user_memory.user_id", "user_memory.memory_id"],
        name="fk_user_memory_tenant_id_user_memory",
    ),
    CheckConstraint("status IN ('processing', 'completed', 'failed')", name="status"),
    CheckConstraint("tokens >= 0", name="tokens_non_negative"),
    Index(
        "uq_user_memory_one_processing_per_user",
        "tenant_id",
        "user_id",
        unique=True,
        postgresql_where=text("status = 'processing'"),
    ),
    Index("ix_user_memory_user_status", "tenant_id", "user_id", "status", text("memory_id DESC")),
    Index(
        "ix_user_memory_processing_lease", "lease_expires_at", postgresql_where=text("status = 'processing'")
    ),
)
