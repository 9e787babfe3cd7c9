"""Load generator, run as its own process: ``python -m bench.loadgen < spec.json > result.json``.

It speaks HTTP/1.1 over raw keep-alive TCP connections on uvloop (a few tens of microseconds of
client CPU per request, so the client is not what gets measured), and times each request from
the moment it is due to the moment its whole response body has been read.

Workloads (``spec["kind"]``):

- ``get``: closed loop. ``concurrency`` connections each send the next of ``paths`` as soon as
  the previous answer is in, for ``warmup_seconds`` (not recorded) then ``duration_seconds``.
- ``post``: open loop at a fixed ``rate``: request i is due at start + i / rate, whatever the
  server did before. A request that cannot be sent on time because every connection is still
  busy is timed from when it was due, so a stalled server shows up as latency rather than as
  fewer requests (no coordinated omission).
- ``mixed``: ``clients`` closed-loop clients, each owning a slice of ``conversations``; for
  ``rounds`` rounds every client does, for each of its conversations, GET context then POST a
  round.
- ``append``: closed loop of POSTs only. ``concurrency`` connections, spread over ``base_urls``
  (connection i to ``base_urls[i % n]``: several replicas behind a round-robin balancer), each
  owning a slice of ``conversations`` (so no two connections write to one conversation at once)
  and posting a round to each in turn, for ``warmup_seconds`` (not recorded) then
  ``duration_seconds``.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from bench.stats import summarize_ms
from bench.textgen import rng_for, round_messages


class HttpConnection:
    """One keep-alive HTTP/1.1 connection; reconnects lazily after an error or a close."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._host_header = f"Host: {host}:{port}\r\n".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader, self._writer = reader, writer
        return reader, writer

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        if self._reader is None or self._writer is None:
            reader, writer = await self._connect()
        else:
            reader, writer = self._reader, self._writer
        head = method.encode() + b" " + path.encode() + b" HTTP/1.1\r\n" + self._host_header
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
        head += b"\r\n"
        try:
            writer.write(head if body is None else head + body)
            if body is not None and len(body) > 65536:
                await writer.drain()
            raw = await reader.readuntil(b"\r\n\r\n")
            status = int(raw[9:12])
            lower = raw.lower()
            close = b"\r\nconnection: close" in lower
            at = lower.find(b"\r\ncontent-length:")
            if at >= 0:
                end = lower.index(b"\r\n", at + 2)
                payload = await reader.readexactly(int(raw[at + 17 : end]))
            elif b"\r\ntransfer-encoding: chunked" in lower:
                payload = await _read_chunked(reader)
            else:
                payload = await reader.read()
                close = True
        except BaseException:
            self.close()
            raise
        if close:
            self.close()
        return status, payload

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        line = await reader.readuntil(b"\r\n")
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


@dataclass
class Recorder:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)

    def ok(self, kind: str, seconds: float) -> None:
        self.latencies.setdefault(kind, []).append(seconds)

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if len(self.error_samples) < 10:
            self.error_samples.append(f"{kind}: {detail}")

    def result(self) -> dict[str, Any]:
        return {
            "latency_ms": {kind: summarize_ms(values) for kind, values in self.latencies.items()},
            "errors": sum(self.errors.values()),
            "errors_by_kind": self.errors,
            "error_samples": self.error_samples,
        }


async def _call(
    conn: HttpConnection, method: str, path: str, body: bytes | None, expect: int
) -> tuple[bool, str]:
    try:
        status, payload = await conn.request(method, path, body)
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if status != expect:
        return False, f"HTTP {status}: {payload[:200]!r}"
    return True, ""


