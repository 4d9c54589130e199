"""Where the shim's C watcher thread runs: off the engine's CPUs when the engine is pinned to part of
the machine (docs/vllm.md, "CPU placement").

The watcher (watchdog.py) wakes twice a round, at `gathered` and at `published`. On the engine's own
CPU each wake takes that CPU from the engine in the middle of its step, and at `published` the
watcher and the engine thread, woken by the same store, queue for the one CPU (measured inside vLLM
on 2 vCPUs under load: read_reply 1.07 ms p50 with the watcher on vLLM's CPU, 0.32 ms with it on the
proxy's, one engine alternating). A thread starts on its creator's CPUs, so the creator is moved to
the watcher's CPUs for the instant it starts it (`run_on`).

`DSPARK_PROXY_WATCHER_CPUS` ("3", "2,3", "2-3") names them; "inherit" keeps the creator's. Unset: the
machine's CPUs the creating thread may not use, when it is pinned to part of the machine (where
docs/vllm.md puts the proxy); none (the creator's) when it may use them all.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TypeVar

__all__ = ["ENV_WATCHER_CPUS", "parse_cpus", "run_on", "watcher_cpus"]

log = logging.getLogger(__name__)

ENV_WATCHER_CPUS = "DSPARK_PROXY_WATCHER_CPUS"
R = TypeVar("R")


def parse_cpus(text: str) -> set[int]:
    """"3", "2,3", "0-2,5" -> a set of CPU numbers; ValueError on anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        a, b = int(lo), int(hi) if sep else int(lo)
        if a < 0 or b < a:
            raise ValueError(f"bad CPU range {part.strip()!r}")
        cpus.update(range(a, b + 1))
    return cpus


def watcher_cpus() -> set[int] | None:
    """The CPUs for a watcher started by the calling thread; None: its own (see the module docstring)."""
    text = os.environ.get(ENV_WATCHER_CPUS, "").strip()
    if text == "inherit":
        return None
    if text:
        try:
            return parse_cpus(text)
        except ValueError as e:
            log.warning("[shim] %s=%r: %s; the watcher runs on the engine thread's CPUs", ENV_WATCHER_CPUS, text, e)
            return None
    try:
        mine = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None
    rest = set(range(os.cpu_count() or 1)) - mine
    return rest or None


def run_on(cpus: set[int] | None, fn: Callable[[], R]) -> R:
    """fn() with the calling thread on `cpus`, so threads it starts begin there; the caller's CPUs are
    restored after. Where they cannot be set (outside the process's cpuset, no such call), fn() as is."""
    if not cpus:
        return fn()
    try:
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cpus)
    except (AttributeError, OSError, ValueError):
        return fn()
    try:
        return fn()
    finally:
        try:
            os.sched_setaffinity(0, before)
        except OSError:  # pragma: no cover - the CPUs it ran on a moment ago
            pass
