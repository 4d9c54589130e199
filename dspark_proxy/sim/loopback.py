"""An in-process stand-in for the shim + proxy + integrity worker, for testing the simulated engine alone.

It keeps its own window of rows per slot from what was enqueued (the ring rules of docs/design.md, step
2: extend when the rows continue the held range of the same request, otherwise restart with exactly this
round's rows; keep the last W), and answers each request that needs drafts with the integrity drafter's
output over that window, as a correct system would. Knobs make it fail requests or rounds, cut windows
short (PARTIAL_WINDOW: right drafts from fewer rows than held, which only the full-window rate sees),
cut n_out, and corrupt answers on purpose, so tests can show the engine's oracle catches what it must.

Corruptions (``corrupt=``), applied to one request per corrupted round:
- ``flip_byte``: one bit of the newest row of a request's window is flipped as it is stored;
- ``swap_slots``: a request is answered from another request's window;
- ``off_by_one``: the window is taken one row short but reported as full (a stale window);
- ``conf``: the confidence reports one row fewer than was hashed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dspark_proxy.integrity import integrity_drafts, integrity_hash

__all__ = ["OracleShim", "OracleReply", "CORRUPTIONS"]

CORRUPTIONS = ("flip_byte", "swap_slots", "off_by_one", "conf")


@dataclass
class OracleReply:
    status: int
    n: int
    ok_mask: np.ndarray  # bool [n]
    draft_ids: np.ndarray  # int32 [n, N]
    confidence: np.ndarray  # float32 [n, N]
    n_drafts: np.ndarray | None = None  # int32 [n]: drafts usable per request (the shim's Reply field)


class OracleShim:
    """Duck-types the engine shim's enqueue / read_reply; answers with integrity drafts in-process."""

    def __init__(self, *, max_reqs: int, num_spec: int, window: int, row_bytes: int, n_out: int = 0,
                 fail_prob: float = 0.0, round_fail_prob: float = 0.0, partial_prob: float = 0.0,
                 corrupt: str | None = None, corrupt_every: int = 1, seed: int = 0) -> None:
        if corrupt is not None and corrupt not in CORRUPTIONS:
            raise ValueError(f"corrupt must be one of {CORRUPTIONS} or None, got {corrupt!r}")
        self.max_reqs, self.num_spec, self.window, self.row_bytes = max_reqs, num_spec, window, row_bytes
        self.n_out = int(n_out)
        self.fail_prob, self.round_fail_prob, self.partial_prob = fail_prob, round_fail_prob, partial_prob
        self.corrupt, self.corrupt_every = corrupt, max(1, int(corrupt_every))
        self.rng = np.random.default_rng(seed)
        W = window
        self.ring = np.zeros((max_reqs, W, row_bytes), dtype=np.uint8)
        self.owner = np.full(max_reqs, -1, dtype=np.int64)
        self.lo = np.zeros(max_reqs, dtype=np.int64)  # held positions lo .. hi - 1 (the last W of them)
        self.hi = np.zeros(max_reqs, dtype=np.int64)
        self.t = 0
        self.corrupted = 0  # requests answered wrongly on purpose
        self.restarts = 0  # windows restarted (new owner, jump or rewind)
        self._round: tuple | None = None

    def enqueue(self, t: int, *, req_ids, slots, qsl, need_draft, k_window, rows, valid, first_pos, anchor,
                sampled=None, seed=None, temperature=None) -> None:
        if t != self.t + 1 or self._round is not None:
            raise ValueError(f"enqueue({t}) after round {self.t} (pending reply: {self._round is not None})")
        req_ids = np.asarray(req_ids, dtype=np.int64)
        slots = np.asarray(slots, dtype=np.int64)
        qsl = np.asarray(qsl, dtype=np.int64)
        need_draft = np.asarray(need_draft, dtype=bool)
        k_window = np.asarray(k_window, dtype=np.int64)
        valid = np.asarray(valid, dtype=np.int64)
        first_pos = np.asarray(first_pos, dtype=np.int64)
        anchor = np.asarray(anchor, dtype=np.int64)
        rows = np.asarray(rows)
        n, W = req_ids.size, self.window
        for name, a in (("slots", slots), ("need_draft", need_draft), ("k_window", k_window),
                        ("valid", valid), ("first_pos", first_pos), ("anchor", anchor)):
            if a.shape != (n,):
                raise ValueError(f"{name} has shape {a.shape}, expected ({n},)")
        if qsl.shape != (n + 1,) or qsl[0] != 0 or (np.diff(qsl) < 1).any():
            raise ValueError(f"qsl must be [n + 1] strictly increasing from 0, got {qsl}")
        span = np.diff(qsl)
        if ((slots < 0) | (slots >= self.max_reqs)).any() or np.unique(slots).size != n:
            raise ValueError(f"slots must be unique in [0, {self.max_reqs}), got {slots}")
        if ((valid < 1) | (valid > W) | (valid > span)).any():
            raise ValueError(f"valid must be 1..min(W, span), got {valid} (span {span})")
        if ((k_window < 0) | (k_window > span - 1) | (k_window > self.num_spec)).any():
            raise ValueError(f"k_window out of range: {k_window}")
        if (first_pos < 0).any():
            raise ValueError("first_pos must be >= 0")
        if rows.dtype != np.uint8 or rows.shape != (int(valid.sum()), self.row_bytes):
            raise ValueError(f"rows must be uint8 [{int(valid.sum())}, {self.row_bytes}], got {rows.dtype} "
                             f"{rows.shape}")
        self.t = t
        # ring rules, per request (a test double: clarity over speed)
        ends = np.cumsum(valid)
        for i in range(n):
            s, f, v = int(slots[i]), int(first_pos[i]), int(valid[i])
            if self.owner[s] == req_ids[i] and self.hi[s] == f and self.hi[s] > self.lo[s]:
                self.hi[s] = f + v
            else:
                self.owner[s], self.lo[s], self.hi[s] = req_ids[i], f, f + v
                self.restarts += 1
            self.lo[s] = max(self.lo[s], self.hi[s] - W)
            self.ring[s, (f + np.arange(v)) % W] = rows[ends[i] - v: ends[i]]
        corrupt_now = self.corrupt is not None and t % self.corrupt_every == 0
        target = int(np.flatnonzero(need_draft)[0]) if corrupt_now and need_draft.any() else -1
        if target >= 0 and self.corrupt == "flip_byte":
            s = int(slots[target])
            last = int(first_pos[target] + valid[target] - 1)
            self.ring[s, last % W, int(self.rng.integers(self.row_bytes))] ^= np.uint8(1 << int(
                self.rng.integers(8)))
            self.corrupted += 1
            target = -1
        self._round = (slots, req_ids, need_draft, first_pos + valid, anchor, target)

    def read_reply(self, t: int) -> OracleReply:
        if self._round is None or t != self.t:
            raise ValueError(f"read_reply({t}) without a pending round {self.t}")
        slots, req_ids, need_draft, anchor_pos, anchor, target = self._round
        self._round = None
        n, N, W = slots.size, self.num_spec, self.window
        ok = np.zeros(n, dtype=bool)
        ids = np.full((n, N), -1, dtype=np.int32)
        conf = np.zeros((n, N), dtype=np.float32)
        if self.round_fail_prob and self.rng.random() < self.round_fail_prob:
            return OracleReply(status=2, n=n, ok_mask=ok, draft_ids=ids, confidence=conf,
                               n_drafts=np.zeros(n, np.int32))
        failed = 0
        for i in np.flatnonzero(need_draft).tolist():
            if self.fail_prob and self.rng.random() < self.fail_prob:
                failed += 1
                continue
            s, ap = int(slots[i]), int(anchor_pos[i])
            w = int(min(W, self.hi[s] - self.lo[s]))
            if self.partial_prob and w > 1 and self.rng.random() < self.partial_prob:
                w = int(self.rng.integers(1, w))
            src, hash_w, report_w = s, w, w
            if i == target:
                self.corrupted += 1
                if self.corrupt == "swap_slots":
                    others = slots[slots != s]
                    src = int(others[0]) if others.size else s
                    hash_w = min(w, int(self.hi[src] - self.lo[src]))
                elif self.corrupt == "off_by_one" and w > 1:
                    hash_w = w - 1
                elif self.corrupt == "conf" and w > 1:
                    report_w = w - 1
                else:
                    self.corrupted -= 1
            end = int(self.hi[src])
            window_rows = self.ring[src, (end - hash_w + np.arange(hash_w)) % W]
            h = integrity_hash(int(anchor[i]), ap, window_rows)
            integrity_drafts(h, report_w, W, N, self.n_out, ids[i], conf[i])
            ok[i] = True
        nd = np.where(ok, self.n_out if 0 < self.n_out < N else N, 0).astype(np.int32)
        return OracleReply(status=1 if failed else 0, n=n, ok_mask=ok, draft_ids=ids, confidence=conf, n_drafts=nd)

    def close(self) -> None:
        self._round = None
