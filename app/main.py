"""App factory and lifespan: engine, model, background runner."""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope

from app.api import context, conversations, health, ops
from app.db import (
    classify_db_error,
    create_engine,
    create_read_pool,
    describe_db_error,
    head_revision,
    is_database_error,
    release_embedded_postgres,
    resolve_database_url,
)
from app.edge import (
    EdgeMiddleware,
    docs_served,
    internal_error_handler,
    internal_error_payload,
    request_id_of,
)
from app.errors import AppError
from app.memory.breaker import CircuitBreaker
from app.memory.llm import ChatModel
from app.memory.service import Limits, MemoryService
from app.repositories.memory import Backoff
from app.schemas import ErrorOut
from app.settings import Settings, SummarizerKind, load_settings

logger = logging.getLogger("app")


def build_model(settings: Settings) -> ChatModel | None:
    """The model that writes summaries; None means each policy's offline fallback."""
    if settings.summarizer_kind is SummarizerKind.OPENAI:
        assert settings.OPENAI_API_KEY is not None  # checked by Settings
        return ChatModel(
            api_key=settings.OPENAI_API_KEY.get_secret_value(),
            model=settings.MEMORY_MODEL,
            base_url=settings.OPENAI_BASE_URL,
            timeout_seconds=settings.MEMORY_LLM_TIMEOUT_SECONDS,
            max_retries=settings.MEMORY_LLM_MAX_RETRIES,
            call_timeout_seconds=settings.MEMORY_LLM_CALL_TIMEOUT_SECONDS,
        )
    return None


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s [%(name)s] %(message)s")
    logging.getLogger("app").setLevel(level)
    # Both log every step at INFO (initdb/pg_ctl output; a line per /readyz check).
    for noisy in ("embedded_postgres", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = await asyncio.to_thread(resolve_database_url, settings)  # may start a server
        engine = create_engine(url, settings)
        read_pool = await create_read_pool(url, settings)
        model = build_model(settings)
        service = MemoryService(
            engine=engine,
            read_pool=read_pool,
            model=model,
            default_policy=settings.default_policy,
            parameter_defaults=settings.policy_defaults,
            summary_max_chars=settings.MEMORY_SUMMARY_MAX_CHARS,
            limits=Limits(
                max_context_messages=settings.MEMORY_MAX_CONTEXT_MESSAGES,
                max_context_bytes=settings.MEMORY_MAX_CONTEXT_BYTES,
                max_page_bytes=settings.MEMORY_MAX_PAGE_BYTES,
                max_metadata_bytes=settings.MEMORY_MAX_METADATA_BYTES,
                max_metadata_keys=settings.MEMORY_MAX_METADATA_KEYS,
            ),
            backoff=Backoff(
                base_seconds=settings.MEMORY_SUMMARY_BACKOFF_SECONDS,
                max_seconds=settings.MEMORY_SUMMARY_BACKOFF_MAX_SECONDS,
            ),
            breaker=CircuitBreaker(
                failures=settings.MEMORY_LLM_BREAKER_FAILURES,
                open_seconds=settings.MEMORY_LLM_BREAKER_OPEN_SECONDS,
            ),
            lease_seconds=settings.MEMORY_PROCESSING_TIMEOUT_SECONDS,
            idempotency_ttl_hours=settings.MEMORY_IDEMPOTENCY_TTL_HOURS,
            max_concurrent=settings.MEMORY_MAX_CONCURRENT_SUMMARIES,
            max_pending=settings.MEMORY_MAX_PENDING_SUMMARIES,
            maintenance_interval=settings.MEMORY_REAPER_INTERVAL_SECONDS,
        )
        app.state.engine = engine
        app.state.service = service
        logger.info(
            "Memory service up: summarizer=%s, default policy=%s",
            service.summarizer_name,
            service.default_policy_json,
        )
        service.runner.start()
        try:
            yield
        finally:
            await service.runner.shutdown(settings.MEMORY_SHUTDOWN_GRACE_SECONDS)
            if model is not None:
                await model.aclose()
            await read_pool.close()
            await engine.dispose()
            if settings.DATABASE_URL is None:
                await asyncio.to_thread(release_embedded_postgres)

    app = FastAPI(
        title="Conversation memory service",
        version="0.1.0",
        description="Rounds in, bounded context out: summaries made by a memory policy per "
        "conversation (sliding window, rolling blocks), with a gap fallback.",
        lifespan=lifespan,
        # A redirect to the slash-less path would build its Location from the Host header.
        redirect_slashes=False,
        docs_url="/docs" if docs_served(settings) else None,
        redoc_url="/redoc" if docs_served(settings) else None,
        openapi_url="/openapi.json" if docs_served(settings) else None,
    )
    app.state.settings = settings
    # API keys, body limit, request ids and JSON 500s, before FastAPI reads a body (app.edge).
    app.add_middleware(EdgeMiddleware, settings=settings)
    app.add_exception_handler(Exception, internal_error_handler)
    app.state.head_revision = head_revision()
    errors: dict[int | str, dict[str, Any]] = {
        400: {"description": "The body could not be parsed"},
        401: {"model": ErrorOut, "description": "Missing or invalid API key (when keys are on)"},
        404: {"model": ErrorOut, "description": "Unknown conversation or memory"},
        503: {"model": ErrorOut, "description": "Database unavailable; retry"},
    }
    for module in (conversations, context, ops):
        app.include_router(module.router, responses=errors)
    app.include_router(health.router)

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
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse(
            status_code=exc.status_code,
            content={"detail": exc.message, "code": exc.code},
            headers=headers,
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
    configure_logging(settings.LOG_LEVEL)
    return create_app(settings)


def __getattr__(name: str) -> FastAPI:
    # `uvicorn app.main:app` works without building an app (and reading settings) at import.
    if name == "app":
        return app_from_env()
    raise AttributeError(name)
