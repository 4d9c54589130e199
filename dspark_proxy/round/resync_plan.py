"""Resync planning: which of a round's entries carry a ring window the engine staged, which still wait
for one, which slots to ask for next, and the STEP's rows as views of the staging and the windows.

A slot needs its ring window resent when the worker's copy cannot be trusted (a new connection, a
failed or late round, rows that did not fit); a slot whose range the proxy does not know (a new proxy
incarnation, a bad descriptor) takes the engine's range from the window (`adopt`). The protocol with
the engine (the request and the stamped windows) is shm/resync.py; how many windows a round may ask
for is the link pacing's (pacing.py). shm_layout.md §5 has the rules.

Owned by the round thread (one per attached segment, like RoundCore).
"""

from __future__ import annotations

import numpy as np

from ..ops.stats import Stats
from ..shm.resync import WindowAsker
from ..shm.stamped import SlotReader
from .pacing import LinkPacer
from .ring_model import Advance, SlotTable

__all__ = ["ResyncPlanner"]


class ResyncPlanner:
    """The slots whose ring window the round asked for (`want`), and the round's resync decisions."""

    def __init__(self, desc: SlotReader, win: WindowAsker, slots: SlotTable, pacer: LinkPacer, stats: Stats,
                 staging: np.ndarray) -> None:
        self.desc, self.win, self.slots, self.pacer, self.stats = desc, win, slots, pacer, stats
        self.staging = staging
        self.W = slots.W
        self.want = np.zeros(slots.max_slots, dtype=np.bool_)  # slots whose ring window we asked for

    def entries(self, t: int, n: int, slots: np.ndarray, plan: Advance, w_of: np.ndarray | None,
                        ) -> tuple[np.ndarray, np.ndarray, int, np.ndarray | None, np.ndarray]:
        """The round's step 5 when some request needs its ring window, has a range we do not know, or the engine
        staged windows with this round: which entries carry a staged window (`have_win`), which still
        wait for one (`pending`: sent with this round's rows, asked for again), the requests with an
        entry (`idx`, None = all) and the staged window of each request (`w_of`, -1 = none). Slots of
        unknown range are asked for too, but their entries go out as planned (the rows we know of)."""
        st = self.stats
        if w_of is None:
            w_of = self.staged_windows(t)[slots]  # staged window index per request, -1 = none
        wants = plan.resync
        have_win = wants & (w_of >= 0)
        if np.count_nonzero(have_win):
            have_win &= self.win.covers(w_of, plan.held_first, plan.held_rows)
        pending = wants & ~have_win  # needs its window; goes out with this round's rows only
        v = self.desc.v
        fits = v.staged == v.valid_raw
        has_entry = have_win | ((v.valid_raw > 0) & fits)
        n_pending, n_win = int(np.count_nonzero(pending)), int(np.count_nonzero(have_win))
        if n_pending:
            self.want[slots[pending]] = True
            st.inc("resync_pending", int(np.count_nonzero(pending & has_entry)))
        if n_win:
            self.want[slots[have_win]] = False
        if self.desc.n_misfit:
            # rows that did not fit, and no staged window to send instead: no entry this round
            nofit = int(np.count_nonzero(~fits & ~have_win))
            if nofit:
                st.inc("requests_not_staged", nofit)
        ask, n_ask = pending, n_pending
        if plan.n_unknown:
            ask = pending | self.slots.unknown[slots]
            n_ask = int(np.count_nonzero(ask))
        if n_ask or self.win.asked:
            self.ask(t, slots[ask] if n_ask else None)
        idx = np.flatnonzero(has_entry)
        return have_win, pending, n_pending, (None if idx.shape[0] == n else idx), w_of

    def adopt(self, t: int, slots: np.ndarray, plan: Advance, w_of: np.ndarray) -> Advance:
        """Slots of unknown range whose window the engine staged with round t (after writing t's rows)
        take the engine's range (`SlotTable.adopt`; shm_layout.md §5); a range that grew is resent
        whole this round: a NEW_GEN RESYNC entry from the staged window. `plan` is updated in place."""
        i = np.flatnonzero(w_of >= 0)
        if i.shape[0] == 0:
            return plan
        wi = w_of[i]
        got = self.win.ranges(t, wi)  # None once t is claimed: the headers may be a later round's
        if got is None:
            return plan
        lo, hi = got
        ok = self.slots.adopt(slots[i], lo, hi)
        i = i[ok]
        if i.shape[0] == 0:
            return plan
        new_first = self.slots.lo[slots[i]]
        grew = i[new_first < plan.held_first[i]]
        plan.held_first[i] = new_first
        plan.held_rows[i] = plan.anchor_pos[i] - new_first
        plan.new_gen[grew] = True
        plan.resync[grew] = True
        self.stats.inc("ring_ranges_adopted", int(i.shape[0]))
        return plan._replace(n_resync=int(np.count_nonzero(plan.resync)), n_unknown=plan.n_unknown - int(i.shape[0]))

    def staged_windows(self, t: int) -> np.ndarray:
        """Window index per slot for the windows the engine staged with round t (else -1)."""
        d = self.desc
        w, named = self.win.staged_windows(t, d.n_staged, d.staged_slots)
        if named is not None:
            # a staged slot we no longer need (clean again, or a new owner) stops being asked for
            self.want[named] &= self.slots.dirty[named]
        return w

    def ask(self, t: int, want: np.ndarray | None) -> None:
        """Ask the engine to stage, with round t + 1 and once, the windows of `want` (slots of round t's
        requests that still need their window; None: nothing), at most as many as fit the round's time
        (pacing.py) and one enqueue's byte budget: at realistic shapes a window is 9 MB, and a round
        that resends R of them (29 with the default budget) would outlast its deadline, time out and
        trip the breaker just when the worker's copies need rebuilding. Only this round's requests are
        asked for, so a request that left the batch is never staged again; a window asked for and not
        used (a failed round) is asked for again by the next round that still needs it."""
        if want is None:
            k = 0
        else:
            k = self.pacer.windows(int(want.shape[0]))
            if want.shape[0] > k:
                self.stats.inc("resync_windows_deferred", int(want.shape[0]) - k)  # paced: a later round
        self.win.ask(t, want, k)

    def row_views(self, idx: np.ndarray | None, have_win: np.ndarray, w_of: np.ndarray, e_first: np.ndarray,
                   e_rows: np.ndarray, staged_rows: np.ndarray) -> list[np.ndarray]:
        """The STEP's rows as views, in entry order: runs of the staging, split where a RESYNC entry
        takes its rows from a staged window instead. Python loops only over RESYNC entries (<= R).
        `idx`: the requests with an entry (None: all of them)."""
        staging = self.staging
        ends = np.cumsum(staged_rows)  # each request's staging rows end here
        # the entries' staging rows end with the last entry's (a round cut to the row cap sends a prefix)
        rows_staged = self.desc.rows_staged if idx is None else int(ends[idx[-1]])
        resync_pos = np.flatnonzero(have_win if idx is None else have_win[idx])
        if resync_pos.shape[0] == 0:
            return [staging[:rows_staged]]
        views: list[np.ndarray] = []
        cur = 0
        W = self.W
        for j in resync_pos.tolist():
            i = j if idx is None else int(idx[j])
            start = int(ends[i]) - int(staged_rows[i])
            if start > cur:
                views.append(staging[cur:start])
            rows = self.win.rows[int(w_of[i])]
            f, c = int(e_first[j]) % W, int(e_rows[j])
            if f + c <= W:
                views.append(rows[f:f + c])
            else:
                views.append(rows[f:])
                views.append(rows[:f + c - W])
            cur = int(ends[i])
        if rows_staged > cur:
            views.append(staging[cur:rows_staged])
        return views

