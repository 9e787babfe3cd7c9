"""Memory policies and rounds: a policy per conversation, rounds, JSON content, summary kinds.

- conversations.memory_policy: the conversation's resolved policy ({"name": ..., parameters}).
  Existing conversations get the sliding window with the deployment's settings at migration time
  (MEMORY_ROLLING_WINDOW_SIZE, MEMORY_SUMMARIZE_AFTER_SEQ, MEMORY_CATCH_UP_ON_COMPLETION, else
  seed 004's 14 / 5 / false), which is what they were summarized with until now.
- conversations.context_summaries / context_recent_rounds: what the context shows (the newest K
  completed summaries, at least the last R rounds raw), derived from the policy at creation and
  stored so the one-statement context read needs no policy code.
- conversations.next_round and messages.round: each POST is one round (seed 000's interaction),
  numbered from 0 like sequences. Every message of a POST was inserted in one transaction and so
  shares its created_at (now() is the transaction's start), which numbers the existing rounds.
- messages.content becomes json (a string, or an object or array as posted: json, not jsonb,
  keeps the client's key order and numbers); messages.metadata (json too) holds optional
  per-message labels.
- memory.kind (window | block), start_round / end_round (a summary covers whole rounds) and
  input_start_sequence (the first message the summarizer was given: after the base memory for an
  incremental summary), so the background job needs no policy-specific rule to load its input.
- idempotency_keys.response becomes json, so a replayed response keeps the content's key order.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

import json
import os
from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _legacy_policy() -> str:
    return json.dumps(
        {
            "name": "sliding_window",
            "window_size": int(os.environ.get("MEMORY_ROLLING_WINDOW_SIZE") or 14),
            "summarize_after_seq": int(os.environ.get("MEMORY_SUMMARIZE_AFTER_SEQ") or 5),
            "catch_up_on_completion": (os.environ.get("MEMORY_CATCH_UP_ON_COMPLETION") or "false").lower()
            in {"1", "true", "yes", "on"},
        }
    )


# asyncpg runs one statement per call, so the DDL is split on ";" below.
UPGRADE = """
        ALTER TABLE conversations
            ADD COLUMN next_round INTEGER NOT NULL DEFAULT 0,
            ADD COLUMN memory_policy JSONB,
            ADD COLUMN context_summaries INTEGER NOT NULL DEFAULT 1,
            ADD COLUMN context_recent_rounds INTEGER NOT NULL DEFAULT 0,
            ADD CONSTRAINT ck_conversations_context
                CHECK (context_summaries >= 1 AND context_recent_rounds >= 0);

        ALTER TABLE messages
            ADD COLUMN round INTEGER,
            ADD COLUMN metadata JSON,
            ALTER COLUMN content TYPE JSON USING to_json(content);
        UPDATE messages m SET round = numbered.round
        FROM (
            SELECT conversation_id, sequence,
                   sum(CASE WHEN created_at IS DISTINCT FROM previous THEN 1 ELSE 0 END)
                       OVER (PARTITION BY conversation_id ORDER BY sequence) - 1 AS round
            FROM (SELECT conversation_id, sequence, created_at,
                         lag(created_at) OVER (PARTITION BY conversation_id ORDER BY sequence)
                             AS previous
                  FROM messages) AS ordered
        ) AS numbered
        WHERE m.conversation_id = numbered.conversation_id AND m.sequence = numbered.sequence;
        ALTER TABLE messages
            ALTER COLUMN round SET NOT NULL,
            ADD CONSTRAINT ck_messages_round_non_negative CHECK (round >= 0);

        UPDATE conversations c
        SET next_round = coalesce(
                (SELECT max(m.round) + 1 FROM messages m WHERE m.conversation_id = c.conversation_id), 0),
            memory_policy = CAST(:legacy_policy AS jsonb);
        ALTER TABLE conversations ALTER COLUMN memory_policy SET NOT NULL;

        ALTER TABLE memory
            ADD COLUMN kind VARCHAR(20) NOT NULL DEFAULT 'window',
            ADD COLUMN start_round INTEGER,
            ADD COLUMN end_round INTEGER,
            ADD COLUMN input_start_sequence INTEGER;
        UPDATE memory m
        SET start_round = (SELECT round FROM messages s
                           WHERE s.conversation_id = m.conversation_id AND s.sequence = m.start_sequence),
            end_round = (SELECT round FROM messages e
                         WHERE e.conversation_id = m.conversation_id AND e.sequence = m.end_sequence),
            input_start_sequence = greatest(
                m.start_sequence,
                coalesce((SELECT b.end_sequence + 1 FROM memory b WHERE b.memory_id = m.base_memory_id),
                         m.start_sequence));
        ALTER TABLE memory
            ALTER COLUMN kind DROP DEFAULT,
            ALTER COLUMN start_round SET NOT NULL,
            ALTER COLUMN end_round SET NOT NULL,
            ALTER COLUMN input_start_sequence SET NOT NULL,
            ADD CONSTRAINT ck_memory_kind CHECK (kind IN ('window', 'block')),
            ADD CONSTRAINT ck_memory_rounds CHECK (0 <= start_round AND start_round <= end_round),
            ADD CONSTRAINT ck_memory_input
                CHECK (start_sequence <= input_start_sequence AND input_start_sequence <= end_sequence);

        ALTER TABLE idempotency_keys ALTER COLUMN response TYPE JSON USING response::json
"""

DOWNGRADE = """
        ALTER TABLE idempotency_keys ALTER COLUMN response TYPE JSONB USING response::jsonb;
        ALTER TABLE memory
            DROP COLUMN kind, DROP COLUMN start_round, DROP COLUMN end_round,
            DROP COLUMN input_start_sequence;
        ALTER TABLE messages
            DROP COLUMN round, DROP COLUMN metadata,
            ALTER COLUMN content TYPE TEXT
                USING CASE WHEN json_typeof(content) = 'string' THEN content #>> '{}'
                           ELSE content::text END;
        ALTER TABLE conversations
            DROP CONSTRAINT ck_conversations_context,
            DROP COLUMN next_round, DROP COLUMN memory_policy,
            DROP COLUMN context_summaries, DROP COLUMN context_recent_rounds
"""


def upgrade() -> None:
    legacy = _legacy_policy().replace("'", "''")
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement.replace(":legacy_policy", f"'{legacy}'"))


def downgrade() -> None:
    for statement in DOWNGRADE.split(";"):
        if statement.strip():
            op.execute(statement)
