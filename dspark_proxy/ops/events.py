"""A flight recorder: the last ``capacity`` events (watchdog takeovers, skipped rounds, a dead proxy), kept
so that ``status`` and the stats can say *which* rounds went target-only and in what shape.

Modelled on PyTorch c10d's FlightRecorder: a fixed ring, monotonic ids, slot = ``id % capacity``, the id
stored in the entry and checked on every read (a slot that was overwritten is never passed off as the
entry asked for), dumps in chronological order, capacity 0 disables it (every method returns at once).

Threads: any thread may ``record`` and ``dump``. The lock is held only to store one entry or to copy the
slots, never across anything that can block, so a watchdog recording an event is never held up by a
reader.

Watchdog event fields (``watchdog_event()`` builds them in this order; the stats key is
``watchdog_events``). The proxy records ``skipped`` and ``late_publish``; the shim records the rest.

- ``round``: the engine round (step) the event is about.
- ``time``: wall-clock seconds (``time.time()``, 3 decimals) when it was *recorded*, which is after it
  happened, and later still if the recording thread was descheduled.
- ``how``: what happened, one of ``WATCHDOG_HOWS`` (open set: new kinds may be added):
  ``watchdog`` (the deadline passed, the watchdog claimed and failed the round), ``skipped`` (a late proxy
  found the round already taken and skipped it), ``late_publish`` (the proxy finished the round but lost
  the claim), ``attached`` (the shim attached to this incarnation at this round); and the shim's reasons
  for giving an incarnation up (every round failed far ahead, then detach): ``proxy_dead`` (pid gone),
  ``proxy_hung`` (heartbeat stale, or a round claimed but not published by deadline + grace),
  ``round_loop_hung`` (a gathered round not begun by the proxy for the heartbeat timeout),
  ``proxy_stopping`` (state STOPPING/DEAD), ``abandoned`` (someone else marked the segment
  abandoned: another engine that found it, or an operator), ``proxy_replaced`` (the name maps a newer incarnation).
- ``phase``: one of ``PHASES``: ``prefill`` (the round's longest query is longer than num_spec + 1),
  ``decode``, or ``unknown`` (the round's descriptor could not be read, or the shim no longer holds
  the round's record).
- ``n``: requests in the round; ``rows``: rows gathered into the staging for the round (those that fit
  max_rows); ``longest_query``: the longest query span of the round. All three are the event's round's
  own (0 with phase ``unknown``).
- ``proxy_wait_ms``: for the proxy's events, how long the proxy had waited for the round when it got to
  it; always 0 in the shim's events (the shim cannot see the proxy's wait).
- ``incarnation``: the segment incarnation the round went through (the shim's: the one it was attached
  to for that round; 0 if it never attached), so any event can be tied to one proxy incarnation.
"""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["EVENTS_FORMAT_VERSION", "WATCHDOG_EVENTS_KEPT", "WATCHDOG_HOWS", "PHASES", "EventRing",
           "watchdog_event"]

EVENTS_FORMAT_VERSION = "1.1"  # minor: fields added (1.1: incarnation); major: existing fields changed
WATCHDOG_EVENTS_KEPT = 64
WATCHDOG_HOWS = ("watchdog", "skipped", "late_publish", "attached", "proxy_dead", "proxy_hung", "round_loop_hung",
                 "proxy_stopping", "abandoned", "proxy_replaced")
PHASES = ("prefill", "decode", "unknown")


class EventRing:
    """Fixed-capacity ring of event dicts with monotonic ids (the first event is id 0)."""

    def __init__(self, capacity: int = WATCHDOG_EVENTS_KEPT) -> None:
        if capacity < 0:
            raise ValueError(f"event ring capacity must be >= 0 (0 disables it), got {capacity}")
        self.capacity = capacity
        self._slots: list[dict[str, Any] | None] = [None] * capacity
        self._next_id = 0  # guarded by _lock
        self._lock = threading.Lock()

    def record(self, **fields: Any) -> int:
        """Store one event; returns its id, or -1 when the ring is disabled."""
        if self.capacity == 0:
            return -1
        if "id" in fields:
            raise ValueError("event field 'id' is reserved for the ring's own id")
        with self._lock:
            eid = self._next_id
            self._next_id = eid + 1
            self._slots[eid % self.capacity] = {"id": eid, **fields}
        return eid

    def get(self, eid: int) -> dict[str, Any] | None:
        """Event ``eid`` (a copy), or None if it was never recorded or has been overwritten."""
        if self.capacity == 0 or eid < 0:
            return None
        entry = self._slots[eid % self.capacity]
        if entry is None or entry["id"] != eid:
            return None
        return dict(entry)

    def dump(self) -> list[dict[str, Any]]:
        """Every event still held, oldest first (copies: safe to keep or serialise)."""
        if self.capacity == 0:
            return []
        with self._lock:
            end = self._next_id
            slots = list(self._slots)
        out = []
        for eid in range(max(0, end - self.capacity), end):
            entry = slots[eid % self.capacity]
            if entry is not None and entry["id"] == eid:
                out.append(dict(entry))
        return out

    @property
    def total(self) -> int:
        """Events recorded since creation (including those overwritten)."""
        return self._next_id

    def __len__(self) -> int:
        return min(self._next_id, self.capacity)


def watchdog_event(*, round: int, how: str, phase: str = "unknown", n: int = 0, rows: int = 0,
                   longest_query: int = 0, proxy_wait_ms: float = 0.0, incarnation: int = 0,
                   time_s: float | None = None) -> dict[str, Any]:
    """The fields of one watchdog event, in the documented order; ``time_s`` defaults to now (wall)."""
    return {
        "round": int(round),
        "time": _round3(time.time() if time_s is None else time_s),
        "how": how,
        "phase": phase,
        "n": int(n),
        "rows": int(rows),
        "longest_query": int(longest_query),
        "proxy_wait_ms": _round3(proxy_wait_ms),
        "incarnation": int(incarnation),
    }


def _round3(x: float) -> float:
    return round(float(x), 3)
