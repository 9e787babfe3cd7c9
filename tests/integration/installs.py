"""Helpers for the tests that install the project the way users and the image do (a wheel in a
fresh virtualenv, the Dockerfile's steps) and run its `memory-service` from there: a throwaway
database, a clean environment, and waiting for readiness."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import httpx
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def throwaway_database(server_url: str) -> Iterator[str]:
    """A new, empty database on the test server (its postgresql:// URL), dropped afterwards."""
    name = f"memory_install_{uuid.uuid4().hex[:8]}"
    admin = make_url(server_url).set(drivername="postgresql").render_as_string(hide_password=False)

    async def run(sql: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(admin).set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def clean_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a fresh machine or container: no virtualenv, no project on the path,
    no settings but those given."""
    env = {
        "PATH": f"{bin_dir}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "INFO",
    }
    env.update(extra)
    return env


def uv() -> str:
    """The uv running these tests (`uv run` says which in UV), else the one on PATH."""
    found = os.environ.get("UV") or shutil.which("uv")
    assert found, "uv not found"
    return found


def uv_env(**extra: str) -> dict[str, str]:
    """The current environment for running uv itself, minus the test run's virtualenv."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    env.update(extra)
    return env


def check(
    args: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> str:
    """Run a command; its stdout, or a failure showing both streams."""
    done = subprocess.run(
        list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    out: str = done.stdout
    return out


def wait_ready(process: subprocess.Popen[bytes], url: str, log: Path, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"serve exited {process.returncode}:\n{log.read_text(errors='replace')}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"not ready after {within} s:\n{log.read_text(errors='replace')}")


def stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    return process.returncode
