"""Targets and checks, the printed table, and the JSON file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

# Performance targets from the issue: reported, and fail the run only with --strict.
TARGETS = {
    "context_cost_ratio": ("<=", 1.1, "GET context: largest conversation's cost / smallest's (1/throughput)"),
    "post_p99_ratio": ("<=", 1.2, "POST round p99 with the slow LLM / with the fast LLM"),
    "floor_ratio": (">=", 0.6, "GET context throughput / floor app's (geometric mean over sizes)"),
    "context_tokens_growth": ("<=", 1.1, "context tokens, last fifth of rounds / first fifth (flat = 1)"),
    "llm_input_growth": ("<=", 1.1, "LLM input tokens per summary, last fifth / first fifth (flat = 1)"),
    "mixed_lag_p99_ratio": (
        "<=",
        3.0,
        "mixed: summary lag p99 (round POST -> first completed summary covering it) / LLM latency",
    ),
    "append_worker_ratio": (
        ">=",
        0.9,
        "append throughput: API with summaries off + 1 worker / API with summaries off, no worker",
    ),
    "append_floor_ratio": (">=", 0.6, "append throughput: API with summaries off / write floor app"),
}


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 1) -> str:
    cells = [[str(h) for h in headers], *[[_fmt(v, digits) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(
            "  "
            + "  ".join(
                c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _policies(section: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A context or floor section's results by memory policy (results written before policies:
    the section itself, which was the sliding window's)."""
    policies: dict[str, dict[str, Any]] | None = section.get("policies")
    return policies if policies else {"sliding_window": section}


def target_name(base: str, policy: str) -> str:
    """Per-policy target names; the sliding window keeps the name it had before policies."""
    return base if policy == "sliding_window" else f"{base}.{policy}"


