"""Tap extraction through `output_hidden_states` (dspark_proxy/model/taps.py) on tiny random GPT-2,
Llama, Mistral, Qwen2 and Qwen3 models built here (no downloads): id i < L is the input of decoder
layer i, id L the last layer's output before the final norm (transformers 5 gives its last entry after
it), and ids outside the model are refused in one line before any forward."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dspark_proxy.model.taps import HiddenTaps, TapError, check_tap_layers, final_norm  # noqa: E402

pytestmark = pytest.mark.timeout(60)

_KW = dict(vocab_size=97, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48)


def _tiny(arch: str):
    torch.manual_seed(0)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=3, n_head=4, n_positions=64)
        return transformers.GPT2LMHeadModel(cfg).eval()
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[arch]
    return cls[1](cls[0](**_KW, num_key_value_heads=2)).eval()


def _decoder_layers(model):
    base = model.base_model
    return base.h if hasattr(base, "h") else base.layers


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral", "qwen2", "qwen3"])
def test_taps_are_layer_inputs_and_the_last_is_before_the_final_norm(arch):
    model = _tiny(arch)
    ids = torch.randint(0, 97, (2, 9))
    seen: dict[int, torch.Tensor] = {}
    layers = _decoder_layers(model)
    hooks = [layer.register_forward_pre_hook(
        lambda _m, a, kw, i=i: seen.__setitem__(i, a[0] if a else kw["hidden_states"]), with_kwargs=True)
        for i, layer in enumerate(layers)]
    try:
        rows, last, logits = HiddenTaps(model, [0, 1, 2, 3])(ids)
    finally:
        for h in hooks:
            h.remove()
    H = 32
    assert rows.shape == (2, 9, 4 * H) and last.shape == (2, 9, H)
    for i in range(3):
        torch.testing.assert_close(rows[..., i * H:(i + 1) * H], seen[i], rtol=0, atol=0)
    torch.testing.assert_close(rows[..., 3 * H:], last, rtol=0, atol=0)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        normed = final_norm(model)(last)
    # transformers' own last entry is after the final norm; ours is before it
    torch.testing.assert_close(out.hidden_states[-1], normed, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(last, normed)
    torch.testing.assert_close(logits, out.logits)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_tap_ids_outside_the_model_are_one_line(arch):
    model = _tiny(arch)
    for bad, says in (([1, 4], "[4] outside 0..3"), ([-1], "outside 0..3"), ([], "at least one"),
                      ([2, 2], "each id once")):
        with pytest.raises(TapError) as e:
            HiddenTaps(model, bad, where="tiny")
        assert says in str(e.value) and "\n" not in str(e.value)
    assert check_tap_layers(model.config, (0, 3)) == [0, 3]


def test_a_model_without_a_findable_final_norm_is_refused_in_one_line():
    model = _tiny("llama")
    model.model.norm = torch.nn.Identity()  # an Identity is a Module: rename it away instead
    del model.model.norm
    with pytest.raises(TapError) as e:
        HiddenTaps(model, [1], where="tiny")
    assert "no final norm found" in str(e.value) and "\n" not in str(e.value)
