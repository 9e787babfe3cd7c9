"""The benchmark's own database: derived from a server URL, created fresh, dropped at the end."""

from __future__ import annotations

import os
import secrets

import asyncpg
from sqlalchemy.engine import make_url

DEFAULT_SERVER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def to_asyncpg_dsn(url: str) -> str:
    """postgresql://, postgres:// or postgresql+asyncpg:// -> the postgresql:// form asyncpg takes."""
    for prefix in ("postgresql+asyncpg://", "postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    raise ValueError(f"not a PostgreSQL URL: {redact(url)}")


def with_database(url: str, database: str) -> str:
    """The same server and credentials, another database."""
    parsed = make_url(to_asyncpg_dsn(url)).set(database=database)
    return parsed.render_as_string(hide_password=False)


def redact(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable URL>"


def new_database_name() -> str:
    return f"memory_bench_{os.getpid()}_{secrets.token_hex(3)}"


async def _admin_connection(server_url: str) -> asyncpg.Connection:
    """A connection to the given database, or to 'postgres' when that one does not exist."""
    dsn = to_asyncpg_dsn(server_url)
    try:
        return await asyncpg.connect(dsn, timeout=10)
    except asyncpg.InvalidCatalogNameError:
        return await asyncpg.connect(with_database(dsn, "postgres"), timeout=10)


async def create_database(server_url: str, name: str) -> str:
    """CREATE DATABASE ``name`` on the server of ``server_url``; return its asyncpg URL.

    template0 takes no connections, so concurrent creations (parallel test runs) never fail on
    "source database is being accessed by other users".
    """
    conn = await _admin_connection(server_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    finally:
        await conn.close()
    return with_database(server_url, name)


async def drop_database(server_url: str, name: str) -> None:
    conn = await _admin_connection(server_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()
