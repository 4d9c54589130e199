"""Where the shim's C watcher thread runs: off the engine's CPUs when the engine is pinned to part of
the machine (docs/vllm.md, "CPU placement").

The watcher (watchdog.py) wakes twice a round, at `gathered` and at `published`. On the engine's own
CPU each wake takes that CPU from the engine in the middle of its step, and at `published` the
watcher and the engine thread, woken by the same store, queue for the one CPU (measured inside vLLM
on 2 vCPUs under load: read_reply 1.07 ms p50 with the watcher on vLLM's CPU, 0.32 ms with it on the
proxy's, one engine alternating). The watcher is started with its CPUs set as a thread attribute
(HostFlags.watcher): the engine thread never moves, not even for an instant, since the proxy reads
its CPUs as the engine attaches to decide whether to spin (hostflag.py `spin_useful`). Moving it to
the watcher's CPUs while it started the thread, as once done here, sometimes made that read see the
engine on the proxy's own CPU, and the proxy never spun for that engine: 58 us a hand-off instead of
19 with each pinned to its own CPU (tests/test_placement.py).

`DSPARK_PROXY_WATCHER_CPUS` ("3", "2,3", "2-3") names them; "inherit" keeps the creator's. Unset: the
machine's CPUs the creating thread may not use, when it is pinned to part of the machine (where
docs/vllm.md puts the proxy); none (the creator's) when it may use them all.
"""

from __future__ import annotations

import logging
import os

__all__ = ["ENV_WATCHER_CPUS", "parse_cpus", "watcher_cpus"]

log = logging.getLogger(__name__)

ENV_WATCHER_CPUS = "DSPARK_PROXY_WATCHER_CPUS"


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
