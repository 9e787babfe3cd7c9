"""Orchestration: a fresh database, the processes (fake LLM, service, floor), load runs in a
separate load-generator process, and the results document."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from app.settings import Settings
from bench import wrk
from bench.db import create_database, drop_database, new_database_name, redact
from bench.procs import (
    Child,
    child_env,
    cpu_delta,
    cpu_of,
    launch,
    launch_quiet,
    machine_busy_seconds,
    migrate,
    pin_tree,
    postmaster_of,
    unpin_tree,
)
from bench.scales import Scale, mixed_prefix, sizing_backlog, sizing_prefix
from bench.seed import CONTEXT_PREFIXES, POLICIES, ConversationSeed, Seeder, vacuum_analyze
from bench.textgen import rng_for

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS_DIR = ROOT / "bench" / "results"
SCENARIOS = ("context", "post", "mixed", "floor", "tokens", "transfer", "counting", "append", "sizing")


@dataclass
class Options:
    scale: Scale
    scenarios: tuple[str, ...]
    database_url: str
    results_dir: Path = DEFAULT_RESULTS_DIR
    output: Path | None = None
    loadgen: str = "auto"  # auto | python | wrk
    keep_database: bool = False
    strict: bool = False
    profile: bool = False
    workers: int = 1
    log_level: str = "INFO"
    approx_tokens: bool = False
    service_env: dict[str, str] = field(default_factory=dict)
    append_deployments: tuple[str, ...] = ()  # empty: every one
    # The mixed scenario's deployment: 0 is the main service (API and summaries in one process),
    # N an API replica with summaries off and N `memory-service worker` processes.
    mixed_workers: int = 0
    # The CPU the service's HTTP processes (main service, API replicas, floors) run on alone;
    # everything else (workers, load generator, fake LLM, PostgreSQL, the harness) on the others.
    api_core: int | None = None


class ServiceSettings(Settings):
    """The settings of a service the harness starts: the values it is given and the defaults,
    never this process's environment or a .env file (the children do not see those either)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _git_dirty() -> bool | None:
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--", "app", "migrations", "pyproject.toml"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip())


