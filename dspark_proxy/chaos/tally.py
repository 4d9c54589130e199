"""What the two watchdog sides recorded: the shim's event ring and counters (in-process) and every
proxy's counters and event ring (through `read_status`, one entry per proxy pid, since a restarted
proxy starts counting from zero and a killed one keeps its last snapshot).

Thread ownership: the controller thread only.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from ..ops.status import read_status
from ..shm.segment import SegmentError

__all__ = ["ProxyTally", "ShimEventLog", "counter_delta"]


def counter_delta(before: dict[int, dict[str, int]], after: dict[int, dict[str, int]]) -> dict[str, int]:
    """Sum over pids of after - before (a pid new since `before` counts from zero); nonzero only."""
    out: Counter[str] = Counter()
    for pid, counters in after.items():
        base = before.get(pid, {})
        for k, v in counters.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                d = v - base.get(k, 0)
                if d:
                    out[k] += d
    return dict(sorted(out.items()))


class ProxyTally:
    """The latest counters (and the watchdog events) of every proxy incarnation seen by `sample()`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.latest: dict[int, dict[str, int]] = {}
        self.events: dict[tuple[int, int], dict[str, Any]] = {}  # (pid, event id) -> event
        self.actions: list[tuple[int, int, str]] = []
        self.windows_per_round: int | None = None  # the current proxy's resync windows a round, as last read

    def sample(self) -> bool:
        """Read the current proxy's snapshot; False when there is no readable one right now."""
        t0 = time.perf_counter_ns()
        try:
            return self._sample()
        finally:
            self.actions.append((t0, time.perf_counter_ns(), "read_status"))

    def _sample(self) -> bool:
        try:
            st = read_status(self.name)
        except (SegmentError, ValueError, OSError):
            return False
        snap = st.get("proxy") or {}
        if not snap:
            return False
        pid = int(st["header"]["owner_pid"])
        counters = dict(snap.get("counters", {}))
        gauges = snap.get("gauges", {})
        # the layout's windows a round, or fewer where link pacing lowered it (the proxy's gauge says so)
        paced = gauges.get("resync_windows_per_round")
        r = int(st["header"].get("resync_per_round", 0)) or None
        if isinstance(paced, int) and paced > 0:
            r = paced if r is None else min(r, paced)
        self.windows_per_round = r
        for k, v in (gauges.get("client") or {}).items():
            counters[f"client.{k}"] = v
        self.latest[pid] = counters
        for ev in gauges.get("watchdog_events") or []:
            if isinstance(ev, dict) and "id" in ev:
                self.events[(pid, int(ev["id"]))] = ev
        return True

    def counters(self) -> dict[int, dict[str, int]]:
        return {pid: dict(c) for pid, c in self.latest.items()}

    def events_between(self, t_lo: int, t_hi: int, wall_lo: float = 0.0, wall_hi: float = 0.0) -> list[dict[str, Any]]:
        """Proxy events of one injection: those stamped within its wall-clock span [wall_lo, wall_hi]
        (each event's `time`), or, without a span, those about rounds t_lo..t_hi. Round numbers alone
        do not tell: a new engine (engine_restart) numbers its rounds from 1 again, so a round range
        would also take in events of an earlier engine's rounds with the same numbers."""
        if wall_hi > 0.0:
            evs = [e for e in self.events.values() if wall_lo <= float(e.get("time", -1.0)) <= wall_hi]
        else:
            evs = [e for e in self.events.values() if t_lo <= int(e.get("round", -1)) <= t_hi]
        return sorted(evs, key=lambda e: (int(e.get("round", 0)), float(e.get("time", 0.0))))


class ShimEventLog:
    """Every shim watchdog event, kept past the ring's 64 by polling it often enough."""

    def __init__(self, shim: Any) -> None:
        self.shim = shim
        self.base = 0  # ids of the current shim's events are offset by the earlier shims' totals
        self.events: dict[int, dict[str, Any]] = {}

    def follow(self, shim: Any) -> None:
        """A new engine's shim (engine_restart): its events number from 0 again, so they go after
        every event of the earlier ones."""
        self.base = self.poll()
        self.shim = shim

    def poll(self) -> int:
        """Merge the ring into the log; returns the next event id (events below it are recorded)."""
        shim, base = self.shim, self.base
        for ev in shim.events.dump():
            self.events.setdefault(base + int(ev["id"]), ev)
        return base + int(shim.events.total)

    def between(self, id_lo: int, id_hi: int) -> list[dict[str, Any]]:
        return [self.events[i] for i in range(id_lo, id_hi) if i in self.events]

    def lost(self, id_lo: int, id_hi: int) -> int:
        """Events in [id_lo, id_hi) that the ring overwrote before a poll saw them."""
        return sum(1 for i in range(id_lo, id_hi) if i not in self.events)
