"""A DSpark head in speculators 0.9.0's own format, built, filled from the target and drafted offline.

The model is the reference library's `DSparkDraftModel` (a test dependency, imported only here), so
what `train-drafter --arch dspark` saves loads with its own `from_pretrained` and vLLM 0.32's DSpark
config checks (docs/dspark.md). The draft layers are Qwen3 layers with sliding attention over the
last W context rows (`sliding_window` = W), so training sees the rows the worker serves from. The
embedding, lm_head and final-norm copy come from the target object itself (not by tensor names in its
files), which works for any architecture; speculators saves none of them for a full draft vocabulary.

`greedy_drafts` drafts every anchor of a sequence at once with the reference model's own modules (its
projection, norms, layers, lm_head and Markov head), feeding each draft back as the Markov head's
previous token, as vLLM's DSpark speculator does: the offline acceptance the trainer reports.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

__all__ = ["build_dspark", "fill_from_target", "greedy_drafts", "num_spec_of", "load_dspark"]


def num_spec_of(cfg) -> int:
    """Drafts per round: block_size when sampling from the anchor, else block_size - 1."""
    return int(cfg.block_size) if cfg.sample_from_anchor else int(cfg.block_size) - 1


def build_dspark(target_cfg, *, verifier_path: str, layers: list[int], num_spec: int, window: int,
                 draft_layers: int = 1, intermediate: int | None = None, heads: int | None = None,
                 markov_rank: int = 64, markov_head_type: str = "vanilla", mask_token_id: int = 0,
                 confidence: bool = True, draft_vocab: int = 0):
    """A fresh DSparkDraftModel for a target config (embedding, lm_head not yet filled; with a
    `draft_vocab`, its maps not yet loaded either: load_vocab_mappings)."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import Qwen3Config

    hidden = int(target_cfg.hidden_size)
    n_heads = heads or int(getattr(target_cfg, "num_attention_heads", None) or target_cfg.n_head)
    if hidden % n_heads:
        raise ValueError(f"--draft-heads {n_heads}: must divide the target's hidden size {hidden}")
    rope = getattr(target_cfg, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    tl = Qwen3Config(vocab_size=int(target_cfg.vocab_size), hidden_size=hidden,
                     intermediate_size=int(intermediate or getattr(target_cfg, "intermediate_size", None) or 4 * hidden),
                     num_hidden_layers=draft_layers, num_attention_heads=n_heads, num_key_value_heads=n_heads,
                     head_dim=hidden // n_heads, rms_norm_eps=1e-6,
                     max_position_embeddings=int(getattr(target_cfg, "max_position_embeddings", None)
                                                 or getattr(target_cfg, "n_positions", 2048)),
                     layer_types=["sliding_attention"] * draft_layers, sliding_window=window,
                     use_sliding_window=True, rope_parameters=dict(rope), tie_word_embeddings=False)
    tl._attn_implementation = "eager"  # the default compiles with inductor; eager runs anywhere
    cfg = DSparkSpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=int(draft_vocab or target_cfg.vocab_size), block_size=num_spec,
        aux_hidden_state_layer_ids=list(layers), mask_token_id=int(mask_token_id), sample_from_anchor=True,
        markov_rank=markov_rank, markov_head_type=markov_head_type, enable_confidence_head=confidence,
        confidence_head_with_markov=confidence and markov_rank > 0, target_hidden_size=hidden,
        speculators_config=SpeculatorsConfig(
            algorithm="dspark", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=num_spec)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=verifier_path,
                                    architectures=list(getattr(target_cfg, "architectures", None) or []))))
    return DSparkDraftModel(cfg)


@torch.no_grad()
def fill_from_target(draft, target) -> None:
    """The verifier-owned weights from the loaded target: embedding, lm_head (the draft's and the
    verifier's copy; for a draft vocabulary, its rows, as the reference's own loader takes them: load
    the maps first). Training compares against the target's own logits, so the verifier norm is not
    used (the trainer feeds the last hidden state after the final norm with an identity in its place)."""
    emb = target.get_input_embeddings().weight
    head = target.get_output_embeddings()
    head = emb if head is None else head.weight
    if draft.use_draft_vocab:
        head = head[draft.t2d.to(device=head.device, dtype=torch.bool)]
    draft.embed_tokens.weight.copy_(emb.float())
    draft.lm_head.weight.copy_(head.float())
    draft.verifier_lm_head.weight.copy_(head.float())
    draft.verifier_norm.weight.fill_(1.0)


def load_dspark(path: str | Path, verifier: str | Path | None = None):
    """The reference's own from_pretrained, eager attention (the verifier's weights load from the path
    the checkpoint names, relative to the working directory; `verifier`: from that target directory
    instead, as the worker's --target does)."""
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig

    cfg = DSparkSpeculatorConfig.from_pretrained(str(path))
    if verifier is not None:
        cfg.speculators_config.verifier.name_or_path = str(verifier)
    cfg.transformer_layer_config._attn_implementation = "eager"  # before the model is built: its masks
    return DSparkDraftModel.from_pretrained(str(path), config=cfg).eval()


