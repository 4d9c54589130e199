"""The reply page: what the engine reads for round t (shm_layout.md §1, `ReplyPageLayout`).

Packing is the round's step 8 on the page side: for the requests that get drafts, their leading
non-negative drafts (the ok word is n_drafts, at most the round's n_out), -1 / 0 past them, and in a
sampled segment the support ids and q; every other row cleared. Only the rows an earlier round wrote
are cleared (the rest are already zero), and the usual round (every request drafted in full) is
filled from slices, or on the C path (native.py) by one `_fastround.pack_whole` call that writes the
same bytes. A failed round writes only status, n and the ok words: the engine's reader hands
out its own cleared arrays for a failed status.

Owned by the round thread; published by HostFlags.publish.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import native
from ..shm.layout import STATUS_OK, STATUS_ROUND_FAILED, STATUS_SOME_FAILED, SUPPORT_K, ReplyPageLayout
from .ndrafts import leading_drafts, trim_rows

__all__ = ["PagePacker"]


class PagePacker:
    """The round's private copy of the reply page (`page`), packed here and published by the round."""

    def __init__(self, layout: ReplyPageLayout, num_spec: int, n_out_table: tuple[int, ...],
                 native_path: bool | None = None) -> None:
        L, M, N = layout, layout.M, num_spec
        self.L, self.N = L, N
        self.native = native.enabled() if native_path is None else native_path  # pack_whole (_fastround_page.c)
        self.page = np.zeros(L.size, dtype=np.int32)
        # the page's per-request blocks, and how many of their rows may hold an earlier round's values
        # (the rest are zero): packing zeroes only those rows, not the whole page
        self._ok = self.page[L.o_ok:L.o_ok + M]
        self._ids = self.page[L.o_ids:L.o_ids + M * N].reshape(M, N)
        self._conf = self.page[L.o_conf:L.o_conf + M * N].view(np.float32).reshape(M, N)
        # (public: a fused call that packs the usual round (round/fused.py) reads and sets them too)
        self.ok_rows = self.ids_rows = 0
        self._no = np.ones(M, dtype=np.bool_)  # scratch: the requests given no drafts
        self._n_out_table = np.asarray(n_out_table, dtype=np.int64)
        self.n_out_table_empty = not n_out_table  # n_out is 0 (all N) for every round
        self._views: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # [:n] of the three, per n

    def _views_of(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        v = self._views[n] = (self._ok[:n], self._ids[:n], self._conf[:n])
        return v

    def pack(self, n: int, idx: np.ndarray | None, need: np.ndarray, usable: np.ndarray | None,
             reply: Any) -> tuple[bool, np.ndarray, int]:
        """Round of n requests whose STEP came back: `idx` the requests with an entry (None: all n, in
        order), `need` the requests that asked for drafts, `usable` the entries' usable statuses (None:
        all usable with a whole window). Returns whether every request that asked got drafts, and the
        entries' need and its count (the breaker's business)."""
        L = self.L
        # the page: rows [0, n) are rewritten; rows an earlier round left beyond n are cleared. The ok
        # word is n_drafts: a request's leading non-negative drafts, at most n_out; past it -1 / 0
        b, ok, ids, conf = self.page, self._ok, self._ids, self._conf
        sel = slice(None) if idx is None else idx
        b[1] = n
        n_need = int(np.count_nonzero(need))
        e_need = need[sel]
        n_e_need = n_need if idx is None else int(np.count_nonzero(e_need))
        cap = self.n_out(n) or self.N
        nd = None
        whole = usable is None and idx is None and n_need == n
        if whole and self.native and native.fastround.pack_whole(
                b, L.o_ok, L.o_ids, L.o_conf, L.M, self.N, n, cap, self.ok_rows, self.ids_rows, reply.draft_ids,
                reply.confidence):  # the slices below in one C call (False: not that round, nothing written)
            self.ok_rows = self.ids_rows = n
            give = None
            n_give = n
        elif whole and (nd := leading_drafts(reply.draft_ids, cap)) is None:  # every request gets all N: slices
            ok_rows, ids_rows = self.ok_rows, self.ids_rows
            self.ok_rows = self.ids_rows = n
            if ok_rows > n:
                ok[n:ok_rows] = 0
            if ids_rows > n:
                ids[n:ids_rows] = -1
                conf[n:ids_rows] = 0
            v_ok, v_ids, v_conf = self._views.get(n) or self._views_of(n)
            v_ok[:] = self.N
            v_ids[:] = reply.draft_ids
            v_conf[:] = reply.confidence
            give = None
            n_give = n
        else:
            rows = max(self.ids_rows, n)
            ok[:max(self.ok_rows, n)] = 0
            ids[:rows] = -1
            conf[:rows] = 0
            self.ok_rows = self.ids_rows = n
            give = e_need.copy() if usable is None else usable & e_need
            if nd is None:
                nd = leading_drafts(reply.draft_ids[give], cap)
            else:
                nd = nd[give]
            g_ids, g_conf = reply.draft_ids[give], reply.confidence[give]
            if nd is not None:  # some request has fewer than N: trim, and no drafts means not given
                g_ids, g_conf = trim_rows(g_ids, nd, -1), trim_rows(g_conf, nd, 0.0)
                has = nd > 0
                if not has.all():
                    give[np.flatnonzero(give)[~has]] = False
                    g_ids, g_conf, nd = g_ids[has], g_conf[has], nd[has]
            gi = give.nonzero()[0] if idx is None else idx[give]
            ok[gi] = self.N if nd is None else nd
            ids[gi] = g_ids
            conf[gi] = g_conf
            n_give = int(gi.shape[0])
        if L.sampled:
            K, N = SUPPORT_K, self.N
            smask = b[L.o_sample_mask:L.o_sample_mask + n]
            if reply.sampled_mask is None or reply.support_ids is None or reply.proposal_q is None:
                raise RuntimeError("sampled reply without its support ids and q")
            qids = b[L.o_qids:L.o_qids + n * N * K].reshape(n, N, K)
            q = b[L.o_q:L.o_q + n * N * K].view(np.float32).reshape(n, N, K)
            if give is None:
                smask[:] = reply.sampled_mask
                qids[:] = reply.support_ids
                q[:] = reply.proposal_q
            else:  # requests without drafts: every field cleared, whatever an earlier round left
                smask[:] = 0
                no = self._no[:n]
                no[:] = True
                no[gi] = False
                qids[no] = -1
                q[no] = 0
                g_sup, g_q = reply.support_ids[give], reply.proposal_q[give]
                if nd is not None:
                    g_sup, g_q = trim_rows(g_sup, nd, -1), trim_rows(g_q, nd, 0.0)
                smask[gi] = reply.sampled_mask[give]
                qids[gi] = g_sup
                q[gi] = g_q
        all_ok = n_give == n_need
        b[0] = STATUS_OK if all_ok else STATUS_SOME_FAILED
        return all_ok, e_need, n_e_need

    def none(self, n: int) -> None:
        """status OK, n, and no drafts for any request (a round that asked none, published before its
        STEP): n_drafts 0 and every row past it cleared, as Reply promises."""
        L, b = self.L, self.page
        b[0] = STATUS_OK
        b[1] = n
        rows = max(self.ids_rows, n)
        self._ok[:max(self.ok_rows, n)] = 0
        self._ids[:rows] = -1
        self._conf[:rows] = 0
        self.ok_rows = self.ids_rows = n
        if L.sampled:
            b[L.o_sample_mask:L.o_sample_mask + n] = 0
            b[L.o_qids:L.o_qids + n * self.N * SUPPORT_K] = -1
            b[L.o_q:L.o_q + n * self.N * SUPPORT_K] = 0

    def failed(self, n: int) -> None:
        """status ROUND_FAILED, n, and n_drafts 0 for every request: the reader hands the engine its own
        cleared arrays for a failed status, so nothing past the ok words is read (shm_layout.md)."""
        b = self.page
        b[0] = STATUS_ROUND_FAILED
        b[1] = n
        self._ok[:self.ok_rows] = 0
        self.ok_rows = 0

    def n_out(self, n: int) -> int:
        """The entries' n_out for a round of n requests: the table's entry min(n, len - 1); 0 (an
        empty table, an entry of 0 or of N or more) asks for all N, as `--n-out-table` says."""
        tab = self._n_out_table
        if tab.shape[0] == 0:
            return 0
        c = int(tab[min(n, tab.shape[0] - 1)])
        return 0 if c >= self.N else max(0, c)
