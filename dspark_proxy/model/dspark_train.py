"""`train-drafter --arch dspark`: train a speculators-format DSpark head for any local HF causal LM.

Self-distillation, as the `torch` head's trainer does: the target greedily continues each prompt, and the
head learns, at every anchor of those continuations, the target's own next-token distributions (the
reference's KL loss against the target's logits) from the tapped rows before the anchor. The model and
the loss are speculators' own (`DSparkDraftModel.forward`, its eager loss implementation); sequences
are packed into one row with document ids, as its trainer packs them. Its attention runs block-local
(dspark_fast.py: each anchor block over its own W context rows and N positions, equal to the reference's
dense mask, tests/test_dspark_fast.py); `reference_forward` runs the reference's own dense-mask backbone. Prompts come from `--prompts FILE`
(held-out acceptance on a hash split of the same file) or, without one, from the stdlib corpus the
shipped target learnt from (held-out prompts from its held-out files, the ones `eval` uses). Generated
data (by prompt: more prompts generate only the new ones) and checkpoints live in `<out>/.work/`
(ignored by git); `--resume` continues from the last one.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from . import dspark_fast
from .dspark_head import acceptance, build_dspark, fill_from_target, num_spec_of
from .taps import HiddenTaps

__all__ = ["DSparkTrainConfig", "train_dspark", "init_shapes", "check_before_work", "step_anchors", "draft_vocab_maps", "coverage"]

_ROW_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class DSparkTrainConfig:
    layers: tuple[int, ...] = (1, 2, 4)
    row_dtype: str = "bfloat16"  # rows are rounded to the dtype the protocol carries them in
    window: int = 16
    num_spec: int = 5
    draft_layers: int = 1
    draft_heads: int = 0  # 0: the target's
    intermediate: int = 0  # 0: the target's
    markov_rank: int = 64
    markov_head_type: str = "vanilla"
    loss_fn: str = "kl_div"  # the reference's: kl_div (the target's distribution) or ce (its greedy token)
    position_weight: str = "fixed-exp-decay"  # or dpace (ce only)
    decay_gamma: float = 4.0
    dpace_alpha: float = 0.5
    draft_vocab: int = 0  # ids the head drafts, the most frequent in the generations; 0: the target's all
    mask_token_id: int = -1  # -1: the tokenizer's pad, else eos, else 0
    prompts_file: str | None = None
    n_prompts: int = 1200
    held_share: float = 0.1
    eval_prompts: int = 48  # without --prompts: held-out stdlib prompts
    prompt_len: int = 32  # without --prompts: tokens a stdlib prompt; with: the last this many (0: all)
    gen_len: int = 96
    epochs: int = 4
    batch: int = 2  # sequences a step
    anchors: int = 0  # anchors a step (the reference's max_anchors); 0: every valid position of the step
    lr: float = 3e-3
    seed: int = 0
    threads: int = 1
    device: str = "cpu"
    checkpoint_every: int = 500
    reference_forward: bool = False  # the reference's dense-mask forward (for checking; dspark_fast.py)
    init: str | None = None  # a DSpark checkpoint to start from (its shapes: init_shapes)


def init_shapes(head_dir: str) -> dict:
    """The config fields a head started from `head_dir` must share with it (its tapped layers, W, N, draft
    layers, Markov head, draft vocabulary), read from its config.json (CheckpointError naming the field
    where it cannot be trained on: a full-attention draft layer or the anchor as the bonus token, which
    this trainer does not build)."""
    from .dspark_ckpt import CheckpointError, read_spec

    spec = read_spec(head_dir)
    where = f"{Path(head_dir) / 'config.json'}"
    if spec.window is None:
        raise CheckpointError(f"{where}: field transformer_layer_config.layer_types: train-drafter trains "
                              "sliding-attention draft layers only")
    if not spec.sample_from_anchor:
        raise CheckpointError(f"{where}: field sample_from_anchor: train-drafter trains sample_from_anchor true only")
    if spec.n_kv_heads != spec.n_heads:
        raise CheckpointError(f"{where}: field transformer_layer_config.num_key_value_heads: {spec.n_kv_heads}, "
                              f"train-drafter trains num_attention_heads ({spec.n_heads}) only")
    return {"layers": spec.aux_layer_ids, "window": spec.window, "num_spec": spec.num_spec,
            "draft_layers": spec.n_layers, "draft_heads": spec.n_heads,
            "intermediate": int(spec.layer.get("intermediate_size") or 0), "markov_rank": spec.markov_rank,
            "markov_head_type": spec.markov_head_type, "mask_token_id": spec.mask_token_id,
            "draft_vocab": spec.draft_vocab_size if spec.draft_vocab_size < spec.vocab_size else 0}


def _init_fits(head_dir: str, target_cfg, target: str) -> None:
    """An --init head made for another target (vocabulary or hidden size) is refused before any work."""
    from .dspark_ckpt import read_spec

    spec, where = read_spec(head_dir), Path(head_dir) / "config.json"
    for field, mine, theirs in (("transformer_layer_config.vocab_size", spec.vocab_size, target_cfg.vocab_size),
                                ("transformer_layer_config.hidden_size", spec.hidden_size, target_cfg.hidden_size)):
        if int(mine) != int(theirs):
            raise ValueError(f"{where}: field {field}: {mine}, but the target {target} has {theirs}")


def _init_weights(draft, head_dir: str) -> None:
    """Loads an --init checkpoint's own tensors over a draft built with its shapes (and filled from the
    target, whose embedding and lm_head the checkpoint may not hold)."""
    from safetensors.torch import load_file

    from .dspark_ckpt import _safetensors

    state: dict[str, torch.Tensor] = {}
    for f in _safetensors(Path(head_dir)):
        state.update(load_file(str(f)))
    own = draft.state_dict()
    for k, v in state.items():
        if k not in own:
            raise ValueError(f"{head_dir}: tensor {k}: not a tensor of the head its config.json describes")
        if tuple(v.shape) != tuple(own[k].shape):
            raise ValueError(f"{head_dir}: tensor {k}: shape {tuple(v.shape)}, its config.json says "
                             f"{tuple(own[k].shape)}")
    draft.load_state_dict(state, strict=False)


def check_before_work(target: str | Path, cfg: DSparkTrainConfig):
    """Load the target and check every tap id and the prompt file before anything is written:
    (model, tokenizer, taps, prompts or None). Raises TapError / PromptError / ValueError (one line)."""
    from transformers import AutoConfig

    from .hf import load_causal_lm
    from .prompts import read_prompts
    from .taps import check_tap_layers

    if cfg.num_spec < 1 or cfg.window < 1:
        raise ValueError(f"--num-spec {cfg.num_spec} / --window {cfg.window}: both at least 1")
    if not (Path(target) / "config.json").is_file():
        raise ValueError(f"{target}: not a Hugging Face model directory (no config.json)")
    check_tap_layers(AutoConfig.from_pretrained(target, local_files_only=True), cfg.layers, str(target))
    prompts = read_prompts(cfg.prompts_file) if cfg.prompts_file else None
    model, tok = load_causal_lm(target)
    taps = HiddenTaps(model, cfg.layers, where=str(target))
    return model, tok, taps, prompts


def _progress(it, total: int, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(it, total=total, desc=desc, mininterval=5.0)
    except ImportError:
        return it


@torch.no_grad()
def _generate(model, prompt: torch.Tensor, new: int, eos: int | None) -> torch.Tensor:
    from .hf import greedy_generate

    seq = greedy_generate(model, prompt, new)
    return seq


def _make_sequences(model, taps: HiddenTaps, prompts: list[np.ndarray], cfg: DSparkTrainConfig, desc: str,
                    device: str, gen_batch: int = 128) -> Iterator[list[dict]]:
    """Greedy continuations of the prompts and their tapped rows, a batch of equal-length prompts at a
    time (each batch yielded as it is made: the store keeps it before the next)."""
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    groups = [(L, idx[b:b + gen_batch]) for L, idx in sorted(by_len.items()) for b in range(0, len(idx), gen_batch)]
    for L, idx in _progress(groups, len(groups), desc):
        x = torch.from_numpy(np.stack([prompts[i] for i in idx])).to(device)
        seq = _generate(model, x, cfg.gen_len, None)
        rows, last, _ = taps(seq)
        rows = rows.to(_ROW_DTYPES[cfg.row_dtype]).cpu()
        last = last.to(torch.bfloat16).cpu()
        yield [{"toks": seq[j].cpu(), "rows": rows[j], "last": last[j], "start": L} for j in range(len(idx))]


def _stdlib_prompts(tok, which: str, n: int, length: int, seed: int) -> list[np.ndarray]:
    from .corpus import stdlib_corpus
    from .target import encode_corpus

    stream = encode_corpus(tok, stdlib_corpus().read(which))
    if which == "held_out":  # the held-out prompts `eval` and the torch head's trainer use
        starts = np.linspace(0, len(stream) - length - 1, n).astype(np.int64)
    else:
        starts = np.random.default_rng(seed + 1).integers(0, len(stream) - length - 1, n)
    return [stream[s:s + length].astype(np.int64) for s in starts]


def _pack(seqs: list[dict], N: int) -> tuple[torch.Tensor, ...]:
    """One packed row, as the reference trains: rows, ids, loss mask, last hidden, document and position
    ids. The loss covers the generated part (anchors from the last prompt token on), never a document's
    first N positions, so no anchor block reaches a neighbour's loss."""
    rows = torch.cat([s["rows"] for s in seqs]).float()[None]
    ids = torch.cat([s["toks"] for s in seqs])[None]
    last = torch.cat([s["last"] for s in seqs]).float()[None]
    lm, doc, pos = [], [], []
    for d, s in enumerate(seqs):
        T = len(s["toks"])
        m = torch.zeros(T)
        m[max(s["start"] - 1, N):T - 1] = 1
        lm.append(m)
        doc.append(torch.full((T,), d, dtype=torch.long))
        pos.append(torch.arange(T))
    return rows, ids, torch.cat(lm)[None], last, torch.cat(doc)[None], torch.cat(pos)[None]


