"""Seed 001: the recursive_summary policy, users across conversations, ended and archived
conversations.

- memory.kind gains 'medium_term' (the evolving summary) and 'compaction' (the same range,
  rewritten smaller).
- conversations.context_max_summary_tokens: completed summaries over it are never shown (NULL:
  no cap), so the context read needs no policy code.
- conversations.user_id (one namespace per tenant), ended_at (read-only after
  POST .../end), archived_at (read-only, out of listings), last_message_at (the archive's clock;
  existing conversations take their newest message's time).
- users and user_memory: the cross-conversation summary of a user's last conversations, with the
  same guarantees as memory (status, version chain, one 'processing' row per user by a partial
  unique index, leases). Their keys lead with (tenant_id, user_id) instead of conversation_id:
  a user's rows span conversations, so they would be distributed by user (tests/integration/
  test_schema_keys.py).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
        ALTER TABLE memory DROP CONSTRAINT ck_memory_kind;
        ALTER TABLE memory ADD CONSTRAINT ck_memory_kind
            CHECK (kind IN ('window', 'block', 'compression', 'fold', 'medium_term', 'compaction'));
        ALTER TABLE conversations
            ADD COLUMN context_max_summary_tokens INTEGER,
            ADD COLUMN user_id VARCHAR(64),
            ADD COLUMN ended_at TIMESTAMPTZ,
            ADD COLUMN archived_at TIMESTAMPTZ,
            ADD COLUMN last_message_at TIMESTAMPTZ NOT NULL DEFAULT now();
        UPDATE conversations c
            SET last_message_at = coalesce((SELECT m.created_at FROM messages m
                                            WHERE m.conversation_id = c.conversation_id
                                            ORDER BY m.sequence DESC LIMIT 1), c.created_at);
        CREATE INDEX ix_conversations_user ON conversations (tenant_id, user_id, last_message_at DESC)
            WHERE user_id IS NOT NULL;
        CREATE INDEX ix_conversations_archivable ON conversations (last_message_at)
            WHERE archived_at IS NULL;
        CREATE INDEX ix_conversations_archived ON conversations (tenant_id, conversation_id)
            WHERE archived_at IS NOT NULL;
        CREATE TABLE users (
            tenant_id VARCHAR(64) NOT NULL,
            user_id VARCHAR(64) NOT NULL,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            summary_due_at TIMESTAMPTZ,
            CONSTRAINT pk_users PRIMARY KEY (tenant_id, user_id)
        );
        CREATE INDEX ix_users_summary_due_at ON users (summary_due_at) WHERE summary_due_at IS NOT NULL;
        CREATE TABLE user_memory (
            tenant_id VARCHAR(64) NOT NULL,
            user_id VARCHAR(64) NOT NULL,
            memory_id SERIAL NOT NULL,
            memory_text TEXT NOT NULL DEFAULT '',
            sources JSONB NOT NULL DEFAULT '[]'::jsonb,
            base_memory_id INTEGER,
            status VARCHAR(20) NOT NULL DEFAULT 'processing',
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            completed_at TIMESTAMPTZ,
            generation_time_ms INTEGER,
            lease_expires_at TIMESTAMPTZ,
            attempts INTEGER NOT NULL DEFAULT 1,
            error TEXT,
            tokens INTEGER NOT NULL DEFAULT 0,
            CONSTRAINT pk_user_memory PRIMARY KEY (tenant_id, user_id, memory_id),
            CONSTRAINT fk_user_memory_tenant_id_users FOREIGN KEY (tenant_id, user_id)
                REFERENCES users (tenant_id, user_id) ON DELETE CASCADE,
            CONSTRAINT fk_user_memory_tenant_id_user_memory FOREIGN KEY (tenant_id, user_id, base_memory_id)
                REFERENCES user_memory (tenant_id, user_id, memory_id),
            CONSTRAINT ck_user_memory_status CHECK (status IN ('processing', 'completed', 'failed')),
            CONSTRAINT ck_user_memory_tokens_non_negative CHECK (tokens >= 0)
        );
        CREATE UNIQUE INDEX uq_user_memory_one_processing_per_user ON user_memory (tenant_id, user_id)
            WHERE status = 'processing';
        CREATE INDEX ix_user_memory_user_status ON user_memory (tenant_id, user_id, status, memory_id DESC);
        CREATE INDEX ix_user_memory_processing_lease ON user_memory (lease_expires_at)
            WHERE status = 'processing'
"""

DOWNGRADE = """
        DROP TABLE user_memory;
        DROP TABLE users;
        DROP INDEX ix_conversations_archived;
        DROP INDEX ix_conversations_archivable;
        DROP INDEX ix_conversations_user;
        ALTER TABLE conversations
            DROP COLUMN last_message_at,
            DROP COLUMN archived_at,
            DROP COLUMN ended_at,
            DROP COLUMN user_id,
            DROP COLUMN context_max_summary_tokens;
        DELETE FROM memory WHERE kind IN ('medium_term', 'compaction');
        ALTER TABLE memory DROP CONSTRAINT ck_memory_kind;
        ALTER TABLE memory ADD CONSTRAINT ck_memory_kind
            CHECK (kind IN ('window', 'block', 'compression', 'fold'))
"""


def upgrade() -> None:
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE.split(";"):
        if statement.strip():
            op.execute(statement)
