#!/usr/bin/env python3
"""The STEP's round trip beyond the worker's own time (`rtt - worker`, eval's round_parts_ms), alone.

STEPs of `eval --quick`'s shape (4 requests, one new 1152-byte row each, N=5, W=16) from a
TcpDraftClient in this process to an integrity worker process on loopback, one every --every-ms (an
engine's pace: both sides sleep between STEPs, as in eval), after a first STEP of W rows. Prints one
JSON line: the p50s of rtt and of the worker's reported time, and their difference (docs/performance.md,
"The STEP's round trip beyond the worker's own time"). --keep-awake-ms starts the worker with it and
kicks the same spinners here after each STEP, as a proxy with it does; --spin-us starts the worker with
it and waits for each reply with it, as a proxy with it does.

    python scripts/bench_step_gap.py [--steps 800] [--every-ms 5] [--keep-awake-ms 0] [--spin-us 0] [--pin]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import dspark_proxy.wire as wire
from dspark_proxy.link.client import TcpDraftClient
from dspark_proxy.ops.keep_awake import KeepAwake
from dspark_proxy.ops.launch import spawn_worker

M, N, W, RB = 4, 5, 16, 1152


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--every-ms", type=float, default=5.0)
    ap.add_argument("--keep-awake-ms", type=float, default=0.0)
    ap.add_argument("--spin-us", type=float, default=0.0)
    ap.add_argument("--pin", action="store_true", help="this process on the first CPU, the worker on the second")
    a = ap.parse_args(argv)
    ka = ["--keep-awake-ms", str(a.keep_awake_ms)] if a.keep_awake_ms > 0 else []
    ka += ["--spin-us", str(a.spin_us)] if a.spin_us > 0 else []
    worker = spawn_worker("--max-reqs", str(M), "--num-spec", str(N), "--window", str(W), "--row-bytes", str(RB),
                          *ka, timeout_s=60.0)
    if a.pin:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus[:1])
        for tid in os.listdir(f"/proc/{worker.pid}/task"):  # its threads, started already
            os.sched_setaffinity(int(tid), cpus[1:2])
    client = TcpDraftClient("127.0.0.1", int(worker.address.rsplit(":", 1)[1]), max_reqs=M, num_spec=N, window=W,
                            row_bytes=RB, backoff_s=(0.01, 0.05), spin_us=a.spin_us)
    awake = KeepAwake(a.keep_awake_ms)
    client.start()
    try:
        end = time.monotonic() + 20.0
        while client.connection_epoch() is None and time.monotonic() < end:
            time.sleep(0.01)
        prefix = wire.StepPrefix(M, False)
        rng = np.random.default_rng(0)
        rtt, own, failed, pos = [], [], 0, 0
        for i in range(a.steps):
            e = prefix.entries(M)
            k = W if pos == 0 else 1
            flags = (wire.RF_NEW_GEN | wire.RF_NEED_DRAFT) if pos == 0 else wire.RF_NEED_DRAFT
            for r in range(M):
                e[r] = (r, k, 1, pos, pos + k, 42 + i % 100, flags, 0, 0, 0)
            rows = rng.integers(0, 256, (M * k, RB), dtype=np.uint8)
            pos = 0 if pos + k > 3000 else pos + k
            out = client.step(prefix, e, M * k, step_id=i + 1, step_flags=0, epoch=client.connection_epoch() or 0,
                              rows=[rows], timeout_s=2.0)
            if not out.ok:
                failed += 1
            elif i >= 50:  # past the start-up
                rtt.append(out.rtt_us)
                own.append(out.reply.worker_us)
            awake.kick()
            time.sleep(a.every_ms / 1e3)
    finally:
        client.stop()
        worker.stop()
        awake.close()
    r, w = float(np.median(rtt)), float(np.median(own))
    print(json.dumps({"gap_us": round(r - w, 1), "rtt_us": round(r, 1), "worker_us": round(w, 1), "steps": len(rtt),
                      "failed": failed, "keep_awake_ms": a.keep_awake_ms, "spin_us": a.spin_us, "pinned": a.pin, "load": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