def step_anchors(loss_mask: torch.Tensor, block_size: int, anchors: int) -> int:
    """max_anchors for one packed step: `anchors`, or with 0 every position the reference's
    select_anchors may choose (loss mask on, not in the packed row's last block), so none is dropped."""
    if anchors > 0:
        return anchors
    valid = loss_mask[0].bool().clone()
    valid[-block_size:] = False
    return max(1, int(valid.sum()))


def draft_vocab_maps(seqs: list[dict], size: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(d2t, t2d) for a draft vocabulary of the `size` ids most frequent in the generated continuations
    (the tokens the head is trained to draft), by the reference's own rule (speculators'
    build_vocab_mappings_from_distribution); None for the whole vocabulary (0 or >= `vocab`)."""
    if size <= 0 or size >= vocab:
        return None
    counts = torch.zeros(vocab, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(s["toks"][int(s["start"]):].long(), minlength=vocab)[:vocab]
    nz = counts.nonzero().flatten()
    freq = dict(zip(nz.tolist(), counts[nz].tolist(), strict=True))
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    return build_vocab_mappings_from_distribution(freq, size, vocab)


def coverage(seqs: list[dict], t2d: torch.Tensor) -> float:
    """The share of the generated continuations' tokens that the draft vocabulary holds."""
    got = tot = 0
    for s in seqs:
        gen = s["toks"][int(s["start"]):].long()
        got, tot = got + int(t2d[gen].sum()), tot + len(gen)
    return got / max(1, tot)


