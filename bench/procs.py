"""Child processes: start on a free port, wait until healthy, measure CPU, stop."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent


class ProcessFailed(RuntimeError):
    pass


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: this one's, less any setting of the service (a
    developer's MEMORY_*, OPENAI_*, DATABASE_* or FLOOR_* must not leak in), plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("MEMORY_", "OPENAI_", "DATABASE_", "FLOOR_"))
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


async def migrate(db_url: str, log_dir: Path, env: Mapping[str, str]) -> None:
    """``python -m app.cli migrate`` (what `memory-service migrate` runs) on ``db_url``."""
    log = log_dir / "migrate.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app.cli",
            "migrate",
            cwd=log_dir,
            env={**env, "DATABASE_URL": db_url, "LOG_LEVEL": "WARNING"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        code = await proc.wait()
    if code != 0:
        raise RuntimeError(f"`memory-service migrate` failed ({code}):\n{log.read_text()[-2000:]}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Linux: the child gets SIGTERM if the harness dies without cleaning up (kill -9, OOM).
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _prepare_child(cpus: Collection[int] | None) -> Callable[[], None] | None:
    """What a child runs between fork and exec: die with the harness, and run on ``cpus`` only
    when given (its threads inherit it); None where that is not Linux."""
    if sys.platform != "linux":
        return None

    def prepare() -> None:  # pragma: no cover - runs in the child
        _die_with_parent()
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return prepare


def pin_tree(pid: int, cpus: Collection[int]) -> dict[int, set[int]]:
    """Run process ``pid`` and its children on ``cpus`` (children it forks later inherit it);
    returns each one's CPUs before, for :func:`unpin_tree`."""
    before: dict[int, set[int]] = {}
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            before[proc.pid] = os.sched_getaffinity(proc.pid)
            os.sched_setaffinity(proc.pid, cpus)
    return before


def unpin_tree(pid: int, before: Mapping[int, set[int]]) -> None:
    """Undo :func:`pin_tree`: each process back on its CPUs, and those forked meanwhile on the
    CPUs ``pid`` had."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                os.sched_setaffinity(proc.pid, before.get(proc.pid, before[pid]))


@dataclass
class Child:
    name: str
    proc: asyncio.subprocess.Process
    base_url: str
    log_path: Path
    _log: IO[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.returncode is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        """User + system CPU of the process and its children (uvicorn --workers)."""
        try:
            proc = psutil.Process(self.pid)
            total = 0.0
            for p in [proc, *proc.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = p.cpu_times()
                    total += times.user + times.system
            return total
        except psutil.Error:
            return 0.0

    async def stop(self, grace_seconds: float = 30.0) -> int | None:
        """SIGTERM (uvicorn shuts down gracefully), SIGKILL after ``grace_seconds``."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), grace_seconds)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        self._log.close()
        return self.proc.returncode


async def wait_healthy(child: Child, path: str, limit_seconds: float) -> None:
    """Poll ``path`` until it answers 200; fail at once if the process exits."""
    deadline = time.monotonic() + limit_seconds
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            if not child.alive():
                raise ProcessFailed(
                    f"{child.name} exited with {child.proc.returncode}; log tail:\n{child.log_tail()}"
                )
            try:
                response = await client.get(child.base_url + path)
                if response.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise ProcessFailed(
                    f"{child.name} not healthy after {limit_seconds:.0f}s; log tail:\n{child.log_tail()}"
                )
            await asyncio.sleep(0.05)


async def launch(
    name: str,
    argv_for_port: Callable[[int], list[str]],
    *,
    env: Mapping[str, str],
    cwd: Path,
    log_path: Path,
    health_path: str,
    limit_seconds: float = 60.0,
    cpus: Collection[int] | None = None,
) -> Child:
    """Start a server on a free port and wait for it; retry when another process took the port.
    With ``cpus``, it runs on those CPUs only (else on the harness's)."""
    for attempt in range(3):
        port = free_port()
        log = log_path.open("ab")
        proc = await asyncio.create_subprocess_exec(
            *argv_for_port(port),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_prepare_child(cpus),
        )
        child = Child(name=name, proc=proc, base_url=f"http://127.0.0.1:{port}", log_path=log_path, _log=log)
        try:
            await wait_healthy(child, health_path, limit_seconds)
        except ProcessFailed:
            await child.stop()
            if attempt < 2 and "address already in use" in child.log_tail().lower():
                continue
            raise
        return child
    raise AssertionError("unreachable")


async def launch_quiet(
    name: str,
    argv: list[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    log_path: Path,
    ready_text: str,
    limit_seconds: float = 60.0,
) -> Child:
    """Start a process that serves no HTTP (a summary worker) and wait until its log shows
    ``ready_text``; fail at once if it exits."""
    log = log_path.open("ab")
    start = log.tell()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_prepare_child(None),
    )
    child = Child(name=name, proc=proc, base_url="", log_path=log_path, _log=log)
    deadline = time.monotonic() + limit_seconds
    while True:
        with log_path.open("rb") as read:
            read.seek(start)
            if ready_text.encode() in read.read():
                return child
        if not child.alive():
            raise ProcessFailed(f"{name} exited with {proc.returncode}; log tail:\n{child.log_tail()}")
        if time.monotonic() > deadline:
            await child.stop()
            raise ProcessFailed(f"{name} not ready after {limit_seconds:.0f}s; log tail:\n{child.log_tail()}")
        await asyncio.sleep(0.05)


def postmaster_of(backend_pid: int) -> int | None:
    """The postmaster of a local backend (its parent process), or None when not local."""
    with contextlib.suppress(psutil.Error):
        parent = psutil.Process(backend_pid).parent()
        if parent is not None and parent.name() == "postgres":
            return parent.pid
    return None


def cpu_of(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds of each of these processes that is alive."""
    out: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            out[pid] = times.user + times.system
    return out


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used between two :func:`cpu_of` snapshots by the processes alive at the second (a
    process that started meanwhile counts whole; one that ended meanwhile is not counted, so
    the result is never negative)."""
    return sum(max(0.0, seconds - before.get(pid, 0.0)) for pid, seconds in after.items())


def machine_busy_seconds() -> float:
    """CPU seconds spent by the whole machine (all cores, not idle or waiting for I/O)."""
    times = psutil.cpu_times()
    busy = times.user + times.system + getattr(times, "nice", 0.0)
    return float(busy + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0))
