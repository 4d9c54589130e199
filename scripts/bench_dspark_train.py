#!/usr/bin/env python3
"""Cost an anchor of one `train-drafter --arch dspark` step, the reference's dense-mask forward against
the block-local one (dspark_proxy/model/dspark_fast.py), interleaved in one process.

A step is forward, backward and AdamW on a fresh head shaped as the shipped one (window 16, 5 drafts,
layers 1,2,4), with every valid position an anchor, over the sequences of a cached training set
(`<out>/.work/dspark-train-*.pt`, written by `train-drafter --arch dspark`). The arms alternate step by
step on the same sequences' successors, so a busy machine slows both alike; the first round is warm-up.

    nice -n 5 python scripts/bench_dspark_train.py DATA.pt [--batch 1,2,8] [--rounds 6] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--target", default=str(ROOT / "models" / "stdlib-llama"))
    ap.add_argument("--batch", default="1,2,8")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sequences", type=int, default=400, help="Sequences of DATA loaded.")
    a = ap.parse_args()
    from speculators.models.dspark import DSparkDraftModel
    from transformers import AutoConfig

    from dspark_proxy.model import dspark_fast
    from dspark_proxy.model.dspark_head import build_dspark
    from dspark_proxy.model.dspark_train import _pack, step_anchors

    torch.set_num_threads(a.threads)
    train = torch.load(a.data, weights_only=False)[:a.sequences]
    draft = build_dspark(AutoConfig.from_pretrained(a.target), verifier_path=a.target, layers=[1, 2, 4],
                         num_spec=5, window=16, mask_token_id=0).train()
    draft.verifier_norm = torch.nn.Identity()  # as the trainer feeds it: targets after the final norm
    with torch.no_grad():  # the verifier-owned weights start as NaN until filled from a target
        for w in (draft.embed_tokens.weight, draft.lm_head.weight, draft.verifier_lm_head.weight):
            w.normal_(0, 0.02)
    kw, _ = DSparkDraftModel.get_trainer_kwargs(loss_fn="kl_div", loss_implementation="eager")
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-4)

    def step(seqs: list[dict], fast: bool) -> tuple[float, int]:
        rows, ids, lm, last, doc, pos = _pack(seqs, draft.block_size)
        kw["max_anchors"] = step_anchors(lm, draft.block_size, 0)
        t = time.perf_counter()
        _, loss, _ = dspark_fast.forward(draft, rows, ids, lm, last, doc, pos, fast=fast, **kw)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return time.perf_counter() - t, kw["max_anchors"]

    arms = [(b, f) for b in map(int, a.batch.split(",")) for f in (False, True)]
    got = {arm: [0.0, 0] for arm in arms}
    i = 0
    for r in range(a.rounds + 1):
        for b, f in arms:
            dt, n = step(train[i:i + b], f)
            i = (i + b) % max(1, len(train) - b)
            if r:
                got[(b, f)][0] += dt
                got[(b, f)][1] += n
    for (b, f), (t, n) in got.items():
        print(f"batch {b:3d} {'block-local' if f else 'reference  '}: {1000 * t / max(1, n):.3f} ms an anchor "
              f"({n} anchors)")


if __name__ == "__main__":
    main()
