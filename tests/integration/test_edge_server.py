"""The HTTP edge at the socket level, against `memory-service serve` as a real process: slow-loris
heads, oversized heads, idle keep-alive, the connection limit, memory under a 30 MB body and the
same edge under --workers; and a JSON 500 that keeps its connection, with uvicorn run as `serve`
runs it but in a thread, so that the test can break a part of the app."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import orjson
import psutil
import pytest
import uvicorn
from fastapi import FastAPI

from app.cli import uvicorn_options
from app.main import create_app
from app.settings import Settings
from tests.integration.servers import ServerProcess, free_port

pytestmark = pytest.mark.slow

Serve = Callable[..., ServerProcess]
MB = 1024 * 1024


@pytest.fixture
def serve(database_url: str, tmp_path: Path) -> Iterator[Serve]:
    """Start `memory-service serve [args]` with environment overrides; stopped at the end."""
    servers: list[ServerProcess] = []

    def start(*args: str, **env: str) -> ServerProcess:
        values = {"DATABASE_URL": database_url, "MEMORY_SUMMARIZER": "offline", "LOG_LEVEL": "INFO", **env}
        server = ServerProcess(values, tmp_path / f"edge-{len(servers)}.log", args)
        servers.append(server)
        return server.wait_ready()

    yield start
    for server in servers:
        server.stop()


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def connect(server: ServerProcess) -> Connection:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def read_response(
    reader: asyncio.StreamReader, within: float = 10
) -> tuple[int, dict[str, str], bytes]:
    async with asyncio.timeout(within):
        return await _read_response(reader)


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") != "chunked":
        body = await reader.read()  # delimited by the end of the connection
    else:
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")
    return int(status_line.split()[1]), headers, body


async def until_closed(reader: asyncio.StreamReader, within: float) -> bytes:
    """Everything the server sends until it closes the connection (fails after ``within`` s)."""
    data = b""
    async with asyncio.timeout(within):
        while True:
            try:
                chunk = await reader.read(65536)
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk


def get(path: str, *headers: str) -> bytes:
    return "\r\n".join([f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]).encode()


PARTIAL_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


# The default (auto) is httptools when it is installed, as it is with uvicorn[standard].
HTTP = pytest.mark.parametrize("http", ["auto", "h11"])


def http_args(http: str) -> tuple[str, ...]:
    return () if http == "auto" else ("--http", http)


@HTTP
async def test_slow_loris_connections_are_closed_at_the_header_timeout(serve: Serve, http: str) -> None:
    header_timeout, margin, count = 2.0, 3.0, 200
    server = serve(*http_args(http), MEMORY_HEADER_TIMEOUT_SECONDS=str(header_timeout))
    loop = asyncio.get_running_loop()
    lifetimes: list[float] = []
    still_open = 0
    answered_408 = 0
    done = asyncio.Event()

    async def slow_client() -> None:
        """Sends a request head one byte every 0.25 s, never finishing it."""
        nonlocal still_open, answered_408
        opened = loop.time()
        reader, writer = await connect(server)
        received = b""
        try:
            writer.write(PARTIAL_HEAD)
            while loop.time() - opened < header_timeout + margin:
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), timeout=0.25)
                except TimeoutError:
                    writer.write(b"a")
                    await writer.drain()
                    continue
                if not chunk:
                    break
                received += chunk
            else:
                still_open += 1
                return
        except (ConnectionResetError, BrokenPipeError):
            pass
        finally:
            writer.close()
        lifetimes.append(loop.time() - opened)
        answered_408 += received.startswith(b"HTTP/1.1 408")

    latencies: list[float] = []

    async def prober() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
            while not done.is_set():
                started = loop.time()
                response = await client.get("/healthz")
                assert response.status_code == 200
                latencies.append(loop.time() - started)
                with contextlib.suppress(TimeoutError):  # probe every 50 ms until the end
                    await asyncio.wait_for(done.wait(), timeout=0.05)

    probe = asyncio.create_task(prober())
    await asyncio.gather(*(slow_client() for _ in range(count)))
    done.set()
    await probe

    print(
        f"\n[{http}] slow-loris: {len(lifetimes)}/{count} connections closed by the server "
        f"(header timeout {header_timeout}s), after {min(lifetimes, default=0):.2f}-"
        f"{max(lifetimes, default=0):.2f}s (median {statistics.median(lifetimes or [0]):.2f}s), "
        f"{answered_408} with a 408; {still_open} still open after {header_timeout + margin}s. "
        f"/healthz answered {len(latencies)} times meanwhile, slowest {max(latencies) * 1000:.0f} ms."
    )
    assert still_open == 0
    assert len(lifetimes) == count
    assert max(lifetimes) <= header_timeout + margin
    assert latencies, "no health check got through"


@HTTP
async def test_an_incomplete_head_gets_a_408_and_a_silent_connection_is_closed(
    serve: Serve, http: str
) -> None:
    server = serve(*http_args(http), MEMORY_HEADER_TIMEOUT_SECONDS="1")
    silent_reader, silent_writer = await connect(server)
    partial_reader, partial_writer = await connect(server)
    partial_writer.write(PARTIAL_HEAD)
    # A keep-alive connection whose second request head stalls gets the same treatment.
    again_reader, again_writer = await connect(server)
    again_writer.write(get("/healthz"))
    status, _, _ = await read_response(again_reader)
    assert status == 200
    again_writer.write(b"GET /healthz HTTP/1.1\r\n")

    assert await until_closed(silent_reader, within=5) == b""
    for reader in (partial_reader, again_reader):
        status, headers, body = await read_response(reader)
        assert status == 408 and headers["connection"] == "close"
        assert orjson.loads(body) == {
            "detail": "request head not received within 1s (MEMORY_HEADER_TIMEOUT_SECONDS)",
            "code": "request_timeout",
        }
        assert await until_closed(reader, within=5) == b""
    for writer in (silent_writer, partial_writer, again_writer):
        writer.close()


@HTTP
async def test_an_oversized_head_is_rejected_at_once(serve: Serve, http: str) -> None:
    server = serve(*http_args(http), MEMORY_HEADER_TIMEOUT_SECONDS="60")
    reader, writer = await connect(server)
    started = time.monotonic()
    writer.write(PARTIAL_HEAD + b"a" * (256 * 1024))  # never finished: only the size can stop it
    status, headers, body = await read_response(reader)
    assert status == 431 and headers["connection"] == "close"
    assert orjson.loads(body) == {
        "detail": "request head larger than 16384 bytes",
        "code": "header_too_large",
    }
    assert await until_closed(reader, within=10) == b""
    print(f"\n[{http}] 256 KiB head rejected with {status} after {time.monotonic() - started:.3f}s")
    writer.close()
    async with httpx.AsyncClient(base_url=server.url) as client:
        response = await client.get("/healthz", headers={"X-Fine": "a" * 8000})
        assert response.status_code == 200


async def test_idle_keep_alive_and_the_connection_limit(serve: Serve) -> None:
    server = serve(MEMORY_KEEPALIVE_TIMEOUT_SECONDS="0.5", MEMORY_MAX_CONNECTIONS="10")
    reader, writer = await connect(server)
    writer.write(get("/healthz"))
    status, headers, _ = await read_response(reader)
    assert status == 200 and "connection" not in headers
    started = time.monotonic()
    assert await until_closed(reader, within=3) == b""  # uvicorn's default would be 5s
    print(f"\nidle keep-alive connection closed after {time.monotonic() - started:.2f}s")
    writer.close()

    idle = [await connect(server) for _ in range(10)]
    reader, writer = await connect(server)
    writer.write(get("/healthz"))
    status, _, _ = await read_response(reader)
    assert status == 503
    for _, idle_writer in idle:
        idle_writer.close()
    writer.close()


def peak_rss_since_reset(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def reset_peak_rss(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def test_a_30_mb_body_gets_its_413_without_the_memory(serve: Serve) -> None:
    server = serve()
    pid = server.process.pid
    content = orjson.dumps({"messages": [{"role": "user", "content": "x" * (30 * MB)}]})

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(content), 64 * 1024):
            yield content[start : start + 64 * 1024]

    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        warm = await client.post(
            "/conversations/warm/messages", content=b"{}", headers={"Content-Type": "application/json"}
        )
        assert warm.status_code == 422
        for kind, body in (("Content-Length", content), ("chunked", chunks())):
            before = psutil.Process(pid).memory_info().rss
            reset_peak_rss(pid)
            started = time.monotonic()
            response = await client.post(
                "/conversations/big/messages", content=body, headers={"Content-Type": "application/json"}
            )
            elapsed = time.monotonic() - started
            growth = peak_rss_since_reset(pid) - before
            print(
                f"\n30 MB body ({kind}): {response.status_code} in {elapsed:.2f}s; server RSS "
                f"{before / MB:.1f} MB before, peak growth {growth / MB:.2f} MB"
            )
            assert response.status_code == 413
            assert response.json()["code"] == "payload_too_large"
            assert growth < 8 * MB
        # The connection that carried both is still good for the next request.
        assert (await client.get("/healthz")).status_code == 200


@contextlib.contextmanager
def uvicorn_thread(app: FastAPI, settings: Settings) -> Iterator[int]:
    """``app`` served by uvicorn with the options `serve` uses, in a thread of this process (so
    that the test can give the app a broken part); yields the port."""
    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), **uvicorn_options(settings))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        thread.join(0.02)
    try:
        yield config.port
    finally:
        server.should_exit = True
        thread.join(30)


async def test_an_unexpected_error_is_a_json_500_and_the_connection_stays_open(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(_env_file=None, DATABASE_URL=database_url, MEMORY_SUMMARIZER="offline")
    app = create_app(settings)

    async def broken() -> None:
        raise KeyError("a component nobody expected to fail")

    app.add_api_route("/broken", broken, methods=["GET"])
    with uvicorn_thread(app, settings) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(get("/broken", "X-Request-ID: edge-500-check"))
        status, headers, body = await read_response(reader)
        assert status == 500, body
        assert headers["content-type"] == "application/json"
        assert headers["x-request-id"] == "edge-500-check"
        assert orjson.loads(body) == {
            "detail": "internal error",
            "code": "internal_error",
            "request_id": "edge-500-check",
        }
        assert "connection" not in headers  # uvicorn's own 500 says "connection: close"
        # The same connection answers the next request.
        writer.write(get("/healthz"))
        status, headers, _ = await read_response(reader)
        assert status == 200 and headers["x-request-id"] != "edge-500-check"
        writer.close()
    [logged] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "request_id=edge-500-check" in logged and "Traceback" in logged and "KeyError" in logged


async def test_serve_with_workers_applies_the_same_edge(serve: Serve) -> None:
    server = serve("--workers", "2", MEMORY_HEADER_TIMEOUT_SECONDS="1", MEMORY_MAX_BODY_BYTES="4096")
    reader, writer = await connect(server)
    writer.write(PARTIAL_HEAD)
    status, _, _ = await read_response(reader)
    assert status == 408
    assert await until_closed(reader, within=5) == b""
    writer.close()
    async with httpx.AsyncClient(base_url=server.url) as client:
        response = await client.post("/conversations/w/messages", content=b"x" * 5000)
        assert response.status_code == 413 and "4096" in response.json()["detail"]
        assert (await client.get("/healthz")).headers["x-request-id"]


@HTTP
async def test_an_upgrade_request_is_served_as_http(serve: Serve, http: str) -> None:
    """uvicorn answered a WebSocket upgrade on a plain route with a bare 403 (no route is a
    WebSocket); `serve` serves it as HTTP, without uvicorn's advice to install a library."""
    server = serve(*http_args(http))
    reader, writer = await connect(server)
    writer.write(get("/healthz", "Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13"))
    status, _, body = await read_response(reader)
    assert (status, orjson.loads(body)) == (200, {"status": "ok"})
    writer.close()
    log = server.log_text()
    assert "WebSocket library" not in log and "Unsupported upgrade" not in log
