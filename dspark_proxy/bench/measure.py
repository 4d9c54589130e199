"""Latency summaries and ratios: the numbers every section reports, computed the same way.

A figure is always p50 / p99 / p99.9 / max (plus the count), in µs, from raw samples in ns taken with
`time.perf_counter_ns` around the operation, or from a `Stats` histogram summary (the proxy's own
figures, which live in another process). Benchmarks report; nothing here judges.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["default_prefix", "FIGURES", "summarize", "from_stats", "ratio", "mb_per_s", "Samples"]

FIGURES = ("p50_us", "p99_us", "p999_us", "max_us")


def default_prefix() -> str:
    """Segment names of a bench run start with this (one run per process at a time)."""
    return f"bench-{os.getpid()}"


def summarize(samples_ns: Sequence[int] | np.ndarray, skip: int = 0) -> dict[str, Any]:
    """p50/p99/p99.9/max in µs of samples in ns, after dropping the first `skip` (warm-up)."""
    a = np.asarray(samples_ns, dtype=np.float64)[skip:] / 1e3
    if a.size == 0:
        return {"n": 0, "p50_us": None, "p99_us": None, "p999_us": None, "max_us": None, "mean_us": None}
    p50, p99, p999 = np.percentile(a, [50.0, 99.0, 99.9])
    return {"n": int(a.size), "p50_us": round(float(p50), 2), "p99_us": round(float(p99), 2),
            "p999_us": round(float(p999), 2), "max_us": round(float(a.max()), 2),
            "mean_us": round(float(a.mean()), 2)}


def from_stats(lat: dict[str, Any] | None) -> dict[str, Any]:
    """The same shape from a `Stats` latency summary (count, p50_us, p99_us, p999_us, max_us, mean_us)."""
    lat = lat or {}
    return {"n": int(lat.get("count") or 0), "p50_us": lat.get("p50_us"), "p99_us": lat.get("p99_us"),
            "p999_us": lat.get("p999_us"), "max_us": lat.get("max_us"), "mean_us": lat.get("mean_us")}


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b to three significant digits, or None when either is missing or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return float(f"{float(a) / float(b):.3g}")


def mb_per_s(nbytes: int, us: float | None) -> float | None:
    if us is None or us <= 0:
        return None
    return round(nbytes / us, 1)  # bytes per µs == MB/s


class Samples:
    """Raw samples (ns) kept by label for the optional plot; not part of the JSON."""

    def __init__(self) -> None:
        self.by_label: dict[str, np.ndarray] = {}

    def add(self, label: str, samples_ns: Sequence[int] | np.ndarray, skip: int = 0) -> None:
        self.by_label[label] = np.asarray(samples_ns, dtype=np.int64)[skip:]

    def merge(self, other: Samples, prefix: str = "") -> None:
        for k, v in other.by_label.items():
            self.by_label[prefix + k] = v
