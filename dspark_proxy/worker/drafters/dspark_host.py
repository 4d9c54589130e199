"""The dspark drafter's host side on the CPU (`DSparkDrafter(native=True)`): a STEP's new rows to their
context keys and values, and the greedy drafts left to right, in numpy and the head's kernel
(model/headmm.py) where torch takes an operation of 5-40 us each on this kind of CPU (docs/dspark.md,
"Its cost"). The torch path (CUDA, `native=False`) computes the same; tests/test_dspark_native.py holds
the two together and tests/test_dspark_reference.py both to the reference.
"""

from __future__ import annotations

import numpy as np
import torch

from ...model.head_runner import bf16_to_f32
from .dspark_rope import Rotary

__all__ = ["HostPath", "MARKOV_TABLE_BYTES", "rows_to_f32", "zero_nonfinite"]

MARKOV_TABLE_BYTES = 32 << 20  # HostPath.markov_table: the shipped head's is 16 MiB (4,096 x 1,024 ids)


def zero_nonfinite(x: np.ndarray) -> np.ndarray:
    """x with every nan and inf set to 0, in place (np.nan_to_num's three passes cost ~60 us here)."""
    bad = ~np.isfinite(x)
    if bad.any():
        x[bad] = 0.0
    return x


def rows_to_f32(raw: np.ndarray, row_dtype: str) -> np.ndarray:
    """Rows [k, row_bytes] (bfloat16, float16 or float32 values) as a new float32 array, a non-finite
    value 0 (a hostile row must not reach a slot's keys)."""
    raw = np.ascontiguousarray(raw)
    if row_dtype == "bfloat16":
        x = bf16_to_f32(raw)
    else:
        x = raw.view(np.float16 if row_dtype == "float16" else np.float32).astype(np.float32)
    return zero_nonfinite(x)


class HostPath:
    """One checkpoint's host-side tables (views of its tensors, or made once here) and the two loops."""

    def __init__(self, spec, t: dict, products, rotary: Rotary, eps: float, row_dtype: str) -> None:
        self.spec, self.products, self.rotary, self.eps, self.row_dtype = spec, products, rotary, eps, row_dtype
        self.hm = products.headmm
        self.k_norm = [t[f"layers.{i}.self_attn.k_norm.weight"].numpy() for i in range(spec.n_layers)]
        self.w1 = t["markov_head.markov_w1.weight"].numpy() if spec.markov_rank else None
        d2t = t.get("draft_to_target")
        self.d2t = None if d2t is None else d2t.numpy()
        self.markov_tab = self.markov_table()

    def _mm(self, x: np.ndarray, name: str) -> np.ndarray:
        pk, b, normed = self.products.packed[name]
        return self.hm.mm(x, pk, b, None, normed, self.eps)

    def markov_table(self) -> np.ndarray | None:
        """A vanilla Markov head's bias for every previous token [V, draft vocab], where it fits in
        MARKOV_TABLE_BYTES (None: each position computes it): a position's bias is then a row read where
        the product of its embedding cost ~40 us a position. The same bytes: the kernel's rows do not
        depend on the rows beside them (model/headmm.py), and it adds the base logits after the product
        and its bias, as `lg + table[prev]` does."""
        s = self.spec
        if not s.markov_rank or s.markov_head_type != "vanilla":
            return None
        if self.w1.shape[0] * s.draft_vocab_size * 4 > MARKOV_TABLE_BYTES:
            return None
        return self._mm(self.w1, "markov_w2")

    def context_kv(self, raw: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Rows [k, row_bytes] at positions pos → [k, kv_width] float32: every draft layer's keys (normed
        and rotated) and values, as the torch path's `_context_kv` computes them (212 us for a decode
        STEP's 4 rows where its ~15 torch operations took 365)."""
        s, k = self.spec, raw.shape[0]
        h = self._mm(rows_to_f32(raw, self.row_dtype), "fc")  # hidden_norm: in each layer's kv product
        cos, sin = (c.numpy()[:, None, :] for c in self.rotary.cos_sin(pos))  # sin's first half negated
        out = np.empty((k, s.n_layers, 2, s.n_kv_heads, s.head_dim), dtype=np.float32)
        half = s.head_dim // 2
        with np.errstate(all="ignore"):  # huge rows overflow fc: their keys are zeroed below, silently
            for i in range(s.n_layers):
                kv = self._mm(h, f"{i}.kv").reshape(k, 2, s.n_kv_heads, s.head_dim)
                kn = self.hm.rms(kv[:, 0], self.eps) * self.k_norm[i]
                # rope: x * cos + rotate_half(x) * sin, rotate_half a swap of the halves (dspark_rope.rope)
                out[:, i, 0] = kn * cos + np.concatenate((kn[..., half:], kn[..., :half]), axis=-1) * sin
                out[:, i, 1] = kv[:, 1]
        return zero_nonfinite(out).reshape(k, -1)

    def greedy(self, base: np.ndarray, anchor: np.ndarray, n: int, need_probs: bool, ids: np.ndarray,
               kept: list | None) -> tuple[torch.Tensor | None, np.ndarray | None]:
        """The greedy drafts left to right (a vanilla Markov head or none): per position the previous
        token's bias is added to the base logits (a row of `markov_tab`, or one kernel call, `mm` with
        the base as its residual) and one call finds the arg max with the draft's probability and margin
        (`top1`). base [B, n, Vd] → ids[:, :n] filled (target ids); returns the Markov embeddings
        [B, n, rank] (None without a Markov head) and [B, n, probability | margin] (None unless
        need_probs)."""
        hm, s = self.hm, self.spec
        B = base.shape[0]
        w1, tab, d2t = self.w1, self.markov_tab, self.d2t
        emb = np.empty((B, n, s.markov_rank), dtype=np.float32) if s.markov_rank else None
        pm = np.empty((B, n, 2), dtype=np.float32) if need_probs else None
        prev = anchor
        for j in range(n):
            lg = base[:, j]
            if emb is not None:
                e = w1[prev]
                emb[:, j] = e
                lg = lg + tab[prev] if tab is not None else \
                    hm.mm(e, self.products.packed["markov_w2"][0], None, lg)
            if kept is not None:
                kept.append(torch.from_numpy(np.array(lg, dtype=np.float32)))
            if need_probs:
                c, cm = hm.top1(lg)
                pm[:, j] = cm
            else:
                c = lg.argmax(-1)
            prev = c if d2t is None else d2t[c]
            ids[:, j] = prev
        return (None if emb is None else torch.from_numpy(emb)), pm
