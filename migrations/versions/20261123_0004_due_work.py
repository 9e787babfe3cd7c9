"""Durable due work, and every key led by conversation_id.

- conversations.summary_due_at: a summary of the conversation is due (its policy's wake point was
  reached, or a failed one waits for its retry) and no runner has planned it yet; any runner may
  claim it once the time has come. NULL when nothing is due. The partial index keeps the claim
  query's scan to due conversations only.
- conversations.wake_round / wake_sequence: the point the conversation's policy next wants to be
  asked (its last round and last sequence must both reach them), recomputed whenever a plan is
  made; a POST compares against them in the same statement that stores the round, so deciding
  "due" costs the append nothing extra.
- memory rows in 'processing' with lease_expires_at NULL are queued: planned, not yet owned by a
  runner. A runner claims one by setting its lease and counting an attempt; a row whose lease
  expired (its runner died) is claimed again, with backoff, until it has used its attempts.
- memory's primary key and its self-reference now lead with conversation_id, so every primary
  key, unique index and foreign key contains conversation_id and the schema can be distributed by
  conversation (Citus). memory_id keeps a plain index for lookups by id (still unique: it comes
  from a sequence).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# asyncpg runs one statement per call, so the DDL is split on ";" below.
UPGRADE = """
        ALTER TABLE conversations
            ADD COLUMN summary_due_at TIMESTAMPTZ,
            ADD COLUMN wake_round INTEGER NOT NULL DEFAULT 0,
            ADD COLUMN wake_sequence INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX ix_conversations_summary_due_at ON conversations (summary_due_at)
            WHERE summary_due_at IS NOT NULL;
        ALTER TABLE memory DROP CONSTRAINT fk_memory_base_memory_id_memory;
        ALTER TABLE memory DROP CONSTRAINT pk_memory;
        ALTER TABLE memory ADD CONSTRAINT pk_memory PRIMARY KEY (conversation_id, memory_id);
        ALTER TABLE memory ADD CONSTRAINT fk_memory_conversation_id_memory
            FOREIGN KEY (conversation_id, base_memory_id) REFERENCES memory (conversation_id, memory_id);
        CREATE INDEX ix_memory_memory_id ON memory (memory_id)
"""

DOWNGRADE = """
        DROP INDEX ix_memory_memory_id;
        ALTER TABLE memory DROP CONSTRAINT fk_memory_conversation_id_memory;
        ALTER TABLE memory DROP CONSTRAINT pk_memory;
        ALTER TABLE memory ADD CONSTRAINT pk_memory PRIMARY KEY (memory_id);
        ALTER TABLE memory ADD CONSTRAINT fk_memory_base_memory_id_memory
            FOREIGN KEY (base_memory_id) REFERENCES memory (memory_id);
        DROP INDEX ix_conversations_summary_due_at;
        ALTER TABLE conversations
            DROP COLUMN summary_due_at, DROP COLUMN wake_round, DROP COLUMN wake_sequence
"""


def upgrade() -> None:
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE.split(";"):
        if statement.strip():
            op.execute(statement)
