"""The dspark drafter's rotary embedding: the reference's cos/sin (transformers' Qwen3 rotary over the
checkpoint's layer config; for the default rope type the same figures computed here, so a worker
never imports transformers) for any host positions, and its rotation.

Where the frequencies never change with the positions (every rope type but the dynamic ones) cos/sin
are a product and two functions, computed as the module computes them; a table of them by position,
grown as positions come (at most `TABLE_BYTES`), makes a round's lookup one indexing instead of the
seven operations (docs/dspark.md, "Its cost"). Dynamic rope types call the module itself.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["Rotary", "rope"]

TABLE_BYTES = 16 << 20  # the table of cos/sin by position: 65,536 positions at head_dim 32


def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, out: torch.Tensor | None = None
         ) -> torch.Tensor:
    """The reference's x * cos + rotate_half(x) * sin, in three operations: rotate_half(x) is the halves
    swapped with the first negated, so with that sign moved into `sin_signed` (Rotary.cos_sin) it is a roll."""
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, -1), sin_signed, out=out)


class _DefaultRope:
    """What `Rotary` reads of transformers' rotary module for the "default" rope type, computed as that
    module computes it (`Qwen3RotaryEmbedding.compute_default_rope_parameters`): importing transformers
    costs a worker some 5 s at start, and the default type is the one DSpark checkpoints carry."""

    rope_type = "default"
    attention_scaling = 1.0

    def __init__(self, theta: float, dim: int) -> None:
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))

    def to(self, device: torch.device) -> _DefaultRope:
        self.inv_freq = self.inv_freq.to(device)
        return self


def _default_rope(layer: dict) -> _DefaultRope | None:
    """The default rope of a layer config that states it plainly (`rope_parameters` {rope_type:
    "default", rope_theta}, `head_dim`, no legacy `rope_scaling`), else None: transformers' module then
    reads it."""
    rp = layer.get("rope_parameters")
    if isinstance(rp, dict) and "sliding_attention" in rp:
        rp = rp["sliding_attention"]
    if not isinstance(rp, dict) or rp.get("rope_type") != "default" or layer.get("rope_scaling") is not None:
        return None
    theta, dim = rp.get("rope_theta"), layer.get("head_dim")  # an unstated head_dim: the config class's default
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or isinstance(dim, bool) \
            or not isinstance(dim, int) or dim <= 0:
        return None
    return _DefaultRope(float(theta), dim)


class Rotary:
    """cos/sin by position for one checkpoint's draft layers, on one device."""

    def __init__(self, layer: dict, head_dim: int, device: torch.device) -> None:
        self.device = device
        self._cpu = device.type == "cpu"
        self.module = self._make_module(layer)
        self._inv_freq, self._scale = self._static()
        half = head_dim // 2
        self._half_sign = torch.cat((-torch.ones(half), torch.ones(half))).to(device)
        self._table = torch.zeros(0, 2, head_dim, device=device)  # [P, cos | sin, head_dim]
        self._table_np = self._table.numpy() if self._cpu else None  # the same memory: numpy indexes it faster
        self._rows = 0
        self._cap = max(64, TABLE_BYTES // (8 * head_dim))

    def _make_module(self, layer: dict):
        plain = _default_rope(layer)
        if plain is not None:
            return plain
        from transformers import AutoConfig
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        layer = dict(layer)
        rp = layer.get("rope_parameters")
        if isinstance(rp, dict) and "sliding_attention" in rp:
            layer["rope_parameters"] = rp["sliding_attention"]
        cfg = AutoConfig.for_model(layer.get("model_type", "qwen3")).__class__(**layer)
        return Qwen3RotaryEmbedding(cfg).to(self.device)

    def _static(self) -> tuple[torch.Tensor | None, float]:
        """The module's frequencies and scale when they never change with the positions (None: the
        module itself is called)."""
        kind = str(getattr(self.module, "rope_type", "default"))
        if "dynamic" in kind or "longrope" in kind:
            return None, 1.0
        return self.module.inv_freq.float().to(self.device), float(self.module.attention_scaling)

    def _on_device(self, pos: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(np.ascontiguousarray(pos))
        return x if self._cpu else x.to(self.device)

    def cos_sin(self, pos: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [*pos.shape, head_dim] for int64 host positions of any shape, sin's first half
        negated (what `rope` takes)."""
        pos = np.asarray(pos, dtype=np.int64)
        if self._inv_freq is not None:
            top = int(pos.max(initial=0)) + 1 if int(pos.min(initial=0)) >= 0 else self._cap + 1
            if top > self._rows and self._rows < self._cap:
                rows = min(self._cap, max(top, 2 * self._rows, 64))
                cos, sin = self._computed(torch.arange(rows, device=self.device))
                self._table, self._rows = torch.stack((cos, sin), dim=1).contiguous(), rows
                self._table_np = self._table.numpy() if self._cpu else None
            if top <= self._rows and self._table_np is not None:
                cs = self._table_np[pos]  # one numpy gather: a third of torch's indexing and slicing here
                return torch.from_numpy(cs[..., 0, :]), torch.from_numpy(cs[..., 1, :])
            if top <= self._rows:
                cs = self._table[self._on_device(pos)]
                return cs[..., 0, :], cs[..., 1, :]
            return self._computed(self._on_device(pos))
        p = self._on_device(pos)
        dummy = torch.empty(0, dtype=torch.float32, device=self.device)
        cos, sin = self.module(dummy, p.reshape(1, -1))
        return cos.reshape(*p.shape, -1), (sin * self._half_sign).reshape(*p.shape, -1)

    def _computed(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, sin's first half negated, as the module computes them (one float32 product a
        frequency, the same cat, then its scale)."""
        f = pos.to(torch.float32)[..., None] * self._inv_freq
        emb = torch.cat((f, f), dim=-1)
        cos, sin = emb.cos(), emb.sin().mul_(self._half_sign)
        if self._scale != 1.0:
            cos, sin = cos * self._scale, sin * self._scale
        return cos, sin
