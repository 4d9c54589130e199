"""Section 3, scaling: what the proxy's round costs per request and row, and what the engine side
costs, for n = 1 .. 1024 requests, W = 16 .. 256, decode and prefill mixes.

Driven in one process, round by round, on the shared rig (bench/rig.py, as tests/rig.py is): a real
segment, a real Shim (no watchdog thread) and a real RoundCore over a null worker
(`InProcessClient(null=True)`). So nothing here waits on another process, and each figure is pure
CPU work:

- proxy cost = `RoundCore.handle(t)` minus the null worker's own `step()` inside it: reading the
  stamped descriptor and metadata, validation, the ring model, the breaker, entries and row views,
  accepting the reply, packing and publishing the page (`rank0_round_us - rtt_us` of a real proxy);
- engine cost = `Shim.enqueue` + `Shim.read_reply` (the reply is already published, so this is the
  copy of rows into the engine ring and the staging, metadata, descriptor, raising `gathered`, then
  the seqlock page copy and parse).

Rows are 256 bytes here: the proxy never touches row bytes (it sends views), and the engine's
row copies at realistic row sizes are the rows section's subject.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .batches import MIXES, RoundGen
from .measure import Samples, default_prefix, summarize

__all__ = ["run_scaling", "ScaleRig"]

NUM_SPEC = 5
ROW_BYTES = 256
FULL_N = (1, 16, 64, 256, 1024)
FULL_W = (16, 64, 128, 256)
QUICK_N = (1, 16, 256, 1024)
QUICK_W = (16, 128)


class ScaleRig:
    """The shared round rig (bench/rig.py) for one (M, W) over a timed null worker: rounds run in
    this thread, one at a time."""

    def __init__(self, name: str, *, max_reqs: int, window: int, num_spec: int = NUM_SPEC,
                 row_bytes: int = ROW_BYTES) -> None:
        from dspark_proxy.round.core import RoundSettings
        from dspark_proxy.shm.layout import LayoutParams
        from dspark_proxy.worker.inproc import InProcessClient

        from .rig import RoundRig, TimedClient

        p = LayoutParams(max_reqs=max_reqs, num_spec=num_spec, window=window, row_bytes=row_bytes,
                         max_rows=max_reqs * window, resync_per_round=min(max_reqs, 8))
        self.client = TimedClient(InProcessClient(null=True, max_reqs=max_reqs, num_spec=num_spec, window=window,
                                                  row_bytes=row_bytes))
        self.rig = RoundRig(name, p, self.client, deadline_ms=60_000.0, breaker=(3, 50),
                            settings=RoundSettings(step_timeout_s=60.0))
        self.t = 0

    def round(self, kw: dict[str, Any]) -> tuple[int, int, int, int]:
        """One round: (enqueue ns, handle ns, worker step ns, read_reply ns)."""
        self.t += 1
        t = self.t
        rig = self.rig
        clock = time.perf_counter_ns
        t0 = clock()
        rig.shim.enqueue(t, **kw)
        t1 = clock()
        rig.core.handle(t, 0.0)
        t2 = clock()
        reply = rig.shim.read_reply(t)
        t3 = clock()
        if reply.status == 2:
            raise RuntimeError(f"scaling rig: round {t} failed ({reply.reason})")
        return t1 - t0, t2 - t1, self.client.last_ns, t3 - t2

    def close(self) -> None:
        self.rig.close()


def _fit(ns: list[int], p50: list[float]) -> dict[str, float]:
    """Least-squares line p50 = a + b n: the per-request slope and the fixed part."""
    b, a = np.polyfit(np.asarray(ns, np.float64), np.asarray(p50, np.float64), 1)
    return {"fixed_us": round(float(a), 2), "us_per_request": round(float(b), 4)}


def run_scaling(quick: bool = False, say: Callable[[str], None] = lambda s: None,
                prefix: str = "") -> tuple[dict, Samples]:
    n_list, w_list = (QUICK_N, QUICK_W) if quick else (FULL_N, FULL_W)
    rounds, warmup, budget_s = (40, 5, 0.6) if quick else (300, 20, 3.0)
    M = max(n_list)
    samples = Samples()
    out: dict[str, Any] = {"method": "in-process RoundCore + Shim over a null worker (see module doc)",
                           "num_spec": NUM_SPEC, "row_bytes": ROW_BYTES, "max_reqs": M, "cases": [],
                           "fits": {}}
    for W in w_list:
        for mix in MIXES:
            say(f"scaling: W={W} {mix}")
            rig = ScaleRig(f"{prefix or default_prefix()}-scale-{W}-{mix}", max_reqs=M, window=W)
            try:
                p50s = []
                for n in n_list:
                    gen = RoundGen(n, num_spec=NUM_SPEC, window=W, row_bytes=ROW_BYTES, mix=mix,
                                   seed=n, req_base=rig.t * M + 1)  # new owners: fresh generations
                    res = []
                    end = time.monotonic() + budget_s
                    i = 0
                    rows = 0
                    while i < warmup + rounds and (i < warmup + 10 or time.monotonic() < end):
                        kw = gen.next()
                        r = rig.round(kw)
                        if i >= warmup:
                            res.append(r)
                            rows += int(kw["rows"].shape[0])
                        i += 1
                    a = np.asarray(res, np.int64)
                    proxy = a[:, 1] - a[:, 2]
                    engine = a[:, 0] + a[:, 3]
                    case = {"W": W, "mix": mix, "n": n, "rounds": int(a.shape[0]),
                            "rows_per_round": round(rows / max(1, a.shape[0]), 1),
                            "proxy_cost": summarize(proxy), "engine_cost": summarize(engine),
                            "enqueue": summarize(a[:, 0]), "read_reply": summarize(a[:, 3]),
                            "null_worker": summarize(a[:, 2])}
                    out["cases"].append(case)
                    p50s.append(case["proxy_cost"]["p50_us"])
                    samples.add(f"W{W}/{mix}/n{n}/proxy_cost", proxy)
                out["fits"][f"W{W}/{mix}"] = _fit(list(n_list), p50s)
            finally:
                rig.close()
    return out, samples
