"""The scenarios. Each returns a JSON-able dict; checks and targets are derived in report."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import orjson

from app.repositories.memory import CONTEXT_SQL
from bench.floor_app import CONTEXT_LIMITS
from bench.procs import cpu_delta, machine_busy_seconds
from bench.scales import mixed_prefix, sizing_backlog, sizing_prefix
from bench.seed import (
    CONTEXT_PREFIXES,
    ENTRIES_PER_AGENT_ROUND,
    POLICIES,
    SLIDING_WINDOW,
    TOKEN_BUDGET,
    ConversationSeed,
)
from bench.stats import geomean, median, summarize_plain
from bench.textgen import rng_for, round_messages
from bench.tokens import get_counter

if TYPE_CHECKING:
    from bench.harness import Bench
    from bench.procs import Child


# ---- 1 + 4: GET context, service and floor -----------------------------------------------------


def _aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    lat = [r["latency_ms"].get("get", {}) for r in runs]

    def med(key: str) -> float | None:
        values = [float(x[key]) for x in lat if x.get(key) is not None]
        return round(median(values), 3) if values else None

    cpu_keys = {k for r in runs for k in r.get("cpu_cores", {})}
    return {
        "throughput_rps": round(median([float(r["throughput_rps"] or 0) for r in runs]), 1),
        "p50_ms": med("p50"),
        "p90_ms": med("p90"),
        "p99_ms": med("p99"),
        "max_ms": max((float(x["max"]) for x in lat if x.get("max") is not None), default=None),
        "requests": sum(int(r["requests"]) for r in runs),
        "errors": sum(int(r["errors"]) for r in runs),
        "error_samples": [s for r in runs for s in r.get("error_samples", [])][:5],
        "throughput_each_run": [r["throughput_rps"] for r in runs],
        "cpu_cores": {
            k: median([r["cpu_cores"][k] for r in runs if k in r.get("cpu_cores", {})]) for k in cpu_keys
        },
        "loadgen": runs[0].get("loadgen"),
    }


async def _explain(b: Bench, conversation_id: str) -> dict[str, Any]:
    """EXPLAIN ANALYZE of the context statement: the custom plan PostgreSQL makes for these
    parameter values, and the generic plan a prepared statement (SQLAlchemy + asyncpg prepare
    every statement) may switch to after five executions."""
    out: dict[str, Any] = {}
    literal = conversation_id.replace("'", "''")
    async with b.db.acquire() as conn:
        await conn.execute(
            "PREPARE bench_context(varchar, varchar, integer, integer, bigint, bigint) AS " + CONTEXT_SQL
        )
        try:
            for mode in ("custom", "generic"):
                await conn.execute(f"SET plan_cache_mode = force_{mode}_plan")
                rows: list[str] = []
                for _ in range(3):  # the last run is warm
                    rows = [
                        r[0]
                        for r in await conn.fetch(
                            f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_context('{literal}', 'default', "
                            f"{CONTEXT_LIMITS[0]}, {CONTEXT_LIMITS[1]}, NULL, NULL)"
                        )
                    ]
                text = "\n".join(rows)
                execution = re.search(r"Execution Time: ([\d.]+) ms", text)
                planning = re.search(r"Planning Time: ([\d.]+) ms", text)
                out[mode] = {
                    "execution_ms": float(execution.group(1)) if execution else None,
                    "planning_ms": float(planning.group(1)) if planning else None,
                    "plan": rows,
                }
        finally:
            await conn.execute("DEALLOCATE bench_context")
            await conn.execute("RESET plan_cache_mode")
    return out


async def _check_context(b: Bench, url: str, conversation_id: str) -> dict[str, Any]:
    response = await b.http.get(f"{url}/conversations/{conversation_id}/context")
    response.raise_for_status()
    body = response.json()
    return {
        # the raw messages (for the sliding window, the gap after the memory)
        "gap_messages": len(body["messages"]),
        "summaries": len(body.get("summaries", [])),
        "memory_end_sequence": body["memory"]["end_sequence"] if body["memory"] else None,
        "last_sequence": body["last_sequence"],
        "bytes": len(response.content),
    }


# Seeded token_budget conversations up to this many entries are also exported and imported back
# (the import checks every entry's tokens, the running totals, each summary's input tokens and the
# tool call pairs); larger exports pass MEMORY_MAX_IMPORT_BYTES.
IMPORT_CHECK_ENTRIES = 10_000


async def _import_check(b: Bench, conversation_id: str) -> bool:
    """Whether the service's import accepts the seeded conversation as its export gives it."""
    url = b.svc.base_url
    exported = await b.http.get(f"{url}/conversations/{conversation_id}/export")
    exported.raise_for_status()
    imported = await b.http.post(
        f"{url}/conversations/import",
        content=exported.content,
        params={"conversation_id": f"{conversation_id}-import-check"},
        headers={"content-type": "application/json"},
    )
    return imported.status_code == 201


def _conversation(policy: str, n: int) -> str:
    return f"{CONTEXT_PREFIXES[policy]}-{n}"


def _path(policy: str, n: int) -> str:
    return f"/conversations/{_conversation(policy, n)}/context"


def _with_shape(b: Bench, policy: str, n: int, cell: dict[str, Any]) -> dict[str, Any]:
    """The measured cell with what the seeded conversation's context must look like."""
    expected = b.seeder.expected_context(ConversationSeed(_conversation(policy, n), n, gap=4, policy=policy))
    got = {
        "summaries": cell["summaries"],
        "memory_end_sequence": cell["memory_end_sequence"],
        "raw_messages": cell["gap_messages"],
    }
    return {**cell, "expected": expected, "shape_ok": got == expected}


