"""How many drafts of a worker's reply the engine may use: `n_drafts`, the page's per-request word.

A request's usable drafts are its leading non-negative draft ids, at most the entry's n_out (0 = all
N): a worker that answers -1 early, or a draft after a -1, never makes the engine read a -1 or a draft
past one (docs/engine.md, "The calls", shm_layout.md). Everything past n_drafts is -1 / 0 on the page.
"""

from __future__ import annotations

import numpy as np

__all__ = ["leading_drafts", "trim_rows"]

_min = np.minimum.reduce


def leading_drafts(ids: np.ndarray, cap: int) -> np.ndarray | None:
    """Per row of `ids` [k, N]: the count of its leading non-negative ids, at most `cap` (int32 [k]).
    None when every row has all N of them and cap is N (the usual round: one reduction, nothing else)."""
    N = ids.shape[1]
    if cap >= N and (ids.shape[0] == 0 or int(_min(ids, axis=None)) >= 0):  # ufunc.reduce: ~0.5 µs less than .min()
        return None
    nd = np.logical_and.accumulate(ids >= 0, axis=1).sum(axis=1, dtype=np.int32)
    np.minimum(nd, cap, out=nd)
    return nd


def trim_rows(a: np.ndarray, nd: np.ndarray, fill: int | float) -> np.ndarray:
    """`a` [k, N, ...] with every position j >= nd[row] set to `fill` (a new array of a's dtype)."""
    keep = np.arange(a.shape[1])[None, :] < nd[:, None]
    keep = keep.reshape(keep.shape + (1,) * (a.ndim - 2))
    return np.where(keep, a, a.dtype.type(fill))
