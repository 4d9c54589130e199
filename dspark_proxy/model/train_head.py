"""Train a DSpark head to predict the target's own next N greedy tokens from its tapped rows.

The training text is the target's own greedy generations from corpus prompts (self-distillation):
along a greedy generation, "the next N tokens" are exactly what verification will accept, which
teacher-forced corpus text is not. Rows come from one forward over each generated sequence with the
tap on, the same rows an engine finalises. Generation is cached in `<out>/.work/` (ignored by git);
each epoch, and every `checkpoint_every` steps inside one, checkpoints head, optimiser and the place in
the epoch's order, so `--resume` continues where a run stopped (a long one-epoch run included) and ends
with the weights an uninterrupted run ends with.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .accept import AcceptStats, ngram_drafts, walk_rounds
from .corpus import stdlib_corpus
from .head import DraftHead
from .head_runner import HeadRunner
from .hf import TAP_POINT, Tap, greedy_generate, load_causal_lm, target_id
from .manifest import MANIFEST_NAME, WEIGHTS_NAME, HeadManifest

__all__ = ["HeadConfig", "TrainSets", "train_head", "make_sequences", "evaluate", "head_drafts", "draft_vocab", "data_key"]

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class HeadConfig:
    layers: tuple[int, ...] = (1, 2, 4)
    row_dtype: str = "bfloat16"
    window: int = 16
    num_spec: int = 5
    d_model: int = 192
    n_heads: int = 4
    sequences: int = 1200
    eval_sequences: int = 48
    prompt_len: int = 32
    gen_len: int = 96
    epochs: int = 4
    batch: int = 8
    lr: float = 2e-3
    seed: int = 0
    threads: int = 1
    draft_vocab: int = 1024  # output rows: the most frequent greedy tokens (0: the whole vocabulary)
    distill: float = 0.5  # weight of the target's top-k probabilities against its greedy token
    init: str | None = None  # start from this head's weights (same shapes, or a longer window)
    extra_seeds: tuple[int, ...] = ()  # more training sets of `sequences` generations, prompts drawn by these
    step: str = "markov"  # the head's sequential step (head.STEPS); a markov --init starts a carry head
    hops: int = 1  # the backbone's looks at the window; a 1-hop --init starts a 2-hop head
    checkpoint_every: int = 500  # steps between checkpoints inside an epoch (0: at each epoch's end only)


def _progress(it, total: int, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(it, total=total, desc=desc, mininterval=5.0)
    except ImportError:  # tqdm comes with transformers; without it, no bar
        return it


SOFT_K = 32  # the target's top-k next-token probabilities kept per position (distillation targets)


@torch.no_grad()
def make_sequences(model, stream: np.ndarray, cfg: HeadConfig, n: int, *, held_out: bool,
                   gen_batch: int = 48) -> dict[str, torch.Tensor]:
    """n greedy generations from prompts of the token stream, their tapped rows and the target's top-k
    next-token distribution at every position: toks [n, P + G] int64, rows [n, P + G, taps x hidden]
    in the row dtype, top_ids [n, P + G, K] int32, top_p [n, P + G, K] float16."""
    P, G = cfg.prompt_len, cfg.gen_len
    if held_out:
        starts = np.linspace(0, len(stream) - P - 1, n).astype(np.int64)
    else:
        starts = np.random.default_rng(cfg.seed + 1).integers(0, len(stream) - P - 1, n)
    prompts = torch.from_numpy(np.stack([stream[s:s + P] for s in starts]).astype(np.int64))
    toks, rows, tid, tp = [], [], [], []
    tap = Tap(model, list(cfg.layers))
    for b in _progress(range(0, n, gen_batch), (n + gen_batch - 1) // gen_batch, "generate"):
        seq = greedy_generate(model, prompts[b:b + gen_batch], G)
        with tap:
            logits = model(seq).logits
        top = logits.float().softmax(-1).topk(SOFT_K, dim=-1)
        toks.append(seq)
        rows.append(tap.rows(_DTYPES[cfg.row_dtype]))
        tid.append(top.indices.to(torch.int32))
        tp.append(top.values.to(torch.float16))
    return {"toks": torch.cat(toks), "rows": torch.cat(rows), "top_ids": torch.cat(tid), "top_p": torch.cat(tp)}


def data_key(tid: str, cfg: HeadConfig, which: str, n: int) -> str:
    """The cache file of a data set: what makes it (the held-out prompts do not depend on the seed)."""
    seed = "" if which == "held_out" else f"-s{cfg.seed}"
    return (f"{which}-{tid[7:19]}-{'-'.join(map(str, cfg.layers))}-{cfg.row_dtype}-{n}-{cfg.prompt_len}"
            f"-{cfg.gen_len}{seed}-k{SOFT_K}.pt")


def _windows(head: DraftHead, rows: torch.Tensor, anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Projected windows of rows a-W .. a-1 for each anchor a: ([B, A, W, 3d], mask [B, A, W])."""
    W = head.window
    B, T, _ = rows.shape
    proj = head.project(rows.float())
    pad = torch.cat([proj.new_zeros(B, W, proj.shape[-1]), proj], 1)  # row t at t + W
    have = torch.cat([torch.zeros(B, W, dtype=torch.bool), torch.ones(B, T, dtype=torch.bool)], 1)
    win = pad.unfold(1, W, 1)[:, anchors].transpose(-1, -2)  # start a: padded a .. a+W-1 = rows a-W .. a-1
    mask = have.unfold(1, W, 1)[:, anchors]
    return win, mask


