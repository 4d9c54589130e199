"""The engine side's ring: the last W rows of each slot, with the rows themselves (SPEC §2 step 5, §3).

The proxy models this ring on positions only (dspark_proxy.ring.SlotTable) and asks for a slot's
window when the worker's copy must be rebuilt; the engine side then copies the slot's block into the
resync area. Both sides apply the same rules through the same SlotTable, so the positions the proxy
believes are held are, row for row, the positions written here.

Layout: ``rows[slot, pos % W]`` holds the row of position ``pos`` — the ring layout itself, which is
also the layout of a staged resync window, so staging one is a single contiguous copy of the slot's
block. The block is allocated with ``np.zeros``: the kernel maps untouched pages lazily, so slots the
engine never uses cost no memory.

Thread ownership: the engine thread that enqueues rounds; nothing here locks.
"""

from __future__ import annotations

import numpy as np

from dspark_proxy.ring import SlotTable

__all__ = ["EngineRing"]


class EngineRing:
    """Rows of the last W positions per slot, plus the same position bookkeeping as the proxy's model.

    ``table`` is a SlotTable; the engine side uses its owner, generation and range (its dirty and
    announced flags describe the worker's copy, which only the proxy tracks).
    """

    def __init__(self, max_slots: int, window: int, row_bytes: int) -> None:
        if row_bytes <= 0:
            raise ValueError(f"row_bytes must be > 0, got {row_bytes}")
        self.table = SlotTable(max_slots, window)
        self.max_slots = self.table.max_slots
        self.window = self.table.window
        self.row_bytes = int(row_bytes)
        self.rows = np.zeros((self.max_slots, self.window, self.row_bytes), dtype=np.uint8)
        self._flat = self.rows.reshape(self.max_slots * self.window, self.row_bytes)
        self._anchor = np.empty(self.max_slots, dtype=np.int64)

    def write(self, slots: np.ndarray, req_ids: np.ndarray, first_pos: np.ndarray, valid: np.ndarray,
              rows: np.ndarray) -> np.ndarray:
        """Apply one round: owners, ranges (SlotTable rules) and the rows, scattered into
        ``rows[slot, pos % W]``; returns the anchor positions (int64 [n], a fresh array).

        ``rows`` is [sum(max(valid, 0)), row_bytes] uint8, request after request in batch order, each
        request's rows in position order. Of a request that sends more than W rows only the last W are
        kept (the earlier ones would land on the same ring rows). Each slot at most once per round.
        """
        slots = np.asarray(slots, dtype=np.int64)
        first_pos = np.asarray(first_pos, dtype=np.int64)
        valid = np.asarray(valid, dtype=np.int64)
        n = slots.shape[0]
        W = self.window
        sent = np.maximum(valid, 0)
        total = int(sent.sum())
        if rows.shape != (total, self.row_bytes) or rows.dtype != np.uint8:
            raise ValueError(f"rows must be uint8 [{total}, {self.row_bytes}], got {rows.dtype} {rows.shape}")
        self.table.begin_requests(slots, req_ids)
        anchor = self.table.apply(slots, first_pos, valid, out=np.empty(n, dtype=np.int64))
        if total == 0:
            return anchor
        kept = np.minimum(sent, W)
        n_kept = total if kept is sent else int(kept.sum())
        # flat index of each kept row: request i's j-th kept row is position anchor_i - kept_i + j,
        # and row (start of request i in `rows`) + sent_i - kept_i + j of the input
        starts = np.cumsum(kept) - kept  # where request i's kept rows begin in the flat list
        j = np.arange(n_kept, dtype=np.int64)
        pos = j + np.repeat(anchor - kept - starts, kept)
        dst = np.repeat(slots * W, kept) + pos % W
        if n_kept == total:
            self._flat[dst] = rows
        else:
            src_start = np.cumsum(sent) - sent + (sent - kept)
            self._flat[dst] = rows[j + np.repeat(src_start - starts, kept)]
        return anchor

    def stage_window(self, slot: int, dst_rows: np.ndarray) -> tuple[int, int, int]:
        """Copy the slot's whole ring block (W rows, indexed by position % W) into ``dst_rows``
        [W, row_bytes] and return ``(generation, lo, hi)`` of what it holds (empty when hi < lo).

        Positions outside ``lo..hi`` are stale bytes: the range, not the block, says what is valid.
        """
        s = int(slot)
        if not 0 <= s < self.max_slots:
            raise IndexError(f"slot {s} out of range [0, {self.max_slots})")
        np.copyto(dst_rows, self.rows[s])
        t = self.table
        return int(t.generation[s]), int(t.lo[s]), int(t.hi[s])

    def window_rows(self, slot: int, first: int, n: int) -> np.ndarray:
        """The rows of positions ``first .. first + n - 1`` in order (a copy; for tests and oracles).
        Raises ValueError when the slot does not hold all of them."""
        s = int(slot)
        lo, hi = int(self.table.lo[s]), int(self.table.hi[s])
        if n < 0 or (n > 0 and (first < lo or first + n - 1 > hi)):
            raise ValueError(f"slot {s} holds positions {lo}..{hi}, not {first}..{first + n - 1}")
        return self.rows[s][(first + np.arange(n, dtype=np.int64)) % self.window]
