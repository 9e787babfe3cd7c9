"""App factory and lifespan: engine, model, background runner."""

from __future__ import annotations

import logging
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope

from app.api import admin, context, conversations, docs, events, health, openapi, ops, users, webhooks
from app.api import metrics as metrics_api
from app.api.responses import edge_responses
from app.db import (
    classify_db_error,
    describe_db_error,
    head_revision,
    is_database_error,
)
from app.edge import (
    EdgeMiddleware,
    docs_served,
    internal_error_handler,
    internal_error_payload,
    request_id_of,
)
from app.errors import AppError
from app.events import EventHub
from app.metrics import MetricsMiddleware
from app.runtime import configure_logging, running_service
from app.settings import Settings, load_settings

logger = logging.getLogger("app")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with running_service(settings, run_summaries=settings.MEMORY_RUN_SUMMARIES) as service:
            app.state.engine = service.engine
            app.state.service = service
            if settings.DATABASE_PGBOUNCER and settings.DATABASE_DIRECT_URL is None:
                logger.warning(
                    "DATABASE_PGBOUNCER is set but DATABASE_DIRECT_URL is not: the event streams' "
                    "LISTEN connection goes through PgBouncer, which does not carry notifications "
                    "in transaction mode; set DATABASE_DIRECT_URL to PostgreSQL itself"
                )
            hub = EventHub(
                engine=service.engine,
                max_streams=settings.MEMORY_EVENTS_MAX_STREAMS,
                heartbeat_seconds=settings.MEMORY_EVENTS_HEARTBEAT_SECONDS,
                listen_url=settings.DATABASE_DIRECT_URL,
            )
            app.state.hub = service.hub = hub
            await hub.start()
            try:
                yield
            finally:
                await hub.stop()

    app = FastAPI(
        title="Conversation memory service",
        version="0.1.0",
        description=openapi.DESCRIPTION,
        openapi_tags=openapi.TAGS,
        generate_unique_id_function=openapi.operation_id,
        lifespan=lifespan,
        # A redirect to the slash-less path would build its Location from the Host header.
        redirect_slashes=False,
        # /docs and /redoc are app.api.docs's, with their files served here, not from a CDN.
        docs_url=None,
        redoc_url=None,
        openapi_url=docs.OPENAPI_PATH if docs_served(settings) else None,
    )
    app.state.settings = settings
    # API keys, body limit, request ids and JSON 500s, before FastAPI reads a body (app.edge).
    app.add_middleware(EdgeMiddleware, settings=settings)
    # Outermost: times every request, the edge's refusals included (app.metrics).
    app.add_middleware(MetricsMiddleware)
    app.add_exception_handler(Exception, internal_error_handler)
    # Operators' endpoints: /metrics, and the admin view when there is an admin key.
    app.include_router(metrics_api.router)
    if settings.admin_key is not None:
        app.include_router(admin.router)
    app.state.head_revision = head_revision()
    for module in (conversations, context, events, ops, users, webhooks):
        app.include_router(module.router, responses=edge_responses(api_keys=bool(settings.api_keys)))
    app.include_router(health.router, responses=edge_responses(api_keys=False))
    if docs_served(settings):
        app.include_router(docs.router)
    openapi.install(app, api_keys=bool(settings.api_keys))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            return JSONResponse(
                status_code=405,
                content={"detail": "Method Not Allowed", "code": "method_not_allowed"},
                headers={"Allow": ", ".join(allowed_methods(app, request.scope))},
            )
        return JSONResponse(
            status_code=exc.status_code,
            content={"detail": exc.detail, "code": _CODES.get(exc.status_code, "http_error")},
            headers=exc.headers,
        )

    @app.exception_handler(AppError)
    async def _app_error(_request: Request, exc: AppError) -> JSONResponse:
        return JSONResponse(
            status_code=exc.status_code, content={"detail": exc.detail, "code": exc.code}, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        found = exc.errors()
        if any(
            e.get("type") == "too_long" and tuple(e.get("loc", ())) == ("body", "messages") for e in found
        ):
            limit = request.app.state.settings.MEMORY_MAX_MESSAGES_PER_REQUEST
            return JSONResponse(
                status_code=413,
                content={
                    "detail": f"at most {limit} messages per request (MEMORY_MAX_MESSAGES_PER_REQUEST)",
                    "code": "payload_too_large",
                },
            )
        if any(e.get("type") == "json_invalid" for e in found):
            # The body is not JSON at all: 400, as documented, not a 422 about its fields.
            return JSONResponse(
                status_code=400,
                content={"detail": "the request body is not valid JSON", "code": "bad_request"},
            )
        if any(tuple(e.get("loc", ())) == ("body",) and isinstance(e.get("input"), bytes) for e in found):
            # FastAPI parses a body as JSON only when its Content-Type says so, and hands the
            # model the raw bytes otherwise: the media type is wrong, not a field.
            return JSONResponse(
                status_code=415,
                content={
                    "detail": "send the body as JSON, with 'Content-Type: application/json'",
                    "code": "unsupported_media_type",
                },
            )
        # The first errors say what is wrong; thousands of them would make the answer a load.
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in found[:MAX_ERRORS_SHOWN]
        ]
        if len(found) > MAX_ERRORS_SHOWN:
            errors.append(
                {"loc": ["body"], "msg": f"and {len(found) - MAX_ERRORS_SHOWN} more errors", "type": "more"}
            )
        return JSONResponse(status_code=422, content={"detail": errors, "code": "invalid_request"})

    @app.exception_handler(DBAPIError)
    @app.exception_handler(PoolTimeoutError)
    @app.exception_handler(OSError)
    @app.exception_handler(asyncpg.PostgresError)
    @app.exception_handler(asyncpg.InterfaceError)
    @app.exception_handler(asyncpg.exceptions.InternalClientError)
    async def _db_unavailable(request: Request, exc: Exception) -> JSONResponse:
        # The database being unavailable (restarting, unreachable, max_connections, no pooled
        # connection free in time, a statement timed out) is transient: answer 503 at once so
        # clients retry, instead of hanging or a bare 500. The engine itself replaces the
        # connections a lost connection condemns (app.db._on_engine_error); a busy database
        # keeps its healthy pool.
        failure = classify_db_error(exc)
        if failure is None:
            if not is_database_error(exc):
                raise exc  # e.g. a missing file: a bug, the usual 500
            return _db_bug(request, exc)
        logger.warning(
            "Database unavailable (%s) on %s %s: answering 503",
            describe_db_error(failure.cause),
            request.method,
            request.url.path,
        )
        return JSONResponse(
            status_code=503,
            content={"detail": "database unavailable, retry shortly", "code": "unavailable"},
            headers={"Retry-After": "1"},
        )

    return app


