"""A block-local training forward for speculators' `DSparkDraftModel`, equal to its own.

The reference's eager training forward (`DSparkDraftModel.forward` over `_backbone_forward`) attends
with one dense mask over [packed row | every anchor block]: an anchor costs ~(packed length + anchors
x N) key columns, most of them masked. What that mask lets a block's queries see is small: the rows of
the anchor's own document at positions anchor - W .. anchor - 1 (W: the layer's sliding window; all
earlier rows of the document for a full-attention layer) and the N positions of its own block (causal
for a sliding layer unless `sliding_window_non_causal`, else all N). `fast_backbone_forward` gathers
exactly those keys per anchor and runs the reference's own decoder layers on [anchors, N] queries over
[anchors, W + N] keys, with the reference's rotary positions (the rows' own position ids, the block's
anchor position + k): cost linear in anchors.

Everything else is the reference's code: the anchors come from its `select_anchors` (the same random
draw), the targets, the aligned loss mask, the Markov and confidence heads and the loss are its
`DSparkDraftModel.forward`, which `forward` runs with this backbone in place of its own. The trained
weights are therefore the reference's modules; tests/test_dspark_fast.py holds the logits, loss and
gradients to the reference forward's on small random configurations (docs/dspark.md).
"""

from __future__ import annotations

import torch

__all__ = ["fast_backbone_forward", "forward"]


def _context(draft, layer_idx: int, total: int) -> tuple[int, bool]:
    """(context rows a block may see, causal within the block) for one draft layer, as the reference's
    anchor-block mask sets them (speculators' create_anchor_block_mask_mod)."""
    if layer_idx in draft.sliding_window_indices:
        return int(draft.sliding_window), not draft.sliding_window_non_causal
    return total, False  # full attention: every earlier row of the document, never causal


def fast_backbone_forward(draft, hidden_states: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                          verifier_last_hidden_states: torch.Tensor, document_ids: torch.Tensor,
                          position_ids: torch.Tensor | None = None, **kwargs):
    """`DFlashDraftModel._backbone_forward`'s contract (hidden, logits, targets, aligned loss mask,
    anchored block indices) for one packed row [1, T, ...], attention done per anchor block."""
    from speculators.models.dflash.utils import get_base_indices_for_anchored_blocks, select_anchors

    dev = hidden_states.device
    T = hidden_states.shape[1]
    N = draft.block_size
    A = kwargs.pop("max_anchors", 512)
    if position_ids is None:
        position_ids = torch.arange(T, dtype=torch.long, device=dev)[None]
    anchors, valid = select_anchors(loss_mask, A, N)  # the reference's own draw (same RNG use)
    blk = torch.full((A, N), draft.mask_token_id, dtype=torch.long, device=dev)
    blk[:, 0] = input_ids[0, anchors]
    x = draft.embed_tokens(blk)  # [A, N, H]
    ctx_all = draft.hidden_norm(draft.fc(hidden_states))[0]  # [T, H]
    block_idx = get_base_indices_for_anchored_blocks(anchors, N)  # [A * N]

    with torch.no_grad():  # the reference's targets, the verifier's logits at each block position:
        # a row is in up to N blocks, so each row's logits are computed once and gathered
        tgt_idx = block_idx if draft.config.sample_from_anchor else (block_idx - 1) % T
        used, inv = torch.unique(tgt_idx, return_inverse=True)
        targets = draft.verifier_lm_head(draft.verifier_norm(verifier_last_hidden_states[:, used]))[:, inv]

    pos = position_ids[0]
    doc = document_ids[0].to(dev)
    a_doc = doc[anchors]  # [A]
    block_pos = pos[anchors][:, None] + torch.arange(N, device=dev)[None]  # [A, N]
    cache: dict[tuple[int, bool], tuple] = {}
    for li, layer in enumerate(draft.layers):
        W, causal = _context(draft, li, T)
        if (W, causal) not in cache:
            idx = anchors[:, None] - W + torch.arange(W, device=dev)[None]  # rows anchor-W .. anchor-1
            ok = (idx >= 0) & (doc[idx.clamp(min=0)] == a_doc[:, None]) & (a_doc[:, None] != -1)
            idx = idx.clamp(min=0)
            see_blk = torch.ones(N, N, dtype=torch.bool, device=dev)
            if causal:
                see_blk = torch.tril(see_blk)
            see = torch.cat([ok[:, None, :].expand(A, N, W), see_blk[None].expand(A, N, N)], -1)
            mask = torch.zeros(A, 1, N, W + N, dtype=x.dtype, device=dev).masked_fill(~see[:, None], float("-inf"))
            pe = draft.rotary_emb(x, torch.cat([pos[idx], block_pos], 1))  # keys: rows', then the block's
            cache[(W, causal)] = (idx, mask, pe)
        idx, mask, pe = cache[(W, causal)]
        x = layer(hidden_states=x, target_hidden=ctx_all[idx], attention_mask=mask, position_embeddings=pe,
                  use_cache=False, **kwargs)
    hidden = draft.norm(x).reshape(1, A * N, -1)
    logits = draft.lm_head(hidden)
    aligned = loss_mask[:, block_idx] * valid.repeat_interleave(N)[None].to(loss_mask.dtype)
    if not draft.config.sample_from_anchor:
        aligned[:, ::N] = 0
    return hidden, logits, targets, aligned, block_idx


def forward(draft, *args, fast: bool = True, **kwargs):
    """`draft(*args, **kwargs)` (the reference's `DSparkDraftModel.forward`: heads, targets, loss), its
    backbone block-local when `fast`; the reference's dense-mask backbone otherwise."""
    if not fast:
        return draft(*args, **kwargs)
    draft.__dict__["_backbone_forward"] = lambda *a, **k: fast_backbone_forward(draft, *a, **k)
    try:
        return draft(*args, **kwargs)
    finally:
        del draft.__dict__["_backbone_forward"]
