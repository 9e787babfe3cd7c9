"""The five scenarios. Each returns a JSON-able dict; checks and targets are derived in report."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from app.repositories.memory import CONTEXT_SQL
from bench.floor_app import CONTEXT_LIMITS
from bench.seed import CONTEXT_PREFIXES, POLICIES, SLIDING_WINDOW, ConversationSeed
from bench.stats import geomean, median, summarize_plain
from bench.textgen import rng_for, round_messages
from bench.tokens import get_counter

if TYPE_CHECKING:
    from bench.harness import Bench


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
        await conn.execute("PREPARE bench_context(varchar, varchar, integer, integer) AS " + CONTEXT_SQL)
        try:
            for mode in ("custom", "generic"):
                await conn.execute(f"SET plan_cache_mode = force_{mode}_plan")
                rows: list[str] = []
                for _ in range(3):  # the last run is warm
                    rows = [
                        r[0]
                        for r in await conn.fetch(
                            f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_context('{literal}', 'default', "
                            f"{CONTEXT_LIMITS[0]}, {CONTEXT_LIMITS[1]})"
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
    runner = await b.runner_stats()
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
        "runner_at_end": runner,
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
            "queued_at_end": max(int(r["runner_at_end"].get("waiting", 0)) for r in results),
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


async def _sample_runner(b: Bench, samples: list[dict[str, Any]], stop: asyncio.Event) -> None:
    began = time.perf_counter()
    while not stop.is_set():
        try:
            stats = await b.runner_stats()
        except Exception:
            stats = {}
        samples.append({"t": round(time.perf_counter() - began, 2), **stats})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)


async def mixed(b: Bench) -> dict[str, Any]:
    scale = b.scale
    conversations = [f"mix-{i}" for i in range(scale.mixed_conversations)]
    await b.llm_control(latency=scale.mixed_llm_latency, reset=True)
    max_id = await b.db.fetchval("SELECT coalesce(max(memory_id), 0) FROM memory")
    db_start = await b.db.fetchval("SELECT clock_timestamp()")
    samples: list[dict[str, Any]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_runner(b, samples, stop))
    try:
        result = await b.run_load(
            {
                "kind": "mixed",
                "conversations": conversations,
                "clients": scale.mixed_clients,
                "rounds": scale.mixed_rounds,
                "seed": "mixed",
            },
            target=b.svc,
            label="mixed",
        )
        drain = await b.wait_idle(scale.drain_timeout_seconds)
    finally:
        stop.set()
        await sampler
    llm = await b.llm_control(latency=0)
    stuck_response = await b.http.get(
        b.svc.base_url + "/ops/memories/stuck", params={"older_than_seconds": 0}
    )
    stuck_response.raise_for_status()
    stuck = stuck_response.json()
    # Per summary (the definition): completed_at minus the created_at of the last message
    # of its window, and minus the created_at of the memory row itself (queue + generation).
    per_summary = await b.db.fetch(
        """
        SELECT extract(epoch FROM m.completed_at - g.created_at)::float8 AS from_last_message,
               extract(epoch FROM m.completed_at - m.created_at)::float8 AS from_row
        FROM memory m
        JOIN messages g ON g.conversation_id = m.conversation_id AND g.sequence = m.end_sequence
        WHERE m.memory_id > $1 AND m.status = 'completed' AND m.conversation_id LIKE 'mix-%'
        """,
        max_id,
    )
    # Per round: from the round's last message to the first completed memory that covers it
    # (rounds that no summary started for are covered by a later one).
    per_round = await b.db.fetch(
        """
        SELECT extract(epoch FROM (
                   SELECT min(m.completed_at) FROM memory m
                   WHERE m.conversation_id = g.conversation_id AND m.status = 'completed'
                     AND m.end_sequence >= g.sequence) - g.created_at)::float8 AS lag
        FROM messages g
        WHERE g.conversation_id LIKE 'mix-%' AND g.created_at >= $1 AND g.role = 'assistant'
        """,
        db_start,
    )
    counts = await b.db.fetchrow(
        """
        SELECT count(*) FILTER (WHERE status = 'completed') AS completed,
               count(*) FILTER (WHERE status = 'failed') AS failed,
               count(*) FILTER (WHERE status = 'processing') AS processing
        FROM memory WHERE memory_id > $1 AND conversation_id LIKE 'mix-%'
        """,
        max_id,
    )
    behind = await b.db.fetchval(
        """
        SELECT count(*) FROM conversations c
        WHERE c.conversation_id LIKE 'mix-%' AND c.next_sequence > 0
          AND coalesce((SELECT max(m.end_sequence) FROM memory m
                        WHERE m.conversation_id = c.conversation_id AND m.status = 'completed'), -1)
              < c.next_sequence - 1
        """
    )
    round_lags = [r["lag"] for r in per_round if r["lag"] is not None]
    return {
        "conversations": scale.mixed_conversations,
        "clients": scale.mixed_clients,
        "rounds_per_conversation": scale.mixed_rounds,
        "llm_latency_seconds": scale.mixed_llm_latency,
        **result,
        "summary_lag_seconds": {
            "from_last_message_of_window": summarize_plain(r["from_last_message"] for r in per_summary),
            "from_memory_row_created": summarize_plain(r["from_row"] for r in per_summary),
            "round_to_first_covering_memory": summarize_plain(round_lags),
            "rounds_never_covered": len(per_round) - len(round_lags),
        },
        "summaries_completed": counts["completed"],
        "summaries_failed": counts["failed"],
        "conversations_memory_behind_at_end": behind,
        "drain": drain,
        "stuck": len(stuck),
        "stuck_rows": stuck[:5],
        "runner_max_running": max((s.get("running", 0) for s in samples), default=0),
        "runner_max_waiting": max((s.get("waiting", 0) for s in samples), default=0),
        "llm_requests": llm["requests"],
        "llm_max_in_flight": llm["max_in_flight"],
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
            if posted.json().get("memory") is not None:
                failed += await _wait_summary(b, url, cid)
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


async def _wait_summary(b: Bench, url: str, cid: str, limit_seconds: float = 60.0) -> int:
    """Wait until the conversation has no summary processing; 1 if the last one failed."""
    deadline = time.monotonic() + limit_seconds
    while True:
        response = await b.http.get(f"{url}/conversations/{cid}/context")
        response.raise_for_status()
        if response.json()["processing"] is None:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"summary of {cid} still processing after {limit_seconds}s")
        await asyncio.sleep(0.005)
    latest = await b.db.fetchval(
        "SELECT status FROM memory WHERE conversation_id = $1 ORDER BY memory_id DESC LIMIT 1", cid
    )
    return 1 if latest == "failed" else 0
