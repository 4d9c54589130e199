"""The draft probabilities vLLM's rejection sampler takes, from a sampled-mode reply (docs/vllm.md,
"Sampled requests").

vLLM's runner keeps `_draft_probs`, float32 [requests, num_spec, vocab], row r for request
`_draft_prob_req_ids[r]`, and hands the rows of the requests it verifies (their first `num_draft`
positions) to the rejection sampler at the next step. There a draft x is accepted with probability
min(1, p(x) / q(x)) and a rejection resamples from max(p - q, 0): lossless only when q is the
distribution x was drawn from. So:

- a request whose drafts were drawn (`sample_mask`): its top-32 `support_ids` / `proposal_q`
  scattered into its vocabulary row, zero elsewhere (the worker drew from exactly that);
- a request whose drafts were not drawn (greedy, or a greedy fallback): a point mass at each draft,
  which is what vLLM assumes of every draft when it gets no probabilities;
- positions past a request's drafts: zero (vLLM never reads them).

Pure torch, no vLLM import: tests/test_vllm_sampled.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DraftProbs"]


class DraftProbs:
    """One buffer [M, N, V] float32, reused: each step zeroes what the last one wrote (a few hundred
    entries) instead of the whole buffer (M x N x V)."""

    def __init__(self, max_reqs: int, num_spec: int, vocab_size: int) -> None:
        import torch

        self.M, self.N, self.V = max_reqs, num_spec, vocab_size
        self.buf = torch.zeros((max_reqs * num_spec, vocab_size), dtype=torch.float32)
        self._dirty: Any = None  # flat (row, col) indices written last time

    def fill(self, drafts: list[list[int]], sample_mask: np.ndarray, support_ids: np.ndarray,
             q: np.ndarray) -> Any:
        """[n, N, V] view of the buffer for a step of n requests (batch order): `drafts` as vLLM got
        them (clipped), `sample_mask` [n], `support_ids` int [n, N, K], `q` float [n, N, K]."""
        import torch

        n, N, V = len(drafts), self.N, self.V
        if n > self.M:
            raise ValueError(f"{n} requests in a step, more than max_num_seqs={self.M}")
        flat = self.buf.view(-1)
        if self._dirty is not None:
            flat[self._dirty] = 0.0
        k = np.fromiter(map(len, drafts), dtype=np.int64, count=n)
        pos = np.arange(N)[None, :] < k[:, None]  # [n, N]: positions with a draft
        drawn = pos & np.asarray(sample_mask[:n], dtype=bool)[:, None]
        point = pos & ~drawn
        sup = np.asarray(support_ids[:n], dtype=np.int64)
        qq = np.asarray(q[:n], dtype=np.float32)
        ok = drawn[:, :, None] & (sup >= 0) & (sup < V) & (qq > 0)
        rows = np.broadcast_to((np.arange(n)[:, None] * N + np.arange(N)[None, :])[:, :, None], sup.shape)
        idx_s = rows[ok] * V + sup[ok]
        val_s = qq[ok]
        ids = np.zeros((n, N), dtype=np.int64)
        for i, d in enumerate(drafts):
            if d:
                ids[i, :len(d)] = d
        idx_p = (np.arange(n)[:, None] * N + np.arange(N)[None, :])[point] * V + ids[point]
        idx = torch.from_numpy(np.concatenate([idx_s, idx_p]))
        val = torch.from_numpy(np.concatenate([val_s, np.ones(idx_p.shape[0], np.float32)]))
        flat[idx] = val
        self._dirty = idx
        return self.buf[:n * N].view(n, N, V)