MAX_ERRORS_SHOWN = 20
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """Every method some route answers on this path: Starlette's 405 names only the first
    matching route's. Asked through each route's own matching, so included routers count."""
    return [
        method
        for method in _METHODS
        if any(route.matches({**scope, "method": method})[0] is Match.FULL for route in app.router.routes)
    ]


_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
}


def _db_bug(request: Request, exc: Exception) -> JSONResponse:
    """A database error that is no outage (a constraint, bad SQL): the usual JSON 500, logged
    without the error's messages at any level, as they may quote values, i.e. message content
    (``DETAIL: Failing row contains (...)``). The stack says where it happened."""
    request_id = request_id_of(request.scope)
    logger.error(
        "Database error on %s %s (request_id=%s): %s\n%s",
        request.method,
        request.url.path,
        request_id,
        describe_db_error(exc),
        "".join(traceback.format_tb(exc.__traceback__)).rstrip(),
    )
    return JSONResponse(status_code=500, content=internal_error_payload(request_id))


def app_from_env() -> FastAPI:
    """Entry point for ``uvicorn app.main:app`` style use."""
    settings = load_settings()
    configure_logging(settings.LOG_LEVEL, settings.LOG_FORMAT)
    return create_app(settings)


def __getattr__(name: str) -> FastAPI:
    # `uvicorn app.main:app` works without building an app (and reading settings) at import.
    if name == "app":
        return app_from_env()
    raise AttributeError(name)
