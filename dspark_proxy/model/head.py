"""The DSpark-style draft head: a window of the target's tapped rows and the anchor → N drafts.

Split so that serving pays for each row once (the worker caches `project`'s output per slot):
- `project(rows)`: each row alone → [d (the "last row" term), key, value], RMS-normed per tapped layer
  first (layers differ in scale by orders of magnitude);
- `backbone(cache, dist, mask, anchor, n)`: the first n of N learned queries (shifted by the anchor's
  embedding) attend over the window at once (the parallel backbone; position = distance from the
  anchor, added to the cached keys and values), plus the row next to the anchor and the anchor's
  embedding, then an MLP → [B, n, d];
  With `hops=2` the backbone's output looks at the window once more (a query made from it, the same
  keys and values) and adds what it finds: the first look's queries know the anchor but not the last
  row's content, so position 0 (the one every later draft's acceptance depends on) gains most;
- `step_logits(ctx_j, prev)`: the cheap Markov term, position j conditioned on draft j - 1 (the anchor
  for j = 0) through its embedding and a small MLP, → logits over the draft vocabulary. With
  `step="carry"` position j also adds a linear map of step j - 1's normed hidden state (`step_carry`):
  the backbone's queries all run before any draft exists, so without it position j knows of the drafts
  before it only draft j - 1's embedding, and acceptance fell fastest at the later positions. The output
  matrix is tied to the token embedding; with a draft vocabulary (`set_draft_vocab`) only its rows:
  a small target's greedy output uses few of its tokens, and the output matmul is most of a round's
  cost at one request (the manifest's `draft_vocab` and training record say how many, what share).

Serving and offline measurement run `head_runner.HeadRunner` (numpy, the same weights folded); this
module is the trainable form.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DraftHead", "STEPS"]

STEPS = ("markov", "carry")  # the sequential step's kinds (the manifest's `step`)


def _rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class _Norm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms(x) * self.weight


class DraftHead(nn.Module):
    def __init__(self, *, n_taps: int, hidden: int, window: int, num_spec: int, vocab: int,
                 d_model: int = 192, n_heads: int = 4, step: str = "markov", hops: int = 1) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
        if step not in STEPS:
            raise ValueError(f"step {step!r}: one of {STEPS}")
        if hops not in (1, 2):
            raise ValueError(f"hops {hops!r}: 1 or 2")
        self.step, self.hops = step, hops
        self.n_taps, self.hidden, self.window, self.num_spec = n_taps, hidden, window, num_spec
        self.vocab, self.d, self.h = vocab, d_model, n_heads
        d = d_model
        self.tap_norm = nn.Parameter(torch.ones(n_taps, hidden))
        self.in_proj = nn.Linear(n_taps * hidden, d)
        self.cache_proj = nn.Linear(d, 3 * d, bias=False)  # → last-row term, key, value
        self.pos = nn.Embedding(window, 2 * d)  # key and value offsets by distance from the anchor
        self.queries = nn.Parameter(torch.randn(num_spec, d) * 0.02)
        self.q_tok = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.norm1 = _Norm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.tok = nn.Embedding(vocab, d)
        self.markov = nn.Linear(d, d, bias=False)
        self.norm2 = _Norm(d)
        self.mlp2 = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.out_norm = _Norm(d)
        if step == "carry":  # zero at first: a markov head's weights start it as the same function
            self.carry = nn.Linear(d, d, bias=False)
            nn.init.zeros_(self.carry.weight)
        if hops == 2:  # a second look at the window, its query from the first's output; zero at first too
            self.norm3 = _Norm(d)
            self.q2 = nn.Linear(d, d, bias=False)
            self.o2 = nn.Linear(d, d, bias=False)
            nn.init.zeros_(self.o2.weight)
        self.register_buffer("draft_ids", torch.arange(vocab), persistent=False)  # output rows, target ids

    def set_draft_vocab(self, ids: torch.Tensor | None) -> None:
        """Draft only these target ids (saved with the weights as `draft_ids`); None: every id."""
        if ids is None:
            self.draft_ids = torch.arange(self.vocab)
            return
        ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.ndim != 1 or len(ids) == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.vocab:
            raise ValueError(f"draft vocabulary: 1..{self.vocab} ids in 0..{self.vocab - 1}")
        if len(torch.unique(ids)) != len(ids):
            raise ValueError("draft vocabulary has repeated ids")
        self.draft_ids = ids.clone()

    @property
    def draft_vocab(self) -> int:
        """0 when the head drafts over the whole vocabulary (the manifest's `draft_vocab`)."""
        return 0 if len(self.draft_ids) == self.vocab else len(self.draft_ids)

    @property
    def cache_width(self) -> int:
        return 3 * self.d

    def project(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [..., n_taps * hidden] float → [..., 3d], one row at a time (what a slot caches)."""
        x = rows.unflatten(-1, (self.n_taps, self.hidden))
        x = (_rms(x) * self.tap_norm).flatten(-2)
        return self.cache_proj(self.in_proj(x))

    def backbone(self, cache: torch.Tensor, mask: torch.Tensor, anchor: torch.Tensor, n: int) -> torch.Tensor:
        """cache [B, W, 3d] right-aligned (index W-1 next to the anchor), mask [B, W] true where a row
        exists (at least the last), anchor [B] token ids → [B, n, d] for draft positions 0..n-1."""
        B, L, _ = cache.shape
        d, H = self.d, self.h
        last, kv = cache[:, -1, :d], cache[:, :, d:]
        kv = kv + self.pos.weight[:L].flip(0)[None]  # distance L-1 .. 0
        k, v = kv[..., :d], kv[..., d:]
        e = self.tok(anchor)
        q = self.queries[:n][None] + self.q_tok(e)[:, None]  # [B, n, d]
        qh = q.unflatten(-1, (H, d // H)).transpose(1, 2)  # [B, H, n, dh]
        kh = k.unflatten(-1, (H, d // H)).transpose(1, 2)
        vh = v.unflatten(-1, (H, d // H)).transpose(1, 2)
        m = mask[:, None, None, :]
        att = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=m)
        ctx = self.o(att.transpose(1, 2).flatten(-2)) + (last + e)[:, None]
        ctx = ctx + self.mlp(self.norm1(ctx))
        if self.hops == 2:
            q2 = self.q2(self.norm3(ctx)).unflatten(-1, (H, d // H)).transpose(1, 2)
            att = torch.nn.functional.scaled_dot_product_attention(q2, kh, vh, attn_mask=m)
            ctx = ctx + self.o2(att.transpose(1, 2).flatten(-2))
        return ctx

    def step_logits(self, ctx_j: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """ctx_j [..., d], prev [...] token ids (draft j - 1) → logits [..., len(draft_ids)] (column c is
        target id draft_ids[c]); position 0 of a carry head (no step before it)."""
        return self.step_carry(ctx_j, prev, None)[0]

    def step_carry(self, ctx_j: torch.Tensor, prev: torch.Tensor, carry: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One position: (logits, the carry for the next position; None for a markov head). carry:
        the previous position's (None at position 0)."""
        z = ctx_j + self.markov(self.tok(prev))
        if carry is not None:
            z = z + carry
        z = z + self.mlp2(self.norm2(z))
        w = self.tok.weight if self.draft_vocab == 0 else self.tok.weight[self.draft_ids]
        r = _rms(z)
        nxt = self.carry(r) if self.step == "carry" else None
        return (r * self.out_norm.weight) @ w.T, nxt

    def steps(self, ctx: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits of every position: ctx [B, n, d], prev [B, n] (the true draft j - 1)
        → [B, n, len(draft_ids)]."""
        if self.step == "markov":
            return self.step_logits(ctx, prev)
        out, carry = [], None
        for j in range(ctx.shape[1]):
            lg, carry = self.step_carry(ctx[:, j], prev[:, j], carry)
            out.append(lg)
        return torch.stack(out, 1)

    def init_from_target(self, embed: torch.Tensor) -> None:
        """Start the tied embedding from the target's (same vocabulary, same width only)."""
        if tuple(embed.shape) == tuple(self.tok.weight.shape):
            with torch.no_grad():
                self.tok.weight.copy_(embed)
