"""The draft head's matrix products, batch-invariant by construction (the C kernel `_headmm_mm.c`).

Every element of x @ w is summed over k in order, each product and each sum rounded to float32, for
any number of rows: a request's numbers cannot depend on what else is in the batch, where BLAS picks
another kernel (another order) for another row count. The RMS norm, the bias and the residual go into
the same call (at one request a round's cost is numpy's per-call overhead, a µs a call, more than the
arithmetic). `mm_reference` and `rms_reference` are those orders in numpy, the readable definitions
the kernel is checked against byte for byte (tests/test_headmm.py). The kernel
reads w from 32-column panels packed once (`Packed`), and a tile of 4 rows reads them once.

Threads: a product large enough to pay for the hand-off splits across `threads()` threads (the calling
one and helpers inside the kernel, _headmm_par.c), each output element computed whole by one of them,
so the bytes are the same for any count. The count: DSPARK_HEAD_THREADS where set (1 to 8), else the
CPUs this process may run on (os.sched_getaffinity) capped at 2; `set_threads` changes it.
"""

from __future__ import annotations

import os

import numpy as np

from . import _headmm

__all__ = ["EPS", "Packed", "backbone", "default_threads", "exp_reference", "gelu", "gelu_reference", "greedy", "mm", "project_bf16",
           "mm_reference", "par_stats", "rms", "rms_reference", "set_threads", "step", "threads", "tune", "use_threads", "top1", "top1_reference"]

_PW = 32  # panel width, as _headmm_common.h's PW


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

THREADS_ENV = "DSPARK_HEAD_THREADS"
MAX_THREADS = 8  # as _headmm_par.h's HM_MAX_THREADS


def default_threads() -> int:
    """DSPARK_HEAD_THREADS where set, else this process's CPUs capped at 2: while the worker drafts,
    the engine and the proxy wait, so a second core is there to take; more rarely are, and each helper
    thread spins a while after a product (_headmm_par.c)."""
    env = os.environ.get(THREADS_ENV, "").strip()
    if env:
        if not env.isdigit() or not 1 <= int(env) <= MAX_THREADS:
            raise ValueError(f"{THREADS_ENV}={env!r}: the head's threads, 1 to {MAX_THREADS}")
        return int(env)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call here (not Linux)
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 2))


_cap = 1  # the configured count (`set_threads`); a round may use fewer (`use_threads`)


def set_threads(n: int) -> None:
    """Threads a product may use from now on (1: the calling thread only); the bytes do not change."""
    global _cap
    _headmm.set_threads(int(n))  # refuses a count outside 1..8 by name
    _cap = int(n)


def threads() -> int:
    """The configured count (`set_threads`, DSPARK_HEAD_THREADS or the CPUs)."""
    return _cap


def use_threads(k: int) -> None:
    """This round's count, at most the configured one (a worker's measured choice,
    model/head_threads.py); `threads()` stays the configured count for the next drafter."""
    _headmm.set_threads(max(1, min(int(k), _cap)))


def tune(par_min: int = -1, chunk: int = 0, adapt: int = -1) -> tuple[int, int, int]:
    """The multiply-adds from which a product splits across threads, the size of its chunks, and
    whether a busy core starts a spell of products run alone (-1, 0, -1: unchanged) → the old triple:
    for tests (tiny chunks put every tile shape across a boundary, adapt 0 shares every product) and
    for measuring the cutoff."""
    return _headmm.tune(int(par_min), int(chunk), int(adapt))


def par_stats() -> tuple[int, int, int, int]:
    """(products shared with the helpers, products run alone in a solo spell, chunks the helpers ran,
    solo spells begun) since the kernel loaded."""
    return _headmm.par_stats()


set_threads(default_threads())


def mm(x: np.ndarray, w: Packed, b: np.ndarray | None = None, resid: np.ndarray | None = None,
       rms: bool = False, eps: float = EPS) -> np.ndarray:
    """resid + ((rms(x) if rms else x) @ w + b), b and resid optional: x [..., K] → [..., M] float32, each
    row by `mm_reference`'s order (the norm's eps `eps`: a DSpark checkpoint's own). One call for what is
    a norm, a product and two adds in numpy; the shapes are checked in C (a ValueError names them)."""
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    if resid is not None and not resid.flags.c_contiguous:
        resid = np.ascontiguousarray(resid)
    return _headmm.mm(x, w.panels, w.shape[1], b, resid, rms, np.float32(eps))


