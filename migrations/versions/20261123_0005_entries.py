"""Entries of tool-using agents: OpenAI chat messages with tool calls, typed, with token counts.

- messages: content may be NULL (an assistant message that only calls tools); name, tool_calls
  (the assistant's calls, as posted), tool_call_id (a tool result's call), source (a context
  entry's origin); kind, the entry's type (seed 003: message, tool_call, tool_result, context);
  tokens, its count, and tokens_before, the conversation's running total before it, so the
  tokens of any range cost O(1); boundary, true on the first message of a round when no tool
  call before it is still waiting for its result: the only places a window may start, so no
  window separates calls from their results. All set when the message is stored, never changed.
- conversations.next_tokens (the running total after the last message) and open_tool_calls
  (calls without a result yet).
- tool_calls and tool_results: each call id of a conversation with the message that made it, and
  the message that answered it. Their keys and the foreign key between them make PostgreSQL
  refuse a call id used twice, a result naming no earlier call and a call answered twice.

Existing messages get their counts for the configured model (MEMORY_MODEL) and a boundary on
each round's first message (they hold no tool calls).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# asyncpg runs one statement per call, so the DDL is split on ";" below.
UPGRADE = """
        ALTER TABLE messages
            ALTER COLUMN content DROP NOT NULL,
            ADD COLUMN kind VARCHAR(16) NOT NULL DEFAULT 'message',
            ADD COLUMN name VARCHAR(64),
            ADD COLUMN tool_calls JSON,
            ADD COLUMN tool_call_id VARCHAR(100),
            ADD COLUMN source VARCHAR(1000),
            ADD COLUMN tokens INTEGER NOT NULL DEFAULT 0,
            ADD COLUMN tokens_before BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN boundary BOOLEAN NOT NULL DEFAULT false,
            ADD CONSTRAINT ck_messages_kind
                CHECK (kind IN ('message', 'tool_call', 'tool_result', 'context')),
            ADD CONSTRAINT ck_messages_tokens_non_negative CHECK (tokens >= 0 AND tokens_before >= 0);
        UPDATE messages m SET boundary = true
        WHERE NOT EXISTS (SELECT 1 FROM messages p
                          WHERE p.conversation_id = m.conversation_id AND p.round = m.round
                            AND p.sequence < m.sequence);
        CREATE INDEX ix_messages_boundary ON messages (conversation_id, sequence) WHERE boundary;
        CREATE INDEX ix_messages_boundary_round ON messages (conversation_id, round) WHERE boundary;
        ALTER TABLE conversations
            ADD COLUMN next_tokens BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN open_tool_calls INTEGER NOT NULL DEFAULT 0;
        CREATE TABLE tool_calls (
            conversation_id VARCHAR(50) NOT NULL
                CONSTRAINT fk_tool_calls_conversation_id_conversations
                REFERENCES conversations (conversation_id) ON DELETE CASCADE,
            call_id VARCHAR(100) NOT NULL,
            sequence INTEGER NOT NULL,
            CONSTRAINT pk_tool_calls PRIMARY KEY (conversation_id, call_id)
        );
        CREATE TABLE tool_results (
            conversation_id VARCHAR(50) NOT NULL,
            call_id VARCHAR(100) NOT NULL,
            sequence INTEGER NOT NULL,
            CONSTRAINT pk_tool_results PRIMARY KEY (conversation_id, call_id),
            CONSTRAINT fk_tool_results_conversation_id_tool_calls FOREIGN KEY (conversation_id, call_id)
                REFERENCES tool_calls (conversation_id, call_id) ON DELETE CASCADE
        )
"""

DOWNGRADE = """
        DROP TABLE tool_results;
        DROP TABLE tool_calls;
        ALTER TABLE conversations DROP COLUMN next_tokens, DROP COLUMN open_tool_calls;
        DROP INDEX ix_messages_boundary;
        DROP INDEX ix_messages_boundary_round;
        DELETE FROM messages WHERE content IS NULL;
        ALTER TABLE messages
            DROP CONSTRAINT ck_messages_kind, DROP CONSTRAINT ck_messages_tokens_non_negative,
            DROP COLUMN kind, DROP COLUMN name, DROP COLUMN tool_calls, DROP COLUMN tool_call_id,
            DROP COLUMN source, DROP COLUMN tokens, DROP COLUMN tokens_before, DROP COLUMN boundary,
            ALTER COLUMN content SET NOT NULL
"""

BATCH = 5000


def _backfill_tokens() -> None:
    """Count the stored messages, a batch at a time, and give each conversation its totals."""
    from app.memory.tokens import counter_for
    from app.settings import load_settings

    counter = counter_for(load_settings().MEMORY_MODEL)
    bind = op.get_bind()
    last = ("", -1)
    while True:
        rows = bind.execute(
            sa.text(
                "SELECT conversation_id, sequence, role, content::text AS content FROM messages "
                "WHERE (conversation_id, sequence) > (:cid, :seq) "
                "ORDER BY conversation_id, sequence LIMIT :batch"
            ),
            {"cid": last[0], "seq": last[1], "batch": BATCH},
        ).all()
        if not rows:
            break
        bind.execute(
            sa.text(
                "UPDATE messages m SET tokens = t.tokens "
                "FROM unnest(CAST(:cids AS varchar[]), CAST(:seqs AS int[]), CAST(:tokens AS int[])) "
                "AS t(cid, seq, tokens) WHERE m.conversation_id = t.cid AND m.sequence = t.seq"
            ),
            {
                "cids": [r.conversation_id for r in rows],
                "seqs": [r.sequence for r in rows],
                "tokens": [counter.message({"role": r.role, "content": json.loads(r.content)}) for r in rows],
            },
        )
        last = (rows[-1].conversation_id, rows[-1].sequence)
    bind.execute(
        sa.text(
            """
            UPDATE messages m SET tokens_before = t.before
            FROM (SELECT conversation_id, sequence,
                         coalesce(sum(tokens) OVER (PARTITION BY conversation_id ORDER BY sequence
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
                  FROM messages) t
            WHERE m.conversation_id = t.conversation_id AND m.sequence = t.sequence
            """
        )
    )
    bind.execute(
        sa.text(
            "UPDATE conversations c SET next_tokens = t.total "
            "FROM (SELECT conversation_id, sum(tokens) AS total FROM messages GROUP BY conversation_id) t "
            "WHERE c.conversation_id = t.conversation_id"
        )
    )


def upgrade() -> None:
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement)
    _backfill_tokens()


def downgrade() -> None:
    for statement in DOWNGRADE.split(";"):
        if statement.strip():
            op.execute(statement)
