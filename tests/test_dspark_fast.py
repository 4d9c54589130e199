"""The block-local DSpark training forward (dspark_proxy/model/dspark_fast.py) held to the reference's
own `DSparkDraftModel.forward` (dense eager anchor-block mask over the packed row): same anchors, same
backbone outputs (hidden, logits, targets, aligned loss mask), same loss and metrics, same gradients,
on small random heads of every Markov head type, with and without the confidence head, sampling from
the anchor or not, sliding and full-attention layers, causal and non-causal blocks, grouped KV heads,
several documents packed, documents shorter and longer than the window, and padded (unused) anchors."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("speculators")

from dspark_proxy.model.dspark_fast import fast_backbone_forward, forward  # noqa: E402

pytestmark = pytest.mark.timeout(120)

TOL = 1e-4
TARGET = Path(__file__).resolve().parent.parent / "models" / "stdlib-llama"  # a verifier config on disk


def _draft(*, window=4, N=3, markov="vanilla", rank=8, confidence=True, sfa=True, non_causal=False,
           layer_types=("sliding_attention",), kv_heads=4, seed=0):
    from speculators.models.dspark import DSparkDraftModel
    from transformers import LlamaConfig

    from dspark_proxy.model.dspark_head import build_dspark

    tcfg = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                       num_key_value_heads=4, num_hidden_layers=2, max_position_embeddings=256)
    cfg = build_dspark(tcfg, verifier_path=str(TARGET), layers=[0, 1], num_spec=N, window=window,
                       markov_rank=rank, markov_head_type=markov, mask_token_id=1, confidence=confidence).config
    tl = cfg.transformer_layer_config
    tl.layer_types, tl.num_hidden_layers, tl.num_key_value_heads = list(layer_types), len(layer_types), kv_heads
    cfg.sample_from_anchor, cfg.sliding_window_non_causal = sfa, non_causal
    torch.manual_seed(seed)
    draft = DSparkDraftModel(cfg)
    with torch.no_grad():  # every weight random (verifier-owned ones and norms too: none trivially 1)
        for n, p in draft.named_parameters():
            p.copy_(torch.randn_like(p) * (0.1 if n.endswith("norm.weight") else 0.3) + n.endswith("norm.weight"))
    return draft.train()


def _row(lengths, H=32, layers=2, V=61, seed=1):
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    rows = torch.randn(1, T, layers * H, generator=g)
    ids = torch.randint(0, V, (1, T), generator=g)
    last = torch.randn(1, T, H, generator=g)
    doc = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])[None]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    lm = (torch.rand(1, T, generator=g) > 0.2).float()
    return rows, ids, lm, last, doc, pos


def _kw(anchors):
    from speculators.models.dspark import DSparkDraftModel

    kw, _ = DSparkDraftModel.get_trainer_kwargs(loss_fn="kl_div", loss_implementation="eager")
    return {**kw, "max_anchors": anchors}


def _run(draft, batch, anchors, fast):
    draft.zero_grad(set_to_none=True)
    torch.manual_seed(123)  # select_anchors draws with torch's RNG: the same anchors both ways
    _, loss, metrics = forward(draft, *batch, fast=fast, **_kw(anchors))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None}
    return loss.detach(), metrics, grads


def _backbones(draft, batch, anchors):
    torch.manual_seed(7)
    ref = draft._backbone_forward(*batch, max_anchors=anchors)
    torch.manual_seed(7)
    fast = fast_backbone_forward(draft, *batch, max_anchors=anchors)
    return ref, fast


def _max_diff(a, b) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max())


CASES = [
    dict(),
    dict(markov="gated", confidence=False),
    dict(markov="rnn", sfa=False),
    dict(rank=0, confidence=False, non_causal=True),
    dict(layer_types=("sliding_attention", "full_attention"), kv_heads=2, markov="gated"),
    dict(window=8, N=4, sfa=False, non_causal=True, confidence=False),
]


@pytest.mark.parametrize("case", CASES, ids=[",".join(f"{k}={v}" for k, v in c.items()) or "default" for c in CASES])
def test_fast_forward_equals_the_reference(case):
    draft = _draft(**case)
    N = draft.block_size
    # documents shorter and longer than the window, packed; anchors: a sample, or (every other case)
    # more than the valid positions (the rest padded at position 0, as the reference pads them)
    batch = _row([3, 11, 6, 20])
    for anchors in ((9, 60) if case == {} else (9,) if CASES.index(case) % 2 else (60,)):
        ref, fast = _backbones(draft, batch, anchors)
        for name, r, f in zip(("hidden", "logits", "targets", "loss mask", "block indices"), ref, fast, strict=True):
            assert r.shape == f.shape, name
            assert _max_diff(r, f) <= TOL, (name, _max_diff(r, f))
        lr, mr, gr = _run(draft, batch, anchors, fast=False)
        lf, mf, gf = _run(draft, batch, anchors, fast=True)
        assert abs(float(lr) - float(lf)) <= TOL, (float(lr), float(lf))
        assert set(gr) == set(gf) and len(gr) > 5
        for n in gr:
            assert _max_diff(gr[n], gf[n]) <= TOL, (n, _max_diff(gr[n], gf[n]))
        for k in mr:
            if torch.is_tensor(mr[k]) and mr[k].is_floating_point():
                assert _max_diff(mr[k], mf[k]) <= TOL, k
    assert N == draft.block_size


def test_window_and_documents_matter_to_the_comparison():
    """The comparison can fail: the fast path with the window one row too wide, or blind to document
    boundaries, differs from the reference on this packed row."""
    import dspark_proxy.model.dspark_fast as fast_mod

    draft = _draft(window=4)
    batch = _row([3, 11, 6, 20])
    ref, fast = _backbones(draft, batch, 30)
    assert _max_diff(ref[1], fast[1]) <= TOL
    orig = fast_mod._context
    try:
        fast_mod._context = lambda d, li, T: (orig(d, li, T)[0] + 1, orig(d, li, T)[1])
        ref, fast = _backbones(draft, batch, 30)
        assert _max_diff(ref[1], fast[1]) > 1e-2
    finally:
        fast_mod._context = orig
    one_doc = (*batch[:4], torch.zeros_like(batch[4]), batch[5])  # documents merged: other context
    torch.manual_seed(7)
    merged = fast_backbone_forward(draft, *one_doc, max_anchors=30)
    assert _max_diff(ref[1], merged[1]) > 1e-2
