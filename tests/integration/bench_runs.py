"""Running a bench/ command as a developer would, for the smoke tests of the harness and of the
hostile suite: in its own process, against the test PostgreSQL server, where it creates and
drops a database of its own (memory_bench_*)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import asyncpg

from bench.db import to_asyncpg_dsn

ROOT = Path(__file__).resolve().parents[2]


def run_tiny(
    module: str, database_url: str, tmp_path: Path, output: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """``python -m <module> --scale tiny`` (and ``extra`` arguments) with its results in
    ``tmp_path`` and JSON in ``output``."""
    env = {k: v for k, v in os.environ.items() if k != "BENCH_DATABASE_URL"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            module,
            "--scale",
            "tiny",
            "--database-url",
            database_url,
            "--results-dir",
            str(tmp_path),
            "--output",
            str(output),
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


async def bench_databases(database_url: str) -> list[str]:
    """The bench databases on the server (a run must drop its own)."""
    conn = await asyncpg.connect(to_asyncpg_dsn(database_url))
    try:
        rows = await conn.fetch("SELECT datname FROM pg_database WHERE datname LIKE 'memory_bench_%'")
    finally:
        await conn.close()
    return [r["datname"] for r in rows]