def evaluate(doc: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(targets, checks). Checks are correctness (errors, stuck rows) and always count."""
    res = doc["results"]
    values: dict[str, tuple[str, str | None, Any]] = {}  # name -> (TARGETS key, policy, value)
    if "context" in res:
        for policy, section in _policies(res["context"]).items():
            name = target_name("context_cost_ratio", policy)
            values[name] = ("context_cost_ratio", policy, section["cost_ratio"])
    if "post" in res:
        values["post_p99_ratio"] = ("post_p99_ratio", None, res["post"]["p99_ratio"])
    if "floor" in res:
        for policy, section in _policies(res["floor"]).items():
            if "ratio" in section:
                values[target_name("floor_ratio", policy)] = ("floor_ratio", policy, section["ratio"])
    if "tokens" in res:
        values["context_tokens_growth"] = ("context_tokens_growth", None, res["tokens"]["context_growth"])
        values["llm_input_growth"] = ("llm_input_growth", None, res["tokens"]["llm_input_growth"])
    if "mixed" in res:
        for latency, run in res["mixed"]["runs"].items():
            values[f"mixed_lag_p99_ratio.{latency}s"] = (
                "mixed_lag_p99_ratio",
                None,
                run["lag_p99_over_llm_latency"],
            )
    if "append" in res:
        ratios = res["append"]["ratios"]
        for name, key in (
            ("append_worker_ratio", "api_worker_vs_summaries_off"),
            ("append_floor_ratio", "summaries_off_vs_floor"),
        ):
            if ratios.get(key) is not None:
                values[name] = (name, None, ratios[key])
    targets = []
    for name, (key, of_policy, value) in values.items():
        op, limit, what = TARGETS[key]
        ok = value is not None and (value <= limit if op == "<=" else value >= limit)
        entry = {"name": name, "value": value, "target": f"{op} {limit}", "pass": ok, "what": what}
        if of_policy is not None:
            entry["policy"] = of_policy
            entry["what"] = f"{what} [{of_policy}]"
        targets.append(entry)

    checks = []

    def check(name: str, value: Any, ok: bool) -> None:
        checks.append({"name": name, "value": value, "pass": ok})

    for key in ("context", "floor"):
        if key in res:
            cells = [cell for section in _policies(res[key]).values() for cell in section["sizes"].values()]
            errors = sum(cell["errors"] for cell in cells)
            check(f"{key}: HTTP errors", errors, errors == 0)
            # summaries, newest summary's end and raw messages as seeded, for every policy and size
            wrong = sum(1 for cell in cells if cell.get("shape_ok") is False)
            if any("shape_ok" in cell for cell in cells):
                check(f"{key}: context shape as seeded (cells wrong)", wrong, wrong == 0)
            refused = sum(1 for cell in cells if cell.get("import_ok") is False)
            if any("import_ok" in cell for cell in cells):
                check(f"{key}: seeded conversations the import refuses", refused, refused == 0)
    if "post" in res:
        for label, run in res["post"]["runs"].items():
            check(f"post ({label} LLM): HTTP errors", run["errors"], run["errors"] == 0)
            check(
                f"post ({label} LLM): summaries failed", run["summaries_failed"], run["summaries_failed"] == 0
            )
    if "mixed" in res:
        for latency, m in res["mixed"]["runs"].items():
            at = f"mixed ({latency} s LLM)"
            check(f"{at}: HTTP errors", m["errors"], m["errors"] == 0)
            check(f"{at}: stuck rows after drain", m["stuck"], m["stuck"] == 0)
            check(f"{at}: summaries failed", m["summaries_failed"], m["summaries_failed"] == 0)
            check(f"{at}: drained in time", not m["drain"]["timed_out"], not m["drain"]["timed_out"])
            due_left = m["drain"]["due_left"]
            check(f"{at}: due conversations left after drain", due_left, due_left == 0)
    if "tokens" in res:
        t = res["tokens"]
        check("tokens: summaries failed", t["summaries_failed"], t["summaries_failed"] == 0)
    if "append" in res:
        a = res["append"]
        errors = sum(d["errors"] for d in a["deployments"].values())
        check("append: HTTP errors", errors, errors == 0)
        late = sum(1 for d in a["drains"] if d["timed_out"])
        check("append: drains that timed out", late, late == 0)
    if "transfer" in res:
        x = res["transfer"]
        check(
            "transfer: export, import, export identical", x["round_trip_identical"], x["round_trip_identical"]
        )
    if "counting" in res:
        errors = res["counting"]["post"]["errors"]
        check("counting: HTTP errors", errors, errors == 0)
        same = res["counting"]["tokens_as_stored"]
        check("counting: the service stored the same token counts", same, same)
    if "sizing" in res:
        runs = res["sizing"]["runs"].values()
        failed = sum(r["failed"] for r in runs)
        check("sizing: summaries failed", failed, failed == 0)
        dry = [r["max_concurrent_summaries"] for r in runs if r["backlog_ran_dry"]]
        check("sizing: runs whose backlog ran dry (rate understated)", len(dry), not dry)
    return targets, checks


def render(doc: dict[str, Any]) -> str:
    meta, res = doc["meta"], doc["results"]
    out: list[str] = []
    out.append(
        f"memory-service benchmark  scale={meta['scale']['name']}  commit={meta.get('git_commit')}"
        f"{' (app/ modified)' if meta.get('app_tree_dirty') else ''}  cpus={meta.get('cpus')}  "
        f"python={meta.get('python')}  postgres={meta.get('postgres', '-')}  "
        f"loadgen={meta.get('loadgen', '-')}"
        + (
            f"  api_core={meta['api_core']} (HTTP processes there alone, the rest on the other CPUs)"
            if meta.get("api_core") is not None
            else ""
        )
    )
    if "context" in res or "floor" in res:
        base = res.get("context") or res["floor"]
        out.append(
            f"\n[1] GET context per memory policy (closed loop, {base['concurrency']} connections, "
            f"{base['repeats']} x {base['duration_seconds']:g}s after {base['warmup_seconds']:g}s "
            "warm-up, medians)"
        )
        out.extend(_render_context(res))
    if "post" in res:
        p = res["post"]
        out.append(
            f"\n[2] POST a round (open loop, {p['rate']:g} req/s, {p['repeats']} x "
            f"{p['duration_seconds']:g}s per LLM latency, interleaved, medians; "
            f"{p['conversations']:,} conversations)"
        )
        rows = []
        for label, run in p["runs"].items():
            lat = run["latency_ms"].get("post", {})
            rows.append(
                [
                    f"{label} ({run['llm_latency_seconds']:g} s)",
                    lat.get("p50"),
                    lat.get("p90"),
                    lat.get("p99"),
                    lat.get("max"),
                    run["throughput_rps"],
                    run["errors"],
                    run["summaries_started"],
                    run["queued_at_end"],
                    run["cpu_cores"].get("service"),
                    run["cpu_cores"].get("machine"),
                ]
            )
        out.append(
            table(
                [
                    "LLM",
                    "p50 ms",
                    "p90 ms",
                    "p99 ms",
                    "max ms",
                    "req/s",
                    "errors",
                    "summaries",
                    "queued at end",
                    "svc cores",
                    "machine cores",
                ],
                rows,
                digits=2,
            )
        )
        out.append(f"  p99 ratio slow/fast: {_fmt(p['p99_ratio'], 3)}   p50 ratio: {_fmt(p['p50_ratio'], 3)}")
        out.append(
            "  p99 of each run (ms): "
            + "; ".join(f"{label} {run['p99_each_run']}" for label, run in p["runs"].items())
        )
    if "mixed" in res:
        out.extend(_render_mixed(res["mixed"]))
    floor_ratios = (
        {
            policy: section["ratio"]
            for policy, section in _policies(res["floor"]).items()
            if "ratio" in section
        }
        if "floor" in res
        else {}
    )
    if floor_ratios:
        out.append(
            "\n[4] Floor (Starlette + asyncpg, same SQL): ours/floor throughput (geometric mean over "
            "sizes; per size in table [1]): "
            + ", ".join(f"{policy} {_fmt(ratio, 3)}" for policy, ratio in floor_ratios.items())
        )
    if "tokens" in res:
        t = res["tokens"]
        out.append(
            f"\n[5] Tokens over {t['rounds']} rounds ({t['summaries']} summaries); "
            f"tokenizer: {t['tokenizer_note']}"
        )
        rows = [
            [
                r["round"],
                r["context_tokens"],
                r["memory_tokens"],
                r["gap_messages"],
                r["full_history_tokens"],
                r["llm_input_tokens"],
            ]
            for r in t["checkpoints"]
        ]
        out.append(
            table(
                ["round", "context", "memory", "gap msgs", "full history", "LLM input/summary"],
                rows,
                digits=0,
            )
        )
        out.append(
            f"  growth (last fifth / first fifth): context {_fmt(t['context_growth'], 3)}, LLM input "
            f"{_fmt(t['llm_input_growth'], 3)}, full history {_fmt(t['full_history_growth'], 3)}"
        )
        out.append(
            f"  saving vs full history every round: context {_pct(t['context_saving'])} overall, "
            f"{_pct(t['context_saving_last_round'])} at the last round; "
            f"LLM input {_pct(t['llm_input_saving'])}"
        )
    if "append" in res:
        out.extend(_render_append(res["append"]))
    if "transfer" in res:
        x = res["transfer"]
        out.append(
            f"\n[8] Export and import of a token_budget conversation: {x['entries']:,} entries, "
            f"{x['memories']} memory rows, {x['document_bytes']:,} bytes; "
            f"export {x['export_median_seconds']:.3f} s, "
            f"import {x['import_median_seconds']:.3f} s (medians of 3, client wall time); round trip "
            f"{'identical' if x['round_trip_identical'] else 'DIFFERENT'}"
        )
    if "counting" in res:
        out.extend(_render_counting(res["counting"]))
    if "sizing" in res:
        out.extend(_render_sizing(res["sizing"]))
    targets, checks = doc["targets"], doc["checks"]
    if targets:
        out.append("\nTargets")
        out.append(
            table(
                ["target", "value", "goal", "result"],
                [[t["name"], t["value"], t["target"], "PASS" if t["pass"] else "MISS"] for t in targets],
                digits=3,
            )
        )
    if checks:
        out.append("\nChecks")
        out.append(
            table(
                ["check", "value", "result"],
                [[c["name"], c["value"], "ok" if c["pass"] else "FAILED"] for c in checks],
            )
        )
    log = meta.get("service_log", {})
    if log:
        out.append(f"\nService log: {log.get('warnings', 0)} warnings, {log.get('errors', 0)} errors")
        for text, count in log.get("top_warnings", []):
            out.append(f"  {count:>6} x {text}")
    out.append(f"\nTotal {meta.get('total_seconds')}s; timings {meta.get('timings')}")
    return "\n".join(out)


def _render_context(res: dict[str, Any]) -> list[str]:
    """Table [1]: one block of rows per policy, then its cost ratios."""
    out: list[str] = []
    context = _policies(res["context"]) if "context" in res else {}
    floor = _policies(res["floor"]) if "floor" in res else {}
    headers = [
        "policy",
        "messages",
        "summ",
        "raw",
        "KiB",
        "p50 ms",
        "p99 ms",
        "req/s",
        "svc cores",
        "pg cores",
        "machine",
        "floor p50",
        "floor req/s",
        "ours/floor",
        "SQL ms",
    ]
    rows = []
    for policy in context or floor:
        c, f = context.get(policy), floor.get(policy)
        explain = (c or f or {}).get("explain", {})
        for size in (c or f or {})["sizes"]:
            s = c["sizes"][size] if c else None
            fl = f["sizes"][size] if f else None
            shape = s or fl or {}
            rows.append(
                [
                    policy,
                    f"{int(size):,}",
                    shape.get("summaries"),
                    shape.get("gap_messages"),
                    shape["bytes"] / 1024 if shape.get("bytes") is not None else None,
                    s["p50_ms"] if s else None,
                    s["p99_ms"] if s else None,
                    s["throughput_rps"] if s else None,
                    s["cpu_cores"].get("service") if s else None,
                    s["cpu_cores"].get("postgres") if s else None,
                    s["cpu_cores"].get("machine") if s else None,
                    fl["p50_ms"] if fl else None,
                    fl["throughput_rps"] if fl else None,
                    f.get("ratio_by_size", {}).get(size) if f else None,
                    explain.get(size, {}).get("custom", {}).get("execution_ms"),
                ]
            )
    out.append(table(headers, rows, digits=2))
    for policy, c in context.items():
        line = (
            f"  {policy}: cost {c['largest']:,} vs {c['smallest']:,} messages (throughput ratio) "
            f"{_fmt(c['cost_ratio'], 3)}   p50 ratio {_fmt(c['p50_ratio'], 3)}"
        )
        if c.get("same_shape_base") is not None:
            line += (
                f"   same-shape cost {c['largest']:,} vs {c['same_shape_base']:,} "
                f"{_fmt(c.get('cost_ratio_same_shape'), 3)}"
            )
        if c.get("summarized_base") not in (None, c["smallest"], c.get("same_shape_base")):
            line += (
                f"   with summaries: cost {c['largest']:,} vs {c['summarized_base']:,} "
                f"{_fmt(c.get('cost_ratio_summarized'), 3)}"
            )
        if policy in floor and floor[policy].get("ratio") is not None:
            line += f"   ours/floor {_fmt(floor[policy]['ratio'], 3)}"
        out.append(line)
    return out


def _render_mixed(m: dict[str, Any]) -> list[str]:
    """Table [3]: one row per LLM latency, then request latencies and the other lag measures."""
    out = [
        f"\n[3] Mixed traffic ({m['conversations']:,} conversations per LLM latency, {m['clients']} clients, "
        f"{m['rounds_per_conversation']} rounds each = GET context + POST round; "
        f"MEMORY_MAX_CONCURRENT_SUMMARIES={m.get('max_concurrent_summaries')}"
        + (
            f"; an API replica with summaries off + {m['deployment'].split('+', 1)[1]}"
            if m.get("deployment", "combined") != "combined"
            else ""
        )
        + "); summary lag = a round's "
        "POST -> the first completed summary covering it; drain with the LLM at the same latency"
    ]
    rows = []
    for latency, r in m["runs"].items():
        lag = r["summary_lag_seconds"]["round_to_first_covering_summary"]
        cpu = r["cpu_seconds_per_round"]
        rows.append(
            [
                f"{latency} s",
                r["rounds"],
                r["rounds_per_second"],
                r["errors"],
                lag.get("p50"),
                lag.get("p99"),
                lag.get("max"),
                r["lag_p99_over_llm_latency"],
                r["llm_calls_per_round"],
                1000 * cpu["service"] if cpu["service"] is not None else None,
                1000 * cpu["service_with_drain"] if cpu["service_with_drain"] is not None else None,
                1000 * cpu["postgres"] if cpu["postgres"] is not None else None,
                r["drain"]["seconds"],
                r["drain"]["due_left"],
            ]
        )
    out.append(
        table(
            [
                "LLM",
                "rounds",
                "rounds/s",
                "errors",
                "lag p50 s",
                "lag p99 s",
                "lag max s",
                "p99/LLM",
                "LLM calls/round",
                "svc CPU ms/round",
                "+drain",
                "pg CPU ms/round",
                "drain s",
                "due left",
            ],
            rows,
            digits=2,
        )
    )
    rows = []
    for latency, r in m["runs"].items():
        for name in ("get_context", "post_round"):
            lat = r["latency_ms"].get(name, {})
            rows.append(
                [
                    f"{latency} s",
                    name,
                    lat.get("count"),
                    lat.get("p50"),
                    lat.get("p90"),
                    lat.get("p99"),
                    lat.get("max"),
                ]
            )
    out.append(table(["LLM", "request", "count", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows, digits=2))
    for latency, r in m["runs"].items():
        lags = r["summary_lag_seconds"]
        window, row = lags["from_last_message_of_window"], lags["from_memory_row_created"]
        per_round = _fmt(r["summaries_per_round"], 2)
        oldest = _fmt(r["runner_max_oldest_due_seconds"])
        out.append(
            f"  {latency} s: summaries {r['summaries_completed']:,} ({per_round}/round), "
            f"failed {r['summaries_failed']}, stuck {r['stuck']}; per summary p50/p99: from the "
            f"window's last message {_fmt(window.get('p50'), 2)}/{_fmt(window.get('p99'), 2)} s, "
            f"from its row {_fmt(row.get('p50'), 2)}/{_fmt(row.get('p99'), 2)} s; rounds never "
            f"covered {lags['rounds_never_covered']}; max running {r['runner_max_running']}, "
            f"queued {r['runner_max_queued']}, due {r['runner_max_due']} (oldest {oldest} s); "
            f"LLM max in flight {r['llm_max_in_flight']}"
        )
    return out


def _render_append(a: dict[str, Any]) -> list[str]:
    out = [
        f"\n[6] Append throughput (closed loop of POSTs, {a['concurrency']} connections over "
        f"{a['conversations']:,} conversations, {a['repeats']} x {a['duration_seconds']:g}s after "
        f"{a['warmup_seconds']:g}s warm-up, medians; LLM {a['llm_latency_seconds']:g} s, "
        f"MEMORY_MAX_CONCURRENT_SUMMARIES={a.get('max_concurrent_summaries')})"
    ]
    rows = []
    for name, d in a["deployments"].items():
        cores, per_round = d["cpu_cores"], d.get("cpu_ms_per_round", {})
        own = [k for k in cores if k not in ("postgres", "machine")]
        rows.append(
            [
                name,
                d["throughput_rps"],
                d["p50_ms"],
                d["p99_ms"],
                d["errors"],
                d["summaries_per_second"],
                d["due_at_end"],
                sum(cores[k] for k in own),
                cores.get("worker"),
                cores.get("postgres"),
                cores.get("machine"),
                sum(per_round.get(k, 0.0) for k in own),
                per_round.get("postgres"),
            ]
        )
    out.append(
        table(
            [
                "deployment",
                "rounds/s",
                "p50 ms",
                "p99 ms",
                "errors",
                "summaries/s",
                "due at end",
                "app cores",
                "worker cores",
                "pg cores",
                "machine",
                "app CPU ms/round",
                "pg CPU ms/round",
            ],
            rows,
            digits=2,
        )
    )
    r = a["ratios"]
    out.append(
        f"  API + worker / summaries off {_fmt(r['api_worker_vs_summaries_off'], 3)} (target >= 0.9); "
        f"summaries off / write floor {_fmt(r['summaries_off_vs_floor'], 3)} (target >= 0.6); "
        f"combined / summaries off {_fmt(r['combined_vs_summaries_off'], 3)}; API + worker / 2 combined "
        f"{_fmt(r['api_worker_vs_2_combined'], 3)}; combined / floor {_fmt(r['combined_vs_floor'], 3)}"
    )
    return out


def _render_counting(c: dict[str, Any]) -> list[str]:
    """[9]: counting a round's tokens against the service's CPU per POSTed round."""
    post = c["post"]
    return [
        f"\n[9] Token counting on the append path ({c['encoding']}{'' if c['exact'] else ', approximate'}): "
        f"agent rounds of {c['entries_per_round']} entries, {c['round_bytes_median']:,.0f} bytes, "
        f"{c['round_tokens_median']:,.0f} tokens (medians)",
        f"  counting a round {_fmt(c['counting_us_per_round']['p50'])} us CPU (p99 "
        f"{_fmt(c['counting_us_per_round']['p99'])}; bytes/4 estimate "
        f"{_fmt(c['estimate_us_per_round']['p50'])} us); "
        f"POST {_fmt(post['service_cpu_us_per_round'])} us service CPU per round, "
        f"{_fmt(post['rounds_per_second'])} rounds/s, p50 {_fmt(post['latency_ms']['p50'], 2)} ms: "
        f"counting is {_pct(c['counting_share_of_post_cpu'])} of the POST's CPU",
    ]


def _render_sizing(z: dict[str, Any]) -> list[str]:
    out = [
        f"\n[7] Summary concurrency: one `memory-service worker` on a backlog of due conversations, LLM "
        f"{z['llm_latency_seconds']:g} s, measured {z['seconds']:g}s after {z['warmup_seconds']:g}s"
    ]
    rows = []
    for cap, r in z["runs"].items():
        rows.append(
            [
                int(cap),
                r["backlog"],
                r["summaries_completed"],
                r["summaries_per_second"],
                r["ideal_per_second"],
                r["efficiency"],
                r["llm_max_in_flight"],
                r["cpu_cores"]["worker"],
                r["cpu_cores"]["postgres"],
                r["cpu_cores"]["machine"],
                r["cpu_ms_per_summary"]["worker"],
                r["cpu_ms_per_summary"]["postgres"],
            ]
        )
    out.append(
        table(
            [
                "max concurrent",
                "backlog",
                "completed",
                "summaries/s",
                "cap/latency",
                "efficiency",
                "LLM in flight",
                "worker cores",
                "pg cores",
                "machine",
                "worker CPU ms/summary",
                "pg CPU ms/summary",
            ],
            rows,
            digits=2,
        )
    )
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def write_json(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
