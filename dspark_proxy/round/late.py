"""The round's ends other than the usual one: publishing round t (at its end, or before its STEP when
its reply is known), rounds the watchdog (or a fail_all) claimed before the proxy reached them, failed
rounds, requests past the link's row cap, and the events that record them: RoundCore's other half (round/core.py), kept apart so that the round's usual
path reads on its own.

Owned by the round thread, like the RoundCore it is part of.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from ..shm.stamped import BadDescriptor

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..ops.events import EventRing
    from ..ops.stats import Stats
    from ..shm.hostflag import HostFlags
    from ..shm.segment import Segment
    from ..shm.stamped import SlotReader
    from .acceptance import Acceptance
    from .pacing import LinkPacer
    from .reply_page import PagePacker
    from .ring_model import SlotTable

__all__ = ["FIRST_FAILED", "FIRST_NO", "FIRST_OVERTAKEN", "FIRST_PUBLISHED", "LateRounds"]

# What `_publish_first` made of a round whose reply was known before its STEP (`_first`; round/core.py
# reads it): not such a round; published (the STEP goes out after it); the watchdog had failed it (no
# STEP, as for a preempted round); the engine answered it and began the next before our copy of its rows
# was whole (no STEP: its windows are resent)
FIRST_NO, FIRST_PUBLISHED, FIRST_FAILED, FIRST_OVERTAKEN = 0, 1, -1, -2


class LateRounds:
    """RoundCore's publishing, and its handling of rounds taken before it reached them (a mixin: its
    state is RoundCore's)."""

    stats: Stats
    desc: SlotReader
    slots: SlotTable
    want_resync: np.ndarray
    events: EventRing
    seg: Segment
    M: int
    _decode_q: int
    packer: PagePacker
    page: np.ndarray
    flags: HostFlags
    _publish: Callable[[int, np.ndarray], bool]
    _consumed: Callable[[], int]
    _first: int
    _first_rows: np.ndarray | None
    _promised: int
    rounds: int
    accept: Acceptance
    _gathered_ns: Callable[[], int]
    _gathered: Callable[[], int]
    _arange: np.ndarray
    pacer: LinkPacer
    W: int

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

    def _paused(self, t: int, slots: np.ndarray, need: np.ndarray) -> bool:
        """The gate's mask on round t's NEED_DRAFT flags (in place); True when none is left, so the reply
        is known before the STEP. While the batch is PAUSED the engine is promised the pause's rounds,
        a few ahead at a time (PAUSED_THROUGH, the gate's `b_promised`): it answers them itself, without
        waiting for this process (shm_layout.md §3, "Paused rounds"), so a promised round asks no drafts
        whatever the gate says now."""
        cleared = self.accept.mask(slots, need)
        g = self.accept.gate
        if g.b_promised > self._promised:
            self._promised = g.b_promised
            self.flags.promise_paused(self._promised)
        if t <= self._promised:
            need[:] = False
            return True
        return bool(cleared) and not np.count_nonzero(need)

    def _step_clock(self) -> int:
        """The gate's clock (gate_tps.py): round t's GATHERED_NS, or -1 when the engine has gathered a
        later round since, whose stamp it may be (behind an engine that answers paused rounds itself)."""
        ns = self._gathered_ns()
        return ns if self._gathered() <= self.rounds else -1

    def _publish_now(self, t: int, phase: str, waited_us: float) -> bool:
        """Round t's page out; False: the watchdog (or, for a promised round, the engine) took t first.
        Raises when the engine has not consumed round t-1's reply (the hand-off's order is broken:
        round/core.py's invariants)."""
        if self._consumed() < t - 1:
            raise RuntimeError(f"round {t}: the engine has not consumed round {t - 1}'s reply "
                               f"(words {self.flags.values()})")
        if self._publish(t, self.page):
            return True
        if t <= self._promised:  # the engine answered it, as promised: no drafts, which is what we had
            self.stats.inc("rounds_answered_by_engine")
            return False
        # the watchdog failed t first: the worker may hold rows we now treat as unsent
        self.slots.mark_all_dirty()
        self.stats.inc("watchdog_preempted")
        self._event(t, "late_publish", phase, waited_us)
        return False

    def _publish_first(self, t: int, n: int, phase: str) -> None:
        """The gate cleared every NEED_DRAFT of round t (the batch, or every slot in it, paused): its
        reply, no drafts for its n requests, is known before its STEP, so it is published now and the
        engine does not wait for the worker's round trip, only for whatever of the STEP outlasts its
        next forward (docs/design.md, "Acceptance-aware drafting").
        The STEP still goes out after it: the worker's windows stay whole for the probe. Its rows are a
        private copy by then (round/core.py): once the engine has read this reply it may enqueue round
        t+1 and rewrite round t's rows (shm_layout.md §1 and §5), which a view would send torn."""
        self.packer.none(n)
        if self._publish_now(t, phase, 0.0):
            self._first = FIRST_PUBLISHED
            self.stats.inc("rounds_published_first")
        elif t > self._promised:
            self._first = FIRST_FAILED
        elif self.flags.overtaken(t):  # the engine answered t and began t+1: our copy may be torn
            self._first = FIRST_OVERTAKEN
            self.stats.inc("paused_rows_overtaken")
        else:  # the engine answered t, and the rows were copied before it wrote any of t+1's
            self._first = FIRST_PUBLISHED

    def _rows_copy(self, rows: list) -> list:
        """Rows of a round published first, copied into a buffer of the proxy's own (made once, for the
        most rows a round sends: M x W, or the staging's rows): `_publish_first` says why. One copy, no
        allocation a round."""
        buf = self._first_rows
        if buf is None:
            p = self.seg.params
            self._first_rows = buf = np.empty(max(self.M * self.W, p.max_rows) * p.row_bytes, dtype=np.uint8)
        flat = [np.asarray(r, dtype=np.uint8).reshape(-1) for r in rows]
        total = sum(int(f.shape[0]) for f in flat)
        if total > buf.shape[0]:  # more than a round can hold: not expected, but never a wrong send
            return [np.concatenate(flat)]
        out = buf[:total]
        if total:
            np.concatenate(flat, out=out)
        return [out]

    def _fail(self, slots: np.ndarray, n: int, reason: str) -> None:
        self.slots.mark_dirty(slots)
        self.stats.inc(f"fallback_{reason}")
        self.stats.inc("rounds_failed")
        self.packer.failed(n)

    def _within_cap(self, idx: np.ndarray | None, n: int, e_rows: np.ndarray) -> tuple[np.ndarray, int]:
        """The entries that fit the link's row cap (pacing.py): a prefix in entry order (at least one),
        so that in the usual round their rows are a prefix of the staging. The rest get no entry this
        round: no drafts, slots dirty, windows resent later at the paced rate (`ResyncPlanner.ask`)."""
        keep, n_rows = self.pacer.keep(e_rows)
        full = self._arange[:n] if idx is None else idx
        self.stats.inc("requests_over_link_cap", int(full.shape[0]) - keep)
        return full[:keep], n_rows
