"""The `torch` drafter: the DSpark head (dspark_proxy.model.head) serving the worker. Imported only when
chosen.

With `weights` (a head directory, or its .safetensors with manifest.json beside it) the manifest fixes
the row dtype, the tap and the shapes, and a disagreement with the worker's row_bytes, window or
num_spec refuses the start, naming the field. Without weights the head is random (seeded), for shape
and plumbing tests only, and reads rows as `row_dtype` (default: raw bytes); the dtype is never guessed.

Each round pays for its new rows only: every slot keeps the projected rows of its window (the head's
`project`, 3d floats a row) between rounds, keyed by the slot's window buffer (the segments' base
array, held by weak reference) and each row's position, and reused only while the row's write id
(`DraftItem.written`, from the worker's SlotWindow) is the one it was projected from: a slot restarted
or rewritten over the same positions is re-projected, and a caller that gives no ids gets no reuse. Only the first n_out draft positions
are computed. Greedy drafts with their softmax probability as confidence; margin is top1 - top2; in
sampled mode, for requests with temperature > 0, the top-32 support of the tempered distribution and
its renormalised probabilities q, with the draft drawn from q by a generator seeded from
(seed, anchor_pos, j), so a replay gives the same draft.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from ..model.head import DraftHead
from ..model.manifest import ROW_DTYPES, HeadManifest
from ..wire import TOP_K, ReplyWriter
from .drafters import DraftItem

__all__ = ["TorchDrafter", "SlotCache"]

_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class SlotCache:
    """One slot's projected window: projected row, position and write id at index position % W."""

    __slots__ = ("proj", "pos", "wid", "ref")

    def __init__(self, window: int, width: int, ref: weakref.ref) -> None:
        self.proj = np.zeros((window, width), dtype=np.float32)
        self.pos = np.full(window, -1, dtype=np.int64)
        self.wid = np.zeros(window, dtype=np.int64)  # 0: never a valid write id
        self.ref = ref


def _take(segments: list[np.ndarray], idx: np.ndarray) -> np.ndarray:
    """Rows idx (ascending, window order) of a window held as consecutive segments."""
    if len(segments) == 1:
        return segments[0][idx]
    parts, o = [], 0
    for sg in segments:
        k = sg.shape[0]
        parts.append(sg[idx[(idx >= o) & (idx < o + k)] - o])
        o += k
    return np.concatenate(parts)


