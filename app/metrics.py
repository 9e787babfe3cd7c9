"""Prometheus metrics: what the service counts, the HTTP middleware that times requests, the
loop that samples gauges, and the text a scrape of /metrics returns.

Several processes (``serve --workers N``) share one set of numbers through prometheus-client's
multiprocess mode: ``serve`` points PROMETHEUS_MULTIPROC_DIR at a fresh folder before the
workers start (it must be set before prometheus_client is imported), each process writes its
counters and histograms there, and a scrape of any process merges them. Gauges say how to merge:
what each process has (running summaries, slots, pool connections) is summed over the live
processes; what every process reads from the database (due, queued, stuck, failed work) is the
most recent reading; the model's circuit is the worst state of any live process.

Counters and histograms are updated where things happen (app.memory.service, app.memory.llm);
gauges are sampled: this process's state on every scrape and every second, the database's work
counts every MEMORY_METRICS_REFRESH_SECONDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric
from sqlalchemy.pool import QueuePool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import logs
from app.memory.breaker import CircuitState
from app.memory.policies import POLICY_NAMES
from app.prometheus_dir import MULTIPROC_DIR

if TYPE_CHECKING:
    from app.memory.service import MemoryService

logger = logging.getLogger(__name__)

# The classic text format (version 0.0.4), which every Prometheus version reads.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
METRICS_PATH = "/metrics"

# ---- what is counted ---------------------------------------------------------------------------

HTTP_REQUEST_SECONDS = Histogram(
    "memory_http_request_duration_seconds",
    "HTTP requests by method, route template and status, from the first byte of the app to the "
    "last of the response (its _count is the number of requests).",
    ["method", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)

# Why a summary attempt ended without a completed row (the ``reason`` label).
FAILURE_REASONS = (
    "llm_error",  # the model's server refused or failed the request
    "timeout",  # a model call timed out (per read, or MEMORY_LLM_CALL_TIMEOUT_SECONDS in all)
    "empty",  # the model (or the offline fallback) returned no text
    "database",  # a database error while reading the input or storing the result
    "lease_expired",  # the reaper failed it: its runner died on every attempt
    "shutdown_requeued",  # the process shut down mid-summary and gave the row back to the queue
    "superseded",  # reaped, claimed again or deleted while it ran: its result was dropped
    "error",  # anything else (a bug: the log has the traceback)
)
UNKNOWN_POLICY = "unknown"

SUMMARIES_STARTED = Counter(
    "memory_summaries_started",
    "Summary attempts started in this service, by the conversation's memory policy.",
    ["policy"],
)
SUMMARIES_COMPLETED = Counter(
    "memory_summaries_completed", "Summaries completed, by memory policy.", ["policy"]
)
SUMMARIES_FAILED = Counter(
    "memory_summaries_failed",
    "Summary attempts that ended without a completed row, by memory policy and reason.",
    ["policy", "reason"],
)
SUMMARY_LAG_SECONDS = Histogram(
    "memory_summary_lag_seconds",
    "From a round's POST to the completion of the first summary covering it (one sample per "
    "newly covered round).",
    ["policy"],
    buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0),
)
SUMMARY_GENERATION_SECONDS = Histogram(
    "memory_summary_generation_seconds",
    "Time to make a completed summary: reading its input, the model call, storing it.",
    ["policy"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)

LLM_CALLS = Counter(
    "memory_llm_calls",
    "Model calls (each may take several HTTP attempts), by outcome: ok, error, timeout, empty.",
    ["outcome"],
)
LLM_RETRIES = Counter("memory_llm_retries", "HTTP attempts of model calls beyond each call's first.")
LLM_TOKENS = Counter(
    "memory_llm_tokens",
    "Tokens the model's server reported (its response's usage), by direction: input, output.",
    ["direction"],
)

RUNNER_RUNNING = Gauge(
    "memory_runner_running",
    "Summaries running now in the processes that serve this scrape.",
    multiprocess_mode="livesum",
)
RUNNER_SLOTS = Gauge(
    "memory_runner_slots",
    "Summary slots (MEMORY_MAX_CONCURRENT_SUMMARIES of each process that runs summaries).",
    multiprocess_mode="livesum",
)
LLM_CIRCUIT_STATE = Gauge(
    "memory_llm_circuit_state",
    "The model's circuit breaker: 0 closed, 1 half-open, 2 open (the worst of the processes).",
    multiprocess_mode="livemax",
)
LLM_CONSECUTIVE_FAILURES = Gauge(
    "memory_llm_consecutive_failures",
    "Failed model calls in a row (the most of the processes).",
    multiprocess_mode="livemax",
)
DB_POOL_IN_USE = Gauge(
    "memory_db_pool_in_use",
    "Database connections checked out: pool=engine (SQLAlchemy) or read (the context read's).",
    ["pool"],
    multiprocess_mode="livesum",
)
DB_POOL_OPEN = Gauge(
    "memory_db_pool_open", "Database connections open, in use or idle.", ["pool"], multiprocess_mode="livesum"
)
DB_POOL_MAX = Gauge(
    "memory_db_pool_max",
    "Database connections each pool may open (the engine's includes its overflow).",
    ["pool"],
    multiprocess_mode="livesum",
)

# The work in the database, as every process reads it (the most recent reading wins).
WORK_DUE = Gauge(
    "memory_work_due",
    "Conversations whose next summary is due now and not yet planned.",
    multiprocess_mode="livemostrecent",
)
WORK_QUEUED = Gauge(
    "memory_work_queued",
    "Planned summaries waiting for a runner (or for a retry after their runner stopped).",
    multiprocess_mode="livemostrecent",
)
WORK_RUNNING = Gauge(
    "memory_work_running",
    "Summaries a runner holds a lease on, in every process and worker.",
    multiprocess_mode="livemostrecent",
)
WORK_STUCK = Gauge(
    "memory_work_stuck",
    "'processing' rows older than MEMORY_PROCESSING_TIMEOUT_SECONDS (GET /ops/memories/stuck).",
    multiprocess_mode="livemostrecent",
)
WORK_FAILED = Gauge(
    "memory_work_failed",
    "Memory rows in status 'failed' (GET /ops/memories/failed; a retry takes one out).",
    multiprocess_mode="livemostrecent",
)
WORK_OLDEST_DUE_SECONDS = Gauge(
    "memory_work_oldest_due_seconds",
    "How long the oldest due conversation has waited for its summary to start (0: none).",
    multiprocess_mode="livemostrecent",
)

CIRCUIT_VALUES = {CircuitState.CLOSED: 0, CircuitState.HALF_OPEN: 1, CircuitState.OPEN: 2}

# No *_created series next to each counter: multiprocess mode has none, and Prometheus does not
# need them; one process or several then scrape alike.
disable_created_metrics()  # type: ignore[no-untyped-call]


def _declare_series() -> None:
    """Known label values start at 0, so a rate is defined from the first scrape on."""
    for policy in POLICY_NAMES:
        SUMMARIES_STARTED.labels(policy)
        SUMMARIES_COMPLETED.labels(policy)
        for reason in FAILURE_REASONS:
            SUMMARIES_FAILED.labels(policy, reason)
    for outcome in ("ok", "error", "timeout", "empty"):
        LLM_CALLS.labels(outcome)
    for direction in ("input", "output"):
        LLM_TOKENS.labels(direction)


_declare_series()


# ---- HTTP requests -----------------------------------------------------------------------------

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_template(scope: Scope) -> str:
    """The template of the route that served the request (``/conversations/{conversation_id}/
    context``), never the raw path, so that the labels stay few. A request answered before
    routing (401, 413, 431) is matched here; one that matches no route is ``unmatched``."""
    path = getattr(scope.get("route"), "path", None)
    if isinstance(path, str):
        return path
    router = getattr(scope.get("app"), "router", None)
    for regex, template in _templates(getattr(router, "routes", ())):
        if regex.match(scope.get("path", "")):
            return template
    return "unmatched"


def _templates(routes: Iterable[object]) -> Iterator[tuple[re.Pattern[str], str]]:
    """(path regex, path template) of every route, those of included routers too (which recent
    FastAPI versions keep as one entry each, matched lazily)."""
    for route in routes:
        contexts = getattr(route, "effective_route_contexts", None)
        for candidate in contexts() if callable(contexts) else (route,):
            regex = getattr(candidate, "path_regex", None)
            template = getattr(candidate, "path_format", None) or getattr(candidate, "path", None)
            if isinstance(regex, re.Pattern) and isinstance(template, str):
                yield regex, template


class MetricsMiddleware:
    """The outermost middleware: times every request, answers included that app.edge refuses
    before routing. It also scopes the log fields app.edge binds (the request id) to the request:
    they are reset when it ends, whichever task served it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # unless a response starts

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        token = logs.bind()
        try:
            await self.app(scope, receive, send_with_status)
        finally:
            logs.unbind(token)
            method = scope.get("method", "")
            HTTP_REQUEST_SECONDS.labels(
                method if method in _METHODS else "other", route_template(scope), str(status)
            ).observe(time.perf_counter() - started)


