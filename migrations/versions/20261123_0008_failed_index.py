"""A partial index of failed summaries: /metrics counts them every MEMORY_METRICS_REFRESH_SECONDS
in every process, and /ops/memories/failed lists the newest, without reading the whole memory
table (failed rows are few; the table grows with every summary).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE INDEX ix_memory_failed ON memory (memory_id) WHERE status = 'failed'")


def downgrade() -> None:
    op.execute("DROP INDEX ix_memory_failed")