def _loss(head: DraftHead, batch: dict[str, torch.Tensor], start: int, distill: float,
          col_of: torch.Tensor) -> torch.Tensor:
    """(1 - distill) x cross-entropy on the target's greedy tokens + distill x cross-entropy on its
    top-k next-token probabilities, over the draft vocabulary (col_of: target id → output column,
    -1 outside it; a token outside cannot be drafted and teaches nothing)."""
    toks, rows = batch["toks"], batch["rows"]
    N = head.num_spec
    T = toks.shape[1]
    anchors = torch.arange(start, T - N)
    win, mask = _windows(head, rows, anchors)
    ctx = head.backbone(win.flatten(0, 1), mask.flatten(0, 1), toks[:, anchors].flatten(), N)
    idx = anchors[:, None] + torch.arange(N + 1)[None]  # anchor, then its N next tokens
    seq = toks[:, idx].flatten(0, 1)  # [B*A, N+1]
    logits = head.steps(ctx, seq[:, :N])  # teacher forced: prev = the true draft j-1
    logp = logits.log_softmax(-1)  # [B*A, N, V']
    hard = col_of[seq[:, 1:]]
    ok = hard >= 0
    nll = -logp.gather(-1, hard.clamp(min=0)[..., None])[..., 0]
    loss = (nll * ok).sum() / ok.sum().clamp(min=1)
    if distill > 0:
        cols = col_of[batch["top_ids"][:, idx[:, :N]].long()].flatten(0, 1)  # [B*A, N, K]: dist. of a+j+1
        p = batch["top_p"][:, idx[:, :N]].float().flatten(0, 1) * (cols >= 0)
        soft = -(p * logp.gather(-1, cols.clamp(min=0))).sum(-1)
        loss = (1 - distill) * loss + distill * soft.mean()
    return loss


@torch.no_grad()
def head_drafts(head: DraftHead, toks: torch.Tensor, rows: torch.Tensor, start: int) -> np.ndarray:
    """Greedy drafts for every anchor ≥ start, by the serving code (HeadRunner, as the worker runs
    it): [S, T, N] (-1 before start and where fewer than N tokens follow)."""
    runner = HeadRunner(head)
    N, W = head.num_spec, head.window
    S, T = toks.shape
    out = np.full((S, T, N), -1, dtype=np.int64)
    anchors = np.arange(start, T - N)
    lens = np.minimum(anchors, W)
    tk = toks.numpy()
    for s in range(S):
        proj = runner.project(rows[s].float().numpy())
        pad = np.concatenate([np.zeros((W, proj.shape[1]), np.float32), proj])  # row t at t + W
        win = np.lib.stride_tricks.sliding_window_view(pad, W, axis=0)[anchors].transpose(0, 2, 1)
        out[s, start:T - N] = runner.greedy(np.ascontiguousarray(win), lens, tk[s, anchors], N)[0]
    return out


