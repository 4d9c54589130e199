"""The engine side's ring: the last W rows of each slot, with the rows themselves (shm_layout.md §5).

The proxy models this ring on positions only (dspark_proxy.round.ring_model.SlotTable) and asks for a slot's
window when the worker's copy must be rebuilt; the engine side then copies the slot's block into the
resync area. Both sides apply the same rules through the same SlotTable, so the positions the proxy
believes are held are, row for row, the positions written here.

Layout: ``rows[slot, pos % W]`` holds the row of position ``pos`` — the ring layout itself, which is
also the layout of a staged resync window, so staging one is a single contiguous copy of the slot's
block. The rows are the engine's shared ring by default (shm/ring_shm.py: the proxy sends from them,
so each row is written once); a private ring is an anonymous mapping whose untouched pages cost nothing.

Cost (measured, n = 256 requests, 910 rows, W = 128): write about 24 us with 16-byte rows, all but
~2 us of it bookkeeping; with 71,680-byte rows it is the 65 MB copy (about 5 ms on this CPU).

Thread ownership: the engine thread that enqueues rounds; nothing here locks.
"""

from __future__ import annotations

import mmap

import numpy as np

from dspark_proxy import native
from dspark_proxy.round.ring_model import SlotTable

__all__ = ["EngineRing"]


def _lazy_zeros(nbytes: int) -> np.ndarray:
    """Zeroed memory that becomes resident only where written, one 4 KiB page at a time.

    np.zeros of a large block asks the kernel for transparent huge pages (numpy madvises them), so a
    few rows per slot made whole 2 MiB pages resident: at M=256, W=128, 71,680-byte rows the ring cost
    ~1 GB after 38 rows per slot. An anonymous mapping without huge pages costs what is written."""
    mm = mmap.mmap(-1, max(nbytes, 1))
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_NOHUGEPAGE)
        except OSError:
            pass
    return np.frombuffer(mm, dtype=np.uint8, count=nbytes)


class EngineRing:
    """Rows of the last W positions per slot, plus the same position bookkeeping as the proxy's model.

    ``table`` is a SlotTable; the engine side uses its owner, generation and range (its dirty and
    announced flags describe the worker's copy, which only the proxy tracks). ``native``: ``write`` is one
    C call (_fastround.ring_write) applying the same rules (dspark_proxy/native.py); this is its reference.
    """

    def __init__(self, max_slots: int, window: int, row_bytes: int, native: bool = False,
                 buf: np.ndarray | None = None) -> None:
        """``buf``: the memory of the rows, uint8 [max_slots * window * row_bytes] (the engine's shared
        ring, shm/ring_shm.py, which the proxy sends from); None: private, lazily zeroed memory."""
        self.native = native
        if row_bytes <= 0:
            raise ValueError(f"row_bytes must be > 0, got {row_bytes}")
        self.table = SlotTable(max_slots, window, known=True)  # the ring itself: every range is known
        self.max_slots = self.table.max_slots
        self.W = self.table.W
        self.row_bytes = int(row_bytes)
        nbytes = self.max_slots * self.W * self.row_bytes
        if buf is not None and (buf.dtype != np.uint8 or buf.shape != (nbytes,)):
            raise ValueError(f"ring buffer must be uint8 [{nbytes}], got {buf.dtype} {buf.shape}")
        self.rows = (_lazy_zeros(nbytes) if buf is None else buf).reshape(
            self.max_slots, self.W, self.row_bytes)
        self._row_t = np.dtype((np.void, self.row_bytes))
        self._flat = self.rows.view(self._row_t).reshape(self.max_slots * self.W)
        self._j = np.arange(self.max_slots * self.W, dtype=np.int64)  # the flat row counter, never rebuilt
        self._ring_u8 = self.rows.reshape(-1)
        self._held = None  # the table's arrays for the C write (_hold), made at its first use

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
        if self.native and not self.table.counts[0]:  # (n_unknown) the engine's table is known=True: always
            return self._write_native(slots, req_ids, first_pos, valid, rows)
        W = self.W
        sent = np.maximum(valid, 0)
        sent_ends = np.add.accumulate(sent)
        total = int(sent_ends[-1]) if sent_ends.shape[0] else 0
        if rows.shape != (total, self.row_bytes) or rows.dtype != np.uint8:
            raise ValueError(f"rows must be uint8 [{total}, {self.row_bytes}], got {rows.dtype} {rows.shape}")
        self.table.begin_requests(slots, req_ids)
        anchor = self.table.apply(slots, first_pos, valid)
        if total == 0:
            return anchor
        over = np.count_nonzero(sent > W)
        kept = np.minimum(sent, W) if over else sent
        ends = np.add.accumulate(kept) if over else sent_ends
        n_kept = int(ends[-1])
        # kept row j (counting over the whole round) of request i holds position j + anchor_i - ends_i
        j = self._j[:n_kept]
        pos = j + np.repeat(anchor - ends, kept)
        dst = np.repeat(slots * W, kept) + pos % W
        if not rows.flags.c_contiguous:
            rows = np.ascontiguousarray(rows)
        # rows as one void item each: a 1-D fancy assignment moves a row per index, far cheaper than 2-D
        src = rows.view(self._row_t).reshape(total)
        if over:
            # and comes from input row j + sent_ends_i - ends_i (the last `kept` of the request's rows)
            src = src[j + np.repeat(sent_ends - ends, kept)]
        self._flat[dst] = src
        return anchor

    def write_checked(self, slots: np.ndarray, req_ids: np.ndarray, first_pos: np.ndarray, valid: np.ndarray,
                      rows: np.ndarray) -> None:
        """``write`` for the shim's round, whose arrays EnqueueInputs has made C-contiguous int64 (rows
        uint8 [total, row_bytes]): on the C path one ring_write with no conversion (nor anchors)."""
        if self.native and not self.table.counts[0]:  # (n_unknown)
            held = self._held if self._held is not None else self._hold()
            native.fastround.ring_write(held, self._ring_u8, slots, req_ids, first_pos, valid, rows, self.W,
                                        self.row_bytes)
            return
        self.write(slots, req_ids, first_pos, valid, rows)

    def _write_native(self, slots: np.ndarray, req_ids: np.ndarray, first_pos: np.ndarray, valid: np.ndarray,
                      rows: np.ndarray) -> np.ndarray:
        if rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] != self.row_bytes:
            raise ValueError(f"rows must be uint8 [total, {self.row_bytes}], got {rows.dtype} {rows.shape}")
        held = self._held if self._held is not None else self._hold()
        native.fastround.ring_write(held, self._ring_u8, np.ascontiguousarray(slots),
                                    np.ascontiguousarray(req_ids, dtype=np.int64),
                                    np.ascontiguousarray(first_pos), np.ascontiguousarray(valid),
                                    np.ascontiguousarray(rows), self.W, self.row_bytes)
        return first_pos + valid

    def _hold(self):
        """The table's arrays, their buffers taken once for ring_write (_fastround_held.c)."""
        t = self.table
        self._held = native.fastround.Held((t.owner, t.generation, t.lo, t.hi, t.dirty, t.announced))
        return self._held

    def window_range(self, slot: int) -> tuple[int, int, int]:
        """``(generation, lo, hi)`` of what the slot's block holds now (a shared ring's window record)."""
        s, t = int(slot), self.table
        if not 0 <= s < self.max_slots:
            raise IndexError(f"slot {s} out of range [0, {self.max_slots})")
        return int(t.generation[s]), int(t.lo[s]), int(t.hi[s])

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
        return self.rows[s][(first + np.arange(n, dtype=np.int64)) % self.W]
