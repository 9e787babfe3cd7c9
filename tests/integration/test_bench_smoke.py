"""A tiny run of the benchmark harness (bench/, `python -m bench`), so that it cannot rot.

It runs the harness exactly as a developer would, in its own process, against the test
PostgreSQL server. The harness creates and drops its own database there (memory_bench_*), so
it never touches the test database. Performance targets are not asserted here (a tiny run on a
shared CI machine says nothing about them); correctness and the shape of the results are.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import pytest

from bench.db import to_asyncpg_dsn
from tests.integration.bench_runs import bench_databases, run_tiny

SCENARIOS = {"context", "floor", "post", "mixed", "tokens", "transfer", "counting", "append", "sizing"}

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_bench_tiny_run(database_url: str, tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    proc = run_tiny("bench", database_url, tmp_path, output)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert "Targets" in proc.stdout and "Checks" in proc.stdout  # the printed table

    doc: dict[str, Any] = json.loads(output.read_text())
    meta, res = doc["meta"], doc["results"]
    assert set(res) == SCENARIOS
    transfer = res["transfer"]
    assert transfer["entries"] == 500 and transfer["memories"] > 0 and transfer["round_trip_identical"]
    assert transfer["export_median_seconds"] > 0 and transfer["import_median_seconds"] > 0
    assert doc["checks"] and all(c["pass"] for c in doc["checks"]), doc["checks"]
    assert {t["name"] for t in doc["targets"]} == {
        "context_cost_ratio",  # the sliding window's (the name it had before policies)
        "context_cost_ratio.rolling_blocks",
        "context_cost_ratio.token_budget",
        "post_p99_ratio",
        "floor_ratio",
        "floor_ratio.rolling_blocks",
        "floor_ratio.token_budget",
        "context_tokens_growth",
        "llm_input_growth",
        *(f"mixed_lag_p99_ratio.{latency:g}s" for latency in meta["scale"]["mixed_llm_latencies"]),
        "append_worker_ratio",
        "append_floor_ratio",
    }

    # 1 + 4: every size served, by both apps, with a memory and a short gap (the top-level
    # sizes are the sliding window's)
    for key in ("context", "floor"):
        for size, cell in res[key]["sizes"].items():
            assert cell["requests"] > 0 and cell["errors"] == 0, (key, size, cell)
            assert cell["gap_messages"] == 4 and cell["memory_end_sequence"] == int(size) - 5
    assert res["context"]["cost_ratio"] > 0 and res["floor"]["ratio"] > 0
    assert res["context"]["explain"][str(res["context"]["largest"])]["custom"]["execution_ms"] is not None
    # ... and per policy: every size served with the context its seeded conversation must have
    for key in ("context", "floor"):
        assert set(res[key]["policies"]) == {"sliding_window", "rolling_blocks", "token_budget"}
        for policy, section in res[key]["policies"].items():
            for size, cell in section["sizes"].items():
                assert cell["requests"] > 0 and cell["errors"] == 0, (key, policy, size, cell)
                assert cell["shape_ok"], (key, policy, size, cell)
            assert section["ratio"] > 0 if key == "floor" else section["cost_ratio"] > 0
    blocks = res["context"]["policies"]["rolling_blocks"]
    largest = blocks["sizes"][str(blocks["largest"])]
    assert largest["summaries"] == 3 and largest["gap_messages"] == 42  # 3 blocks + 21 rounds raw
    assert blocks["explain"][str(blocks["largest"])]["custom"]["execution_ms"] is not None
    # token_budget (tiny: 10, 100, 1,000 entries of agent rounds): no summary yet at 10 and 100,
    # ten compressions at 1,000 (every 95 entries once 100 are active), the newest ending at 949
    budget = res["context"]["policies"]["token_budget"]["sizes"]
    assert (budget["10"]["summaries"], budget["10"]["gap_messages"]) == (0, 10)
    assert (budget["1000"]["summaries"], budget["1000"]["memory_end_sequence"]) == (10, 949)
    assert all(cell["import_ok"] for cell in budget.values())  # as consistent as an export

    # 9: every agent round POSTed; counting measured exactly, below the POST's whole CPU
    counting = res["counting"]
    assert counting["post"]["errors"] == 0 and counting["post"]["rounds"] > 0
    assert counting["exact"] and 0 < counting["counting_share_of_post_cpu"] < 1
    assert counting["tokens_as_stored"]

    # 2: both LLM latencies measured; summaries ran in the background
    for run in res["post"]["runs"].values():
        assert run["requests"] > 0 and run["errors"] == 0
        assert run["summaries_started"] > 0
    assert res["post"]["p99_ratio"] is not None

    # 3: mixed traffic at each LLM latency completed every round, summaries covered every round,
    # the drain left nothing due and no stuck rows; LLM calls and CPU per round were measured
    mixed = res["mixed"]
    assert set(mixed["runs"]) == {f"{latency:g}" for latency in meta["scale"]["mixed_llm_latencies"]}
    for run in mixed["runs"].values():
        assert run["rounds"] == mixed["conversations"] * mixed["rounds_per_conversation"]
        assert run["errors"] == 0 and run["stuck"] == 0
        assert run["summaries_completed"] > 0
        lag = run["summary_lag_seconds"]
        assert lag["round_to_first_covering_summary"]["count"] == run["rounds"]
        assert lag["rounds_never_covered"] == 0
        assert run["drain"]["due_left"] == 0 and run["drain"]["processing_left"] == 0
        assert run["llm_calls_per_round"] > 0 and run["cpu_seconds_per_round"]["service"] > 0

    # 5: the fake LLM saw the summaries, and memory + gap is far below the full history
    tokens = res["tokens"]
    assert tokens["rounds"] == meta["scale"]["token_rounds"]
    assert tokens["summaries"] > 0
    assert tokens["context_saving"] > 0 and tokens["llm_input_saving"] > 0
    assert tokens["last_round"]["context_tokens"] < tokens["last_round"]["full_history_tokens"]

    # 6: every deployment appended; summaries ran where a runner was up, and nowhere else
    append = res["append"]
    deployments = append["deployments"]
    assert set(deployments) == {"floor", "api_off", "api_off+worker", "combined", "2x_combined"}
    for name, deployment in deployments.items():
        assert deployment["throughput_rps"] > 0 and deployment["errors"] == 0, (name, deployment)
    for name in ("floor", "api_off"):
        for run in deployments[name]["runs"]:
            assert run["summaries_completed"] == 0 and run["work_at_end"]["running"] == 0, (name, run)
            assert run["work_at_end"]["due"] > 0, (name, run)
    for name in ("api_off+worker", "combined", "2x_combined"):
        # a runner claimed work during the run (on a loaded machine none may have completed yet)
        for run in deployments[name]["runs"]:
            assert run["summaries_completed"] + run["work_at_end"]["running"] > 0, (name, run)
    assert all(requests > 0 for run in deployments["2x_combined"]["requests_per_target"] for requests in run)
    assert all(value is not None and value > 0 for value in append["ratios"].values())

    # 7: every concurrency cap completed summaries on a backlog that never ran dry
    sizing = res["sizing"]
    assert set(sizing["runs"]) == {str(cap) for cap in meta["scale"]["sizing_caps"]}
    for run in sizing["runs"].values():
        assert run["summaries_completed"] > 0 and not run["backlog_ran_dry"] and run["failed"] == 0

    # its database was dropped
    assert meta["database"] not in asyncio.run(bench_databases(database_url))


async def _postmaster_cpus(database_url: str) -> set[int] | None:
    """The CPUs of the test server's postmaster, or None when it is not on this machine."""
    conn = await asyncpg.connect(to_asyncpg_dsn(database_url))
    try:
        parent = psutil.Process(await conn.fetchval("SELECT pg_backend_pid()")).parent()
    except psutil.Error:
        return None
    finally:
        await conn.close()
    return None if parent is None else os.sched_getaffinity(parent.pid)