def _policy_results(
    b: Bench,
    policy: str,
    runs: dict[tuple[str, str, int], list[dict[str, Any]]],
    shapes: dict[tuple[str, str, int], dict[str, Any]],
    explain: dict[str, Any],
    target: str,
) -> dict[str, Any]:
    """One policy's cells for one target (service or floor)."""
    sizes_n = b.scale.context_sizes
    smallest, largest = min(sizes_n), max(sizes_n)
    sizes = {
        str(n): _with_shape(
            b, policy, n, {**_aggregate(runs[(policy, target, n)]), **shapes[(policy, target, n)]}
        )
        for n in sizes_n
    }
    thr_small = sizes[str(smallest)]["throughput_rps"]
    thr_large = sizes[str(largest)]["throughput_rps"]
    # The largest size against the smallest one whose context has the same shape (as many
    # summaries and raw messages): history alone, without the response growing. None when only
    # the largest has its shape (e.g. rolling blocks below three full blocks).
    same = [
        n
        for n in sizes_n
        if n != largest
        and (sizes[str(n)]["summaries"], sizes[str(n)]["gap_messages"])
        == (sizes[str(largest)]["summaries"], sizes[str(largest)]["gap_messages"])
    ]
    same_base = min(same) if same else None
    thr_same = sizes[str(same_base)]["throughput_rps"] if same_base is not None else None
    # The largest size against the smallest one that shows summaries too (token_budget: 1,000
    # entries, ten compressions, against 100,000, compressions and folds): a 100x longer history
    # behind a context of about the same size. None when only the largest shows any.
    summarized = [n for n in sizes_n if n != largest and sizes[str(n)]["summaries"] > 0]
    summarized_base = min(summarized) if summarized else None
    thr_summarized = sizes[str(summarized_base)]["throughput_rps"] if summarized_base is not None else None
    return {
        "policy": policy,
        "conversation_prefix": CONTEXT_PREFIXES[policy],
        "sizes": sizes,
        "smallest": smallest,
        "largest": largest,
        # cost = 1 / throughput at saturation (server time per request)
        "cost_ratio": round(thr_small / thr_large, 3) if thr_large else None,
        "p50_ratio": (
            round(sizes[str(largest)]["p50_ms"] / sizes[str(smallest)]["p50_ms"], 3)
            if sizes[str(smallest)]["p50_ms"] and sizes[str(largest)]["p50_ms"] is not None
            else None
        ),
        "same_shape_base": same_base,
        "cost_ratio_same_shape": round(thr_same / thr_large, 3) if thr_same and thr_large else None,
        "summarized_base": summarized_base,
        "cost_ratio_summarized": round(thr_summarized / thr_large, 3)
        if thr_summarized and thr_large
        else None,
        "explain": explain,
    }


async def context_and_floor(b: Bench, with_context: bool, with_floor: bool) -> dict[str, Any]:
    """GET context per memory policy (ctx-N: sliding window, blocks-N: rolling blocks) at every
    size, against the service and the floor app. The top-level keys of "context" and "floor"
    are the sliding window's (the shape before policies); "policies" holds every policy's."""
    scale = b.scale
    targets = []
    if with_context:
        targets.append(b.svc)
    if with_floor:
        assert b.floor is not None
        targets.append(b.floor)
    runs: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    shapes: dict[tuple[str, str, int], dict[str, Any]] = {}
    for policy in POLICIES:
        for n in scale.context_sizes:
            for target in targets:
                shapes[(policy, target.name, n)] = await _check_context(
                    b, target.base_url, _conversation(policy, n)
                )
                if policy == TOKEN_BUDGET and target is b.svc and n <= IMPORT_CHECK_ENTRIES:
                    shapes[(policy, target.name, n)]["import_ok"] = await _import_check(
                        b, _conversation(policy, n)
                    )
    # Prime each fresh process (connections, prepared statements, lazy imports) on every size,
    # unrecorded, so the first measured cell is not the cold one.
    for target in targets:
        await b.run_load(
            {
                "kind": "get",
                "paths": [_path(policy, n) for policy in POLICIES for n in scale.context_sizes],
                "concurrency": scale.context_concurrency,
                "warmup_seconds": 0,
                "duration_seconds": max(1.0, 2 * scale.warmup_seconds),
            },
            target=target,
            label=f"context-{target.name}-prime",
        )
    # Interleaved repeats (policy x size x target), so drift in the machine hits every cell alike.
    for rep in range(scale.repeats):
        for policy in POLICIES:
            for n in scale.context_sizes:
                for target in targets:
                    result = await b.run_load(
                        {
                            "kind": "get",
                            "paths": [_path(policy, n)],
                            "concurrency": scale.context_concurrency,
                            "warmup_seconds": scale.warmup_seconds,
                            "duration_seconds": scale.duration_seconds,
                        },
                        target=target,
                        label=f"context-{target.name}-{CONTEXT_PREFIXES[policy]}-{n}-{rep}",
                    )
                    runs[(policy, target.name, n)].append(result)
    explain = {
        policy: {str(n): await _explain(b, _conversation(policy, n)) for n in scale.context_sizes}
        for policy in POLICIES
    }
    common = {
        "concurrency": scale.context_concurrency,
        "repeats": scale.repeats,
        "duration_seconds": scale.duration_seconds,
        "warmup_seconds": scale.warmup_seconds,
    }
    out: dict[str, Any] = {}
    if with_context:
        per_policy = {
            policy: _policy_results(b, policy, runs, shapes, explain[policy], "service")
            for policy in POLICIES
        }
        out["context"] = {**common, **per_policy[SLIDING_WINDOW], "policies": per_policy}
    if with_floor:
        floor_policies: dict[str, Any] = {}
        for policy in POLICIES:
            floor_sizes = _policy_results(b, policy, runs, shapes, explain[policy], "floor")["sizes"]
            entry: dict[str, Any] = {"policy": policy, "sizes": floor_sizes}
            if with_context:
                service_sizes = out["context"]["policies"][policy]["sizes"]
                ratios = {
                    str(n): round(
                        service_sizes[str(n)]["throughput_rps"] / floor_sizes[str(n)]["throughput_rps"], 3
                    )
                    for n in scale.context_sizes
                    if floor_sizes[str(n)]["throughput_rps"]
                }
                entry["ratio_by_size"] = ratios
                entry["ratio"] = round(geomean(list(ratios.values())), 3) if ratios else None
            else:
                entry["explain"] = explain[policy]
            floor_policies[policy] = entry
        out["floor"] = {**common, **floor_policies[SLIDING_WINDOW], "policies": floor_policies}
    return out


# ---- 2: POST latency with a fast and a slow LLM -------------------------------------------------


