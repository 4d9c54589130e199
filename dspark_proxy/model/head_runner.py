"""The head at serving time: `DraftHead`'s forward in numpy float32, its weights folded once.

At one request a round is ~100 tiny operations, where torch's per-call overhead (several µs) costs
more than the arithmetic; numpy's is a fraction of it. Folding: each RMS norm's weight goes into the
matrix after it and `markov(tok(prev))` is a table lookup. Both the worker (`worker/drafters/torch_head.py`) and the offline measurement (`train_head.evaluate`)
call `greedy`, so what is measured is what is served, bit for bit (tests/test_head_runner.py).
GELU is the erf one, as in training, within 5e-7 (model/headmm.py `gelu`: native, 0.6 µs where torch's
call cost ~7 µs a step; torch's own float32 GELU is within 1.1e-6).

Batch-invariant: a request's drafts do not depend on what else is in the batch. BLAS picks another
kernel (another summation order) for another number of rows, so every product here goes through `_mm`,
the native kernel of model/headmm.py: each element summed over k in one fixed order whatever the row
count, and a tile of 4 rows reads w once (2-2.5x the one-row-at-a-time BLAS products it replaces at
4-20 rows, as fast at one); it also takes the RMS norm before a product and the bias and residual
after it (one call for what was about seven numpy calls).

The backbone is one native call too (`backbone` → model/headmm.py `backbone`): in numpy it was ~15
calls (the attention's reshapes, transposes, batched matmuls, mask and softmax), a few µs each hot and
5-10x that on the cold caches a round meets between an engine's forwards, around ~80 µs of arithmetic.
Its attention has a defined order now (`backbone_reference`: each score summed over the head's
features in order, the kernel's exp, the softmax's sum and the weighted sum over rows in order), where
numpy's batched matmul left it to BLAS; a request's ctx is the same alone or in a batch.

After the backbone, a round's positions are one native call (`greedy` → model/headmm.py `greedy`;
`step_carry` one position): a position was about a dozen numpy-level calls, a µs or more each on a
loaded machine. `greedy_reference` (through `backbone_reference`) and `step_carry_reference` keep
that composition as the readable definition; tests/test_head_runner.py requires the same bytes from
both.
"""

from __future__ import annotations

import weakref

import numpy as np

from . import headmm
from .head import DraftHead

__all__ = ["HeadRunner", "bf16_to_f32"]



def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """uint8 [..., 2k] bfloat16 bytes (little-endian) → float32 [..., k], exactly."""
    u = raw.view(np.uint16).astype(np.uint32)
    return (u << 16).view(np.float32)


_gelu = headmm.gelu  # 0.5 x (1 + erf(x / sqrt 2)), natively (see the module docstring)


def _mm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, resid: np.ndarray | None = None,
        rms: bool = False) -> np.ndarray:
    """resid + ((_rms(x) if rms else x) @ w + b) (b, resid optional) by the batch-invariant kernel
    (model/headmm.py), w packed on first use."""
    return headmm.mm(x, _packed(w), b, resid, rms)


_mm_blocked = _mm  # the kernel reads w once per 4 rows already: one product rule for every matrix

_packs: dict[int, tuple[weakref.ref, headmm.Packed]] = {}


def _packed(w: np.ndarray) -> headmm.Packed:
    """w's panels, made once per weight array (while it lives; weights are never written after
    folding, so the panels stay its copy)."""
    got = _packs.get(id(w))
    if got is not None and got[0]() is w:
        return got[1]
    key = id(w)
    _packs[key] = got = (weakref.ref(w, lambda _r, k=key, d=_packs: d.pop(k, None)), headmm.Packed(w))
    return got[1]


_rms = headmm.rms  # x / sqrt(mean(x²) + eps) over the last axis, natively (a dozen calls a round)


