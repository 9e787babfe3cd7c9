"""python -m bench: benchmark the memory service end to end on a local PostgreSQL.

Creates its own database on the server (CREATE DATABASE memory_bench_<pid>_<hex>, dropped at the
end), migrates it with `memory-service migrate`, seeds it with COPY, starts a fake
OpenAI-compatible LLM, the service (uvicorn app.main:app --no-access-log) and a floor app in
their own processes, drives them from a separate load-generator process, prints a table and
writes JSON to bench/results/.

Scenarios: context (GET context on conversations of 10 / 1,000 / 100,000 messages, per memory
policy: sliding window, rolling blocks and token budget), post (POST latency with a 0 s and a 2 s LLM), mixed
(1,000 conversations, 50 clients, GET + POST rounds, with a 1 s and a 2 s LLM: summary lag, LLM
calls and CPU per round, drain), floor (a minimal Starlette + asyncpg app running the same SQL),
tokens (context and LLM input size over 300 rounds against sending the full history), transfer
(export and import time of a 10,000-entry conversation), counting (what exact token
counting costs per POSTed agent round), append
(POST throughput of an API replica with summaries off, with a worker, combined, two combined
replicas, and the write floor), sizing (summaries/s of a worker per
MEMORY_MAX_CONCURRENT_SUMMARIES with a 1 s LLM).

Exit status: 0 when every correctness check passed (no HTTP errors, no stuck or failed
summaries), 1 when one did not (or, with --strict, when a performance target was missed),
2 when the harness itself failed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import traceback
from pathlib import Path

from bench.db import DEFAULT_SERVER_URL
from bench.harness import DEFAULT_RESULTS_DIR, SCENARIOS, Bench, Options
from bench.report import evaluate, render, write_json
from bench.scales import SCALES
from bench.scenarios import APPEND_DEPLOYMENTS


def _sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    if not sizes or min(sizes) < 6:
        raise argparse.ArgumentTypeError("comma-separated message counts, each >= 6")
    return sizes


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError("comma-separated numbers") from exc
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError("comma-separated numbers, each >= 0")
    return values


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError("comma-separated integers") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("comma-separated integers, each >= 1")
    return values


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError("an integer") from exc
    if value < 0:
        raise argparse.ArgumentTypeError("an integer >= 0")
    return value


def _deployments(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in APPEND_DEPLOYMENTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(APPEND_DEPLOYMENTS)}")
    return names


def _scenarios(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(SCENARIOS)}")
    return names


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError("expected KEY=VALUE")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Example: uv run --group bench python -m bench --scale full",
    )
    parser.add_argument("--scale", choices=sorted(SCALES), default="tiny", help="run sizes (default: tiny)")
    parser.add_argument(
        "--scenarios",
        type=_scenarios,
        default=SCENARIOS,
        help=f"comma-separated subset of {','.join(SCENARIOS)} (default: all)",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER_URL),
        help="any database on the PostgreSQL server to use; the harness creates and drops its own "
        "database there (env BENCH_DATABASE_URL; default %(default)s)",
    )
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR, help="JSON and logs go here")
    parser.add_argument("--output", type=Path, help="JSON file (default: RESULTS_DIR/bench-SCALE-TIME.json)")
    parser.add_argument(
        "--loadgen",
        choices=("auto", "python", "wrk"),
        default="auto",
        help="plain GET runs with wrk when installed (auto) or always with the Python load "
        "generator; POST and mixed runs always use the Python one",
    )
    parser.add_argument("--workers", type=int, default=1, help="uvicorn --workers for the service and floor")
    parser.add_argument(
        "--mixed-workers",
        type=_count,
        default=0,
        metavar="N",
        help="run the mixed scenario on an API replica with MEMORY_RUN_SUMMARIES=false and N "
        "`memory-service worker` processes (default 0: the service, summaries in its process)",
    )
    parser.add_argument(
        "--api-core",
        type=_count,
        metavar="CPU",
        help="run the service's HTTP processes (service, API replicas, floors) on this CPU alone, "
        "and every other process (workers, load generator, fake LLM, PostgreSQL) on the rest: "
        "a worker then takes no CPU from the API, as on a host of its own. Needs a local "
        "PostgreSQL, whose CPUs are restored at the end",
    )
    parser.add_argument(
        "--log-level", default="INFO", help="the service's LOG_LEVEL (default INFO, as deployed)"
    )
    parser.add_argument(
        "--service-env",
        type=_env_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra setting for the service, e.g. MEMORY_MAX_CONCURRENT_SUMMARIES=32 (repeatable)",
    )
    parser.add_argument("--keep-database", action="store_true", help="do not drop the benchmark database")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a performance target is missed")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the processes under load in each run (service, replicas, workers, floors; "
        "py-spy on PATH)",
    )
    parser.add_argument(
        "--approx-tokens", action="store_true", help="use the chars/4 approximation, not tiktoken"
    )
    sizes = parser.add_argument_group("size overrides (default: from --scale)")
    sizes.add_argument("--context-sizes", type=_sizes, help="e.g. 10,1000,100000")
    sizes.add_argument("--concurrency", type=int, help="connections for GET context runs")
    sizes.add_argument("--duration", type=float, help="seconds per GET context run")
    sizes.add_argument("--warmup", type=float, help="warm-up seconds before each run")
    sizes.add_argument("--repeats", type=int, help="interleaved repeats of the GET context runs")
    sizes.add_argument(
        "--no-memory-history",
        action="store_true",
        help="seed only the memories the context shows (sliding window: the latest; rolling blocks: 3)",
    )
    sizes.add_argument("--post-rate", type=float, help="POST requests per second")
    sizes.add_argument("--post-duration", type=float, help="seconds per POST run")
    sizes.add_argument("--slow-llm-latency", type=float, help="LLM latency of the slow POST run (s)")
    sizes.add_argument("--mixed-conversations", type=int)
    sizes.add_argument("--mixed-clients", type=int)
    sizes.add_argument("--mixed-rounds", type=int)
    sizes.add_argument(
        "--mixed-llm-latencies",
        type=_floats,
        help="LLM latencies of the mixed runs (s), one run each, e.g. 1,2",
    )
    sizes.add_argument("--token-rounds", type=int)
    sizes.add_argument("--append-conversations", type=int)
    sizes.add_argument("--append-concurrency", type=int, help="connections of the append runs")
    sizes.add_argument("--append-duration", type=float, help="seconds per append run")
    sizes.add_argument("--append-repeats", type=int, help="interleaved repeats of the append runs")
    sizes.add_argument("--append-llm-latency", type=float, help="LLM latency during the append runs (s)")
    sizes.add_argument(
        "--append-deployments",
        type=_deployments,
        default=(),
        help=f"comma-separated subset of {','.join(APPEND_DEPLOYMENTS)} (default: all)",
    )
    sizes.add_argument(
        "--sizing-caps", type=_ints, help="MEMORY_MAX_CONCURRENT_SUMMARIES values to compare, e.g. 8,64"
    )
    sizes.add_argument("--sizing-llm-latency", type=float, help="LLM latency of the sizing runs (s)")
    sizes.add_argument("--sizing-seconds", type=float, help="measured seconds per sizing run")
    return parser


def options_from(args: argparse.Namespace) -> Options:
    scale = SCALES[args.scale]
    overrides = {
        "context_sizes": args.context_sizes,
        "context_concurrency": args.concurrency,
        "duration_seconds": args.duration,
        "warmup_seconds": args.warmup,
        "repeats": args.repeats,
        "post_rate": args.post_rate,
        "post_duration_seconds": args.post_duration,
        "slow_llm_latency": args.slow_llm_latency,
        "mixed_conversations": args.mixed_conversations,
        "mixed_clients": args.mixed_clients,
        "mixed_rounds": args.mixed_rounds,
        "mixed_llm_latencies": args.mixed_llm_latencies,
        "token_rounds": args.token_rounds,
        "append_conversations": args.append_conversations,
        "append_concurrency": args.append_concurrency,
        "append_duration_seconds": args.append_duration,
        "append_repeats": args.append_repeats,
        "append_llm_latency": args.append_llm_latency,
        "sizing_caps": args.sizing_caps,
        "sizing_llm_latency": args.sizing_llm_latency,
        "sizing_seconds": args.sizing_seconds,
    }
    changes = {k: v for k, v in overrides.items() if v is not None}
    if args.no_memory_history:
        changes["memory_history"] = False
    if changes:
        scale = dataclasses.replace(scale, name=f"{scale.name}-custom", **changes)
    return Options(
        scale=scale,
        scenarios=args.scenarios,
        database_url=args.database_url,
        results_dir=args.results_dir,
        output=args.output,
        loadgen=args.loadgen,
        keep_database=args.keep_database,
        strict=args.strict,
        profile=args.profile,
        workers=args.workers,
        log_level=args.log_level.upper(),
        approx_tokens=args.approx_tokens,
        service_env=dict(args.service_env),
        append_deployments=args.append_deployments,
        api_core=args.api_core,
        mixed_workers=args.mixed_workers,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    opts = options_from(args)
    bench = Bench(opts)
    print(
        f"bench: scale {opts.scale.name}, scenarios {','.join(opts.scenarios)}; logs in {bench.log_dir}",
        flush=True,
    )
    try:
        doc = asyncio.run(bench.run())
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 2
    except Exception:
        traceback.print_exc()
        print(f"bench: failed; process logs in {bench.log_dir}", file=sys.stderr)
        return 2
    targets, checks = evaluate(doc)
    doc["targets"], doc["checks"] = targets, checks
    output = opts.output or opts.results_dir / f"bench-{opts.scale.name}-{bench.stamp}.json"
    write_json(doc, output)
    print(render(doc))
    print(f"\nJSON: {output}")
    if not all(c["pass"] for c in checks):
        print("bench: a correctness check FAILED", file=sys.stderr)
        return 1
    if opts.strict and not all(t["pass"] for t in targets):
        print("bench: a performance target was missed (--strict)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