async def _post_run(b: Bench, label: str, latency: float, rep: int) -> dict[str, Any]:
    scale = b.scale
    prefix = f"post-{label}"
    await b.llm_control(latency=latency, reset=True)
    max_id = await b.db.fetchval("SELECT coalesce(max(memory_id), 0) FROM memory")
    result = await b.run_load(
        {
            "kind": "post",
            "conversations": [f"{prefix}-{i}" for i in range(scale.post_conversations)],
            "rate": scale.post_rate,
            "warmup_seconds": scale.warmup_seconds,
            "duration_seconds": scale.post_duration_seconds,
            "concurrency": scale.post_concurrency,
            "seed": f"{prefix}-{rep}",
        },
        target=b.svc,
        label=f"post-{label}-{rep}",
    )
    work_at_end = await b.due_work()
    llm = await b.llm_control(latency=0)  # let the queue left by a slow LLM drain quickly
    drain = await b.wait_idle(scale.drain_timeout_seconds)
    row = await b.db.fetchrow(
        """
        SELECT count(*) AS started,
               count(*) FILTER (WHERE status = 'completed') AS completed,
               count(*) FILTER (WHERE status = 'failed') AS failed
        FROM memory WHERE memory_id > $1 AND conversation_id LIKE $2
        """,
        max_id,
        prefix + "-%",
    )
    return {
        **result,
        "summaries_started": row["started"],
        "summaries_completed": row["completed"],
        "summaries_failed": row["failed"],
        "work_at_end": work_at_end,
        "llm_requests_during_run": llm["requests"],
        "llm_max_in_flight": llm["max_in_flight"],
        "drain": drain,
    }


async def post_latency(b: Bench) -> dict[str, Any]:
    """Fast and slow LLM runs, interleaved (fast, slow, fast, slow, ...), medians reported: a
    POST commits, so one run's tail depends on the disk's fsync latency at that moment."""
    scale = b.scale
    latencies = {"fast": scale.fast_llm_latency, "slow": scale.slow_llm_latency}
    each: dict[str, list[dict[str, Any]]] = {"fast": [], "slow": []}
    for rep in range(scale.repeats):
        for label, latency in latencies.items():
            each[label].append(await _post_run(b, label, latency, rep))
    runs: dict[str, Any] = {}
    for label, results in each.items():
        lats = [r["latency_ms"].get("post", {}) for r in results]

        def med(key: str, lats: list[dict[str, Any]] = lats) -> float | None:
            values = [float(x[key]) for x in lats if x.get(key) is not None]
            return round(median(values), 3) if values else None

        runs[label] = {
            "llm_latency_seconds": latencies[label],
            "repeats": len(results),
            "latency_ms": {
                "post": {
                    "count": sum(int(x.get("count", 0)) for x in lats),
                    "p50": med("p50"),
                    "p90": med("p90"),
                    "p99": med("p99"),
                    "p999": med("p999"),
                    "max": max((float(x["max"]) for x in lats if x.get("max") is not None), default=None),
                }
            },
            "p99_each_run": [x.get("p99") for x in lats],
            "requests": sum(int(r["requests"]) for r in results),
            "throughput_rps": round(median([float(r["throughput_rps"] or 0) for r in results]), 1),
            "errors": sum(int(r["errors"]) for r in results),
            "error_samples": [e for r in results for e in r.get("error_samples", [])][:5],
            "sent_late": sum(int(r.get("sent_late", 0)) for r in results),
            "summaries_started": sum(int(r["summaries_started"]) for r in results),
            "summaries_completed": sum(int(r["summaries_completed"]) for r in results),
            "summaries_failed": sum(int(r["summaries_failed"]) for r in results),
            # summaries not started when the load stopped: queued rows and due conversations
            "queued_at_end": max(r["work_at_end"]["queued"] + r["work_at_end"]["due"] for r in results),
            "cpu_cores": {
                k: median([r["cpu_cores"][k] for r in results if k in r["cpu_cores"]])
                for k in results[0]["cpu_cores"]
            },
            "runs": results,
        }
    fast, slow = runs["fast"]["latency_ms"]["post"], runs["slow"]["latency_ms"]["post"]

    def ratio(key: str) -> float | None:
        if fast.get(key) and slow.get(key) is not None:
            return round(float(slow[key]) / float(fast[key]), 3)
        return None

    return {
        "rate": scale.post_rate,
        "duration_seconds": scale.post_duration_seconds,
        "conversations": scale.post_conversations,
        "repeats": scale.repeats,
        "runs": runs,
        "p99_ratio": ratio("p99"),
        "p50_ratio": ratio("p50"),
    }


# ---- 3: mixed traffic ---------------------------------------------------------------------------


async def _sample_runner(b: Bench, api: Child, samples: list[dict[str, Any]], stop: asyncio.Event) -> None:
    began = time.perf_counter()
    while not stop.is_set():
        try:
            stats = await b.runner_stats(api)
        except Exception:
            stats = {}
        samples.append({"t": round(time.perf_counter() - began, 2), **stats})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)


def _per(value: float | int | None, rounds: int, digits: int = 4) -> float | None:
    return round(float(value) / rounds, digits) if value is not None and rounds else None


