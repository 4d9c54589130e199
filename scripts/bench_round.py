#!/usr/bin/env python3
"""The proxy's own cost per round: RoundCore.handle() over a real segment, with an in-process null worker.

One thread plays both sides, on the rig tests/rig.py uses too (dspark_proxy/bench/rig.py): the real engine shim enqueues round t (untimed), the
proxy's RoundCore.handle(t) runs (timed), the shim reads the reply (untimed). The worker is the
in-process null client (fixed drafts, no windows), so what is timed is the round's bookkeeping,
validation, entries, reply packing and publish, plus the null client's few µs, which are also timed
on their own and reported as `step_us` (the issue's "rank0_round_us minus rtt_us" is `own_us`).

Mixes (all N = 5, 64-byte rows unless --row-bytes):
  decode   every request decodes: valid = 1 + k accepted drafts (k random in [0, N]), positions continue
  prefill  decode, plus every round ~1/8 of the slots (at least one) get a new request that sends a
           prefill chunk of W rows (half of them jump forward: a prompt longer than W)
  resync   decode, plus every round R random slots are marked dirty (as a failed request would), so
           the round asks for their windows and later rounds send them as RESYNC entries

With --cold, 16 MiB are swept between each enqueue and its round, so the round runs with caches that
hold none of its code or data, as it does at a real engine's pace (docs/performance.md, "What each section and row
means", the paced hand-off).

Prints one line per (W, n, mix): median and p90 of handle() and of the proxy's own time, over
--rounds rounds after --warmup. Asserts nothing about speed.

    python scripts/bench_round.py [--n 1,16,64,256,1024] [--W 16,128] [--mix decode,prefill]
                                  [--rounds 2000] [--repeat 1] [--max-slots M] [--cold] [--json] [--lineprof]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np

from dspark_proxy.bench.rig import RoundRig, TimedClient
from dspark_proxy.shm.layout import LayoutParams
from dspark_proxy.worker.inproc import InProcessClient

N_SPEC = 5
R_PER_ROUND = 4
COLD_BYTES = 16 << 20  # --cold: more than this machine's L2s and its share of L3


class Bench:
    """The shared round rig (dspark_proxy/bench/rig.py) over a timed null worker; rounds of a given mix."""

    def __init__(self, n: int, W: int, row_bytes: int, mix: str, seed: int = 1, max_slots: int = 0) -> None:
        M = max(n, max_slots)  # the segment's max_reqs; the round uses n of its slots
        self.n, self.W, self.B, self.mix = n, W, row_bytes, mix
        name = f"bench_round_{os.getpid()}_{n}_{W}_{mix}"
        p = LayoutParams(max_reqs=M, num_spec=N_SPEC, window=W, row_bytes=row_bytes, max_rows=n * W,
                         resync_per_round=min(n, R_PER_ROUND))
        self.client = TimedClient(InProcessClient(max_reqs=M, num_spec=N_SPEC, window=W, row_bytes=row_bytes,
                                                  null=True))
        self.rig = RoundRig(name, p, self.client)
        self.shim, self.core, self.stats = self.rig.shim, self.rig.core, self.rig.stats
        self.rng = np.random.default_rng(seed)
        self.t = 0
        self.req = np.arange(n, dtype=np.int64)  # request id per batch position
        self.next_req = n
        self.pos = np.zeros(n, dtype=np.int64)  # next position per batch position
        # the engine's request-state indices are not the batch order (vLLM's idx_mapping): a permutation
        self.slots = self.rng.permutation(M)[:n].astype(np.int64)
        self.rows = np.zeros((n * W, row_bytes), dtype=np.uint8)

    def close(self) -> None:
        self.rig.close()

    def _batch(self) -> dict:
        n, W, rng = self.n, self.W, self.rng
        k = rng.integers(0, N_SPEC + 1, n)
        valid = 1 + k
        q = np.full(n, N_SPEC + 1, dtype=np.int64)
        if self.mix == "prefill" or self.t == 0:
            fresh = (np.arange(n) if self.t == 0
                     else rng.choice(n, max(1, n // 8), replace=False))
            self.req[fresh] = self.next_req + np.arange(fresh.shape[0])
            self.next_req += fresh.shape[0]
            longer = rng.random(fresh.shape[0]) < 0.5
            self.pos[fresh] = np.where(longer, 3 * W, 0)  # a prompt longer than W sends its last W rows
            valid[fresh] = W
            k[fresh] = 0
            q[fresh] = np.where(longer, 4 * W, W)
        if self.mix == "resync" and self.t > 0:
            self.core.slots.mark_dirty(self.slots[rng.choice(n, min(n, R_PER_ROUND), replace=False)])
        first = self.pos.copy()
        self.pos += valid
        qsl = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(q, out=qsl[1:])
        return dict(req_ids=self.req.copy(), slots=self.slots, qsl=qsl, need_draft=np.ones(n, bool),
                    k_window=k, rows=self.rows[:int(valid.sum())], valid=valid, first_pos=first,
                    anchor=(first + valid) % 50_000)

    def run(self, rounds: int, handle_ns: list[int] | None, step_ns: list[int] | None,
            cold: np.ndarray | None = None) -> None:
        shim, core, client = self.shim, self.core, self.client
        for _ in range(rounds):
            b = self._batch()
            self.t += 1
            shim.enqueue(self.t, **b)
            if cold is not None:  # every cache line of it touched: the caches hold none of the round's
                cold[::64] += 1
            client.last_ns = 0
            t0 = time.perf_counter_ns()
            core.handle(self.t, 0.0)
            dt = time.perf_counter_ns() - t0
            reply = shim.read_reply(self.t)
            if handle_ns is not None:
                handle_ns.append(dt)
                step_ns.append(client.last_ns)
            if not reply.ok_mask.all():
                raise RuntimeError(f"round {self.t}: not every request got drafts (status {reply.status})")


def measure(n: int, W: int, mix: str, rounds: int, warmup: int, row_bytes: int, repeat: int = 1,
            max_slots: int = 0, cold: bool = False) -> dict:
    """Medians over `rounds` rounds; with `repeat` > 1, the repeat with the lowest median handle() time
    (other processes on a shared machine only ever add time, so the least disturbed run is the truest)."""
    b = Bench(n, W, row_bytes, mix, max_slots=max_slots)
    try:
        b.run(warmup, None, None)
        best: tuple[np.ndarray, np.ndarray] | None = None
        for _ in range(repeat):
            h: list[int] = []
            s: list[int] = []
            gc.collect()
            b.run(rounds, h, s, np.zeros(COLD_BYTES, np.uint8) if cold else None)
            ha, sa = np.array(h) / 1e3, np.array(s) / 1e3
            if best is None or np.median(ha) < np.median(best[0]):
                best = ha, sa
        ha, sa = best
        own = ha - sa
        c = b.stats.snapshot()["counters"]
        return {"n": n, "W": W, "M": max(n, max_slots), "mix": mix, "rounds": rounds, "repeat": repeat, "cold": cold,
                "handle_p50_us": round(float(np.median(ha)), 1), "handle_p90_us": round(float(np.percentile(ha, 90)), 1),
                "own_p50_us": round(float(np.median(own)), 1), "own_p90_us": round(float(np.percentile(own, 90)), 1),
                "step_p50_us": round(float(np.median(sa)), 1),
                "resync_rounds": c.get("resync_rounds", 0), "rounds_ok": c.get("rounds_ok", 0),
                "rounds_failed": c.get("rounds_failed", 0)}
    finally:
        b.close()


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=_ints, default=[1, 16, 64, 256, 1024])
    ap.add_argument("--W", type=_ints, default=[16, 128])
    ap.add_argument("--mix", default="decode,prefill")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=1, help="report the least disturbed of this many runs")
    ap.add_argument("--row-bytes", type=int, default=64)
    ap.add_argument("--max-slots", type=int, default=0,
                    help="the segment's max_reqs (default: n); rounds use n slots of it at random")
    ap.add_argument("--cold", action="store_true", help="sweep 16 MiB between enqueue and the round: the round "
                    "as a real engine's pace finds it, its caches holding someone else's data")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--lineprof", action="store_true", help="line-profile the round (one n, W, mix)")
    a = ap.parse_args(argv)
    mixes = [m for m in a.mix.split(",") if m]
    if a.lineprof:
        return _lineprof(a.n[0], a.W[0], mixes[0], a.rounds, a.warmup, a.row_bytes, a.max_slots)
    out = []
    if not a.json:
        print(f"{'W':>4} {'n':>5} {'mix':>8} {'handle p50':>11} {'p90':>7} {'own p50':>8} {'p90':>7} "
              f"{'step p50':>9}  (µs; own = handle - null worker step)")
    for W in a.W:
        for mix in mixes:
            for n in a.n:
                r = measure(n, W, mix, a.rounds, a.warmup, a.row_bytes, a.repeat, a.max_slots, a.cold)
                out.append(r)
                if not a.json:
                    print(f"{W:>4} {n:>5} {mix:>8} {r['handle_p50_us']:>11.1f} {r['handle_p90_us']:>7.1f} "
                          f"{r['own_p50_us']:>8.1f} {r['own_p90_us']:>7.1f} {r['step_p50_us']:>9.1f}",
                          flush=True)
    if a.json:
        json.dump(out, sys.stdout, indent=1)
        print()
    return 0


def _lineprof(n: int, W: int, mix: str, rounds: int, warmup: int, row_bytes: int, max_slots: int) -> int:
    from line_profiler import LineProfiler

    import dspark_proxy.round.core as rnd
    import dspark_proxy.round.ring_model as ring

    lp = LineProfiler()
    for cls in (rnd.RoundCore, ring.SlotTable):
        for name, fn in vars(cls).items():
            if callable(fn) and not name.startswith("__"):
                lp.add_function(fn)
    b = Bench(n, W, row_bytes, mix, max_slots=max_slots)
    try:
        b.run(warmup, None, None)
        lp.enable()
        b.run(rounds, [], [])
        lp.disable()
    finally:
        b.close()
    lp.print_stats(output_unit=1e-6, stripzeros=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
