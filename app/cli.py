"""`memory-service`: serve (migrating first) or migrate."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from app.settings import Settings, SettingsError, load_settings

logger = logging.getLogger("app")


def _migrate_when_reachable(url: str, migrate: Callable[[str], None], wait_seconds: float) -> None:
    """Migrate, retrying while the database refuses connections (it may still be starting, as
    in `docker compose up`), for up to ``wait_seconds``."""
    deadline = time.monotonic() + wait_seconds
    delay = 0.5
    while True:
        try:
            migrate(url)
            return
        except (OSError, asyncpg.CannotConnectNowError) as exc:
            if time.monotonic() + delay > deadline:
                raise OSError(str(exc)) from exc
            logger.warning("Database not reachable yet (%s); retrying in %.1fs", exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memory-service", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="apply migrations, then serve HTTP")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1)
    serve.add_argument("--no-migrate", action="store_true", help="skip `alembic upgrade head`")
    serve.add_argument(
        "--http",
        choices=["auto", "httptools", "h11"],
        default="auto",
        help="uvicorn's HTTP/1.1 implementation (auto: httptools)",
    )
    sub.add_parser("migrate", help="apply migrations and exit")
    args = parser.parse_args(argv)

    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"memory-service: {exc}", file=sys.stderr)
        return 2

    from app.db import migrate, resolve_database_url
    from app.main import configure_logging

    configure_logging(settings.LOG_LEVEL)
    url = resolve_database_url(settings)
    if args.command == "migrate" or not args.no_migrate:
        try:
            _migrate_when_reachable(url, migrate, settings.DATABASE_STARTUP_WAIT_SECONDS)
        except OSError as exc:
            print(f"memory-service: database unreachable: {exc}", file=sys.stderr)
            return 1
        logger.info("Database migrated to head")
    if args.command == "migrate":
        return 0

    import uvicorn

    from app.main import create_app

    if settings.DATABASE_URL is None and args.workers > 1:
        print("memory-service: --workers > 1 needs DATABASE_URL", file=sys.stderr)
        return 2
    options = uvicorn_options(settings, args.http)
    if args.workers > 1:
        # Each worker process builds its app from the environment (app.main:app).
        uvicorn.run("app.main:app", host=args.host, port=args.port, workers=args.workers, **options)
    else:
        uvicorn.run(create_app(settings), host=args.host, port=args.port, **options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
