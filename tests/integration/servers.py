"""The service as a separate OS process, started with the real command (`memory-service serve`),
for multi-replica, kill -9, SIGTERM and socket-level tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    def __init__(self, env: dict[str, str], log: Path, args: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log_path = log
        self._log: IO[bytes] = log.open("ab")
        full_env = {**os.environ, **env}
        # The test database is migrated once per run, so each process skips the migration.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", *self.command(), "--no-migrate", *args],
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def command(self) -> list[str]:
        return ["serve", "--host", "127.0.0.1", "--port", str(self.port)]

    def wait_ready(self, within: float = 60.0) -> ServerProcess:
        """Wait until the process serves (a worker: until it runs), or fail with its log."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log_text()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {within}s:\n{self.log_text()}")

    def log_text(self) -> str:
        self._log.flush()
        return self._log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in an OOM kill or a lost node."""
        self.process.kill()
        self.process.wait(10)

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def wait(self, within: float = 30.0) -> int:
        return self.process.wait(within)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


class WorkerProcess(ServerProcess):
    """`memory-service worker`: summaries only, no HTTP (its port is unused)."""

    def command(self) -> list[str]:
        return ["worker"]

    def wait_ready(self, within: float = 60.0) -> WorkerProcess:
        deadline = time.monotonic() + within
        while "Worker running" not in self.log_text():
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.log_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker not running after {within}s:\n{self.log_text()}")
            time.sleep(0.05)
        return self
