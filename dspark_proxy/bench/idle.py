"""The idle cost of proxy and shim, state by state (docs/performance.md, "Idle, state by state"; the target: each state at most
0.5% of one core for proxy + shim together).

An idle engine still pays for every thread that wakes on a timer: the proxy's heartbeat and round
loop, the shim's watchdog and its C deadline watcher. What each costs is CPU time (all threads of a
process: /proc/<pid>/task/*/schedstat, ns; this process: its CPU-time clock) over a window, as % of
one core, so a loaded machine makes a measure longer, never larger by waiting. A loaded machine
does make each wake dearer (cold caches, contended cores): figures from one run compare with each
other, not with another day's.

States (`idle_states`): the proxy waiting for an engine; an engine that attached and has not run a
round; idle after rounds; the shim alone (its proxy killed, its segment left behind; then no segment
at all); thread mode before and after rounds. The worker's own idle cost is reported beside each.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .procs import cpu_s

__all__ = ["IdleMeter", "idle_states", "worst_state", "wakes"]


def wakes(pid: int) -> int:
    """Times the live threads of `pid` went to sleep of their own accord so far (the sum of
    voluntary_ctxt_switches over /proc/<pid>/task/*/status): one per timed wait, whatever the load, so
    it counts an idle process's wakes where CPU time prices them."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        n += int(line.split()[1])
        except OSError:
            pass  # the thread ended meanwhile
    return n


class IdleMeter:
    """CPU used by the proxy process, the worker process and this (the engine's) process over one
    window. A pid of None is not measured (no such process in that state)."""

    def __init__(self, proxy_pid: int | None, worker_pid: int | None) -> None:
        self.proxy_pid, self.worker_pid = proxy_pid, worker_pid

    def _now(self) -> tuple[float, ...]:
        def of(pid: int | None) -> float:
            return 0.0 if pid is None else cpu_s(pid)

        def woke(pid: int | None) -> float:
            return 0.0 if pid is None else float(wakes(pid))

        return (of(self.proxy_pid), of(self.worker_pid), time.process_time(), woke(self.proxy_pid),
                woke(self.worker_pid), float(wakes(os.getpid())))

    def measure(self, seconds: float, settle_s: float = 1.0) -> dict[str, Any]:
        """After `settle_s` (the move into the state: a detach's log lines, the last rounds' statistics
        published), CPU over `seconds`."""
        time.sleep(settle_s)
        a = self._now()
        t0 = time.monotonic()
        time.sleep(seconds)
        wall = time.monotonic() - t0
        b = self._now()

        def pct(i: int) -> float:
            return round(100.0 * (b[i] - a[i]) / wall, 3)

        out = {"seconds": round(wall, 2), "proxy_pct_core": pct(0), "worker_pct_core": pct(1),
               "engine_process_pct_core": pct(2)}
        out["proxy_plus_shim_pct_core"] = round(out["proxy_pct_core"] + out["engine_process_pct_core"], 3)
        for i, who in ((3, "proxy"), (4, "worker"), (5, "engine_process")):
            out[f"{who}_wakes_per_s"] = round((b[i] - a[i]) / wall, 1)
        return out


def worst_state(states: dict[str, dict[str, Any]]) -> tuple[str, float]:
    """The state where proxy + shim cost most, and that cost."""
    name = max(states, key=lambda k: states[k]["proxy_plus_shim_pct_core"])
    return name, states[name]["proxy_plus_shim_pct_core"]


def idle_states(seconds: float, prefix: str, say: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Every idle state in turn, each measured for `seconds`, at small shapes (M=16, N=5, W=32,
    256-byte rows: what idles does not depend on them, and each state needs a segment of its own)."""
    import engine_shim
    from dspark_proxy.ops.launch import spawn_proxy, spawn_worker
    from dspark_proxy.shm.segment import Segment

    from .batches import RoundGen, wait_connected

    shape = {"max_reqs": 16, "num_spec": 5, "window": 32, "row_bytes": 256}
    args = ["--max-reqs", "16", "--num-spec", "5", "--window", "32", "--row-bytes", "256"]
    gen = RoundGen(8, num_spec=5, window=32, row_bytes=256)
    name = f"{prefix}-idle"
    out: dict[str, Any] = {"shape": shape}

    def rounds(shim: Any, k: int = 5) -> None:
        for _ in range(k):
            kw = gen.next()
            shim.enqueue(gen.t, **kw)
            shim.read_reply(gen.t)

    worker = spawn_worker(*args)
    proxy = shim = None
    try:
        proxy = spawn_proxy(name, worker.address, *args, "--log-every", "0", "--deadline-ms", "2000")
        wait_connected(name)
        meter = IdleMeter(proxy.pid, worker.pid)
        say(f"idle: proxy waiting for an engine, {seconds:.0f} s")
        out["proxy_waiting"] = meter.measure(seconds)
        shim = engine_shim.attach(name, timeout_s=10.0, **shape)
        say(f"idle: engine attached, no round yet ({shim.state.value}), {seconds:.0f} s")
        out["attached_no_round"] = meter.measure(seconds)
        rounds(shim)
        say(f"idle: after rounds, {seconds:.0f} s")
        out["after_rounds"] = meter.measure(seconds)
        proxy.kill()
        proxy = None
        end = time.monotonic() + 5.0
        while shim.attached and time.monotonic() < end:
            rounds(shim, 1)  # the engine detaches at a round boundary
            time.sleep(0.05)
        say(f"idle: the shim alone, its proxy killed ({shim.state.value}), {seconds:.0f} s")
        out["shim_alone_proxy_killed"] = IdleMeter(None, worker.pid).measure(seconds)
        Segment.unlink_name(name)
        say(f"idle: the shim alone, no segment, {seconds:.0f} s")
        out["shim_alone_no_segment"] = IdleMeter(None, worker.pid).measure(seconds)
        shim.close()
        shim = engine_shim.attach(f"{name}-thread", mode="thread", worker=worker.address, timeout_s=10.0, **shape)
        say(f"idle: thread mode, no round yet, {seconds:.0f} s")
        out["thread_mode_no_round"] = IdleMeter(None, worker.pid).measure(seconds)
        rounds(shim)
        say(f"idle: thread mode after rounds, {seconds:.0f} s")
        out["thread_mode_after_rounds"] = IdleMeter(None, worker.pid).measure(seconds)
    finally:
        if shim is not None:
            shim.close()
        if proxy is not None:
            proxy.stop()
        worker.stop()
    states = {k: v for k, v in out.items() if k != "shape"}
    out["worst_state"], out["worst_pct_core"] = worst_state(states)
    return out
