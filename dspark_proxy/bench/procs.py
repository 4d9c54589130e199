"""What the benchmarks need from the OS: pinning whole processes, resident memory, CPU time, and
busy Python threads.

Pinning: `os.sched_setaffinity(pid)` moves one thread (the pid's main thread); threads made later
inherit it but threads already running do not, so `pin()` walks /proc/<pid>/task. Memory and CPU
come from /proc, in the units the kernel keeps (kB, clock ticks).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["cores", "placements", "pin", "pinned", "on_cpu", "rss_kb", "cpu_s", "thread_cpu_s", "BusyThreads", "BusyProcesses"]

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cores() -> list[int]:
    """The CPUs this process may run on, lowest first."""
    return sorted(os.sched_getaffinity(0))


def placements() -> list[tuple[str, int | None, int | None]]:
    """(name, engine cpu, other cpu): left to the scheduler; both sides on one core; each on its own
    core (when there are two). Pinned processes are pinned from their start, as `taskset` does."""
    cs = cores()
    out: list[tuple[str, int | None, int | None]] = [("unpinned", None, None), ("same_core", cs[0], cs[0])]
    if len(cs) > 1:
        out.append(("cross_core", cs[0], cs[1]))
    return out


def _tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def pin(pid: int, cpus: set[int] | list[int]) -> None:
    """Every thread of `pid` (0: this process) onto `cpus`."""
    pid = pid or os.getpid()
    for tid in _tids(pid):
        try:
            os.sched_setaffinity(tid, set(cpus))
        except (ProcessLookupError, PermissionError):
            pass


@contextmanager
def pinned(cpus: set[int] | list[int]) -> Iterator[None]:
    """This whole process on `cpus` for the block, then back on every core it had."""
    before = os.sched_getaffinity(0)
    pin(0, cpus)
    try:
        yield
    finally:
        pin(0, before)


@contextmanager
def on_cpu(cpu: int | None) -> Iterator[None]:
    """Start children inside this block on `cpu` only (they inherit the affinity, as under `taskset`,
    so their own spin policy sees one core); None: leave everything as it is."""
    if cpu is None:
        yield
        return
    with pinned({cpu}):
        yield


def rss_kb(pid: int = 0) -> dict[str, int]:
    """VmRSS and its parts (RssAnon, RssFile, RssShmem) in kB from /proc/<pid>/status, and how much of
    it is transparent huge pages (AnonHugePages, /proc/<pid>/smaps_rollup; numpy asks for them on
    large arrays, so a few rows written per slot can make a whole 2 MB page resident)."""
    pid = pid or os.getpid()
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[key] = int(rest.split()[0])
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "AnonHugePages":
                    out[key] = int(rest.split()[0])
    except OSError:
        pass
    return out


def _stat_cpu_s(path: str) -> float:
    with open(path) as f:
        data = f.read()
    fields = data[data.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime


def cpu_s(pid: int) -> float:
    """CPU seconds used so far by the live threads of `pid`: the sum of /proc/<pid>/task/*/schedstat
    (ns, exact), or utime + stime from /proc/<pid>/stat (clock ticks) where schedstat is missing."""
    total_ns = 0
    try:
        for tid in _tids(pid):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total_ns += int(f.read().split()[0])
        return total_ns / 1e9
    except (OSError, ValueError, IndexError):
        return _stat_cpu_s(f"/proc/{pid}/stat")


def thread_cpu_s(thread: threading.Thread) -> float:
    """CPU seconds used so far by one thread of this process (its CPU-time clock, exact)."""
    if thread.ident is None:
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


class BusyThreads:
    """`k` pure-Python threads that hold the GIL as much as the interpreter lets them (an engine's
    tokenizer, scheduler and HTTP threads, at their worst)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._spin, name=f"bench-busy-{i}", daemon=True)
                         for i in range(k)]
        self.loops = 0

    def _spin(self) -> None:
        n = 0
        stop = self._stop
        while not stop.is_set():
            for _ in range(1000):
                n += 1
        self.loops += n

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        for t in self._threads:
            t.join(timeout)

    def __enter__(self) -> BusyThreads:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join(5.0)


class BusyProcesses:
    """`k` processes that spin on a CPU each, unpinned (`bench --busy K`): a machine shared with other
    work, which the benchmark's own processes must share CPUs with. Killed on exit."""

    def __init__(self, k: int) -> None:
        self.k = k
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> BusyProcesses:
        for _ in range(self.k):
            self._procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        return self

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def __exit__(self, *exc: object) -> None:
        for p in self._procs:
            p.kill()
        for p in self._procs:
            p.wait(5.0)
        self._procs.clear()
