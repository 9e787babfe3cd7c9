"""Closed-loop GET runs with wrk (a C load generator), when it is installed (Debian: ``wrk``)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

import orjson

_MARK = "BENCH_WRK_JSON "

# Rotates over the given paths; done() prints the summary as one JSON line (latencies in us).
_SCRIPT = """
local paths = {%(paths)s}
local counter = 0
request = function()
  counter = counter + 1
  return wrk.format("GET", paths[(counter %% #paths) + 1])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '%(mark)s{"requests":%%d,"duration_us":%%d,"errors":{"connect":%%d,"read":%%d,"write":%%d,' ..
    '"status":%%d,"timeout":%%d},"mean":%%f,"p50":%%f,"p90":%%f,"p99":%%f,"p999":%%f,"max":%%f}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max))
end
"""


def wrk_path() -> str | None:
    return shutil.which("wrk")


def _lua_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


async def _wrk(exe: str, base_url: str, script: Path, concurrency: int, seconds: float) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        exe,
        "-t1",
        f"-c{concurrency}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "30s",
        "-s",
        str(script),
        base_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {err.decode(errors='replace')[-500:]}")
    for line in out.decode(errors="replace").splitlines():
        if line.startswith(_MARK):
            parsed: dict[str, Any] = orjson.loads(line[len(_MARK) :])
            return parsed
    raise RuntimeError(f"wrk printed no summary: {out.decode(errors='replace')[-500:]}")


async def run_get(
    exe: str, base_url: str, paths: list[str], concurrency: int, warmup: float, duration: float
) -> dict[str, Any]:
    """Same result shape as the Python load generator's ``get`` workload."""
    with tempfile.TemporaryDirectory(prefix="bench-wrk-") as tmp:
        script = Path(tmp) / "rotate.lua"
        script.write_text(
            _SCRIPT % {"paths": ", ".join(_lua_string(p) for p in paths), "mark": _MARK}, encoding="utf-8"
        )
        if warmup > 0:
            await _wrk(exe, base_url, script, concurrency, warmup)
        raw = await _wrk(exe, base_url, script, concurrency, duration)
    seconds = raw["duration_us"] / 1e6
    errors = int(sum(raw["errors"].values()))

    def ms(key: str) -> float:
        return round(float(raw[key]) / 1000.0, 3)

    return {
        "kind": "get",
        "loadgen": "wrk",
        "requests": raw["requests"],
        "seconds": round(seconds, 3),
        "throughput_rps": round(raw["requests"] / seconds, 1) if seconds else None,
        "latency_ms": {
            "get": {
                "count": raw["requests"],
                "mean": ms("mean"),
                "p50": ms("p50"),
                "p90": ms("p90"),
                "p99": ms("p99"),
                "p999": ms("p999"),
                "max": ms("max"),
            }
        },
        "errors": errors,
        "errors_by_kind": {k: v for k, v in raw["errors"].items() if v},
        "error_samples": [],
    }
