"""The resync request and the staged windows: both halves of one sub-protocol (shm_layout.md §5,
"Resync windows" and "Resync requests").

- `WindowAsker` (the proxy's round thread) writes the request (a seqlock block: which slots' ring
  windows the engine should stage, once, from round `round` on) and reads the windows the engine
  staged with a round (a window counts only if its stamp is that round and its slot matches).
- `WindowStager` (the engine thread) reads the request when its sequence moved, honours it once at the
  first enqueue of the round it names or later, for the slots of that round's requests, up to one
  enqueue's byte budget (`resync_windows_per_enqueue`), and stamps each window it stages.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from . import _hostflag
from .layout import Word, resync_windows_per_enqueue
from .segment import Segment

__all__ = ["WindowAsker", "WindowStager"]


class _Counters(Protocol):
    def inc(self, key: str, by: int = 1) -> None: ...
    def set(self, key: str, value: object) -> None: ...
    def gauge(self, key: str, default: float = 0) -> float: ...


class _Ring(Protocol):
    def stage_window(self, s: int, dst: np.ndarray) -> tuple[int, int, int]: ...
    def window_range(self, s: int) -> tuple[int, int, int]: ...


# ----------------------------------------------------------------------------------------- proxy side


class WindowAsker:
    """The proxy's half: the request it writes, and the windows the engine staged for it."""

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        lay, self.M = seg.layout, seg.params.max_reqs
        self.req = np.zeros(1, lay.resync_req_dtype)  # the last request written
        self.asked = 0  # windows in the last request written (0: nothing asked for)
        self._seq_off, self._req_off = lay.word_off(Word.RESYNC_SEQ), lay.resync_req
        self._claimed_off = lay.word_off(Word.CLAIMED)
        self._slot_of_window = np.full(self.M, -1, dtype=np.int64)  # staged window index per slot
        win = seg.windows  # the staged windows' header fields and rows, as views made once
        self.stamp, self.slot, self.lo, self.hi = win["stamp"], win["slot"], win["lo"], win["hi"]
        self.rows = [win[i]["rows"] for i in range(seg.params.resync_per_round)]

    def ask(self, t: int, want: np.ndarray | None, k: int) -> None:
        """Ask for the windows of `want[:k]` (None or k 0: nothing; cancels an unhonoured request), to be
        staged with round t + 1 or later."""
        r = self.req
        r["count"][0] = k
        r["round"][0] = t + 1
        if k:
            r["slots"][0, :k] = want[:k]
        self.asked = k
        _hostflag.seq_write(self.seg.mm, self._seq_off, self._req_off, r.view(np.uint8))

    def staged_windows(self, t: int, k: int, staged_slots: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Window index per slot for the `k` windows the engine says it staged with round t (else -1),
        and the in-range slots it named (None when it staged none)."""
        w = self._slot_of_window
        w[:] = -1
        if not k:
            return w, None
        staged = staged_slots[:k].astype(np.int64)
        ok = (staged >= 0) & (staged < self.M)
        hdr_ok = (self.stamp[:k] == t) & (self.slot[:k] == staged)
        good = np.flatnonzero(ok & hdr_ok)
        w[staged[good]] = good
        return w, staged[ok]

    def covers(self, w_of: np.ndarray, first: np.ndarray, n_rows: np.ndarray) -> np.ndarray:
        """The staged window holds every position the entry needs (the engine's ring agrees with ours)."""
        wi = np.maximum(w_of, 0)
        lo, hi = self.lo[wi], self.hi[wi]
        return (w_of >= 0) & (lo <= first) & (hi >= first + n_rows - 1)

    def ranges(self, t: int, wi: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The engine's [lo, hi] of these windows staged with round t, or None once t is claimed: the
        engine rewrites windows only in a later enqueue, after t was claimed, so a range read then could
        be a later round's (and a wrong range would stay in the ring model)."""
        lo, hi = self.lo[wi].astype(np.int64), self.hi[wi].astype(np.int64)
        if _hostflag.load_after(self.seg.mm, self._claimed_off) >= t:
            return None
        return lo, hi


# ---------------------------------------------------------------------------------------- engine side


class WindowStager:
    """The engine's half, for one attached segment: honour each request once."""

    def __init__(self, seg: Segment, ring: _Ring, counters: _Counters, shared: bool = False) -> None:
        """``shared``: the proxy reads the rows from the engine's shared ring (shm/ring_shm.py): a staged
        window is its record alone (stamp, slot, generation, lo, hi), no row is copied."""
        self.seg, self.ring, self.counters, self.shared = seg, ring, counters, shared
        p, lay = seg.params, seg.layout
        self.M, self.window_bytes = p.max_reqs, p.window * p.row_bytes
        self._seq_off, self._req_off = lay.word_off(Word.RESYNC_SEQ), lay.resync_req
        self._req = np.zeros(1, lay.resync_req_dtype)  # private copy of the proxy's request
        self._seen = 0  # its seqlock sequence when last read (unchanged: reuse _want)
        self._want: list[int] = []  # the request read, not yet honoured (it is honoured once)
        self._due = 0  # the round it is for
        self._in_round = np.zeros(p.max_reqs, dtype=np.bool_)  # scratch: the slots of the round enqueued
        self.bytes_last = 0  # ring-window bytes the last stage() copied

    def stage(self, t: int, slots: np.ndarray) -> list[int]:
        """Stage the windows asked for, with round t whose requests are in `slots` (validated: in
        range); returns the slots staged, in window order. The request is re-read only when its seqlock
        sequence moved (one word load per round otherwise); once honoured it is spent, so a late or hung
        proxy costs no more copying."""
        self.bytes_last = 0
        mm = self.seg.mm
        seq = _hostflag.load(mm, self._seq_off)
        if seq != self._seen:
            req = self._req
            got = _hostflag.seq_read(mm, self._seq_off, self._req_off, req.view(np.uint8), 8)
            if not got:
                return []  # being rewritten right now: next round
            self._seen = got
            count = min(int(req["count"][0]), self.M)
            want = req["slots"][0, :count]
            self._want = want[(want >= 0) & (want < self.M)].tolist()
            self._due = int(req["round"][0])
        if not self._want or t < self._due:
            return []
        want, self._want = self._want, []  # spent, whatever is staged of it
        in_round = self._in_round
        in_round[slots] = True
        staged: list[int] = []
        limit = resync_windows_per_enqueue(self.seg.params)
        for s in want:
            if len(staged) == limit:
                break
            if not in_round[s] or s in staged:
                continue  # a request that left the batch: its window is of no use to anyone
            w = self.seg.windows[len(staged)]
            gen, lo, hi = self.ring.window_range(s) if self.shared else self.ring.stage_window(s, w["rows"])
            w["slot"], w["generation"], w["lo"], w["hi"] = s, gen, lo, hi
            w["stamp"] = t
            staged.append(s)
        in_round[slots] = False
        c = self.counters
        c.inc("resync_requests_honoured")
        if len(staged) < len(want):
            c.inc("resync_windows_not_staged", len(want) - len(staged))
        if staged:
            nbytes = self.bytes_last = 0 if self.shared else len(staged) * self.window_bytes
            c.inc("resync_windows_staged", len(staged))
            c.inc("resync_bytes_staged", nbytes)
            if nbytes > c.gauge("resync_bytes_max_enqueue", 0):
                c.set("resync_bytes_max_enqueue", nbytes)  # the worst enqueue (chaos reports it)
        return staged
