"""An independent witness of the machine's scheduling noise: a child process that sleeps 1 ms at a time
and records how late it wakes up.

On a small, shared machine the engine's thread can be descheduled for tens of milliseconds (a child
process starting, other test suites); a wait that overran the deadline then says nothing about the
proxy. The campaign runs this probe beside the engine, and the report puts each over-limit round next
to the largest wake-up delay the probe saw during that round's wait ("explained" when that delay
alone covers the overrun). CLOCK_MONOTONIC is the clock on both sides (`time.perf_counter_ns` is
CLOCK_MONOTONIC on Linux).

The child writes one line per 20 ms window to a file: `<window end ns> <largest oversleep ns>`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["NoiseProbe", "main"]

_WINDOW_NS = 20_000_000
_SLEEP_S = 0.001


def main(path: str) -> None:  # pragma: no cover - runs in the child
    """The child's loop: until killed (SIGTERM) or its parent is gone."""
    import os

    parent = os.getppid()
    with open(path, "w", buffering=1) as f:
        worst = 0
        end = time.perf_counter_ns() + _WINDOW_NS
        while True:
            t0 = time.perf_counter_ns()
            time.sleep(_SLEEP_S)
            t1 = time.perf_counter_ns()
            worst = max(worst, t1 - t0 - int(_SLEEP_S * 1e9))
            if t1 >= end:
                f.write(f"{t1} {worst}\n")
                worst = 0
                end = t1 + _WINDOW_NS
                if os.getppid() != parent:
                    return


class NoiseProbe:
    """Start/stop the child; `stall_ns(lo, hi)` is the largest oversleep seen in windows overlapping
    [lo, hi] (0 if none)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc: subprocess.Popen | None = None
        self._ends = np.zeros(0, dtype=np.int64)
        self._worst = np.zeros(0, dtype=np.int64)

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", f"from dspark_proxy.chaos.noise import main; "
                                      f"main({str(self.path)!r})"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is not None:
            p.terminate()
            try:
                p.wait(5.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5.0)
        self.load()

    def load(self) -> None:
        try:
            rows = [ln.split() for ln in self.path.read_text().splitlines()]
        except OSError:
            rows = []
        rows = [r for r in rows if len(r) == 2]
        a = np.asarray(rows, dtype=np.int64).reshape(-1, 2)
        self._ends, self._worst = a[:, 0], a[:, 1]

    def stall_ns(self, lo: int, hi: int) -> int:
        """Largest oversleep in the windows that overlap [lo, hi] (a window covers end - 20 ms .. end)."""
        if self._ends.size == 0:
            return 0
        i = int(np.searchsorted(self._ends, lo))
        j = int(np.searchsorted(self._ends, hi + _WINDOW_NS, side="right"))
        return int(self._worst[i:j].max()) if j > i else 0

    def summary_ms(self) -> dict[str, float]:
        w = self._worst
        if w.size == 0:
            return {"windows": 0}
        return {"windows": int(w.size), "p50": round(float(np.percentile(w, 50)) / 1e6, 3),
                "p99": round(float(np.percentile(w, 99)) / 1e6, 3), "max": round(float(w.max()) / 1e6, 3)}
