"""Building the running service from settings: the engine and pools, the model, the memory
service and its runner. Shared by the HTTP app's lifespan and the `worker` command."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from app import logs, metrics
from app.db import create_engine, create_read_pool, release_embedded_postgres, resolve_database_url
from app.memory.breaker import CircuitBreaker
from app.memory.llm import ChatModel
from app.memory.service import Limits, MemoryService, Retries
from app.memory.tokens import counter_for
from app.repositories.memory import Backoff
from app.settings import Settings, SummarizerKind
from app.webhooks import Retries as WebhookRetries
from app.webhooks import WebhookSender

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


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr at ``level``, as text or one JSON object per line (app.logs)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logs.formatter(log_format))
    logging.basicConfig(level=level, handlers=[handler])
    logging.getLogger("app").setLevel(level)
    # They log every step at INFO (initdb/pg_ctl output; a line per /readyz check; a line per
    # model call from the OpenAI client's HTTP library).
    for noisy in ("embedded_postgres", "alembic", "httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))


@asynccontextmanager
async def running_service(
    settings: Settings, *, run_summaries: bool, announce: bool = True
) -> AsyncIterator[MemoryService]:
    """The memory service, with its runner claiming and running summaries when
    ``run_summaries`` (its maintenance runs either way); stopped gracefully on exit. Without
    ``announce`` (a one-shot command: ops, export, import) its start-up line is logged at DEBUG,
    so the command's own output is all its user sees."""
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
            max_import_entries=settings.MEMORY_MAX_IMPORT_ENTRIES,
            max_message_chars=settings.MEMORY_MAX_MESSAGE_CHARS,
        ),
        retries=Retries(
            backoff=Backoff(
                base_seconds=settings.MEMORY_SUMMARY_BACKOFF_SECONDS,
                max_seconds=settings.MEMORY_SUMMARY_BACKOFF_MAX_SECONDS,
            ),
            max_attempts=settings.MEMORY_SUMMARY_MAX_ATTEMPTS,
        ),
        breaker=CircuitBreaker(
            failures=settings.MEMORY_LLM_BREAKER_FAILURES,
            open_seconds=settings.MEMORY_LLM_BREAKER_OPEN_SECONDS,
        ),
        lease_seconds=settings.MEMORY_PROCESSING_TIMEOUT_SECONDS,
        idempotency_ttl_hours=settings.MEMORY_IDEMPOTENCY_TTL_HOURS,
        events_ttl_hours=settings.MEMORY_EVENTS_TTL_HOURS,
        archive_after_days=settings.MEMORY_ARCHIVE_AFTER_DAYS,
        max_concurrent=settings.MEMORY_MAX_CONCURRENT_SUMMARIES,
        claim_interval=settings.MEMORY_CLAIM_INTERVAL_SECONDS,
        maintenance_interval=settings.MEMORY_REAPER_INTERVAL_SECONDS,
        token_counter=counter_for(settings.MEMORY_MODEL),
        pgbouncer=settings.DATABASE_PGBOUNCER,
    )
    logger.log(
        logging.INFO if announce else logging.DEBUG,
        "Memory service up: summarizer=%s, default policy=%s, summaries %s",
        service.summarizer_name,
        service.default_policy_json,
        f"run here (up to {settings.MEMORY_MAX_CONCURRENT_SUMMARIES} at once)"
        if run_summaries
        else "left to workers",
    )
    service.runner.start(claims=run_summaries)
    sender = WebhookSender(
        engine=engine,
        timeout_seconds=settings.MEMORY_WEBHOOK_TIMEOUT_SECONDS,
        interval_seconds=settings.MEMORY_WEBHOOK_INTERVAL_SECONDS,
        retries=WebhookRetries(
            max_attempts=settings.MEMORY_WEBHOOK_MAX_ATTEMPTS,
            backoff_seconds=settings.MEMORY_WEBHOOK_BACKOFF_SECONDS,
            backoff_max_seconds=settings.MEMORY_WEBHOOK_BACKOFF_MAX_SECONDS,
        ),
    )
    sender.start()
    stop_sampling = asyncio.Event()
    sampling = asyncio.create_task(
        metrics.sample_forever(
            service,
            refresh_seconds=settings.MEMORY_METRICS_REFRESH_SECONDS,
            stuck_after_seconds=settings.MEMORY_PROCESSING_TIMEOUT_SECONDS,
            stop=stop_sampling,
        ),
        name="metrics-sampling",
    )
    try:
        yield service
    finally:
        stop_sampling.set()
        await asyncio.gather(sampling, return_exceptions=True)
        await sender.stop()
        await service.runner.shutdown(settings.MEMORY_SHUTDOWN_GRACE_SECONDS)
        if model is not None:
            await model.aclose()
        await read_pool.close()
        await engine.dispose()
        if settings.DATABASE_URL is None:
            await asyncio.to_thread(release_embedded_postgres)
        metrics.process_exiting()
