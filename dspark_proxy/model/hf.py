"""Loading a local Hugging Face causal LM, naming it, and tapping its hidden states.

Any directory that `AutoModelForCausalLM.from_pretrained` reads works (the shipped stdlib-llama is one).
The target's identity is a hash of its config and weight files, so a head trained for one target is
refused by another of the same shape. The tap is defined on the residual stream, as vLLM's auxiliary
hidden states are: tap layer i is the input of decoder layer i (0 = the embeddings); i = num_layers is
the last layer's output, before the final norm. A row is the tapped vectors concatenated, in the
manifest's dtype.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path

import torch

__all__ = ["load_causal_lm", "target_id", "Tap", "TAP_POINT", "greedy_generate"]

TAP_POINT = "residual stream at the input of decoder layer i; i = num_layers: last layer output, before the final norm"

_WEIGHT_SUFFIXES = (".safetensors", ".bin")


def load_causal_lm(path: str | Path, dtype: torch.dtype = torch.float32):
    """(model in eval mode, tokenizer) from a local directory; never reaches a hub."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{p}: not a Hugging Face model directory (no config.json)")
    try:
        model = AutoModelForCausalLM.from_pretrained(p, dtype=dtype, local_files_only=True)
    except TypeError:  # transformers < 4.56 calls it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(p, torch_dtype=dtype, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(p, local_files_only=True)
    return model.eval(), tok


def target_id(path: str | Path) -> str:
    """sha256 over the canonical config and every weight file's bytes, in name order."""
    p = Path(path)
    h = hashlib.sha256()
    cfg = json.loads((p / "config.json").read_text())
    for k in ("transformers_version", "_name_or_path"):  # bookkeeping, not the model
        cfg.pop(k, None)
    h.update(json.dumps(cfg, sort_keys=True).encode())
    files = sorted(f for f in p.iterdir() if f.name.endswith(_WEIGHT_SUFFIXES))
    if not files:
        raise FileNotFoundError(f"{p}: no weight files")
    for f in files:
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return "sha256:" + h.hexdigest()


def _decoder(model):
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "norm"):
        raise TypeError(f"{type(model).__name__}: expected a decoder with .model.layers and .model.norm")
    return inner


class Tap:
    """Captures the tapped residual-stream vectors of every forward while active (a context manager)."""

    def __init__(self, model, layers: list[int]) -> None:
        inner = _decoder(model)
        n = len(inner.layers)
        if not layers or any(not 0 <= i <= n for i in layers):
            raise ValueError(f"tap layers {layers}: each must be in 0..{n}")
        self.layers = list(layers)
        self.hidden = int(model.config.hidden_size)
        self._inner = inner
        self._n = n
        self._got: dict[int, torch.Tensor] = {}
        self._handles: list = []

    def _hook(self, i: int):
        def pre(_mod, args, kwargs):
            self._got[i] = args[0] if args else kwargs["hidden_states"]
        return pre

    def __enter__(self) -> Tap:
        for i in set(self.layers):
            mod = self._inner.norm if i == self._n else self._inner.layers[i]
            self._handles.append(mod.register_forward_pre_hook(self._hook(i), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def rows(self, dtype: torch.dtype) -> torch.Tensor:
        """[B, T, len(layers) * hidden] of the last forward, tapped layers in manifest order."""
        return torch.cat([self._got[i] for i in self.layers], dim=-1).to(dtype)


def _cache_kw(model) -> str:
    """transformers 5.x names the KV cache `cache`; 4.x `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def greedy_generate(model, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation of equal-length prompts [B, P] → [B, P + new_tokens], with a KV cache."""
    kw = _cache_kw(model)
    out = model(prompts, use_cache=True)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    seq = [prompts, nxt]
    for _ in range(new_tokens - 1):
        out = model(nxt, use_cache=True, **{kw: getattr(out, kw)})
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        seq.append(nxt)
    return torch.cat(seq, dim=1)