def draft_vocab(toks: torch.Tensor, start: int, size: int, vocab: int) -> tuple[torch.Tensor, float]:
    """The `size` ids most frequent in the greedy generations (ties to the lower id), and the share
    of generated tokens they cover; size 0 or ≥ vocab: every id."""
    gen = toks[:, start:].flatten()
    if size <= 0 or size >= vocab:
        return torch.arange(vocab), 1.0
    cnt = torch.bincount(gen, minlength=vocab)
    ids = torch.sort(torch.argsort(-cnt, stable=True)[:size]).values
    return ids, round(float(cnt[ids].sum()) / max(1, len(gen)), 5)


def evaluate(head: DraftHead, toks: torch.Tensor, rows: torch.Tensor, start: int) -> dict:
    """Head and prompt-lookup acceptance along the same held-out greedy generations."""
    N = head.num_spec
    seqs = toks.numpy()
    drafts = head_drafts(head, toks, rows, start)
    hs, ns = AcceptStats(N), AcceptStats(N)
    walk_rounds(seqs, start, N, lambda s, a: drafts[s, a], hs)
    walk_rounds(seqs, start, N, lambda s, a: ngram_drafts(seqs[s, :a + 1], N), ns)
    gen = seqs[:, start:]
    grams = [len({tuple(r[i:i + 4]) for i in range(len(r) - 3)}) / (len(r) - 3) for r in gen]
    return {**hs.as_dict(), "mean_accepted_ngram": round(ns.mean, 4),
            "accept_by_position_ngram": ns.as_dict()["accept_by_position"],
            "num_spec": N, "eval_sequences": int(len(seqs)),
            "greedy_distinct_4gram_rate": round(float(np.mean(grams)), 4)}


class TrainSets:
    """The training sets as loaded (memory-mapped from the cache), indexed as their concatenation would
    be, without making it: at 6,000 generations a set holds about 0.9 GB of rows, and a concatenated
    copy of many sets would not fit in memory. `batch(b)` is the concatenation's `v[b]` for every
    field, element for element (tests/test_train_sets.py)."""

    def __init__(self, sets: list[dict[str, torch.Tensor]]) -> None:
        if not sets:
            raise ValueError("no training sets")
        self.sets = sets
        self.offsets = np.cumsum([0] + [len(d["toks"]) for d in sets])
        self.toks = torch.cat([d["toks"] for d in sets])  # small (int64 tokens), read whole by draft_vocab

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def batch(self, b: torch.Tensor) -> dict[str, torch.Tensor]:
        """Generations b (indices into the concatenation), in b's order."""
        idx = b.numpy()
        which = np.searchsorted(self.offsets, idx, side="right") - 1
        local = idx - self.offsets[which]
        return {k: torch.stack([self.sets[w][k][int(i)] for w, i in zip(which.tolist(), local.tolist(), strict=True)])
                for k in self.sets[0]}


def _load_or_make(path: Path, make):
    if path.is_file():
        return torch.load(path, weights_only=True, mmap=True)  # read as batches need them (TrainSets)
    data = make()
    torch.save(data, path)
    return data


def save_head(head: DraftHead, out: Path, manifest: HeadManifest) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    if head.draft_vocab:
        state["draft_ids"] = head.draft_ids.to(torch.int32).contiguous()  # ids, not weights: never bf16
    save_file(state, str(out / WEIGHTS_NAME))
    manifest.save(out / MANIFEST_NAME)


