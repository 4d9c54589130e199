"""Window completeness in the campaign: the full-window rate (full / usable drafts) of a stretch of
rounds, and how soon after a fault the windows are whole again.

A usable draft is *full* when its window held every row the engine wrote for the request, up to W,
as the engine's own oracle counts it (sim/oracle.py), never from the proxy's ring model. After a fault
clears, every usable draft must be full again within ceil(live requests / windows a round) + 1 rounds
of the first round that reaches a healthy worker (the first reply that is not ROUND_FAILED: its STEP
went out and came back): a dirty window is asked for in one round and staged with the next. The live
requests of that round bound its dirty live slots; the windows a round are the proxy's resync
windows a round, or fewer where link pacing lowered them (its `resync_windows_per_round` gauge).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["full_rate", "recovery", "BASELINE_MIN_FULL_RATE"]

BASELINE_MIN_FULL_RATE = 0.99
_REACHED = (0, 1)  # reply statuses whose STEP came back from a worker (ok, some_failed)


def full_rate(usable: int, full: int) -> float | None:
    """full / usable, rounded for the report; None with no usable draft."""
    return round(full / usable, 4) if usable else None


def recovery(probe: Any, lo: int, hi: int, windows_per_round: int | None) -> dict[str, Any]:
    """From round index `lo` (the fault cleared) to `hi`: the first round that reached a worker, the bound
    on rounds until every usable draft is full, and the most rounds it took: for each round with a usable
    draft that was not full, the rounds from the first reaching round of its stretch (a ROUND_FAILED
    reply in between starts a new one: that round did not reach a healthy worker, and its slots are dirty
    again) up to and including it; 0 when every usable draft was full. `full_after_rounds` None: no
    round reached a worker."""
    status, usable, full = probe.status, probe.usable, probe.full
    r0 = next((i for i in range(lo, hi) if status[i] in _REACHED), None)
    if r0 is None:
        return {"reached_after_rounds": None, "full_bound_rounds": None, "full_after_rounds": None}
    live = int(probe.n_reqs[r0])
    bound = math.ceil(live / max(1, windows_per_round or 1)) + 1
    after, start = 0, r0
    for i in range(r0, hi):
        if status[i] not in _REACHED:
            start = i + 1
        elif usable[i] > full[i]:
            after = max(after, i - start + 1)
    return {"reached_after_rounds": r0 - lo, "full_bound_rounds": bound, "full_after_rounds": after}
