"""`memory-service worker`: a process that only runs summaries (no HTTP).

It claims due work from the database like any replica with MEMORY_RUN_SUMMARIES on, so API
replicas can run with it off and never spend request time on summaries; add workers to scale
summaries. SIGTERM or SIGINT stops claiming, lets running summaries finish for up to
MEMORY_SHUTDOWN_GRACE_SECONDS, and gives the rest back to the queue.

With ``--metrics-port`` it serves /metrics (app.metrics) with prometheus-client's own HTTP
server, in a thread: no API keys there, so bind it to an address only Prometheus reaches.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from app.runtime import running_service
from app.settings import Settings

logger = logging.getLogger("app")


async def run_worker(
    settings: Settings, *, drain: bool = False, metrics_address: tuple[str, int] | None = None
) -> None:
    """Run summaries until stopped by a signal; with ``drain``, until no work is due. With
    ``metrics_address`` (host, port), serve /metrics there."""
    async with running_service(settings, run_summaries=True) as service:
        if metrics_address is not None:
            serve_metrics(*metrics_address)
        if drain:
            await service.drain()
            logger.info("No summary work is due; stopping")
            return
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        logger.info("Worker running; stop it with SIGTERM or Ctrl-C")
        await stop.wait()
        logger.info("Stopping: no new claims; letting running summaries finish")


def serve_metrics(host: str, port: int) -> None:
    """prometheus-client's HTTP server (a daemon thread) answering /metrics; the sampling loop
    of app.runtime keeps this process's gauges current."""
    from prometheus_client import start_http_server

    from app import metrics

    start_http_server(port, addr=host, registry=metrics.scrape_registry())
    logger.info("Serving metrics on http://%s:%d/metrics", host, port)
