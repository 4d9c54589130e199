"""The proxy's CPUs kept out of idle while rounds flow (`--keep-awake-ms`, `_keepawake.c`).

An engine's rounds come a forward apart, milliseconds, and between them the proxy's CPU idles. The
next round then pays for waking it (a futex wake to an idle vCPU: ~130 us in a KVM guest with halt
polling off, against ~15 us to a busy one) and runs on cold caches. With keep-awake the proxy kicks
SCHED_IDLE spinners on its CPUs after each round; they spin until the kick runs out, yielding at once
to any other task, and then sleep until the next kick. Off by default: it spends power (and shows as
CPU time in `top`) to buy latency, which is the operator's call.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("dspark_proxy.keep_awake")

__all__ = ["KeepAwake", "MAX_CPUS"]

MAX_CPUS = 8  # one spinner per CPU of the proxy's affinity; a proxy free to run anywhere is not served


class KeepAwake:
    """One per proxy process. `kick()` after each round; `close()` stops and joins the spinners."""

    def __init__(self, ms: float) -> None:
        self.ns = int(ms * 1e6)
        self._mod = None
        if self.ns <= 0:
            return
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > MAX_CPUS:
            log.warning("[proxy] --keep-awake-ms needs the proxy pinned to at most %d CPUs (taskset); it may "
                        "run on %d: not kept awake", MAX_CPUS, len(cpus))
            self.ns = 0
            return
        from . import _keepawake

        self._mod = _keepawake
        started = _keepawake.start(cpus)
        log.info("[proxy] keep-awake: %d spinner(s) on CPUs %s, %.1f ms after each round", started,
                 ",".join(map(str, cpus)), ms)
        time.sleep(0.01)  # the spinners' first instructions: SCHED_IDLE taken, or refused
        if self.snapshot()["refused"]:
            log.warning("[proxy] keep-awake: SCHED_IDLE refused here (a container's seccomp?): no spinning, "
                        "which at normal priority would take CPU time from the proxy and the worker")

    def kick(self) -> None:
        if self._mod is not None:
            self._mod.kick(self.ns)

    def snapshot(self) -> dict[str, int]:
        """Spinners running, spin turns begun so far, spinners asleep now, spinners that could not take
        SCHED_IDLE and so never spin (`status`; zeros when off)."""
        state = self._mod.state() if self._mod is not None else (0, 0, 0, 0)
        return dict(zip(("spinners", "spins", "sleeping", "refused"), state, strict=True))

    def close(self) -> None:
        if self._mod is not None:
            self._mod.stop()
            self._mod = None
