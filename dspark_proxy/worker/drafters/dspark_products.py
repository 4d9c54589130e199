"""The dspark drafter's matrix products: the checkpoint's projections fused by input, and, on the CPU,
run through the head's own kernel (model/headmm.py) instead of torch.

Each group of projections that reads the same input is one matrix, stored transposed (contiguous) once
(q/k/v, gate/up, a context row's k/v; the confidence head's hidden part one more column of lm_head's),
so a round runs a dozen products. A product whose input is RMS-normed first names that norm's weight
(`norm_of`): torch norms then multiplies; the kernel takes the weight folded into the matrix (rms(x) * g
@ W = rms(x) @ (g W)) and norms x in the same call with the checkpoint's eps, adds the bias and the
residual there too, reads the matrix from panels packed once (BLAS packs it again every call, for a
round's few rows most of a product), and may share a product with a second thread. On this CPU a torch
operation costs 5-40 us whatever its size (docs/dspark.md, "Its cost"), so each one saved counts.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["Products", "fuse", "rms"]


def rms(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The reference's RMSNorm (x * rsqrt(mean(x^2) + eps) * w, in float32) as torch's one operation."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)


def fuse(spec, t: dict) -> tuple[dict, dict[str, torch.Tensor]]:
    """(products by name: (W [K, M], bias [M] or None), or a plain tensor for the few read as such;
    the norm weight of each product whose input is normed). The tensors fused are moved out of `t`, so
    the weights are held once (the memory budget counts them once)."""
    s = spec
    used: set[str] = set()

    def lin(*names: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        used.update(names)
        w = torch.cat([t[n + ".weight"] for n in names], 0).T.contiguous()
        bs = [t.get(n + ".bias") for n in names]
        if all(b is None for b in bs):
            return w, None
        return w, torch.cat([b if b is not None else w.new_zeros(t[n + ".weight"].shape[0])
                             for b, n in zip(bs, names, strict=True)])

    w: dict = {"fc": lin("fc")}
    norm_of: dict[str, torch.Tensor] = {"out": t["norm.weight"]}
    lm_w, lm_b = lin("lm_head")
    if s.enable_confidence_head:  # the confidence head's hidden part: one more column of lm_head's product
        cw = t["confidence_head.proj.weight"]  # [1, H (+ rank)]: the hidden part and the Markov part
        cb = t.get("confidence_head.proj.bias")
        if lm_b is not None or cb is not None:
            lm_b = torch.cat((lm_b if lm_b is not None else lm_w.new_zeros(lm_w.shape[1]),
                              cb if cb is not None else lm_w.new_zeros(1)))
        lm_w = torch.cat((lm_w, cw[:, :s.hidden_size].T), dim=1).contiguous()
        w["conf_e"] = cw[:, s.hidden_size:].T.contiguous()
        used.add("confidence_head.proj")
    w["out"] = (lm_w, lm_b)  # [H, Vd (+ 1)]: base logits (and the confidence head's logit)
    for i in range(s.n_layers):
        a, m = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        w[f"{i}.qk_norm"] = torch.cat((t[a + "q_norm.weight"].expand(s.n_heads, -1),
                                       t[a + "k_norm.weight"].expand(s.n_kv_heads, -1)))
        used.add(a + "q_norm")  # only the fused copy is read; k_norm stays (the rows' keys read it)
        w[f"{i}.kv"] = lin(a + "k_proj", a + "v_proj")
        w[f"{i}.qkv"] = lin(a + "q_proj", a + "k_proj", a + "v_proj")
        w[f"{i}.o"] = lin(a + "o_proj")
        w[f"{i}.gate_up"] = lin(m + "gate_proj", m + "up_proj")
        w[f"{i}.down"] = lin(m + "down_proj")
        norm_of[f"{i}.kv"] = t["hidden_norm.weight"]
        norm_of[f"{i}.qkv"] = t[f"layers.{i}.input_layernorm.weight"]
        norm_of[f"{i}.gate_up"] = t[f"layers.{i}.post_attention_layernorm.weight"]
    if s.markov_rank:
        w["markov_w2"] = (t["markov_head.markov_w2.weight"].T.contiguous(), None)
        used.add("markov_head.markov_w2")
    for n in used:
        t.pop(n + ".weight", None)
        t.pop(n + ".bias", None)
    return w, norm_of


class Products:
    """`proj(x, name)` for every fused product; `native`: through the head's kernel (the CPU), else
    torch. The kernel's copies replace torch's (`w[name]` is None for those)."""

    def __init__(self, spec, t: dict, eps: float, native: bool) -> None:
        self.eps = eps
        self.w, self.norm_of = fuse(spec, t)
        self.native = native
        self.packed: dict = {}
        if native:
            from ...model import headmm

            self.headmm = headmm
            for name, wb in list(self.w.items()):
                if not (isinstance(wb, tuple) and wb[0].dim() == 2):
                    continue
                g = self.norm_of.get(name)
                m = wb[0] if g is None else wb[0] * g[:, None].to(wb[0].dtype)
                b = None if wb[1] is None else np.ascontiguousarray(wb[1].numpy(), dtype=np.float32)
                pk = headmm.Packed(m.numpy())
                pk.w = None  # the plain form is not read here
                self.packed[name] = (pk, b, g is not None)
                self.w[name] = None

    def proj(self, x: torch.Tensor, name: str, resid: torch.Tensor | None = None) -> torch.Tensor:
        """resid + (norm(x) if `name` reads a normed input else x) @ W + b (resid, b optional)."""
        p = self.packed.get(name)
        if p is not None:
            r = None if resid is None else resid.numpy()
            return torch.from_numpy(self.headmm.mm(x.numpy(), p[0], p[1], r, p[2], self.eps))
        w, b = self.w[name]
        g = self.norm_of.get(name)
        if g is not None:
            x = rms(x, g, self.eps)
        y = x @ w if b is None else torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], -1)
        return y if resid is None else resid + y

    def head_norm(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """RMS norm over the last axis (a head's) times g (broadcast), as the reference's q/k norms."""
        if self.native:
            return torch.from_numpy(self.headmm.rms(x.numpy(), self.eps)).mul_(g)
        return rms(x, None, self.eps).mul_(g)
