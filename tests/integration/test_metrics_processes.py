"""/metrics of real processes: `serve --workers 2` sums what both workers count (prometheus-client's
multiprocess mode), forgets a killed worker's gauges, cleans its folder; JSON logs on stderr;
`memory-service worker --metrics-port`."""

from __future__ import annotations

import asyncio
import json
import signal
import tempfile
from pathlib import Path

import asyncpg
import httpx
import psutil
import pytest
from prometheus_client.multiprocess import MultiProcessCollector

from tests.fakellm import FakeLLM
from tests.integration.conftest import Launch, eventually
from tests.integration.scrapes import Scrape
from tests.integration.servers import ServerProcess, WorkerProcess, free_port

pytestmark = pytest.mark.slow

CONTEXT = "/conversations/{conversation_id}/context"
SLOTS = 3


def service_env(database_url: str, llm: FakeLLM, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": llm.base_url,
        "MEMORY_SUMMARIZER": "openai",
        "MEMORY_LLM_MAX_RETRIES": "0",
        "MEMORY_MAX_CONCURRENT_SUMMARIES": str(SLOTS),
        "DATABASE_POOL_SIZE": "3",
        "DATABASE_MAX_OVERFLOW": "5",
        "DATABASE_READ_POOL_SIZE": "2",
        **extra,
    }


async def scrape(url: str) -> Scrape:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:  # a new connection each time
        response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    return Scrape(response.text)


