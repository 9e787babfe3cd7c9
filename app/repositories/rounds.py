"""SQL for storing a round: one statement over conversations, messages, tool_calls,
tool_results and idempotency_keys.

An ended or archived conversation is refused inside the statement (its row lock decides), so a
round racing POST .../end is either stored before the end or refused after it.

A POST is the hot write path, so the whole round is one statement, run outside an explicit
transaction (one round trip): the idempotency lookup, the conversation's upsert (creating it with
the default policy, or reserving the next round and sequence range under its row lock), the
metadata merge and its limits, the messages with their running token total and boundary flag,
the tool calls they make and answer, whether a summary became due (the conversation's stored wake
point, see app.memory.types.Wake), the idempotency record with the response the statement
builds, and an ``entry:added`` event per message (app.repositories.events). A statement is
atomic: on any error nothing of it is stored, its events included (a tool result naming no
earlier call, or answering one twice, fails on the keys of tool_results), and the row lock
serializes writers of one conversation, so sequences never overlap and never leave holes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection

from app.memory.types import ContextSpec, Wake
from app.repositories.events import ENTRY_ADDED, emit_ctes
from app.repositories.messages import OUT_COLUMNS, NewMessage
from app.repositories.statements import Statement, driver, sql

APPEND_SQL = sql(
    f"""
    WITH prior AS (
        SELECT response::text AS body, request_hash FROM idempotency_keys
        WHERE conversation_id = :conversation_id AND idempotency_key = :key
    ), request AS (
        SELECT CAST(:metadata AS jsonb) AS doc
    ), conv AS (
        INSERT INTO conversations AS c (conversation_id, tenant_id, metadata, next_sequence, next_round,
                                        memory_policy, context_summaries, context_recent_rounds,
                                        context_max_summary_tokens, wake_round, wake_sequence, wake_tokens,
                                        summary_due_at, next_tokens, open_tool_calls, last_event_id)
        SELECT :conversation_id, :tenant_id, r.doc, :count, 1, CAST(:memory_policy AS jsonb),
               :context_summaries, :context_recent_rounds,
               CAST(:context_max_summary_tokens AS integer), :wake_round, :wake_sequence,
               CAST(:wake_tokens AS bigint),
               CASE WHEN (0 >= :wake_round AND :count - 1 >= :wake_sequence)
                         OR CAST(:round_tokens AS bigint) >= CAST(:wake_tokens AS bigint) THEN now() END,
               :round_tokens, :open_delta,
               -- A conversation created again after a DELETE goes on numbering its events.
               (SELECT coalesce(max(event_id), 0) FROM events WHERE conversation_id = :conversation_id)
                   + :count
        FROM request r
        WHERE NOT EXISTS (SELECT 1 FROM prior)
          AND octet_length(r.doc::text) <= :max_bytes
          AND (SELECT count(*) FROM jsonb_object_keys(r.doc)) <= :max_keys
        ON CONFLICT (conversation_id) DO UPDATE
            SET next_sequence = c.next_sequence + :count,
                next_round = c.next_round + 1,
                metadata = c.metadata || excluded.metadata,
                next_tokens = c.next_tokens + :round_tokens,
                last_message_at = now(),
                open_tool_calls = c.open_tool_calls + :open_delta,
                last_event_id = c.last_event_id + :count,
                -- Reaching the wake point makes a summary due now, or once a failure's backoff
                -- is over; it brings an existing mark's time forward, never back.
                summary_due_at = CASE
                    WHEN (c.next_round >= c.wake_round AND c.next_sequence + :count - 1 >= c.wake_sequence)
                         OR c.next_tokens + :round_tokens >= c.wake_tokens
                    THEN least(c.summary_due_at, greatest(now(), c.summary_retry_at))
                    ELSE c.summary_due_at END
            WHERE c.tenant_id = excluded.tenant_id
              -- An ended or archived conversation is read-only.
              AND c.ended_at IS NULL AND c.archived_at IS NULL
              -- Calls left open by the previous round are answered first, by this round's
              -- leading tool messages.
              AND c.open_tool_calls <= :leading_results
              AND (excluded.metadata = '{{}}'::jsonb
                   OR (octet_length((c.metadata || excluded.metadata)::text) <= :max_bytes
                       AND (SELECT count(*) FROM jsonb_object_keys(c.metadata || excluded.metadata))
                           <= :max_keys))
        RETURNING c.next_sequence - :count AS first_sequence, c.next_round - 1 AS round,
                  (xmax = 0) AS created, c.summary_due_at IS NOT NULL AS summary_due,
                  c.next_tokens - :round_tokens AS tokens_before,
                  c.open_tool_calls - :open_delta AS open_before,
                  c.last_event_id - :count AS events_before,
                  -- A new conversation always notifies: no stream could mark it watched before.
                  (xmax = 0) OR coalesce(c.events_watched_until > now(), false) AS watched
    ), items AS (
        SELECT t.*, conv.first_sequence + t.ord - 1 AS sequence
        FROM conv,
             unnest(CAST(:roles AS varchar[]), CAST(:contents AS text[]), CAST(:item_metadata AS text[]),
                    CAST(:kinds AS varchar[]), CAST(:names AS varchar[]), CAST(:tool_calls AS text[]),
                    CAST(:tool_call_ids AS varchar[]), CAST(:sources AS varchar[]),
                    CAST(:tokens AS int[]), CAST(:token_prefix AS bigint[]))
             WITH ORDINALITY AS t(role, content, metadata, kind, name, tool_calls, tool_call_id, source,
                                  tokens, token_prefix, ord)
    ), stored AS (
        INSERT INTO messages (conversation_id, sequence, round, role, content, metadata, content_bytes,
                              kind, name, tool_calls, tool_call_id, source, tokens, tokens_before,
                              boundary)
        SELECT :conversation_id, i.sequence, conv.round, i.role, i.content::json, i.metadata::json,
               coalesce(octet_length(i.content), 0) + coalesce(octet_length(i.metadata), 0)
                   + coalesce(octet_length(i.tool_calls), 0),
               i.kind, i.name, i.tool_calls::json, i.tool_call_id, i.source, i.tokens,
               conv.tokens_before + i.token_prefix,
               -- A window may start here: the round's first message, no call left waiting.
               i.ord = 1 AND conv.open_before = 0
        FROM conv, items i
        RETURNING {OUT_COLUMNS}
    ), calls AS (
        INSERT INTO tool_calls (conversation_id, call_id, sequence)
        SELECT :conversation_id, made.call_id, conv.first_sequence + made.ord - 1
        FROM conv, unnest(CAST(:made_ids AS varchar[]), CAST(:made_ords AS int[])) AS made(call_id, ord)
    ), results AS (
        INSERT INTO tool_results (conversation_id, call_id, sequence)
        SELECT :conversation_id, i.tool_call_id, i.sequence FROM items i WHERE i.tool_call_id IS NOT NULL
    ), entry_events AS (
        -- entry:added, one per message: what it is, not its content (GET .../messages has it).
        SELECT CAST(:conversation_id AS varchar) AS conversation_id, CAST(:tenant_id AS varchar) AS tenant_id,
               conv.events_before + s.sequence - conv.first_sequence + 1 AS event_id,
               '{ENTRY_ADDED}' AS type,
               json_build_object('sequence', s.sequence, 'round', s.round, 'type', s.type, 'role', s.role,
                                 'tokens', s.tokens, 'name', s.name, 'tool_call_id', s.tool_call_id,
                                 'created_at', s.created_at) AS data,
               conv.watched
        FROM conv, stored s
    ), {emit_ctes("entry_events")}, body AS (
        SELECT json_build_object(
            'conversation_id', CAST(:conversation_id AS text),
            'created', conv.created,
            'round', conv.round,
            'messages', (SELECT json_agg(stored ORDER BY stored.sequence) FROM stored),
            'summary_due', conv.summary_due
        ) AS doc, conv.summary_due
        FROM conv
    ), saved AS (
        INSERT INTO idempotency_keys (conversation_id, idempotency_key, request_hash, response)
        SELECT :conversation_id, :key, :request_hash, body.doc FROM body
        WHERE CAST(:key AS varchar) IS NOT NULL
    )
    SELECT 'stored' AS outcome, body.doc::text AS body, body.summary_due,
           (SELECT count(*) FROM ev_notified) AS notified
    FROM body
    UNION ALL
    SELECT CASE WHEN prior.request_hash = :request_hash THEN 'replayed' ELSE 'key_reused' END,
           prior.body, false, 0
    FROM prior
    """
)

# APPEND_SQL compiled once for asyncpg: the append runs it on the pooled connection's asyncpg
# connection directly, skipping SQLAlchemy's per-execution work (compiled-cache lookup, parameter
# processing, result proxy, greenlet switches): ~0.25 ms of the service's ~1.3 ms of CPU per
# round (cProfile of 2,000 POSTs).
_APPEND = Statement(APPEND_SQL.text)

# Why the append stored nothing: another tenant owns the id, or the merged metadata is too big.
_REFUSED = sql(
    """
    SELECT owner.tenant_id AS owner, owner.open_tool_calls AS open_calls,
           CASE WHEN owner.archived_at IS NOT NULL THEN 'archived'
                WHEN owner.ended_at IS NOT NULL THEN 'ended' END AS closed,
           octet_length(merged.doc::text) AS bytes,
           (SELECT count(*) FROM jsonb_object_keys(merged.doc)) AS keys
    FROM (SELECT coalesce((SELECT metadata FROM conversations
                           WHERE conversation_id = :conversation_id AND tenant_id = :tenant_id),
                          '{}'::jsonb) || CAST(:metadata AS jsonb) AS doc) AS merged
    LEFT JOIN conversations owner ON owner.conversation_id = :conversation_id
    """
)


@dataclass(frozen=True, slots=True)
class Appended:
    """What the statement did: 'stored' the round (``body`` is the response), 'replayed' an
    earlier response for the same Idempotency-Key and body, or found the key used with another
    body ('key_reused'). ``summary_due`` is whether a summary of the conversation is now due."""

    outcome: Literal["stored", "replayed", "key_reused"]
    body: str
    summary_due: bool


@dataclass(frozen=True, slots=True)
class Refused:
    """Nothing was stored: ``foreign`` when another tenant owns the conversation id; else the
    tool calls the conversation has waiting for results, and the size (bytes, keys) its metadata
    would have had."""

    foreign: bool
    open_calls: int
    metadata_bytes: int
    metadata_keys: int
    # 'ended' or 'archived': the conversation is read-only.
    closed: str | None = None


def leading_results(items: Sequence[NewMessage]) -> int:
    """How many tool messages open the round: the results of calls the previous round left open."""
    return next((i for i, m in enumerate(items) if m.role != "tool"), len(items))


def append_params(
    *,
    conversation_id: str,
    tenant_id: str,
    items: Sequence[NewMessage],
    metadata: dict[str, Any] | None,
    idempotency: tuple[str, str] | None,
    default_policy: dict[str, Any],
    default_context: ContextSpec,
    default_wake: Wake,
    max_metadata_bytes: int,
    max_metadata_keys: int,
) -> dict[str, Any]:
    """The parameters of APPEND_SQL for one round. ``idempotency`` is (key, request hash)."""
    tokens = [m.tokens for m in items]
    # Each call opens one; each result closes one (the keys of tool_results guarantee it).
    deltas = [len(m.tool_calls or ()) - (m.tool_call_id is not None) for m in items]
    made = [(call["id"], ord_) for ord_, m in enumerate(items, 1) for call in m.tool_calls or ()]
    return {
        "conversation_id": conversation_id,
        "tenant_id": tenant_id,
        "key": None if idempotency is None else idempotency[0],
        "request_hash": None if idempotency is None else idempotency[1],
        "metadata": orjson.dumps(metadata or {}).decode(),
        "count": len(items),
        "memory_policy": orjson.dumps(default_policy).decode(),
        "context_summaries": default_context.summaries,
        "context_recent_rounds": default_context.recent_rounds,
        "context_max_summary_tokens": default_context.max_summary_tokens,
        "wake_round": default_wake.round,
        "wake_sequence": default_wake.sequence,
        "wake_tokens": default_wake.tokens,
        "max_bytes": max_metadata_bytes,
        "max_keys": max_metadata_keys,
        "round_tokens": sum(tokens),
        "open_delta": sum(deltas),
        "leading_results": leading_results(items),
        "roles": [m.role for m in items],
        "contents": [None if m.content is None else orjson.dumps(m.content).decode() for m in items],
        "item_metadata": [None if m.metadata is None else orjson.dumps(m.metadata).decode() for m in items],
        "kinds": [m.kind for m in items],
        "names": [m.name for m in items],
        "tool_calls": [None if m.tool_calls is None else orjson.dumps(m.tool_calls).decode() for m in items],
        "tool_call_ids": [m.tool_call_id for m in items],
        "sources": [m.source for m in items],
        "tokens": tokens,
        "token_prefix": list(itertools.accumulate(tokens, initial=0))[:-1],
        "made_ids": [call_id for call_id, _ in made],
        "made_ords": [ord_ for _, ord_ in made],
    }


async def append(
    conn: AsyncConnection, params: dict[str, Any], *, transaction: bool = False
) -> Appended | Refused:
    """Store one round (see the module's docstring) with the parameters of append_params. Run
    it on an autocommit connection: the statement is its own transaction. With
    ``transaction`` (behind PgBouncer in transaction mode) it runs in an explicit one, so that
    its preparation and execution reach the same server connection.

    The statement goes to asyncpg directly, so the engine's error hook does not see its errors:
    a connection that is lost or whose statement timed out is invalidated here, as that hook
    would (app.db._on_engine_error), and asyncpg's exception is raised as is."""
    async with driver(conn, transaction=transaction) as raw:
        row = await _APPEND.fetchrow(raw, params)
    if row is not None:
        return Appended(outcome=row["outcome"], body=row["body"], summary_due=bool(row["summary_due"]))
    refused = (
        await conn.execute(
            _REFUSED,
            {
                "conversation_id": params["conversation_id"],
                "tenant_id": params["tenant_id"],
                "metadata": params["metadata"],
            },
        )
    ).one()
    return Refused(
        foreign=refused.owner is not None and refused.owner != params["tenant_id"],
        open_calls=int(refused.open_calls or 0),
        metadata_bytes=int(refused.bytes),
        metadata_keys=int(refused.keys),
        closed=refused.closed,
    )


@dataclass(frozen=True, slots=True)
class ToolCallProblems:
    """Why a round's tool calls or results were refused: call ids the conversation already
    used, results naming no call, results for calls already answered."""

    reused: frozenset[str]
    unknown: frozenset[str]
    answered: frozenset[str]


async def tool_call_problems(
    conn: AsyncConnection, *, conversation_id: str, made: Sequence[str], answers: Sequence[str]
) -> ToolCallProblems:
    """After the append failed on a key of tool_calls or tool_results: which ids were at fault."""
    rows = await conn.execute(
        sql(
            """
            SELECT c.call_id, r.call_id IS NOT NULL AS answered
            FROM tool_calls c LEFT JOIN tool_results r USING (conversation_id, call_id)
            WHERE c.conversation_id = :conversation_id AND c.call_id = ANY(CAST(:ids AS varchar[]))
            """
        ),
        {"conversation_id": conversation_id, "ids": list({*made, *answers})},
    )
    existing = {r.call_id: bool(r.answered) for r in rows}
    made_here = set(made)
    return ToolCallProblems(
        reused=frozenset(i for i in made if i in existing),
        unknown=frozenset(i for i in answers if i not in existing and i not in made_here),
        answered=frozenset(i for i in answers if existing.get(i)),
    )
