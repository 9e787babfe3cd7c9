"""The schema stays distributable (Citus): every primary key, unique index and foreign key of
every conversation table includes conversation_id, so each constraint can be checked within one
conversation's shard. A user's tables (users, user_memory) span that user's conversations, so
they cannot be keyed by conversation: theirs include user_id (with tenant_id, its namespace), so
they would be distributed by user, each user's rows in one shard. They are never joined to the
conversation tables in one statement that needs a constraint across both (the user summary reads
the conversations' summaries in its own, read-only statements). Tenant-wide configuration
(REFERENCE_TABLES) is the other exception: Citus replicates such a table to every node."""

from __future__ import annotations

import asyncpg

# Every unique index (primary keys included) and every foreign key, with its columns, of the
# tables in the public schema (Alembic's own bookkeeping aside).
KEYS = """
SELECT c.relname AS table_name, i.relname AS key_name, 'unique index' AS kind,
       array_agg(a.attname::text ORDER BY a.attname) AS columns
FROM pg_index x
JOIN pg_class c ON c.oid = x.indrelid
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(x.indkey)
WHERE n.nspname = 'public' AND x.indisunique AND c.relname <> 'alembic_version'
GROUP BY c.relname, i.relname
UNION ALL
SELECT c.relname, k.conname, 'foreign key (referencing)',
       array_agg(a.attname::text ORDER BY a.attname)
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(k.conkey)
WHERE n.nspname = 'public' AND k.contype = 'f'
GROUP BY c.relname, k.conname
UNION ALL
SELECT c.relname, k.conname, 'foreign key (referenced)',
       array_agg(a.attname::text ORDER BY a.attname)
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.confrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(k.confkey)
WHERE n.nspname = 'public' AND k.contype = 'f'
GROUP BY c.relname, k.conname
"""


# Small, tenant-wide configuration, never joined by conversation: a tenant's webhook endpoints.
REFERENCE_TABLES = {"webhooks"}
# Tables distributed by something other than conversation_id, and by what.
DISTRIBUTION = {"users": "user_id", "user_memory": "user_id"}


async def test_every_key_includes_the_distribution_column(db: asyncpg.Connection) -> None:
    keys = await db.fetch(KEYS)
    tables = {r["table_name"] for r in keys}
    assert {"conversations", "messages", "memory", "idempotency_keys"} <= tables
    offending = [
        f"{r['table_name']}.{r['key_name']} ({r['kind']}: {', '.join(r['columns'] or ['an expression'])})"
        for r in keys
        if DISTRIBUTION.get(r["table_name"], "conversation_id") not in (r["columns"] or [])
        and r["table_name"] not in REFERENCE_TABLES
    ]
    assert offending == []


async def test_every_table_has_its_distribution_column(db: asyncpg.Connection) -> None:
    rows = await db.fetch(
        """
        SELECT t.table_name,
               bool_or(c.column_name = 'conversation_id')
                   OR bool_or(c.column_name = 'user_id' AND t.table_name IN ('users', 'user_memory')) AS keyed
        FROM information_schema.tables t
        JOIN information_schema.columns c USING (table_schema, table_name)
        WHERE t.table_schema = 'public' AND t.table_type = 'BASE TABLE' AND t.table_name <> 'alembic_version'
        GROUP BY t.table_name
        """
    )
    assert rows and [r["table_name"] for r in rows if not r["keyed"]] == sorted(REFERENCE_TABLES)
