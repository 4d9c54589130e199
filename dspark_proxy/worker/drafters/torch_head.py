"""The `torch` drafter: the DSpark head (dspark_proxy.model.head) serving the worker. Imported only when
chosen.

With `weights` (a head directory, or its .safetensors with manifest.json beside it) the manifest fixes
the row dtype, the tap and the shapes, and a disagreement with the worker's row_bytes, window or
num_spec refuses the start, naming the field. Without weights the head is random (seeded), for shape
and plumbing tests only, and reads rows as `row_dtype` (default: raw bytes); the dtype is never guessed.

The head runs as `model.head_runner.HeadRunner` (numpy float32, batch-invariant), the code the
offline measurement runs, so served drafts are the measured ones bit for bit.

Each round pays for its new rows only: the worker hands a STEP's rows to `project_rows` (the head's
`project`, 3d floats a row) before applying them, and each slot keeps the projections beside its rows
(worker/session.py, `SlotWindow.aux`); a round's windows are one gather from the slots' rings. A
window without them (a caller that is not the worker's serve loop, or rows applied while projecting
failed) is projected whole from its rows.
Only the first n_out draft positions are computed. Greedy drafts with their softmax probability as
confidence; margin is top1 - top2; in sampled mode, for requests with temperature > 0, the top-32
support of the tempered distribution over the draft vocabulary and its renormalised probabilities q,
with the draft drawn from q by a generator seeded from (seed, anchor_pos, j), so a replay gives the
same draft.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ...model import headmm
from ...model.head import DraftHead
from ...model.head_runner import HeadRunner, bf16_to_f32
from ...model.head_threads import ThreadChoice
from ...model.manifest import ROW_DTYPES, HeadManifest
from ...wire import TOP_K, ReplyWriter
from .base import DraftItem, seeded_uniform

__all__ = ["TorchDrafter"]

_U64 = (1 << 64) - 1


class TorchDrafter:
    name = "torch"

    def __init__(self, *, num_spec: int, window: int, row_bytes: int, device: str = "cpu",
                 weights: str | None = None, seed: int = 0, d_model: int = 64, vocab: int = 4096,
                 row_dtype: str | None = None) -> None:
        self.num_spec = num_spec
        self.window = window
        self.row_bytes = row_bytes
        if torch.device(device).type != "cpu":
            raise ValueError(f"device {device!r}: the torch drafter's head runs on the CPU (numpy); its "
                             "per-round cost at these shapes is call overhead, not arithmetic")
        self.device = torch.device(device)
        self.manifest: HeadManifest | None = None
        if weights:
            from ...model.train_head import load_head

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
        self.head = head.eval()
        self.runner = HeadRunner(self.head)
        self.vocab_size = int(head.vocab)  # told to the client in WELCOME: it checks support ids against it
        self.rows_projected = 0  # rows that went through `project`
        self._cols = np.arange(window)
        self._rows = np.arange(64)[:, None]  # row indices for the batch's gather, grown to the largest batch seen
        self._rings = np.zeros((64, window, self.runner.cache_width), dtype=np.float32)  # the batch's aux rings
        self.threads = ThreadChoice(headmm.threads())  # the kernel's threads a round: measured (model/head_threads.py)

    def slot_bytes(self, window: int, row_bytes: int) -> int:
        """What each slot holds for this drafter (charged to the worker's memory budget,
        worker/session.py): its rows and their transforms, [window, cache_width] float32 (SlotWindow.aux)."""
        return window * (row_bytes + int(self.runner.cache_width) * 4)

    def state_dict(self) -> dict:
        return self.head.state_dict()

    def _to_float(self, raw: np.ndarray) -> np.ndarray:
        """Rows' bytes → float32 values, a non-finite value read as 0 and the rest clipped to ±1e4 (a
        corrupt or hostile row cannot blow up the head)."""
        if self.row_dtype == "uint8":
            x = (raw.astype(np.float32) - 128.0) / 128.0
        elif self.row_dtype == "bfloat16":
            x = bf16_to_f32(raw)
        else:
            x = raw.view(np.dtype(self.row_dtype).newbyteorder("<")).astype(np.float32)
        ok = np.isfinite(x)
        if not ok.all():
            x[~ok] = 0.0
        np.minimum(x, 1e4, out=x)
        return np.maximum(x, -1e4, out=x)

    def project_rows(self, raw: np.ndarray) -> np.ndarray:
        """Rows' bytes [k, row_bytes] → their projections [k, 3d] (what a slot keeps beside each row)."""
        return self._project(raw)

    def _project(self, raw: np.ndarray) -> np.ndarray:
        self.rows_projected += raw.shape[0]
        if self.row_dtype == "bfloat16":  # the manifests' dtype: one native call (~12 calls below)
            return self.runner.project_bf16(raw)
        return self._project_reference(raw)

    def _project_reference(self, raw: np.ndarray) -> np.ndarray:
        """What `_project` computes: the rows read as floats (`_to_float`), then the head's `project`."""
        return self.runner.project(self._to_float(raw))

    def _windows(self, items: list[DraftItem], apos: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """[B, W, 3d] projected windows, right-aligned (apos: anchor positions, lens: rows present; the
        columns before a window's rows hold whatever its ring does there, and the head never reads them)."""
        W, B = self.window, len(items)
        at = (apos[:, None] + self._cols[None, :]) % W  # column c: position anchor - W + c, at its index % W
        if B > self._rings.shape[0]:
            self._rings = np.zeros((2 * B, W, self._rings.shape[2]), dtype=np.float32)
            self._rows = np.arange(2 * B)[:, None]
        rings = self._rings[:B]
        kept = [it.aux for it in items]
        if all(a is not None for a in kept):  # the serve loop's rounds: one copy of the rings, one gather
            np.stack(kept, out=rings)
        else:
            for b, it in enumerate(items):
                if it.aux is not None:
                    rings[b] = it.aux
                else:  # no projections kept for this window: its rows, projected now, at their ring indices
                    rings[b, at[b, W - it.w:]] = self._project(np.concatenate(it.segments))
        return rings[self._rows[:B], at]

    # -- drafting -----------------------------------------------------------------------------------
    def draft(self, items: list[DraftItem], out: ReplyWriter) -> None:
        items = [it for it in items if it.w > 0]
        if not items:
            return
        headmm.use_threads(self.threads.pick(len(items)))
        t0 = time.perf_counter()
        self._draft(items, out)
        self.threads.record(len(items), time.perf_counter() - t0)

    def _draft(self, items: list[DraftItem], out: ReplyWriter) -> None:
        N, r = self.num_spec, self.runner
        B = len(items)
        # the per-request fields in one pass over the items (n_out, anchor token, index, anchor position, w)
        f = np.array([(it.n_out, it.anchor_token, it.index, it.anchor_pos, it.w) for it in items],
                     dtype=np.int64).reshape(B, 5)
        n_out = np.where(f[:, 0] <= 0, N, np.minimum(f[:, 0], N))
        n = int(n_out.max())
        lens = f[:, 4]
        win = self._windows(items, f[:, 3], lens)
        anchor = f[:, 1] % r.vocab
        idx = f[:, 2]
        temps = None  # sampled mode not agreed: every request greedy
        if out.sampled_mask is not None:
            temps = np.fromiter((max(0.0, float(it.temperature)) for it in items), np.float64, B)
        if temps is None or not (temps > 0).any():
            gi, gc, gm = r.greedy(win, lens, anchor, n)
            if int(n_out.min()) == N:  # every request wants all N drafts: nothing to cut
                out.draft_ids[idx], out.confidence[idx] = gi, gc
                if out.margin is not None:
                    out.margin[idx] = gm
                return
            ids = np.full((B, N), -1, dtype=np.int32)
            conf = np.zeros((B, N), dtype=np.float32)
            marg = np.zeros((B, N), dtype=np.float32)
            ids[:, :n], conf[:, :n], marg[:, :n] = gi, gc, gm
            sampled = None
        else:
            sampled = temps > 0
            ids = np.full((B, N), -1, dtype=np.int32)
            conf = np.zeros((B, N), dtype=np.float32)
            marg = np.zeros((B, N), dtype=np.float32)
            sup = np.full((B, N, TOP_K), -1, dtype=np.int32)
            q = np.zeros((B, N, TOP_K), dtype=np.float32)
            self._draft_sampled(items, win, lens, anchor, n, temps, sampled, ids, conf, marg, sup, q)
        cut = np.arange(N)[None, :] >= n_out[:, None]
        ids[cut] = -1
        conf[cut] = 0.0
        marg[cut] = 0.0
        out.draft_ids[idx] = ids
        out.confidence[idx] = conf
        if out.margin is not None:
            out.margin[idx] = marg
        if sampled is not None:
            sup[cut] = -1
            q[cut] = 0.0
            out.sampled_mask[idx[sampled]] = 1
            out.support_ids[idx[sampled]] = sup[sampled]
            out.proposal_q[idx[sampled]] = q[sampled]

    def _draft_sampled(self, items, win, lens, anchor, n, temps, sampled, ids, conf, marg, sup, q) -> None:
        """Greedy rows as `greedy` drafts them; sampled rows draw from the tempered top-32 of the
        draft vocabulary, one draw per sampled request and position from a uniform that is a function
        of (its seed, its anchor position, the position): a replay draws the same."""
        r = self.runner
        B = len(items)
        rows = np.arange(B)
        ctx = r.backbone(win, lens, anchor, n)
        prev, carry = anchor, None
        t = np.where(sampled, temps, 1.0).astype(np.float32)
        sb = np.flatnonzero(sampled)
        key = np.array([(items[b].seed & _U64, items[b].anchor_pos & _U64) for b in sb.tolist()],
                       dtype=np.uint64).reshape(-1, 2)
        at = np.arange(sb.shape[0])
        for j in range(n):
            logits, carry = r.step_carry(np.ascontiguousarray(ctx[:, j]), prev, carry, j + 1 < n)
            choice = r.draft_ids[r.top1(logits, rows, conf[:, j], marg[:, j])]
            lt = logits[sb] / t[sb, None]
            k = min(TOP_K, lt.shape[1])
            part = np.argpartition(-lt, k - 1, axis=1)[:, :k]
            lv = np.take_along_axis(lt, part, 1)
            order = np.argsort(-lv, axis=1, kind="stable")
            part, lv = np.take_along_axis(part, order, 1), np.take_along_axis(lv, order, 1)
            p = np.exp(lv - lv[:, :1])
            qs = (p / p.sum(-1, keepdims=True)).astype(np.float32)
            # inverse CDF: the first support index whose cumulative q reaches u (the top one at worst)
            u = seeded_uniform(key[:, 0], key[:, 1], j)
            below = np.cumsum(qs, axis=1) < (u * qs.sum(axis=1))[:, None]
            kk = np.minimum(np.count_nonzero(below, axis=1), k - 1)
            choice[sb] = r.draft_ids[part[at, kk]]
            conf[sb, j] = qs[at, kk]
            sup[sb, j, :k] = r.draft_ids[part]
            q[sb, j, :k] = qs
            ids[:, j] = choice
            prev = choice
