"""A tiny run of the hostile-client suite (bench/hostile.py, `python -m bench.hostile`), so that it
cannot rot and so that what it checks keeps holding.

It runs the suite exactly as a developer would, in its own process, against the test PostgreSQL
server: the suite creates and drops its own database there (memory_bench_*), starts two replicas
with `python -m app.cli serve` and the fake LLM, abuses them for ~15 s and exits 0 only when
every status it saw is documented (no 5xx but 503, each 503 with Retry-After), no
acknowledged message was lost or stored twice and no refused input was accepted.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.bench_runs import bench_databases, run_tiny

CHECKS = {
    "undocumented_statuses",
    "server_errors_not_503",
    "503_without_retry_after",
    "lost_acknowledged",
    "duplicated",
    "hostile_accepted",
    "sequence_gaps",
}
ABUSE = {
    "hostile_json",
    "malformed",
    "wrong_key",
    "junk_path",
    "junk_method",
    "trailing_slash",
    "huge_header",
    "cross_tenant",
    "oversized",
    "unauth_large",
    "million_messages",
    "metadata_bloat",
    "slowloris",
}

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_hostile_tiny_run(database_url: str, tmp_path: Path) -> None:
    output = tmp_path / "hostile.json"
    proc = run_tiny("bench.hostile", database_url, tmp_path, output)
    assert output.exists(), f"no JSON; stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    doc: dict[str, Any] = json.loads(output.read_text())
    meta, res, summary = doc["meta"], doc["results"], doc["summary"]
    failed = [c for c in doc["checks"] if not c["pass"]]
    findings = {k: v[:3] for k, v in res["findings"].items() if v}
    assert proc.returncode == 0, (
        f"exit {proc.returncode}; failed checks {failed}; findings {json.dumps(findings)[:6000]}; "
        f"suite errors {res.get('harness_errors')}; stderr:\n{proc.stderr[-3000:]}"
    )
    assert "Checks" in proc.stdout and "Statuses by route template" in proc.stdout  # the printed table

    # every check ran and passed, and the counts say so
    assert {c["name"] for c in doc["checks"]} == CHECKS
    assert all(c["pass"] for c in doc["checks"])
    assert summary["undocumented"] == 0 and summary["server_errors"] == 0
    assert summary["no_retry_after_503"] == 0 and summary["hostile_accepted"] == 0
    assert summary["lost"] == 0 and summary["duplicated"] == 0
    integrity = res["integrity"]
    assert integrity["acknowledged_messages"] > 100
    assert integrity["content_differs"] == 0 and integrity["sequence_gaps"] == 0

    # the run did what it says: every kind of abuse got answers, next to normal traffic
    categories = res["categories"]
    for name in ABUSE | {"steady", "quiet", "burst", "poison"}:
        assert categories.get(name, {}).get("responses", 0) > 0, (name, categories.get(name))
    assert res["statuses_by_route"]
    assert "413" in categories["oversized"]["statuses"]
    assert "401" in categories["unauth_large"]["statuses"]
    assert "408" in categories["slowloris"]["statuses"]
    assert res["metadata_bloat"]["refusal_statuses"], res["metadata_bloat"]

    # the kill -9 and the restart happened; both replicas were sampled
    events = [e["event"] for e in res["events"]]
    assert "kill -9 replica 1" in events and "replica 1 restarted" in events, events
    assert len(res["peak_rss_mib"]["replica-1"]) >= 2
    assert all(inc["peak_rss_mib"] > 0 for incs in res["peak_rss_mib"].values() for inc in incs)

    # B and C were measured (reported, not judged)
    lag = res["summary_lag"]["tenant-b+c"]
    assert lag["rounds"] > 0 and lag["seconds"]["count"] > 0

    # its database was dropped
    assert meta["database"] not in asyncio.run(bench_databases(database_url))
