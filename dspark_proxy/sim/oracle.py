"""The `integrity` oracle on the engine side: recompute every usable draft from rows the engine knows.

For request i with n_drafts[i] > 0, the window size is recovered from the confidence (w = conf[i][0] * W,
which must be an integer 1..min(W, anchor_pos)); the expected drafts are the integrity drafter's (docs/design.md,
"The worker") over the anchor and the rows of positions anchor_pos - w .. anchor_pos - 1, its first
n_drafts[i] ids, then -1 / 0. Anything else is a wrong draft, and so is a request without drafts
whose ids are not all -1 and confidences 0 (the reply must not show stale or made-up values).

Window completeness: a usable draft is *full* when w covers every row the engine holds for the
request, up to W: min(W, anchor_pos - the start of the rows it sent contiguously since the slot's
last restart), from this oracle's own record of what the engine wrote (`record`), never from the
proxy's ring model. A correct drafter over a window rebuilt after a fault can be right and not full;
the full-window rate (full / usable) is what sees it.

Two ways to get the CRC, which must agree (the tests hold them to it):
- ``bytes``: regenerate the window's rows and call `integrity_hash` / `integrity_drafts` per request.
  Exact by construction, but hashes W * row_bytes bytes per request (9 MB at the realistic shapes).
- ``fast``: for each slot the engine keeps a chain of prefix CRCs over the rows it sent contiguously
  since the slot's last restart: ``A(p) = crc(rows start .. p)``, the last W + 1 of them in a ring
  (``A(p) = shift(L)(A(p - 1)) ^ crc(row p)``, computed for a round's rows by a segmented parallel
  scan). The CRC of the window ``a .. e - 1`` is then ``A(e - 1) ^ shift(w L)(A(a - 1))``, so a whole
  round's check is a dozen numpy operations on [n] arrays, whatever W and row_bytes are. The chain
  covers every legal window: the rows sent since a restart always include the last min(W, anchor_pos)
  positions (a chunk longer than W restarts the chain at its last W rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dspark_proxy.crc import CrcOp, WindowShifts, byte_tables, le_bytes, xor_lookup
from dspark_proxy.integrity import GOLDEN, integrity_drafts, integrity_hash

from .rows import RowGen

__all__ = ["Oracle", "CheckResult"]

_W_TOL = 1e-3


@dataclass
class CheckResult:
    """Per request of the round: whether its drafts are wrong / usable, and how many drafts it got."""

    wrong: np.ndarray  # bool [n]
    usable: np.ndarray  # bool [n]: need_draft, ok, right, at least one draft
    n_drafts: np.ndarray  # int64 [n]: non-negative drafts (0 where not usable)
    partial: int = 0  # usable windows shorter than min(W, anchor_pos)
    full: np.ndarray | None = None  # bool [n]: usable, and its window holds every row the engine holds (<= W)
    details: list[dict] = field(default_factory=list)

    @property
    def n_full(self) -> int:
        return 0 if self.full is None else int(self.full.sum())


class Oracle:
    """Expected drafts for (slot, uid, anchor, anchor_pos, w); keeps the engine's prefix-CRC chains.
    Thread ownership: the simulated engine's thread."""

    def __init__(self, rowgen: RowGen, *, window: int, num_spec: int, max_slots: int) -> None:
        self.rowgen = rowgen
        self.W = W = int(window)
        self.N = int(num_spec)
        self.max_slots = M = int(max_slots)
        self._ring = W + 1  # A(a - 1) of a full window is W + 1 positions back from the anchor
        self.chain = np.zeros(M * self._ring, dtype=np.uint32)  # A(p) at [slot, p % (W + 1)]
        self.chain_owner = np.full(M, -1, dtype=np.int64)
        self.chain_start = np.zeros(M, dtype=np.int64)
        self.chain_end = np.zeros(M, dtype=np.int64)  # one past the last position in the chain
        L = rowgen.row_bytes
        self._pow = [CrcOp.shift((1 << b) * L) for b in range(max(1, W.bit_length()))]
        self._shift_w = WindowShifts(L, W)  # past a window of w rows (built in ms, crc.py)
        # anchor header: int32 token (bytes 0..3) ‖ int64 position (bytes 4..11; 8..11 are zero)
        c12, tab = byte_tables(12, 8)
        self._hdr_flat = tab.reshape(-1)
        self._hdr_off = np.arange(8, dtype=np.intp) * 256
        self._hdr_const = np.uint32(c12)
        j = np.arange(self.N, dtype=np.int64)
        self._golden_j = (j * GOLDEN) & 0xFFFFFFFF

    def record(self, slots: np.ndarray, req_ids: np.ndarray, first_pos: np.ndarray, valid: np.ndarray,
               row_crc: np.ndarray) -> None:
        """The engine sent these rows this round (request i: positions first_pos[i] .. + valid[i] - 1,
        1 <= valid <= W, CRCs in batch order): extend or restart each slot's chain."""
        n_rows = row_crc.size
        if n_rows == 0:
            return
        cont = (self.chain_owner[slots] == req_ids) & (self.chain_end[slots] == first_pos)
        starts = np.cumsum(valid) - valid
        off = np.arange(n_rows, dtype=np.int64) - np.repeat(starts, valid)  # row's offset in its request
        a = np.array(row_crc, dtype=np.uint32, copy=True)
        d, b = 1, 0
        max_v = int(valid.max())
        while d < max_v:  # Hillis-Steele: a[r] = XOR_{q <= r} shift((r - q) L)(crc q), within a request
            idx = np.flatnonzero(off >= d)
            a[idx] ^= self._pow[b].apply(a[idx - d])
            d <<= 1
            b += 1
        R = self._ring
        if cont.any():  # continue the chain: A(f + i) = shift((i + 1) L)(A(f - 1)) ^ crc(rows f .. f + i)
            prev = self.chain[slots * R + (first_pos - 1) % R]
            rows_cont = np.repeat(cont, valid)
            r = np.flatnonzero(rows_cont)
            a[r] ^= self._shift_w.apply(np.repeat(prev, valid)[r], off[r] + 1)
        pos = np.repeat(first_pos, valid) + off
        self.chain[np.repeat(slots * R, valid) + pos % R] = a
        self.chain_start[slots] = np.where(cont, self.chain_start[slots], first_pos)
        self.chain_end[slots] = first_pos + valid
        self.chain_owner[slots] = req_ids

    def held(self, slots: np.ndarray, req_ids: np.ndarray, anchor_pos: np.ndarray) -> np.ndarray:
        """Rows the engine holds for each request's anchor, up to W, from its own record: the rows it
        sent contiguously since the slot's last restart (a rewind, a jump or a new owner restarts it,
        as the ring rules do). min(W, anchor_pos) where the record is not this request's (never, for a
        request of the round just recorded)."""
        mine = (self.chain_owner[slots] == req_ids) & (self.chain_end[slots] == anchor_pos)
        since = np.where(mine, self.chain_start[slots], 0)
        return np.minimum(self.W, anchor_pos - since)

    # ---- hashes ------------------------------------------------------------------------------

    def hashes_fast(self, slots: np.ndarray, anchor: np.ndarray, anchor_pos: np.ndarray,
                    w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """integrity_hash per request from the chains (uint32 [m]), and whether the chain covers the
        window (it always does for this round's anchors and w <= min(W, anchor_pos))."""
        R = self._ring
        a = anchor_pos - w
        base = slots * R
        covered = (a >= self.chain_start[slots]) & (self.chain_end[slots] == anchor_pos)
        a_end = self.chain[base + (anchor_pos - 1) % R]
        a_before = np.where(a > self.chain_start[slots], self.chain[base + (a - 1) % R], np.uint32(0))
        # crc(hdr ‖ rows a..e-1) = shift(wL)(hdr) ^ A(e-1) ^ shift(wL)(A(a-1))
        h = self._shift_w.apply(self._header(anchor, anchor_pos) ^ a_before, w)
        h ^= a_end
        return h, covered

    def _header(self, anchor: np.ndarray, anchor_pos: np.ndarray) -> np.ndarray:
        tok = le_bytes(np.asarray(anchor, dtype=np.int64).astype(np.uint32), np.uint32)
        pos = le_bytes(np.asarray(anchor_pos, dtype=np.int64).astype(np.uint32), np.uint32)
        h = xor_lookup(self._hdr_flat, np.concatenate([tok, pos], axis=-1) + self._hdr_off)
        h ^= self._hdr_const
        return h

    def hashes_bytes(self, uids: np.ndarray, anchor: np.ndarray, anchor_pos: np.ndarray,
                     w: np.ndarray) -> np.ndarray:
        """integrity_hash per request over regenerated rows (the reference; slow at large rows)."""
        out = np.zeros(uids.size, dtype=np.uint32)
        for i in range(uids.size):
            ap, wi = int(anchor_pos[i]), int(w[i])
            rows = self.rowgen.make_rows(int(uids[i]), np.arange(ap - wi, ap, dtype=np.int64))
            out[i] = integrity_hash(int(anchor[i]), ap, rows)
        return out

    def expected(self, h: np.ndarray, w: np.ndarray, n_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The integrity drafts (docs/design.md, "The worker"): [m, N] int32 and confidences [m, N]
        float32 (vectorised integrity_drafts)."""
        j = np.arange(self.N)
        keep = j[None, :] < n_out[:, None]
        ids = (h.astype(np.int64)[:, None] ^ self._golden_j[None, :]) & 0x7FFFFFFF
        ids = np.where(keep, ids, -1).astype(np.int32)
        conf = np.where(keep, (w.astype(np.float64) / self.W).astype(np.float32)[:, None], np.float32(0))
        return ids, conf.astype(np.float32)

    def expected_reference(self, h: np.ndarray, w: np.ndarray, n_out: np.ndarray) -> tuple[np.ndarray,
                                                                                           np.ndarray]:
        """The same through integrity_drafts, one request at a time."""
        ids = np.zeros((h.size, self.N), dtype=np.int32)
        conf = np.zeros((h.size, self.N), dtype=np.float32)
        for i in range(h.size):
            integrity_drafts(int(h[i]), int(w[i]), self.W, self.N, int(n_out[i]), ids[i], conf[i])
        return ids, conf

    # ---- the check ---------------------------------------------------------------------------

    def check(self, *, t: int, slots: np.ndarray, req_ids: np.ndarray, anchor: np.ndarray,
              anchor_pos: np.ndarray, need_draft: np.ndarray, ok_mask: np.ndarray, draft_ids: np.ndarray,
              confidence: np.ndarray, mode: str = "fast", max_details: int = 8,
              reply_n_drafts: np.ndarray | None = None) -> CheckResult:
        """Check every request of one round's reply: those with drafts against the oracle, the others
        for cleared fields. `reply_n_drafts`: the reply's n_drafts (None: an older reply without it,
        then the leading non-negative ids of the ok requests)."""
        n = slots.size
        wrong = np.zeros(n, dtype=bool)
        usable = np.zeros(n, dtype=bool)
        n_drafts = np.zeros(n, dtype=np.int64)
        full = np.zeros(n, dtype=bool)
        res = CheckResult(wrong=wrong, usable=usable, n_drafts=n_drafts, full=full)
        all_ids = np.asarray(draft_ids)[:n, :self.N]
        all_conf = np.asarray(confidence)[:n, :self.N]
        if reply_n_drafts is None:
            lead = np.logical_and.accumulate(all_ids >= 0, axis=1).sum(axis=1)
            nd_all = np.where(np.asarray(ok_mask, dtype=bool), lead, 0).astype(np.int64)
        else:
            nd_all = np.asarray(reply_n_drafts)[:n].astype(np.int64)
        bad_nd = (nd_all < 0) | (nd_all > self.N) | ((nd_all > 0) != np.asarray(ok_mask, dtype=bool))
        none = nd_all == 0
        unclean = none & ((all_ids != -1).any(axis=1) | (all_conf != 0).any(axis=1))
        for i in np.flatnonzero(unclean | bad_nd)[:max_details].tolist():
            res.details.append({"round": int(t), "index": i, "req_id": int(req_ids[i]), "slot": int(slots[i]),
                                "reason": "n_drafts out of range or not ok_mask" if bad_nd[i]
                                else "no drafts but ids / confidences not cleared",
                                "n_drafts": int(nd_all[i]), "got_ids": all_ids[i].tolist(),
                                "got_conf": all_conf[i].tolist()})
        wrong |= unclean | bad_nd
        sel = np.flatnonzero(~none & ~bad_nd)
        if sel.size == 0:
            return res
        got_ids = np.asarray(draft_ids)[sel, :self.N].astype(np.int32, copy=False)
        got_conf = np.asarray(confidence)[sel, :self.N].astype(np.float32, copy=False)
        ap = anchor_pos[sel]
        wf = got_conf[:, 0].astype(np.float64) * self.W
        wr = np.rint(np.where(np.isfinite(wf), wf, -1.0))
        good_w = (np.abs(wf - wr) <= _W_TOL) & (wr >= 1) & (wr <= np.minimum(self.W, ap))
        w = np.where(good_w, wr, 1).astype(np.int64)
        n_out = nd_all[sel]
        if mode == "fast":
            h, covered = self.hashes_fast(slots[sel], anchor[sel], ap, w)
            good_w &= covered
            exp_ids, exp_conf = self.expected(h, w, n_out)
        else:
            h = self.hashes_bytes(req_ids[sel], anchor[sel], ap, w)
            exp_ids, exp_conf = self.expected_reference(h, w, n_out)
        match = good_w & (exp_ids == got_ids).all(axis=1) & (exp_conf == got_conf).all(axis=1) & (n_out > 0)
        wrong[sel] = ~match
        right = sel[match]
        usable[right] = need_draft[right]
        n_drafts[right] = np.where(need_draft[right], n_out[match], 0)
        res.partial = int((match & (w < np.minimum(self.W, ap))).sum())
        full[right] = need_draft[right] & (w[match] >= self.held(slots[right], req_ids[right], ap[match]))
        for r in np.flatnonzero(~match)[:max(0, max_details - len(res.details))].tolist():
            i = int(sel[r])
            res.details.append({
                "round": int(t), "index": i, "req_id": int(req_ids[i]), "slot": int(slots[i]),
                "anchor": int(anchor[i]), "anchor_pos": int(ap[r]),
                "reason": "draft mismatch" if good_w[r] else "window size",
                "w": int(w[r]) if good_w[r] else (float(wf[r]) if np.isfinite(wf[r]) else None),
                "expected_ids": exp_ids[r].tolist(), "got_ids": got_ids[r].tolist(),
                "expected_conf": exp_conf[r].tolist(), "got_conf": got_conf[r].tolist(),
            })
        return res