def step(ctx_j: np.ndarray, prev: np.ndarray, carry: np.ndarray | None, more: bool, weights: tuple,
         vout: int) -> tuple[np.ndarray, np.ndarray | None]:
    """One draft position natively (_headmm_step.c): weights = (markov, s1, s1b, s2, s2b, out, carry_w),
    the matrices `Packed`; → (logits [B, vout], the next carry or None)."""
    mk, s1, s1b, s2, s2b, out, cw = weights
    return _headmm.step(np.ascontiguousarray(ctx_j, dtype=np.float32), np.ascontiguousarray(prev, dtype=np.int64),
                        carry, more, mk, s1.panels, s1b, s2.panels, s2b, out.panels,
                        None if cw is None else cw.panels, vout, EPS)


def greedy(ctx: np.ndarray, anchor: np.ndarray, weights: tuple, draft_ids: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every position's greedy draft natively, each fed to the next: ctx [B, n, d], anchor [B] →
    (ids int64 [B, n] = draft_ids[top-1], confidence, margin float32 [B, n])."""
    mk, s1, s1b, s2, s2b, out, cw = weights
    return _headmm.greedy(np.ascontiguousarray(ctx, dtype=np.float32), np.ascontiguousarray(anchor, dtype=np.int64),
                          mk, s1.panels, s1b, s2.panels, s2b, out.panels, None if cw is None else cw.panels,
                          draft_ids, EPS)


def backbone(win: np.ndarray, lens: np.ndarray, anchor: np.ndarray, n: int, weights: tuple, heads: int,
             scale: np.float32) -> np.ndarray:
    """The head's backbone natively (_headmm_bb.c): weights = (pos, queries, tok, q_tok, o, m1, m1b, m2,
    m2b, q2, o2), the matrices `Packed`, q2 and o2 None for a 1-hop head; win [B, W, 3d], lens [B] rows
    present (1 .. W), anchor [B] ids → ctx [B, n, d] (HeadRunner.backbone_reference's order)."""
    pos, queries, tok, q_tok, o, m1, m1b, m2, m2b, q2, o2 = weights
    return _headmm.backbone(np.ascontiguousarray(win, dtype=np.float32), np.ascontiguousarray(lens, dtype=np.int64),
                            np.ascontiguousarray(anchor, dtype=np.int64), int(n), pos, queries, tok, q_tok.panels,
                            o.panels, m1.panels, m1b, m2.panels, m2b, None if q2 is None else q2.panels,
                            None if o2 is None else o2.panels, int(heads), float(scale), EPS)


def project_bf16(raw: np.ndarray, n_taps: int, hidden: int, in_w: Packed, in_b: np.ndarray, c_w: Packed
                 ) -> np.ndarray:
    """bfloat16 rows (uint8 [R, n_taps * hidden * 2]) → [R, c_w's columns] natively (_headmm_proj.c): widened
    (non-finite 0, clipped to ±1e4), each tap's values RMS-normed, @ in_w + in_b, @ c_w; the kernel's
    functions in the reference composition's order (worker/drafters/torch_head.py `_project_reference`)."""
    return _headmm.project_bf16(np.ascontiguousarray(raw, dtype=np.uint8), int(n_taps), int(hidden), in_w.panels,
                                in_w.shape[1], np.ascontiguousarray(in_b, dtype=np.float32), c_w.panels, c_w.shape[1],
                                EPS)


def rms(x: np.ndarray, eps: float = EPS) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) over the last axis, by `rms_reference`'s order."""
    return _headmm.rms(x if x.flags.c_contiguous else np.ascontiguousarray(x), np.float32(eps))


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


def gelu(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + erf(x / sqrt 2)) elementwise in float32, as `gelu_reference` computes it: within 5e-7
    of the exact GELU (torch's float32 GELU: 1.1e-6); erf by Abramowitz & Stegun 7.1.26."""
    return _headmm.gelu(x if x.flags.c_contiguous else np.ascontiguousarray(x))


_f = np.float32
_A = tuple(map(_f, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)))  # A&S 7.1.26
_EXP_TAYLOR = tuple(_f(1.0) / _f(c) for c in (1, 1, 2, 6, 24, 120, 720, 5040))  # 1 / k!, k = 0..7
_LN2_HI, _LN2_LO, _INV_LN2 = _f(0.693145751953125), _f(1.428606765330187e-06), _f(1.44269504088896341)
_RND, _RND_BITS = _f(12582912.0), np.int32(0x4B400000)  # 1.5 * 2**23 and its bits


