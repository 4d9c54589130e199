"""Deciding what a verification forward finalises: greedy acceptance and rejection sampling.

Both take the target's logits at the anchor and each draft ([B, Q, V], position j predicts the
token after the anchor's j-th successor) and the drafts a request verifies (`k[b]` of them), and
return how many drafts each request accepted (`m`) and the tokens it emits: m + 1 of them, the
accepted drafts then one token of the target's own (the bonus after a full match, else the
correction). Vectorised over the batch; no per-request Python.

Sampled mode is the standard speculative sampling rule, lossless for any proposal the draft was
really drawn from: draft j is accepted with probability min(1, p_j(d_j) / q_j(d_j)); the first
rejected position draws from norm(max(0, p_j - q_j)); after k acceptances the bonus draws from p_k.
q_j is the reply's top-32 support and probabilities; a draft that came without them (greedy) is a
point mass, q_j = onehot(d_j).
"""

from __future__ import annotations

import torch

__all__ = ["accept_greedy", "accept_sampled", "Verdict"]


class Verdict:
    """m [B] drafts accepted; tokens [B, Q] (the first m + 1 are emitted; the rest is padding)."""

    __slots__ = ("m", "tokens")

    def __init__(self, m: torch.Tensor, tokens: torch.Tensor) -> None:
        self.m, self.tokens = m, tokens


def _prefix_len(ok: torch.Tensor) -> torch.Tensor:
    """Length of each row's leading run of True ([B, K] → [B])."""
    if ok.shape[1] == 0:
        return torch.zeros(ok.shape[0], dtype=torch.long)
    return ok.long().cumprod(1).sum(1)


def accept_greedy(logits: torch.Tensor, drafts: torch.Tensor, k: torch.Tensor) -> Verdict:
    """drafts [B, Q-1] (-1 padding), k [B] drafts verified. The emitted tokens are the target's own
    argmax at positions 0..m: identical to what one-token greedy decoding produces."""
    target = logits.argmax(-1)  # [B, Q]
    K = drafts.shape[1]
    live = torch.arange(K)[None] < k[:, None]
    m = _prefix_len((drafts == target[:, :K]) & live)
    return Verdict(m, target)


def accept_sampled(logits: torch.Tensor, temperature: torch.Tensor, drafts: torch.Tensor, k: torch.Tensor,
                   support: torch.Tensor | None, q: torch.Tensor | None, gen: torch.Generator) -> Verdict:
    """temperature [B] (> 0), drafts [B, K], k [B]; support [B, K, S] ids (-1 padding) and q [B, K, S]
    the proposal each draft was drawn from, or None (every draft a point mass)."""
    B, Q, V = logits.shape
    K = drafts.shape[1]
    p = torch.softmax(logits / temperature[:, None, None], dim=-1)  # [B, Q, V]
    qf = torch.zeros(B, K, V)
    d = drafts.clamp(min=0)
    if support is not None and q is not None:
        qf.scatter_add_(2, support.clamp(min=0).long(), torch.where(support >= 0, q, torch.zeros_like(q)))
    point = qf.sum(-1) <= 0  # no proposal given for this draft: a point mass at it
    qf[point] = 0.0
    qf.view(B * K, V)[torch.nonzero(point.flatten()).flatten(), d.flatten()[point.flatten()]] = 1.0
    pd = p[:, :K].gather(2, d[..., None])[..., 0]
    qd = qf.gather(2, d[..., None])[..., 0]
    u = torch.rand(B, K, generator=gen)
    live = torch.arange(K)[None] < k[:, None]
    ok = live & (qd > 0) & (u * qd <= pd)  # u < p/q, without dividing by a tiny q
    m = _prefix_len(ok)
    rows = torch.arange(B)
    pm = p[rows, m]  # the target's distribution at the first position not accepted
    rejected = m < k
    if bool(rejected.any()):
        resid = (pm - qf[rows, m.clamp(max=max(K - 1, 0))]).clamp(min=0.0) if K else pm
        has = resid.sum(-1) > 0
        pm = torch.where((rejected & has)[:, None], resid, pm)
    last = torch.multinomial(pm / pm.sum(-1, keepdim=True), 1, generator=gen)[:, 0]
    tokens = torch.zeros(B, Q, dtype=torch.long)
    tokens[:, :K] = d
    tokens[rows, m] = last
    return Verdict(m, tokens)
