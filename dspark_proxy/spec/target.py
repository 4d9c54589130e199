"""The target as an engine runs it: a per-slot KV cache and one batched forward over ragged queries.

A Hugging Face causal LM's own decoder layers do the work (any Llama-shaped model: `model.model`
with `embed_tokens`, `layers`, `norm`, `rotary_emb`); what the engine owns is the cache. Each slot's
keys and values live at their token's position, so rolling back rejected drafts is just not moving
a slot's length forward: the next forward writes over them before any real query can see them (a
query at position p sees keys 0..p, all written by then). Queries of different lengths are padded
to the longest; the padding's outputs are never read.

The tap (`model.hf.Tap`, the head manifest's layers) sees every forward, so each position's row is
the residual stream the head was trained on.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import torch

from ..model.hf import Tap, load_causal_lm

__all__ = ["TargetEngine", "ROW_TORCH_DTYPES"]

ROW_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class _SlotCache:
    """What HF attention layers call `cache.update` on: writes this forward's keys and values at
    their positions and returns the batch's keys and values up to the longest position."""

    def __init__(self, n_layers: int, slots: int, kv_heads: int, max_len: int, head_dim: int) -> None:
        shape = (slots, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape) for _ in range(n_layers)]
        self.v = [torch.zeros(shape) for _ in range(n_layers)]
        self.max_len = max_len
        self._slots: torch.Tensor | None = None
        self._pos: torch.Tensor | None = None
        self._lk = 0

    def bind(self, slots: torch.Tensor, pos: torch.Tensor, lk: int) -> None:
        self._slots, self._pos, self._lk = slots, pos, lk

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        s, p = self._slots, self._pos
        assert s is not None and p is not None
        k, v = self.k[layer_idx], self.v[layer_idx]
        k[s[:, None], :, p] = key.transpose(1, 2).to(k.dtype)  # [B, Q, H, D] at (slot, position)
        v[s[:, None], :, p] = value.transpose(1, 2).to(v.dtype)
        return k[:, :, :self._lk].index_select(0, s), v[:, :, :self._lk].index_select(0, s)

    # transformers' layers may ask these of a cache; the mask is ours, so they never matter
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


def _cache_kwarg(layer) -> str:
    names = inspect.signature(layer.forward).parameters
    for kw in ("cache", "past_key_values", "past_key_value"):
        if kw in names:
            return kw
    raise TypeError(f"{type(layer).__name__}.forward takes no cache argument")


class TargetEngine:
    """A local HF causal LM with a KV cache of `slots` sequences of up to `max_len` tokens."""

    def __init__(self, model_dir: str | Path, *, slots: int, max_len: int, tap_layers: list[int] | None = None,
                 row_dtype: str = "bfloat16") -> None:
        self.model, self.tokenizer = load_causal_lm(model_dir)
        self.model.config._attn_implementation = "sdpa"
        inner = getattr(self.model, "model", None)
        for part in ("embed_tokens", "layers", "norm", "rotary_emb"):
            if not hasattr(inner, part):
                raise TypeError(f"{model_dir}: the reference engine runs Llama-shaped models (model.model.{part} "
                                f"missing in {type(self.model).__name__})")
        self.inner = inner
        cfg = self.model.config
        self.vocab = int(cfg.vocab_size)
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kvh = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.cache = _SlotCache(len(inner.layers), slots, kvh, max_len, hd)
        self.slots, self.max_len = slots, max_len
        self._kw = _cache_kwarg(inner.layers[0])
        self.tap = Tap(self.model, tap_layers) if tap_layers else None
        self.row_dtype = ROW_TORCH_DTYPES[row_dtype]
        self.forwards = 0  # forward calls (prefill and verification alike)

    @property
    def row_bytes(self) -> int:
        if self.tap is None:
            return 0
        return len(self.tap.layers) * self.tap.hidden * torch.finfo(self.row_dtype).bits // 8

    @torch.inference_mode()
    def forward(self, slots: np.ndarray, tokens: torch.Tensor, start: np.ndarray,
                need: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens [B, Q] at positions start[b] .. start[b] + Q - 1 of slots[b] (padding past a query's
        own length is harmless) → (logits [B, Q, V] float32, tapped rows [B, Q, row] or None).
        need [B, Q] bool: the positions whose logits are read (the output projection is most of a
        small model's step; elsewhere the logits are 0)."""
        B, Q = tokens.shape
        s = torch.from_numpy(np.asarray(slots, dtype=np.int64))
        pos = torch.from_numpy(np.asarray(start, dtype=np.int64))[:, None] + torch.arange(Q)[None]
        lk = int(pos.max()) + 1
        if lk > self.max_len:
            raise ValueError(f"position {lk - 1} is past the cache's max_len {self.max_len}")
        self.cache.bind(s, pos, lk)
        mask = torch.arange(lk)[None, None, None, :] <= pos[:, None, :, None]  # [B, 1, Q, lk]: keys 0..p
        h = self.inner.embed_tokens(tokens)
        cos_sin = self.inner.rotary_emb(h, pos)
        tap = self.tap if self.tap is not None else _NoTap()
        with tap:
            for layer in self.inner.layers:
                out = layer(h, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin,
                            **{self._kw: self.cache})
                h = out[0] if isinstance(out, tuple) else out
            h = self.inner.norm(h)
        if need is None or bool(need.all()):  # (a verification of every request's drafts reads them all)
            logits = self.model.lm_head(h).float()
        else:
            logits = torch.zeros(B, Q, self.vocab)
            logits[need] = self.model.lm_head(h[need]).float()
        self.forwards += 1
        return logits, (self.tap.rows(self.row_dtype) if self.tap is not None else None)


class _NoTap:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None
