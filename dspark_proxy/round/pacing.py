"""Link pacing: how many rows a STEP may carry, and how many ring windows a round may ask to resend.

A link that carries every round never pays for any of this. Two things are learned from the STEPs that
carry at least a window's rows (smaller ones say nothing about the link and are not recorded):

- the **row cap** (stat `row_cap`, 0: none), a state machine: no cap until a STEP times out; then half
  of that STEP's rows (never below a window); from every STEP near the cap, what its speed moves in half
  the deadline (at most twice the cap), and no cap any more once that reaches `max_rows`. The requests
  past the cap get no entry that round, exactly like those whose rows did not fit the staging.
- the **resync pacing** (stat `resync_windows_per_round`): a slow EWMA of the rows per µs a STEP moves
  (a timed-out STEP only says the rate is below rows / timeout: the estimate drops to at most that),
  and from it how many windows a round can resend within half its deadline, between 1 and what one
  enqueue stages at most. A fixed rate would misjudge a link whose round trip is mostly fixed cost,
  which is why the cap has its own rule and the rate is only the pacing's rough guide.

The cap's states and events are the table `TRANSITIONS` and nothing else, in the shape of breaker.py:
`on_timeout` / `on_reply` classify what happened into a `LinkEvent` and `apply` looks it up; a pair
missing from the table raises `PacingError` and changes nothing. Time is passed in (the STEP's round
trip or timeout in µs, the deadline), never read here, so tests replay exact sequences.

Owned by the round thread; nothing here is locked.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import numpy as np

__all__ = ["TRANSITIONS", "LinkEvent", "LinkPacer", "LinkState", "PacingError"]


class LinkState(enum.Enum):
    UNCAPPED = "uncapped"  # a STEP carries every row that fits the staging
    CAPPED = "capped"  # a STEP carries at most `row_cap` rows


class LinkEvent(enum.Enum):
    TIMEOUT = "timeout"  # a STEP of at least a window's rows timed out: the cap halves
    REPLY = "reply"  # a STEP's reply came; capped: near the cap, the cap follows what the link moves
    FAR_BELOW = "far_below"  # capped, and the STEP carried under half the cap: it says nothing
    CARRIES_ALL = "carries_all"  # capped, and what the link moves in half the deadline reaches max_rows


class PacingError(ValueError):
    """An event the table has no transition for (a caller bug)."""


_S, _E = LinkState, LinkEvent
TRANSITIONS: dict[tuple[LinkState, LinkEvent], LinkState] = {
    (_S.UNCAPPED, _E.TIMEOUT): _S.CAPPED,  # half the STEP's rows
    (_S.UNCAPPED, _E.REPLY): _S.UNCAPPED,  # the link carries its rounds
    (_S.CAPPED, _E.TIMEOUT): _S.CAPPED,  # at most half the STEP's rows
    (_S.CAPPED, _E.REPLY): _S.CAPPED,  # what the STEP's speed moves in half the deadline, <= twice the cap
    (_S.CAPPED, _E.FAR_BELOW): _S.CAPPED,  # unchanged
    (_S.CAPPED, _E.CARRIES_ALL): _S.UNCAPPED,  # the cap goes away
}


class LinkPacer:
    """The row cap and the resync pacing of one round loop (a new one per engine attach).

    `publish(key, value)` is told every change of `row_cap` and `resync_windows_per_round` (the stats
    gauges `status` shows)."""

    def __init__(self, *, window: int, max_rows: int, resync_max: int, deadline_ns: int,
                 publish: Callable[[str, int], None]) -> None:
        self.W, self.max_rows, self.deadline_ns = window, max_rows, deadline_ns
        self.min_rows = window  # STEPs with at least a window's rows say something about the link
        self.resync_max = resync_max  # what one enqueue stages at most (shm_layout.md §5)
        self.resync_cap = resync_max  # until the rate is known
        self.rows_per_us = 0.0  # learned STEP throughput (0: not yet)
        self.row_cap = 0  # rows a STEP may carry (0: no cap); the state is this, named
        self._publish = publish
        publish("resync_windows_per_round", self.resync_cap)

    @property
    def state(self) -> LinkState:
        return LinkState.CAPPED if self.row_cap else LinkState.UNCAPPED

    # ------------------------------------------------------------------ what happened

    def on_timeout(self, n_rows: int, timeout_us: float) -> None:
        """A STEP of n_rows timed out after timeout_us."""
        if n_rows < self.min_rows:
            return
        self.learn_rate(n_rows, timeout_us, upper_bound=True)
        self.apply(LinkEvent.TIMEOUT, n_rows, 0.0)

    def on_reply(self, n_rows: int, rtt_us: float) -> None:
        """A STEP of n_rows came back in rtt_us."""
        if n_rows < self.min_rows:
            return
        self.learn_rate(n_rows, rtt_us)
        if not self.row_cap:
            return  # (UNCAPPED, REPLY) -> UNCAPPED, no new cap: the usual round skips the lookup
        if rtt_us <= 0.0:  # no measurable round trip: the cap takes it as a timeout, as it always has
            self.apply(LinkEvent.TIMEOUT, n_rows, 0.0)
        elif 2 * n_rows < self.row_cap:
            self.apply(LinkEvent.FAR_BELOW, n_rows, rtt_us)
        elif self._fit(n_rows, rtt_us) >= self.max_rows:
            self.apply(LinkEvent.CARRIES_ALL, n_rows, rtt_us)
        else:
            self.apply(LinkEvent.REPLY, n_rows, rtt_us)

    def _fit(self, n_rows: int, rtt_us: float) -> int:
        """Rows this STEP's speed moves in half the deadline, within [a window, twice the cap]."""
        return max(self.W, min(int(n_rows * self.deadline_ns / 2e3 / rtt_us), 2 * self.row_cap))

    def apply(self, event: LinkEvent, n_rows: int, rtt_us: float) -> None:
        """One row of `TRANSITIONS` and its new cap; an illegal pair raises and changes nothing."""
        src = self.state
        dst = TRANSITIONS.get((src, event))
        if dst is None:
            raise PacingError(f"link pacing: no transition for {event.value} while {src.value}")
        cap = self.row_cap
        if event is LinkEvent.TIMEOUT:
            half = max(self.W, n_rows // 2)
            new = half if src is LinkState.UNCAPPED else max(self.W, min(cap, half))
        elif event is LinkEvent.CARRIES_ALL:
            new = 0
        elif event is LinkEvent.REPLY and src is LinkState.CAPPED:
            new = self._fit(n_rows, rtt_us)
        else:
            new = cap
        assert (new != 0) == (dst is LinkState.CAPPED), (src, event, new)
        if new != cap:
            self.row_cap = new
            self._publish("row_cap", new)

    def learn_rate(self, n_rows: int, rtt_us: float, upper_bound: bool = False) -> None:
        """Rows per µs that a STEP round trip has been moving, and from it the windows a round may ask
        for. `upper_bound`: a STEP that timed out, which only says the rate is below n_rows / rtt_us."""
        rate = n_rows / max(rtt_us, 1.0)
        if upper_bound:
            self.rows_per_us = rate if self.rows_per_us == 0.0 else min(self.rows_per_us, rate)
        else:
            self.rows_per_us = rate if self.rows_per_us == 0.0 else 0.9 * self.rows_per_us + 0.1 * rate
        fit = int(self.rows_per_us * self.deadline_ns / 2e3) // self.W
        cap = max(1, min(self.resync_max, fit))
        if cap != self.resync_cap:
            self.resync_cap = cap
            self._publish("resync_windows_per_round", cap)

    # ------------------------------------------------------------------ what a round may do

    def over_cap(self, n_rows: int, k: int) -> bool:
        """A round of k entries and n_rows rows must be cut to the cap (one entry always goes)."""
        return bool(self.row_cap) and n_rows > self.row_cap and k > 1

    def keep(self, e_rows: np.ndarray) -> tuple[int, int]:
        """How many entries, in entry order, fit the cap (at least one), and their rows."""
        ends = np.cumsum(e_rows)
        keep = max(1, int(np.searchsorted(ends, self.row_cap, side="right")))
        return keep, int(ends[keep - 1])

    def windows(self, n_want: int) -> int:
        """How many of n_want windows a round may ask for (the rest: a later round)."""
        return min(n_want, self.resync_cap)
