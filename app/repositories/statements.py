"""SQL text built once, and the statements of the summary path, which run on asyncpg directly.

``sqlalchemy.text()`` scans its statement for bind parameters each time it is called, so the
repositories build theirs through :func:`sql`, which keeps each distinct statement (fixed
strings, or f-strings over a few fixed parts: column lists, table names, a tenant condition).

A :class:`Statement` runs on a SQLAlchemy connection like any other, or on the asyncpg
connection under it (:data:`Db`). The summary runners take the second way: through SQLAlchemy a
statement cost a worker about 270 us of CPU, on asyncpg about 70 us (one statement, measured
side by side on one connection), and a summary runs about twenty. Both ways send the same SQL
(SQLAlchemy compiles ``:name`` to ``$n`` for asyncpg the same way) with the same values to the same
asyncpg connection, whose codecs SQLAlchemy set up, so they read and write the same data. Rows
come back as mappings either way (``row["column"]``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeAlias, cast

import asyncpg
from sqlalchemy import TextClause, text
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db import classify_db_error

# Well above the repositories' distinct statements (about 120 with their variants).
CACHED_STATEMENTS = 1024

# A SQLAlchemy connection, or the asyncpg connection of one (see the module's docstring).
Db: TypeAlias = AsyncConnection | asyncpg.Connection

Row: TypeAlias = Mapping[str, Any]

_ASYNCPG = asyncpg_dialect()  # type: ignore[no-untyped-call]


@functools.lru_cache(maxsize=CACHED_STATEMENTS)
def sql(statement: str) -> TextClause:
    """``text(statement)``, the same object for the same statement."""
    return text(statement)


class Statement:
    """A statement with ``:name`` parameters, compiled once for asyncpg (``$1``..``$n``)."""

    __slots__ = ("_order", "_sql", "clause")

    def __init__(self, statement: str) -> None:
        self.clause = sql(statement)
        compiled = self.clause.compile(dialect=_ASYNCPG)
        self._sql = str(compiled)
        self._order: tuple[str, ...] = tuple(compiled.positiontup or ())

    def _args(self, params: Mapping[str, Any]) -> list[Any]:
        return [params[name] for name in self._order]

    async def fetch(self, db: Db, params: Mapping[str, Any] | None = None) -> Sequence[Row]:
        params = params or {}
        if isinstance(db, AsyncConnection):
            return cast(Sequence[Row], (await db.execute(self.clause, params)).mappings().all())
        rows: list[Row] = await db.fetch(self._sql, *self._args(params))
        return rows

    async def fetchrow(self, db: Db, params: Mapping[str, Any] | None = None) -> Row | None:
        """The first row, or None."""
        params = params or {}
        if isinstance(db, AsyncConnection):
            return cast(Row | None, (await db.execute(self.clause, params)).mappings().first())
        row: Row | None = await db.fetchrow(self._sql, *self._args(params))
        return row

    async def execute(self, db: Db, params: Mapping[str, Any] | None = None) -> None:
        params = params or {}
        if isinstance(db, AsyncConnection):
            await db.execute(self.clause, params)
        else:
            await db.execute(self._sql, *self._args(params))


@contextlib.asynccontextmanager
async def driver(conn: AsyncConnection, *, transaction: bool) -> AsyncIterator[asyncpg.Connection]:
    """The asyncpg connection under ``conn`` (which must not have run a statement yet), in a
    transaction of its own with ``transaction``; without, each statement commits by itself.

    Its statements bypass the engine, so its error hook (app.db._on_engine_error) never sees
    their errors: a connection that is lost, or whose statement timed out, is invalidated here as
    that hook would, and one left inside a transaction (cancelled before its rollback) too, so
    the pool never hands it out again."""
    pooled = await conn.get_raw_connection()
    raw: asyncpg.Connection = pooled.driver_connection
    try:
        if transaction:
            async with raw.transaction():
                yield raw
        else:
            yield raw
    except BaseException as exc:
        failure = classify_db_error(exc) if isinstance(exc, Exception) else None
        if failure is not None and failure.connection_lost:
            # As the hook does for a lost connection: every connection the pool holds that is
            # older than this one is suspect (a restart, a failover, terminated backends) and is
            # replaced on its next checkout, so the caller's own error handling (marking the
            # summary failed) does not pick up another dead one. SQLAlchemy offers this only
            # through the pool's _invalidate (with _checkin=False: the time, not the connection).
            conn.sync_engine.pool._invalidate(pooled, exc, _checkin=False)
        lost = failure is not None and (failure.connection_lost or isinstance(failure.cause, TimeoutError))
        if lost or raw.is_in_transaction():
            await conn.invalidate()
        raise


@contextlib.asynccontextmanager
async def connect(engine: AsyncEngine, *, transaction: bool) -> AsyncIterator[asyncpg.Connection]:
    """A pooled connection of ``engine`` as its asyncpg connection (:func:`driver`)."""
    async with engine.connect() as conn, driver(conn, transaction=transaction) as raw:
        yield raw
