"""The pool fault kinds (kinds.py: pool_worker_kill, pool_worker_stall): one of two workers fails.

Each injection adds a second worker to the proxy's pool (its `--worker @FILE` rewritten, SIGHUP) and
waits until both serve their share; then the second worker is SIGKILLed or SIGSTOPped. The fault is
marked cleared at the round its requests move to the survivor (pool/client.py: the round after its
first miss for a kill, after the breaker's threshold of misses for a stall), so the campaign's bound on
full windows (completeness.py) is the moved requests' bound. Meanwhile the surviving worker's requests
must keep usable drafts in at least 99% of their entries, or, on a machine so busy that the baseline
(the rounds outside every fault) itself got fewer, in 99% of the baseline's share, less what chance moves that share over the
few rounds measured (`healthy_bar`): a round lost because the machine is busy is not the other
worker's fault, and the baseline counts such rounds the same way. From the pool's per-worker counters (`workers` in status), misses counted, rounds
the watchdog took counted as misses of its share. Then the second worker leaves the
list (it owns no slot any more, so nothing moves) and is stopped.
"""

from __future__ import annotations

import math
import signal
import time
from typing import TYPE_CHECKING, Any

from ..ops.status import read_status
from ..shm.segment import SegmentError

if TYPE_CHECKING:
    from .controller import Controller

__all__ = ["pool_worker_kill", "pool_worker_stall", "HEALTHY_MIN_USABLE", "healthy_bar"]

HEALTHY_MIN_USABLE = 0.99
_BREAKER_THRESHOLD = 3  # the proxy's default breaker_threshold (the campaign does not change it)


def healthy_bar(baseline_usable: float | None, rounds: int | None = None) -> float:
    """The least usable share the healthy worker's requests may get through a pool fault: 99%, of the
    baseline's usable share where the baseline got less than all its drafts (None: no baseline rounds,
    the plain 99%), less three binomial standard deviations of that share over the `rounds` measured
    (a busy machine loses whole rounds at random; over a few rounds that alone moves the share)."""
    if baseline_usable is None:
        return HEALTHY_MIN_USABLE
    b = min(1.0, baseline_usable)
    chance = 3.0 * math.sqrt(b * (1.0 - b) / rounds) if rounds else 0.0
    return round(max(0.0, HEALTHY_MIN_USABLE * b - chance), 4)


def _proxy(c: Controller) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The pool's worker links and the proxy's counters ([] / {} when unreadable)."""
    try:
        p = read_status(c.system.name).get("proxy") or {}
    except (SegmentError, ValueError, OSError):
        return [], {}
    links = (p.get("gauges") or {}).get("workers") or []
    return [w for w in links if isinstance(w, dict)], dict(p.get("counters") or {})


def _wait_links(c: Controller, ok, timeout_s: float) -> list[dict[str, Any]] | None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        links, _ = _proxy(c)
        if ok(links):
            return links
        c.sleep(0.05)
    return None


def _first_miss(c: Controller, from_idx: int, timeout_s: float) -> int | None:
    """The first round at or after from_idx in which a request that needed drafts got none."""
    p = c.probe
    end = time.monotonic() + timeout_s
    i = from_idx
    while time.monotonic() < end:
        n = p.count
        while i < n:
            if p.usable[i] < p.needed[i]:
                return i
            i += 1
        c.sleep(0.002)
    return None


def _healthy(before: dict[str, Any], after: dict[str, Any], late: int) -> dict[str, Any]:
    d = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in ("entries", "usable", "missed", "steps")}
    per_round = d["entries"] / d["steps"] if d["steps"] else 0.0
    lost_late = round(late * per_round)  # rounds the watchdog took: its share of them got nothing
    total = d["entries"] + lost_late
    rate = round(d["usable"] / total, 4) if total else None
    return {"healthy_entries": d["entries"], "healthy_usable": d["usable"], "healthy_missed": d["missed"] + lost_late,
            "healthy_rounds": d["steps"] + late, "healthy_usable_rate": rate}


def _pool_fault(c: Controller, how: str) -> None:
    s = c.system
    primary = s.address
    s.spawn_pool_worker()
    try:
        s.set_pool([primary, s.pool_address])
        both = _wait_links(c, lambda ls: len(ls) == 2 and all(w.get("pool_state") == "up" and w.get("slots", 0) > 0
                                                             for w in ls), 15.0)
        if both is None:
            c.note(pool_setup_failed=True)
            return
        _, counters0 = _proxy(c)
        idx0 = c.probe.count
        if how == "kill":
            s.pool_worker.kill()
        else:
            s.pool_worker.signal(signal.SIGSTOP)
        # cleared where its requests move: at the start of the round after the one that tripped it
        miss = _first_miss(c, idx0, 5.0)
        if miss is not None:
            at = miss + (1 if how == "kill" else _BREAKER_THRESHOLD)
            end = time.monotonic() + 5.0
            while c.probe.count < at and time.monotonic() < end:
                c.sleep(0.002)
        c.cleared()
        c.sleep(c.hold_s)
        links, counters1 = _proxy(c)
        healthy = next((w for w in links if w.get("address") == primary), {})
        before = next((w for w in both if w.get("address") == primary), {})
        late = counters1.get("watchdog_preempted", 0) - counters0.get("watchdog_preempted", 0)
        second = next((w for w in links if w.get("address") == s.pool_address), {})
        c.note(moved_from_second=int(next((w for w in both if w.get("address") == s.pool_address), {})
                                     .get("slots", 0)),
               second_state=second.get("pool_state"), first_miss_round=miss is not None, watchdog_late=late,
               **_healthy(before, healthy, late))
    finally:
        s.set_pool([primary])  # the second worker owns no slot now: nothing moves
        _wait_links(c, lambda ls: len(ls) == 1, 5.0)
        s.stop_pool_worker()


def pool_worker_kill(c: Controller) -> None:
    _pool_fault(c, "kill")


def pool_worker_stall(c: Controller) -> None:
    _pool_fault(c, "stall")
