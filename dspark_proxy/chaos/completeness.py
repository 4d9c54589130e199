"""Window completeness in the campaign: the full-window rate (full / usable drafts) of a stretch of
rounds, and how soon after a fault the windows are whole again.

A usable draft is *full* when its window held every row the engine wrote for the request, up to W,
as the engine's own oracle counts it (sim/oracle.py), never from the proxy's ring model.

After a fault clears, every usable draft must be full again within ceil(live requests / windows a
round) + 1 rounds of the first round that reaches a healthy worker (the first reply that is not
ROUND_FAILED: its STEP went out and came back): a dirty window is asked for in one round and staged
with the next. The live requests of that round bound its dirty live slots. The windows a round are
the effective ones, from the engine's own count: the fewest its shim staged in any round of the
stretch that staged some (link pacing and byte budgets lower them below the layout's, and a pace
that ramps up is held to its slowest round; the proxy's `resync_windows_per_round` gauge is reported
beside it). Windows staged for slots that are not live or not dirty count without helping, so they
fail the check; a stretch with no window staged while a window is short is bounded at 1 round.

Outside the faults the same contract holds: a round that fails (late on a busy machine, say) dirties its
slots like a fault does, so the baseline's full-window rate counts only settled rounds, those beyond the
same bound after the baseline's last failed round (`settled`); the excused rounds are reported.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["full_rate", "recovery", "settled", "BASELINE_MIN_FULL_RATE"]

BASELINE_MIN_FULL_RATE = 0.99
_REACHED = (0, 1)  # reply statuses whose STEP came back from a worker (ok, some_failed)


def full_rate(usable: int, full: int) -> float | None:
    """full / usable, rounded for the report; None with no usable draft."""
    return round(full / usable, 4) if usable else None


def recovery(probe: Any, lo: int, hi: int, windows_per_round: int | None = None) -> dict[str, Any]:
    """From round index `lo` (the fault cleared) to `hi`: the first round that reached a worker, and the
    worst stretch: for each round with a usable draft that was not full, the rounds from the first
    reaching round of its stretch (a ROUND_FAILED reply in between starts a new one: that round did not
    reach a healthy worker, and its slots are dirty again) up to and including it, against the bound
    from the windows staged over those rounds and the next (a window asked for in round i is staged
    with round i + 1). `full_after_rounds` 0: every usable draft was full;
    None: no round reached a worker. `windows_per_round` (the proxy's gauge) is only reported."""
    status, usable, full, staged = probe.status, probe.usable, probe.full, probe.staged
    r0 = next((i for i in range(lo, hi) if status[i] in _REACHED), None)
    out: dict[str, Any] = {"reached_after_rounds": None, "full_bound_rounds": None, "full_after_rounds": None,
                           "windows_per_round_proxy": windows_per_round, "windows_per_round_staged": None}
    if r0 is None:
        return out
    live = int(probe.n_reqs[r0])
    worst, worst_bound, worst_rate, start, key = 0, 2, None, r0, None
    for i in range(r0, hi):
        if status[i] not in _REACHED:
            start = i + 1
        elif usable[i] > full[i]:
            k = i - start + 1
            paced = [w for w in staged[start:i + 2] if w > 0]  # what round i lacked is staged with i + 1
            rate = min(paced, default=0)
            bound = math.ceil(live / rate) + 1 if rate > 0 else 1
            kk = (k > bound, k - bound if k > bound else k)  # the worst excess, else the longest stretch
            if key is None or kk >= key:
                key, worst, worst_bound, worst_rate = kk, k, bound, rate
    out.update(reached_after_rounds=r0 - lo, full_after_rounds=worst, full_bound_rounds=worst_bound,
               windows_per_round_staged=worst_rate)
    return out


def settled(probe: Any, n: int) -> np.ndarray:
    """True for each of the first `n` rounds that is not within the recovery bound of a failed round:
    ceil(most live requests / fewest windows staged in a round that staged some) + 1 rounds after it,
    the bound `recovery` holds a fault's aftermath to. A failed round's own drafts are not usable, so it
    needs no mask of its own."""
    mask = np.ones(n, dtype=np.bool_)
    if not n:
        return mask
    reached = np.isin(np.asarray(probe.status[:n]), _REACHED)
    staged = np.asarray(probe.staged[:n])
    rate = int(staged[staged > 0].min()) if (staged > 0).any() else 1
    bound = math.ceil(int(np.max(probe.n_reqs[:n])) / rate) + 1
    for f in np.flatnonzero(~reached).tolist():  # the report's own pass, once per failed round
        mask[f + 1:f + 1 + bound] = False
    return mask