# ---- gauges ------------------------------------------------------------------------------------


def sample_process(service: MemoryService) -> None:
    """This process's gauges: its runner, its circuit breaker, its two connection pools."""
    runner = service.runner
    RUNNER_RUNNING.set(runner.running)
    RUNNER_SLOTS.set(runner.max_concurrent if runner.accepting else 0)
    if service.model is None:  # offline summaries: no model, no circuit
        LLM_CIRCUIT_STATE.set(0)
        LLM_CONSECUTIVE_FAILURES.set(0)
    else:
        LLM_CIRCUIT_STATE.set(CIRCUIT_VALUES[service.breaker.state])
        LLM_CONSECUTIVE_FAILURES.set(service.breaker.consecutive_failures)
    pool = service.engine.pool
    if isinstance(pool, QueuePool):
        DB_POOL_IN_USE.labels("engine").set(pool.checkedout())
        DB_POOL_OPEN.labels("engine").set(pool.checkedout() + pool.checkedin())
        DB_POOL_MAX.labels("engine").set(pool.size() + pool._max_overflow)
    read_pool = service.read_pool
    DB_POOL_IN_USE.labels("read").set(read_pool.get_size() - read_pool.get_idle_size())
    DB_POOL_OPEN.labels("read").set(read_pool.get_size())
    DB_POOL_MAX.labels("read").set(read_pool.get_max_size())