def exp_reference(y: np.ndarray) -> np.ndarray:
    """The kernel's exp for y <= 0, float32: y clamped to >= -87 (2**n stays a normal float), n =
    round(y / ln 2) by adding and taking away 1.5 * 2**23, a degree-7 Taylor polynomial of r = y - n ln 2
    (|r| <= ln2 / 2: error 5e-9), times 2**n built from n's bits."""
    y = np.asarray(y, dtype=np.float32)
    y = np.where(y < _f(-87.0), _f(-87.0), y)
    nr = y * _INV_LN2 + _RND  # n + 1.5 * 2**23: n sits in the low bits of the mantissa
    n = nr - _RND
    r = (y - n * _LN2_HI) - n * _LN2_LO
    e = r * _EXP_TAYLOR[7] + _EXP_TAYLOR[6]
    for c in _EXP_TAYLOR[5::-1]:
        e = e * r + c
    return e * ((nr.view(np.int32) - _RND_BITS + np.int32(127)) << np.int32(23)).view(np.float32)


def gelu_reference(x: np.ndarray) -> np.ndarray:
    """The kernel's GELU step by step in float32 numpy (only +, -, *, / and exact bit moves, so the
    same bits): z = clip(x / sqrt 2, ±6); erf(|z|) = 1 - t (a1 + t (a2 + ...)) exp(-z²), t = 1 / (1 +
    p |z|), exp by `exp_reference`. NaN stays NaN; -inf gives NaN (0 * inf), never reached: rows are clipped to ±1e4 before the head."""
    x = np.asarray(x, dtype=np.float32)
    z = x * _f(0.70710678118654752)
    z = np.where(z < _f(-6.0), _f(-6.0), z)
    z = np.where(z > _f(6.0), _f(6.0), z)
    neg = z < _f(0.0)
    az = np.where(neg, -z, z)
    t = _f(1.0) / (_f(1.0) + _f(0.3275911) * az)
    e = exp_reference(-(az * az))  # y in [-36, 0]
    poly = ((((_A[4] * t + _A[3]) * t + _A[2]) * t + _A[1]) * t + _A[0]) * t
    erfa = _f(1.0) - poly * e
    erf = np.where(neg, -erfa, erfa)
    return (_f(0.5) * x * (_f(1.0) + erf)).astype(np.float32)


def top1(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's arg max (int64 [B]) and [confidence, margin] (float32 [B, 2]), by `top1_reference`."""
    return _headmm.top1(logits if logits.flags.c_contiguous else np.ascontiguousarray(logits))


def top1_reference(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's top-1: c = the arg max (numpy's: the first max, or the first NaN), confidence =
    1 / sum_j exp(l_j - l_c), margin = (1 - exp(l_2nd - l_c)) / sum (the runner-up: the max over j != c;
    with one column none, and that exp taken as -1); exp by `exp_reference`, the sum in float64 over 16
    interleaved partial sums (lane k: columns k, k + 16, ...; a last block zero-padded) added lane 0 to
    15 (a fixed order, vectorisable)."""
    lg = np.asarray(logits, dtype=np.float32)
    B, V = lg.shape
    rows = np.arange(B)
    c = lg.argmax(-1)
    top = lg[rows, c]
    e = exp_reference(lg - top[:, None]).astype(np.float64)
    e = np.concatenate([e, np.zeros((B, -V % 16))], axis=1).reshape(B, -1, 16)
    part = np.zeros((B, 16))
    for blk in range(e.shape[1]):
        part = part + e[:, blk]
    tot = part[:, 0]
    for k in range(1, 16):
        tot = tot + part[:, k]
    if V > 1:
        rest = lg.copy()
        rest[rows, c] = -np.inf
        e2 = exp_reference(rest.max(-1) - top).astype(np.float64)
    else:
        e2 = np.full(B, -1.0)
    return c.astype(np.int64), np.stack([1.0 / tot, (1.0 - e2) / tot], axis=1).astype(np.float32)
