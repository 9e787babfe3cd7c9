"""Percentiles and latency summaries (no numpy)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of an ascending sequence."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    frac = pos - low
    return float(sorted_values[low] * (1 - frac) + sorted_values[high] * frac)


def summarize_ms(seconds: Iterable[float]) -> dict[str, Any]:
    """count, mean, p50/p90/p99/p99.9, max of durations given in seconds, reported in ms."""
    values = sorted(v * 1000.0 for v in seconds)
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "p999": None, "max": None}
    return {
        "count": len(values),
        "mean": round(sum(values) / len(values), 3),
        "p50": round(percentile(values, 50), 3),
        "p90": round(percentile(values, 90), 3),
        "p99": round(percentile(values, 99), 3),
        "p999": round(percentile(values, 99.9), 3),
        "max": round(values[-1], 3),
    }


def summarize_plain(values: Iterable[float], digits: int = 3) -> dict[str, Any]:
    """Same shape as :func:`summarize_ms` for values already in their final unit."""
    ordered = sorted(values)
    if not ordered:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "count": len(ordered),
        "mean": round(sum(ordered) / len(ordered), digits),
        "p50": round(percentile(ordered, 50), digits),
        "p90": round(percentile(ordered, 90), digits),
        "p99": round(percentile(ordered, 99), digits),
        "max": round(ordered[-1], digits),
    }


def median(values: Sequence[float]) -> float:
    return percentile(sorted(values), 50)


def geomean(values: Sequence[float]) -> float:
    positive = [v for v in values if v > 0]
    if not positive:
        return math.nan
    return math.exp(sum(math.log(v) for v in positive) / len(positive))
