#!/usr/bin/env python3
"""The head's backbone before and after it became one native call, interleaved in one process.

"Before" is HeadRunner.backbone as of --before (default cd2c483: the numpy composition), loaded from
git beside today's module and bound to the same runner, so both arms share weights, inputs and noise.
Timed, per arm, alternating in blocks: the backbone alone, and a TorchDrafter round (the shipped
head, B requests whose windows gained ~3.6 rows each since the last round, as `serve_step` hands them
over), hot (back to back) and after an idle gap (--gap-ms between rounds: the cold caches a round
meets between an engine's forwards). Prints medians in µs, and the spread of the blocks' medians.
With --head-bench also `python -m dspark_proxy.bench.head`'s figures per arm, alternated.

    nice -n 5 python scripts/bench_backbone.py [--B 1,4,8] [--blocks 5] [--rounds 40] [--gap-ms 5] [--head-bench]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HEAD = ROOT / "models" / "stdlib-llama-head"


def old_module(rev: str):
    """dspark_proxy/model/head_runner.py as of `rev`, importable beside today's (its relative imports
    resolve in today's package)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:dspark_proxy/model/head_runner.py"],
                         check=True, capture_output=True, text=True).stdout
    f = Path(tempfile.mkdtemp()) / "old_head_runner.py"
    f.write_text(src)
    spec = importlib.util.spec_from_file_location("dspark_proxy.model._old_head_runner", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_old(runner, old) -> None:
    """This runner's backbone the old numpy one (its `_attend` with it)."""
    runner.backbone = types.MethodType(old.HeadRunner.backbone, runner)
    runner._attend = types.MethodType(old.HeadRunner._attend, runner)


def timed(fn, gap_s: float) -> float:
    if gap_s:
        time.sleep(gap_s)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Rounds:
    """B requests of one drafter walked round by round: each round 3 or 4 new rows a request (mean 3.6)."""

    def __init__(self, drafter, B: int, W: int, row_bytes: int, vocab: int, seed: int) -> None:
        from dspark_proxy.worker.session import SlotWindow

        self.dr, self.B, self.W = drafter, B, W
        self.rng = np.random.default_rng(seed)
        self.rows = self.rng.standard_normal((B, 4096, row_bytes // 2)).astype(np.float32)
        self.rows = (self.rows.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(B, 4096, -1)  # bf16
        self.slots = [SlotWindow(W, row_bytes, chains=False) for _ in range(B)]
        self.hi, self.vocab = [W] * B, vocab
        for s, sw in enumerate(self.slots):
            sw.write(0, self.rows[s, :W], True, drafter.project_rows(self.rows[s, :W]))
            sw.hi, sw.lo = W, 0

    def round(self, gap_s: float) -> float:
        from dspark_proxy.wire import ReplyWriter
        from dspark_proxy.worker.drafters import DraftItem

        news = [(4 if self.rng.random() < 0.6 else 3) for _ in self.slots]

        def one() -> None:  # the round: its new rows projected as a STEP's are, then drafted
            items = []
            for s, sw in enumerate(self.slots):
                new, hi = news[s], self.hi[s]
                src = self.rows[s, hi % 4000:][:new]
                sw.write(hi, src, False, self.dr.project_rows(src))
                sw.hi, sw.lo = hi + new, hi + new - self.W
                self.hi[s] = hi + new
                items.append(DraftItem(s, int(self.rng.integers(0, self.vocab)), sw.hi, self.W, 0,
                                       sw.segments(self.W), aux=sw.aux_window(self.W)))
            self.dr.draft(items, ReplyWriter(self.B, self.dr.num_spec, 0))

        return timed(one, gap_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="cd2c483")
    ap.add_argument("--B", default="1,4,8")
    ap.add_argument("--blocks", type=int, default=5, help="alternations per arm")
    ap.add_argument("--rounds", type=int, default=40, help="calls per block")
    ap.add_argument("--gap-ms", type=float, default=5.0)
    ap.add_argument("--head-bench", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="the kernel's threads (0: its default)")
    a = ap.parse_args()
    if a.threads:  # the drafters' per-round choice (model/head_threads.py) is capped by it too
        from dspark_proxy.model import headmm

        headmm.set_threads(a.threads)

    from dspark_proxy.model.head_runner import HeadRunner
    from dspark_proxy.model.train_head import load_head
    from dspark_proxy.worker.drafters.torch_head import TorchDrafter

    old = old_module(a.before)
    head, man = load_head(HEAD)
    runners = {"before": HeadRunner(head), "after": HeadRunner(head)}
    make_old(runners["before"], old)
    W, N = man.window, man.num_spec
    rng = np.random.default_rng(0)
    out: dict = {"before": a.before, "threads": a.threads, "gap_ms": a.gap_ms, "blocks": a.blocks, "rounds": a.rounds, "us": {}}
    for B in (int(x) for x in a.B.split(",")):
        rows = rng.standard_normal((B * W, len(man.tap_layers) * man.hidden)).astype(np.float32)
        win = runners["after"].project(rows).reshape(B, W, -1)
        lens, anchor = np.full(B, W), rng.integers(0, man.vocab_size, B)
        drafters = {k: TorchDrafter(num_spec=N, window=W, row_bytes=man.row_bytes, weights=str(HEAD)) for k in runners}
        make_old(drafters["before"].runner, old)
        walks = {k: Rounds(d, B, W, man.row_bytes, man.vocab_size, seed=B) for k, d in drafters.items()}
        for k in runners:  # the two arms compute the same backbone (the defined order may differ in the last bits)
            assert np.allclose(runners[k].backbone(win, lens, anchor, N), runners["after"].backbone(win, lens, anchor, N),
                               atol=1e-4, rtol=1e-4)
        for what in ("backbone", "round"):
            for gap in (0.0, a.gap_ms / 1e3):
                blocks: dict[str, list[float]] = {k: [] for k in runners}
                allt: dict[str, list[float]] = {k: [] for k in runners}
                for _ in range(a.blocks):
                    for k in runners:
                        if what == "backbone":
                            r = runners[k]
                            ts = [timed(lambda r=r, x=(win, lens, anchor): r.backbone(*x, N), gap) for _ in range(a.rounds)]
                        else:
                            ts = [walks[k].round(gap) for _ in range(a.rounds)]
                        ts = ts[2:]  # the block's first calls meet the other arm's caches
                        blocks[k].append(float(np.median(ts)) * 1e6)
                        allt[k] += ts
                key = f"{what} B={B} {'idle' if gap else 'hot'}"
                out["us"][key] = {k: {"p50": round(float(np.median(allt[k])) * 1e6, 1),
                                      "block_p50s": [round(x, 1) for x in blocks[k]]} for k in runners}
                print(key, {k: v["p50"] for k, v in out["us"][key].items()}, file=sys.stderr)
    if a.head_bench:
        from dspark_proxy.bench.head import bench_head

        class Before(TorchDrafter):
            def __init__(self, **kw) -> None:
                super().__init__(**kw)
                make_old(self.runner, old)

        hb: dict[str, list] = {"before": [], "after": []}
        for _ in range(3):
            for k, cls in (("before", Before), ("after", TorchDrafter)):
                hb[k].append(bench_head(ROOT / "models" / "stdlib-llama", HEAD, (1, 8, 32), 60, drafter_cls=cls)["by_requests"])
        out["head_bench"] = {k: {n: {"head_ms_runs": [r[n]["head_ms"] for r in v],
                                     "target_step_ms_runs": [r[n]["target_step_ms"] for r in v]} for n in v[0]}
                             for k, v in hb.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
