"""The proxy's CPUs kept out of idle while rounds flow (`--keep-awake-ms`, `_keepawake.c`).

An engine's rounds come a forward apart, milliseconds, and between them the proxy's CPU idles. The
next round then pays for waking it (a futex wake to an idle vCPU: ~130 us in a KVM guest with halt
polling off, against ~15 us to a busy one) and runs on cold caches. With keep-awake the proxy kicks
SCHED_IDLE spinners on its CPUs after each round; they spin until the kick runs out, yielding at once
to any other task, and then sleep until the next kick. Off by default: it spends power (and shows as
CPU time in `top`) to buy latency, which is the operator's call.

The spinners are the process's (the C module's state is): several proxies in one process (thread
mode) share them, each a counted owner, and the last to close stops them. Under a cgroup CPU quota
they are not started: SCHED_IDLE yields the CPU to other tasks, not the quota, so the spin would
spend the very quota that throttles the proxy (docs/performance.md, "Keeping the proxy's CPUs awake").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger("dspark_proxy.ops.keep_awake")

__all__ = ["KeepAwake", "MAX_CPUS", "cpu_quota"]

MAX_CPUS = 8  # one spinner per CPU of the proxy's affinity; a proxy free to run anywhere is not served

_lock = threading.Lock()  # _owners, and the start/stop of the shared spinners
_owners = 0
_quota_said = False  # the quota's warning: once a process


def cpu_quota(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """The CPUs this process's cgroups allow (quota / period, the smallest along the path to the root),
    or None when no quota applies: cgroup v2's cpu.max, v1's cpu.cfs_quota_us / cpu.cfs_period_us."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _, ctrl, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        ctrls = ctrl.split(",") if ctrl else []
        if ctrl == "":
            bases = [Path(root), Path(root) / "unified"]
        elif "cpu" in ctrls:
            bases = [Path(root) / ctrl, Path(root) / "cpu"]
        else:
            continue
        for base in bases:
            d = base / path.lstrip("/")
            while True:
                limits += _limit_at(d)
                if d == base or d.parent == d:
                    break
                d = d.parent
    return min(limits) if limits else None


def _limit_at(d: Path) -> list[float]:
    """The quota one cgroup directory sets, in CPUs ([] when none, or no such files)."""
    try:
        quota, period = (d / "cpu.max").read_text().split()[:2]
        return [] if quota == "max" else [int(quota) / int(period)]
    except (OSError, ValueError):
        pass
    try:
        q = int((d / "cpu.cfs_quota_us").read_text())
        p = int((d / "cpu.cfs_period_us").read_text())
        return [q / p] if q > 0 and p > 0 else []
    except (OSError, ValueError):
        return []


class KeepAwake:
    """One per proxy. `kick()` after each round; `close()` gives its share of the spinners back (the
    last owner's close stops and joins them)."""

    def __init__(self, ms: float, who: str = "proxy") -> None:
        """who: the process's role in its log lines (`proxy`, or `worker`: `worker --keep-awake-ms`
        kicks after each reply, so the next STEP wakes a warm CPU)."""
        global _owners, _quota_said
        self.ns = int(ms * 1e6)
        self._mod = None
        if self.ns <= 0:
            return
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > MAX_CPUS:
            log.warning("[%s] --keep-awake-ms needs the %s pinned to at most %d CPUs (taskset); it may "
                        "run on %d: not kept awake", who, who, MAX_CPUS, len(cpus))
            self.ns = 0
            return
        quota = cpu_quota()
        if quota is not None:
            with _lock:
                said, _quota_said = _quota_said, True
            if not said:
                log.warning("[%s] --keep-awake-ms: this process runs under a cgroup CPU quota (%.2f CPUs): "
                            "not kept awake, as the spinners would spend the quota that throttles the %s",
                            who, quota, who)
            self.ns = 0
            return
        from . import _keepawake

        with _lock:
            first = _owners == 0
            started = _keepawake.start(cpus)  # running already: a no-op returning the count
            _owners += 1
        self._mod = _keepawake
        if not first:
            log.info("[%s] keep-awake: sharing this process's %d spinner(s) (%d owners)", who, started, _owners)
            return
        log.info("[%s] keep-awake: %d spinner(s) on CPUs %s, %.1f ms after each round", who, started,
                 ",".join(map(str, cpus)), ms)
        time.sleep(0.01)  # the spinners' first instructions: SCHED_IDLE taken, or refused
        if self.snapshot()["refused"]:
            log.warning("[%s] keep-awake: SCHED_IDLE refused here (a container's seccomp?): no spinning, "
                        "which at normal priority would take CPU time from the proxy and the worker", who)

    def kick(self) -> None:
        if self._mod is not None:
            self._mod.kick(self.ns)

    def snapshot(self) -> dict[str, int]:
        """Spinners running, spin turns begun so far, spinners asleep now, spinners that could not take
        SCHED_IDLE and so never spin (`status`; the process's, shared by its proxies; zeros when off)."""
        state = self._mod.state() if self._mod is not None else (0, 0, 0, 0)
        return dict(zip(("spinners", "spins", "sleeping", "refused"), state, strict=True))

    def close(self) -> None:
        """Idempotent: only an owner's first close counts."""
        global _owners
        if self._mod is None:
            return
        mod, self._mod = self._mod, None
        with _lock:
            _owners -= 1
            if _owners == 0:
                mod.stop()