class HeadRunner:
    """Float32 numpy tables of one DraftHead: `project` rows once, then `greedy` (or `backbone` and
    `step` for a caller that picks drafts itself, as sampled mode does)."""

    def __init__(self, head: DraftHead) -> None:
        sd = {k: v.detach().float().cpu().numpy() for k, v in head.state_dict().items()}
        f32 = np.float32
        d, H = head.d, head.h
        self.d, self.h, self.dh = d, H, d // H
        self.n_taps, self.hidden, self.window, self.num_spec = head.n_taps, head.hidden, head.window, head.num_spec
        self.vocab = head.vocab
        tn = sd["tap_norm"].reshape(-1)
        # tap_norm folds into in_proj; in_proj and cache_proj stay two products: one [F, 3d] matrix
        # would be 3x the bytes read per row, and at real row sizes (F = 35,840) reading it is the cost
        self.in_w = np.ascontiguousarray((sd["in_proj.weight"] * tn[None, :]).T)  # [F, d]
        self.in_b = sd["in_proj.bias"]
        self.c_w = np.ascontiguousarray(sd["cache_proj.weight"].T)  # [d, 3d]
        self._pw = (_packed(self.in_w), _packed(self.c_w))  # `project_bf16`'s matrices
        self.pos = np.ascontiguousarray(sd["pos.weight"][:head.window][::-1])  # row i: distance W-1-i
        self.queries = sd["queries"]
        self.tok = sd["tok.weight"]
        self.q_tok = np.ascontiguousarray(sd["q_tok.weight"].T)
        self.o = np.ascontiguousarray(sd["o.weight"].T)
        self.m1 = np.ascontiguousarray((sd["mlp.0.weight"] * sd["norm1.weight"][None, :]).T)
        self.m1b, self.m2, self.m2b = sd["mlp.0.bias"], np.ascontiguousarray(sd["mlp.2.weight"].T), sd["mlp.2.bias"]
        self.markov = np.ascontiguousarray(self.tok @ sd["markov.weight"].T)  # [vocab, d]
        self.s1 = np.ascontiguousarray((sd["mlp2.0.weight"] * sd["norm2.weight"][None, :]).T)
        self.s1b, self.s2, self.s2b = sd["mlp2.0.bias"], np.ascontiguousarray(sd["mlp2.2.weight"].T), sd["mlp2.2.bias"]
        ids = head.draft_ids.cpu().numpy().astype(np.int64)
        self.draft_ids = ids  # output column c drafts target id draft_ids[c]
        self.out = np.ascontiguousarray((self.tok[ids] * sd["out_norm.weight"][None, :]).T)  # [d, V']
        self.step_kind, self.hops = head.step, head.hops
        if head.hops == 2:
            self.q2 = np.ascontiguousarray((sd["q2.weight"] * sd["norm3.weight"][None, :]).T)
            self.o2 = np.ascontiguousarray(sd["o2.weight"].T)
        self.carry = np.ascontiguousarray(sd["carry.weight"].T) if head.step == "carry" else None  # [d, d]
        self.cache_width = 3 * d
        self._scale = f32(1.0 / np.sqrt(self.dh))
        # the backbone's weights as the native call takes them (model/headmm.py `backbone`)
        two = head.hops == 2
        self._bw = (self.pos, np.ascontiguousarray(self.queries), np.ascontiguousarray(self.tok), _packed(self.q_tok),
                    _packed(self.o), _packed(self.m1), self.m1b, _packed(self.m2), self.m2b,
                    _packed(self.q2) if two else None, _packed(self.o2) if two else None)
        # the step's weights as the native calls take them (model/headmm.py `step`, `greedy`)
        self._w = (self.markov, _packed(self.s1), self.s1b, _packed(self.s2), self.s2b, _packed(self.out),
                   None if self.carry is None else _packed(self.carry))

    def project(self, x: np.ndarray) -> np.ndarray:
        """x float32 [R, n_taps * hidden] → [R, 3d]: what a slot caches for each row."""
        r = _rms(x.reshape(len(x), self.n_taps, self.hidden)).reshape(len(x), -1)
        return _mm(_mm(r, self.in_w, self.in_b), self.c_w)

    def project_bf16(self, raw: np.ndarray) -> np.ndarray:
        """raw uint8 [R, n_taps * hidden * 2], bfloat16 rows → [R, 3d]: the rows widened (a non-finite
        value 0, the rest clipped to ±1e4, as the worker's torch drafter reads rows), then `project`, in
        one native call (model/headmm.py `project_bf16`; the same bytes as that composition)."""
        return headmm.project_bf16(raw, self.n_taps, self.hidden, self._pw[0], self.in_b, self._pw[1])

    def backbone(self, win: np.ndarray, lens: np.ndarray, anchor: np.ndarray, n: int) -> np.ndarray:
        """win [B, W, 3d] projected rows right-aligned (index W-1 next to the anchor), lens [B] rows
        present (1 .. W), anchor [B] ids → ctx [B, n, d]: one native call (model/headmm.py
        `backbone`), `backbone_reference`'s arithmetic to the bit."""
        return headmm.backbone(win, lens, anchor, n, self._bw, self.h, self._scale)

    def backbone_reference(self, win: np.ndarray, lens: np.ndarray, anchor: np.ndarray, n: int) -> np.ndarray:
        """`backbone` a product, norm and sum at a time (the readable definition)."""
        d = self.d
        e = self.tok[anchor]
        q = self.queries[:n][None] + _mm(e, self.q_tok)[:, None]  # [B, n, d]
        k = win[:, :, d:2 * d] + self.pos[:, :d]  # [B, W, d]
        v = win[:, :, 2 * d:] + self.pos[:, d:]
        present = np.arange(win.shape[1])[None, :] >= (win.shape[1] - np.asarray(lens))[:, None]  # [B, W]
        ctx = _mm(self._attend_reference(q, k, v, present), self.o) + (win[:, -1, :d] + e)[:, None]
        h = _gelu(_mm(ctx, self.m1, self.m1b, rms=True))
        ctx = _mm(h, self.m2, self.m2b, resid=ctx)
        if self.hops == 2:
            ctx = _mm(self._attend_reference(_mm(ctx, self.q2, rms=True), k, v, present), self.o2, resid=ctx)
        return ctx

    def _attend_reference(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, present: np.ndarray) -> np.ndarray:
        """q [B, n, d] over keys k and values v [B, W, d] of the `present` [B, W] rows → [B, n, d], each
        head: score s_i = 0 + (q scale)[0] k_i[0] + (q scale)[1] k_i[1] + ... in order; p_i = exp(s_i -
        max s) by the kernel's exp (headmm.exp_reference); z = 0 + p_0 + p_1 + ... over the rows in
        order; out = 0 + (p_0 / z) v_0 + (p_1 / z) v_1 + ... A masked row adds nothing (its p is 0 and
        its terms are left out, whatever its values)."""
        B, n, d = q.shape
        H, dh, W = self.h, self.dh, k.shape[1]
        qs = (q * self._scale).reshape(B, n, H, dh)
        kh = k.reshape(B, W, H, dh).transpose(0, 2, 3, 1)[:, None]  # [B, 1, H, dh, W]
        s = np.zeros((B, n, H, W), dtype=np.float32)
        for c in range(dh):
            s = s + qs[..., c, None] * kh[..., c, :]
        pm = present[:, None, None, :]
        s = np.where(pm, s, np.float32(-np.inf))
        p = np.where(pm, headmm.exp_reference(s - s.max(-1, keepdims=True)), np.float32(0.0))
        z = np.zeros((B, n, H), dtype=np.float32)
        for i in range(W):
            z = z + p[..., i]
        p = p / z[..., None]
        vh = v.reshape(B, W, H, dh)[:, None]  # [B, 1, W, H, dh]
        out = np.zeros((B, n, H, dh), dtype=np.float32)
        for i in range(W):
            out = out + np.where(pm[..., i, None], p[..., i, None] * vh[:, :, i], np.float32(0.0))
        return out.reshape(B, n, d)

    def step(self, ctx_j: np.ndarray, prev: np.ndarray) -> np.ndarray:
        """ctx_j [B, d], prev [B] target ids (draft j - 1) → logits [B, V'] over draft_ids (a carry
        head's position 0)."""
        return self.step_carry(ctx_j, prev, None, False)[0]

    def step_carry(self, ctx_j: np.ndarray, prev: np.ndarray, carry: np.ndarray | None, more: bool
                   ) -> tuple[np.ndarray, np.ndarray | None]:
        """One position: (logits, the carry for the next one, computed only when `more` positions
        follow and the head is a carry head, else None); carry: the previous position's. One native
        call (model/headmm.py `step`), `step_carry_reference`'s arithmetic to the bit."""
        return headmm.step(ctx_j, prev, carry, more, self._w, len(self.draft_ids))

    def step_carry_reference(self, ctx_j: np.ndarray, prev: np.ndarray, carry: np.ndarray | None, more: bool
                             ) -> tuple[np.ndarray, np.ndarray | None]:
        """`step_carry` one product, norm and GELU at a time (the readable definition)."""
        z = ctx_j + self.markov[prev]
        if carry is not None:
            z += carry
        h = _gelu(_mm(z, self.s1, self.s1b, rms=True))
        z = _mm(h, self.s2, self.s2b, resid=z)
        r = _rms(z)
        return _mm(r, self.out), (_mm(r, self.carry) if more and self.carry is not None else None)

    @staticmethod
    def top1(logits: np.ndarray, rows: np.ndarray, conf: np.ndarray, marg: np.ndarray) -> np.ndarray:
        """Each row's arg max over the draft vocabulary, its softmax probability written to `conf` and
        its lead over the runner-up to `marg` (the one definition the offline measure and the worker
        share: model/headmm.py `top1`, one native call; `rows` is kept for callers)."""
        c, cm = headmm.top1(logits)
        conf[:] = cm[:, 0]
        marg[:] = cm[:, 1]
        return c

    def greedy(self, win: np.ndarray, lens: np.ndarray, anchor: np.ndarray, n: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """n greedy drafts a request: (ids [B, n] target ids, confidence = softmax top-1 probability,
        margin = top-1 minus top-2 probability), each draft fed to the next position: the backbone,
        then every position in one native call (model/headmm.py `greedy`; `greedy_reference` is the
        same loop a product at a time, to the bit)."""
        ctx = self.backbone(win, lens, anchor, n)
        return headmm.greedy(ctx, anchor, self._w, self.draft_ids)

    def greedy_reference(self, win: np.ndarray, lens: np.ndarray, anchor: np.ndarray, n: int
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`greedy` through `backbone_reference`, then position by position through
        `step_carry_reference` and `top1`."""
        B = len(anchor)
        ids = np.empty((B, n), dtype=np.int64)
        conf = np.empty((B, n), dtype=np.float32)
        marg = np.empty((B, n), dtype=np.float32)
        ctx = self.backbone_reference(win, lens, anchor, n)
        prev, carry = anchor, None
        rows = np.arange(B)
        for j in range(n):
            logits, carry = self.step_carry_reference(np.ascontiguousarray(ctx[:, j]), prev, carry, j + 1 < n)
            c = self.top1(logits, rows, conf[:, j], marg[:, j])
            prev = self.draft_ids[c]
            ids[:, j] = prev
        return ids, conf, marg
