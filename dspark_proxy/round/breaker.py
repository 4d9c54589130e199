"""The circuit breaker that keeps a failing worker off the round's critical path.

A worker that fails round after round costs the engine a full deadline each time it is tried; after
``threshold`` consecutive failed rounds the breaker opens and the proxy sends nothing for ``cooldown``
rounds (they go target-only at once), then lets exactly one probe round through: its success closes the
breaker, its failure opens it again for another cooldown.

The state machine is the table ``TRANSITIONS`` below and nothing else: ``allow()`` and ``record()`` only
classify what happened into a ``BreakerEvent`` (the threshold and cooldown guards are decided there, so the
table itself stays a pure lookup) and apply it. A pair missing from the table is an illegal event: it
raises ``BreakerError`` and leaves the breaker exactly as it was.

Time is the round number, passed in by the caller, never read here, so tests replay exact sequences.

Only rounds that really went out are recorded; that is the caller's job. A round with nothing to send is
neutral. A probe round that ended without ``record()`` (granted, then nothing went out: not connected,
nothing to draft) is neutral too: the next round gets the probe instead, so a breaker can never be stuck
half-open waiting for an outcome that will not come. The round is synchronous, so "a probe is
outstanding" means "granted in this very round and not yet recorded".

Owned by the round thread; nothing here is locked. Publish ``snapshot()`` through the stats.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["TRANSITIONS", "BreakerError", "BreakerEvent", "BreakerState", "CircuitBreaker"]


class BreakerState(enum.Enum):
    CLOSED = "closed"  # every round goes out
    OPEN = "open"  # no round goes out until the cooldown has passed
    HALF_OPEN = "half_open"  # one probe round goes out; its outcome decides


class BreakerEvent(enum.Enum):
    SUCCESS = "success"  # a round that went out succeeded
    FAILURE = "failure"  # a round that went out failed, below the threshold (or a failed probe)
    FAILURE_AT_THRESHOLD = "failure_at_threshold"  # the failure that makes `threshold` in a row
    COOLDOWN_OVER = "cooldown_over"  # allow() found `cooldown` rounds passed since the breaker opened


class BreakerError(ValueError):
    """An event the table has no transition for (a caller bug: e.g. recording a round while open)."""


_S, _E = BreakerState, BreakerEvent
TRANSITIONS: dict[tuple[BreakerState, BreakerEvent], BreakerState] = {
    (_S.CLOSED, _E.SUCCESS): _S.CLOSED,  # resets the run of failures
    (_S.CLOSED, _E.FAILURE): _S.CLOSED,  # one more failure in the run
    (_S.CLOSED, _E.FAILURE_AT_THRESHOLD): _S.OPEN,  # "tripped"
    (_S.OPEN, _E.COOLDOWN_OVER): _S.HALF_OPEN,  # the probe is granted
    (_S.HALF_OPEN, _E.SUCCESS): _S.CLOSED,  # "recovered"
    (_S.HALF_OPEN, _E.FAILURE): _S.OPEN,  # a failed probe: "tripped" again, a new cooldown
}


class CircuitBreaker:
    """``allow(now_round)`` before a round goes out, ``record(ok, now_round)`` after it went out."""

    def __init__(self, threshold: int, cooldown: int) -> None:
        if threshold < 1:
            raise ValueError(f"breaker threshold must be >= 1 (breaker_threshold), got {threshold}")
        if cooldown < 0:
            raise ValueError(f"breaker cooldown must be >= 0 rounds (breaker_cooldown), got {cooldown}")
        self.threshold = threshold
        self.cooldown = cooldown
        self.current = BreakerState.CLOSED  # read by the round every round: an attribute, not a property
        self.consecutive_failures = 0
        self.trips = 0  # times it opened, failed probes included
        self.recoveries = 0  # probes that closed it
        self.probes = 0  # probe rounds granted
        self.opened_round: int | None = None  # round of the latest trip
        self._probe_round: int | None = None  # round the current probe was granted in

    @property
    def state(self) -> str:
        """"closed", "open" or "half_open"."""
        return self.current.value

    def allow(self, now_round: int) -> bool:
        """May round ``now_round`` go out? Open: not until more than ``cooldown`` rounds after the trip (rounds
        trip+1 .. trip+cooldown stay local), then this round is the probe. Half-open: only one probe per
        round (see the module docstring for a probe that never went out)."""
        s = self.current
        if s is BreakerState.CLOSED:
            return True
        if s is BreakerState.OPEN:
            assert self.opened_round is not None
            if now_round - self.opened_round > self.cooldown:
                self.apply(BreakerEvent.COOLDOWN_OVER, now_round)
                return True
            return False
        assert self._probe_round is not None
        if now_round > self._probe_round:  # the earlier probe never went out: neutral, probe again
            self._probe_round = now_round
            self.probes += 1
            return True
        return False

    def record(self, ok: bool, now_round: int) -> str | None:
        """The outcome of a round that went out. Returns "tripped", "recovered" or None."""
        if ok and self.current is BreakerState.CLOSED:  # apply(SUCCESS) from CLOSED, without its lookups
            self.consecutive_failures = 0
            return None
        if ok:
            ev = BreakerEvent.SUCCESS
        elif self.current is BreakerState.CLOSED and self.consecutive_failures + 1 >= self.threshold:
            ev = BreakerEvent.FAILURE_AT_THRESHOLD
        else:
            ev = BreakerEvent.FAILURE
        return self.apply(ev, now_round)

    def apply(self, event: BreakerEvent, now_round: int) -> str | None:
        """One row of ``TRANSITIONS`` and its bookkeeping; an illegal pair raises and changes nothing."""
        src = self.current
        dst = TRANSITIONS.get((src, event))
        if dst is None:
            raise BreakerError(f"circuit breaker: no transition for {event.value} while {src.value}")
        self.current = dst
        if event is BreakerEvent.COOLDOWN_OVER:
            self._probe_round = now_round
            self.probes += 1
            return None
        if dst is BreakerState.OPEN:
            self.trips += 1
            self.opened_round = now_round
            self.consecutive_failures = 0
            self._probe_round = None
            return "tripped"
        if event is BreakerEvent.FAILURE:
            self.consecutive_failures += 1
            return None
        self.consecutive_failures = 0  # SUCCESS
        if src is BreakerState.HALF_OPEN:
            self.recoveries += 1
            self._probe_round = None
            return "recovered"
        return None

    def rebase(self, last_round: int, first_round: int) -> None:
        """A new engine attached and numbers its rounds from ``first_round``; the previous one's last
        round was ``last_round``. Every round remembered here moves by the same shift, so an open
        breaker keeps exactly the cooldown it had left (a new engine does not mend the worker) and a
        probe granted to the old engine counts as never sent. Without this a restarted engine, counting
        from 1, would wait for the old engine's round count plus the cooldown."""
        shift = first_round - 1 - last_round
        if self.opened_round is not None:
            self.opened_round += shift
        if self._probe_round is not None:
            self._probe_round += shift

    def snapshot(self) -> dict[str, Any]:
        """JSON-able state for the stats (``breaker`` gauge) and ``status``."""
        return {
            "state": self.state,
            "trips": self.trips,
            "recoveries": self.recoveries,
            "probes": self.probes,
            "consecutive_failures": self.consecutive_failures,
            "threshold": self.threshold,
            "cooldown": self.cooldown,
            "opened_round": self.opened_round,
        }

    def __repr__(self) -> str:
        return (f"CircuitBreaker(state={self.state}, failures={self.consecutive_failures}/{self.threshold}, "
                f"trips={self.trips}, cooldown={self.cooldown})")
