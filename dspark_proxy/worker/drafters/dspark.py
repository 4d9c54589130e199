"""The `dspark` drafter: a speculators DSpark checkpoint (worker/dspark_ckpt.py) served over the protocol,
in torch, on the CPU or CUDA (docs/dspark.md, "Serve your DSpark head").

What it computes, for a request whose window holds the rows of positions a-w .. a-1 and whose anchor
token sits at position a (the reference's drafting step, as vLLM's DSpark speculator runs it):
- each row (the tapped layers' hidden states) goes through `fc` and `hidden_norm`, and each draft
  layer's k_proj/k_norm/rotary (at the row's own position) and v_proj give its context keys and values.
  That is per row, so it is done once, when the row arrives (`project_rows`), and each slot keeps it
  beside its rows (worker/session.py, `SlotWindow.aux`): a round computes its new rows only;
- the block (the anchor, then `mask_token_id`) at positions a .. a+block_size-1 passes through the
  draft layers once, attending to the context rows (a sliding layer to its last `sliding_window`) and
  to the block (all of it for full-attention layers and non-causal sliding ones, the positions up to
  its own otherwise), batched over the round's requests; `norm` and `lm_head` give each position's
  base logits over the draft vocabulary;
- left to right over the drafts, the Markov head adds its bias from the previous token (the anchor,
  then each draft fed back, as target ids), vanilla, gated or rnn (its state carried, the anchor slot
  included when sample_from_anchor is false); the confidence head gives each draft's confidence
  (sigmoid), else the draft's softmax probability. Draft j reads block position j (sample_from_anchor)
  or j + 1 (the anchor is the bonus token). Only the first n_out drafts are computed.
In sampled mode a request with temperature t > 0 draws each draft from the top-32 of softmax(logits/t)
renormalised, with a uniform that is a function of (seed, anchor position, j) alone (drafters/base.py's
`seeded_uniform`), and the reply's support and q are that distribution, so rejection sampling against
it stays lossless.
On the CPU (`native`, the default there) the products go through the head's own kernel with each norm
folded into the matrix after it (dspark_products.py), and a STEP's new rows and the greedy loop run on
the host (dspark_host.py): docs/dspark.md, "Its cost"; `native=False` (and CUDA) runs it all in torch,
the path the native one is tested against (tests/test_dspark_native.py).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from ...model.dspark_ckpt import ROW_ITEMSIZE, CheckpointError, load_tensors, read_spec, resolve_target
from ...model.head_threads import ThreadChoice
from ...wire import TOP_K, ReplyWriter
from .base import DraftItem, seeded_uniform
from .dspark_host import HostPath
from .dspark_products import Products, rms
from .dspark_rope import Rotary, rope

__all__ = ["DSparkDrafter"]

log = logging.getLogger("dspark_proxy.worker.server")

_TORCH_ROW = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_said_full_attention: set[str] = set()  # "exact only for contexts <= W", said once per checkpoint


def _pick_device(device: str) -> torch.device:
    if device in ("", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    d = torch.device(device)
    if d.type == "cuda" and not torch.cuda.is_available():
        raise CheckpointError(f"device {device!r}: this torch has no CUDA device (--device cpu)")
    return d


class DSparkDrafter:
    """A DSpark checkpoint as a worker drafter. Its N, window and row layout are the checkpoint's."""

    name = "dspark"
    fixes = ("num_spec", "window", "row_bytes")  # worker/terms.py: a HELLO with others is refused

    def __init__(self, *, num_spec: int, window: int, row_bytes: int, head: str | None = None,
                 target: str | None = None, device: str = "auto", row_dtype: str = "bfloat16",
                 gpu_memory_budget_mb: int = 0, max_reqs: int = 64, native: bool = True, **_: object) -> None:
        if not head:
            raise CheckpointError("head: the dspark drafter needs --head CKPT_DIR (a speculators checkpoint)")
        if row_dtype not in ROW_ITEMSIZE:
            raise CheckpointError(f"row_dtype: expected one of {', '.join(ROW_ITEMSIZE)}, got {row_dtype!r}")
        spec = read_spec(head)
        self.spec = spec
        self.row_dtype = row_dtype
        self.num_spec = spec.num_spec
        if num_spec != spec.num_spec:
            raise CheckpointError(f"num_spec: worker {num_spec}, checkpoint {spec.head_dir / 'config.json'} "
                                  f"{spec.num_spec} (block_size {spec.block_size}, sample_from_anchor "
                                  f"{str(spec.sample_from_anchor).lower()})")
        if spec.window is not None and window != spec.window:
            raise CheckpointError(f"window: worker {window}, checkpoint {spec.head_dir / 'config.json'} "
                                  f"transformer_layer_config.sliding_window {spec.window}")
        self.window = window
        self.row_bytes = spec.row_bytes(row_dtype)
        if row_bytes != self.row_bytes:
            raise CheckpointError(f"row_bytes: worker {row_bytes}, checkpoint {spec.head_dir / 'config.json'} "
                                  f"{self.row_bytes} ({len(spec.aux_layer_ids)} tapped layers x hidden "
                                  f"{spec.hidden_size} x {row_dtype})")
        self.tap_layers = spec.aux_layer_ids
        self.target_dir = resolve_target(spec, target)
        self.device = _pick_device(device)
        t = load_tensors(spec, self.target_dir)
        self._budget_check(t, gpu_memory_budget_mb, max_reqs)
        self.t = {k: v.to(self.device) for k, v in t.items()}
        self.vocab_size = spec.vocab_size  # support ids are target ids (WELCOME's vocab_size)
        self.eps = float(spec.layer.get("rms_norm_eps", 1e-6))
        self.scaling = spec.head_dim ** -0.5
        self.kv_width = spec.n_layers * 2 * spec.n_kv_heads * spec.head_dim  # float32 values a row keeps
        self._cpu = self.device.type == "cpu"
        self.native = native and self._cpu  # the head's kernel and the host side (dspark_host.py); else torch
        self.rotary = Rotary(spec.layer, spec.head_dim, self.device)
        self._mask_memo: tuple[bytes, list[torch.Tensor]] | None = None  # _masks: the last round's
        self.products = Products(spec, self.t, self.eps, self.native)
        self.w = self.products.w
        self._proj = self.products.proj
        if self.native:  # the host side (dspark_host.py) and the block's tables, as host arrays
            self._headmm = self.products.headmm
            self.host = HostPath(spec, self.t, self.products, self.rotary, self.eps, row_dtype)
            self._embed_np = self.t["embed_tokens.weight"].numpy()
            # the first layer's q/k/v of the block's mask rows, by the kernel that computes the anchor's
            # (its rows' sums do not depend on the rows beside them: model/headmm.py), so the same bytes
            self._mask_qkv0 = self._proj(torch.from_numpy(self._embed_np[spec.mask_token_id][None].copy()),
                                         "0.qkv")[0].numpy()
            # the block's input and its first q/k/v, kept across rounds (grown with the batch), the mask
            # rows written once: a round writes its anchors' rows only
            self._x0 = np.empty((0, spec.block_size, spec.hidden_size), dtype=np.float32)
            self._qkv0 = np.empty((0, spec.block_size, self._mask_qkv0.shape[-1]), dtype=np.float32)
            ce = self.w.get("conf_e")
            self._conf_e_np = None if ce is None or not ce.numel() else ce.numpy()[:, 0].copy()
        self.threads = ThreadChoice(self._headmm.threads()) if self.native else None
        self._win = np.zeros((0, 0, self.kv_width), dtype=np.float32)  # _windows' buffer, grown when needed
        self.rows_projected = 0
        self.keep_logits = False  # tests: keep each round's logits (last_logits, [B, n, draft vocab] float32)
        self.last_logits: torch.Tensor | None = None
        if spec.window is None and str(spec.head_dir) not in _said_full_attention:
            _said_full_attention.add(str(spec.head_dir))
            log.warning("[worker] dspark head %s: its draft layers use full attention over the whole prefix; "
                        "served with the last W=%d rows, its drafts are exact only for contexts <= %d",
                        spec.head_dir, window, window)
        log.info("[worker] dspark head=%s target=%s device=%s N=%d W=%d taps=%s row_dtype=%s markov=%s/%d "
                 "confidence_head=%s", spec.head_dir, self.target_dir, self.device, self.num_spec, window,
                 list(self.tap_layers), row_dtype, spec.markov_head_type, spec.markov_rank,
                 spec.enable_confidence_head)

    # -- accounting -----------------------------------------------------------------------------------
    def slot_bytes(self, window: int, row_bytes: int) -> int:
        """Host bytes one slot holds: its window's rows and each row's context keys and values (float32)."""
        return window * (row_bytes + self.kv_width * 4)

    def _budget_check(self, t: dict, budget_mb: int, max_reqs: int) -> None:
        """Device memory: the weights, and a round's largest context (max_reqs windows of keys and values,
        with the block's activations, twice over), against --gpu-memory-budget-mb (0: unchecked)."""
        if budget_mb <= 0 or self.device.type != "cuda":
            return
        s = self.spec
        weights = sum(v.numel() * 4 for v in t.values())
        per_req = (self.window + s.block_size) * (s.n_layers * 2 * s.n_kv_heads * s.head_dim
                                                  + s.n_heads * s.block_size + s.hidden_size) * 4
        need = weights + 2 * max_reqs * per_req + max_reqs * s.block_size * s.draft_vocab_size * 4
        if need > budget_mb << 20:
            raise CheckpointError(f"gpu_memory_budget_mb: the head needs about {need >> 20} MiB on {self.device} "
                                  f"({weights >> 20} MiB weights, the rest a round of {max_reqs} requests); "
                                  f"the budget is {budget_mb} MiB (raise --gpu-memory-budget-mb or lower --max-reqs)")

    def _on_device(self, a: np.ndarray) -> torch.Tensor:
        """A host array as a tensor on the drafter's device (on the CPU the same memory, no call)."""
        x = torch.from_numpy(np.ascontiguousarray(a))
        return x if self._cpu else x.to(self.device)

    # -- rows -> context keys and values ----------------------------------------------------------------
    def _rows_to_float(self, raw: np.ndarray) -> torch.Tensor:
        x = self._on_device(raw)
        x = x.view(_TORCH_ROW[self.row_dtype]).float()
        return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)

    @torch.inference_mode()
    def _context_kv(self, raw: np.ndarray, pos: np.ndarray) -> torch.Tensor:
        """Rows [k, row_bytes] at positions pos → [k, L, 2, n_kv, head_dim] float32 keys (normed and
        rotated) and values of every draft layer."""
        s, t = self.spec, self.t
        self.rows_projected += raw.shape[0]
        h = self._proj(self._rows_to_float(raw), "fc")  # hidden_norm: in each layer's kv product
        cos, sin = self.rotary.cos_sin(pos)
        cos, sin = cos[:, None, :], sin[:, None, :]
        out = torch.empty(raw.shape[0], s.n_layers, 2, s.n_kv_heads, s.head_dim, device=self.device)
        for i in range(s.n_layers):
            kv = self._proj(h, f"{i}.kv").view(-1, 2, s.n_kv_heads, s.head_dim)
            rope(self.products.head_norm(kv[:, 0], t[f"layers.{i}.self_attn.k_norm.weight"]), cos, sin, out=out[:, i, 0])
            out[:, i, 1] = kv[:, 1]
        # a hostile row (huge values overflow fc) must not leave inf/nan keys in its slot's ring
        return torch.nan_to_num_(out, nan=0.0, posinf=0.0, neginf=0.0)

    def project_rows(self, raw: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """A STEP's rows at their positions → what each slot keeps beside them: [k, kv_width] float32."""
        if self.native:
            self.rows_projected += raw.shape[0]
            return self.host.context_kv(raw, positions)
        return self._context_kv(raw, positions).reshape(raw.shape[0], -1).cpu().numpy()

    project_rows.needs_positions = True  # type: ignore[attr-defined]  # drafters/base.py project_at passes them

    def _lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        y = x @ self.t[name + ".weight"].T
        b = self.t.get(name + ".bias")
        return y if b is None else y + b

    # -- drafting -------------------------------------------------------------------------------------
    def _windows(self, items: list[DraftItem], apos: np.ndarray, wm: int) -> torch.Tensor:
        """[B, wm, L, 2, n_kv, hd]: each request's last wm context rows' keys and values, right-aligned;
        the columns before its own rows are zeros (the mask hides them, and a masked column still meets a
        zero weight in softmax @ V: 0 * whatever a ring held there must be 0)."""
        W, B = self.window, len(items)
        if self._win.shape[0] < B or self._win.shape[1] < wm:
            self._win = np.zeros((max(B, self._win.shape[0]), W, self.kv_width), dtype=np.float32)
        win = self._win[:B, :wm]
        for b, it in enumerate(items):
            w0 = wm - it.w
            win[b, :w0] = 0.0
            if it.aux is not None:  # the ring's last w rows: one or two slices (a gather costs 5x more)
                a = (int(apos[b]) - it.w) % W
                cut = min(it.w, W - a)
                win[b, w0:w0 + cut] = it.aux[a:a + cut]
                win[b, w0 + cut:] = it.aux[:it.w - cut]
            else:  # no keys kept for this window (rows applied while projecting failed): from its rows
                pos = np.arange(it.anchor_pos - it.w, it.anchor_pos)
                win[b, w0:] = self.project_rows(np.concatenate(it.segments), pos)
        s = self.spec
        # the buffer is reused next round: on the CPU the block reads it within this round only
        x = torch.from_numpy(win)
        return (x if self._cpu else x.to(self.device)).view(B, wm, s.n_layers, 2, s.n_kv_heads, s.head_dim)

    def _masks(self, lens: np.ndarray, wm: int) -> list[torch.Tensor]:
        """Each draft layer's attention mask [B, 1, bs, wm + bs] (True: attend), one per kind of layer: a
        sliding layer sees its last `sliding_window` context rows and, causal, the block up to itself.
        The last round's are reused when its context lengths were the same (full windows, every round
        of a steady batch)."""
        lens64 = lens.astype(np.int64)
        key = lens64.tobytes() + wm.to_bytes(4, "little")
        if self._mask_memo is not None and self._mask_memo[0] == key:
            return self._mask_memo[1]
        masks = self._make_masks(torch.from_numpy(lens64).to(self.device), len(lens), wm)
        self._mask_memo = (key, masks)
        return masks

    def _make_masks(self, lens: torch.Tensor, B: int, wm: int) -> list[torch.Tensor]:
        s, dev, bs = self.spec, self.device, self.spec.block_size
        col = torch.arange(wm, device=dev)[None, :]
        qi = torch.arange(bs, device=dev)
        kinds: dict[bool, torch.Tensor] = {}
        for sliding in set(s.sliding):
            seen = torch.clamp(lens, max=s.sliding_window) if sliding else lens
            ctx_ok = (col >= (wm - seen)[:, None])[:, None, :].expand(B, bs, wm)
            blk_ok = (qi[None, :] <= qi[:, None]) if sliding and not s.sliding_window_non_causal else \
                torch.ones(bs, bs, dtype=torch.bool, device=dev)
            kinds[sliding] = torch.cat((ctx_ok, blk_ok[None].expand(B, bs, bs)), dim=2)[:, None]
        return [kinds[sl] for sl in s.sliding]

    @torch.inference_mode()
    def block_hidden(self, ctx: torch.Tensor, lens: np.ndarray, anchor: torch.Tensor, apos: np.ndarray
                     ) -> torch.Tensor:
        """The block's parallel pass: [B, block_size, H] before `norm` (which the "out" product applies;
        ctx: [B, wm, L, 2, n_kv, hd], zeros before each request's own rows; lens: each request's context
        rows, apos: its anchor's position, both on the host)."""
        s, t, w = self.spec, self.t, self.w
        B, wm, bs = ctx.shape[0], ctx.shape[1], s.block_size
        if self.native:  # the block's input on the host: the anchor's embedding, then the mask token's
            if self._x0.shape[0] < B:
                self._x0 = np.empty((B, bs, s.hidden_size), dtype=np.float32)
                self._x0[:, 1:] = self._embed_np[s.mask_token_id]
                self._qkv0 = np.empty((B, bs, self._mask_qkv0.shape[-1]), dtype=np.float32)
                self._qkv0[:, 1:] = self._mask_qkv0
            xn = self._x0[:B]  # read within this round only: every product writes a new array
            xn[:, 0] = self._embed_np[anchor.numpy()]
            x = torch.from_numpy(xn)
        else:
            tok = torch.full((B, bs), s.mask_token_id, dtype=torch.long, device=self.device)
            tok[:, 0] = anchor
            x = t["embed_tokens.weight"][tok]
        cos, sin = self.rotary.cos_sin(apos[:, None] + np.arange(bs)[None, :])
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
        masks = self._masks(lens, wm)
        nq, nkv = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
        for i in range(s.n_layers):
            if i == 0 and self.native:  # the mask rows' are the same every round: only the anchor's computed
                qkv = torch.from_numpy(self._qkv0[:B])
                qkv[:, 0] = self._proj(x[:, 0], "0.qkv")
            else:
                qkv = self._proj(x, f"{i}.qkv")  # input_layernorm: in the product
            # q's and k's heads side by side: one norm (each head its own weight row) and one rotation
            qk = qkv[..., :nq + nkv].reshape(B, bs, s.n_heads + s.n_kv_heads, s.head_dim)
            qk = rope(self.products.head_norm(qk, w[f"{i}.qk_norm"]), cos, sin)
            q, k = qk[:, :, :s.n_heads], qk[:, :, s.n_heads:]
            v = qkv[..., nq + nkv:]
            K = torch.cat((ctx[:, :, i, 0], k), dim=1).transpose(1, 2)
            V = torch.cat((ctx[:, :, i, 1], v.view(B, bs, s.n_kv_heads, s.head_dim)), dim=1).transpose(1, 2)
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), K, V, attn_mask=masks[i], scale=self.scaling,
                enable_gqa=s.n_heads != s.n_kv_heads)
            x = self._proj(o.transpose(1, 2).reshape(B, bs, -1), f"{i}.o", resid=x)
            g, u = self._proj(x, f"{i}.gate_up").chunk(2, dim=-1)  # post_attention_layernorm: in the product
            x = self._proj(torch.nn.functional.silu(g) * u, f"{i}.down", resid=x)
        return x

    def draft(self, items: list[DraftItem], out: ReplyWriter) -> None:
        items = [it for it in items if it.w > 0]
        if not items:
            return
        if self.threads is None:
            self._draft(items, out)
            return
        self._headmm.use_threads(self.threads.pick(len(items)))
        t0 = time.perf_counter()
        self._draft(items, out)
        self.threads.record(len(items), time.perf_counter() - t0)

    @torch.inference_mode()
    def _draft(self, items: list[DraftItem], out: ReplyWriter) -> None:
        s, N = self.spec, self.num_spec
        B = len(items)
        f = np.array([(it.n_out, it.anchor_token, it.index, it.anchor_pos, it.w) for it in items],
                     dtype=np.int64).reshape(B, 5)
        n_out = np.where(f[:, 0] <= 0, N, np.minimum(f[:, 0], N))
        n = int(n_out.max())
        wm = int(f[:, 4].max())
        anchor_np = f[:, 1] % s.vocab_size
        ctx = self._windows(items, f[:, 3], wm)
        anchor = self._on_device(anchor_np)
        hidden = self.block_hidden(ctx, f[:, 4], anchor, f[:, 3])
        off = 0 if s.sample_from_anchor else 1
        out_all = self._proj(hidden[:, :off + n], "out")  # [B, off + n, Vd (+ 1)]: norm, lm_head (, confidence)
        Vd = s.draft_vocab_size
        base = out_all[:, off:, :Vd]  # [B, n, Vd]
        temps = np.zeros(B)
        if out.sampled_mask is not None:
            temps = np.fromiter((max(0.0, float(it.temperature)) for it in items), np.float64, B)
        sb = np.flatnonzero(temps > 0)  # the requests whose drafts are drawn from q
        ids = np.full((B, N), -1, dtype=np.int32)
        conf = np.zeros((B, N), dtype=np.float32)
        marg = np.zeros((B, N), dtype=np.float32)
        kept = [] if self.keep_logits else None
        need_probs = not s.enable_confidence_head or out.margin is not None or bool(sb.size)
        sq = None
        host = self.native and not sb.size and Vd > 1 and (not s.markov_rank or s.markov_head_type == "vanilla")
        if host:  # the common case, on the host: the same drafts (tests/test_dspark_native.py)
            emb_t, pm = self.host.greedy(base.numpy(), anchor_np, n, need_probs, ids, kept)
        else:
            emb_t, pm, sq = self._torch_loop(hidden[:, :off + n], base, anchor, items, temps, sb, need_probs, ids, kept)
        if s.enable_confidence_head and host:  # the same on the host: numpy's few us an operation
            z = out_all.numpy()[:, off:, Vd]
            if s.confidence_head_with_markov:
                z = z + emb_t.numpy() @ self._conf_e_np
            with np.errstate(over="ignore"):  # a very negative logit: exp overflows, the confidence is 0
                conf[:, :n] = 1.0 / (1.0 + np.exp(-z))
        elif s.enable_confidence_head:  # every draft's at once, after the loop: it feeds nothing back
            z = out_all[:, off:, Vd]  # the hidden part and the bias, from the "out" product
            if s.confidence_head_with_markov:
                z = z + (emb_t @ self.w["conf_e"])[..., 0]
            conf[:, :n] = torch.sigmoid(z).cpu().numpy()
        else:
            conf[:, :n] = pm[..., 0]
        if out.margin is not None:
            marg[:, :n] = pm[..., 1]
        if kept is not None:
            self.last_logits = torch.stack(kept, dim=1)
        cut = np.arange(N)[None, :] >= n_out[:, None]
        ids[cut], conf[cut], marg[cut] = -1, 0.0, 0.0
        idx = f[:, 2]
        out.draft_ids[idx] = ids
        out.confidence[idx] = conf
        if out.margin is not None:
            out.margin[idx] = marg
        if sb.size:
            sup, q = sq
            sup[cut] = -1
            q[cut] = 0.0
            out.sampled_mask[idx[sb]] = 1
            out.support_ids[idx[sb]] = sup[sb]
            out.proposal_q[idx[sb]] = q[sb]

    def _torch_loop(self, hb: torch.Tensor, base: torch.Tensor, anchor: torch.Tensor, items: list[DraftItem],
                    temps: np.ndarray, sb: np.ndarray, need_probs: bool, ids: np.ndarray, kept: list | None
                    ) -> tuple[torch.Tensor | None, np.ndarray | None, tuple[np.ndarray, np.ndarray] | None]:
        """The drafts left to right in torch: sampled requests, the gated and rnn Markov heads, CUDA and
        `native=False`. hb: the block's hidden states [B, off + n, H] before `norm`; base: the base logits
        [B, n, Vd]; sb: the requests drawn from q. Fills ids[:, :n]; returns the Markov embeddings
        [B, n, rank] (or None), [B, n, probability | margin] (None unless need_probs), and for sampled
        requests (support, q) [B, N, TOP_K] (else None)."""
        s, dev, N = self.spec, self.device, self.num_spec
        B, n = base.shape[0], base.shape[1]
        off = hb.shape[1] - n
        hs = h0 = None  # the normed hidden states, only for a Markov head that reads them
        if s.markov_rank and s.markov_head_type in ("gated", "rnn"):
            hn = rms(hb, self.t["norm.weight"], self.eps)
            hs, h0 = hn[:, off:], hn[:, 0]
        if sb.size:
            key = np.array([(items[b].seed & ((1 << 64) - 1), items[b].anchor_pos) for b in sb.tolist()],
                           dtype=np.uint64).reshape(-1, 2)
            tt = torch.from_numpy(temps[sb]).to(dev, torch.float32)[:, None]
            sbt = torch.from_numpy(sb).to(dev)
        tids: list[torch.Tensor] = []
        embs: list[torch.Tensor] = []  # the Markov head's embedding of each draft's previous token
        confs: list[torch.Tensor] = []
        margs: list[torch.Tensor] = []
        sups: list[torch.Tensor] = []
        qss: list[torch.Tensor] = []
        prev = anchor
        state = None
        if s.markov_rank and s.markov_head_type == "rnn" and not s.sample_from_anchor:
            _, state = self._markov(prev, h0, None)  # the anchor slot carries the rnn state
        for j in range(n):
            bias, state, emb = self._markov_step(prev, None if hs is None else hs[:, j], state)
            logits = base[:, j] if bias is None else base[:, j] + bias
            if kept is not None:
                kept.append(logits.cpu())
            choice = torch.argmax(logits, dim=-1)
            c = mg = None
            if need_probs:  # the draft's probability (no confidence head) and top1 - top2 (margin)
                top2 = torch.topk(logits, min(2, logits.shape[-1]), dim=-1).values
                lse = torch.logsumexp(logits, dim=-1)
                c = torch.exp(top2[:, 0] - lse)
                mg = c - (torch.exp(top2[:, 1] - lse) if logits.shape[-1] > 1 else 0.0)
            if sb.size:
                k = min(TOP_K, logits.shape[-1])
                lv, li = torch.topk(logits[sbt] / tt, k, dim=-1)
                qs = torch.softmax(lv, dim=-1)
                u = torch.from_numpy(seeded_uniform(key[:, 0], key[:, 1], j)).to(dev, torch.float64)
                below = torch.cumsum(qs.double(), dim=-1) < (u * qs.double().sum(-1))[:, None]
                kk = torch.clamp(below.sum(-1), max=k - 1)
                choice = choice.clone()
                choice[sbt] = li.gather(1, kk[:, None])[:, 0]
                c = c.clone()
                c[sbt] = qs.gather(1, kk[:, None])[:, 0]
                sups.append(self._to_target(li))
                qss.append(qs)
            tid = self._to_target(choice)
            if emb is not None:
                embs.append(emb)
            tids.append(tid)
            confs.append(c)
            margs.append(mg if mg is not None else c)
            prev = tid
        # one copy to the host for the whole block (a copy a position is a device sync each)
        ids[:, :n] = torch.stack(tids, dim=1).cpu().numpy()
        emb_t = torch.stack(embs, dim=1) if embs else None
        pm = np.stack((torch.stack(confs, dim=1).float().cpu().numpy(),
                       torch.stack(margs, dim=1).float().cpu().numpy()), axis=-1) if need_probs else None
        sq = None
        if sb.size:
            sup = np.full((B, N, TOP_K), -1, dtype=np.int32)
            q = np.zeros((B, N, TOP_K), dtype=np.float32)
            kk_n = sups[0].shape[1]
            sup[sb, :n, :kk_n] = torch.stack(sups, dim=1).cpu().numpy()
            q[sb, :n, :kk_n] = torch.stack(qss, dim=1).cpu().numpy()
            sq = (sup, q)
        return emb_t, pm, sq

    def _to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        m = self.t.get("draft_to_target")
        return draft_ids if m is None else m.index_select(0, draft_ids.reshape(-1)).view(draft_ids.shape)

    def _markov(self, prev: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None):
        bias, state, _ = self._markov_step(prev, h, state)
        return bias, state

    def _markov_step(self, prev: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None):
        """(logit bias [B, Vd] or None, the rnn state, the previous token's embedding) for one position."""
        s, t = self.spec, self.t
        if not s.markov_rank:
            return None, None, None
        emb = t["markov_head.markov_w1.weight"].index_select(0, prev)
        if s.markov_head_type == "vanilla":
            return self._proj(emb, "markov_w2"), None, emb
        if s.markov_head_type == "gated":
            gate = torch.sigmoid(self._lin(torch.cat((h, emb), dim=-1), "markov_head.gate_proj"))
            return self._proj(gate * emb, "markov_w2"), None, emb
        if state is None:
            state = emb.new_zeros(emb.shape[0], s.markov_rank)
        g, cand, o = self._lin(torch.cat((state, emb, h), dim=-1), "markov_head.joint_proj").chunk(3, dim=-1)
        g = torch.sigmoid(g)
        state = g * state + (1.0 - g) * torch.tanh(cand)
        return self._proj(torch.tanh(o), "markov_w2"), state, emb
