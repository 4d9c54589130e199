"""The round's latencies, recorded at its end in one call (stats.py `HistGroup`, `_fastround.hist_observe`
on the C path) rather than one `Stats.observe` each: at n = 1 the six observes were ~3 µs of a ~20 µs
round. The keys and their meanings are those the round always had (docs/operating.md):

- `rank0_round_us`, `proxy_parked_us_<phase>`: the round's own time (gathered seen -> published), all
  rounds and by phase;
- for a round that got its STEP's reply: `proxy_cost_us` (the round less the STEP's round trip, per
  round), `rtt_us`, `rtt_us_<phase>` and `worker_us` (the worker's own time, as it reported it).

Owned by the round thread, like the Stats it writes.
"""

from __future__ import annotations

from ..ops.stats import Stats

__all__ = ["PHASES", "ROUND_KEYS", "RoundLatencies"]

PHASES = ("decode", "prefill", "unknown")
ROUND_KEYS = ("rank0_round_us", "proxy_cost_us", "rtt_us", "worker_us",
              *(f"proxy_parked_us_{ph}" for ph in PHASES), *(f"rtt_us_{ph}" for ph in PHASES))
_PARKED, _RTT_PH = 4, 4 + len(PHASES)  # where each phase's keys start in ROUND_KEYS


class RoundLatencies:
    """One incarnation's writer of the round's latency keys (the group is the Stats', shared by every
    RoundCore that writes it)."""

    def __init__(self, stats: Stats, native_path: bool) -> None:
        g = stats.group(ROUND_KEYS, native_path)
        self._obs, self._record, self._joined = g.observe, g.record, g.joined
        self._failed = {ph: (0, _PARKED + i) for i, ph in enumerate(PHASES)}
        self._ok = {ph: (0, _PARKED + i, 1, 2, _RTT_PH + i, 3) for i, ph in enumerate(PHASES)}

    def done(self, phase: str, done_us: float, rtt_us: float, worker_us: float) -> None:
        """A handled round: its time, and its STEP's figures when `rtt_us` >= 0 (it got a reply).
        proxy_cost_us is per round, not p50(round) - p50(rtt): failed rounds are fast and have no rtt."""
        if rtt_us >= 0.0:
            at = self._ok[phase]
            if at in self._joined:  # (observe, without its frame: every round but the first of its kind)
                self._record(at, done_us, done_us, done_us - rtt_us, rtt_us, rtt_us, worker_us)
            else:
                self._obs(at, done_us, done_us, done_us - rtt_us, rtt_us, rtt_us, worker_us)
        else:
            self._obs(self._failed[phase], done_us, done_us)

    def skipped(self, done_us: float) -> None:
        """A round the watchdog had taken before the proxy reached it: its time, in rank0_round_us only."""
        self._obs((0,), done_us)
