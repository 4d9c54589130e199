"""Rounds the watchdog (or a fail_all) claimed before the proxy reached them, and the events that
record them: RoundCore's late-round half (round/core.py), kept apart so that the round's usual path reads
on its own.

Owned by the round thread, like the RoundCore it is part of.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from ..shm.stamped import BadDescriptor

if TYPE_CHECKING:
    from ..ops.events import EventRing
    from ..ops.stats import Stats
    from ..shm.segment import Segment
    from ..shm.stamped import SlotReader
    from .ring_model import SlotTable

__all__ = ["LateRounds"]


class LateRounds:
    """RoundCore's handling of rounds taken before it reached them (a mixin: its state is RoundCore's)."""

    stats: Stats
    desc: SlotReader
    slots: SlotTable
    want_resync: np.ndarray
    events: EventRing
    seg: Segment
    M: int
    _decode_q: int

    def _phase(self) -> str:
        """The round's phase from its descriptor's longest query (handle inlines the same test)."""
        return "prefill" if self.desc.max_q > self._decode_q else "decode"

    def _skip_taken(self, t: int, waited_us: float) -> None:
        """Round t was failed (watchdog, fail_all) before we reached it. The engine may already be
        writing a later round's rows, so no row is read and nothing is sent; the ring model is still
        advanced from round t's own metadata slot if the stamps show it is still t's, else the
        round's slots (or, without a trustworthy descriptor, every slot) restart their windows."""
        st = self.stats
        st.inc("watchdog_preempted")
        st.inc("watchdog_skipped_rounds")
        phase = "unknown"
        try:
            self.desc.read(t)
        except BadDescriptor:
            self.slots.restart(np.arange(self.M))
            self.want_resync[:] = False
            st.inc("watchdog_skipped_unknown_ring")
        else:
            phase = self._phase()
            v = self.desc.v
            slots = v.slots
            new_owner = self.slots.begin_requests(slots, v.req)
            self.want_resync[slots[new_owner]] = False
            self.slots.apply(slots, v.first, v.valid)
            self.slots.mark_dirty(slots)
        self._event(t, "skipped", phase, waited_us)

    def _event(self, t: int, how: str, phase: str, waited_us: float) -> None:
        d = self.desc.d
        same = int(d["t"]) == t
        n = int(d["n"]) if same else 0
        self.events.record(round=t, time=round(time.time(), 3), how=how, phase=phase, n=n,
                           rows=int(d["rows_gathered"]) if same else 0,
                           longest_query=int(d["max_q"]) if same else 0,
                           proxy_wait_ms=round(waited_us / 1e3, 3), incarnation=self.seg.incarnation)
        self.stats.set("watchdog_events", self.events.dump())