@torch.no_grad()
def greedy_drafts(draft, rows: torch.Tensor, toks: torch.Tensor, anchors: torch.Tensor,
                  chunk: int = 256) -> torch.Tensor:
    """Greedy drafts [A, N] for anchors of one sequence: rows [T, k x H] (the target's tapped rows,
    float), toks [T]; anchor a reads rows max(0, a - W) .. a - 1 and its token toks[a]."""
    cfg = draft.config
    W = int(draft.sliding_window or cfg.transformer_layer_config.sliding_window)
    B = int(draft.block_size)
    sfa = bool(cfg.sample_from_anchor)
    ctx_all = draft.hidden_norm(draft.fc(rows.float()))  # [T, H]
    H = ctx_all.shape[-1]
    pad = torch.cat([ctx_all.new_zeros(W, H), ctx_all])  # row t at t + W
    have = torch.cat([torch.zeros(W, dtype=torch.bool), torch.ones(len(rows), dtype=torch.bool)])
    outs = []
    for c in range(0, len(anchors), chunk):
        a = anchors[c:c + chunk]
        n = len(a)
        idx = a[:, None] + torch.arange(W)[None]  # padded rows a .. a+W-1 = rows a-W .. a-1
        ctx, ok = pad[idx], have[idx]  # [n, W, H], [n, W]
        blk = torch.full((n, B), draft.mask_token_id, dtype=torch.long)
        blk[:, 0] = toks[a]
        x = draft.embed_tokens(blk)
        pos = torch.cat([a[:, None] - W + torch.arange(W)[None], a[:, None] + torch.arange(B)[None]], 1)
        pe = draft.rotary_emb(x, pos)
        neg = torch.finfo(torch.float32).min
        full = torch.cat([ok[:, None, :].expand(n, B, W), torch.ones(n, B, B, dtype=torch.bool)], -1)
        causal = full.clone()
        causal[:, :, W:] = torch.tril(torch.ones(B, B, dtype=torch.bool))
        for li, layer in enumerate(draft.layers):
            m = causal if (li in draft.sliding_window_indices and not draft.sliding_window_non_causal) else full
            mask = torch.zeros(n, 1, B, W + B).masked_fill(~m[:, None], neg)
            x = layer(hidden_states=x, target_hidden=ctx, attention_mask=mask, position_embeddings=pe)
        hid = draft.norm(x)
        logits = draft.lm_head(hid)  # [n, B, V']
        d2t = draft.d2t if draft.use_draft_vocab else None
        prev = toks[a]
        got = []
        for k in range(B):
            if not sfa and k == 0:
                continue
            lk = logits[:, k]
            if draft.markov_head is not None:
                if draft.markov_head.head_type == "rnn":
                    raise ValueError("greedy_drafts: markov_head_type 'rnn' is not drafted here")
                lk = lk + draft.markov_head.block_bias(prev_token_ids=prev[:, None], hidden_states=hid[:, k:k + 1])[:, 0]
            d = lk.argmax(-1)
            if d2t is not None:
                d = d + d2t[d]  # speculators' d2t holds target id - draft id
            got.append(d)
            prev = d
        outs.append(torch.stack(got, 1))
    return torch.cat(outs) if outs else torch.zeros(0, num_spec_of(cfg), dtype=torch.long)


def _walk(toks: np.ndarray, start: int, N: int, drafts: np.ndarray, stats) -> None:
    """accept.walk_rounds over one sequence, drafts[a - start] the N drafts at anchor a."""
    a = start
    while a + N < len(toks):
        match = drafts[a - start] == toks[a + 1:a + 1 + N]
        k = int(N if match.all() else np.argmin(match))
        stats.add(k)
        a += k + 1


def acceptance(draft, seqs: list[tuple[np.ndarray, torch.Tensor, int]]) -> dict:
    """Mean accepted drafts a round along held-out greedy generations (toks, rows, first generated
    position), walked as a speculative decoder walks them (accept.walk_rounds), beside prompt lookup."""
    from .accept import AcceptStats, ngram_drafts

    N = num_spec_of(draft.config)
    hs, ns = AcceptStats(N), AcceptStats(N)
    for toks, rows, start in seqs:
        T = len(toks)
        if start + N >= T:
            continue
        anchors = torch.arange(start, T - N)
        dr = greedy_drafts(draft, rows, torch.from_numpy(toks), anchors).numpy()
        ng = np.stack([ngram_drafts(toks[:a + 1], N) for a in range(start, T - N)])
        _walk(toks, start, N, dr, hs)
        _walk(toks, start, N, ng, ns)
    return {**hs.as_dict(), "mean_accepted_ngram": round(ns.mean, 4),
            "accept_by_position_ngram": ns.as_dict()["accept_by_position"], "num_spec": N}
