"""The head's cost per round beside one target step, measured side by side in one run.

The DSpark head only pays off while a round of drafting costs well under a target forward, so the
two are timed interleaved (the same noise falls on both): a one-token target step with its KV cache
for n requests, and the worker's torch drafter drafting N positions for n requests whose windows
each gained `new_rows` rows since the last round (what a round of speculative decoding hands it).
Both on one thread, p50 over `rounds`.

    python -m dspark_proxy.bench.head --target models/stdlib-llama --head models/stdlib-llama-head
    python -m dspark_proxy.bench.head --target models/stdlib-llama --head models/stdlib-llama-dspark

Either kind of head: a manifest head runs on the worker's `torch` drafter, a DSpark checkpoint on its
`dspark` drafter (its new rows' keys and values at their positions, as the worker's serve loop asks).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from ..model.head_shapes import DSparkShapes, load_head_shapes
from ..model.hf import Tap, _cache_kw, load_causal_lm

__all__ = ["bench_head"]


@torch.inference_mode()
def bench_head(target: str | Path, weights: str | Path, ns: tuple[int, ...] = (1, 8, 32), rounds: int = 60,
               new_rows: int = 3, drafter_cls=None) -> dict:
    from ..wire import ReplyWriter
    from ..worker.drafters import DraftItem
    from ..worker.drafters.torch_head import TorchDrafter
    from ..worker.session import SlotWindow

    torch.set_num_threads(1)
    man = load_head_shapes(weights)
    model, _ = load_causal_lm(target)
    N, W, RB = man.num_spec, man.window, man.row_bytes
    if isinstance(man, DSparkShapes):
        from ..worker.drafters.registry import make_drafter

        def make(**kw):
            return make_drafter("dspark", **kw, head=str(weights), target=str(target), row_dtype=man.row_dtype,
                                device="cpu", max_reqs=max(ns))
    else:
        make = drafter_cls or TorchDrafter
    kw = _cache_kw(model)
    rng = np.random.default_rng(0)
    res: dict[str, dict] = {}
    for n in ns:
        dr = make(num_spec=N, window=W, row_bytes=RB, weights=str(weights))
        project = getattr(dr, "project_rows", None)  # kept beside the rows, as the worker's serve loop does
        project = _at_positions(project) if project is not None else None
        ctx_len = 64
        prompts = torch.from_numpy(rng.integers(1, man.vocab_size, (n, ctx_len)))
        tap = Tap(model, man.tap_layers)
        with tap:
            out = model(prompts, use_cache=True)
        rows = tap.rows(getattr(torch, man.row_dtype)).contiguous().view(torch.uint8).numpy()  # [n, T, RB]
        slots = [SlotWindow(W, RB, chains=False) for _ in range(n)]
        for s, sw in enumerate(slots):
            sw.write(0, rows[s, :W], True, project(rows[s, :W], np.arange(W)) if project else None)
            sw.hi, sw.lo = W, 0
        nxt = out.logits[:, -1:].argmax(-1)
        cache = getattr(out, kw)
        t_head, t_target = [], []
        for r in range(rounds):
            t0 = time.perf_counter()
            out = model(nxt, use_cache=True, **{kw: cache})
            t_target.append(time.perf_counter() - t0)
            cache, nxt = getattr(out, kw), out.logits[:, -1:].argmax(-1)
            hi = W + (r + 1) * new_rows
            src = rows[np.arange(n)[:, None], (hi - new_rows + np.arange(new_rows)[None]) % ctx_len]  # [n, new, RB]
            t0 = time.perf_counter()  # the round: its new rows projected (all at once, as a STEP's), then drafted
            pos = np.tile(hi - new_rows + np.arange(new_rows), n)
            proj = project(src.reshape(n * new_rows, RB), pos).reshape(n, new_rows, -1) if project else [None] * n
            items = []
            for s, sw in enumerate(slots):
                sw.write(hi - new_rows, src[s], False, proj[s])
                sw.hi, sw.lo = hi, hi - W
                items.append(DraftItem(s, int(nxt[s, 0]), hi, W, 0, sw.segments(W), aux=sw.aux_window(W)))
            reply = ReplyWriter(n, N, 0)
            dr.draft(items, reply)
            t_head.append(time.perf_counter() - t0)
        skip = min(5, rounds // 4)  # warm-up
        h, t = 1e3 * float(np.median(t_head[skip:])), 1e3 * float(np.median(t_target[skip:]))
        res[str(n)] = {"head_ms": round(h, 3), "target_step_ms": round(t, 3), "ratio": round(h / t, 3)}
    return {"num_spec": N, "window": W, "new_rows": new_rows, "rounds": rounds, "by_requests": res}


def _at_positions(project):
    """A per-row transform called as (rows, positions), whatever it needs (the worker's own dispatch)."""
    from ..worker.drafters.base import project_at

    return lambda rows, pos: project_at(project, rows, lambda: pos)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, default=Path("models/stdlib-llama"))
    ap.add_argument("--head", "--weights", dest="weights", type=Path, default=Path("models/stdlib-llama-head"),
                    help="The head directory (--weights: its old name).")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--requests", default="1,8,32")
    a = ap.parse_args(argv)
    print(json.dumps(bench_head(a.target, a.weights, tuple(int(x) for x in a.requests.split(",")), a.rounds)))


if __name__ == "__main__":
    main()
