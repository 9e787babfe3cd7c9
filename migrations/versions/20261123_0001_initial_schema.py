"""Initial schema: conversations, messages, memory (seed 004), idempotency keys.

Beyond seed 004's memory table, and why:
- conversations.next_sequence: the next free message sequence. A POST allocates its range with one
  atomic UPSERT ... RETURNING on this row, whose row lock serializes concurrent writers of one
  conversation, so sequences are unique and gap-free across requests and replicas.
- conversations.tenant_id: the owner when API keys are on; every query filters on it.
- messages primary key (conversation_id, sequence): the unique pair the contract asks for.
- memory CHECK on status and on the window (0 <= start <= end): bad rows cannot exist.
- memory partial unique index on conversation_id WHERE status = 'processing': at most one
  summary in flight per conversation, enforced by PostgreSQL rather than in-process locks;
  the loser of a race inserts nothing (ON CONFLICT DO NOTHING) and starts no task.
- memory.lease_expires_at (+ partial index): a worker's lease on a processing row, renewed while
  it runs. A reaper fails rows whose lease has expired (their worker died), so a crash never
  blocks a conversation for good, and never touches rows a live worker still renews.
- memory.completed_at, attempts, error: when and how a summary ended, for ops.
- memory.memory_text stays NOT NULL (seed): a processing row holds '' until it completes.
- idempotency_keys: the stored response of a POST made with an Idempotency-Key, so a retried
  request returns the original result and stores nothing twice; indexed by created_at for the
  periodic expiry (MEMORY_IDEMPOTENCY_TTL_HOURS).

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# asyncpg runs one statement per call, so the DDL is split on ";" below.
UPGRADE = """
        CREATE TABLE conversations (
            conversation_id VARCHAR(50) NOT NULL,
            tenant_id VARCHAR(64) NOT NULL DEFAULT 'default',
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            metadata JSONB NOT NULL DEFAULT '{}'::jsonb,
            next_sequence INTEGER NOT NULL DEFAULT 0,
            CONSTRAINT pk_conversations PRIMARY KEY (conversation_id)
        );
        CREATE INDEX ix_conversations_tenant_id_conversation_id
            ON conversations (tenant_id, conversation_id);

        CREATE TABLE messages (
            conversation_id VARCHAR(50) NOT NULL
                CONSTRAINT fk_messages_conversation_id_conversations
                REFERENCES conversations (conversation_id) ON DELETE CASCADE,
            sequence INTEGER NOT NULL,
            role VARCHAR(16) NOT NULL,
            content TEXT NOT NULL,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            CONSTRAINT uq_messages_conversation_sequence PRIMARY KEY (conversation_id, sequence),
            CONSTRAINT ck_messages_role CHECK (role IN ('user', 'assistant', 'system', 'tool')),
            CONSTRAINT ck_messages_sequence_non_negative CHECK (sequence >= 0)
        );

        CREATE TABLE memory (
            memory_id SERIAL NOT NULL,
            conversation_id VARCHAR(50) NOT NULL
                CONSTRAINT fk_memory_conversation_id_conversations
                REFERENCES conversations (conversation_id) ON DELETE CASCADE,
            memory_text TEXT NOT NULL,
            start_sequence INTEGER NOT NULL,
            end_sequence INTEGER NOT NULL,
            base_memory_id INTEGER
                CONSTRAINT fk_memory_base_memory_id_memory REFERENCES memory (memory_id),
            status VARCHAR(20) NOT NULL DEFAULT 'completed',
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            generation_time_ms INTEGER,
            completed_at TIMESTAMPTZ,
            lease_expires_at TIMESTAMPTZ,
            attempts INTEGER NOT NULL DEFAULT 1,
            error TEXT,
            CONSTRAINT pk_memory PRIMARY KEY (memory_id),
            CONSTRAINT ck_memory_status CHECK (status IN ('processing', 'completed', 'failed')),
            CONSTRAINT ck_memory_window CHECK (0 <= start_sequence AND start_sequence <= end_sequence)
        );
        CREATE INDEX idx_memory_conversation_status
            ON memory (conversation_id, status, end_sequence DESC);
        CREATE UNIQUE INDEX uq_memory_one_processing_per_conversation
            ON memory (conversation_id) WHERE status = 'processing';
        CREATE INDEX ix_memory_processing_lease
            ON memory (lease_expires_at) WHERE status = 'processing';

        CREATE TABLE idempotency_keys (
            conversation_id VARCHAR(50) NOT NULL
                CONSTRAINT fk_idempotency_keys_conversation_id_conversations
                REFERENCES conversations (conversation_id) ON DELETE CASCADE,
            idempotency_key VARCHAR(255) NOT NULL,
            request_hash VARCHAR(64) NOT NULL,
            response JSONB NOT NULL,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            CONSTRAINT pk_idempotency_keys PRIMARY KEY (conversation_id, idempotency_key)
        );
        CREATE INDEX ix_idempotency_keys_created_at ON idempotency_keys (created_at);
"""


def upgrade() -> None:
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    for table in ("idempotency_keys", "memory", "messages", "conversations"):
        op.execute(f"DROP TABLE {table}")
