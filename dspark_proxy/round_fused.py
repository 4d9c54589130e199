"""The usual round's fused C calls (`_fastround_fused.c`): what RoundCore runs on the C path where
the reference runs two or three calls with Python between them.

At n = 1 a round's cost is its calls and the Python around them, not its data (round.py, "Cost"), so
the C path joins the calls that follow each other in the usual round, each joined call running the
very code of the single ones (advance_core, accept_core, pack_whole_core):
- `advance`: the ring model's advance, then the acceptance sums, when the gate's `begin` has nothing
  to do in between (no new owner while the gate is on, no pause ending); otherwise the sums run as
  before (`Acceptance.round`).
- `finish`: step 8 when every request got an entry, asked for drafts and came back RS_OK with all N
  drafts: the slots announced, the page packed, its n and status words, in one call. Any other round
  (or a sampled segment) returns False having written nothing, and round.py's `_accept` runs.

The reference model (DSPARK_NATIVE=0) never comes here; tests/test_native_diff_round.py and
test_native_diff.py hold both paths to the same bytes and counters, and test_native_fused.py checks
that their usual rounds do take these calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .acceptance import Acceptance
from .native import fastround
from .reply_page import PagePacker
from .ring_model import Advance, SlotTable
from .shm.layout import STATUS_OK

__all__ = ["FusedRound"]


class FusedRound:
    """The fused calls over one RoundCore's ring model, acceptance and page (all made once, written in
    place: their buffers are held, `_fastround_held.c`)."""

    def __init__(self, table: SlotTable, accept: Acceptance, packer: PagePacker, num_spec: int, window: int) -> None:
        self.table, self.accept, self.packer = table, accept, packer
        self.N, self.W = num_spec, window
        L = packer.L
        self._page_args = (L.o_ok, L.o_ids, L.o_conf, L.M, num_spec)
        self._can_finish = not L.sampled  # a sampled page has sections pack_whole does not write
        self._fin_held: Any = None
        self.advanced = self.finished = 0  # rounds that took each fused call (tests read them)

    def advance(self, t: int, slots: np.ndarray, req: np.ndarray, first: np.ndarray, valid: np.ndarray,
                valid_raw: np.ndarray, k_window: np.ndarray) -> Advance:
        """SlotTable.advance then Acceptance.round, as round.py's step 2 runs them."""
        acc = self.accept
        g = acc.gate
        held, out = self.table.native_held(slots.shape[0])
        n_new, n_resync, n_unknown, summed, n_ver, tokens, n_ready = fastround.advance_accept(
            held, acc.native_held(), slots, req, first, valid, valid_raw, k_window, self.W, self.N, g.on,
            g.n_probing > 0, acc.sums_may_fuse(t))
        plan = self.table.native_plan(out, n_new, n_resync, n_unknown)
        if summed:
            self.advanced += 1
            acc.summed(t, n_ver, tokens, n_ready)
        else:
            acc.round(t, slots, valid_raw, k_window, plan.new_owner, n_new)
        return plan

    def finish(self, n: int, e_slots: np.ndarray, need: np.ndarray, reply: Any, cap: int) -> bool:
        """Step 8 of a round whose n requests all have entries, in order: True when it was the usual
        one and is done (ring model and page), False when nothing was written."""
        if not self._can_finish:
            return False
        held = self._fin_held
        if held is None:
            held = self._fin_held = fastround.Held((self.table.announced, self.table.dirty, self.packer.page))
        p = self.packer
        ok_rows, ids_rows = p.rows_written()
        o_ok, o_ids, o_conf, M, N = self._page_args
        if not fastround.finish_whole(held, e_slots, reply.status, need, reply.draft_ids, reply.confidence, o_ok, o_ids,
                                      o_conf, M, N, cap, ok_rows, ids_rows, STATUS_OK):
            return False
        p.wrote_whole(n)
        self.finished += 1
        return True
