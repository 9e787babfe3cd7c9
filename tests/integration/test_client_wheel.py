"""The client package installs on its own: its wheel, in a fresh virtualenv, brings httpx and
pydantic and nothing of the service, talks to a real service, and each adapter asks for its
extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.conftest import Launch
from tests.integration.installs import ROOT, check, clean_env, uv, uv_env

pytestmark = pytest.mark.slow

PROBE = """
import importlib.util as u, sys
from importlib.metadata import requires
from importlib.resources import files
from memory_client import Client
print(files("memory_client").joinpath("py.typed").is_file())
print(sorted(r for r in requires("memory-service-client") if "extra ==" not in r))
print([m for m in ("app", "fastapi", "sqlalchemy", "agents", "langchain_core", "mcp") if u.find_spec(m)])
with Client(sys.argv[1]) as client:
    print(client.append_messages("wheel-1", [{"role": "user", "content": "hi"}]).round)
try:
    import memory_client.agents
except ImportError as error:
    print(error.name)
"""


def test_the_client_wheel_installs_alone(tmp_path: Path, launch: Launch) -> None:
    server = launch()
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    check([uv(), "build", "--wheel", "--out-dir", str(dist), "clients/python"], cwd=ROOT, env=uv_env())
    (wheel,) = dist.glob("memory_service_client-*.whl")
    check([uv(), "venv", "--python", sys.executable, str(venv)], cwd=tmp_path, env=uv_env())
    check(
        [uv(), "pip", "install", "--python", str(venv / "bin" / "python"), str(wheel)],
        cwd=tmp_path,
        env=uv_env(),
    )
    out = check(
        [str(venv / "bin" / "python"), "-c", PROBE, server.url], cwd=tmp_path, env=clean_env(venv / "bin")
    ).splitlines()
    assert out[0] == "True"  # typed (PEP 561)
    assert out[1] == "['httpx>=0.27', 'pydantic>=2.9']"
    assert out[2] == "[]"  # nothing of the service, no adapter library
    assert out[3] == "0"
    assert out[4] == "agents"  # memory_client.agents needs the extra
