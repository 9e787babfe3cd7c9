"""The token_budget policy (seed 003).

- memory.kind gains 'compression' (a summary of entries) and 'fold' (a summary of summaries).
- conversations.wake_tokens: a policy may also want to be asked once the conversation's tokens
  reach a number (NULL: never), whatever its rounds.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
        ALTER TABLE memory DROP CONSTRAINT ck_memory_kind;
        ALTER TABLE memory ADD CONSTRAINT ck_memory_kind
            CHECK (kind IN ('window', 'block', 'compression', 'fold'));
        ALTER TABLE conversations ADD COLUMN wake_tokens BIGINT
"""

DOWNGRADE = """
        ALTER TABLE conversations DROP COLUMN wake_tokens;
        DELETE FROM memory WHERE kind IN ('compression', 'fold');
        ALTER TABLE memory DROP CONSTRAINT ck_memory_kind;
        ALTER TABLE memory ADD CONSTRAINT ck_memory_kind CHECK (kind IN ('window', 'block'))
"""


def upgrade() -> None:
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE.split(";"):
        if statement.strip():
            op.execute(statement)
