"""The proxy's view of the engine's shared ring (shm/ring_shm.py): the STEP's rows are sent from there,
so a round's rows cross the engine side once (shm_layout.md §1, "The engine's shared ring").

Entry i's rows are positions `first .. first + n - 1` of its slot, held at `ring[slot, pos % W]` as the
engine wrote them in `enqueue(t)`: at most two runs per entry, one when the slot's block does not wrap.
Rows below `GATHER_BELOW` bytes are gathered into one private buffer (`_fastround.ring_gather`, or
`gather` below, its reference: hundreds of 256-byte iovecs would cost more than the copy); larger ones go out as views of the ring, the kernel's
copy into the socket being the only one (`_fastround.ring_runs`, or `runs` below, its reference).

The engine rewrites ring rows only in `enqueue(t + 1)`, after round t was claimed; a proxy still
sending when the watchdog claims t then loses its publish and marks every slot dirty (round/core.py), so
rows read while being rewritten never reach a draft the engine uses.

Owned by the round thread (one per attached segment, like RoundCore).
"""

from __future__ import annotations

import numpy as np

from .. import native
from ..native import fastround as _fastround
from ..shm.layout import Word
from ..shm.ring_shm import RingError, open_ring, read_ring_name
from ..shm.segment import Segment

__all__ = ["GATHER_BELOW", "RingRows"]

GATHER_BELOW = 4096  # bytes per row under which a round's rows are gathered rather than sent as views


class RingRows:
    """The engine's shared ring, mapped read-only once the engine names it (`open`), and the STEP's rows
    from it."""

    def __init__(self, seg: Segment, native_path: bool) -> None:
        p = seg.params
        self.seg, self.native = seg, native_path
        self.M, self.W, self.B = p.max_reqs, p.window, p.row_bytes
        self.nbytes = self.M * self.W * self.B
        self.name = ""
        self.rows: np.ndarray | None = None  # [M * W] rows as void items
        self._base: memoryview | None = None  # the ring as bytes, sliced into runs
        self._ring_u8: np.ndarray | None = None  # the same, for the C gather
        self._gather: np.ndarray | None = None  # the private buffer of small rows, made at first use
        self._row_t = np.dtype((np.void, self.B))
        self._j = np.arange(self.M * self.W, dtype=np.int64)
        self._small_c = False  # open, the C path, small rows: views() gathers in one C call
        # the same, for round_front's gather (round/fused.py): (ring, out, row_bytes); None otherwise
        self.c_gather: tuple[np.ndarray, np.ndarray, int] | None = None

    def open(self) -> bool:
        """Map the ring the engine named in the header (once); False: it named none (a private ring:
        rows come through the staging). Raises RingError when the named ring cannot be opened."""
        if self.rows is not None:
            return True
        name = read_ring_name(self.seg.mm)
        if not name:
            return False
        arr = open_ring(name, self.nbytes, self.seg.word(Word.ENGINE_PID))
        self.name = name
        self._base = memoryview(arr)
        self._ring_u8 = arr
        self.rows = arr.view(self._row_t)
        if self.native and self.B < GATHER_BELOW:
            self.c_gather = (arr, self._gather_buf(), self.B)
            self._small_c = True
        return True

    def close(self) -> None:
        """The incarnation ended: drop every view of the ring, so its mapping goes now and an ended
        engine's memory (a memfd lives while anyone maps it) is not held until the next engine attaches."""
        self.rows = self._base = self._ring_u8 = None
        self.c_gather = None
        self._small_c = False
        self.name = ""

    def views(self, slots: np.ndarray, first: np.ndarray, n_rows: np.ndarray) -> list:
        """The rows of each entry (`slots`, `first`, `n_rows`: int64, entry order), as one gathered
        buffer (small rows) or runs of the ring (large rows)."""
        if self._small_c:  # the usual case, without the conversions (a wrong dtype raises in the C call)
            out = self._gather
            return [out[:_fastround.ring_gather(self._ring_u8, slots, first, n_rows, self.W, self.B, out)]]
        if self.rows is None:
            raise RingError("the engine's shared ring is not open")
        slots = np.asarray(slots, dtype=np.int64)
        first = np.asarray(first, dtype=np.int64)
        n_rows = np.asarray(n_rows, dtype=np.int64)
        if self.B < GATHER_BELOW:
            if self.native:
                out = self._gather_buf()
                k = native.fastround.ring_gather(self._ring_u8, slots, first, n_rows, self.W, self.B, out)
                return [out[:k]]
            return [self.gather(slots, first, n_rows)]
        if self.native:
            return native.fastround.ring_runs(self._base, np.ascontiguousarray(slots), np.ascontiguousarray(first),
                                              np.ascontiguousarray(n_rows), self.W, self.B)
        return self.runs(slots, first, n_rows)

    def gathered(self, k: int) -> list:
        """What views() returns for rows round_front already gathered into `c_gather`'s buffer (k rows)."""
        assert self._gather is not None
        return [self._gather[:k]]

    def gather(self, slots: np.ndarray, first: np.ndarray, n_rows: np.ndarray) -> np.ndarray:
        """Every entry's rows, in order, copied into the private buffer (vectorised: one take)."""
        assert self.rows is not None
        if np.count_nonzero((slots < 0) | (slots >= self.M) | (n_rows < 0) | (n_rows > self.W)):
            raise ValueError("ring rows: a slot or a row count outside the ring")
        ends = np.add.accumulate(n_rows)
        total = int(ends[-1]) if ends.shape[0] else 0
        out = self._gather_buf()[:total]
        if total:
            # row j of the round belongs to entry i and holds its position j - (ends_i - n_i) + first_i
            pos = self._j[:total] + np.repeat(first - ends + n_rows, n_rows)
            idx = np.repeat(slots * self.W, n_rows) + pos % self.W
            np.take(self.rows, idx, out=out.view(self._row_t).reshape(total))
        return out

    def _gather_buf(self) -> np.ndarray:
        if self._gather is None:  # virtual until written: a round writes only the rows it sends
            self._gather = np.empty((self.M * self.W, self.B), dtype=np.uint8)
        return self._gather

    def runs(self, slots: np.ndarray, first: np.ndarray, n_rows: np.ndarray) -> list:
        """The reference of _fastround.ring_runs: each entry's one or two runs of the ring, a run that
        continues the previous one in memory merged into it."""
        assert self._base is not None
        W, B = self.W, self.B
        spans: list[list[int]] = []
        for s, f, c in zip(slots.tolist(), first.tolist(), n_rows.tolist(), strict=True):
            if not (0 <= s < self.M and 0 <= c <= W):
                raise ValueError(f"ring rows: slot {s} or rows {c} outside the ring")
            if c == 0:
                continue
            a, blk = f % W, s * W
            parts = [((blk + a) * B, (blk + a + c) * B)] if a + c <= W else \
                [((blk + a) * B, (blk + W) * B), (blk * B, (blk + a + c - W) * B)]
            for lo, hi in parts:
                if spans and spans[-1][1] == lo:
                    spans[-1][1] = hi
                else:
                    spans.append([lo, hi])
        return [self._base[lo:hi] for lo, hi in spans]