def _host_port(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    assert parts.hostname is not None and parts.port is not None, base_url
    return parts.hostname, parts.port


async def run_get(spec: dict[str, Any]) -> dict[str, Any]:
    host, port = _host_port(spec["base_url"])
    paths: list[str] = spec["paths"]
    warmup = float(spec["warmup_seconds"])
    duration = float(spec["duration_seconds"])
    rec = Recorder()
    begin = time.perf_counter()
    measure_from = begin + warmup
    stop_at = measure_from + duration

    async def worker(number: int) -> None:
        conn = HttpConnection(host, port)
        index = number
        try:
            while (started := time.perf_counter()) < stop_at:
                path = paths[index % len(paths)]
                index += 1
                ok, detail = await _call(conn, "GET", path, None, 200)
                ended = time.perf_counter()
                if not ok:
                    rec.error("get", detail)
                elif started >= measure_from and ended <= stop_at:
                    rec.ok("get", ended - started)
        finally:
            conn.close()

    await asyncio.gather(*(worker(n) for n in range(int(spec["concurrency"]))))
    result = rec.result()
    done = result["latency_ms"].get("get", {"count": 0})["count"]
    result.update(kind="get", requests=done, seconds=duration, throughput_rps=round(done / duration, 1))
    return result


async def run_post(spec: dict[str, Any]) -> dict[str, Any]:
    host, port = _host_port(spec["base_url"])
    conversations: list[str] = spec["conversations"]
    rate = float(spec["rate"])
    warmup = float(spec["warmup_seconds"])
    duration = float(spec["duration_seconds"])
    total = int(rate * (warmup + duration))
    requests = [
        (
            f"/conversations/{conversations[i % len(conversations)]}/messages",
            orjson.dumps(
                {
                    "messages": round_messages(
                        rng_for(spec["seed"], conversations[i % len(conversations)], i // len(conversations))
                    )
                }
            ),
        )
        for i in range(total)
    ]
    rec = Recorder()
    start = time.perf_counter() + 0.05
    measure_from = start + warmup
    next_index = 0
    behind = 0

    async def worker() -> None:
        nonlocal next_index, behind
        conn = HttpConnection(host, port)
        try:
            while next_index < total:
                index = next_index
                next_index += 1
                due = start + index / rate
                free_at = time.perf_counter()
                if free_at < due:
                    await asyncio.sleep(due - free_at)
                sent = time.perf_counter()
                path, body = requests[index]
                ok, detail = await _call(conn, "POST", path, body, 201)
                ended = time.perf_counter()
                if not ok:
                    rec.error("post", detail)
                elif due >= measure_from:
                    # On time: time from the send (the timer's own slack is not the server's).
                    # Late because every connection was busy: time from when it was due.
                    if free_at >= due:
                        behind += 1
                        rec.ok("post", ended - due)
                    else:
                        rec.ok("post", ended - sent)
        finally:
            conn.close()

    await asyncio.gather(*(worker() for _ in range(int(spec["concurrency"]))))
    elapsed = time.perf_counter() - measure_from
    result = rec.result()
    done = result["latency_ms"].get("post", {"count": 0})["count"]
    result.update(
        kind="post",
        requests=done,
        offered_rps=rate,
        seconds=round(elapsed, 3),
        throughput_rps=round(done / elapsed, 1) if elapsed > 0 else None,
        sent_late=behind,
    )
    return result


async def run_mixed(spec: dict[str, Any]) -> dict[str, Any]:
    host, port = _host_port(spec["base_url"])
    conversations: list[str] = spec["conversations"]
    clients = int(spec["clients"])
    rounds = int(spec["rounds"])
    slices = [conversations[c::clients] for c in range(clients)]
    bodies = {
        (cid, r): orjson.dumps({"messages": round_messages(rng_for(spec["seed"], cid, r))})
        for cid in conversations
        for r in range(rounds)
    }
    rec = Recorder()

    async def client(number: int) -> None:
        conn = HttpConnection(host, port)
        try:
            for r in range(rounds):
                for cid in slices[number]:
                    t0 = time.perf_counter()
                    ok, detail = await _call(conn, "GET", f"/conversations/{cid}/context", None, 200)
                    t1 = time.perf_counter()
                    if ok:
                        rec.ok("get_context", t1 - t0)
                    else:
                        rec.error("get_context", detail)
                    ok2, detail = await _call(
                        conn, "POST", f"/conversations/{cid}/messages", bodies[(cid, r)], 201
                    )
                    t2 = time.perf_counter()
                    if ok2:
                        rec.ok("post_round", t2 - t1)
                    else:
                        rec.error("post_round", detail)
                    if ok and ok2:
                        rec.ok("round", t2 - t0)
        finally:
            conn.close()

    began = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(clients)))
    elapsed = time.perf_counter() - began
    result = rec.result()
    requests = sum(result["latency_ms"].get(k, {"count": 0})["count"] for k in ("get_context", "post_round"))
    result.update(
        kind="mixed",
        seconds=round(elapsed, 3),
        requests=requests,
        rounds=result["latency_ms"].get("round", {"count": 0})["count"],
        throughput_rps=round(requests / elapsed, 1),
        rounds_per_second=round(result["latency_ms"].get("round", {"count": 0})["count"] / elapsed, 1),
    )
    return result


async def run_append(spec: dict[str, Any]) -> dict[str, Any]:
    targets = [_host_port(url) for url in spec.get("base_urls") or [spec["base_url"]]]
    conversations: list[str] = spec["conversations"]
    concurrency = int(spec["concurrency"])
    warmup = float(spec["warmup_seconds"])
    duration = float(spec["duration_seconds"])
    # A fixed pool of round bodies, cycled: what is posted does not change what a POST costs.
    bodies = [orjson.dumps({"messages": round_messages(rng_for(spec["seed"], i))}) for i in range(256)]
    slices = [conversations[c::concurrency] for c in range(concurrency)]
    rec = Recorder()
    begin = time.perf_counter()
    measure_from = begin + warmup
    stop_at = measure_from + duration
    per_target = [0] * len(targets)

    async def worker(number: int) -> None:
        host, port = targets[number % len(targets)]
        conn = HttpConnection(host, port)
        mine = slices[number] or [conversations[number % len(conversations)]]
        index = 0
        try:
            while (started := time.perf_counter()) < stop_at:
                cid = mine[index % len(mine)]
                body = bodies[(number * 31 + index) % len(bodies)]
                index += 1
                ok, detail = await _call(conn, "POST", f"/conversations/{cid}/messages", body, 201)
                ended = time.perf_counter()
                if not ok:
                    rec.error("post", detail)
                elif started >= measure_from and ended <= stop_at:
                    rec.ok("post", ended - started)
                    per_target[number % len(targets)] += 1
        finally:
            conn.close()

    await asyncio.gather(*(worker(n) for n in range(concurrency)))
    result = rec.result()
    done = result["latency_ms"].get("post", {"count": 0})["count"]
    result.update(
        kind="append",
        requests=done,
        seconds=duration,
        throughput_rps=round(done / duration, 1),
        requests_per_target=per_target,
    )
    return result


WORKLOADS: dict[str, Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]]] = {
    "get": run_get,
    "post": run_post,
    "mixed": run_mixed,
    "append": run_append,
}


def main() -> None:
    spec = orjson.loads(sys.stdin.buffer.read())
    workload = WORKLOADS[spec["kind"]]
    cpu_before = time.process_time()
    result: dict[str, Any]
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        result = asyncio.run(workload(spec))
        result["event_loop"] = "asyncio"
    else:
        result = uvloop.run(workload(spec))
        result["event_loop"] = "uvloop"
    result["loadgen"] = "python"
    result["loadgen_cpu_seconds"] = round(time.process_time() - cpu_before, 3)
    sys.stdout.buffer.write(orjson.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
