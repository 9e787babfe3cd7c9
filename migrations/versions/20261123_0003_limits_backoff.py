"""Bounded reads and failure backoff.

- messages.content_bytes: the bytes a message adds to a response (its content and metadata as
  JSON text), stored at insert so the context and message pages can be capped by size without
  reading (and detoasting) the content of every candidate row.
- conversations.summary_failures / summary_retry_at: how many summaries of the conversation
  failed in a row, and when the next may start. A conversation whose summaries keep failing
  waits (exponential backoff) instead of starting a doomed summary on every round; both are
  shown in its context and in ops, and reset when a summary completes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# asyncpg runs one statement per call, so the DDL is split on ";" below.
UPGRADE = """
        ALTER TABLE messages ADD COLUMN content_bytes INTEGER;
        UPDATE messages
        SET content_bytes = octet_length(content::text) + coalesce(octet_length(metadata::text), 0);
        ALTER TABLE messages
            ALTER COLUMN content_bytes SET NOT NULL,
            ADD CONSTRAINT ck_messages_content_bytes_non_negative CHECK (content_bytes >= 0);
        ALTER TABLE conversations
            ADD COLUMN summary_failures INTEGER NOT NULL DEFAULT 0,
            ADD COLUMN summary_retry_at TIMESTAMPTZ,
            ADD CONSTRAINT ck_conversations_summary_failures CHECK (summary_failures >= 0)
"""

DOWNGRADE = """
        ALTER TABLE conversations
            DROP CONSTRAINT ck_conversations_summary_failures,
            DROP COLUMN summary_failures, DROP COLUMN summary_retry_at;
        ALTER TABLE messages DROP COLUMN content_bytes
"""


def upgrade() -> None:
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE.split(";"):
        if statement.strip():
            op.execute(statement)
