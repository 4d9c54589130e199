"""Tapped hidden states of any Hugging Face causal LM, through the model's own `output_hidden_states`.

The tap ids are speculators' `aux_hidden_state_layer_ids` (docs/dspark.md): id i is entry i of
`output_hidden_states`, the input of decoder layer i (0 = the embeddings), and id L = num_layers is the
last layer's output. transformers 5.x gives entry L after the final norm, while vLLM's auxiliary hidden
states are taken before it, so id L is read at the input of the final norm instead (a forward pre-hook
on it); a model whose final norm cannot be found refuses id L in one line. This works for any
architecture whose forward honours `output_hidden_states` (GPT-2, Llama, Mistral, Qwen2/3 ...), unlike
`hf.Tap`, which reaches into a Llama-layout `.model.layers`.
"""

from __future__ import annotations

import torch

__all__ = ["num_layers", "check_tap_layers", "final_norm", "HiddenTaps", "TapError"]

_NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "final_norm")


class TapError(ValueError):
    """A tap the model cannot give (one line, naming the model and the layer ids)."""


def num_layers(config) -> int:
    """The decoder's layer count (GPT-2 calls it n_layer; its config maps num_hidden_layers onto it)."""
    n = getattr(config, "num_hidden_layers", None)
    if n is None:
        n = getattr(config, "n_layer", None)
    if not isinstance(n, int) or n <= 0:
        raise TapError(f"{type(config).__name__}: no num_hidden_layers in the model's config")
    return n


def check_tap_layers(config, layers: list[int] | tuple[int, ...], where: str = "the target") -> list[int]:
    """The ids as a list, or one line saying why not: each in 0..num_layers, distinct, at least one."""
    n = num_layers(config)
    ids = [int(i) for i in layers]
    if not ids:
        raise TapError(f"tap layers: at least one id for {where} (0..{n})")
    bad = [i for i in ids if not 0 <= i <= n]
    if bad:
        raise TapError(f"tap layers {ids}: {bad} outside 0..{n} ({where} has {n} decoder layers; "
                       f"id {n} is the last layer's output)")
    if len(set(ids)) != len(ids):
        raise TapError(f"tap layers {ids}: each id once")
    return ids


def final_norm(model) -> torch.nn.Module | None:
    """The decoder's final norm module (Llama family: .model.norm; GPT-2: .transformer.ln_f), or None."""
    base = getattr(model, "base_model", None) or model
    for holder in (base, getattr(base, "model", None), getattr(base, "decoder", None)):
        if holder is None:
            continue
        for name in _NORM_NAMES:
            mod = getattr(holder, name, None)
            if isinstance(mod, torch.nn.Module):
                return mod
    return None


class HiddenTaps:
    """Runs the model once over token ids and returns the tapped rows, the last layer's output before
    the final norm, and the logits.

    Checks happen at construction, before any forward: a layer id outside the model or a needed final
    norm that cannot be found raises TapError.
    """

    def __init__(self, model, layers: list[int] | tuple[int, ...], where: str = "the target") -> None:
        self.model = model
        self.n = num_layers(model.config)
        self.layers = check_tap_layers(model.config, layers, where)
        self.hidden = int(model.config.hidden_size)
        self._norm = final_norm(model)
        if self._norm is None:
            raise TapError(f"{type(model).__name__} ({where}): no final norm found (looked for "
                           f"{', '.join(_NORM_NAMES)} on its base model); tap id {self.n} and the "
                           "verifier's last hidden state are read at its input")

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows [B, T, len(layers) x hidden], last [B, T, hidden] before the final norm, logits [B, T, V])."""
        got: list[torch.Tensor] = []

        def pre(_mod, args, kwargs):
            got.append(args[0] if args else kwargs["hidden_states"])

        h = self._norm.register_forward_pre_hook(pre, with_kwargs=True)
        try:
            out = self.model(input_ids, attention_mask=attention_mask, output_hidden_states=True)
        finally:
            h.remove()
        hs = out.hidden_states
        if hs is None or len(hs) != self.n + 1:
            raise TapError(f"{type(self.model).__name__}: output_hidden_states gave "
                           f"{'nothing' if hs is None else len(hs)} entries, not num_layers + 1 = {self.n + 1}")
        if len(got) != 1:
            raise TapError(f"{type(self.model).__name__}: its final norm ran {len(got)} times in one forward")
        last = got[0]
        rows = torch.cat([last if i == self.n else hs[i] for i in self.layers], dim=-1)
        return rows, last, out.logits
