"""python -m bench.hostile: a bounded hostile-client run against two replicas of the service.

Creates a fresh database on the PostgreSQL server (memory_bench_<pid>_<hex>, dropped at the
end), migrates it with `python -m app.cli migrate`, starts a fake OpenAI-compatible LLM
(bench/hostile_llm.py: bench/fake_llm.py plus a conversation whose summaries always fail) and two
replicas with the real command, `python -m app.cli serve`, API keys on for three tenants. Then,
for --seconds (default: 60 at --scale full, 15 at tiny), it drives them from this process
(asyncio, raw HTTP/1.1 sockets, at most --concurrency requests in flight) with well-behaved
traffic and abuse at once:

- tenant A: steady conversations and bursts of hundreds of new conversations; tenants B and C:
  a round every second or so (their summary lag is measured while A bursts);
- abuse: bodies over MEMORY_MAX_BODY_BYTES (Content-Length and chunked), unauthenticated large
  bodies, wrong keys, a million tiny messages in one body, metadata bloat (64 new keys per POST
  until refused), NaN / Infinity / huge integers / lone surrogates / deep nesting, malformed JSON,
  junk paths and methods, trailing slashes, huge and broken heads, cross-tenant access,
  slow-loris connections, idle keep-alive connections, slow bodies, rounds close to the body
  limit, a conversation whose summaries keep failing, and one kill -9 of a replica mid-run
  followed by a restart on the same port.

Every response's status is recorded per route template and checked against the service's own
/openapi.json: it must be documented for the operation, or be one of the edge's documented
answers (400/401/404/405/408/413/431/503); any other 5xx is a failure, and every 503 must carry
Retry-After. Every acknowledged (201) message must be in the messages table exactly once. Peak
RSS of each replica and the summary lag of tenants B and C (from a round's POST to the first
completed summary covering that round) are reported, not judged.

Prints a table, writes JSON to bench/results/hostile-<scale>-<time>.json (logs under
bench/results/logs/hostile-...). Exit status: 0 when every check passed, 1 when one failed,
2 when the suite itself failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import hashlib
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import psutil

from bench import hostile_payloads as hp
from bench.db import DEFAULT_SERVER_URL, create_database, drop_database, new_database_name, redact
from bench.hostile_http import (
    KeepAlive,
    Reply,
    RouteBook,
    acceptable,
    build_head,
    chunked,
    exchange,
    read_response,
)
from bench.procs import Child, ProcessFailed, _prepare_child, child_env, free_port, migrate, wait_healthy
from bench.report import table
from bench.stats import summarize_plain

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS_DIR = ROOT / "bench" / "results"
HOST = "127.0.0.1"
TENANTS = {"a": "tenant-a", "b": "tenant-b", "c": "tenant-c"}
JSON_CT = ("Content-Type", "application/json")
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) (\w+) ")
TOKEN = re.compile(r"tok:[0-9a-f]{16}")


@dataclass(frozen=True)
class Scale:
    name: str
    seconds: float
    concurrency: int
    abuse_workers: int
    steady_conversations: int  # tenant A, well-behaved, closed loop
    quiet_conversations: int  # per tenant B and C
    quiet_interval: float
    burst_conversations: int  # tenant A, per burst
    burst_rounds: int
    bursts: int
    slowloris: int
    idle_connections: int
    slow_bodies: int
    million: int
    heavy_every: float
    heavy_parallel: int
    fat_rounds: int
    drain_seconds: float
    # After the window, alone: bodies that make the service build an error per item
    # (3: 1.4 million empty messages, 4: one message with 260,000 unknown keys).
    amplification: tuple[int, ...]
    amplification_limit_seconds: float


SCALES = {
    "tiny": Scale(
        name="tiny",
        seconds=15.0,
        concurrency=24,
        abuse_workers=6,
        steady_conversations=4,
        quiet_conversations=1,
        quiet_interval=1.0,
        burst_conversations=60,
        burst_rounds=5,
        bursts=1,
        slowloris=60,
        idle_connections=20,
        slow_bodies=3,
        million=1_000_000,
        heavy_every=4.0,
        heavy_parallel=1,
        fat_rounds=2,
        drain_seconds=30.0,
        amplification=(3,),
        amplification_limit_seconds=120.0,
    ),
    "full": Scale(
        name="full",
        seconds=60.0,
        concurrency=50,
        abuse_workers=14,
        steady_conversations=12,
        quiet_conversations=2,
        quiet_interval=1.0,
        burst_conversations=300,
        burst_rounds=6,
        bursts=2,
        slowloris=300,
        idle_connections=100,
        slow_bodies=10,
        million=1_000_000,
        heavy_every=3.0,
        heavy_parallel=2,
        fat_rounds=6,
        drain_seconds=60.0,
        amplification=(3, 4),
        amplification_limit_seconds=180.0,
    ),
}

# The abuse mix (kind -> weight); the heavy kinds (a million messages, near-limit rounds,
# metadata bloat, slow connections) run in their own tasks at their own pace.
MIX = {
    "hostile_json": 4,
    "malformed": 3,
    "wrong_key": 2,
    "junk_path": 3,
    "junk_method": 2,
    "trailing_slash": 1,
    "huge_header": 2,
    "cross_tenant": 2,
    "oversized": 1,
    "unauth_large": 1,
}


@dataclass
class Options:
    scale: Scale
    database_url: str
    results_dir: Path = DEFAULT_RESULTS_DIR
    output: Path | None = None
    keep_database: bool = False
    seed: int = 1
    service_env: dict[str, str] = field(default_factory=dict)


@dataclass
class Incarnation:
    pid: int
    started_at: float
    peak_rss: int = 0
    peak_at: float | None = None
    ended_at: float | None = None
    end: str | None = None
    exit_code: int | None = None


@dataclass
class Replica:
    index: int
    port: int
    log_path: Path
    child: Child | None = None
    incarnations: list[Incarnation] = field(default_factory=list)
    # Answering /readyz since its start, and not killed since: what a health-checking load
    # balancer would route to.
    ready: bool = False

    def alive(self) -> bool:
        return self.child is not None and self.child.alive()

    def up(self) -> bool:
        return self.ready and self.alive()


@dataclass
class Record:
    category: str
    variant: str
    method: str
    target: str
    route: str
    status: int | None
    error: str | None
    replica: int
    sent_at: float
    elapsed: float
    request_id: str | None
    acceptable: bool
    retry_after: bool
    must_refuse: bool
    resp_bytes: int
    body: str | None = None


@dataclass
class Ack:
    sha: str
    token: str | None


@dataclass
class Held:
    """The outcome of one slow-loris, idle or slow-body connection."""

    kind: str
    replica: int
    opened_at: float
    closed_at: float | None
    outcome: str  # "response" | "closed" | "still_open" | "connect_failed" | "error"
    status: int | None = None


def content_sha(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value)).hexdigest()


def _process_rss(pid: int) -> int:
    try:
        proc = psutil.Process(pid)
        total = 0
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total
    except psutil.Error:
        return 0


class Pool:
    """Keep-alive connections to one replica for the well-behaved traffic."""

    def __init__(self, port: int, size: int) -> None:
        self._idle: asyncio.Queue[KeepAlive] = asyncio.Queue()
        self._all = [KeepAlive(HOST, port) for _ in range(size)]
        for conn in self._all:
            self._idle.put_nowait(conn)

    @contextlib.asynccontextmanager
    async def conn(self) -> AsyncIterator[KeepAlive]:
        conn = await self._idle.get()
        try:
            yield conn
        finally:
            self._idle.put_nowait(conn)

    async def close(self) -> None:
        for conn in self._all:
            await conn.close()


class Hostile:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.scale = opts.scale
        self.stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_id = f"hostile-{self.scale.name}-{self.stamp}-{os.getpid()}"
        self.log_dir = opts.results_dir / "logs" / self.run_id
        self.db_name = new_database_name()
        self.db_url = ""
        self.pool: asyncpg.Pool | None = None
        self.llm: Child | None = None
        self.replicas: list[Replica] = []
        self.keys = {t: secrets.token_hex(16) for t in TENANTS}
        self.service_env: dict[str, str] = {}
        self.max_body = 4 * 1024 * 1024
        self.book: RouteBook | None = None
        self.records: list[Record] = []
        self.acked: dict[tuple[str, int], Ack] = {}
        self.ack_conflicts: list[dict[str, Any]] = []
        # B's and C's acknowledged rounds, for their summary lag (measured in the database).
        self.lags: list[dict[str, Any]] = []
        self.burst_windows: list[tuple[float, float]] = []
        self.amplification: list[dict[str, Any]] = []
        self.quiet_rounds: Counter[str] = Counter()
        self.quiet_no_summary: Counter[str] = Counter()
        self.held: list[Held] = []
        self.metadata_cycles: list[dict[str, Any]] = []
        self.fat: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.runner_peaks: dict[int, dict[str, int]] = defaultdict(dict)
        self.loop_lag_max = 0.0
        self.loop_lags: list[tuple[float, float]] = []  # (seconds into the run, how late) when > 50 ms
        self.harness_errors: list[str] = []
        self.ctx = hp.Context(max_body=self.max_body)
        self.rng = random.Random(opts.seed)
        self._rid = 0
        self.sem = asyncio.Semaphore(self.scale.concurrency)
        self.pools: list[Pool] = []
        self.started_at = 0.0  # wall clock when the abuse began
        self.deadline = 0.0  # monotonic
        self.kill_at_wall: float | None = None
        self.killed_replica: int | None = None
        self.bodies: hp.Bodies | None = None

    # ---- processes --------------------------------------------------------------------------

    def _db(self) -> asyncpg.Pool:
        assert self.pool is not None
        return self.pool

    async def _migrate(self) -> None:
        await migrate(self.db_url, self.log_dir, child_env())

    async def _start_llm(self) -> Child:
        log_path = self.log_dir / "hostile_llm.log"
        for _attempt in range(3):
            port = free_port()
            log = log_path.open("ab")
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.hostile_llm",
                "--port",
                str(port),
                "--latency",
                "0.2",
                env=child_env({}),
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_prepare_child(None),
            )
            child = Child("hostile-llm", proc, f"http://{HOST}:{port}", log_path, log)
            try:
                await wait_healthy(child, "/healthz", 60)
                return child
            except ProcessFailed:
                await child.stop()
                if "address already in use" not in child.log_tail().lower():
                    raise
        raise RuntimeError("the fake LLM could not get a port")

    async def _start_replica(self, replica: Replica, *, limit_seconds: float = 90.0) -> None:
        """`python -m app.cli serve` on the replica's port (the same port after a kill -9)."""
        for attempt in range(5):
            log = replica.log_path.open("ab")
            log.write(
                f"==== hostile: starting replica {replica.index} on port {replica.port} ====\n".encode()
            )
            log.flush()
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "app.cli",
                "serve",
                "--host",
                HOST,
                "--port",
                str(replica.port),
                env=self.service_env,
                cwd=self.log_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_prepare_child(None),
            )
            child = Child(
                f"replica-{replica.index}", proc, f"http://{HOST}:{replica.port}", replica.log_path, log
            )
            incarnation = Incarnation(pid=proc.pid, started_at=time.time())
            replica.child = child
            replica.incarnations.append(incarnation)
            try:
                await wait_healthy(child, "/readyz", limit_seconds)
                replica.ready = True
                return
            except ProcessFailed:
                await child.stop()
                incarnation.ended_at, incarnation.end = time.time(), "failed_to_start"
                incarnation.exit_code = child.proc.returncode
                tail = child.log_tail(80).lower()
                if attempt < 4 and "address already in use" in tail:
                    await asyncio.sleep(1.0)
                    continue
                raise
        raise RuntimeError(f"replica {replica.index} did not start")

    async def setup(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.db_url = await create_database(self.opts.database_url, self.db_name)
        await self._migrate()
        self.pool = await asyncpg.create_pool(self.db_url, min_size=1, max_size=3)
        self.llm = await self._start_llm()
        self.service_env = child_env(
            {
                "DATABASE_URL": self.db_url,
                "OPENAI_API_KEY": "hostile-not-a-real-key",
                "OPENAI_BASE_URL": self.llm.base_url + "/v1",
                "MEMORY_SUMMARIZER": "openai",
                "MEMORY_API_KEYS": ",".join(f"{TENANTS[t]}:{k}" for t, k in self.keys.items()),
                "LOG_LEVEL": "INFO",
                # A replica killed with -9 leaves 'processing' rows; a short lease and a short
                # backoff let the other replica claim them again within the run and its drain.
                "MEMORY_PROCESSING_TIMEOUT_SECONDS": "20",
                "MEMORY_REAPER_INTERVAL_SECONDS": "5",
                "MEMORY_SUMMARY_BACKOFF_SECONDS": "5",
                **self.opts.service_env,
            }
        )
        self.max_body = int(self.service_env.get("MEMORY_MAX_BODY_BYTES", str(4 * 1024 * 1024)))
        self.ctx = hp.Context(max_body=self.max_body)
        self.bodies = hp.Bodies(self.max_body, self.scale.million)
        self.replicas = [Replica(i, free_port(), self.log_dir / f"replica-{i}.log") for i in range(2)]
        for replica in self.replicas:
            try:
                await self._start_replica(replica)
            except ProcessFailed:
                replica.port = free_port()  # someone took it meanwhile: one more try elsewhere
                await self._start_replica(replica)
        self.pools = [Pool(r.port, self.scale.concurrency) for r in self.replicas]

    async def teardown(self) -> None:
        for p in self.pools:
            with contextlib.suppress(Exception):
                await p.close()
        for replica in self.replicas:
            if replica.child is not None:
                with contextlib.suppress(Exception):
                    code = await replica.child.stop(grace_seconds=30)
                    inc = replica.incarnations[-1]
                    if inc.ended_at is None:
                        inc.ended_at, inc.end, inc.exit_code = time.time(), "stopped", code
        if self.llm is not None:
            with contextlib.suppress(Exception):
                await self.llm.stop()
        if self.pool is not None:
            with contextlib.suppress(Exception):
                await self.pool.close()
        if self.db_url and not self.opts.keep_database:
            await drop_database(self.opts.database_url, self.db_name)

    # ---- recording ----------------------------------------------------------------------------

    def next_rid(self) -> str:
        self._rid += 1
        return f"hx-{self._rid}"

    def record(
        self,
        category: str,
        variant: str,
        method: str,
        target: str,
        reply: Reply,
        replica: int,
        sent_at: float,
        request_id: str | None,
        must_refuse: bool,
    ) -> Record:
        assert self.book is not None
        route, documented = self.book.classify(method, target)
        ok = True if reply.status is None else acceptable(documented, reply.status)
        retry_after = "retry-after" in reply.headers
        rec = Record(
            category=category,
            variant=variant,
            method=method[:16],
            target=target[:300],
            route=route,
            status=reply.status,
            error=reply.error,
            replica=replica,
            sent_at=sent_at,
            elapsed=reply.elapsed,
            request_id=request_id,
            acceptable=ok,
            retry_after=retry_after,
            must_refuse=must_refuse,
            resp_bytes=reply.body_bytes,
        )
        finding = (
            (reply.status is not None and not ok)
            or (reply.status == 503 and not retry_after)
            or (must_refuse and reply.status is not None and 200 <= reply.status < 300)
        )
        if finding:
            rec.body = reply.body[:1000].decode("utf-8", errors="replace")
        self.records.append(rec)
        return rec

    def ack(self, conversation_id: str, body: bytes) -> dict[str, Any] | None:
        """Remember the messages a 201 acknowledged."""
        try:
            data: dict[str, Any] = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        for m in data.get("messages", []):
            key = (conversation_id, int(m["sequence"]))
            text = orjson.dumps(m["content"]).decode()
            found = TOKEN.search(text)
            entry = Ack(content_sha(m["content"]), found.group(0) if found else None)
            previous = self.acked.get(key)
            if previous is not None and previous.sha != entry.sha:
                self.ack_conflicts.append({"conversation_id": key[0], "sequence": key[1]})
            self.acked[key] = entry
        return data

    # ---- well-behaved traffic -----------------------------------------------------------------

    async def call(
        self,
        category: str,
        tenant: str,
        method: str,
        target: str,
        body: bytes | None = None,
        *,
        hint: int = 0,
        idempotency_key: str | None = None,
        attempts: int = 6,
        own: list[KeepAlive] | None = None,
    ) -> tuple[Reply, float]:
        """A request as a careful client makes it: retried on another replica after a transport
        error or a 503 (POSTs only with an Idempotency-Key). ``own``: dedicated connections
        (not counted against --concurrency)."""
        headers = [("X-API-Key", self.keys[tenant])]
        if body is not None:
            headers.append(JSON_CT)
        if idempotency_key is not None:
            headers.append(("Idempotency-Key", idempotency_key))
        reply = Reply(None, error="not sent")
        sent_at = time.time()
        for attempt in range(attempts):
            index = (hint + attempt) % len(self.replicas)
            if not self.replicas[index].up() and self.replicas[1 - index].up():
                index = 1 - index  # as a load balancer with health checks would
            rid = self.next_rid()
            sent_at = time.time()
            all_headers = [*headers, ("X-Request-ID", rid)]
            if own is not None:
                reply = await own[index].request(method, target, all_headers, body)
            else:
                async with self.sem, self.pools[index].conn() as conn:
                    reply = await conn.request(method, target, all_headers, body)
            self.record(category, "normal", method, target, reply, index, sent_at, rid, False)
            reply.replica = index
            if reply.status is not None and reply.status != 503:
                break
            if method == "POST" and idempotency_key is None:
                break
            await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
        return reply, sent_at

    async def post_round(
        self,
        category: str,
        tenant: str,
        conversation_id: str,
        n: int,
        *,
        hint: int = 0,
        body: bytes | None = None,
        own: list[KeepAlive] | None = None,
    ) -> tuple[dict[str, Any] | None, float, Reply]:
        if body is None:
            body, _tokens = hp.normal_round(n, self.rng)
        reply, sent_at = await self.call(
            category,
            tenant,
            "POST",
            f"/conversations/{conversation_id}/messages",
            body,
            hint=hint,
            idempotency_key=uuid.uuid4().hex,
            own=own,
        )
        data = self.ack(conversation_id, reply.body) if reply.status == 201 else None
        return data, sent_at, reply

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    async def sleep_until_offset(self, seconds: float) -> None:
        """Sleep until ``seconds`` after the abuse began."""
        delay = self.started_at + seconds - time.time()
        if delay > 0:
            await asyncio.sleep(delay)

    async def prewarm(self) -> None:
        """Two rounds in each quiet conversation (B and C), so each later round makes a summary
        due (MEMORY_SUMMARIZE_AFTER_SEQ=5: from the third round on)."""
        for tenant in ("b", "c"):
            for i in range(self.scale.quiet_conversations):
                cid = f"q{tenant}-{i}"
                for n in range(2):
                    data, _, reply = await self.post_round("prewarm", tenant, cid, n, hint=i)
                    if data is None:
                        raise RuntimeError(
                            f"prewarm POST failed: {reply.status} {reply.error} {reply.body[:300]!r}"
                        )

    async def quiet_worker(self, tenant: str, index: int) -> None:
        cid = f"q{tenant}-{index}"
        own = [KeepAlive(HOST, r.port) for r in self.replicas]
        n = 2
        rng = random.Random(f"{tenant}{index}")
        await asyncio.sleep(rng.uniform(0, self.scale.quiet_interval))
        try:
            while self.running():
                began = time.monotonic()
                hint = n % 2
                await self.call(
                    "quiet", tenant, "GET", f"/conversations/{cid}/context", hint=hint, attempts=3, own=own
                )
                data, sent_at, reply = await self.post_round("quiet", tenant, cid, n, hint=hint, own=own)
                n += 1
                self.quiet_rounds[tenant] += 1
                if data is not None:
                    self.lags.append(
                        {
                            "tenant": tenant,
                            "conversation_id": cid,
                            "round": int(data["round"]),
                            "summary_due": bool(data["summary_due"]),
                            "sent_at": sent_at,
                            "replica": reply.replica,
                        }
                    )
                    if not data["summary_due"]:
                        self.quiet_no_summary[tenant] += 1
                pause = self.scale.quiet_interval * rng.uniform(0.8, 1.2) - (time.monotonic() - began)
                if pause > 0:
                    await asyncio.sleep(pause)
        finally:
            for conn in own:
                await conn.close()

    async def steady_worker(self, index: int) -> None:
        cid = f"sa-{index}"
        n = 0
        rng = random.Random(f"steady{index}")
        while self.running():
            hint = rng.randrange(2)
            data, _, _ = await self.post_round("steady", "a", cid, n, hint=hint)
            if data is not None:
                n += 1
                if n == 1:
                    self.ctx.a_conversations.append(cid)
            await self.call("steady", "a", "GET", f"/conversations/{cid}/context", hint=1 - hint, attempts=3)
            await asyncio.sleep(rng.uniform(0.05, 0.25))

    async def burst(self, number: int, at: float) -> None:
        await self.sleep_until_offset(at)
        if not self.running():
            return
        began = time.time()
        self.events.append({"event": f"burst {number} starts", "at": round(began - self.started_at, 2)})

        async def one(i: int) -> int:
            cid = f"ab{number}-{i}"
            done = 0
            for n in range(self.scale.burst_rounds):
                if not self.running():
                    break
                data, _, _ = await self.post_round("burst", "a", cid, n, hint=i % 2)
                done += data is not None
            return done

        rounds = await asyncio.gather(*(one(i) for i in range(self.scale.burst_conversations)))
        self.burst_windows.append((began, time.time()))
        self.events.append(
            {
                "event": f"burst {number} done",
                "at": round(time.time() - self.started_at, 2),
                "conversations": self.scale.burst_conversations,
                "rounds": sum(rounds),
                "seconds": round(time.time() - began, 2),
            }
        )

    async def a_memories_worker(self) -> None:
        """Tenant A's newest memory ids, from the database, for the cross-tenant retry abuse (a
        POST answers only whether a summary became due, not which memory row a runner made)."""
        while self.running():
            rows = await self._db().fetch(
                "SELECT m.memory_id FROM memory m JOIN conversations c USING (conversation_id)"
                " WHERE c.tenant_id = $1 ORDER BY m.memory_id DESC LIMIT 500",
                TENANTS["a"],
            )
            self.ctx.a_memories[:] = [int(r["memory_id"]) for r in rows]
            await asyncio.sleep(1.0)

    async def poison_worker(self) -> None:
        """Tenant A's conversation whose summaries always fail (the LLM answers it 500)."""
        n = 0
        while self.running():
            await self.post_round("poison", "a", "hx-poison", n, hint=n % 2, body=hp.poison_round(n))
            n += 1
            await asyncio.sleep(1.0)

    # ---- abuse --------------------------------------------------------------------------------

    async def send_abuse(self, abuse: hp.Abuse, replica: int, within: float = 30.0) -> Reply:
        port = self.replicas[replica].port
        rid: str | None = None
        body_pieces: list[bytes] = []
        if abuse.raw_head is not None:
            head = abuse.raw_head
        else:
            headers = list(abuse.headers)
            if abuse.auth:
                headers.append(("X-API-Key", self.keys[abuse.auth]))
            rid = self.next_rid()
            headers.append(("X-Request-ID", rid))
            has_length = any(k.lower() == "content-length" for k, _ in headers)
            if abuse.body is not None:
                if abuse.chunked:
                    headers.append(("Transfer-Encoding", "chunked"))
                    body_pieces = chunked(abuse.body)
                else:
                    if not has_length:
                        headers.append(("Content-Length", str(len(abuse.body))))
                    data = abuse.body if abuse.send_limit is None else abuse.body[: abuse.send_limit]
                    body_pieces = [data[i : i + 256 * 1024] for i in range(0, len(data), 256 * 1024)]
            head = build_head(abuse.method, abuse.target, f"{HOST}:{port}", headers)
        sent_at = time.time()
        reply = await exchange(HOST, port, head, body_pieces, method=abuse.method.upper(), within=within)
        if reply.status == 201 and abuse.method == "POST":
            match = re.fullmatch(r"/conversations/([^/?]+)/messages", abuse.target)
            if match:
                self.ack(match.group(1), reply.body)
        self.record(
            abuse.kind,
            abuse.variant,
            abuse.method,
            abuse.target,
            reply,
            replica,
            sent_at,
            rid,
            abuse.must_refuse
            and not (abuse.empty_context_ok and reply.status == 200 and hp.empty_context(reply.body)),
        )
        return reply

    def live_replica(self, rng: random.Random) -> int:
        """A replica that is up (abuse aimed at a dead one only measures the kill)."""
        alive = [r.index for r in self.replicas if r.up()]
        return rng.choice(alive) if alive else rng.randrange(len(self.replicas))

    def generate(self, kind: str, rng: random.Random) -> hp.Abuse:
        bodies = self.bodies
        assert bodies is not None
        host = f"{HOST}:{self.replicas[0].port}"
        generators: dict[str, Callable[[], hp.Abuse]] = {
            "hostile_json": lambda: hp.hostile_json(self.ctx, rng),
            "malformed": lambda: hp.malformed(self.ctx, rng),
            "wrong_key": lambda: hp.wrong_key(self.ctx, rng, self.keys),
            "junk_path": lambda: hp.junk_path(self.ctx, rng),
            "junk_method": lambda: hp.junk_method(self.ctx, rng),
            "trailing_slash": lambda: hp.trailing_slash(self.ctx, rng),
            "huge_header": lambda: hp.huge_header(self.ctx, rng, self.keys, host),
            "cross_tenant": lambda: hp.cross_tenant(self.ctx, rng),
            "oversized": lambda: hp.oversized(self.ctx, rng, bodies),
            "unauth_large": lambda: hp.unauthenticated(self.ctx, rng, bodies),
        }
        return generators[kind]()

    async def abuse_worker(self, index: int) -> None:
        rng = random.Random(self.opts.seed * 1000 + index)
        kinds, weights = list(MIX), list(MIX.values())
        while self.running():
            kind = rng.choices(kinds, weights)[0]
            abuse = self.generate(kind, rng)
            async with self.sem:
                await self.send_abuse(abuse, self.live_replica(rng), within=20.0)
            await asyncio.sleep(rng.uniform(0.005, 0.03))

    async def heavy_worker(self) -> None:
        """A million tiny messages in one body, by Content-Length and chunked (refused at the
        limit), and the most valid tiny messages that fit under it (parsed, then refused), in
        turn, now and then. The bodies that fit and make the service build an error per item
        run after the abuse window, alone (``amplification``)."""
        rng = random.Random(self.opts.seed * 7)
        bodies = self.bodies
        assert bodies is not None
        turn = 0
        await asyncio.sleep(0.5)
        while self.running():
            batch = []
            for _ in range(self.scale.heavy_parallel):
                batch.append(self._million_variant(turn % 3, bodies))
                turn += 1

            async def fire(abuse: hp.Abuse) -> None:
                async with self.sem:
                    await self.send_abuse(abuse, self.live_replica(rng), within=60.0)

            await asyncio.gather(*(fire(a) for a in batch))
            await asyncio.sleep(self.scale.heavy_every)

    def _million_variant(self, which: int, bodies: hp.Bodies) -> hp.Abuse:
        target = f"/conversations/{self.ctx.cid('million')}/messages"
        kinds = [
            (f"million_{self.scale.million}_content_length", bodies.million, False),
            (f"fit_{bodies.fit_valid_count}_valid", bodies.fit_valid, False),
            (f"million_{self.scale.million}_chunked", bodies.million, True),
            (f"fit_{bodies.fit_empty_count}_empty_objects", bodies.fit_empty, False),
            (f"fit_1_message_{bodies.fit_keys_count}_extra_keys", bodies.fit_keys, False),
        ]
        variant, body, is_chunked = kinds[which]
        return hp.Abuse("million_messages", variant, "POST", target, (hp.JSON,), body, chunked=is_chunked)

    async def amplify(self, which: int, limit_seconds: float) -> dict[str, Any]:
        """One body under the limit that makes the service build an error per item (1.4 million
        empty messages, or one message with 260,000 unknown keys), sent alone to one replica
        while a bystander (tenant B reading its context on the same replica) measures how long
        the replica stops answering, and its RSS is sampled."""
        bodies = self.bodies
        assert bodies is not None
        replica = self.replicas[0] if self.replicas[0].alive() else self.replicas[1]
        abuse = self._million_variant(which, bodies)
        pid = replica.incarnations[-1].pid
        rss_before = _process_rss(pid)
        peak = rss_before
        stop = asyncio.Event()
        bystander: list[float] = []
        bystander_failures: Counter[str] = Counter()

        async def watch() -> None:
            nonlocal peak
            cid = "qb-0"
            while not stop.is_set():
                began = time.perf_counter()
                head = build_head(
                    "GET",
                    f"/conversations/{cid}/context",
                    f"{HOST}:{replica.port}",
                    [("X-API-Key", self.keys["b"])],
                )
                reading = asyncio.create_task(exchange(HOST, replica.port, head, within=limit_seconds))
                while not reading.done():
                    peak = max(peak, _process_rss(pid))
                    await asyncio.wait({reading}, timeout=0.2)
                reply = reading.result()
                if reply.status == 200:
                    bystander.append(time.perf_counter() - began)
                else:
                    bystander_failures[str(reply.status or reply.error)] += 1
                await asyncio.sleep(0.25)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.5)
        reply = await self.send_abuse(abuse, replica.index, within=limit_seconds)
        rss_after = _process_rss(pid)
        await asyncio.sleep(1.0)
        stop.set()
        await watcher
        return {
            "variant": abuse.variant,
            "body_bytes": len(abuse.body or b""),
            "replica": replica.index,
            "status": reply.status,
            "error": reply.error,
            "seconds": round(reply.elapsed, 2),
            "response_bytes": reply.body_bytes,
            "response_head": reply.body[:300].decode("utf-8", "replace"),
            "rss_before_mib": round(rss_before / 2**20, 1),
            "rss_peak_mib": round(peak / 2**20, 1),
            "rss_after_mib": round(rss_after / 2**20, 1),
            "bystander_context_gets": len(bystander),
            "bystander_max_seconds": round(max(bystander), 2) if bystander else None,
            "bystander_failures": dict(bystander_failures),
        }

    async def metadata_worker(self) -> None:
        """64 new metadata keys per POST to one conversation until refused; then the
        conversation must still take a plain round. Alternates short values (the key cap) and
        long ones (the byte cap)."""
        cycle = 0
        while self.running():
            cid = f"hx-meta-{cycle}"
            value_chars = 8 if cycle % 2 == 0 else 120
            accepted = 0
            refusal: dict[str, Any] | None = None
            for step in range(64):
                if not self.running():
                    break
                data, _, reply = await self.post_round(
                    "metadata_bloat",
                    "a",
                    cid,
                    step,
                    hint=step % 2,
                    body=hp.metadata_round(step, 64, value_chars),
                )
                if data is not None:
                    accepted += 1
                    continue
                refusal = {
                    "status": reply.status,
                    "error": reply.error,
                    "body": reply.body[:300].decode("utf-8", "replace"),
                }
                break
            after: dict[str, Any] = {}
            if refusal is not None:
                data, _, reply = await self.post_round("metadata_bloat", "a", cid, 999, hint=cycle % 2)
                after["plain_round_status"] = reply.status
                reply, _ = await self.call("metadata_bloat", "a", "GET", f"/conversations/{cid}", attempts=3)
                if reply.status == 200:
                    meta = orjson.loads(reply.body).get("metadata") or {}
                    after["metadata_keys"] = len(meta)
                    after["metadata_bytes"] = len(orjson.dumps(meta))
            self.metadata_cycles.append(
                {
                    "conversation_id": cid,
                    "value_chars": value_chars,
                    "accepted_posts": accepted,
                    "refusal": refusal,
                    **after,
                }
            )
            cycle += 1

    async def fat_worker(self) -> None:
        """Valid rounds close to the body limit (40 messages of ~99,000 characters), then
        their context."""
        count = max(1, (self.max_body - 4096) // 100_500)
        for i in range(self.scale.fat_rounds):
            await self.sleep_until_offset((i + 0.5) * self.scale.seconds / (self.scale.fat_rounds + 1))
            if not self.running():
                return
            cid = f"hx-fat-{i}"
            body = hp.fat_round(99_000, count)
            _data, _, reply = await self.post_round("fat_round", "a", cid, 0, hint=i % 2, body=body)
            ctx_reply, _ = await self.call(
                "fat_round", "a", "GET", f"/conversations/{cid}/context", hint=i % 2, attempts=3
            )
            self.fat.append(
                {
                    "conversation_id": cid,
                    "body_bytes": len(body),
                    "messages": count,
                    "post_status": reply.status,
                    "post_seconds": round(reply.elapsed, 3),
                    "context_status": ctx_reply.status,
                    "context_bytes": ctx_reply.body_bytes,
                    "context_seconds": round(ctx_reply.elapsed, 3),
                }
            )

    # ---- slow and idle connections ------------------------------------------------------------

    async def _hold(
        self,
        kind: str,
        replica: int,
        opening: bytes,
        drip: Callable[[int], bytes] | None,
        drip_every: float,
        method: str,
        target: str,
    ) -> Held:
        """Open a connection, send ``opening``, then ``drip(i)`` every ``drip_every`` seconds
        until the server answers or closes, or the run ends."""
        port = self.replicas[replica].port
        opened = time.time()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 10)
        except (OSError, TimeoutError):
            return Held(kind, replica, opened, time.time(), "connect_failed")
        held = Held(kind, replica, opened, None, "still_open")
        reading = asyncio.create_task(read_response(reader, method))
        try:
            if opening:
                writer.write(opening)
                await writer.drain()
            i = 0
            while self.running():
                done, _ = await asyncio.wait(
                    {reading}, timeout=min(drip_every, max(0.01, self.deadline - time.monotonic()))
                )
                if done:
                    break
                if drip is not None and self.running():
                    writer.write(drip(i))
                    await writer.drain()
                    i += 1
            if reading.done():
                held.closed_at = time.time()
                exc = reading.exception()
                if exc is None:
                    status, headers, body, _size = reading.result()
                    held.outcome, held.status = "response", status
                    self.record(
                        kind,
                        "response",
                        method,
                        target,
                        Reply(status, headers, body),
                        replica,
                        opened,
                        None,
                        False,
                    )
                elif isinstance(exc, asyncio.IncompleteReadError) and not exc.partial:
                    held.outcome = "closed"
                else:
                    held.outcome = f"error:{type(exc).__name__}"
        except (OSError, ConnectionError) as exc:
            held.closed_at, held.outcome = time.time(), f"error:{type(exc).__name__}"
        finally:
            reading.cancel()
            with contextlib.suppress(BaseException):
                await reading
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1)
        return held

    async def slowloris_slot(self, index: int) -> None:
        replica = index % len(self.replicas)
        target = "/conversations/hx-loris/messages"
        while self.running():
            if not self.replicas[replica].up():  # down: wait for its restart
                await asyncio.sleep(0.25)
                continue
            host = f"{HOST}:{self.replicas[replica].port}"
            opening = f"POST {target} HTTP/1.1\r\nHost: {host}\r\n".encode()
            held = await self._hold(
                "slowloris", replica, opening, lambda i: f"X-Loris-{i}: {i}\r\n".encode(), 2.0, "POST", target
            )
            self.held.append(held)
            if held.outcome == "connect_failed":
                await asyncio.sleep(0.5)

    async def idle_slot(self, index: int) -> None:
        replica = (index // 2) % len(self.replicas)
        while self.running():
            if not self.replicas[replica].up():  # down: wait for its restart
                await asyncio.sleep(0.25)
                continue
            if index % 2 == 0:
                # A kept-alive connection that goes quiet after one request.
                conn = KeepAlive(HOST, self.replicas[replica].port)
                sent_at = time.time()
                reply = await conn.request("GET", "/healthz", [("X-Request-ID", rid := self.next_rid())])
                self.record(
                    "idle_keepalive", "first_request", "GET", "/healthz", reply, replica, sent_at, rid, False
                )
                reader = conn._reader
                opened = time.time()
                if reader is None:
                    self.held.append(Held("idle_keepalive", replica, opened, time.time(), "connect_failed"))
                    await asyncio.sleep(0.5)
                    continue
                held = Held("idle_keepalive", replica, opened, None, "still_open")
                try:
                    left = self.deadline - time.monotonic()
                    data = await asyncio.wait_for(reader.read(1), max(0.01, left))
                    held.closed_at = time.time()
                    held.outcome = "closed" if not data else "unexpected_bytes"
                except TimeoutError:
                    pass
                except OSError as exc:
                    held.closed_at, held.outcome = time.time(), f"error:{type(exc).__name__}"
                await conn.close()
                self.held.append(held)
            else:
                # A connection that never sends a byte.
                held = await self._hold("idle_silent", replica, b"", None, 1.0, "GET", "/")
                self.held.append(held)
                if held.outcome == "connect_failed":
                    await asyncio.sleep(0.5)

    async def slow_body_slot(self, index: int) -> None:
        """A complete head with a valid key, then the body a byte a second."""
        replica = index % len(self.replicas)
        while self.running():
            if not self.replicas[replica].up():  # down: wait for its restart
                await asyncio.sleep(0.25)
                continue
            host = f"{HOST}:{self.replicas[replica].port}"
            opening = build_head(
                "POST",
                f"/conversations/hx-slowbody-{index}/messages",
                host,
                [("X-API-Key", self.keys["a"]), JSON_CT, ("Content-Length", "4096")],
            )
            held = await self._hold(
                "slow_body",
                replica,
                opening,
                lambda _i: b" ",
                1.0,
                "POST",
                f"/conversations/hx-slowbody-{index}/messages",
            )
            self.held.append(held)
            if held.outcome == "connect_failed":
                await asyncio.sleep(0.5)

    # ---- the kill -9 --------------------------------------------------------------------------

    async def kill_and_restart(self, at: float) -> None:
        await self.sleep_until_offset(at)
        if not self.running():
            return
        replica = self.replicas[1]
        child = replica.child
        assert child is not None
        inc = replica.incarnations[-1]
        killed_at = time.time()
        replica.ready = False
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
        await child.proc.wait()
        child._log.close()
        inc.ended_at, inc.end, inc.exit_code = time.time(), "killed", child.proc.returncode
        self.kill_at_wall, self.killed_replica = killed_at, replica.index
        self.events.append({"event": "kill -9 replica 1", "at": round(killed_at - self.started_at, 2)})
        await asyncio.sleep(1.0)
        began = time.time()
        for attempt in range(4):
            try:
                await self._start_replica(replica, limit_seconds=60)
                break
            except (ProcessFailed, RuntimeError) as exc:
                self.events.append({"event": f"restart attempt {attempt} failed", "error": str(exc)[-500:]})
                await asyncio.sleep(15 if attempt < 3 else 0)
        self.events.append(
            {
                "event": "replica 1 restarted" if replica.alive() else "replica 1 NOT restarted",
                "at": round(time.time() - self.started_at, 2),
                "restart_seconds": round(time.time() - began, 2),
                "downtime_seconds": round(time.time() - killed_at, 2),
            }
        )

    # ---- samplers -----------------------------------------------------------------------------

    async def sample(self, stop: asyncio.Event) -> None:
        """RSS of each replica every 0.2 s, the runner queues every second (in their own
        tasks, so a frozen replica does not hold this loop), and how late this loop wakes: the
        client's own event-loop delay, which every latency measured here carries too."""
        pollers = [asyncio.create_task(self._poll_runner(r, stop)) for r in self.replicas]
        try:
            while not stop.is_set():
                expected = time.monotonic() + 0.2
                for replica in self.replicas:
                    if replica.alive() and replica.incarnations:
                        inc = replica.incarnations[-1]
                        rss = _process_rss(inc.pid)
                        if rss > inc.peak_rss:
                            inc.peak_rss, inc.peak_at = rss, time.time()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, expected - time.monotonic()))
                if not stop.is_set():
                    late = time.monotonic() - expected
                    if late > 0.05:
                        self.loop_lags.append((round(time.time() - self.started_at, 2), round(late, 3)))
                    self.loop_lag_max = max(self.loop_lag_max, late)
        finally:
            await asyncio.gather(*pollers, return_exceptions=True)

    async def _poll_runner(self, replica: Replica, stop: asyncio.Event) -> None:
        conn = KeepAlive(HOST, replica.port)
        try:
            while not stop.is_set():
                if replica.up():
                    reply = await conn.request(
                        "GET", "/ops/runner", [("X-API-Key", self.keys["a"])], within=5
                    )
                    if reply.status == 200:
                        stats = orjson.loads(reply.body)
                        peaks = self.runner_peaks[replica.index]
                        for key in ("running", "queued", "due"):
                            if isinstance(stats.get(key), int):
                                peaks[key] = max(peaks.get(key, 0), stats[key])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        finally:
            await conn.close()

    # ---- the run ------------------------------------------------------------------------------

    async def guard(self, name: str, coro: Awaitable[None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            self.harness_errors.append(f"{name}: {traceback.format_exc()}")

    async def fetch_openapi(self) -> dict[str, Any]:
        conn = KeepAlive(HOST, self.replicas[0].port)
        try:
            reply = await conn.request("GET", "/openapi.json", [("X-API-Key", self.keys["a"])])
        finally:
            await conn.close()
        if reply.status != 200:
            raise RuntimeError(f"GET /openapi.json answered {reply.status} {reply.error}")
        doc: dict[str, Any] = orjson.loads(reply.body)
        return doc

    async def drive(self) -> None:
        scale = self.scale
        self.started_at = time.time()
        self.deadline = time.monotonic() + scale.seconds
        tasks: list[asyncio.Task[None]] = []

        def spawn(name: str, coro: Awaitable[None]) -> None:
            tasks.append(asyncio.create_task(self.guard(name, coro), name=name))

        for tenant in ("b", "c"):
            for i in range(scale.quiet_conversations):
                spawn(f"quiet-{tenant}{i}", self.quiet_worker(tenant, i))
        for i in range(scale.steady_conversations):
            spawn(f"steady-{i}", self.steady_worker(i))
        for b in range(scale.bursts):
            spawn(f"burst-{b}", self.burst(b, scale.seconds * (0.15 + 0.4 * b)))
        for i in range(scale.abuse_workers):
            spawn(f"abuse-{i}", self.abuse_worker(i))
        spawn("heavy", self.heavy_worker())
        spawn("metadata", self.metadata_worker())
        spawn("fat", self.fat_worker())
        spawn("poison", self.poison_worker())
        spawn("a-memories", self.a_memories_worker())
        for i in range(scale.slowloris):
            spawn(f"slowloris-{i}", self.slowloris_slot(i))
        for i in range(scale.idle_connections):
            spawn(f"idle-{i}", self.idle_slot(i))
        for i in range(scale.slow_bodies):
            spawn(f"slowbody-{i}", self.slow_body_slot(i))
        spawn("kill", self.kill_and_restart(scale.seconds * 0.45))

        await asyncio.sleep(scale.seconds)
        self.events.append({"event": "abuse ends", "at": round(time.time() - self.started_at, 2)})
        _done, pending = await asyncio.wait(tasks, timeout=120)
        for task in pending:
            self.harness_errors.append(f"{task.get_name()}: still running 120 s after the end; cancelled")
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self.events.append({"event": "client tasks done", "at": round(time.time() - self.started_at, 2)})

    async def drain(self) -> dict[str, Any]:
        """Wait until no summary is 'processing' (orphans of the killed replica are claimed again
        after their lease) and no conversation is due now, at most drain_seconds. A conversation
        whose summaries keep failing (the poisoned one) stays due for later, after its backoff."""
        began = time.monotonic()
        while True:
            row = await self._db().fetchrow(
                """
                SELECT (SELECT count(*) FROM memory WHERE status = 'processing') AS processing,
                       count(*) FILTER (WHERE summary_due_at <= now()) AS due,
                       count(*) FILTER (WHERE summary_due_at > now()) AS due_later
                FROM conversations
                """
            )
            elapsed = time.monotonic() - began
            if (row["processing"] == 0 and row["due"] == 0) or elapsed > self.scale.drain_seconds:
                return {
                    "seconds": round(elapsed, 2),
                    "processing_left": row["processing"],
                    "due_left": row["due"],
                    "due_after_backoff": row["due_later"],
                }
            await asyncio.sleep(0.25)

    async def run(self) -> dict[str, Any]:
        began = time.perf_counter()
        meta: dict[str, Any] = {
            "run_id": self.run_id,
            "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": " ".join([os.path.basename(sys.executable), "-m", "bench.hostile", *sys.argv[1:]]),
            "scale": dataclasses.asdict(self.scale),
            "database_server": redact(self.opts.database_url),
            "database": self.db_name,
            "log_dir": str(self.log_dir),
            "cpus": os.cpu_count(),
            "git_commit": _git(["rev-parse", "--short", "HEAD"]),
            "app_tree_dirty": bool(_git(["status", "--porcelain", "--", "app", "migrations"])),
        }
        results: dict[str, Any] = {}
        stop = asyncio.Event()
        sampler: asyncio.Task[None] | None = None
        try:
            await self.setup()
            meta["replica_command"] = "python -m app.cli serve --host 127.0.0.1 --port <port>"
            meta["service_env"] = {
                k: ("<3 tenants>" if k == "MEMORY_API_KEYS" else ("<redacted>" if k == "DATABASE_URL" else v))
                for k, v in self.service_env.items()
                if k.startswith(("MEMORY_", "OPENAI_BASE", "LOG_LEVEL", "DATABASE_"))
            }
            openapi = await self.fetch_openapi()
            self.book = RouteBook(openapi)
            meta["openapi_operations"] = {
                route.template: {m: sorted(s) for m, s in route.operations.items()}
                for route in self.book.routes
            }
            await self.prewarm()
            sampler = asyncio.create_task(self.sample(stop))
            await self.drive()
            results["drain"] = await self.drain()
            for which in self.scale.amplification:
                self.amplification.append(await self.amplify(which, self.scale.amplification_limit_seconds))
            stop.set()
            await sampler
            sampler = None
            results["llm"] = await self._llm_counts()
            results["failing_conversations"] = await self._failing()
            results["replicas_alive_at_end"] = [r.alive() for r in self.replicas]
        finally:
            stop.set()
            if sampler is not None:
                sampler.cancel()
                await asyncio.gather(sampler, return_exceptions=True)
            try:
                if self.pool is not None and self.book is not None:
                    results.update(await self.database_checks())
            finally:
                await self.teardown()
                meta["total_seconds"] = round(time.perf_counter() - began, 1)
        results["events"] = self.events
        return {"meta": meta, "results": results}

    async def _llm_counts(self) -> dict[str, Any]:
        assert self.llm is not None
        conn = KeepAlive(HOST, int(self.llm.base_url.rsplit(":", 1)[1]))
        try:
            reply = await conn.request("GET", "/_hostile")
        finally:
            await conn.close()
        data: dict[str, Any] = orjson.loads(reply.body) if reply.status == 200 else {"error": reply.status}
        return data

    async def _failing(self) -> Any:
        conn = KeepAlive(HOST, self.replicas[0].port)
        try:
            reply = await conn.request("GET", "/ops/conversations/failing", [("X-API-Key", self.keys["a"])])
        finally:
            await conn.close()
        return orjson.loads(reply.body) if reply.status == 200 else {"status": reply.status}

    # ---- checks against the database ----------------------------------------------------------

    async def database_checks(self) -> dict[str, Any]:
        db = self._db()
        out: dict[str, Any] = {}
        # 1. every acknowledged message is stored, with the content acknowledged
        cids = sorted({cid for cid, _ in self.acked})
        stored: dict[tuple[str, int], str] = {}
        for i in range(0, len(cids), 200):
            rows = await db.fetch(
                "SELECT conversation_id, sequence, content::text AS content FROM messages"
                " WHERE conversation_id = ANY($1::text[])",
                cids[i : i + 200],
            )
            for r in rows:
                try:
                    stored[(r["conversation_id"], r["sequence"])] = content_sha(orjson.loads(r["content"]))
                except orjson.JSONDecodeError:
                    stored[(r["conversation_id"], r["sequence"])] = "unparseable"
        missing = [k for k in self.acked if k not in stored]
        differing = [k for k, a in self.acked.items() if k in stored and stored[k] != a.sha]
        # 2. every tagged message once (a retried or replayed round stored twice would repeat its token)
        rows = await db.fetch(
            "SELECT conversation_id, sequence,"
            " substring(left(content::text, 400) from 'tok:[0-9a-f]{16}') AS tok FROM messages"
        )
        by_token: dict[str, list[tuple[str, int]]] = defaultdict(list)
        untagged = 0
        for r in rows:
            if r["tok"] is None:
                untagged += 1
            else:
                by_token[r["tok"]].append((r["conversation_id"], r["sequence"]))
        duplicated = {t: places for t, places in by_token.items() if len(places) > 1}
        acked_keys = set(self.acked)
        unacked = [
            r["conversation_id"] for r in rows if (r["conversation_id"], r["sequence"]) not in acked_keys
        ]
        unacked_stored = len(unacked)
        # 3. gap-free sequences and rounds per conversation
        gaps = await db.fetch(
            """
            SELECT c.conversation_id, c.next_sequence, count(m.sequence) AS n,
                   coalesce(max(m.sequence), -1) AS max_seq
            FROM conversations c LEFT JOIN messages m USING (conversation_id)
            GROUP BY c.conversation_id, c.next_sequence
            HAVING count(m.sequence) <> c.next_sequence
                OR coalesce(max(m.sequence), -1) <> c.next_sequence - 1
            """
        )
        out["integrity"] = {
            "acknowledged_messages": len(self.acked),
            "acknowledged_conversations": len(cids),
            "lost": len(missing),
            "content_differs": len(differing),
            "ack_conflicts": len(self.ack_conflicts),
            "duplicated_tokens": len(duplicated),
            "messages_in_db": len(rows),
            "untagged_in_db": untagged,
            "stored_without_ack": unacked_stored,
            "sequence_gaps": len(gaps),
            "examples": {
                "lost": [list(k) for k in missing[:10]],
                "content_differs": [list(k) for k in differing[:10]],
                "duplicated": dict(list(duplicated.items())[:10]),
                "ack_conflicts": self.ack_conflicts[:10],
                "sequence_gaps": [dict(r) for r in gaps[:10]],
                # rounds stored whose 201 never reached the client (kill -9, client timeouts)
                "stored_without_ack_by_conversation": dict(Counter(unacked).most_common(15)),
            },
        }
        # 4. summary lag of the quiet tenants: from a round's POST to the first completed summary
        # covering that round (end_round >= the round), and of tenant A for comparison
        covered_rows = await db.fetch(
            """
            SELECT r.i, extract(epoch FROM (
                       SELECT min(m.completed_at) FROM memory m
                       WHERE m.conversation_id = r.conversation_id AND m.status = 'completed'
                         AND m.end_round >= r.round))::float8 AS covered
            FROM unnest($1::text[], $2::int[]) WITH ORDINALITY AS r(conversation_id, round, i)
            """,
            [e["conversation_id"] for e in self.lags],
            [e["round"] for e in self.lags],
        )
        covered = {int(r["i"]) - 1: r["covered"] for r in covered_rows}
        for i, entry in enumerate(self.lags):
            at = covered.get(i)
            entry["lag"] = None if at is None else round(float(at) - entry["sent_at"], 3)
        lag: dict[str, Any] = {}

        def lag_of(entries: list[dict[str, Any]]) -> dict[str, Any]:
            return {
                "rounds": len(entries),
                "rounds_marked_due": sum(1 for e in entries if e["summary_due"]),
                "seconds": summarize_plain(e["lag"] for e in entries if e["lag"] is not None),
                "never_covered": sum(1 for e in entries if e["lag"] is None),
            }

        for group in ("b", "c", "bc"):
            entries = [e for e in self.lags if e["tenant"] in group]
            lag[TENANTS.get(group, "tenant-b+c")] = {
                **lag_of(entries),
                "rounds_posted": sum(self.quiet_rounds[t] for t in group),
                "rounds_that_made_no_summary_due": sum(self.quiet_no_summary[t] for t in group),
            }
        if self.burst_windows:
            during = [e for e in self.lags if any(a <= e["sent_at"] <= b for a, b in self.burst_windows)]
            lag["tenant-b+c, posted during A's bursts"] = lag_of(during)
        for replica in self.replicas:
            lag[f"tenant-b+c, on replica {replica.index}"] = lag_of(
                [e for e in self.lags if e.get("replica") == replica.index]
            )
        slow = sorted(
            (
                {
                    **{
                        k: e[k]
                        for k in ("tenant", "conversation_id", "round", "replica", "summary_due", "lag")
                    },
                    "at": round(e["sent_at"] - self.started_at, 2),
                }
                for e in self.lags
            ),
            key=lambda x: -(x["lag"] if x["lag"] is not None else 1e9),
        )
        lag["slowest"] = slow[:8]
        a_rows = await db.fetch(
            """
            SELECT m.status, extract(epoch FROM m.completed_at - m.created_at) AS lag
            FROM memory m JOIN conversations c USING (conversation_id)
            WHERE c.tenant_id = $1
            """,
            TENANTS["a"],
        )
        # A memory row is made when a runner claims the due conversation (or queued by the
        # completion before it): row created -> completed is mostly the model call.
        lag["tenant-a (memory row created -> completed)"] = {
            "summaries": len(a_rows),
            "seconds": summarize_plain(float(r["lag"]) for r in a_rows if r["lag"] is not None),
            "statuses": dict(Counter(r["status"] for r in a_rows)),
        }
        out["summary_lag"] = lag
        # 5. the poisoned conversation and what is left processing
        poison = await db.fetch(
            "SELECT status, count(*) AS n, max(attempts) AS attempts, max(error) AS error FROM memory"
            " WHERE conversation_id = 'hx-poison' GROUP BY status"
        )
        conv = await db.fetchrow(
            "SELECT summary_failures, summary_retry_at, next_round FROM conversations"
            " WHERE conversation_id = 'hx-poison'"
        )
        out["poison"] = {
            "memories": {
                r["status"]: {"count": r["n"], "attempts": r["attempts"], "error": r["error"]} for r in poison
            },
            "rounds": conv["next_round"] if conv else 0,
            "summary_failures": conv["summary_failures"] if conv else None,
            "backing_off_until": conv["summary_retry_at"].isoformat()
            if conv and conv["summary_retry_at"]
            else None,
        }
        out["memory_statuses"] = {
            r["status"]: r["n"]
            for r in await db.fetch("SELECT status, count(*) AS n FROM memory GROUP BY status")
        }
        failed = await db.fetch(
            "SELECT left(error, 120) AS error, count(*) AS n FROM memory WHERE status = 'failed'"
            " AND conversation_id <> 'hx-poison' GROUP BY 1 ORDER BY 2 DESC LIMIT 10"
        )
        out["failed_summaries_outside_poison"] = [dict(r) for r in failed]
        return out


def _git(args: list[str]) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# ---- analysis ---------------------------------------------------------------------------------


def _parse_log(path: Path) -> list[tuple[float | None, str]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    lines: list[tuple[float | None, str]] = []
    for line in text.splitlines():
        match = LOG_LINE.match(line)
        ts = None
        if match:
            ts = (
                dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
                + int(match.group(2)) / 1000
            )
        lines.append((ts, line))
    return lines


def _excerpt(lines: list[tuple[float | None, str]], request_id: str | None, sent_at: float) -> list[str]:
    """The log lines about one request: those naming its id (with the traceback that follows),
    else the warnings and errors logged around its time."""
    picked: list[str] = []
    if request_id:
        needle = f"request_id={request_id})"
        for i, (_ts, line) in enumerate(lines):
            if needle in line:
                picked.append(line)
                j = i + 1
                while j < len(lines) and lines[j][0] is None and j - i < 40:
                    picked.append(lines[j][1])
                    j += 1
        if picked:
            return picked[:60]
    current_ok = False
    for ts, line in lines:
        if ts is not None:
            # Errors, and the app's warnings (uvicorn's "Invalid HTTP request received" is the
            # suite's own junk, everywhere).
            current_ok = sent_at - 1.0 <= ts <= sent_at + 5.0 and (
                " ERROR " in line or " CRITICAL " in line or (" WARNING " in line and "[uvicorn." not in line)
            )
        if current_ok:
            picked.append(line)
        if len(picked) >= 40:
            break
    return picked


def _log_summary(lines: list[tuple[float | None, str]]) -> dict[str, Any]:
    errors = [line for ts, line in lines if ts is not None and (" ERROR " in line or " CRITICAL " in line)]
    warnings = [line for ts, line in lines if ts is not None and " WARNING " in line]
    tracebacks = sum(1 for _ts, line in lines if line.startswith("Traceback"))

    def kind(line: str) -> str:
        rest = line.split("] ", 1)[-1]
        rest = re.sub(r"request_id=[^)]*", "request_id=...", rest)
        rest = re.sub(r"\d+", "N", rest)
        return rest[:110]

    return {
        "errors": len(errors),
        "warnings": len(warnings),
        "tracebacks": tracebacks,
        "error_kinds": Counter(kind(e) for e in errors).most_common(10),
        "warning_kinds": Counter(kind(w) for w in warnings).most_common(10),
    }


def analyse(h: Hostile, doc: dict[str, Any]) -> None:
    res = doc["results"]
    records = h.records
    logs = {r.index: _parse_log(r.log_path) for r in h.replicas}

    # statuses per route template
    per_route: dict[str, Counter[str]] = defaultdict(Counter)
    per_category: dict[str, dict[str, Any]] = {}
    for rec in records:
        per_route[rec.route][str(rec.status) if rec.status is not None else f"no_response:{rec.error}"] += 1
        cat = per_category.setdefault(
            rec.category,
            {
                "requests": 0,
                "responses": 0,
                "no_response": Counter(),
                "statuses": Counter(),
                "max_seconds": 0.0,
            },
        )
        cat["requests"] += 1
        cat["max_seconds"] = max(cat["max_seconds"], round(rec.elapsed, 3))
        if rec.status is None:
            cat["no_response"][rec.error or "?"] += 1
        else:
            cat["responses"] += 1
            cat["statuses"][str(rec.status)] += 1
    res["statuses_by_route"] = {route: dict(sorted(c.items())) for route, c in sorted(per_route.items())}
    res["categories"] = {
        k: {**v, "no_response": dict(v["no_response"]), "statuses": dict(sorted(v["statuses"].items()))}
        for k, v in sorted(per_category.items())
    }
    # per variant of each abuse (what answered what)
    variants: dict[str, Counter[str]] = defaultdict(Counter)
    for rec in records:
        if rec.category not in ("steady", "quiet", "burst", "prewarm", "poison"):
            variants[f"{rec.category}/{rec.variant}"][
                str(rec.status) if rec.status else f"none:{rec.error}"
            ] += 1
    res["statuses_by_variant"] = {k: dict(v) for k, v in sorted(variants.items())}
    heavy = [r for r in records if r.category == "million_messages"]
    res["million_messages"] = [
        {
            "variant": r.variant,
            "status": r.status,
            "error": r.error,
            "seconds": round(r.elapsed, 3),
            "response_bytes": r.resp_bytes,
        }
        for r in heavy
    ]

    # findings
    def describe(rec: Record) -> dict[str, Any]:
        return {
            "category": rec.category,
            "variant": rec.variant,
            "method": rec.method,
            "target": rec.target[:200],
            "route": rec.route,
            "status": rec.status,
            "replica": rec.replica,
            "request_id": rec.request_id,
            "at": round(rec.sent_at - h.started_at, 2),
            "body": rec.body,
            "log": _excerpt(logs.get(rec.replica, []), rec.request_id, rec.sent_at),
        }

    undocumented = [r for r in records if r.status is not None and not r.acceptable]
    server_errors = [r for r in records if r.status is not None and r.status >= 500 and r.status != 503]
    no_retry_after = [r for r in records if r.status == 503 and not r.retry_after]
    accepted = [r for r in records if r.must_refuse and r.status is not None and 200 <= r.status < 300]
    n503 = sum(1 for r in records if r.status == 503)

    def grouped(items: list[Record]) -> list[dict[str, Any]]:
        groups: dict[tuple[str, int | None, str], list[Record]] = defaultdict(list)
        for rec in items:
            groups[(rec.route, rec.status, f"{rec.category}/{rec.variant}")].append(rec)
        return [
            {
                "route": k[0],
                "status": k[1],
                "what": k[2],
                "count": len(v),
                "examples": [describe(r) for r in v[:3]],
            }
            for k, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))
        ]

    res["findings"] = {
        "undocumented": grouped(undocumented),
        "server_errors": grouped(server_errors),
        "503_without_retry_after": grouped(no_retry_after),
        "hostile_accepted": grouped(accepted),
    }

    # held connections
    held: dict[str, Any] = {}
    for kind in ("slowloris", "idle_keepalive", "idle_silent", "slow_body"):
        items = [x for x in h.held if x.kind == kind]
        cut = [
            x
            for x in items
            if h.kill_at_wall is not None
            and x.replica == h.killed_replica
            and x.opened_at <= h.kill_at_wall <= (x.closed_at or time.time()) + 0.5
        ]
        normal = [x for x in items if x not in cut]
        closed = [
            x.closed_at - x.opened_at
            for x in normal
            if x.closed_at is not None and x.outcome != "connect_failed"
        ]
        window_end = h.started_at + h.scale.seconds
        still = [window_end - x.opened_at for x in normal if x.outcome == "still_open"]
        held[kind] = {
            "connections": len(items),
            "outcomes": dict(Counter(x.outcome for x in normal)),
            "statuses": dict(Counter(str(x.status) for x in normal if x.status is not None)),
            "seconds_open_until_server_closed": summarize_plain(closed),
            "seconds_held_open_at_window_end": summarize_plain(still),
            "cut_by_kill": len(cut),
        }
    res["held_connections"] = held
    res["metadata_bloat"] = {
        "cycles": len(h.metadata_cycles),
        "accepted_posts_before_refusal": dict(
            Counter(str(c["accepted_posts"]) for c in h.metadata_cycles if c["refusal"])
        ),
        "refusal_statuses": dict(
            Counter(str(c["refusal"]["status"]) for c in h.metadata_cycles if c["refusal"])
        ),
        "examples": h.metadata_cycles[:4],
    }
    well_behaved = ("steady", "quiet", "burst", "poison", "prewarm", "metadata_bloat", "fat_round")
    res["normal_traffic_without_response"] = [
        {
            "category": r.category,
            "target": r.target[:100],
            "error": r.error,
            "replica": r.replica,
            "at": round(r.sent_at - h.started_at, 2),
            "around_kill": h.kill_at_wall is not None and abs(r.sent_at - h.kill_at_wall) < 2.0,
        }
        for r in records
        if r.category in well_behaved and r.status is None
    ][:30]
    res["fat_rounds"] = h.fat
    res["amplification"] = h.amplification
    res["responses_503"] = [
        {
            "category": r.category,
            "route": r.route,
            "target": r.target[:120],
            "at": round(r.sent_at - h.started_at, 2),
            "replica": r.replica,
            "retry_after": r.retry_after,
            "log": _excerpt(logs.get(r.replica, []), None, r.sent_at)[:5],
        }
        for r in records
        if r.status == 503
    ][:20]

    res["peak_rss_mib"] = {
        f"replica-{r.index}": [
            {
                "pid": inc.pid,
                "peak_rss_mib": round(inc.peak_rss / 2**20, 1),
                "peak_at": round(inc.peak_at - h.started_at, 2) if inc.peak_at else None,
                "end": inc.end,
                "exit_code": inc.exit_code,
            }
            for inc in r.incarnations
        ]
        for r in h.replicas
    }
    res["runner_peaks"] = {f"replica-{k}": v for k, v in sorted(h.runner_peaks.items())}
    in_window = [late for at, late in h.loop_lags if at <= h.scale.seconds]
    res["client_loop_lag"] = {
        "max_seconds": round(h.loop_lag_max, 3),
        "max_in_window_seconds": max(in_window, default=0.0),
        "late_over_50ms_in_window": len(in_window),
        "worst": sorted(h.loop_lags, key=lambda x: -x[1])[:5],
    }
    res["service_logs"] = {f"replica-{i}": _log_summary(lines) for i, lines in logs.items()}
    res["harness_errors"] = h.harness_errors

    integrity = res.get("integrity", {})
    checks = [
        (
            "undocumented_statuses",
            len(undocumented),
            "statuses neither documented for the operation nor edge answers",
        ),
        ("server_errors_not_503", len(server_errors), "5xx other than 503"),
        ("503_without_retry_after", len(no_retry_after), f"503 answers without Retry-After (of {n503})"),
        (
            "lost_acknowledged",
            integrity.get("lost", -1)
            + integrity.get("content_differs", 0)
            + integrity.get("ack_conflicts", 0),
            "201-acknowledged messages missing or different in the table",
        ),
        ("duplicated", integrity.get("duplicated_tokens", -1), "messages stored more than once"),
        ("hostile_accepted", len(accepted), "2xx for input the README says is refused (incl. cross-tenant)"),
        ("sequence_gaps", integrity.get("sequence_gaps", -1), "conversations whose sequences are not 0..n-1"),
    ]
    doc["checks"] = [{"name": n, "value": v, "pass": v == 0, "what": w} for n, v, w in checks]
    doc["summary"] = {
        "requests": len(records),
        "responses": sum(1 for r in records if r.status is not None),
        "undocumented": len(undocumented),
        "server_errors": len(server_errors),
        "responses_503": n503,
        "no_retry_after_503": len(no_retry_after),
        "hostile_accepted": len(accepted),
        "acknowledged": integrity.get("acknowledged_messages"),
        "lost": integrity.get("lost"),
        "duplicated": integrity.get("duplicated_tokens"),
    }


def render(doc: dict[str, Any]) -> str:
    res, meta = doc["results"], doc["meta"]
    out: list[str] = []
    out.append(
        f"\nHostile run {meta['run_id']}: {meta['scale']['seconds']:.0f} s of abuse, 2 replicas "
        f"(`python -m app.cli serve`), concurrency {meta['scale']['concurrency']}, "
        f"total {meta.get('total_seconds')} s"
    )
    out.append("\nRequests by category")
    rows = []
    for name, cat in res.get("categories", {}).items():
        statuses = " ".join(f"{s}:{n}" for s, n in cat["statuses"].items())
        none = " ".join(f"{s}:{n}" for s, n in cat["no_response"].items())
        rows.append([name, cat["requests"], statuses, none or "-", cat["max_seconds"]])
    out.append(table(["category", "requests", "statuses", "no response", "max s"], rows, digits=2))
    out.append("\nStatuses by route template (OpenAPI operation, or the path the edge answered)")
    routes = res.get("statuses_by_route", {})
    width = max((len(r) for r in routes), default=10)
    for route, counts in routes.items():
        out.append(f"  {route:<{width}}  " + " ".join(f"{s}:{n}" for s, n in counts.items()))
    findings = res.get("findings", {})
    for key in ("server_errors", "undocumented", "503_without_retry_after", "hostile_accepted"):
        groups = findings.get(key, [])
        if groups:
            out.append(f"\nFINDINGS: {key}")
            for g in groups[:15]:
                ex = g["examples"][0]
                out.append(
                    f"  {g['count']:>5} x {g['status']} {g['route']} [{g['what']}]"
                    f"  e.g. {ex['method']} {ex['target'][:90]}"
                )
                if ex.get("body"):
                    out.append(f"        body: {ex['body'][:200]}")
                for line in ex.get("log", [])[:6]:
                    out.append(f"        log: {line[:200]}")
    integ = res.get("integrity", {})
    out.append("\nAcknowledged messages vs the messages table")
    out.append(
        table(
            [
                "acknowledged",
                "lost",
                "content differs",
                "duplicated",
                "stored w/o ack",
                "sequence gaps",
                "in table",
            ],
            [
                [
                    integ.get("acknowledged_messages"),
                    integ.get("lost"),
                    integ.get("content_differs"),
                    integ.get("duplicated_tokens"),
                    integ.get("stored_without_ack"),
                    integ.get("sequence_gaps"),
                    integ.get("messages_in_db"),
                ]
            ],
        )
    )
    out.append("\nPeak RSS per replica process (MiB)")
    rows = []
    for name, incs in res.get("peak_rss_mib", {}).items():
        for inc in incs:
            rows.append([name, inc["pid"], inc["peak_rss_mib"], inc["peak_at"], inc["end"]])
    out.append(table(["replica", "pid", "peak RSS", "at s", "ended"], rows))
    out.append(
        "\nSummary lag (s): a quiet tenant's round POST -> first completed summary covering it "
        "(tenant A: memory row created -> completed)"
    )
    rows = []
    for name, lag in res.get("summary_lag", {}).items():
        if not isinstance(lag, dict):
            continue
        s = lag["seconds"]
        if "rounds" in lag:
            counts = f"{lag['rounds_marked_due']} marked due, {lag['never_covered']} never covered"
        else:
            counts = " ".join(f"{k}:{v}" for k, v in lag["statuses"].items())
        rows.append(
            [name, lag.get("rounds", lag.get("summaries")), s["count"], s["p50"], s["p99"], s["max"], counts]
        )
    out.append(table(["of", "rounds/rows", "covered", "p50", "p99", "max", ""], rows, digits=2))
    slowest = res.get("summary_lag", {}).get("slowest", [])
    if slowest:
        out.append(
            "  slowest B/C: "
            + "; ".join(
                f"{x['conversation_id']} round {x['round']} at {x['at']}s on replica {x['replica']}: "
                f"{x['lag'] if x['lag'] is not None else 'never covered'}"
                f"{'s' if x['lag'] is not None else ''}"
                for x in slowest[:4]
            )
        )
    out.append("\nHeld connections")
    rows = []
    for kind, h in res.get("held_connections", {}).items():
        s = h["seconds_open_until_server_closed"]
        o = h["seconds_held_open_at_window_end"]
        rows.append(
            [
                kind,
                h["connections"],
                " ".join(f"{k}:{v}" for k, v in h["outcomes"].items()),
                " ".join(f"{k}:{v}" for k, v in h["statuses"].items()) or "-",
                s["p50"],
                s["max"],
                o["max"],
                h["cut_by_kill"],
            ]
        )
    out.append(
        table(
            [
                "kind",
                "conns",
                "outcomes",
                "statuses",
                "closed p50 s",
                "closed max s",
                "open at end s",
                "cut by kill",
            ],
            rows,
            digits=2,
        )
    )
    if res.get("million_messages"):
        out.append("\nA million tiny messages (and the most that fit under the limit)")
        rows = [
            [m["variant"], m["status"] or m["error"], m["seconds"], m["response_bytes"]]
            for m in res["million_messages"][:12]
        ]
        out.append(table(["variant", "status", "seconds", "response bytes"], rows, digits=2))
    if res.get("amplification"):
        out.append("\nAmplification probes (after the window, alone; a bystander reads tenant B's context)")
        rows = [
            [
                a["variant"],
                a["replica"],
                a["status"] or a["error"],
                a["seconds"],
                round(a["response_bytes"] / 2**20, 1),
                a["rss_before_mib"],
                a["rss_peak_mib"],
                a["rss_after_mib"],
                a["bystander_max_seconds"],
                " ".join(f"{k}:{v}" for k, v in a["bystander_failures"].items()) or "-",
            ]
            for a in res["amplification"]
        ]
        out.append(
            table(
                [
                    "variant",
                    "replica",
                    "status",
                    "seconds",
                    "resp MiB",
                    "RSS before",
                    "RSS peak",
                    "RSS after",
                    "bystander max s",
                    "bystander failed",
                ],
                rows,
                digits=2,
            )
        )
    mb = res.get("metadata_bloat", {})
    out.append(
        f"\nMetadata bloat: {mb.get('cycles')} conversations; accepted POSTs before refusal "
        f"{mb.get('accepted_posts_before_refusal')}; refused with {mb.get('refusal_statuses')}"
    )
    p = res.get("poison", {})
    out.append(
        f"Poisoned conversation: {p.get('rounds')} rounds, memories {p.get('memories')}, "
        f"LLM calls answered 500: {res.get('llm', {}).get('poisoned')}"
    )
    out.append(f"Events: {res.get('events')}")
    out.append(f"Drain: {res.get('drain')}; memory statuses {res.get('memory_statuses')}")
    lag = res.get("client_loop_lag", {})
    out.append(
        f"This client's event loop: at most {lag.get('max_in_window_seconds')} s late during the window "
        f"({lag.get('late_over_50ms_in_window')} times > 50 ms), {lag.get('max_seconds')} s overall; "
        f"worst (s into run, s late): {lag.get('worst')}"
    )
    for name, s in res.get("service_logs", {}).items():
        out.append(f"{name} log: {s['errors']} ERROR, {s['warnings']} WARNING, {s['tracebacks']} tracebacks")
        for kind, n in s["error_kinds"][:5]:
            out.append(f"    {n} x {kind}")
    if res.get("harness_errors"):
        out.append(f"\nSUITE ERRORS: {len(res['harness_errors'])}")
        for e in res["harness_errors"][:5]:
            out.append("  " + e[-600:])
    out.append("\nChecks")
    out.append(
        table(
            ["check", "value", "pass", "what"],
            [[c["name"], c["value"], c["pass"], c["what"]] for c in doc["checks"]],
        )
    )
    return "\n".join(out)


# ---- command line -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hostile", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--scale", choices=sorted(SCALES), default="full", help="run sizes (default: full, ~60 s of abuse)"
    )
    parser.add_argument("--seconds", type=float, help="seconds of abuse (default: 60 full, 15 tiny)")
    parser.add_argument("--concurrency", type=int, help="requests in flight (default: 50 full, 24 tiny)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER_URL),
        help="any database on the PostgreSQL server; the suite creates and drops its own there "
        "(env BENCH_DATABASE_URL; default %(default)s)",
    )
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR, help="JSON and logs go here")
    parser.add_argument(
        "--output", type=Path, help="JSON file (default: RESULTS_DIR/hostile-SCALE-TIME.json)"
    )
    parser.add_argument("--keep-database", action="store_true", help="do not drop the database")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the abuse mix")
    parser.add_argument(
        "--no-amplification",
        action="store_true",
        help="skip the bodies that make the service build an error per item (run after the window)",
    )
    parser.add_argument(
        "--service-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra setting for the replicas",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    scale = SCALES[args.scale]
    changes: dict[str, Any] = {}
    if args.seconds is not None:
        if args.seconds < 5:
            print("--seconds must be at least 5", file=sys.stderr)
            return 2
        changes["seconds"] = args.seconds
    if args.concurrency is not None:
        changes["concurrency"] = max(4, args.concurrency)
    if args.no_amplification:
        changes["amplification"] = ()
    if changes:
        scale = dataclasses.replace(scale, name=f"{scale.name}-custom", **changes)
    service_env = {}
    for pair in args.service_env:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            print(f"--service-env expects KEY=VALUE, got {pair!r}", file=sys.stderr)
            return 2
        service_env[key] = value
    opts = Options(
        scale=scale,
        database_url=args.database_url,
        results_dir=args.results_dir,
        output=args.output,
        keep_database=args.keep_database,
        seed=args.seed,
        service_env=service_env,
    )
    hostile = Hostile(opts)
    print(
        f"hostile: scale {scale.name}, {scale.seconds:.0f} s of abuse; logs in {hostile.log_dir}", flush=True
    )
    try:
        doc = asyncio.run(hostile.run())
        analyse(hostile, doc)
    except KeyboardInterrupt:
        print("hostile: interrupted", file=sys.stderr)
        return 2
    except Exception:
        traceback.print_exc()
        print(f"hostile: failed; process logs in {hostile.log_dir}", file=sys.stderr)
        return 2
    output = opts.output or opts.results_dir / f"hostile-{scale.name}-{hostile.stamp}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str))
    print(render(doc))
    print(f"\nJSON: {output}")
    if doc["results"].get("harness_errors"):
        print("hostile: the suite itself failed (see SUITE ERRORS)", file=sys.stderr)
        return 2
    if not all(c["pass"] for c in doc["checks"]):
        print("hostile: a check FAILED", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