async def _mixed_run(b: Bench, k: int, latency: float, api: Child, workers: list[Child]) -> dict[str, Any]:
    """The mixed load on the k-th set of conversations with the LLM at ``latency`` against
    ``api`` (summarized by it or by ``workers``), then a drain with the LLM still at that
    latency (the lag of the last rounds includes it)."""
    scale = b.scale
    prefix = mixed_prefix(k)
    like = prefix + "-%"
    conversations = [f"{prefix}-{i}" for i in range(scale.mixed_conversations)]
    await b.llm_control(latency=latency, reset=True)
    max_id = await b.db.fetchval("SELECT coalesce(max(memory_id), 0) FROM memory")
    db_start = await b.db.fetchval("SELECT clock_timestamp()")
    samples: list[dict[str, Any]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_runner(b, api, samples, stop))
    try:
        result = await b.run_load(
            {
                "kind": "mixed",
                "conversations": conversations,
                "clients": scale.mixed_clients,
                "rounds": scale.mixed_rounds,
                "seed": f"mixed-{k}",
            },
            target=api,
            also=workers,
            label=f"mixed-{latency:g}s",
        )
        llm_at_end = await b.llm_control()
        processes = [api, *workers]
        cpu_drain0 = sum(c.cpu_seconds() for c in processes)
        drain = await b.wait_idle(scale.drain_timeout_seconds)
        drain_cpu = sum(c.cpu_seconds() for c in processes) - cpu_drain0
    finally:
        stop.set()
        await sampler
    llm = await b.llm_control(latency=0)
    stuck_response = await b.http.get(api.base_url + "/ops/memories/stuck", params={"older_than_seconds": 0})
    stuck_response.raise_for_status()
    stuck = stuck_response.json()
    # Per summary: completed_at minus the created_at of the last message of its window, and minus
    # the created_at of the memory row itself (claim + generation, or queue + generation).
    per_summary = await b.db.fetch(
        """
        SELECT extract(epoch FROM m.completed_at - g.created_at)::float8 AS from_last_message,
               extract(epoch FROM m.completed_at - m.created_at)::float8 AS from_row
        FROM memory m
        JOIN messages g ON g.conversation_id = m.conversation_id AND g.sequence = m.end_sequence
        WHERE m.memory_id > $1 AND m.status = 'completed' AND m.conversation_id LIKE $2
        """,
        max_id,
        like,
    )
    # Per round (the issue's summary lag): from the round's POST (its messages' created_at, the
    # statement's start) to the first completed summary covering it (end_round >= the round).
    per_round = await b.db.fetch(
        """
        SELECT extract(epoch FROM (
                   SELECT min(m.completed_at) FROM memory m
                   WHERE m.conversation_id = g.conversation_id AND m.status = 'completed'
                     AND m.end_round >= g.round) - min(g.created_at))::float8 AS lag
        FROM messages g
        WHERE g.conversation_id LIKE $1 AND g.created_at >= $2
        GROUP BY g.conversation_id, g.round
        """,
        like,
        db_start,
    )
    counts = await b.db.fetchrow(
        """
        SELECT count(*) FILTER (WHERE status = 'completed') AS completed,
               count(*) FILTER (WHERE status = 'failed') AS failed,
               count(*) FILTER (WHERE status = 'processing') AS processing
        FROM memory WHERE memory_id > $1 AND conversation_id LIKE $2
        """,
        max_id,
        like,
    )
    behind = await b.db.fetchval(
        """
        SELECT count(*) FROM conversations c
        WHERE c.conversation_id LIKE $1 AND c.next_sequence > 0
          AND coalesce((SELECT max(m.end_sequence) FROM memory m
                        WHERE m.conversation_id = c.conversation_id AND m.status = 'completed'), -1)
              < c.next_sequence - 1
        """,
        like,
    )
    round_lags = [r["lag"] for r in per_round if r["lag"] is not None]
    lag = summarize_plain(round_lags)
    rounds = int(result["rounds"])
    cpu = result["cpu_seconds"]
    service_cpu = sum(cpu[c.name] for c in processes)
    return {
        "llm_latency_seconds": latency,
        "conversation_prefix": prefix,
        **result,
        "summary_lag_seconds": {
            "round_to_first_covering_summary": lag,
            "from_last_message_of_window": summarize_plain(r["from_last_message"] for r in per_summary),
            "from_memory_row_created": summarize_plain(r["from_row"] for r in per_summary),
            "rounds_never_covered": len(per_round) - len(round_lags),
        },
        "lag_p99_over_llm_latency": round(lag["p99"] / latency, 3)
        if lag["p99"] is not None and latency
        else None,
        "summaries_completed": counts["completed"],
        "summaries_failed": counts["failed"],
        "summaries_per_round": _per(counts["completed"], rounds),
        "llm_calls": llm["requests"],
        "llm_calls_during_load": llm_at_end["requests"],
        "llm_calls_per_round": _per(llm["requests"], rounds),
        "llm_max_in_flight": llm["max_in_flight"],
        # CPU of the service's processes (the API and any workers) per round: during the load,
        # and with the drain's summaries
        "cpu_seconds_per_round": {
            "service": _per(service_cpu, rounds, 5),
            "service_with_drain": _per(service_cpu + drain_cpu, rounds, 5),
            "postgres": _per(cpu["postgres"], rounds, 5),
        },
        "conversations_memory_behind_at_end": behind,
        "drain": drain,
        "stuck": len(stuck),
        "stuck_rows": stuck[:5],
        "runner_max_running": max((s.get("running", 0) for s in samples), default=0),
        "runner_max_queued": max((s.get("queued", 0) for s in samples), default=0),
        "runner_max_due": max((s.get("due", 0) for s in samples), default=0),
        "runner_max_oldest_due_seconds": max((s.get("oldest_due_seconds") or 0 for s in samples), default=0),
    }


async def mixed(b: Bench) -> dict[str, Any]:
    """The mixed load once per LLM latency (scale.mixed_llm_latencies), each on conversations of
    its own with the same histories."""
    scale = b.scale
    runs = {}
    count = b.opts.mixed_workers
    if count == 0:
        for k, latency in enumerate(scale.mixed_llm_latencies):
            runs[f"{latency:g}"] = await _mixed_run(b, k, latency, b.svc, [])
    else:
        # The main service would claim the workers' due work: it is stopped meanwhile.
        await b.stop_main_service()
        started: list[Child] = []
        try:
            api = await b.start_replica("mixed-api", {"MEMORY_RUN_SUMMARIES": "false"})
            started.append(api)
            workers = [await b.start_worker(f"mixed-worker-{i}") for i in range(count)]
            started += workers
            for k, latency in enumerate(scale.mixed_llm_latencies):
                runs[f"{latency:g}"] = await _mixed_run(b, k, latency, api, workers)
        finally:
            for child in started:
                await b.stop_child(child)
            await b.start_main_service()
    return {
        "conversations": scale.mixed_conversations,
        "clients": scale.mixed_clients,
        "rounds_per_conversation": scale.mixed_rounds,
        "max_concurrent_summaries": b.settings.MEMORY_MAX_CONCURRENT_SUMMARIES,
        "deployment": "combined" if count == 0 else f"api_off+{count} worker{'s' if count > 1 else ''}",
        "runs": runs,
    }


# ---- 5: tokens ----------------------------------------------------------------------------------