async def refresh_work(service: MemoryService, *, stuck_after_seconds: float) -> None:
    """The database's work counts, read by one statement."""
    totals = await service.work_totals(stuck_after_seconds=stuck_after_seconds)
    WORK_DUE.set(totals["due"])
    WORK_QUEUED.set(totals["queued"])
    WORK_RUNNING.set(totals["running"])
    WORK_STUCK.set(totals["stuck"])
    WORK_FAILED.set(totals["failed"])
    WORK_OLDEST_DUE_SECONDS.set(totals["oldest_due_seconds"] or 0.0)


# How often this process's own gauges are sampled between scrapes (the worker's /metrics is
# served by prometheus-client's HTTP server in a thread, which does not sample them itself).
SAMPLE_SECONDS = 1.0


async def sample_forever(
    service: MemoryService, *, refresh_seconds: float, stuck_after_seconds: float, stop: asyncio.Event
) -> None:
    """Sample this process's gauges every second and the database's work counts every
    ``refresh_seconds``, until ``stop`` is set (never in the middle of a statement: a cancelled
    query leaves its connection to be torn down)."""
    tick = min(SAMPLE_SECONDS, refresh_seconds)
    # The first reading waits a tick: start-up (migrations, the first requests, the maintenance
    # loop) has the pool to itself.
    next_refresh = time.monotonic() + tick
    while not stop.is_set():
        sample_process(service)
        now = time.monotonic()
        if now >= next_refresh:
            # A failed reading waits for the next turn too: no retries for a busy pool.
            next_refresh = now + refresh_seconds
            try:
                await refresh_work(service, stuck_after_seconds=stuck_after_seconds)
            except Exception as exc:
                logger.debug("Reading the work counts for /metrics failed (%s)", type(exc).__name__)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(tick):
                await stop.wait()


# ---- scrapes -----------------------------------------------------------------------------------


def multiprocess_dir() -> Path | None:
    value = os.environ.get(MULTIPROC_DIR)
    return Path(value) if value else None


def forget_dead_processes(path: Path) -> None:
    """Drop the live gauges of processes that are gone (a worker killed and replaced): their
    running summaries and connections no longer exist. Their counters stay, as they must."""
    for file in path.glob("gauge_live*_*.db"):
        pid_text = file.stem.rsplit("_", 1)[-1]
        if pid_text.isdigit() and not _alive(int(pid_text)):
            prometheus_multiprocess.mark_process_dead(int(pid_text), str(path))  # type: ignore[no-untyped-call]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # no such process (or not ours to ask: then it is someone else's)
        return False


class _LiveProcesses(prometheus_multiprocess.MultiProcessCollector):
    """Every process's files, less the live gauges of processes that are gone."""

    def __init__(self, registry: CollectorRegistry, path: Path) -> None:
        super().__init__(registry, path=str(path))  # type: ignore[no-untyped-call]
        self.folder = path

    def collect(self) -> Iterable[Metric]:
        forget_dead_processes(self.folder)
        return super().collect()  # type: ignore[no-untyped-call,no-any-return]


def scrape_registry() -> CollectorRegistry:
    """What a scrape reads: every process's files in multiprocess mode, else this process's
    registry (which adds the Python runtime's and the process's own metrics)."""
    path = multiprocess_dir()
    if path is None:
        return REGISTRY
    registry = CollectorRegistry()
    _LiveProcesses(registry, path)
    return registry


async def render(service: MemoryService | None) -> bytes:
    """The text of a scrape (this process's gauges sampled first)."""
    if service is not None:
        sample_process(service)
    return await asyncio.to_thread(generate_latest, scrape_registry())


def process_exiting() -> None:
    """Withdraw this process's live gauges at a graceful exit (a killed one is noticed by the
    next scrape instead)."""
    path = multiprocess_dir()
    if path is not None:
        with contextlib.suppress(OSError):
            prometheus_multiprocess.mark_process_dead(os.getpid(), str(path))  # type: ignore[no-untyped-call]
