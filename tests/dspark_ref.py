"""The reference for the dspark drafter's tests: small random-weight DSpark speculators built and saved
with `speculators` 0.9.0 itself, and drafts from a loop over the reference model's own modules (its
fc, norms, decoder layers, lm_head, markov_head, confidence_head) that feeds each drafted token back,
as vLLM's DSpark speculator drafts. speculators is a test dependency (scripts/setup.sh): these imports
fail, never skip, when it is missing."""

from __future__ import annotations

from pathlib import Path

import torch
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config

VOCAB, HIDDEN, TARGET_LAYERS = 256, 32, 4
TAPS = [1, 2, 4]


def make_target(d: Path) -> Path:
    """A tiny random Llama target, saved as Hugging Face saves it."""
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=TARGET_LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB)
    LlamaForCausalLM(cfg).save_pretrained(str(d))
    return d


def make_head(d: Path, target: Path, *, markov: str = "vanilla", rank: int = 8, confidence: bool = True,
              with_markov: bool = True, sample_from_anchor: bool = True, draft_vocab: int = 64,
              block_size: int = 4, sliding_window: int | None = 6, n_layers: int = 2, seed: int = 1,
              non_causal: bool = False, attention_bias: bool = False, rope: dict | None = None) -> DSparkDraftModel:
    """A random-weight DSpark speculator for `target`, saved with its own save_pretrained into d."""
    torch.manual_seed(seed)
    types = ["sliding_attention" if sliding_window else "full_attention"] * n_layers
    tl = Qwen3Config(hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=n_layers, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, vocab_size=VOCAB, layer_types=types,
                     sliding_window=sliding_window, use_sliding_window=bool(sliding_window),
                     max_window_layers=n_layers, rms_norm_eps=1e-6, attention_bias=attention_bias,
                     **({"rope_parameters": rope} if rope else {}))
    tl._attn_implementation = "eager"
    n = block_size if sample_from_anchor else block_size - 1
    cfg = DSparkSpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=draft_vocab, block_size=block_size,
        aux_hidden_state_layer_ids=TAPS, mask_token_id=VOCAB - 1, target_hidden_size=HIDDEN,
        markov_rank=rank, markov_head_type=markov, enable_confidence_head=confidence,
        confidence_head_with_markov=with_markov, sample_from_anchor=sample_from_anchor,
        sliding_window_non_causal=non_causal,
        speculators_config=SpeculatorsConfig(
            algorithm="dspark", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=n)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(target), architectures=["LlamaForCausalLM"])))
    m = DSparkDraftModel(cfg)
    with torch.no_grad():  # weights of a useful scale (the default init makes the Markov bias ~0)
        for name, p in m.named_parameters():
            if "markov" in name or "confidence" in name or name.endswith("proj.bias"):
                p.normal_(0, 0.5)
    if draft_vocab != VOCAB:
        t2d = torch.zeros(VOCAB, dtype=torch.bool)
        t2d[torch.randperm(VOCAB)[:draft_vocab]] = True
        keep = torch.nonzero(t2d).squeeze(-1)
        m.load_vocab_mappings(t2d, keep - torch.arange(draft_vocab))
    m.load_verifier_weights()
    m.save_pretrained(str(d))
    return m.eval()


@torch.no_grad()
def reference_drafts(m: DSparkDraftModel, rows: torch.Tensor, anchor: int, n: int, given: list[int] | None = None,
                     start: int = 0):
    """Drafts, the logits each was chosen from and confidences for one request whose context is `rows`
    [T, taps*H] at positions start..start+T-1 and whose anchor token sits at position start+T. `given`:
    feed these tokens back instead of the argmax (to check a sampled reply's q)."""
    c = m.config
    T, bs = rows.shape[0], c.block_size
    sw = m.sliding_window
    ctx = m.hidden_norm(m.fc(rows[None]))
    tok = torch.full((1, bs), c.mask_token_id, dtype=torch.long)
    tok[0, 0] = anchor
    x = m.embed_tokens(tok)
    pos = start + torch.cat([torch.arange(T), T + torch.arange(bs)])[None]
    cos, sin = m.rotary_emb(x, pos)
    masks = []
    for i in range(len(m.layers)):
        sliding = i in m.sliding_window_indices
        ok = torch.zeros(bs, T + bs, dtype=torch.bool)
        lo = max(0, T - sw) if sliding and sw else 0
        ok[:, lo:T] = True
        blk = torch.ones(bs, bs, dtype=torch.bool)
        if sliding and not c.sliding_window_non_causal:
            blk = torch.tril(blk)
        ok[:, T:] = blk
        f = torch.zeros(bs, T + bs).masked_fill(~ok, float("-inf"))
        masks.append(f[None, None])
    for i, layer in enumerate(m.layers):
        x = layer(hidden_states=x, target_hidden=ctx, attention_mask=masks[i], position_ids=pos,
                  position_embeddings=(cos, sin))
    hidden = m.norm(x)
    base = m.lm_head(hidden)
    off = 0 if c.sample_from_anchor else 1
    d2t = m.d2t
    drafts, logits_out, conf = [], [], []
    prev = [anchor] * (off + 1)
    for j in range(n):
        slot = j + off
        logits = base[0, slot]
        emb = None
        if m.markov_head is not None:
            ids = torch.tensor([prev])
            emb = m.markov_head.prev_embeddings(ids)
            bias = m.markov_head.block_bias(prev_token_ids=ids, hidden_states=hidden[:, :slot + 1], prev_emb=emb)
            logits = logits + bias[0, -1]
        d = int(torch.argmax(logits)) if given is None else None
        tid = (d + int(d2t[d]) if d2t is not None else d) if d is not None else given[j]
        if m.confidence_head is not None:
            feat = hidden[0, slot]
            if c.confidence_head_with_markov:
                feat = torch.cat([feat, emb[0, -1]])
            conf.append(float(torch.sigmoid(m.confidence_head(feat[None]))[0]))
        drafts.append(tid)
        logits_out.append(logits)
        prev.append(tid)
    return drafts, torch.stack(logits_out), conf
