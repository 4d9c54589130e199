"""`dspark-proxy generate` as a library call: the reference engine with its drafts from a real proxy and
worker (started here, or an already running proxy by name), from prompt lookup, or from nowhere."""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch

from .drafts import NgramDrafts, NoDrafts, ShimDrafts
from .engine import Request, RunStats, SpecEngine
from .target import TargetEngine

__all__ = ["DEFAULT_MODEL", "DEFAULT_HEAD", "held_out_prompts", "open_engine", "generate"]

_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = str(_ROOT / "models" / "stdlib-llama")
DEFAULT_HEAD = str(_ROOT / "models" / "stdlib-llama-head")


def held_out_prompts(tokenizer, n: int, length: int) -> list[np.ndarray]:
    """n prompts of `length` tokens, evenly spaced over the held-out stdlib stream (as train-drafter
    measures acceptance: text the target and the head never saw)."""
    from ..model.corpus import stdlib_corpus
    from ..model.target import encode_corpus

    stream = encode_corpus(tokenizer, stdlib_corpus().read("held_out"))
    starts = np.linspace(0, len(stream) - length - 1, n).astype(np.int64)
    return [stream[s:s + length].astype(np.int64) for s in starts]


def open_engine(model: str, head: str | None, *, max_batch: int, max_len: int) -> TargetEngine:
    """The target with the head manifest's tap (no tap without a head: target-only or n-gram)."""
    from ..model.head_shapes import load_head_shapes

    man = load_head_shapes(head) if head else None
    return TargetEngine(model, slots=max_batch, max_len=max_len, tap_layers=man.tap_layers if man else None,
                        row_dtype=man.row_dtype if man else "bfloat16")


def generate(prompts: list[np.ndarray], *, model: str = DEFAULT_MODEL, head: str = DEFAULT_HEAD,
             drafter: str = "proxy", proxy: str | None = None, max_new: int = 64, max_batch: int = 4,
             temperature: float = 0.0, seed: int = 0, deadline_ms: float = 50.0, num_spec: int = 5,
             threads: int = 1, target: TargetEngine | None = None) -> tuple[RunStats, SpecEngine]:
    """Generate for every prompt (batched, joining as slots free up); drafter: proxy | ngram | none."""
    from ..model.head_shapes import load_head_shapes

    torch.set_num_threads(threads)
    man = load_head_shapes(head) if drafter == "proxy" else None
    N = man.num_spec if man else num_spec
    max_len = max(len(p) for p in prompts) + max_new + N + 2
    if target is None:
        target = open_engine(model, head if man else None, max_batch=max_batch, max_len=max_len)
    reqs = [Request(i, np.asarray(p, np.int64), max_new, temperature, seed + i) for i, p in enumerate(prompts)]
    with ExitStack() as stack:
        if drafter == "none":
            src = NoDrafts(N)
        elif drafter == "ngram":
            src = NgramDrafts(N)
        elif drafter == "proxy":
            assert man is not None
            import engine_shim

            name = proxy
            if name is None:
                from .system import SpecSystem

                name = f"gen-{os.getpid()}"
                stack.enter_context(SpecSystem(name, head, max_reqs=max_batch, deadline_ms=deadline_ms,
                                               sampled=temperature > 0, seed=seed, target=model))
            from ..model.hf import target_id

            # the engine names its target: a worker whose head was made for another refuses it
            shim = engine_shim.attach(name, max_reqs=max_batch, num_spec=N, window=man.window,
                                      row_bytes=man.row_bytes, sampled=temperature > 0, timeout_s=10.0,
                                      target_id=target_id(model))
            stack.callback(shim.close)
            src = ShimDrafts(shim)
        else:
            raise ValueError(f"drafter {drafter!r}: proxy, ngram or none")
        eng = SpecEngine(target, src, max_batch=max_batch, window=man.window if man else 16, seed=seed)
        return eng.run(reqs), eng
