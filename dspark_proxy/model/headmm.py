"""The draft head's matrix products, batch-invariant by construction (the C kernel `_headmm.c`).

Every element of x @ w is summed over k in order, each product and each sum rounded to float32, for
any number of rows: a request's numbers cannot depend on what else is in the batch, where BLAS picks
another kernel (another order) for another row count. The RMS norm, the bias and the residual go into
the same call (at one request a round's cost is numpy's per-call overhead, a µs a call, more than the
arithmetic). `mm_reference` and `rms_reference` are those orders in numpy, the readable definitions
the kernel is checked against byte for byte (tests/test_headmm.py). The kernel
reads w from 32-column panels packed once (`Packed`), and a tile of 4 rows reads them once.
"""

from __future__ import annotations

import numpy as np

from . import _headmm

__all__ = ["EPS", "Packed", "mm", "mm_reference", "rms", "rms_reference"]

_PW = 32  # panel width, as _headmm.c's PW


class Packed:
    """w [K, M] float32 as the kernel reads it: panels [ceil(M/32), K, 32], the last zero-padded."""

    __slots__ = ("w", "panels", "shape")

    def __init__(self, w: np.ndarray) -> None:
        w = np.asarray(w, dtype=np.float32)
        if w.ndim != 2:
            raise ValueError(f"a product's matrix is 2-D, not {w.shape}")
        K, M = w.shape
        nb = -(-M // _PW)
        p = np.zeros((K, nb * _PW), dtype=np.float32)
        p[:, :M] = w
        self.w = w  # the plain form, for the reference model and for readers
        self.panels = np.ascontiguousarray(p.reshape(K, nb, _PW).transpose(1, 0, 2))
        self.shape = (K, M)


EPS = np.float32(1e-6)


def mm(x: np.ndarray, w: Packed, b: np.ndarray | None = None, resid: np.ndarray | None = None,
       rms: bool = False) -> np.ndarray:
    """resid + ((rms(x) if rms else x) @ w + b), b and resid optional: x [..., K] → [..., M] float32, each
    row by `mm_reference`'s order. One call for what is a norm, a product and two adds in numpy; the
    shapes are checked in C (a ValueError names them)."""
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    if resid is not None and not resid.flags.c_contiguous:
        resid = np.ascontiguousarray(resid)
    return _headmm.mm(x, w.panels, w.shape[1], b, resid, rms, EPS)


def rms(x: np.ndarray) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) over the last axis, by `rms_reference`'s order."""
    return _headmm.rms(x if x.flags.c_contiguous else np.ascontiguousarray(x), EPS)


def rms_reference(x: np.ndarray) -> np.ndarray:
    """The kernel's RMS norm: s = 0; s = s + x[..., k]² for k in order; x * (1 / sqrt(s / K + eps))."""
    x = np.asarray(x, dtype=np.float32)
    s = np.zeros(x.shape[:-1], dtype=np.float32)
    for k in range(x.shape[-1]):
        s = s + x[..., k] * x[..., k]
    inv = np.float32(1.0) / np.sqrt(s / np.float32(x.shape[-1]) + EPS)
    return x * inv[..., None]


def mm_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, resid: np.ndarray | None = None,
                 rms: bool = False) -> np.ndarray:
    """The kernel's definition: acc = 0; acc = acc + x[..., k] * w[k] for k = 0..K-1, in float32; then
    acc + b, then resid + that; x first through `rms_reference` where asked."""
    x = rms_reference(x) if rms else np.asarray(x, dtype=np.float32)
    acc = np.zeros((*x.shape[:-1], w.shape[1]), dtype=np.float32)
    for k in range(x.shape[-1]):
        acc = acc + x[..., k, None] * w[k]
    if b is not None:
        acc = acc + b
    return acc if resid is None else resid + acc
