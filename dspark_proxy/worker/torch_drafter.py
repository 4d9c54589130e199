"""The `torch` drafter: a small DSpark-style draft head (SPEC §6). Imported only when chosen.

Shape of the head, after DSpark's: the window's rows (the target's tapped hidden states) are projected
to a small width and read by N learned queries in parallel (one attention over the window: the
"parallel backbone"); a Markov head then produces position j's logits from backbone output j and the
embedding of draft j-1 (the anchor for j = 0), so drafts are decoded left to right at the cost of a
tiny matmul each. Rows are read as bfloat16 features when row_bytes is even (5 × 7168 bf16 in
production), else as bytes. Greedy drafts with their softmax probability as confidence; margin is
top1 - top2; in sampled mode, for requests with temperature > 0, the top-32 support of the tempered
distribution and its renormalised probabilities q, with the draft drawn from q by a generator seeded
from (seed, anchor_pos, j), so a replay gives the same draft.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..wire import TOP_K, ReplyWriter
from .drafters import DraftItem

__all__ = ["DraftHead", "TorchDrafter"]


class DraftHead(nn.Module):
    def __init__(self, d_in: int, window: int, num_spec: int, *, d_model: int = 64, vocab: int = 4096) -> None:
        super().__init__()
        self.vocab = vocab
        self.in_proj = nn.Linear(d_in, d_model)
        self.pos = nn.Embedding(window, d_model)  # position counted back from the anchor
        self.queries = nn.Parameter(torch.zeros(num_spec, d_model))
        self.k = nn.Linear(d_model, d_model, bias=False)
        self.v = nn.Linear(d_model, d_model, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))
        self.tok = nn.Embedding(vocab, d_model)
        self.markov = nn.Linear(d_model, d_model, bias=False)
        self.out = nn.Linear(d_model, vocab)

    def backbone(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, L, d_in] (rows right-aligned, last row next to the anchor), mask [B, L] true where a
        row exists → [B, N, d_model], all N positions at once."""
        B, L, _ = x.shape
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        h = self.in_proj(x) + self.pos(torch.arange(L - 1, -1, -1, device=x.device))[None]
        scores = torch.einsum("nd,bld->bnl", self.queries, self.k(h)) / h.shape[-1] ** 0.5
        scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        ctx = torch.einsum("bnl,bld->bnd", scores.softmax(-1), self.v(h))
        return ctx + self.mlp(ctx)

    def step_logits(self, ctx_j: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Markov head: logits of position j from backbone output j and draft j-1."""
        return self.out(torch.tanh(ctx_j + self.markov(self.tok(prev))))


class TorchDrafter:
    name = "torch"

    def __init__(self, *, num_spec: int, window: int, row_bytes: int, device: str = "cpu",
                 weights: str | None = None, seed: int = 0, d_model: int = 64, vocab: int = 4096) -> None:
        self.num_spec = num_spec
        self.window = window
        self.row_bytes = row_bytes
        self.vocab_size = vocab  # told to the client in WELCOME: it checks support ids against it
        self.bf16 = row_bytes % 2 == 0
        self.device = torch.device(device)
        d_in = row_bytes // 2 if self.bf16 else row_bytes
        gen = torch.Generator().manual_seed(seed)
        head = DraftHead(d_in, window, num_spec, d_model=d_model, vocab=vocab)
        with torch.no_grad():
            for p in head.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / max(1, p.shape[-1]) ** 0.5))
        if weights:
            state = torch.load(weights, map_location="cpu", weights_only=True)
            head.load_state_dict(state, strict=True)
        self.head = head.to(self.device).eval()

    def state_dict(self) -> dict:
        return self.head.state_dict()

    def _features(self, items: list[DraftItem]) -> tuple[torch.Tensor, torch.Tensor]:
        L = max(it.w for it in items)
        buf = np.zeros((len(items), L, self.row_bytes), dtype=np.uint8)
        mask = np.zeros((len(items), L), dtype=bool)
        for b, it in enumerate(items):
            o = L - it.w
            for seg in it.segments:
                buf[b, o:o + seg.shape[0]] = seg
                o += seg.shape[0]
            mask[b, L - it.w:] = True
        t = torch.from_numpy(buf)
        if self.bf16:
            x = t.view(torch.bfloat16).float()
        else:
            x = (t.float() - 128.0) / 128.0
        x = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).clamp_(-1e4, 1e4)
        return x.to(self.device), torch.from_numpy(mask).to(self.device)

    @torch.inference_mode()
    def draft(self, items: list[DraftItem], out: ReplyWriter) -> None:
        if not items:
            return
        N, head = self.num_spec, self.head
        x, mask = self._features(items)
        ctx = head.backbone(x, mask)
        idx = np.array([it.index for it in items])
        temps = torch.tensor([max(0.0, float(it.temperature)) for it in items], device=self.device)
        sampled = (temps > 0) & (out.sampled_mask is not None)
        prev = torch.tensor([it.anchor_token % head.vocab for it in items], device=self.device)
        ids = np.empty((len(items), N), dtype=np.int32)
        conf = np.empty((len(items), N), dtype=np.float32)
        marg = np.empty((len(items), N), dtype=np.float32)
        sup = np.full((len(items), N, TOP_K), -1, dtype=np.int32)
        q = np.zeros((len(items), N, TOP_K), dtype=np.float32)
        for j in range(N):
            logits = head.step_logits(ctx[:, j], prev)
            probs = logits.softmax(-1)
            top2 = probs.topk(2, dim=-1)
            choice = top2.indices[:, 0].clone()
            c = top2.values[:, 0].clone()
            if bool(sampled.any()):
                t = torch.where(sampled, temps, torch.ones_like(temps))
                pt = (logits / t[:, None]).softmax(-1)
                tk = pt.topk(TOP_K, dim=-1)
                qs = tk.values / tk.values.sum(-1, keepdim=True)
                for b in torch.nonzero(sampled).flatten().tolist():
                    it = items[b]
                    u = np.random.default_rng([it.seed & (2**63 - 1), it.anchor_pos, j]).random()
                    k = int(np.searchsorted(np.cumsum(qs[b].cpu().numpy()), u * float(qs[b].sum())))
                    k = min(k, TOP_K - 1)
                    choice[b] = tk.indices[b, k]
                    c[b] = qs[b, k]
                    sup[b, j] = tk.indices[b].cpu().numpy()
                    q[b, j] = qs[b].cpu().numpy()
            ids[:, j] = choice.cpu().numpy()
            conf[:, j] = c.cpu().numpy()
            marg[:, j] = (top2.values[:, 0] - top2.values[:, 1]).cpu().numpy()
            prev = choice
        n_out = np.array([N if it.n_out <= 0 else min(it.n_out, N) for it in items])
        cut = np.arange(N)[None, :] >= n_out[:, None]
        ids[cut] = -1
        conf[cut] = 0.0
        marg[cut] = 0.0
        out.draft_ids[idx] = ids
        out.confidence[idx] = conf
        if out.margin is not None:
            out.margin[idx] = marg
        if out.sampled_mask is not None:
            s = sampled.cpu().numpy()
            sup[cut] = -1
            q[cut] = 0.0
            out.sampled_mask[idx[s]] = 1
            out.support_ids[idx[s]] = sup[s]
            out.proposal_q[idx[s]] = q[s]
