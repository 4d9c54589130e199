"""The engine's writes of one round into the attached segment, in the order the proxy relies on:
the staging rows (a private ring only: with the shared ring the rows are already where the proxy reads
them), the metadata slot, the resync windows asked for, the descriptor slot; `gathered` is
raised by the shim after all of them (shm_layout.md §5). The protocols themselves are shm/stamped.py
(the slots) and shm/resync.py (the windows); this is the engine thread's, one per attached segment.
"""

from __future__ import annotations

import numpy as np

from dspark_proxy import native
from dspark_proxy.ops.stats import Stats
from dspark_proxy.shm.layout import META_SLOTS
from dspark_proxy.shm.resync import WindowStager
from dspark_proxy.shm.segment import Segment
from dspark_proxy.shm.stamped import SlotWriter

from .row_ring import EngineRing

__all__ = ["RoundWriter"]


class RoundWriter:
    """Writes round t of validated inputs (EnqueueInputs) into one attached segment. With the ring's
    `native` choice, the staging, meta and desc are one C call (_fastround.write_round), after the
    windows; the bytes are the same (every one is published by the `gathered` raised after them all)."""

    def __init__(self, seg: Segment, ring: EngineRing, counters: Stats, sampled: bool, shared: bool = False) -> None:
        """``shared``: the ring is the engine's shared ring (shm/ring_shm.py), named in the segment's
        header: the proxy sends the rows from it, so nothing is copied into the staging or the windows."""
        self.seg, self.sampled, self.shared = seg, sampled, shared
        self.slots = SlotWriter(seg)
        self.stager = WindowStager(seg, ring, counters, shared)
        self.native = ring.native
        lay = seg.layout
        self._moffs, self._doffs = native.meta_offsets(lay.meta_dtype), native.desc_offsets(lay.desc_dtype)
        self._staging_off = lay.staging
        # per round: the slots' offsets and the counts, looked up once here rather than through properties
        self._slot_offs = [(lay.meta_off(i), lay.desc_off(i)) for i in range(META_SLOTS)]
        p = seg.params
        self._max_rows, self._max_reqs, self._R = p.max_rows, p.max_reqs, p.resync_per_round
        self._no_staged = np.zeros(0, dtype=np.int64)
        self._no_rows = np.zeros((0, seg.params.row_bytes), dtype=np.uint8)

    def write(self, t: int, n: int, a: dict[str, np.ndarray]) -> tuple[int, int]:
        """Round t of n requests; returns (rows staged, longest query) for the round's events."""
        seg, max_rows = self.seg, self._max_rows
        valid = a["valid"]
        total = int(a["rows"].shape[0])
        if total <= max_rows:  # the usual round: every request's rows fit
            k, rows_staged = n, total
        else:
            # requests whose rows do not fit stage none this round (the proxy resyncs them later); the
            # ends only grow, so those that fit are a prefix
            ends = np.cumsum(valid)
            k = int(np.searchsorted(ends, max_rows, side="right"))
            rows_staged = int(ends[k - 1]) if k else 0
        qsl = a["qsl"]
        if self.native:
            staged = self.stager.stage(t, a["slots"])
            st = np.array(staged, dtype=np.int64) if staged else self._no_staged
            s = self.sampled
            meta_off, desc_off = self._slot_offs[t % META_SLOTS]
            max_q = native.fastround.write_round(  # max_q -1: computed there from qsl, as below
                seg.mm, meta_off, desc_off, self._moffs, self._doffs, t, n, rows_staged,
                k, -1, st, self._staging_off, self._no_rows if self.shared else a["rows"][:rows_staged], valid, a["first_pos"], a["anchor"],
                a["sampled"], a["seed"] if s else None, a["temperature"] if s else None, a["req_ids"], a["slots"], qsl,
                a["need_draft"], a["k_window"], self._max_reqs, self._R)
            return rows_staged, max_q
        if rows_staged and not self.shared:
            seg.staging[:rows_staged] = a["rows"][:rows_staged]
        self.slots.write_meta(t, n, rows_staged, k, a, self.sampled)
        staged = self.stager.stage(t, a["slots"])  # a bounded number of windows, once per request
        max_q = int((qsl[1:] - qsl[:-1]).max()) if n else 0
        self.slots.write_desc(t, n, max_q, rows_staged, staged, a)
        return rows_staged, max_q

    def write_nothing(self, t: int) -> None:
        """Round t with no requests, no rows and no windows (a rejected round)."""
        self.slots.write_nothing(t)