def _data_key(target: Path, cfg: DSparkTrainConfig, which: str, prompts_digest: str) -> str:
    """The file name of one run's generations before the store (`_GenStore`): read once, if present, so
    a `.work/` made by an earlier version is not generated again."""
    h = hashlib.sha256(f"{target.resolve()}|{cfg.layers}|{cfg.row_dtype}|{cfg.gen_len}|{cfg.prompt_len}|"
                       f"{cfg.n_prompts}|{cfg.eval_prompts}|{cfg.held_share}|{cfg.seed}|{prompts_digest}".encode())
    return f"dspark-{which}-{h.hexdigest()[:16]}.pt"


class _GenStore:
    """The target's continuations and their tapped rows, keyed by the prompt's token ids, in one directory
    per (target, tapped layers, row dtype, continuation length): a run with more prompts (a larger
    `--n-prompts`, lines added to `--prompts FILE`) generates only the prompts it has not seen, and
    held-out prompts are generated once. One file per batch of generations, kept as soon as the batch is
    made (written whole, then renamed): a kill loses at most the batch in progress, a store that grows is
    never rewritten, and its files are read memory-mapped, so a store larger than memory still trains
    (tens of GB: ~200 KB a sequence for models/stdlib-llama). The single file an earlier version kept
    (`<dir>.pt`) is read too."""

    def __init__(self, work: Path, target: Path, cfg: DSparkTrainConfig) -> None:
        h = hashlib.sha256(f"{target.resolve()}|{cfg.layers}|{cfg.row_dtype}|{cfg.gen_len}".encode())
        self.dir = work / f"dspark-generations-{h.hexdigest()[:16]}"
        self.seqs: dict[bytes, dict] = {}
        old = self.dir.with_suffix(".pt")
        files = sorted(self.dir.glob("*.pt")) if self.dir.is_dir() else []
        for f in ([old] if old.is_file() else []) + files:
            self._read(f)
        self._next = 1 + max((int(f.stem) for f in files if f.stem.isdigit()), default=-1)

    def _read(self, f: Path) -> None:
        try:
            seqs = torch.load(f, weights_only=False, mmap=True)
        except Exception as e:  # noqa: BLE001  (a damaged file: one line, not a traceback)
            raise ValueError(f"{f}: not a store of generations ({type(e).__name__}); delete it to generate "
                             "them again") from None
        if not isinstance(seqs, dict):
            raise ValueError(f"{f}: not a store of generations; delete it to generate them again")
        self.seqs.update(seqs)

    @staticmethod
    def key(prompt) -> bytes:
        return np.asarray(prompt, dtype=np.int64).tobytes()

    def missing(self, prompts: list[np.ndarray]) -> list[int]:
        return [i for i, p in enumerate(prompts) if self.key(p) not in self.seqs]

    def add(self, seqs: list[dict]) -> None:
        """Kept on disk (one more file) before they count as generated."""
        chunk = {self.key(q["toks"][:int(q["start"])].numpy()): q for q in seqs}  # its prompt: the first `start`
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{self._next:06d}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save(chunk, tmp)
        tmp.replace(path)
        self._next += 1
        self.seqs.update(chunk)

    def take(self, prompts: list[np.ndarray]) -> list[dict]:
        return [self.seqs[self.key(p)] for p in prompts]


