"""The `integrity` drafter, the worker's default (docs/design.md, "The worker"): the test oracle. numpy
only, so a worker serving it never loads torch.
"""

from __future__ import annotations

import zlib

import numpy as np

from ...integrity import GOLDEN, integrity_hash
from ...wire import TOP_K, ReplyWriter
from .base import DraftItem

__all__ = ["IntegrityDrafter"]


class IntegrityDrafter:
    """The test oracle: drafts are a CRC of the anchor and the exact rows held (dspark_proxy.integrity).

    Optional sections, deterministic so an oracle can check them too: margin = confidence; in sampled
    mode a request with temperature > 0 gets sampled_mask 1, support_ids[j][k] = (draft_j + k) &
    0x7FFFFFFF and proposal_q[j] = one-hot on k = 0 (positions past n_out: -1 and 0).
    """

    name = "integrity"
    vocab_size = 0  # ids span every non-negative int32: no vocabulary to check them against
    fixes: tuple[str, ...] = ()  # serves any N, window and row_bytes (worker/terms.py)

    def __init__(self, num_spec: int, window: int) -> None:
        self.num_spec = num_spec
        self.window = window
        self._k = np.arange(TOP_K, dtype=np.int64)
        self._j = np.arange(num_spec, dtype=np.int64)
        self._golden = (self._j * GOLDEN) & 0xFFFFFFFF

    def slot_bytes(self, window: int, row_bytes: int) -> int:
        """The rows alone: the CRC chain it reads is the slot's, charged there (worker/session.py)."""
        return window * row_bytes

    def draft(self, items: list[DraftItem], out: ReplyWriter) -> None:
        """The whole batch at once (a per-item numpy call cost ~4 us a request at n = 256)."""
        k = len(items)
        idx = np.fromiter((it.index for it in items), dtype=np.intp, count=k)
        h = np.fromiter((self._hash(it) for it in items), dtype=np.int64, count=k)
        w = np.fromiter((it.w for it in items), dtype=np.float64, count=k)
        n_out = np.fromiter((it.n_out for it in items), dtype=np.int64, count=k)
        N = self.num_spec
        cut = np.where(n_out <= 0, N, np.minimum(n_out, N))  # positions j < cut are drafted
        live = self._j[None, :] < cut[:, None]
        ids = (h[:, None] ^ self._golden[None, :]) & 0x7FFFFFFF
        ids[~live] = -1
        conf = np.where(live, (w / self.window).astype(np.float32)[:, None], np.float32(0.0))
        out.draft_ids[idx] = ids
        out.confidence[idx] = conf
        if out.margin is not None:
            out.margin[idx] = conf
        if out.sampled_mask is not None:
            self.fill_sampled(out, idx, np.fromiter((it.temperature for it in items), dtype=np.float64, count=k))

    def fill_sampled(self, out, idx: np.ndarray, temperature: np.ndarray) -> None:
        """Sampled mode's sections for the requests `idx` whose drafts are already in `out` and that
        sample (temperature > 0): sampled_mask 1, support draft + k, q one-hot on k = 0. Also what the
        in-process `null` worker answers sampled rounds with (dspark_proxy.worker.inproc)."""
        hot = idx[temperature > 0]
        if hot.size:
            out.sampled_mask[hot] = 1
            hid = out.draft_ids[hot].astype(np.int64)  # [h, N]
            sup = (hid[:, :, None] + self._k[None, None, :]) & 0x7FFFFFFF
            sup[hid < 0] = -1
            out.support_ids[hot] = sup
            q = np.zeros(sup.shape, dtype=np.float32)
            q[:, :, 0] = np.where(hid >= 0, 1.0, 0.0)
            out.proposal_q[hot] = q

    @staticmethod
    def _hash(it: DraftItem) -> int:
        if it.crc is not None:
            return it.crc
        h = integrity_hash(it.anchor_token, it.anchor_pos, it.segments[0])  # from the bytes
        for seg in it.segments[1:]:
            h = zlib.crc32(seg, h)
        return h
