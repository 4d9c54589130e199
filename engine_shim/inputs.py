"""The engine's inputs as numpy arrays: conversions and the request-id table, with ShimError for
anything that cannot be converted (enqueue turns it into a rejected round; shim.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dspark_proxy import native

__all__ = ["EnqueueInputs", "ShimError"]


_NEGATIVE_IDS = "req_ids: integer request ids must be >= 0"


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
            return np.ascontiguousarray(req_ids, dtype=np.int64)
        if hasattr(req_ids, "dtype") and hasattr(req_ids, "numpy"):  # an integer torch tensor
            return np.ascontiguousarray(req_ids.detach().cpu().numpy(), dtype=np.int64)
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
    if not a.flags.c_contiguous:  # the C paths take contiguous arrays (a strided view, a transposed tensor)
        a = np.ascontiguousarray(a)
    if dtype is not None and a.dtype != dtype:
        try:
            a = a.astype(dtype)
        except (TypeError, ValueError) as e:
            raise ShimError(f"{name}: cannot convert {a.dtype} to {np.dtype(dtype)}") from e
    return a


class EnqueueInputs:
    """Checks and converts one enqueue's arguments (numpy or torch, CPU or GPU) before anything is
    written; the engine thread's, like the shim. Its scratch is made once. `native`: the cheap checks in
    one C call (_fastround.check_round) instead of the numpy reference below (dspark_proxy/native.py)."""

    def __init__(self, max_reqs: int, window: int, row_bytes: int, sampled: bool, native: bool = False) -> None:
        self.max_reqs, self.window, self.row_bytes, self.sampled = max_reqs, window, row_bytes, sampled
        self.native = native
        self._req_ids = _ReqIds(limit=16 * max_reqs + 1024)
        self._arange = np.arange(max_reqs, dtype=np.int64)
        self._mark = np.zeros(max_reqs, dtype=np.int64)  # scratch for the duplicate-slot check
        self._no_sampled = np.zeros(max_reqs, dtype=np.bool_)  # `sampled` not given: never written
        self._pinned = None  # CUDA rows: a pinned host bounce buffer (see _rows_from_device)

    def check(self, req_ids, slots, qsl, need_draft, k_window, rows, valid, first_pos, anchor, sampled,
              seed, temperature) -> tuple[int, dict[str, np.ndarray]]:
        """enqueue's arguments, checked and converted: n and the arrays by name (rows as [total,
        row_bytes] bytes). Cheap checks first, in one pass; `_explain` names the culprit. On the C path,
        arguments that need no conversion (C-contiguous numpy arrays of the right dtypes and shapes) are
        checked by one `_fastround.check_fast` call; anything else takes the reference (`_convert`,
        `_finish`)."""
        M, W = self.max_reqs, self.window
        code = taken = -1
        if self.native:  # arguments that are already what is needed: taken as they are, checked in one call
            code, n, total, taken = native.fastround.check_fast(np.ndarray, M, W, self.row_bytes, self._mark, slots,
                                                                valid, first_pos, anchor, k_window, need_draft, qsl,
                                                                req_ids, rows)
        if code < 0:
            n, a, total = self._convert(slots, valid, first_pos, anchor, k_window, need_draft, qsl)
            return self._finish(n, a, total, req_ids, rows, sampled, seed, temperature)
        a = {"slots": slots, "valid": valid, "first_pos": first_pos, "anchor": anchor, "k_window": k_window,
             "need_draft": need_draft, "qsl": qsl}
        if code == 1:
            self._explain(slots, qsl, a)
        if code == 2:
            raise ShimError("slots: a slot appears more than once in the round")
        if code == 3:
            raise ShimError(_NEGATIVE_IDS)
        if taken == 3 and sampled is None and not self.sampled:  # the usual round: nothing left to convert
            a["req_ids"], a["rows"], a["sampled"] = req_ids, rows, self._no_sampled[:n]
            return n, a
        return self._finish(n, a, total, req_ids, rows, sampled, seed, temperature)

    def _convert(self, slots, valid, first_pos, anchor, k_window, need_draft, qsl) -> tuple[int, dict, int]:
        """check()'s reference: each argument converted (_as_numpy) and its shape checked, then the
        cheap checks (check_round, or numpy); n, the arrays by name, and the sum of valid (-1: not yet)."""
        M, W = self.max_reqs, self.window
        slots_a = _as_numpy(slots, np.int64, "slots")
        n = int(slots_a.shape[0]) if slots_a.ndim == 1 else -1
        if n < 0 or n > M:
            raise ShimError(f"slots: expected a 1-D array of at most max_reqs={M} requests, got shape "
                            f"{slots_a.shape}")
        a: dict[str, np.ndarray] = {"slots": slots_a}
        for key, val, dt in (("valid", valid, np.int64), ("first_pos", first_pos, np.int64),
                             ("anchor", anchor, np.int64), ("k_window", k_window, np.int64),
                             ("need_draft", need_draft, np.bool_)):
            arr = _as_numpy(val, dt, key)
            if arr.shape != (n,):
                raise ShimError(f"{key}: expected shape ({n},), got {arr.shape}")
            a[key] = arr
        qsl_a = _as_numpy(qsl, np.int64, "qsl")
        if qsl_a.shape != (n + 1,):
            raise ShimError(f"qsl: expected shape ({n + 1},), got {qsl_a.shape}")
        a["qsl"] = qsl_a
        total = -1
        if self.native:
            code, total = native.fastround.check_round(slots_a, a["valid"], a["first_pos"], a["k_window"], qsl_a,
                                                       self._mark, M, W)
            if code == 1:
                self._explain(slots_a, qsl_a, a)
            if code == 2:
                raise ShimError("slots: a slot appears more than once in the round")
        elif n:
            # one pass of cheap checks on the hot path; the slow path below only names the culprit
            # as uint64 a negative int64 is huge: one comparison checks both ends of a range
            v, k = a["valid"], a["k_window"]
            bad = np.count_nonzero((slots_a.view(np.uint64) >= M) | (v.view(np.uint64) > W)
                                   | ((a["first_pos"] | k) < 0))
            bad += np.count_nonzero(qsl_a[1:] < qsl_a[:-1])
            if bad:
                self._explain(slots_a, qsl_a, a)
            # duplicates: mark each slot with its request index; a slot seen twice keeps only one
            idx = self._arange[:n]
            self._mark[slots_a] = idx
            if np.count_nonzero(self._mark[slots_a] != idx):
                raise ShimError("slots: a slot appears more than once in the round")
        return n, a, total

    def _finish(self, n: int, a: dict[str, np.ndarray], total: int, req_ids, rows, sampled, seed,
                temperature) -> tuple[int, dict[str, np.ndarray]]:
        """check() past the per-request arrays: request ids, rows, the sampled fields."""
        a["req_ids"] = self._req_ids(req_ids, n)
        if a["req_ids"].shape != (n,):
            raise ShimError(f"req_ids: expected {n} ids, got {a['req_ids'].shape}")
        if n and np.minimum.reduce(a["req_ids"]) < 0:
            raise ShimError(_NEGATIVE_IDS)
        if total < 0:
            total = int(a["valid"].sum()) if n else 0
        a["rows"] = self._rows(rows, total)
        s = self._no_sampled[:n] if sampled is None else _as_numpy(sampled, np.bool_, "sampled")
        if s.shape != (n,):
            raise ShimError(f"sampled: expected shape ({n},), got {s.shape}")
        a["sampled"] = s
        if self.sampled:
            if seed is None or temperature is None:
                raise ShimError("seed and temperature are required: the proxy was started with --sampled")
            a["seed"] = _as_numpy(seed, np.int64, "seed")
            a["temperature"] = _as_numpy(temperature, np.float32, "temperature")
            for key in ("seed", "temperature"):
                if a[key].shape != (n,):
                    raise ShimError(f"{key}: expected shape ({n},), got {a[key].shape}")
        return n, a

    def _explain(self, slots_a: np.ndarray, qsl_a: np.ndarray, a: dict[str, np.ndarray]) -> None:
        """The hot-path check failed: raise the error that names the field."""
        M, W = self.max_reqs, self.window
        if slots_a.min() < 0 or slots_a.max() >= M:
            raise ShimError(f"slots: every slot must be in [0, {M}), got {slots_a.min()}..{slots_a.max()}")
        v = a["valid"]
        if v.max() > W or v.min() < 0:
            raise ShimError(f"valid: every value must be in [0, window={W}] (only the last W rows of a "
                            f"chunk are sent), got {v.min()}..{v.max()}")
        if a["first_pos"].min() < 0:
            raise ShimError("first_pos: positions must be >= 0")
        if a["k_window"].min() < 0:
            raise ShimError("k_window: must be >= 0")
        raise ShimError("qsl: must be non-decreasing")

    def _rows(self, rows: Any, total: int) -> np.ndarray:
        B = self.row_bytes
        if hasattr(rows, "detach"):  # torch: view the row as bytes without a copy on CPU
            import torch

            x = rows.detach()
            if x.dim() != 2 or x.shape[0] != total or x.shape[1] * x.element_size() != B:
                raise ShimError(f"rows: expected [{total}, H] with H * itemsize == row_bytes={B}, got "
                                f"{tuple(x.shape)} of {x.dtype}")
            if x.device.type != "cpu":
                return self._rows_from_device(x.contiguous(), total)
            arr = x.contiguous().view(torch.uint8).numpy()
        else:
            arr = np.asarray(rows)
            if arr.ndim != 2 or arr.shape[0] != total or arr.shape[1] * arr.itemsize != B:
                raise ShimError(f"rows: expected [{total}, H] with H * itemsize == row_bytes={B}, got "
                                f"{arr.shape} of {arr.dtype}")
            arr = np.ascontiguousarray(arr).view(np.uint8)
        return arr.reshape(total, B)

    def _rows_from_device(self, x: Any, total: int) -> np.ndarray:
        """Rows on a GPU: one copy into a pinned host buffer, ordered on the engine's current stream,
        which is synchronised before we return, so `gathered` is raised only after the copy has
        completed. The buffer is the shim's (grown to the largest round seen), reused every round.
        (Built so; proven only where a GPU is available: CI runs CPU only.)"""
        import torch

        nbytes = total * self.row_bytes
        buf = self._pinned
        if buf is None or buf.numel() < nbytes:
            buf = self._pinned = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=True)
        dst = buf[:nbytes].view(total, self.row_bytes)
        stream = torch.cuda.current_stream(x.device)
        dst.copy_(x.view(torch.uint8).view(total, self.row_bytes), non_blocking=True)
        stream.synchronize()
        return dst.numpy()
