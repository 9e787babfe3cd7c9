"""Property-based API fuzzing: schemathesis against the service's own OpenAPI schema."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import Launch

pytestmark = pytest.mark.slow


def test_schemathesis_finds_no_failures(launch: Launch, tmp_path: Path) -> None:
    server = launch(MEMORY_SUMMARIZER="offline")
    report = tmp_path / "schemathesis.xml"
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "schemathesis"),
            "run",
            f"{server.url}/openapi.json",
            # The stateful phase's cross-request checks depend on what earlier phases left in the
            # database, so they vary from run to run; these four do not.
            "--checks",
            "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance",
            "--max-examples",
            "25",
            "--seed",
            "20261123",
            "--report",
            "junit",
            "--report-junit-path",
            str(report),
            "--request-timeout",
            "10",
            # An event stream answers 200 and stays open: test_events reads it.
            "--exclude-operation-id",
            "stream_events",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # schemathesis keeps a .schemathesis folder in its working directory
    )
    summary = result.stdout[-3000:]
    print(summary)
    assert "Traceback" not in server.log_text()
    assert "ST101" not in result.stdout, summary  # no server errors
    assert result.returncode == 0, summary