def load_head(weights: str | Path, step: str | None = None, hops: int | None = None,
              window: int | None = None) -> tuple[DraftHead, HeadManifest]:
    """A saved head (directory or .safetensors with manifest.json beside it), as float32. A `step` or
    `hops` beyond the saved head's (carry from markov, 2 from 1): the same function, the new parts
    starting where they do no harm (the carry and the second look's output at zero), to train on. A
    longer `window`: the rows beyond the saved head's reach start with its farthest distance's
    offsets (the attention then sees them as it sees that row, and training tells them apart)."""
    from safetensors.torch import load_file

    from .manifest import head_paths

    wpath, mpath = head_paths(weights)
    man = HeadManifest.load(mpath)
    W = window or man.window
    if W < man.window:
        raise ValueError(f"{wpath}: a head of window {man.window} cannot start one of window {W}")
    head = DraftHead(n_taps=len(man.tap_layers), hidden=man.hidden, window=W, num_spec=man.num_spec,
                     vocab=man.vocab_size, d_model=man.d_model, n_heads=man.n_heads, step=step or man.step,
                     hops=hops or man.hops)
    state = load_file(str(wpath))
    if W > man.window:
        pos = state["pos.weight"]
        state["pos.weight"] = torch.cat([pos, pos[-1:].expand(W - man.window, -1)])
    if (head.step, head.hops) != (man.step, man.hops):
        if (man.step not in ("markov", head.step)) or man.hops > head.hops:
            raise ValueError(f"{wpath}: a {man.step} {man.hops}-hop head cannot start a {head.step} "
                             f"{head.hops}-hop head")
        state = {k: v.detach().clone() for k, v in head.state_dict().items()} | state
    ids = state.pop("draft_ids", None)
    if (0 if ids is None else len(ids)) != man.draft_vocab:
        raise ValueError(f"{wpath}: {0 if ids is None else len(ids)} draft ids but the manifest has "
                         f"draft_vocab={man.draft_vocab}")
    head.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    if ids is not None:
        head.set_draft_vocab(ids.long())
    return head.eval(), man


