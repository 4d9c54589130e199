"""The usual round's fused C calls (`_fastround_fused.c`): what RoundCore runs on the C path where
the reference runs two or three calls with Python between them.

At n = 1 a round's cost is its calls and the Python around them, not its data (round/core.py, "Cost"), so
the C path joins the calls that follow each other in the usual round, each joined call running the
very code of the single ones (read_core, advance_core, accept_core, fill_core, pack_whole_core):
- `front`: the descriptor read, then (when the caller has no connection epoch or moved slots to apply
  first) the ring model's advance and the acceptance sums, then (when the caller knows nothing in
  between would change them) the usual round's entries and, from the engine's shared ring, their
  small rows (ring_rows.py's gather); `stage` says how far it went and round/core.py goes on from there.
- `advance`: the ring model's advance, then the acceptance sums, when the gate's `begin` has nothing
  to do in between (no new owner while the gate is on, no pause ending); otherwise the sums run as
  before (`Acceptance.round`).
- `finish`: step 8 when every request got an entry, asked for drafts and came back RS_OK with all N
  drafts: the slots announced, the page packed, its n and status words, in one call. Any other round
  (or a sampled segment) returns False having written nothing, and round/core.py's `_accept` runs.

The reference model (DSPARK_NATIVE=0) never comes here; tests/test_native_diff_round.py and
test_native_diff.py hold both paths to the same bytes and counters, and test_native_fused.py checks
that their usual rounds do take these calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..native import fastround
from ..shm.layout import META_SLOTS, STATUS_OK
from ..shm.segment import Segment
from ..shm.stamped import SlotReader
from .acceptance import Acceptance
from .reply_page import PagePacker
from .ring_model import Advance, SlotTable

__all__ = ["FusedRound"]

_NO_GATHER = (None, None, 0)


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
        self._front_fixed: tuple | None = None
        self.fronts = [0, 0, 0, 0]  # rounds by the stage their front reached (tests read them)
        self.advanced = self.finished = 0  # rounds that took each fused call (tests read them)
        self.k_staged = 0  # the last front's requests with staged rows (stage >= 1)
        self.n_gathered = -1  # the last front's rows gathered from the shared ring (-1: none)

    def front(self, t: int, seg: Segment, reader: SlotReader, go: bool, fill: bool, prefix: Any, ent_off: int,
              ent_size: int, eoffs: np.ndarray, gather: tuple | None = None) -> tuple[int, Advance | None, int]:
        """Round t's descriptor read (BadDescriptor as SlotReader.read raises it), and as far past it as
        `go` and `fill` allow (round_front in _fastround_fused.c): (n, the plan or None below stage 1,
        stage). `gather`: (ring, out, row_bytes) of the engine's shared ring (RingRows.c_gather): at stage 3
        the entries' rows are gathered into `out` too, `n_gathered` of them (-1: not gathered)."""
        acc, tab = self.accept, self.table
        g = acc.gate
        fixed = self._front_fixed
        if fixed is None:  # what every call passes the same: the reader's copies, scratch, sizes and slots'
            # offsets, the entries' offsets, the acceptance sums' arrays, the ring model's tables
            fixed = self._front_fixed = (fastround.Held((*reader.front_arrays(), eoffs)), reader.M, reader.W, reader.R,
                                         reader.max_rows, tuple(reader.offsets(i) for i in range(META_SLOTS)),
                                         acc.native_held(), tab.native_held())
        held, M, W, R, max_rows, offs, held_acc, held_tab = fixed
        desc_off, meta_off = offs[t % META_SLOTS]
        ring, out, B = gather or _NO_GATHER
        (code, n, max_q, rows, n_staged, n_misfit, stage, self.k_staged, n_new, n_resync, n_unknown, n_ver, tokens,
         n_ready, self.n_gathered) = fastround.round_front(seg.mm, desc_off, meta_off, held, t, M, W, R, max_rows,
                                                           held_tab, held_acc, self.N, g.on,
                                                           g.n_probing > 0, acc.sums_may_fuse(t),
                                                           go, fill, prefix,
                                                           ent_off, ent_size, ring, out, B)
        self.fronts[stage] += 1
        n = reader.read_done(t, code, n, max_q, rows, n_staged, n_misfit)
        if stage == 0:
            return n, None, 0
        plan = tab.native_plan_of(n, n_new, n_resync, n_unknown)
        decode = max_q <= self.N + 1  # (round/core.py's phase)
        if stage >= 2:
            acc.summed(t, n, n_ver, tokens, n_ready, decode)
        else:
            acc.round(t, reader.v.slots, reader.v.valid_raw, reader.v.k_window, plan.new_owner, n_new, decode)
        return n, plan, stage

    def advance(self, t: int, slots: np.ndarray, req: np.ndarray, first: np.ndarray, valid: np.ndarray,
                valid_raw: np.ndarray, k_window: np.ndarray, decode: bool = True) -> Advance:
        """SlotTable.advance then Acceptance.round, as round/core.py's step 2 runs them (decode: a decode
        round, Acceptance.round's)."""
        acc = self.accept
        g = acc.gate
        n_new, n_resync, n_unknown, summed, n_ver, tokens, n_ready = fastround.advance_accept(
            self.table.native_held(), acc.native_held(), slots, req, first, valid, valid_raw, k_window, self.W, self.N, g.on,
            g.n_probing > 0, acc.sums_may_fuse(t))
        plan = self.table.native_plan_of(slots.shape[0], n_new, n_resync, n_unknown)
        if summed:
            self.advanced += 1
            acc.summed(t, slots.shape[0], n_ver, tokens, n_ready, decode)
        else:
            acc.round(t, slots, valid_raw, k_window, plan.new_owner, n_new, decode)
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
        o_ok, o_ids, o_conf, M, N = self._page_args
        if not fastround.finish_whole(held, e_slots, reply.status, need, reply.draft_ids, reply.confidence, o_ok, o_ids,
                                      o_conf, M, N, cap, p.ok_rows, p.ids_rows, STATUS_OK):
            return False
        p.ok_rows = p.ids_rows = n  # packed as pack's C path packs the usual round
        self.finished += 1
        return True
