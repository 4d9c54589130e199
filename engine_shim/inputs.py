"""The engine's inputs as numpy arrays: conversions and the request-id table, with ShimError for
anything that cannot be converted (enqueue turns it into a rejected round; shim.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ShimError"]


class ShimError(ValueError):
    """Bad input to enqueue/read_reply: raised before anything is written."""


class _ReqIds:
    """Request ids as int64: integers pass through; strings get small ids from a bounded table."""

    def __init__(self, limit: int) -> None:
        self._ids: dict[Any, int] = {}
        self._next = 0
        self._limit = limit

    def __call__(self, req_ids: Any, n: int) -> np.ndarray:
        if isinstance(req_ids, np.ndarray) and req_ids.dtype.kind in "iu":
            return req_ids.astype(np.int64, copy=False)
        if hasattr(req_ids, "dtype") and hasattr(req_ids, "numpy"):  # an integer torch tensor
            return req_ids.detach().cpu().numpy().astype(np.int64, copy=False)
        if not hasattr(req_ids, "__len__"):
            req_ids = list(req_ids)
        if len(req_ids) != n:
            raise ShimError(f"req_ids: expected {n} ids, got {len(req_ids)}")
        ids = self._ids
        if len(ids) > self._limit:
            ids.clear()  # owners re-register below; a slot whose owner id changes resends its window
        out = np.empty(n, dtype=np.int64)
        try:
            for i, r in enumerate(req_ids):
                v = ids.get(r)
                if v is None:
                    v = ids[r] = self._next
                    self._next += 1
                out[i] = v
        except TypeError as e:
            raise ShimError(f"req_ids: ids must be integers or hashable values: {e}") from e
        return out


def _as_numpy(x: Any, dtype: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        x = x.numpy()
    a = np.asarray(x)
    if dtype is not None and a.dtype != dtype:
        try:
            a = a.astype(dtype)
        except (TypeError, ValueError) as e:
            raise ShimError(f"{name}: cannot convert {a.dtype} to {np.dtype(dtype)}") from e
    return a