def _growth(series: list[float], skip: int) -> float | None:
    """Mean of the last fifth over the mean of the fifth after ``skip`` warm-up points: 1.0 is
    flat, 2.0 means it doubled."""
    body = series[skip:]
    fifth = max(1, len(body) // 5)
    early, late = body[:fifth], body[-fifth:]
    if not early or not late or sum(early) == 0:
        return None
    return round((sum(late) / len(late)) / (sum(early) / len(early)), 3)


async def tokens(b: Bench) -> dict[str, Any]:
    scale = b.scale
    counter = get_counter(prefer_approx=b.opts.approx_tokens)
    cid = "tok-0"
    url = b.svc.base_url
    await b.llm_control(latency=0, capture=True, reset=True)
    rng = rng_for("tokens", cid)
    message_tokens: list[int] = []  # per sequence, as "role: content"
    rounds: list[dict[str, Any]] = []
    failed = 0
    try:
        for r in range(scale.token_rounds):
            response = await b.http.get(f"{url}/conversations/{cid}/context")
            if response.status_code == 404 and r == 0:
                memory_tokens, gap = 0, []
            else:
                response.raise_for_status()
                ctx = response.json()
                memory_tokens = counter.count(ctx["memory"]["text"]) if ctx["memory"] else 0
                gap = ctx["messages"]
            gap_tokens = sum(counter.count(f"{m['role']}: {m['content']}") for m in gap)
            rounds.append(
                {
                    "round": r + 1,
                    "context_tokens": memory_tokens + gap_tokens,
                    "memory_tokens": memory_tokens,
                    "gap_messages": len(gap),
                    "full_history_tokens": sum(message_tokens),
                }
            )
            messages = round_messages(rng)
            posted = await b.http.post(f"{url}/conversations/{cid}/messages", json={"messages": messages})
            if posted.status_code != 201:
                raise RuntimeError(f"POST round {r + 1}: HTTP {posted.status_code} {posted.text[:300]}")
            message_tokens += [counter.count(f"{m['role']}: {m['content']}") for m in messages]
            if posted.json()["summary_due"]:
                failed += await _wait_summary(b, cid)
    finally:
        captured = await b.llm_captured()
        await b.llm_control(capture=False, reset=True)
    prefix = [0]
    for t in message_tokens:
        prefix.append(prefix[-1] + t)
    summaries = []
    for body in captured["bodies"]:
        msgs = body.get("messages", [])
        system = next((str(m.get("content", "")) for m in msgs if m.get("role") == "system"), "")
        window = re.search(r"to #(\d+)", system)
        end = int(window.group(1)) if window else len(message_tokens) - 1
        summaries.append(
            {
                "window_end": end,
                "llm_input_tokens": counter.chat(msgs),
                # the same request carrying every message so far instead of summary + new ones
                "full_history_input_tokens": counter.chat([{"role": "system", "content": system}])
                + prefix[min(end + 1, len(message_tokens))],
            }
        )
    ctx_series = [float(x["context_tokens"]) for x in rounds]
    llm_series = [float(s["llm_input_tokens"]) for s in summaries]
    skip_rounds = b.window_size // 2 + 1  # the window fills over the first rounds
    total_ctx = sum(ctx_series)
    total_full = sum(float(x["full_history_tokens"]) for x in rounds)
    total_llm = sum(llm_series)
    total_llm_full = sum(float(s["full_history_input_tokens"]) for s in summaries)
    checkpoints = sorted({1, min(10, len(rounds)), *(max(1, len(rounds) * k // 4) for k in (1, 2, 3, 4))})
    by_end = {s["window_end"]: s for s in summaries}
    table = []
    for c in checkpoints:
        row = dict(rounds[c - 1])
        # the summary made after this round (its window ends at the round's last message)
        summary = by_end.get(2 * c - 1)
        row["llm_input_tokens"] = summary["llm_input_tokens"] if summary else None
        table.append(row)
    return {
        "tokenizer": counter.name,
        "tokenizer_exact": counter.exact,
        "tokenizer_note": counter.note,
        "rounds": len(rounds),
        "summaries": len(summaries),
        "summaries_failed": failed,
        "checkpoints": table,
        "context_tokens": summarize_plain(ctx_series[skip_rounds:], 1),
        "llm_input_tokens_per_summary": summarize_plain(llm_series[skip_rounds:], 1),
        "context_growth": _growth(ctx_series, skip_rounds),
        "llm_input_growth": _growth(llm_series, skip_rounds),
        "full_history_growth": _growth([float(x["full_history_tokens"]) for x in rounds], skip_rounds),
        "last_round": rounds[-1] if rounds else None,
        "context_saving": round(1 - total_ctx / total_full, 4) if total_full else None,
        "context_saving_last_round": (
            round(1 - rounds[-1]["context_tokens"] / rounds[-1]["full_history_tokens"], 4)
            if rounds and rounds[-1]["full_history_tokens"]
            else None
        ),
        "llm_input_saving": round(1 - total_llm / total_llm_full, 4) if total_llm_full else None,
        "totals": {
            "context_tokens": int(total_ctx),
            "full_history_tokens": int(total_full),
            "llm_input_tokens": int(total_llm),
            "llm_full_history_input_tokens": int(total_llm_full),
        },
        "series": {"rounds": rounds, "summaries": summaries},
    }


async def _wait_summary(b: Bench, cid: str, limit_seconds: float = 60.0) -> int:
    """Wait until the conversation is no longer due and has no summary processing (a runner
    claimed the due mark, ran the summary and found nothing more due); 1 if the last one failed."""
    deadline = time.monotonic() + limit_seconds
    while True:
        busy = await b.db.fetchval(
            """
            SELECT c.summary_due_at IS NOT NULL
                   OR EXISTS (SELECT 1 FROM memory m
                              WHERE m.conversation_id = c.conversation_id AND m.status = 'processing')
            FROM conversations c WHERE c.conversation_id = $1
            """,
            cid,
        )
        if not busy:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"summary of {cid} still processing after {limit_seconds}s")
        await asyncio.sleep(0.005)
    latest = await b.db.fetchval(
        "SELECT status FROM memory WHERE conversation_id = $1 ORDER BY memory_id DESC LIMIT 1", cid
    )
    return 1 if latest == "failed" else 0


# ---- 8: export and import ----------------------------------------------------------------------

TRANSFER_ROUND = 50  # entries per POST: ten exchanges of a question, two tool calls, their results, an answer


def _transfer_round(r: int) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for k in range(TRANSFER_ROUND // 5):
        n = r * 100 + k
        calls = [
            {
                "id": f"c{n}-{i}",
                "type": "function",
                "function": {"name": "search", "arguments": f'{{"q": {i}}}'},
            }
            for i in (1, 2)
        ]
        entries += [
            {"role": "user", "content": f"Step {n}: find the two files that define the parser, please."},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": f"c{n}-1", "content": f"src/parser_{n}.py: 120 lines"},
            {
                "role": "tool",
                "tool_call_id": f"c{n}-2",
                "content": {"path": f"src/lexer_{n}.py", "lines": 80},
            },
            {"role": "assistant", "content": f"Found both for step {n}: the parser and its lexer."},
        ]
    return entries


def _ids_aside(doc: dict[str, Any]) -> dict[str, Any]:
    rank = {m["memory_id"]: i for i, m in enumerate(doc["memories"])}
    memories = [
        m | {"memory_id": rank[m["memory_id"]], "base_memory_id": rank.get(m["base_memory_id"])}
        for m in doc["memories"]
    ]
    conversation = {k: v for k, v in doc["conversation"].items() if k != "conversation_id"}
    return doc | {"conversation": conversation, "memories": memories}


async def transfer(b: Bench) -> dict[str, Any]:
    """GET .../export and POST /conversations/import of one token_budget conversation of
    scale.transfer_entries entries (tool exchanges, compressions and folds made by the service
    with the fake LLM at 0 s): wall time per call, 3 of each, and whether export, import and
    export again give the same document (ids aside)."""
    url = b.svc.base_url
    cid = "xfer-0"
    await b.llm_control(latency=0, reset=True)
    created = await b.http.post(
        f"{url}/conversations", json={"conversation_id": cid, "memory_policy": {"name": "token_budget"}}
    )
    created.raise_for_status()
    for r in range(max(1, b.scale.transfer_entries // TRANSFER_ROUND)):
        posted = await b.http.post(
            f"{url}/conversations/{cid}/messages", json={"messages": _transfer_round(r)}
        )
        if posted.status_code != 201:
            raise RuntimeError(f"POST round {r}: HTTP {posted.status_code} {posted.text[:300]}")
    drain = await b.wait_idle(b.scale.drain_timeout_seconds)
    exports: list[float] = []
    body = b""
    for _ in range(3):
        t0 = time.perf_counter()
        response = await b.http.get(f"{url}/conversations/{cid}/export")
        exports.append(time.perf_counter() - t0)
        response.raise_for_status()
        body = response.content
    imports: list[float] = []
    for i in range(3):
        t0 = time.perf_counter()
        response = await b.http.post(
            f"{url}/conversations/import",
            content=body,
            params={"conversation_id": f"xfer-copy-{i}"},
            headers={"content-type": "application/json"},
        )
        imports.append(time.perf_counter() - t0)
        if response.status_code != 201:
            raise RuntimeError(f"import: HTTP {response.status_code} {response.text[:300]}")
    again = await b.http.get(f"{url}/conversations/xfer-copy-0/export")
    again.raise_for_status()
    original = orjson.loads(body)
    await b.wait_idle(b.scale.drain_timeout_seconds)
    return {
        "entries": len(original["entries"]),
        "memories": len(original["memories"]),
        "document_bytes": len(body),
        "drain": drain,
        "export_seconds": [round(x, 4) for x in exports],
        "import_seconds": [round(x, 4) for x in imports],
        "export_median_seconds": round(median(exports), 4),
        "import_median_seconds": round(median(imports), 4),
        "round_trip_identical": _ids_aside(orjson.loads(again.content)) == _ids_aside(original),
    }


# ---- 6: append throughput per deployment -------------------------------------------------------

# Deployment -> what it is. Each runs the same closed loop of POSTs (no GETs).
APPEND_DEPLOYMENTS = {
    "floor": "write floor: bare Starlette + asyncpg, the same append statement",
    "api_off": "1 API replica, MEMORY_RUN_SUMMARIES=false, no worker (nothing summarizes)",
    "api_off+worker": "1 API replica with summaries off + 1 `memory-service worker`",
    "combined": "1 API replica running summaries too (the default)",
    "2x_combined": "2 combined replicas, connections split between them",
}


async def _append_run(
    b: Bench, name: str, targets: list[Child], also: list[Child], rep: int
) -> dict[str, Any]:
    """One measured closed loop of POSTs against ``targets``, with the LLM at the run's latency;
    the summaries completed meanwhile (by anyone) and the work left due at its end."""
    scale = b.scale
    await b.llm_control(latency=scale.append_llm_latency, reset=True)
    max_id = await b.db.fetchval("SELECT coalesce(max(memory_id), 0) FROM memory")
    t0 = await b.db.fetchval("SELECT clock_timestamp()")
    result = await b.run_load(
        {
            "kind": "append",
            "conversations": [f"app-{i}" for i in range(scale.append_conversations)],
            "concurrency": scale.append_concurrency,
            "warmup_seconds": scale.append_warmup_seconds,
            "duration_seconds": scale.append_duration_seconds,
            "seed": f"append-{name}-{rep}",
        },
        target=targets,
        also=also,
        label=f"append-{name}-{rep}",
    )
    row = await b.db.fetchrow(
        """
        SELECT count(*) AS completed,
               extract(epoch FROM clock_timestamp() - $2::timestamptz)::float8 AS seconds
        FROM memory WHERE memory_id > $1 AND status = 'completed'
        """,
        max_id,
        t0,
    )
    return {
        **result,
        "summaries_completed": row["completed"],
        "summaries_per_second": round(row["completed"] / row["seconds"], 1) if row["seconds"] else None,
        "work_at_end": await b.due_work(),
    }


async def _drain_fast(b: Bench) -> dict[str, Any]:
    """Run what the last deployment left due with the LLM at 0 s, so the next one starts with
    an empty queue (needs a runner up)."""
    await b.llm_control(latency=0)
    return await b.wait_idle(b.scale.drain_timeout_seconds)


def _median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in runs if r.get(key) is not None]
    return round(median(values), 1) if values else None


async def append_throughput(b: Bench) -> dict[str, Any]:
    """POST throughput of each deployment in APPEND_DEPLOYMENTS, interleaved repeats. Only the
    deployment's own processes run during its runs (the main service is stopped: it would
    claim their due work), and what a deployment leaves due is drained before the next one."""
    scale = b.scale
    await b.stop_main_service()
    each: dict[str, list[dict[str, Any]]] = defaultdict(list)
    drains: list[dict[str, Any]] = []
    chosen = set(b.opts.append_deployments or APPEND_DEPLOYMENTS)
    for rep in range(scale.append_repeats):
        # Neither the floor nor an API replica with summaries off claims work: start both at once.
        floor_started = asyncio.create_task(b.start_floor("floor-write")) if "floor" in chosen else None
        api_started = (
            asyncio.create_task(b.start_replica("api-off", {"MEMORY_RUN_SUMMARIES": "false"}))
            if chosen & {"api_off", "api_off+worker"}
            else None
        )
        started = await asyncio.gather(
            *(t for t in (floor_started, api_started) if t is not None), return_exceptions=True
        )
        failed = [r for r in started if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        if floor_started is not None:
            floor = floor_started.result()
            try:
                each["floor"].append(await _append_run(b, "floor", [floor], [], rep))
            finally:
                await b.stop_child(floor)
        if api_started is not None:
            api = api_started.result()
            try:
                if "api_off" in chosen:
                    each["api_off"].append(await _append_run(b, "api_off", [api], [], rep))
                if "api_off+worker" in chosen:
                    worker = await b.start_worker("worker")
                    try:
                        drains.append(await _drain_fast(b))
                        each["api_off+worker"].append(
                            await _append_run(b, "api_off+worker", [api], [worker], rep)
                        )
                        drains.append(await _drain_fast(b))
                    finally:
                        await b.stop_child(worker)
            finally:
                await b.stop_child(api)
        if chosen & {"combined", "2x_combined"}:
            first = await b.start_replica("combined-a")
            try:
                drains.append(await _drain_fast(b))
                if "combined" in chosen:
                    each["combined"].append(await _append_run(b, "combined", [first], [], rep))
                    drains.append(await _drain_fast(b))
                if "2x_combined" in chosen:
                    second = await b.start_replica("combined-b")
                    try:
                        each["2x_combined"].append(
                            await _append_run(b, "2x_combined", [first, second], [], rep)
                        )
                        drains.append(await _drain_fast(b))
                    finally:
                        await b.stop_child(second)
            finally:
                await b.stop_child(first)
    if any((await b.due_work()).values()):
        # Left by deployments without a runner: run it, so no later scenario's runner does.
        worker = await b.start_worker("worker")
        try:
            drains.append(await _drain_fast(b))
        finally:
            await b.stop_child(worker)
    deployments: dict[str, Any] = {}
    for name, runs in each.items():
        lats = [r["latency_ms"].get("post", {}) for r in runs]
        cpu_keys = {k for r in runs for k in r["cpu_cores"]}
        deployments[name] = {
            "what": APPEND_DEPLOYMENTS[name],
            "throughput_rps": _median_of(runs, "throughput_rps"),
            "throughput_each_run": [r["throughput_rps"] for r in runs],
            "p50_ms": round(median([float(x["p50"]) for x in lats if x.get("p50") is not None] or [0]), 2),
            "p99_ms": round(median([float(x["p99"]) for x in lats if x.get("p99") is not None] or [0]), 2),
            "errors": sum(int(r["errors"]) for r in runs),
            "error_samples": [e for r in runs for e in r.get("error_samples", [])][:5],
            "summaries_per_second": _median_of(runs, "summaries_per_second"),
            "due_at_end": max(r["work_at_end"]["due"] for r in runs),
            "cpu_cores": {
                k: round(median([r["cpu_cores"][k] for r in runs if k in r["cpu_cores"]]), 2)
                for k in sorted(cpu_keys)
            },
            # CPU per round of the deployment's own processes (floor, API replicas, worker) and of
            # PostgreSQL: cores over the run / rounds per second
            "cpu_ms_per_round": {
                k: round(
                    median(
                        [1000 * r["cpu_cores"][k] / r["throughput_rps"] for r in runs if r["throughput_rps"]]
                    ),
                    3,
                )
                for k in sorted(cpu_keys - {"machine"})
            },
            "requests_per_target": [r.get("requests_per_target") for r in runs],
            "runs": runs,
        }

    def ratio(a: str, b_: str) -> float | None:
        if a not in deployments or b_ not in deployments:
            return None
        x, y = deployments[a]["throughput_rps"], deployments[b_]["throughput_rps"]
        return round(x / y, 3) if x and y else None

    return {
        "conversations": scale.append_conversations,
        "concurrency": scale.append_concurrency,
        "warmup_seconds": scale.append_warmup_seconds,
        "duration_seconds": scale.append_duration_seconds,
        "repeats": scale.append_repeats,
        "llm_latency_seconds": scale.append_llm_latency,
        "max_concurrent_summaries": b.settings.MEMORY_MAX_CONCURRENT_SUMMARIES,
        "deployments": deployments,
        "ratios": {
            # the issue's targets: >= 0.9 and >= 0.6
            "api_worker_vs_summaries_off": ratio("api_off+worker", "api_off"),
            "summaries_off_vs_floor": ratio("api_off", "floor"),
            # for comparison
            "combined_vs_summaries_off": ratio("combined", "api_off"),
            "api_worker_vs_2_combined": ratio("api_off+worker", "2x_combined"),
            "combined_vs_floor": ratio("combined", "floor"),
        },
        "drains": drains,
    }


# ---- 7: summary concurrency sizing -------------------------------------------------------------


async def _sizing_run(b: Bench, cap: int) -> dict[str, Any]:
    """A worker with MEMORY_MAX_CONCURRENT_SUMMARIES=cap on a backlog of due conversations: the
    summaries it completes per second once warmed up, and what that costs in CPU."""
    scale = b.scale
    like = sizing_prefix(cap) + "-%"
    await b.llm_control(latency=scale.sizing_llm_latency, reset=True)
    worker = await b.start_worker(f"worker-cap{cap}", {"MEMORY_MAX_CONCURRENT_SUMMARIES": str(cap)})
    try:
        max_id = await b.db.fetchval("SELECT coalesce(max(memory_id), 0) FROM memory")
        backlog = await b.db.fetchval(
            "WITH due AS (UPDATE conversations SET summary_due_at = now() WHERE conversation_id LIKE $1"
            " RETURNING 1) SELECT count(*) FROM due",
            like,
        )
        await asyncio.sleep(scale.sizing_warmup_seconds)
        count_sql = (
            "SELECT count(*) AS n, clock_timestamp() AS at FROM memory"
            " WHERE memory_id > $1 AND status = 'completed' AND conversation_id LIKE $2"
        )
        before = await b.db.fetchrow(count_sql, max_id, like)
        cpu0, db0, machine0 = worker.cpu_seconds(), await b.postgres_cpu(), machine_busy_seconds()
        wall0 = time.perf_counter()
        await asyncio.sleep(scale.sizing_seconds)
        after = await b.db.fetchrow(count_sql, max_id, like)
        wall = time.perf_counter() - wall0
        cpu, db_cpu = worker.cpu_seconds() - cpu0, cpu_delta(db0, await b.postgres_cpu())
        machine = machine_busy_seconds() - machine0
        llm = await b.llm_control()
        left = await b.db.fetchval(
            "SELECT count(*) FROM conversations WHERE conversation_id LIKE $1 AND summary_due_at IS NOT NULL",
            like,
        )
        failed = await b.db.fetchval(
            "SELECT count(*) FROM memory"
            " WHERE memory_id > $1 AND status = 'failed' AND conversation_id LIKE $2",
            max_id,
            like,
        )
    finally:
        await b.stop_child(worker)
    # What the run left (due conversations, rows given back at shutdown) must not reach the next run.
    await b.db.execute("UPDATE conversations SET summary_due_at = NULL WHERE conversation_id LIKE $1", like)
    await b.db.execute("DELETE FROM memory WHERE status = 'processing' AND conversation_id LIKE $1", like)
    completed = int(after["n"]) - int(before["n"])
    seconds = (after["at"] - before["at"]).total_seconds()
    rate = completed / seconds if seconds > 0 else 0.0
    return {
        "max_concurrent_summaries": cap,
        "backlog": backlog,
        "summaries_completed": completed,
        "seconds": round(seconds, 2),
        "summaries_per_second": round(rate, 1),
        # the most a cap of this size can do with this LLM latency
        "ideal_per_second": round(cap / scale.sizing_llm_latency, 1) if scale.sizing_llm_latency else None,
        "efficiency": round(rate * scale.sizing_llm_latency / cap, 3) if scale.sizing_llm_latency else None,
        "llm_max_in_flight": llm["max_in_flight"],
        "still_due_at_end": left,
        "backlog_ran_dry": left == 0,
        "failed": failed,
        "cpu_cores": {
            "worker": round(cpu / wall, 2),
            "postgres": round(db_cpu / wall, 2),
            "machine": round(machine / wall, 2),
        },
        "cpu_ms_per_summary": {
            "worker": round(1000 * cpu / completed, 2) if completed else None,
            "postgres": round(1000 * db_cpu / completed, 2) if completed else None,
        },
    }


async def summary_concurrency(b: Bench) -> dict[str, Any]:
    """Summaries/s of one `memory-service worker` per MEMORY_MAX_CONCURRENT_SUMMARIES value, the
    LLM at scale.sizing_llm_latency: how many slots an I/O-bound summary needs."""
    scale = b.scale
    await b.stop_main_service()
    runs = {str(cap): await _sizing_run(b, cap) for cap in scale.sizing_caps}
    return {
        "llm_latency_seconds": scale.sizing_llm_latency,
        "warmup_seconds": scale.sizing_warmup_seconds,
        "seconds": scale.sizing_seconds,
        "backlogs": {str(cap): sizing_backlog(scale, cap) for cap in scale.sizing_caps},
        "runs": runs,
    }


# ---- 9: what exact token counting costs on the append path -------------------------------------

COUNTING_CONVERSATIONS = 8  # POSTed concurrently, one round at a time each


async def _post_rounds(b: Bench, rounds: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """POST ``rounds`` over COUNTING_CONVERSATIONS token_budget conversations (auto_compress off:
    nothing is summarized, so the service's CPU is the append path's), one client each."""
    url = b.svc.base_url
    for i in range(COUNTING_CONVERSATIONS):
        created = await b.http.post(
            f"{url}/conversations",
            json={
                "conversation_id": f"count-{i}",
                "memory_policy": {"name": "token_budget", "auto_compress": False},
            },
        )
        created.raise_for_status()
    latencies: list[float] = []
    errors = 0

    async def client(i: int) -> None:
        nonlocal errors
        for r in range(i, len(rounds), COUNTING_CONVERSATIONS):
            t0 = time.perf_counter()
            posted = await b.http.post(
                f"{url}/conversations/count-{i}/messages", json={"messages": rounds[r]}
            )
            if i:  # count-0 is the warm-up
                latencies.append(time.perf_counter() - t0)
            errors += posted.status_code != 201

    await client(0)  # warm-up, unmeasured: count-0's rounds, one at a time
    cpu0, t0 = b.svc.cpu_seconds(), time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(1, COUNTING_CONVERSATIONS)))
    wall, cpu = time.perf_counter() - t0, b.svc.cpu_seconds() - cpu0
    done = len(rounds) - len(range(0, len(rounds), COUNTING_CONVERSATIONS))
    return {
        "rounds": done,
        "errors": errors,
        "rounds_per_second": round(done / wall, 1),
        "service_cpu_us_per_round": round(cpu / done * 1e6, 1),
        "latency_ms": summarize_plain([x * 1000 for x in latencies]),
    }


async def counting(b: Bench) -> dict[str, Any]:
    """Exact token counting (tiktoken, app/memory/tokens.py, the deployment's model) of typical
    agent rounds: the CPU time counting a round's messages takes in-process (median of 5 passes
    after a warm one), next to the service's whole CPU per POSTed round of the same rounds, and
    the cheapest estimate (ceil(JSON bytes / 4)) for scale."""
    agents = b.seeder.agents
    per = ENTRIES_PER_AGENT_ROUND
    rounds = [
        [agents.posted(seq) for seq in range(r * per, (r + 1) * per)] for r in range(b.scale.counting_rounds)
    ]
    counter = agents.counter
    exact: list[list[int]] = [[] for _ in rounds]
    approx: list[list[int]] = [[] for _ in rounds]
    tokens = [0] * len(rounds)
    for passes in range(6):
        for r, messages in enumerate(rounds):
            t0 = time.process_time_ns()
            tokens[r] = sum(counter.message(m) for m in messages)
            t1 = time.process_time_ns()
            sum(-(-len(orjson.dumps(m)) // 4) for m in messages)
            t2 = time.process_time_ns()
            if passes:
                exact[r].append(t1 - t0)
                approx[r].append(t2 - t1)
    exact_us = [median([float(x) for x in ns]) / 1000 for ns in exact]
    approx_us = [median([float(x) for x in ns]) / 1000 for ns in approx]
    posted = await _post_rounds(b, rounds)
    # The service stored the same counts (so the seeded budget-N entries carry the service's too).
    stored = [
        (await b.http.get(f"{b.svc.base_url}/conversations/count-{i}/stats")).json()["total_tokens"]
        for i in range(COUNTING_CONVERSATIONS)
    ]
    expected = [sum(tokens[i::COUNTING_CONVERSATIONS]) for i in range(COUNTING_CONVERSATIONS)]
    counting_us = median(exact_us)
    return {
        "model": counter.model,
        "encoding": counter.encoding_name,
        "exact": counter.exact,
        "entries_per_round": per,
        "round_bytes_median": median([float(len(orjson.dumps({"messages": m}))) for m in rounds]),
        "round_tokens_median": median([float(t) for t in tokens]),
        "counting_us_per_round": summarize_plain(exact_us),
        "estimate_us_per_round": summarize_plain(approx_us),
        "post": posted,
        "tokens_as_stored": stored == expected,
        # the share of the service's CPU per POSTed round that counting its messages takes
        "counting_share_of_post_cpu": round(counting_us / posted["service_cpu_us_per_round"], 4)
        if posted["service_cpu_us_per_round"]
        else None,
    }
