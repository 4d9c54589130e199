"""Make the shipped target: a byte-level BPE tokenizer and a small Llama trained on stdlib sources.

Deterministic for a given stdlib, step count and thread count: fixed file lists (`corpus`), seeds for
torch and the sampler. The weights are saved in bfloat16 (half the bytes to commit) and every figure in
`make_info.json` is measured on the saved weights loaded back as float32, the way users load them.
Head size 32 keeps it within what vLLM's CPU attention serves.

    python -m dspark_proxy.model.target --out models/stdlib-llama --steps 1500
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from .corpus import stdlib_corpus
from .hf import greedy_generate, load_causal_lm

__all__ = ["train_tokenizer", "encode_corpus", "make_target", "make_portable", "held_out_loss", "distinct_4gram_rate"]

EOS = "<|endoftext|>"


def train_tokenizer(texts: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=EOS, eos_token=EOS, pad_token=EOS,
                                   unk_token=None)


def encode_corpus(tok, texts: list[str]) -> np.ndarray:
    """One stream of ids, files separated by EOS, as uint16."""
    eos = tok.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for enc in tok(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


@torch.no_grad()
def held_out_loss(model, stream: np.ndarray, seq: int = 256, windows: int = 64) -> float:
    """Mean next-token loss (nats/token) over `windows` evenly spaced windows of the held-out stream."""
    starts = np.linspace(0, len(stream) - seq - 1, windows).astype(np.int64)
    x = torch.from_numpy(np.stack([stream[s:s + seq + 1] for s in starts]).astype(np.int64))
    tot = 0.0
    for b in range(0, windows, 16):
        xb = x[b:b + 16]
        logits = model(xb[:, :-1]).logits
        tot += torch.nn.functional.cross_entropy(logits.flatten(0, 1), xb[:, 1:].flatten(), reduction="sum").item()
    return tot / (windows * seq)


def held_out_prompts(stream: np.ndarray, n: int, length: int) -> torch.Tensor:
    starts = np.linspace(0, len(stream) - length - 1, n).astype(np.int64)
    return torch.from_numpy(np.stack([stream[s:s + length] for s in starts]).astype(np.int64))


def distinct_4gram_rate(gen: np.ndarray) -> float:
    """Distinct 4-grams / 4-grams, per sequence, averaged: 1.0 never repeats, low values loop."""
    rates = []
    for row in gen:
        grams = [tuple(row[i:i + 4]) for i in range(len(row) - 3)]
        rates.append(len(set(grams)) / max(1, len(grams)))
    return float(np.mean(rates))


def make_portable(out: Path) -> None:
    """Add the keys older readers expect (transformers 4.x, and vLLM on it): rope_theta and torch_dtype
    beside 5.x's rope_parameters and dtype, and a tokenizer class both major versions know."""
    cfg_p, tok_p = out / "config.json", out / "tokenizer_config.json"
    cfg = json.loads(cfg_p.read_text())
    cfg.setdefault("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    cfg.setdefault("torch_dtype", cfg.get("dtype", "bfloat16"))
    cfg_p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tk = json.loads(tok_p.read_text())
    tk["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_p.write_text(json.dumps(tk, indent=2, sort_keys=True) + "\n")


def make_target(out: Path, *, steps: int, vocab: int = 4096, hidden: int = 192, layers: int = 4,
                heads: int = 6, ffn: int = 512, seq: int = 256, batch: int = 16, lr: float = 3e-3,
                seed: int = 0, threads: int = 1, log_every: int = 25) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    t0 = time.time()
    corpus = stdlib_corpus()
    train_texts, held_texts = corpus.read("train"), corpus.read("held_out")
    tok = train_tokenizer(train_texts, vocab)
    train_ids, held_ids = encode_corpus(tok, train_texts), encode_corpus(tok, held_texts)
    print(f"corpus: {len(corpus.train)} train files ({len(train_ids)} tokens), {len(corpus.held_out)} "
          f"held-out files ({len(held_ids)} tokens), tokenizer {time.time() - t0:.0f}s", flush=True)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, head_dim=hidden // heads,
                      max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    rng = np.random.default_rng(seed)
    model.train()
    t1 = time.time()
    for step in range(steps):
        starts = rng.integers(0, len(train_ids) - seq - 1, batch)
        xb = torch.from_numpy(np.stack([train_ids[s:s + seq + 1] for s in starts]).astype(np.int64))
        loss = model(xb[:, :-1], labels=xb[:, :-1].clone()).loss  # HF shifts labels itself
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps - 1:
            el = time.time() - t1
            print(f"step {step + 1}/{steps} loss {loss.item():.3f} {el:.0f}s "
                  f"(eta {el / (step + 1) * (steps - step - 1):.0f}s)", flush=True)
    train_s = time.time() - t1
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    make_portable(out)
    model, tok = load_causal_lm(out)  # every figure from the weights as shipped
    loss = held_out_loss(model, held_ids)
    gen = greedy_generate(model, held_out_prompts(held_ids, 16, 32), 64)[:, 32:].numpy()
    info = {
        "corpus_digest": corpus.digest(), "python_stdlib": str(corpus.root),
        "train_files": len(corpus.train), "held_out_files": len(corpus.held_out),
        "train_tokens": int(len(train_ids)), "held_out_tokens": int(len(held_ids)),
        "steps": steps, "batch": batch, "seq": seq, "lr": lr, "seed": seed, "threads": threads,
        "train_seconds": round(train_s, 1), "params": sum(p.numel() for p in model.parameters()),
        "held_out_loss_nats_per_token": round(loss, 4),
        "greedy_distinct_4gram_rate": round(distinct_4gram_rate(gen), 4),
        "greedy_eval": "16 held-out prompts of 32 tokens, 64 greedy tokens each",
    }
    (out / "make_info.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("models/stdlib-llama"))
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args(argv)
    info = make_target(a.out, steps=a.steps, vocab=a.vocab, hidden=a.hidden, layers=a.layers,
                       seq=a.seq, batch=a.batch, threads=a.threads)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
