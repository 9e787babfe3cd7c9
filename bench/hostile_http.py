"""The hostile suite's HTTP side: a raw HTTP/1.1 client that sends exactly the bytes it is given
(chunked bodies, junk methods, huge heads, bodies that keep coming after the answer), and the
route book that maps a request to the OpenAPI operation the service documents for it."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from app.api.docs import DOCS_PATHS, OPENAPI_PATH

# Statuses the edge (app/edge.py, uvicorn) may answer for any request, documented in the README:
# unparseable, no key, unknown path, wrong method, head timeout, body too large, head too large,
# unavailable. Nothing else is acceptable unless the operation documents it.
EDGE_STATUSES = frozenset({400, 401, 404, 405, 408, 413, 431, 503})
# The docs pages, their files and the schema (app.api.docs): not operations of the OpenAPI document.
# The schema is Starlette's own route, which answers HEAD too.
DOCS_ROUTES = {("GET", path) for path in DOCS_PATHS} | {("HEAD", OPENAPI_PATH)}
# Larger response bodies are read and counted, but only this much of them is kept.
KEEP_BYTES = 16 * 1024 * 1024
MAX_HEAD_READ = 1024 * 1024


@dataclass
class Reply:
    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: str | None = None
    elapsed: float = 0.0
    # The server closed the connection after the answer (or without one).
    closed: bool = False
    body_bytes: int = 0  # the whole body's size (``body`` keeps at most KEEP_BYTES of it)
    replica: int = -1  # which replica answered (set by the caller)


class ResponseError(Exception):
    pass


async def _read_counted(reader: asyncio.StreamReader, size: int | None) -> tuple[bytes, int]:
    """``size`` bytes (None: until the server closes), keeping at most KEEP_BYTES of them."""
    kept: list[bytes] = []
    kept_size = total = 0
    while size is None or total < size:
        want = 1024 * 1024 if size is None else min(1024 * 1024, size - total)
        piece = await reader.read(want)
        if not piece:
            if size is None:
                break
            raise asyncio.IncompleteReadError(b"".join(kept), size)
        total += len(piece)
        if kept_size < KEEP_BYTES:
            kept.append(piece[: KEEP_BYTES - kept_size])
            kept_size += len(kept[-1])
    return b"".join(kept), total


async def read_response(reader: asyncio.StreamReader, method: str) -> tuple[int, dict[str, str], bytes, int]:
    """One HTTP/1.x response: status, headers (lower-case names, last one wins), the body (at
    most KEEP_BYTES of it) and the body's whole size."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ResponseError(f"bad status line {lines[0][:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            continue  # 100 Continue and friends: the real answer follows
        break
    if method == "HEAD" or status in (204, 304):
        return status, headers, b"", 0
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        kept = total = 0
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                # trailers until an empty line
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                break
            data, n = await _read_counted(reader, size)
            total += n
            if kept < KEEP_BYTES:
                chunks.append(data[: KEEP_BYTES - kept])
                kept += len(chunks[-1])
            await reader.readexactly(2)
        return status, headers, b"".join(chunks), total
    length = headers.get("content-length")
    if length is not None and length.isdigit():
        body, total = await _read_counted(reader, int(length))
        return status, headers, body, total
    body, total = await _read_counted(reader, None)
    return status, headers, body, total


def build_head(method: str, target: str, host: str, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", errors="replace")


def chunked(body: bytes, chunk_size: int = 64 * 1024) -> list[bytes]:
    """``body`` in Transfer-Encoding: chunked framing, terminator included."""
    out = [
        b"%x\r\n%s\r\n" % (len(body[i : i + chunk_size]), body[i : i + chunk_size])
        for i in range(0, len(body), chunk_size)
    ]
    out.append(b"0\r\n\r\n")
    return out


async def _open(host: str, port: int, within: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=MAX_HEAD_READ), within)
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return reader, writer


async def _write_all(writer: asyncio.StreamWriter, pieces: Iterable[bytes]) -> None:
    for piece in pieces:
        writer.write(piece)
        await writer.drain()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), 1.0)