def train_dspark(target: str, out: str, cfg: DSparkTrainConfig, *, resume: bool = False, log=print) -> dict:
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    from .prompts import encode_prompts, split_prompts

    model, tok, taps, prompts = check_before_work(target, cfg)  # nothing written before this passes
    if cfg.init:
        _init_fits(cfg.init, model.config, target)
    dev = cfg.device
    model.to(dev)
    out_p, tgt = Path(out), Path(target)
    work = out_p / ".work"
    work.mkdir(parents=True, exist_ok=True)
    (work / ".gitignore").write_text("*\n")
    N = cfg.num_spec
    if prompts is not None:
        train_i, held_i = split_prompts(prompts, cfg.held_share)
        enc = encode_prompts(tok, prompts, cfg.prompt_len or None)
        empty = [i for i, e in enumerate(enc) if len(e) == 0]
        if empty:
            raise ValueError(f"{cfg.prompts_file}: prompt {empty[0] + 1} encodes to no tokens")
        train_i = train_i[:cfg.n_prompts] if cfg.n_prompts else train_i
        digest = hashlib.sha256(Path(cfg.prompts_file).read_bytes()).hexdigest()
        train_p, held_p = [enc[i] for i in train_i], [enc[i] for i in held_i]
    else:
        digest = "stdlib"
        train_p = _stdlib_prompts(tok, "train", cfg.n_prompts, cfg.prompt_len, cfg.seed)
        held_p = _stdlib_prompts(tok, "held_out", cfg.eval_prompts, cfg.prompt_len, cfg.seed)

    store = _GenStore(work, tgt, cfg)

    def data(which: str, ps: list[np.ndarray]) -> list[dict]:
        legacy = work / _data_key(tgt, cfg, which, digest)
        todo = store.missing(ps)
        if todo and legacy.is_file():
            store.add(torch.load(legacy, weights_only=False))
            todo = store.missing(ps)
        if todo:
            log(f"generating {len(todo)} {which} sequences with the target"
                + (f" ({len(ps) - len(todo)} already generated) ..." if len(todo) < len(ps) else " ..."))
            for chunk in _make_sequences(model, taps, [ps[i] for i in todo], cfg, f"generate {which}", dev):
                store.add(chunk)
        return store.take(ps)

    train, held = data("train", train_p), data("held_out", held_p)
    mask_id = cfg.mask_token_id
    if mask_id < 0:
        mask_id = next((int(t) for t in (tok.pad_token_id, tok.eos_token_id) if t is not None), 0)
    V = int(model.config.vocab_size)
    if cfg.init:  # its own ids: its lm_head rows are theirs
        from safetensors import safe_open

        from .dspark_ckpt import _safetensors

        maps = {}
        for f in _safetensors(Path(cfg.init)):
            with safe_open(str(f), "pt") as fh:
                maps.update({k: fh.get_tensor(k) for k in ("d2t", "t2d") if k in fh.keys()})
        if cfg.draft_vocab and len(maps) < 2:
            raise ValueError(f"{cfg.init}: tensor d2t/t2d: missing for its draft vocabulary of {cfg.draft_vocab}")
        vocab = (maps["d2t"], maps["t2d"]) if cfg.draft_vocab else None
    else:
        vocab = draft_vocab_maps(train, cfg.draft_vocab, V)
    draft = build_dspark(model.config, verifier_path=str(target), layers=list(cfg.layers), num_spec=N,
                         window=cfg.window, draft_layers=cfg.draft_layers, intermediate=cfg.intermediate or None,
                         heads=cfg.draft_heads or None, markov_rank=cfg.markov_rank,
                         markov_head_type=cfg.markov_head_type, mask_token_id=mask_id,
                         draft_vocab=len(vocab[0]) if vocab else 0)
    covered = coverage(held, vocab[1]) if vocab else None  # once: logged now, returned at the end
    if vocab:
        draft.load_vocab_mappings(vocab[1], vocab[0])
        log(f"draft vocabulary: {len(vocab[0])} of {V} ids, {covered:.2%} of the held-out "
            "continuations' tokens")
    fill_from_target(draft, model)
    if cfg.init:
        _init_weights(draft, cfg.init)
        log(f"starting from {cfg.init}")
    draft.to(dev)
    from speculators.models.dspark import DSparkDraftModel

    kw, _ = DSparkDraftModel.get_trainer_kwargs(loss_fn=cfg.loss_fn, loss_implementation="eager",
                                                dflash_decay_gamma=cfg.decay_gamma, dpace_alpha=cfg.dpace_alpha,
                                                per_position_loss_weight=cfg.position_weight)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01)
    steps_per_epoch = (len(train) + cfg.batch - 1) // cfg.batch
    total = steps_per_epoch * cfg.epochs
    warm = max(1, total // 20)

    def lr_at(step: int) -> float:  # warm-up, then cosine to 5%, a function of the step (resume continues it)
        if step < warm:
            return cfg.lr * (step + 1) / warm
        return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm)))))

    ckpt = work / "dspark-checkpoint.pt"
    epoch0, step0, history, tot, cnt = 0, 0, [], 0.0, 0

    def checkpoint(epoch: int, step: int) -> None:  # whole, then renamed: a kill never leaves half
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"draft": draft.state_dict(), "opt": opt.state_dict(), "epoch": epoch, "step": step,
                    "history": history, "tot": tot, "cnt": cnt, "config": asdict(cfg)}, tmp)
        tmp.replace(ckpt)

    if resume and ckpt.is_file():
        st = torch.load(ckpt, weights_only=False)
        # checkpoints are taken with the identity in the verifier norm's place (below): its weight is
        # the only key they lack, and it is never trained
        try:
            missing, unexpected = draft.load_state_dict(st["draft"], strict=False)
        except RuntimeError as e:  # shapes: another --draft-vocab, window, rank ...
            first = str(e).strip().splitlines()[-1].strip()
            raise ValueError(f"{ckpt}: a checkpoint of another head ({first}); delete it or train without "
                             "--resume") from None
        if unexpected or set(missing) - {"verifier_norm.weight"}:
            raise ValueError(f"{ckpt}: a checkpoint of another head (missing {missing}, unexpected {unexpected}); "
                             "delete it or train without --resume")
        opt.load_state_dict(st["opt"])
        epoch0, step0, history, tot, cnt = st["epoch"], st["step"], st["history"], st["tot"], st["cnt"]
        if vocab and not torch.equal(draft.t2d.cpu(), vocab[1].to(draft.t2d.dtype)):
            # more prompts may rank the ids differently; the checkpoint's lm_head rows are its own ids'
            covered = coverage(held, draft.t2d.cpu().bool())
            log(f"draft vocabulary: the checkpoint's ({covered:.2%} of the held-out continuations' tokens)")
        log(f"resumed after epoch {epoch0}" + (f", step {step0} of {steps_per_epoch}" if step0 else ""))
    # the targets are the target's own logits: its last hidden state goes in after the final norm
    # (HiddenTaps keeps it before), so the verifier norm is the target's own norm, applied here
    final = taps._norm.to(dev)
    vnorm, draft.verifier_norm = draft.verifier_norm, torch.nn.Identity()
    t0 = time.time()
    try:
        for epoch in range(epoch0, cfg.epochs):
            draft.train()
            order = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch))
            first = step0 if epoch == epoch0 else 0
            if not first:
                tot, cnt = 0.0, 0
            bar = _progress(range(first, steps_per_epoch), steps_per_epoch - first, f"epoch {epoch + 1}/{cfg.epochs}")
            for i in bar:
                for g in opt.param_groups:
                    g["lr"] = lr_at(epoch * steps_per_epoch + i)
                b = [train[int(j)] for j in order[i * cfg.batch:(i + 1) * cfg.batch]]
                rows, ids, lm, last, doc, pos = (t.to(dev) for t in _pack(b, N))
                kw["max_anchors"] = step_anchors(lm, draft.block_size, cfg.anchors)
                with torch.no_grad():
                    last = final(last)
                _, loss, _m = dspark_fast.forward(draft, rows, ids, lm, last, doc, pos,
                                                  fast=not cfg.reference_forward, **kw)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                tot, cnt = tot + loss.item(), cnt + 1
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(loss=f"{tot / cnt:.3f}", refresh=False)
                if cfg.checkpoint_every and (i + 1) % cfg.checkpoint_every == 0 and i + 1 < steps_per_epoch:
                    checkpoint(epoch, i + 1)
            history.append(round(tot / max(1, cnt), 4))
            log(f"epoch {epoch + 1}/{cfg.epochs} loss {history[-1]:.4f} ({time.time() - t0:.0f}s)")
            checkpoint(epoch + 1, 0)
    finally:
        draft.verifier_norm = vnorm
    train_s = round(time.time() - t0, 1)
    draft.to("cpu").eval()
    tmp = out_p / ".work" / "save"
    shutil.rmtree(tmp, ignore_errors=True)
    draft.save_pretrained(str(tmp))
    for f in tmp.iterdir():  # files replaced one by one; .work and anything else in out stay
        if f.name == "config.py":  # speculators' own config-class source, for trust_remote_code only:
            f.unlink()  # its from_pretrained and vLLM read config.json; we ship no copy of its code
            continue
        f.replace(out_p / f.name)
    tmp.rmdir()
    from .dspark_head import load_dspark

    try:
        shipped = load_dspark(out_p)  # measured as saved, loaded by the reference's own from_pretrained
    except ValueError as e:  # its loader finds the verifier's embedding by Llama-style names only
        log(f"{out_p}: speculators cannot reload it ({e}: it looks for embed_tokens/lm_head/model.norm in "
            f"{target}'s weights); measured on the weights in memory")
        shipped = draft
    held_seqs = [(s["toks"].numpy(), s["rows"].float(), int(s["start"])) for s in held]
    res = acceptance(shipped, held_seqs)
    if num_spec_of(shipped.config) != N:
        raise RuntimeError(f"{out_p}: saved with {num_spec_of(shipped.config)} drafts, not {N}")
    if vocab:
        res["draft_vocab"] = len(vocab[0])
        res["draft_vocab_coverage"] = round(covered, 4)
    return {**res, "loss_per_epoch": history, "train_seconds": train_s, "out": str(out_p),
            "train_sequences": len(train), "held_out_sequences": len(held),
            "params": sum(p.numel() for p in params)}
