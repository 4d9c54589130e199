"""Per-session, per-slot windows of rows: the worker's half of the ring bookkeeping (SPEC §6).

Each slot holds its generation, the positions [lo, hi) it has rows for (at most the last W), and a
[W, row_bytes] array indexed by position % W, allocated when the slot is first seen. It also keeps a
chain of prefix CRCs over the rows received since the window last restarted, A(p) = crc32(rows
chain_start .. p), the last W + 1 of them: each row is hashed once, when it arrives, and the
`integrity` drafter assembles any window's CRC from two chain entries (dspark_proxy.crc) instead of
re-hashing W rows every round; with any other drafter (`chains=False`) no row is hashed. Entries are
applied one by one in batch order: this is the reference the proxy's vectorised model is checked
against, so it is written for clarity, not speed.
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict

import numpy as np

from ..wire import (
    RF_NEW_GEN,
    RS_BAD_ENTRY,
    RS_GAP,
    RS_OK,
    RS_PARTIAL_WINDOW,
    RS_STALE_GENERATION,
    RS_UNKNOWN_SLOT,
)

__all__ = ["SlotWindow", "Session", "SessionTable"]


class SlotWindow:
    """One slot's window: rows of positions [lo, hi) (hi - lo <= W) at index position % W."""

    __slots__ = ("generation", "lo", "hi", "rows", "chain", "chain_start", "chains")

    def __init__(self, window: int, row_bytes: int, chains: bool = True) -> None:
        self.generation = 0
        self.lo = 0
        self.hi = 0
        self.rows = np.empty((window, row_bytes), dtype=np.uint8)
        self.chain = [0] * (window + 1)  # A(p) at p % (W + 1)
        self.chain_start = 0
        self.chains = chains  # only the integrity drafter reads them: a torch drafter pays no CRC

    def write(self, first_pos: int, rows: np.ndarray, restart: bool) -> None:
        w = self.rows.shape[0]
        k = rows.shape[0]
        if k == 0:
            return
        if self.chains:
            R = w + 1
            chain = self.chain
            if restart:
                self.chain_start = first_pos
            prev = 0 if restart else chain[(first_pos - 1) % R]
            for j in range(k):  # each row hashed once, as it arrives
                prev = zlib.crc32(rows[j], prev)
                chain[(first_pos + j) % R] = prev
        start = first_pos % w
        if start + k <= w:
            self.rows[start:start + k] = rows
        else:
            cut = w - start
            self.rows[start:] = rows[:cut]
            self.rows[:k - cut] = rows[cut:]

    def chain_ends(self, w: int) -> tuple[int, int]:
        """(A(a - 1), A(hi - 1)) for the window of the last w rows, a = hi - w; A(a - 1) is 0 when the
        window starts where the chain does. crc(window) = A(hi-1) ^ shift(w L)(A(a-1))."""
        R = self.rows.shape[0] + 1
        a = self.hi - w
        before = self.chain[(a - 1) % R] if a > self.chain_start else 0
        return before, self.chain[(self.hi - 1) % R]

    def segments(self, w: int) -> list[np.ndarray]:
        """The last w rows (positions hi-w .. hi-1) in order, as at most two contiguous views."""
        size = self.rows.shape[0]
        start = (self.hi - w) % size
        if start + w <= size:
            return [self.rows[start:start + w]]
        return [self.rows[start:], self.rows[:w - (size - start)]]


class Session:
    """A client session's slots. The lock serialises steps of one session across connections."""

    def __init__(self, session_id: int, window: int, row_bytes: int, max_slots: int, chains: bool = True) -> None:
        self.session_id = session_id
        self.window = window
        self.row_bytes = row_bytes
        self.max_slots = max_slots
        self.chains = chains
        self.slots: dict[int, SlotWindow] = {}
        self.lock = threading.Lock()
        self.owner: int | None = None

    def apply(self, slot: int, generation: int, first_pos: int, n_rows: int, flags: int,
              rows: np.ndarray) -> tuple[int, int]:
        """Apply one well-formed entry; returns (status, rows held for the anchor)."""
        if slot >= self.max_slots:
            return RS_BAD_ENTRY, 0
        W = self.window
        sw = self.slots.get(slot)
        if flags & RF_NEW_GEN:
            if sw is not None and generation < sw.generation:
                return RS_STALE_GENERATION, 0
            if sw is None:
                sw = self.slots[slot] = SlotWindow(W, self.row_bytes, self.chains)
            sw.generation = generation
            sw.lo, sw.hi = first_pos, first_pos + n_rows
        else:
            if sw is None:
                return RS_UNKNOWN_SLOT, 0
            if generation < sw.generation:
                return RS_STALE_GENERATION, 0
            if generation > sw.generation or first_pos != sw.hi or sw.hi == sw.lo:
                return RS_GAP, 0
            sw.hi = first_pos + n_rows
            sw.lo = max(sw.lo, sw.hi - W)
        sw.write(first_pos, rows, restart=bool(flags & RF_NEW_GEN))
        w = min(W, sw.hi - sw.lo)
        return (RS_OK if w == W else RS_PARTIAL_WINDOW), w


class SessionTable:
    """All sessions, keyed by the session id of the frame header; least recently used evicted past
    max_sessions. A session belongs to the connection that last stepped it, and is dropped when that
    connection closes (the client's next connection raises the epoch and resends every window)."""

    def __init__(self, window: int, row_bytes: int, max_slots: int, max_sessions: int,
                 chains: bool = True) -> None:
        self._window = window
        self._chains = chains
        self._row_bytes = row_bytes
        self._max_slots = max_slots
        self._max_sessions = max_sessions
        self._lock = threading.Lock()
        self._sessions: OrderedDict[int, Session] = OrderedDict()
        self.evicted = 0

    def get(self, session_id: int, owner: int) -> Session:
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                s = self._sessions[session_id] = Session(session_id, self._window, self._row_bytes,
                                                         self._max_slots, self._chains)
                while len(self._sessions) > self._max_sessions:
                    self._sessions.popitem(last=False)
                    self.evicted += 1
            else:
                self._sessions.move_to_end(session_id)
            s.owner = owner
            return s

    def drop(self, session_id: int) -> bool:
        with self._lock:
            return self._sessions.pop(session_id, None) is not None

    def drop_owned_by(self, owner: int) -> int:
        with self._lock:
            ids = [k for k, s in self._sessions.items() if s.owner == owner]
            for k in ids:
                del self._sessions[k]
            return len(ids)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: int) -> bool:
        return session_id in self._sessions