async def exchange(
    host: str,
    port: int,
    head: bytes,
    body: Iterable[bytes] = (),
    *,
    method: str = "GET",
    within: float = 30.0,
) -> Reply:
    """One request on a new connection. The body is written while the answer is awaited, so a
    server that answers before reading the body (401, 413) is seen answering, as a hostile client
    would keep sending regardless. The connection is closed afterwards."""
    started = time.perf_counter()
    try:
        reader, writer = await _open(host, port, within)
    except (OSError, TimeoutError) as exc:
        return Reply(None, error=f"connect: {type(exc).__name__}", elapsed=time.perf_counter() - started)
    sender = asyncio.create_task(_write_all(writer, [head, *body]))
    try:
        status, headers, data, size = await asyncio.wait_for(read_response(reader, method), within)
    except (
        OSError,
        asyncio.IncompleteReadError,
        asyncio.LimitOverrunError,
        ResponseError,
        ValueError,
    ) as exc:
        return Reply(None, error=type(exc).__name__, elapsed=time.perf_counter() - started, closed=True)
    except TimeoutError:
        return Reply(None, error="timeout", elapsed=time.perf_counter() - started)
    finally:
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender
        await _close(writer)
    closed = headers.get("connection", "").lower() == "close"
    return Reply(
        status,
        headers,
        data,
        elapsed=time.perf_counter() - started,
        closed=closed,
        body_bytes=size,
    )


class KeepAlive:
    """One keep-alive connection for well-behaved traffic; reconnects when the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self._writer is not None:
            await _close(self._writer)
        self._reader = self._writer = None

    async def request(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]] = (),
        body: bytes | None = None,
        within: float = 30.0,
    ) -> Reply:
        started = time.perf_counter()
        all_headers = list(headers)
        if body is not None:
            all_headers.append(("Content-Length", str(len(body))))
        head = build_head(method, target, f"{self.host}:{self.port}", all_headers)
        if self._reader is not None and self._reader.at_eof():
            await self.close()
        try:
            if self._reader is None or self._writer is None:
                self._reader, self._writer = await _open(self.host, self.port, within)
            self._writer.write(head + (body or b""))
            await self._writer.drain()
            status, resp_headers, data, size = await asyncio.wait_for(
                read_response(self._reader, method), within
            )
        except (
            OSError,
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ResponseError,
            ValueError,
        ) as exc:
            await self.close()
            return Reply(None, error=type(exc).__name__, elapsed=time.perf_counter() - started)
        closed = resp_headers.get("connection", "").lower() == "close"
        if closed:
            await self.close()
        return Reply(
            status,
            resp_headers,
            data,
            elapsed=time.perf_counter() - started,
            closed=closed,
            body_bytes=size,
        )


# ---- the service's own contract -------------------------------------------------------------


@dataclass
class Route:
    template: str
    pattern: re.Pattern[str]
    params: int
    operations: dict[str, set[str]]  # method -> documented status keys ("201", "4XX", "default")


class RouteBook:
    """Request -> (route key, documented statuses) from the service's /openapi.json."""

    def __init__(self, openapi: dict[str, Any]) -> None:
        self.routes: list[Route] = []
        for template, item in openapi.get("paths", {}).items():
            regex = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
            ops = {
                method.upper(): set(op.get("responses", {}))
                for method, op in item.items()
                if method.lower() in {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
            }
            self.routes.append(Route(template, re.compile(regex), template.count("{"), ops))
        # Literal paths before templated ones (/ops/conversations/failing before {id} ones).
        self.routes.sort(key=lambda r: r.params)

    @staticmethod
    def server_path(target: str) -> str:
        """The path as the server routes it: the request target's path, percent-decoded."""
        if target.startswith(("http://", "https://")):
            target = urlsplit(target).path or "/"
        return unquote(target.split("?", 1)[0], errors="replace")

    def classify(self, method: str, target: str) -> tuple[str, set[str] | None]:
        """The route key ``METHOD template`` (or ``METHOD (unrouted)``) and the statuses the
        operation documents (None: no such operation, only the edge's answers apply)."""
        path = self.server_path(target)
        method = method.upper()
        if (method, path) in DOCS_ROUTES:
            return f"{method} {path}", {"200"}
        for route in self.routes:
            if route.pattern.match(path):
                documented = route.operations.get(method)
                return f"{method if documented is not None else method[:12]} {route.template}", documented
        return f"{method[:12]} (unrouted)", None

    @staticmethod
    def documents(documented: set[str] | None, status: int) -> bool:
        if documented is None:
            return False
        return str(status) in documented or f"{status // 100}XX" in documented or "default" in documented


def acceptable(documented: set[str] | None, status: int) -> bool:
    """Documented by the operation, or one of the edge's documented answers; never a 5xx but 503."""
    if status >= 500 and status != 503:
        return False
    return status in EDGE_STATUSES or RouteBook.documents(documented, status)