def summarize_collapsed(path: Path, top: int = 25) -> dict[str, Any]:
    """Top functions of a py-spy ``--format raw`` profile (collapsed stacks): by self samples
    and by inclusive samples."""
    self_counts: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {"samples": 0}
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        self_counts[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return {
        "samples": total,
        "self": [(f, round(100 * c / total, 1)) for f, c in self_counts.most_common(top)] if total else [],
        "inclusive": [(f, round(100 * c / total, 1)) for f, c in inclusive.most_common(top)] if total else [],
    }


class Bench:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.scale = opts.scale
        self.stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_id = f"{self.scale.name}-{self.stamp}-{os.getpid()}"
        self.results_dir = opts.results_dir
        self.log_dir = self.results_dir / "logs" / self.run_id
        # What the service runs with (its defaults and --service-env), for the seeder and the
        # scenarios that depend on the policy's parameters.
        self.settings = ServiceSettings.model_validate(
            {"OPENAI_API_KEY": "bench-not-a-real-key", **opts.service_env}
        )
        self.window_size = self.settings.MEMORY_ROLLING_WINDOW_SIZE
        self.db_name = new_database_name()
        self.db_url = ""
        self.pool: asyncpg.Pool | None = None
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(30.0))
        self.llm: Child | None = None
        self.service: Child | None = None
        self.floor: Child | None = None
        # API replicas, workers and floors started by a scenario (stopped by it, or at teardown).
        self.extra: list[Child] = []
        self.service_env: dict[str, str] = {}
        self.postgres_local = False
        self.wrk_exe: str | None = None
        # --api-core: the CPUs of the service's HTTP processes, and PostgreSQL's CPUs before
        # the run moved it off them (restored at teardown).
        self.api_cpus: set[int] | None = None
        self.postgres_pinned: tuple[int, dict[int, set[int]]] | None = None
        self.timings: dict[str, float] = {}
        self.profiles: dict[str, Any] = {}

    # ---- helpers used by the scenarios ------------------------------------------------------

    @property
    def db(self) -> asyncpg.Pool:
        assert self.pool is not None
        return self.pool

    @property
    def svc(self) -> Child:
        assert self.service is not None
        return self.service

    def child_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return child_env(extra)

    async def llm_control(self, **control: Any) -> dict[str, Any]:
        assert self.llm is not None
        response = await self.http.post(self.llm.base_url + "/_control", json=control)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    async def llm_captured(self) -> dict[str, Any]:
        assert self.llm is not None
        response = await self.http.get(self.llm.base_url + "/_captured")
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    async def runner_stats(self, api: Child) -> dict[str, Any]:
        """GET /ops/runner of ``api``: the summary work across every runner, and that
        process's runner."""
        response = await self.http.get(api.base_url + "/ops/runner")
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    async def postgres_cpu(self) -> dict[int, float]:
        """CPU seconds so far of the PostgreSQL processes that work for this run: the backends
        of its database and the server's background processes (WAL writer, checkpointer, ...,
        shared with other databases on the server); empty when the server is not local. Compare
        two snapshots with :func:`bench.procs.cpu_delta`: backends that ended between them are
        not counted (short-lived connections, e.g. a pool's overflow, are missed)."""
        if not self.postgres_local:
            return {}
        rows = await self.db.fetch(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() OR backend_type <> 'client backend'"
        )
        return cpu_of([int(r["pid"]) for r in rows])

    async def due_work(self) -> dict[str, int]:
        """Summary work left in the database, whoever runs it: conversations marked due (not yet
        planned, or planned while a summary of theirs ran) and 'processing' rows (running, or
        queued for a runner)."""
        row = await self.db.fetchrow(
            """
            SELECT (SELECT count(*) FROM conversations WHERE summary_due_at IS NOT NULL) AS due,
                   count(*) FILTER (WHERE lease_expires_at > now()) AS running,
                   count(*) FILTER (WHERE lease_expires_at IS NULL OR lease_expires_at <= now()) AS queued
            FROM memory WHERE status = 'processing'
            """
        )
        return {"due": int(row["due"]), "running": int(row["running"]), "queued": int(row["queued"])}

    async def wait_idle(self, limit_seconds: float) -> dict[str, Any]:
        """Drain: wait until no conversation is due and no summary is running or queued (read
        from the database, so it holds for every runner). ``due_left`` is what was still due
        when it returned: 0 unless it timed out."""
        started = time.perf_counter()
        while True:
            work = await self.due_work()
            elapsed = time.perf_counter() - started
            idle = work["due"] == 0 and work["running"] == 0 and work["queued"] == 0
            if idle or elapsed > limit_seconds:
                return {
                    "seconds": round(elapsed, 3),
                    "timed_out": not idle,
                    "due_left": work["due"],
                    "processing_left": work["running"] + work["queued"],
                }
            await asyncio.sleep(0.1)

    async def run_load(
        self,
        spec: dict[str, Any],
        *,
        target: Child | Sequence[Child],
        label: str,
        also: Sequence[Child] = (),
    ) -> dict[str, Any]:
        """One load run from a separate process (wrk for plain GET runs when chosen, else the
        Python load generator), with the CPU the target(s), the processes in ``also`` (workers)
        and PostgreSQL used meanwhile. Several targets: the load is spread over them (append
        runs only); ``cpu_seconds`` has each process's total."""
        targets = [target] if isinstance(target, Child) else list(target)
        target = targets[0]
        spec = {**spec, "base_url": target.base_url, "base_urls": [t.base_url for t in targets]}
        watched = [*targets, *also]
        cpu0 = [c.cpu_seconds() for c in watched]
        wall0, db0 = time.perf_counter(), await self.postgres_cpu()
        machine0 = machine_busy_seconds()
        profilers = (
            {f"{label}-{c.name}": await self._start_profiler(f"{label}-{c.name}", c) for c in watched}
            if self.opts.profile
            else {}
        )
        try:
            if spec["kind"] == "get" and self.wrk_exe is not None:
                result = await wrk.run_get(
                    self.wrk_exe,
                    target.base_url,
                    spec["paths"],
                    int(spec["concurrency"]),
                    float(spec["warmup_seconds"]),
                    float(spec["duration_seconds"]),
                )
            else:
                result = await self._python_loadgen(spec)
        finally:
            for name, profiler in profilers.items():
                await self._stop_profiler(name, profiler)
        wall = time.perf_counter() - wall0
        used = {c.name: c.cpu_seconds() - before for c, before in zip(watched, cpu0, strict=True)}
        db_used = cpu_delta(db0, await self.postgres_cpu())
        result["label"] = label
        result["cpu_cores"] = {
            **{name: round(seconds / wall, 2) for name, seconds in used.items()},
            "postgres": round(db_used / wall, 2),
            # everything on the machine, load generator and other tenants included
            "machine": round((machine_busy_seconds() - machine0) / wall, 2),
        }
        result["cpu_seconds"] = {
            **{name: round(seconds, 3) for name, seconds in used.items()},
            "postgres": round(db_used, 3),
        }
        result["wall_seconds"] = round(wall, 3)
        if self.postgres_pinned is not None:
            # --api-core: where each process ran (PostgreSQL: its postmaster, which backends
            # inherit from)
            result["cpus"] = {
                **{c.name: sorted(os.sched_getaffinity(c.pid)) for c in watched},
                "postgres": sorted(os.sched_getaffinity(self.postgres_pinned[0])),
            }
        for child in watched:
            if not child.alive():
                raise RuntimeError(f"{child.name} died during {label}:\n{child.log_tail()}")
        return result

    async def _python_loadgen(self, spec: dict[str, Any]) -> dict[str, Any]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.loadgen",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=ROOT,
            env=self.child_env(),
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(orjson.dumps(spec)), timeout=7200)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0:
            raise RuntimeError(
                f"load generator failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}"
            )
        result: dict[str, Any] = orjson.loads(out)
        return result

    async def _start_profiler(self, label: str, target: Child) -> asyncio.subprocess.Process:
        exe = shutil.which("py-spy")
        if exe is None:
            raise RuntimeError("--profile needs py-spy on PATH")
        out = self.log_dir / f"profile-{label}.txt"
        args = [exe, "record", "--pid", str(target.pid), "--rate", "200", "--format", "raw"]
        if self.opts.workers > 1:
            args.append("--subprocesses")
        proc = await asyncio.create_subprocess_exec(
            *args,
            "--output",
            str(out),
            "--nonblocking",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return proc

    async def _stop_profiler(self, label: str, proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(proc.wait(), timeout=30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        self.profiles[label] = summarize_collapsed(self.log_dir / f"profile-{label}.txt")

    # ---- set-up and tear-down -----------------------------------------------------------------

    @functools.cached_property
    def seeder(self) -> Seeder:
        """The seeder, with the policy parameters the service is started with (rolling blocks:
        the policy's defaults)."""
        return Seeder(
            policy_defaults=self.settings.policy_defaults,
            max_chars=self.settings.MEMORY_SUMMARY_MAX_CHARS,
            history=self.scale.memory_history,
            model=self.settings.MEMORY_MODEL,
        )

    def seeds(self) -> list[ConversationSeed]:
        chosen = set(self.opts.scenarios)
        seeds: list[ConversationSeed] = []
        if chosen & {"context", "floor"}:
            # Scenario 1 runs per policy: ctx-N (sliding window, a gap of 4 after the latest
            # memory) and blocks-N (rolling blocks, every full block summarized).
            seeds += [
                ConversationSeed(f"{CONTEXT_PREFIXES[policy]}-{n}", n, gap=4, policy=policy)
                for policy in POLICIES
                for n in self.scale.context_sizes
            ]
        if "post" in chosen:
            for prefix in ("post-fast", "post-slow"):
                seeds += [
                    ConversationSeed(f"{prefix}-{i}", 10, gap=4) for i in range(self.scale.post_conversations)
                ]
        if "mixed" in chosen:
            # The same histories (0-10 rounds) for every LLM latency's run, each on its own set.
            for k in range(len(self.scale.mixed_llm_latencies)):
                rng = rng_for("bench-mixed-history")
                for i in range(self.scale.mixed_conversations):
                    rounds = rng.randint(0, 10)
                    seeds.append(ConversationSeed(f"{mixed_prefix(k)}-{i}", 2 * rounds, gap=2))
        if "append" in chosen:
            # A short history, so every measured POST takes the path of an existing conversation.
            seeds += [ConversationSeed(f"app-{i}", 10, gap=4) for i in range(self.scale.append_conversations)]
        if "sizing" in chosen:
            for cap in self.scale.sizing_caps:
                seeds += [
                    ConversationSeed(f"{sizing_prefix(cap)}-{i}", 16, gap=4)
                    for i in range(sizing_backlog(self.scale, cap))
                ]
        return seeds

    async def _migrate(self) -> None:
        await migrate(self.db_url, self.log_dir, self.child_env())

    async def setup(self) -> dict[str, Any]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.opts.loadgen in ("auto", "wrk"):
            self.wrk_exe = wrk.wrk_path()
            if self.wrk_exe is None and self.opts.loadgen == "wrk":
                raise RuntimeError("--loadgen wrk: wrk is not installed (Debian: apt-get install wrk)")
        if self.opts.profile and shutil.which("py-spy") is None:
            raise RuntimeError("--profile needs py-spy on PATH (e.g. `uv tool install py-spy`)")
        if self.opts.api_core is not None:
            self._split_cpus(self.opts.api_core)
        t0 = time.perf_counter()
        self.db_url = await create_database(self.opts.database_url, self.db_name)
        await self._migrate()
        self.timings["create_and_migrate_seconds"] = round(time.perf_counter() - t0, 2)

        t0 = time.perf_counter()
        self.pool = await asyncpg.create_pool(self.db_url, min_size=1, max_size=3)
        # Whether the server runs on this machine, so that its processes' CPU can be measured.
        postmaster = postmaster_of(await self.db.fetchval("SELECT pg_backend_pid()"))
        self.postgres_local = postmaster is not None
        if self.api_cpus is not None:
            if postmaster is None:
                raise RuntimeError("--api-core needs PostgreSQL on this machine (to move it off that CPU)")
            others = os.sched_getaffinity(0)
            self.postgres_pinned = (postmaster, pin_tree(postmaster, others))
        async with self.db.acquire() as conn:
            seeded = await self.seeder.seed(conn, self.seeds())
            await vacuum_analyze(conn)
        self.timings["seed_seconds"] = round(time.perf_counter() - t0, 2)

        t0 = time.perf_counter()
        self.llm = await launch(
            "fake-llm",
            lambda port: [sys.executable, "-m", "bench.fake_llm", "--port", str(port)],
            env=self.child_env(),
            cwd=ROOT,
            log_path=self.log_dir / "fake_llm.log",
            health_path="/healthz",
        )
        self.service_env = self.child_env(
            {
                "DATABASE_URL": self.db_url,
                "OPENAI_API_KEY": "bench-not-a-real-key",
                "OPENAI_BASE_URL": self.llm.base_url + "/v1",
                "MEMORY_SUMMARIZER": "openai",
                "LOG_LEVEL": self.opts.log_level,
                **self.opts.service_env,
            }
        )
        await self.start_main_service()
        if "floor" in self.opts.scenarios:
            self.floor = await self._launch_floor("floor")
        self.timings["start_processes_seconds"] = round(time.perf_counter() - t0, 2)
        return seeded

    def _split_cpus(self, core: int) -> None:
        """--api-core: this process (and so every child not started on ``core``) leaves it."""
        mine = os.sched_getaffinity(0)
        if core not in mine or len(mine) < 2:
            raise RuntimeError(
                f"--api-core {core}: this process may run on CPUs {sorted(mine)}: needs it and another"
            )
        self.api_cpus = {core}
        os.sched_setaffinity(0, mine - {core})

    def _uvicorn(self, app_path: str) -> Callable[[int], list[str]]:
        """As in production: uvicorn, no reload, access log off. The working directory is the
        run's log folder so a developer's .env cannot change the settings under test."""
        workers = ["--workers", str(self.opts.workers)] if self.opts.workers > 1 else []
        return lambda port: [
            sys.executable,
            "-m",
            "uvicorn",
            app_path,
            "--no-access-log",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--app-dir",
            str(ROOT),
            *workers,
        ]

    async def _launch_floor(self, name: str, extra: dict[str, str] | None = None) -> Child:
        # The same pool size as the service's, so the comparison is like for like.
        pool_size = str(self.settings.DATABASE_POOL_SIZE)
        return await launch(
            name,
            self._uvicorn("bench.floor_app:app"),
            env=self.child_env(
                {"FLOOR_DATABASE_URL": self.db_url, "FLOOR_POOL_SIZE": pool_size, **(extra or {})}
            ),
            cwd=self.log_dir,
            log_path=self.log_dir / f"{name}.log",
            health_path="/healthz",
            cpus=self.api_cpus,
        )

    async def start_floor(self, name: str) -> Child:
        """A floor app for a write run (its read pool is not opened up front)."""
        child = await self._launch_floor(name, {"FLOOR_READ_POOL_MIN": "1"})
        self.extra.append(child)
        return child

    async def start_replica(self, name: str, env: dict[str, str] | None = None) -> Child:
        """Another API replica of the service (uvicorn app.main:app) with the run's settings plus
        ``env`` (e.g. MEMORY_RUN_SUMMARIES=false), logging to <name>.log."""
        child = await launch(
            name,
            self._uvicorn("app.main:app"),
            env={**self.service_env, **(env or {})},
            cwd=self.log_dir,
            log_path=self.log_dir / f"{name}.log",
            health_path="/readyz",
            cpus=self.api_cpus,
        )
        self.extra.append(child)
        return child

    async def start_worker(self, name: str, env: dict[str, str] | None = None) -> Child:
        """A `memory-service worker` process (python -m app.cli worker --no-migrate) with the
        run's settings plus ``env``; returns once it says it runs."""
        child = await launch_quiet(
            name,
            [sys.executable, "-m", "app.cli", "worker", "--no-migrate"],
            env={**self.service_env, **(env or {})},
            cwd=self.log_dir,
            log_path=self.log_dir / f"{name}.log",
            ready_text="Worker running",
        )
        self.extra.append(child)
        return child

    async def stop_child(self, child: Child) -> None:
        await child.stop()
        if child in self.extra:
            self.extra.remove(child)

    async def start_main_service(self) -> None:
        """Start the run's main service (summaries on, logging to service.log)."""
        self.service = await launch(
            "service",
            self._uvicorn("app.main:app"),
            env=self.service_env,
            cwd=self.log_dir,
            log_path=self.log_dir / "service.log",
            health_path="/readyz",
            cpus=self.api_cpus,
        )

    async def stop_main_service(self) -> None:
        """Stop the run's main service (summaries on): a scenario that starts its own runners
        must not have it claim their due work. Scenarios after it cannot use it, unless the
        scenario starts it again (:meth:`start_main_service`)."""
        if self.service is not None and self.service.alive():
            await self.service.stop()

    async def teardown(self) -> None:
        for child in (*self.extra, self.service, self.floor, self.llm):
            if child is not None:
                with contextlib.suppress(Exception):
                    await child.stop()
        if self.postgres_pinned is not None:
            unpin_tree(*self.postgres_pinned)
        await self.http.aclose()
        if self.pool is not None:
            with contextlib.suppress(Exception):
                await self.pool.close()
        if self.db_url and not self.opts.keep_database:
            await drop_database(self.opts.database_url, self.db_name)

    def service_log_summary(self) -> dict[str, Any]:
        """Warnings and errors of every service process: the main one, replicas and workers."""
        lines: list[str] = []
        for path in sorted(self.log_dir.glob("*.log")):
            if path.name.startswith(("service", "api-", "combined-", "worker")):
                with contextlib.suppress(OSError):
                    lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
        if not lines:
            return {}
        warnings = [line for line in lines if " WARNING " in line]
        errors = [line for line in lines if " ERROR " in line or line.startswith("Traceback")]
        kinds = Counter(line.split("] ", 1)[-1][:80] for line in warnings)
        return {
            "warnings": len(warnings),
            "errors": len(errors),
            "top_warnings": kinds.most_common(5),
            "first_errors": errors[:5],
        }

    # ---- the run --------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        from bench import scenarios

        began = time.perf_counter()
        results: dict[str, Any] = {}
        meta: dict[str, Any] = {
            "run_id": self.run_id,
            "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": " ".join([os.path.basename(sys.executable), "-m", "bench", *sys.argv[1:]]),
            "scale": asdict(self.scale),
            "scenarios": list(self.opts.scenarios),
            "git_commit": _git_commit(),
            "app_tree_dirty": _git_dirty(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "database_server": redact(self.opts.database_url),
            "database": self.db_name,
            "workers": self.opts.workers,
            "api_core": self.opts.api_core,
            "service_env_overrides": self.opts.service_env,
            "log_level": self.opts.log_level,
            "log_dir": str(self.log_dir),
        }
        try:
            meta["seeded"] = await self.setup()
            meta["loadgen"] = "wrk (GET runs) + python (others)" if self.wrk_exe else "python"
            async with self.db.acquire() as conn:
                meta["postgres"] = await conn.fetchval("SHOW server_version")
            chosen = set(self.opts.scenarios)
            if chosen & {"context", "floor"}:
                t0 = time.perf_counter()
                results.update(
                    await scenarios.context_and_floor(self, "context" in chosen, "floor" in chosen)
                )
                if self.floor is not None:
                    # Its pool holds DATABASE_POOL_SIZE connections open; nothing else uses it.
                    await self.floor.stop()
                self.timings["context_floor_seconds"] = round(time.perf_counter() - t0, 1)
            # In this order: append and sizing start runners of their own, so they stop the main
            # service first (for good).
            for name, run in (
                ("post", scenarios.post_latency),
                ("mixed", scenarios.mixed),
                ("tokens", scenarios.tokens),
                ("transfer", scenarios.transfer),
                ("counting", scenarios.counting),
                ("append", scenarios.append_throughput),
                ("sizing", scenarios.summary_concurrency),
            ):
                if name in chosen:
                    t0 = time.perf_counter()
                    results[name] = await run(self)
                    self.timings[f"{name}_seconds"] = round(time.perf_counter() - t0, 1)
        finally:
            await self.teardown()
            meta["service_log"] = self.service_log_summary()
            meta["timings"] = self.timings
            meta["total_seconds"] = round(time.perf_counter() - began, 1)
        if self.profiles:
            meta["profiles"] = self.profiles
        return {"meta": meta, "results": results}
