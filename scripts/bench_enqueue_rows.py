#!/usr/bin/env python3
"""The engine's row copy with large rows: `enqueue` of n decode rows of row_bytes each, the engine's
ring private (rows copied into it and into the segment's staging: `DSPARK_SHARED_RING=0`) beside the
ring shared (rows written once, into the ring the proxy sends from), in one run, against one numpy
copy of the same bytes (this machine's memcpy).

One thread plays both sides on the in-process rig (dspark_proxy/bench/rig.py) with the null worker,
so nothing waits on another process: the engine enqueues (timed), the proxy handles the round (timed
apart), the engine reads the reply. Each request writes one row a round, so the first W rounds touch
ring rows never written before (page faults, reported apart) and later ones rewrite them.

Measured here (shared 2-core machine, load average ~3; noisy, compare within a run), 256 x 71,680 B
(18.4 MB) a round, two runs: memcpy 0.66 / 0.52 ms; private ring + staging: enqueue 1.73 / 1.53 ms (38% /
34% of memcpy), 12.0 / 23.2 ms in the first W rounds; shared ring: 0.76 / 0.66 ms (87% / 79% of memcpy),
0.79 / 0.68 ms in the first W rounds; its set-up (reserve and map 2.35 GB) 1.5 / 3.6 s against 0.2 / 0.3 s.

    python scripts/bench_enqueue_rows.py [--n 256] [--row-bytes 71680] [--window 128] [--rounds 170]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from dspark_proxy.bench.batches import RoundGen
from dspark_proxy.bench.rig import RoundRig
from dspark_proxy.shm.layout import LayoutParams, derive_sizes
from dspark_proxy.worker.inproc import InProcessClient


def run(shared: bool, n: int, W: int, B: int, rounds: int) -> dict[str, float]:
    """One rig with the ring shared or private; medians in ms."""
    os.environ["DSPARK_SHARED_RING"] = "1" if shared else "0"  # read when the shim is made
    M, N = n, 5
    max_rows, R = derive_sizes(M, N, W, B, 256)
    p = LayoutParams(max_reqs=M, num_spec=N, window=W, row_bytes=B, max_rows=max_rows, resync_per_round=R,
                     sampled=False)
    t0 = time.perf_counter()
    rig = RoundRig(f"bench-enq-{os.getpid()}-{int(shared)}", p,
                   InProcessClient(max_reqs=M, num_spec=N, window=W, row_bytes=B, null=True))
    setup = time.perf_counter() - t0
    gen = RoundGen(n, num_spec=N, window=W, row_bytes=B, fixed_valid=1)
    enq, proxy = [], []
    try:
        for _ in range(rounds):
            b = gen.next()
            rig.t += 1
            t0 = time.perf_counter()
            rig.shim.enqueue(rig.t, **b)
            t1 = time.perf_counter()
            rig.core.handle(rig.t, 0.0)
            proxy.append(time.perf_counter() - t1)
            if rig.shim.read_reply(rig.t).status != 0:
                raise RuntimeError(f"round {rig.t} failed: {rig.stats.snapshot()['counters']}")
            enq.append(t1 - t0)
    finally:
        rig.close()
    e, h = np.array(enq) * 1e3, np.array(proxy) * 1e3
    return {"setup_ms": setup * 1e3, "enqueue_first_w_ms": float(np.median(e[:W])),
            "enqueue_ms": float(np.median(e[W:])), "proxy_round_ms": float(np.median(h[W:]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--row-bytes", type=int, default=71680)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=170)
    a = ap.parse_args()
    if a.rounds <= a.window + 10:
        ap.error("--rounds must exceed --window by at least 10 (the rounds after every slot wrapped)")
    res = {shared: run(shared, a.n, a.window, a.row_bytes, a.rounds) for shared in (False, True)}
    nbytes = a.n * a.row_bytes
    src = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    times = []
    for _ in range(40):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    mc = float(np.median(times[5:])) * 1e3
    print(f"{a.n} rows x {a.row_bytes} B = {nbytes / 1e6:.1f} MB a round; memcpy {mc:.3f} ms "
          f"({nbytes / mc / 1e6:.1f} GB/s)")
    for shared, r in res.items():
        print(f"{'shared ring' if shared else 'private ring + staging'}: set-up {r['setup_ms']:.0f} ms; enqueue "
              f"{r['enqueue_ms']:.3f} ms ({mc / r['enqueue_ms'] * 100:.0f}% of memcpy), first W rounds "
              f"{r['enqueue_first_w_ms']:.3f} ms; proxy round {r['proxy_round_ms']:.3f} ms")


if __name__ == "__main__":
    main()
