"""Token accounting of summaries.

- memory.input_tokens: the tokens of the entries the summary covers (its range), and from_at /
  to_at, the times of its first and last entry (seed 003's time range), set when it is planned.
- memory.tokens: the tokens of its text, set when it completes.

Existing rows get their range's tokens and times; their text is counted as 0 (unknown).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
        ALTER TABLE memory
            ADD COLUMN tokens INTEGER NOT NULL DEFAULT 0,
            ADD COLUMN input_tokens BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN from_at TIMESTAMPTZ,
            ADD COLUMN to_at TIMESTAMPTZ,
            ADD CONSTRAINT ck_memory_tokens_non_negative CHECK (tokens >= 0 AND input_tokens >= 0);
        UPDATE memory m
        SET input_tokens = e.tokens_before + e.tokens - s.tokens_before,
            from_at = s.created_at, to_at = e.created_at
        FROM messages s, messages e
        WHERE s.conversation_id = m.conversation_id AND s.sequence = m.start_sequence
          AND e.conversation_id = m.conversation_id AND e.sequence = m.end_sequence
"""

DOWNGRADE = """
        ALTER TABLE memory
            DROP CONSTRAINT ck_memory_tokens_non_negative,
            DROP COLUMN tokens, DROP COLUMN input_tokens, DROP COLUMN from_at, DROP COLUMN to_at
"""


def upgrade() -> None:
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE.split(";"):
        if statement.strip():
            op.execute(statement)