@pytest.mark.timeout(300)
def test_bench_workers_and_api_core(database_url: str, tmp_path: Path) -> None:
    """--mixed-workers 1: the mixed load on an API replica with summaries off, summarized by a
    worker. --api-core 0: the API replica on CPU 0 alone; the worker, and PostgreSQL while the
    run lasts, on the other CPUs; PostgreSQL back on its CPUs afterwards."""
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2 or 0 not in cpus:
        pytest.skip("needs CPU 0 and another")
    before = asyncio.run(_postmaster_cpus(database_url))
    if before is None:
        pytest.skip("the test PostgreSQL server is not on this machine")
    output = tmp_path / "bench.json"
    proc = run_tiny(
        "bench",
        database_url,
        tmp_path,
        output,
        "--scenarios",
        "mixed,append",
        "--mixed-workers",
        "1",
        "--append-deployments",
        "api_off,api_off+worker",
        "--api-core",
        "0",
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert "api_core=0" in proc.stdout
    doc: dict[str, Any] = json.loads(output.read_text())
    mixed = doc["results"]["mixed"]
    assert mixed["deployment"] == "api_off+1 worker"
    for run in mixed["runs"].values():
        assert run["errors"] == 0 and run["summaries_completed"] > 0
        assert run["summary_lag_seconds"]["rounds_never_covered"] == 0
        assert run["drain"]["due_left"] == 0 and run["drain"]["processing_left"] == 0
        # the main service was stopped and the API runs none: the worker did these summaries
        assert set(run["cpu_seconds"]) >= {"mixed-api", "mixed-worker-0"}
    others = sorted(cpus - {0})
    for run in doc["results"]["append"]["deployments"]["api_off+worker"]["runs"]:
        assert run["cpus"] == {"api-off": [0], "worker": others, "postgres": others}, run["cpus"]
        assert run["throughput_rps"] > 0 and run["errors"] == 0
    assert asyncio.run(_postmaster_cpus(database_url)) == before