async def post_rounds(url: str, cid: str, count: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        for n in range(count):
            response = await client.post(
                f"/conversations/{cid}/messages",
                json={
                    "messages": [
                        {"role": "user", "content": f"Q{n}"},
                        {"role": "assistant", "content": f"A{n}"},
                    ]
                },
                headers={"X-Request-ID": f"{cid}-round-{n}"},
            )
            assert response.status_code == 201, response.text


def context_counts_by_process(folder: Path) -> dict[int, float]:
    """Each worker's own count of GET context requests, from its own file."""
    counts = {}
    for file in folder.glob("histogram_*.db"):
        total = 0.0
        for metric in MultiProcessCollector.merge([str(file)]):  # type: ignore[no-untyped-call]
            for sample in metric.samples:
                if (
                    sample.name == "memory_http_request_duration_seconds_count"
                    and sample.labels.get("route") == CONTEXT
                ):
                    total += sample.value
        counts[int(file.stem.rsplit("_", 1)[1])] = total
    return counts


def metrics_folders(server: ServerProcess) -> list[Path]:
    """The folders `serve` made for its workers' metrics (named after its pid)."""
    return list(Path(tempfile.gettempdir()).glob(f"memory-service-metrics-{server.process.pid}-*"))


def workers_of(server: ServerProcess) -> list[psutil.Process]:
    """uvicorn's worker processes (spawned: `... multiprocessing.spawn ... spawn_main`)."""
    found = []
    for child in psutil.Process(server.process.pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:  # ended meanwhile
            pass
    return found


async def test_two_workers_count_into_one_scrape(
    database_url: str, llm: FakeLLM, tmp_path: Path, db: asyncpg.Connection
) -> None:
    folder = tmp_path / "prometheus"
    folder.mkdir()
    (folder / "counter_999999.db").write_bytes(b"left by an earlier run")
    env = service_env(database_url, llm, PROMETHEUS_MULTIPROC_DIR=str(folder), LOG_FORMAT="json")
    server = ServerProcess(env, tmp_path / "serve.log", args=["--workers", "2"]).wait_ready()
    try:
        assert not (folder / "counter_999999.db").exists()  # emptied at start
        await post_rounds(server.url, "multi", 3)
        # Requests until both workers have served some (the kernel picks who accepts).
        sent = 0
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as probe:
            for _ in range(20):
                clients = [httpx.AsyncClient(base_url=server.url, timeout=10) for _ in range(30)]
                responses = await asyncio.gather(*(c.get("/conversations/multi/context") for c in clients))
                await asyncio.gather(*(c.aclose() for c in clients))
                assert all(r.status_code == 200 for r in responses)
                sent += len(responses)
                per_process = context_counts_by_process(folder)
                if len([c for c in per_process.values() if c > 0]) == 2:
                    break
            else:
                raise AssertionError(f"one worker served every request: {per_process}")
            assert (await probe.get("/healthz")).status_code == 200
        assert sum(per_process.values()) == sent
        assert len(workers_of(server)) == 2

        # Whichever worker answers the scrape, it counts both workers' requests and summaries.
        async def summarized() -> bool:
            done = await scrape(server.url)
            return done.value("memory_summaries_completed_total", policy="sliding_window") == 1

        await eventually(summarized, what="the summary in the scrape")
        for _ in range(6):
            now = await scrape(server.url)
            requests = now.value(
                "memory_http_request_duration_seconds_count", method="GET", route=CONTEXT, status="200"
            )
            assert requests == sent
            assert now.value("memory_summaries_started_total", policy="sliding_window") == 1
            assert now.value("memory_summary_lag_seconds_count", policy="sliding_window") == 3
            # Gauges of each process, summed over both.
            assert now.value("memory_runner_slots") == 2 * SLOTS
            assert now.value("memory_db_pool_max", pool="read") == 2 * 2
            assert now.value("memory_db_pool_max", pool="engine") == 2 * (3 + 5)
            assert now.value("memory_llm_circuit_state") == 0
    finally:
        server.stop()

    # LOG_FORMAT=json: every line on stderr is one JSON object, uvicorn's included.
    log = await asyncio.to_thread((tmp_path / "serve.log").read_text)
    lines = [json.loads(line) for line in log.splitlines() if line.strip()]
    assert any(line["logger"].startswith("uvicorn") for line in lines)
    [summary] = [line for line in lines if line["message"].startswith("Summarized messages 0-5 for multi")]
    assert summary["conversation_id"] == "multi" and summary["memory_id"] == 1
    # The round that made it due came to one worker; the other may have claimed it.
    assert summary["request_id"] in ("multi-round-2", None)
    assert {line["level"] for line in lines} <= {"DEBUG", "INFO", "WARNING"}


async def test_serve_makes_a_folder_for_its_workers_and_forgets_a_killed_one(
    database_url: str, llm: FakeLLM, tmp_path: Path
) -> None:
    server = ServerProcess(service_env(database_url, llm), tmp_path / "serve.log", args=["--workers", "2"])
    try:
        server.wait_ready()
        [folder] = metrics_folders(server)

        async def two_workers() -> bool:
            return (await scrape(server.url)).value("memory_runner_slots") == 2 * SLOTS

        await eventually(two_workers, what="both workers to be up")  # ready is one of them

        # kill -9 a worker: uvicorn starts another; the dead one's gauges are not counted.
        [first, _] = workers_of(server)
        first.send_signal(signal.SIGKILL)

        async def replaced() -> bool:
            workers = workers_of(server)
            return len(workers) == 2 and first.pid not in [w.pid for w in workers]

        await eventually(replaced, within=30, what="uvicorn to replace the killed worker")
        # Not 3 x SLOTS: the dead worker's gauges are dropped.
        await eventually(two_workers, what="the scrape to count the two live workers")
        assert (await scrape(server.url)).value("memory_runner_slots") == 2 * SLOTS
    finally:
        server.stop()
    assert not folder.exists()  # removed when serve exits


async def test_a_worker_serves_its_metrics_on_its_own_port(
    launch: Launch, llm: FakeLLM, database_url: str, tmp_path: Path, db: asyncpg.Connection
) -> None:
    api = launch(MEMORY_RUN_SUMMARIES="false", MEMORY_METRICS_REFRESH_SECONDS="0.2")
    port = free_port()
    worker = WorkerProcess(
        service_env(database_url, llm), tmp_path / "worker.log", args=["--metrics-port", str(port)]
    )
    try:
        worker.wait_ready()
        assert f"Serving metrics on http://127.0.0.1:{port}/metrics" in worker.log_text()
        await post_rounds(api.url, "worked", 3)
        worker_url = f"http://127.0.0.1:{port}"

        async def summarized() -> bool:
            done = await scrape(worker_url)
            return done.value("memory_summaries_completed_total", policy="sliding_window") == 1

        await eventually(summarized, what="the worker's metrics to show its summary")
        scraped = await scrape(worker_url)
        assert scraped.value("memory_runner_slots") == SLOTS
        assert scraped.value("memory_llm_calls_total", outcome="ok") == 1
        # The API replica runs none, and reads the same work from the database.
        replica = await scrape(api.url)
        assert replica.value("memory_runner_slots") == 0
        assert replica.value("memory_summaries_completed_total", policy="sliding_window") == 0

        async def failed_row_seen() -> bool:
            return (await scrape(api.url)).value("memory_work_failed") == 1

        await db.execute("UPDATE memory SET status = 'failed', error = 'x'")
        await eventually(failed_row_seen, what="the replica's reading of the failed row")
    finally:
        worker.stop()