def train_head(target: str | Path, out: str | Path, cfg: HeadConfig, *, resume: bool = False,
               log=print) -> dict:
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out, target = Path(out), Path(target)
    work = out / ".work"
    work.mkdir(parents=True, exist_ok=True)
    (work / ".gitignore").write_text("*\n")
    model, tok = load_causal_lm(target)
    tid = target_id(target)
    hidden, tok_vocab = int(model.config.hidden_size), int(model.config.vocab_size)
    embed = model.get_input_embeddings().weight.detach().float().clone()
    corpus = stdlib_corpus()
    from .target import encode_corpus

    def data(which: str, n: int, held: bool, seed: int = cfg.seed) -> dict[str, torch.Tensor]:
        c = dataclasses.replace(cfg, seed=seed)

        def make():
            log(f"generating {n} {which} sequences with the target (seed {seed}) ...")
            return make_sequences(model, encode_corpus(tok, corpus.read(which)), c, n, held_out=held)
        return _load_or_make(work / data_key(tid, c, which, n), make)

    train = TrainSets([data("train", cfg.sequences, False, s) for s in (cfg.seed, *cfg.extra_seeds)])
    held = data("held_out", cfg.eval_sequences, True)
    init_record = None
    if cfg.init:
        head, init_man = load_head(cfg.init, cfg.step, cfg.hops, cfg.window)
        init_record = {"path": str(cfg.init), "training": init_man.training}  # the lineage, recursively
        if (head.n_taps, head.hidden, head.window, head.num_spec, head.vocab, head.d, head.h) != (
                len(cfg.layers), int(train.sets[0]["rows"].shape[-1]) // len(cfg.layers), cfg.window, cfg.num_spec,
                int(tok_vocab), cfg.d_model, cfg.n_heads):
            raise ValueError(f"--init {cfg.init}: a head of other shapes than this run's")
        head.train()
    else:
        head = DraftHead(n_taps=len(cfg.layers), hidden=hidden, window=cfg.window, num_spec=cfg.num_spec,
                         vocab=tok_vocab, d_model=cfg.d_model, n_heads=cfg.n_heads, step=cfg.step,
                         hops=cfg.hops)
        head.init_from_target(embed)
    toks = train.toks
    ids, coverage = draft_vocab(toks, cfg.prompt_len, cfg.draft_vocab, tok_vocab)
    head.set_draft_vocab(ids)
    col_of = torch.full((tok_vocab,), -1, dtype=torch.long)
    col_of[head.draft_ids] = torch.arange(len(head.draft_ids))
    log(f"draft vocabulary {len(ids)} ids: {coverage:.2%} of the training generations' tokens")
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.01)
    steps_per_epoch = (len(toks) + cfg.batch - 1) // cfg.batch
    total = steps_per_epoch * cfg.epochs
    warm = max(1, total // 20)

    def lr_at(step: int) -> float:  # warm-up, then cosine to 5%; a function of the step, so a resumed
        # run (even with more epochs) just continues the curve
        if step < warm:
            return cfg.lr * (step + 1) / warm
        return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm)))))

    epoch0, step0, history, tot, cnt = 0, 0, [], 0.0, 0
    ckpt = work / "checkpoint.pt"

    def checkpoint(epoch: int, step: int) -> None:  # written whole, then renamed: a kill never leaves half
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"head": head.state_dict(), "draft_ids": head.draft_ids, "opt": opt.state_dict(),
                    "epoch": epoch, "step": step, "history": history, "tot": tot, "cnt": cnt}, tmp)
        tmp.replace(ckpt)

    if resume and ckpt.is_file():
        st = torch.load(ckpt, weights_only=False)
        head.load_state_dict(st["head"])
        head.set_draft_vocab(st["draft_ids"])
        opt.load_state_dict(st["opt"])
        epoch0, step0, history = st["epoch"], st.get("step", 0), st["history"]
        tot, cnt = st.get("tot", 0.0), st.get("cnt", 0)
        log(f"resumed after epoch {epoch0}" + (f", step {step0} of {steps_per_epoch}" if step0 else ""))
    t0 = time.time()
    for epoch in range(epoch0, cfg.epochs):
        head.train()
        order = torch.randperm(len(toks), generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch))
        first = step0 if epoch == epoch0 else 0  # a resumed epoch skips the steps its checkpoint had taken
        if not first:
            tot, cnt = 0.0, 0
        bar = _progress(range(first, steps_per_epoch), steps_per_epoch - first, f"epoch {epoch + 1}/{cfg.epochs}")
        for i in bar:
            for g in opt.param_groups:
                g["lr"] = lr_at(epoch * steps_per_epoch + i)
            b = order[i * cfg.batch:(i + 1) * cfg.batch]
            loss = _loss(head, train.batch(b), cfg.prompt_len, cfg.distill, col_of)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            tot, cnt = tot + loss.item(), cnt + 1
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{tot / cnt:.3f}", refresh=False)
            if cfg.checkpoint_every and (i + 1) % cfg.checkpoint_every == 0 and i + 1 < steps_per_epoch:
                checkpoint(epoch, i + 1)
        history.append(round(tot / max(1, cnt), 4))
        log(f"epoch {epoch + 1}/{cfg.epochs} loss {history[-1]:.4f} ({time.time() - t0:.0f}s)")
        checkpoint(epoch + 1, 0)
    man = HeadManifest(target_id=tid, target_name=target.name, tap_layers=list(cfg.layers), tap_point=TAP_POINT,
                       hidden=head.hidden, row_dtype=cfg.row_dtype, window=cfg.window, num_spec=cfg.num_spec,
                       vocab_size=head.vocab, d_model=cfg.d_model, n_heads=cfg.n_heads,
                       draft_vocab=head.draft_vocab, step=head.step, hops=head.hops,
                       training={"sequences": int(len(toks)), "prompt_len": cfg.prompt_len, "gen_len": cfg.gen_len,
                                 "epochs": cfg.epochs, "batch": cfg.batch, "lr": cfg.lr, "seed": cfg.seed,
                                 "extra_seeds": list(cfg.extra_seeds),
                                 "distill": cfg.distill, "distill_top_k": SOFT_K, "init": init_record,
                                 "draft_vocab_coverage": coverage, "loss_per_epoch": history,
                                 "params": sum(p.numel() for p in head.parameters())})
    save_head(head, out, man)
    shipped, _ = load_head(out)  # measure the weights as saved
    res = evaluate(shipped, held["toks"], held["rows"], cfg.prompt_len)
    man.training["held_out"] = res
    man.save(out / MANIFEST_NAME)
    return {**res, "loss_per_epoch": history, "out": str(out), "target_id": tid}
