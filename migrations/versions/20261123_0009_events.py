"""The event outbox (issue 9): events are rows written by the statement or transaction that
changes what they report, so none is lost or invented; each conversation numbers its own events
(conversations.last_event_id, bumped under the conversation's row lock, so a conversation's
events commit in id order). Events have no foreign key to their conversation: a deleted
conversation's last event outlives it until MEMORY_EVENTS_TTL_HOURS. events_watched_until marks
conversations with an open stream (or a waiting read): only their writes send a NOTIFY.

Webhooks (issue 12): a tenant's endpoints (a reference table, tenant-wide configuration, which
Citus would replicate to every node) and one delivery row per event and endpoint, written with
the event, whose state any replica claims with SKIP LOCKED.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "conversations", sa.Column("last_event_id", sa.BigInteger(), nullable=False, server_default="0")
    )
    op.add_column(
        "conversations", sa.Column("events_watched_until", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_table(
        "events",
        sa.Column("conversation_id", sa.String(50), nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("type", sa.String(40), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("conversation_id", "event_id", name="pk_events"),
        sa.CheckConstraint("event_id > 0", name="ck_events_event_id_positive"),
    )
    op.create_index("ix_events_created_at", "events", ["created_at"])
    op.create_table(
        "webhooks",
        sa.Column("webhook_id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("secret", sa.String(100), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("webhook_id", name="pk_webhooks"),
    )
    op.create_index("ix_webhooks_tenant_id", "webhooks", ["tenant_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("conversation_id", sa.String(50), nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("webhook_id", sa.BigInteger(), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("status", sa.String(10), nullable=False, server_default="pending"),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column(
            "next_attempt_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("conversation_id", "event_id", "webhook_id", name="pk_webhook_deliveries"),
        sa.CheckConstraint("status IN ('pending', 'delivered', 'dead')", name="ck_webhook_deliveries_status"),
    )
    op.execute(
        "CREATE INDEX ix_webhook_deliveries_due ON webhook_deliveries (next_attempt_at) "
        "WHERE status = 'pending'"
    )
    op.execute(
        "CREATE INDEX ix_webhook_deliveries_dead ON webhook_deliveries (tenant_id, created_at) "
        "WHERE status = 'dead'"
    )
    op.create_index("ix_webhook_deliveries_created_at", "webhook_deliveries", ["created_at"])


def downgrade() -> None:
    op.drop_table("webhook_deliveries")
    op.drop_table("webhooks")
    op.drop_index("ix_events_created_at", table_name="events")
    op.drop_table("events")
    op.drop_column("conversations", "events_watched_until")
    op.drop_column("conversations", "last_event_id")
