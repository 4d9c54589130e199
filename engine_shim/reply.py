"""What `Shim.read_reply(t)` returns: one round's drafts, as views of the shim's private page copy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dspark_proxy.native import fastround
from dspark_proxy.shm.layout import STATUS_NAMES, STATUS_OK, STATUS_ROUND_FAILED, SUPPORT_K, ReplyPageLayout

__all__ = ["Reply", "ReplyReader"]

_umax = np.maximum.reduce


@dataclass(frozen=True)
class Reply:
    """Round t's result for the engine.

    The arrays are views of the shim's private copy of the page, valid until the next `read_reply`
    (copy them to keep them longer). Request i's usable drafts are exactly `draft_ids[i, :n_drafts[i]]`
    (and their confidences, supports and q); past n_drafts[i] ids are -1, confidences 0, support ids
    -1, q 0. `ok_mask` is `n_drafts > 0`. A failed round (`status == 2`) has n_drafts all 0: the engine
    runs target-only for every request.
    """

    t: int
    status: int  # 0 ok, 1 some_failed, 2 round_failed
    n: int
    ok_mask: np.ndarray  # [n] bool: n_drafts > 0
    draft_ids: np.ndarray  # [n, N] int32
    confidence: np.ndarray  # [n, N] float32
    sample_mask: np.ndarray | None = None  # [n] bool (sampled mode)
    support_ids: np.ndarray | None = None  # [n, N, 32] int32
    proposal_q: np.ndarray | None = None  # [n, N, 32] float32
    reason: str = ""  # why a failed round failed, from the engine side's point of view
    n_drafts: np.ndarray | None = None  # [n] int32, 0..N: usable drafts of request i (set by every reader)

    def __post_init__(self) -> None:
        if self.n_drafts is None:  # built by hand (an older caller): the leading drafts of the ok requests
            ids = np.asarray(self.draft_ids)
            lead = np.logical_and.accumulate(ids >= 0, axis=1).sum(axis=1, dtype=np.int32) if ids.ndim == 2 \
                else np.zeros(int(self.n), np.int32)
            object.__setattr__(self, "n_drafts", np.where(np.asarray(self.ok_mask, bool), lead, 0).astype(np.int32))

    @property
    def ok(self) -> bool:
        return self.status != STATUS_ROUND_FAILED

    @property
    def status_name(self) -> str:
        return STATUS_NAMES.get(self.status, str(self.status))

    def to_torch(self, device: str | None = None) -> Reply:
        """The same reply with torch tensors (shares memory on CPU)."""
        import torch

        def conv(a: np.ndarray | None):
            if a is None:
                return None
            x = torch.from_numpy(a)
            return x.to(device) if device else x

        return Reply(self.t, self.status, self.n, conv(self.ok_mask), conv(self.draft_ids),
                     conv(self.confidence), conv(self.sample_mask), conv(self.support_ids),
                     conv(self.proposal_q), self.reason, conv(self.n_drafts))


def _reply(t: int, status: int, n: int, ok: np.ndarray, ids: np.ndarray, conf: np.ndarray, nd: np.ndarray) -> Reply:
    """Reply(t, status, n, ok, ids, conf, n_drafts=nd) of a non-sampled page, built without the frozen
    dataclass's per-field object.__setattr__ (about a microsecond per read_reply): the same type, fields
    and equality; __post_init__ has nothing to do when n_drafts is given."""
    r = object.__new__(Reply)
    r.__dict__.update(t=t, status=status, n=n, ok_mask=ok, draft_ids=ids, confidence=conf, sample_mask=None,
                      support_ids=None, proposal_q=None, reason="", n_drafts=nd)
    return r


class ReplyReader:
    """Turns a copied page into a Reply without allocating: every array is a view of `buf`. `native`:
    the n_drafts check and the ok mask in one C call (_fastround.check_page), and the views of each
    round size made once; `parse` below is its reference."""

    def __init__(self, layout: ReplyPageLayout, native: bool = False) -> None:
        self.L = layout
        self.native = native
        self._views: dict[int, tuple[np.ndarray, ...]] = {}  # per n: ok, ids, conf, n_drafts (native)
        self.buf = np.zeros(layout.size, dtype=np.int32)
        self._okbool = np.zeros(layout.M, dtype=np.bool_)
        self._fail_nd = np.zeros(layout.M, dtype=np.int32)
        self._smask = np.zeros(layout.M, dtype=np.bool_)
        self._fail_ids = np.full((layout.M, layout.N), -1, dtype=np.int32)
        self._fail_conf = np.zeros((layout.M, layout.N), dtype=np.float32)
        self._fail_ok = np.zeros(layout.M, dtype=np.bool_)
        K = SUPPORT_K
        # a failed round has the same fields as a good one (all off), so engines need no special case
        self._fail_sm = np.zeros(layout.M, dtype=np.bool_) if layout.sampled else None
        self._fail_sup = np.full((layout.M, layout.N, K), -1, dtype=np.int32) if layout.sampled else None
        self._fail_q = np.zeros((layout.M, layout.N, K), dtype=np.float32) if layout.sampled else None

    def failed(self, t: int, n: int, reason: str) -> Reply:
        n = min(max(n, 0), self.L.M)
        if not self.L.sampled:
            return Reply(t, STATUS_ROUND_FAILED, n, self._fail_ok[:n], self._fail_ids[:n], self._fail_conf[:n],
                         reason=reason, n_drafts=self._fail_nd[:n])
        return Reply(t, STATUS_ROUND_FAILED, n, self._fail_ok[:n], self._fail_ids[:n], self._fail_conf[:n],
                     self._fail_sm[:n], self._fail_sup[:n], self._fail_q[:n], reason=reason,
                     n_drafts=self._fail_nd[:n])

    def none(self, t: int, n: int) -> Reply:
        """A good round with no drafts for any of its n requests (a paused round the engine answered)."""
        n = min(max(n, 0), self.L.M)
        if not self.L.sampled:
            return _reply(t, STATUS_OK, n, self._fail_ok[:n], self._fail_ids[:n], self._fail_conf[:n],
                          self._fail_nd[:n])
        return Reply(t, STATUS_OK, n, self._fail_ok[:n], self._fail_ids[:n], self._fail_conf[:n], self._fail_sm[:n],
                     self._fail_sup[:n], self._fail_q[:n], n_drafts=self._fail_nd[:n])

    def parse(self, t: int, n_expected: int) -> Reply:
        """The reply in `buf`. A page whose own n disagrees with the round's is not trusted."""
        L, b = self.L, self.buf
        status, n = int(b[0]), int(b[1])
        if status == STATUS_ROUND_FAILED:
            return self.failed(t, n_expected, "round_failed")
        if status not in STATUS_NAMES or n != n_expected or not 0 <= n <= L.M:
            return self.failed(t, n_expected, "bad_page")
        if self.native:
            return self._parse_native(t, n, status)
        N = L.N
        nd = b[L.o_ok:L.o_ok + n]
        if n and int(_umax(nd.view(np.uint32))) > N:  # n_drafts outside 0..N (one reduction)
            return self.failed(t, n_expected, "bad_page")
        ok = self._okbool[:n]
        np.not_equal(nd, 0, out=ok)
        ids = b[L.o_ids:L.o_ids + n * N].reshape(n, N)
        conf = b[L.o_conf:L.o_conf + n * N].view(np.float32).reshape(n, N)
        if not L.sampled:
            return Reply(t, status, n, ok, ids, conf, n_drafts=nd)
        sm = self._smask[:n]
        np.not_equal(b[L.o_sample_mask:L.o_sample_mask + n], 0, out=sm)
        K = SUPPORT_K
        qids = b[L.o_qids:L.o_qids + n * N * K].reshape(n, N, K)
        q = b[L.o_q:L.o_q + n * N * K].view(np.float32).reshape(n, N, K)
        return Reply(t, status, n, ok, ids, conf, sm, qids, q, n_drafts=nd)

    def _parse_native(self, t: int, n: int, status: int) -> Reply:
        L = self.L
        v = self._views.get(n)
        if v is None:
            v = self._views[n] = self._views_of(n)
        ok, ids, conf, nd = v[:4]
        if not fastround.check_page(self.buf, L.o_ok, n, L.N, ok):
            return self.failed(t, n, "bad_page")
        if not L.sampled:
            return _reply(t, status, n, ok, ids, conf, nd)
        sm = v[4]
        np.not_equal(v[5], 0, out=sm)
        return Reply(t, status, n, ok, ids, conf, sm, v[6], v[7], n_drafts=nd)

    def _views_of(self, n: int) -> tuple[np.ndarray, ...]:
        """parse's views of `buf` for a round of n requests (the same arrays parse builds each time)."""
        L, b, N, K = self.L, self.buf, self.L.N, SUPPORT_K
        v = (self._okbool[:n], b[L.o_ids:L.o_ids + n * N].reshape(n, N),
             b[L.o_conf:L.o_conf + n * N].view(np.float32).reshape(n, N), b[L.o_ok:L.o_ok + n])
        if L.sampled:
            v += (self._smask[:n], b[L.o_sample_mask:L.o_sample_mask + n],
                  b[L.o_qids:L.o_qids + n * N * K].reshape(n, N, K),
                  b[L.o_q:L.o_q + n * N * K].view(np.float32).reshape(n, N, K))
        return v