class TorchDrafter:
    name = "torch"
    caches_rows = True  # the serve loop passes each row's write id (DraftItem.written)

    def __init__(self, *, num_spec: int, window: int, row_bytes: int, device: str = "cpu",
                 weights: str | None = None, seed: int = 0, d_model: int = 64, vocab: int = 4096,
                 row_dtype: str | None = None) -> None:
        self.num_spec = num_spec
        self.window = window
        self.row_bytes = row_bytes
        self.device = torch.device(device)
        self.manifest: HeadManifest | None = None
        if weights:
            from ..model.train_head import load_head

            head, man = load_head(weights)
            man.check(row_bytes=row_bytes, window=window, num_spec=num_spec)
            self.manifest, self.row_dtype = man, man.row_dtype
        else:
            self.row_dtype = row_dtype or "uint8"
            isz = ROW_DTYPES.get(self.row_dtype, 1)
            if row_bytes % isz:
                raise ValueError(f"row_bytes {row_bytes} is not a whole number of {self.row_dtype} values")
            gen = torch.Generator().manual_seed(seed)
            head = DraftHead(n_taps=1, hidden=row_bytes // isz, window=window, num_spec=num_spec, vocab=vocab,
                             d_model=d_model, n_heads=4)
            with torch.no_grad():
                for p in head.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / max(1, p.shape[-1]) ** 0.5))
        self.head = head.to(self.device).eval()
        self.vocab_size = int(head.vocab)  # told to the client in WELCOME: it checks support ids against it
        self._width = self.head.cache_width
        self._caches: dict[int, SlotCache] = {}
        self.rows_projected = 0  # rows that went through `project` (the rest came from the caches)

    def state_dict(self) -> dict:
        return self.head.state_dict()

    # -- the per-slot caches ------------------------------------------------------------------------
    def _cache_for(self, seg: np.ndarray) -> SlotCache:
        base = seg.base if isinstance(seg.base, np.ndarray) else seg
        key = id(base)
        c = self._caches.get(key)
        if c is None or c.ref() is not base:
            caches = self._caches
            c = SlotCache(self.window, self._width, weakref.ref(base, lambda _r, k=key: caches.pop(k, None)))
            caches[key] = c
        return c

    def _to_float(self, raw: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(raw)
        if self.row_dtype == "uint8":
            x = (t.float() - 128.0) / 128.0
        else:
            x = t.view(_TORCH_DTYPES[self.row_dtype]).float()
        return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).clamp_(-1e4, 1e4)

    def _windows(self, items: list[DraftItem]) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, W, 3d] projected windows, right-aligned, and their masks; projects only uncached rows."""
        W, B = self.window, len(items)
        caches, slots, misses = [], [], []
        for it in items:
            segs = it.segments
            c = self._cache_for(segs[0])
            pos = np.arange(it.anchor_pos - it.w, it.anchor_pos, dtype=np.int64)
            at = pos % W
            wid = it.written if it.written is not None else np.zeros(len(at), dtype=np.int64)
            miss = (c.pos[at] != pos) | (c.wid[at] != wid) | (wid == 0)
            caches.append(c)
            slots.append(at)
            misses.append((segs, miss, at, pos, wid))
        need = [_take(m[0], np.flatnonzero(m[1])) for m in misses if m[1].any()]
        if need:
            raw = np.concatenate(need)
            proj = self.head.project(self._to_float(raw).to(self.device)).float().cpu().numpy()
            self.rows_projected += len(raw)
            o = 0
            for c, (_rows, miss, at, pos, wid) in zip(caches, misses, strict=True):
                k = int(miss.sum())
                if k:
                    c.proj[at[miss]] = proj[o:o + k]
                    c.pos[at[miss]] = pos[miss]
                    c.wid[at[miss]] = wid[miss]
                    o += k
        win = np.zeros((B, W, self._width), dtype=np.float32)
        mask = np.zeros((B, W), dtype=bool)
        for b, (c, at) in enumerate(zip(caches, slots, strict=True)):
            win[b, W - len(at):] = c.proj[at]
            mask[b, W - len(at):] = True
        return torch.from_numpy(win).to(self.device), torch.from_numpy(mask).to(self.device)

    # -- drafting -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def draft(self, items: list[DraftItem], out: ReplyWriter) -> None:
        items = [it for it in items if it.w > 0]
        if not items:
            return
        N, head = self.num_spec, self.head
        n_out = np.array([N if it.n_out <= 0 else min(it.n_out, N) for it in items])
        n = int(n_out.max())
        win, mask = self._windows(items)
        prev = torch.tensor([it.anchor_token % head.vocab for it in items], device=self.device)
        ctx = head.backbone(win, mask, prev, n)
        idx = np.array([it.index for it in items])
        temps = torch.tensor([max(0.0, float(it.temperature)) for it in items], device=self.device)
        sampled = (temps > 0) & (out.sampled_mask is not None)
        B = len(items)
        ids = np.full((B, N), -1, dtype=np.int32)
        conf = np.zeros((B, N), dtype=np.float32)
        marg = np.zeros((B, N), dtype=np.float32)
        sup = np.full((B, N, TOP_K), -1, dtype=np.int32)
        q = np.zeros((B, N, TOP_K), dtype=np.float32)
        for j in range(n):
            logits = head.step_logits(ctx[:, j], prev)
            probs = logits.softmax(-1)
            top2 = probs.topk(2, dim=-1)
            choice = top2.indices[:, 0].clone()
            c = top2.values[:, 0].clone()
            if bool(sampled.any()):
                t = torch.where(sampled, temps, torch.ones_like(temps))
                tk = (logits / t[:, None]).softmax(-1).topk(TOP_K, dim=-1)
                qs = (tk.values / tk.values.sum(-1, keepdim=True)).cpu().numpy()
                tki = tk.indices.cpu().numpy()
                for b in torch.nonzero(sampled).flatten().tolist():
                    it = items[b]
                    u = np.random.default_rng([it.seed & (2**63 - 1), it.anchor_pos, j]).random()
                    k = min(int(np.searchsorted(np.cumsum(qs[b]), u * float(qs[b].sum()))), TOP_K - 1)
                    choice[b] = int(tki[b, k])
                    c[b] = float(qs[b, k])
                    sup[b, j] = tki[b]
                    q[b, j] = qs[b]
            ids[:, j] = choice.cpu().numpy()
            conf[:, j] = c.cpu().numpy()
            marg[:, j] = (top2.values[:, 0] - top2.values[:, 1]).cpu().numpy()
            prev = choice
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
