"""Async Alembic environment. The URL comes from the Alembic config's ``sqlalchemy.url`` when the
service sets it (``app.db.migrate``), else from DATABASE_URL, so `alembic upgrade head` and the
service always migrate the same database."""

from __future__ import annotations

import asyncio
import logging.config

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from app.models import metadata
from app.settings import load_settings

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    settings = load_settings()
    if settings.DATABASE_URL is None:
        raise SystemExit("DATABASE_URL is not set; `memory-service migrate` migrates the embedded database")
    return settings.DATABASE_URL


# Replicas starting together all run `serve`, which migrates first: an advisory lock makes them
# take turns, so the first one migrates and the others find the database already at head.
MIGRATION_LOCK_ID = 0x6D656D6F7279  # "memory"


def _run(connection: Connection) -> None:
    # Transaction-scoped: held until the migrations commit, so the next replica sees them.
    connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID})
    context.configure(connection=connection, target_metadata=metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_online() -> None:
    engine = create_async_engine(_url())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_online())
