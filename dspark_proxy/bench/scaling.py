"""Section 3, scaling: what the proxy's round costs per request and row, and what the engine side
costs, for n = 1 .. 1024 requests, W = 16 .. 256, decode and prefill mixes.

Driven in one process, round by round, like tests/rig.py: a real segment, a real Shim (no watchdog
thread) and a real RoundCore over a null worker (`InProcessClient(null=True)`). So nothing here
waits on another process, and each figure is pure CPU work:

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


class _TimedNull:
    """The null in-process worker, with the time of each step() kept (to subtract it)."""

    def __init__(self, **kw: Any) -> None:
        from dspark_proxy.inproc import InProcessClient

        self.inner = InProcessClient(null=True, **kw)
        self.last_ns = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def step(self, *a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = self.inner.step(*a, **kw)
        self.last_ns = time.perf_counter_ns() - t0
        return out


class ScaleRig:
    """A segment, a Shim and a RoundCore for one (M, W): rounds run in this thread, one at a time."""

    def __init__(self, name: str, *, max_reqs: int, window: int, num_spec: int = NUM_SPEC,
                 row_bytes: int = ROW_BYTES) -> None:
        from dspark_proxy.breaker import CircuitBreaker
        from dspark_proxy.events import EventRing
        from dspark_proxy.round import RoundCore, RoundSettings
        from dspark_proxy.shm.layout import LayoutParams, State, Word
        from dspark_proxy.shm.segment import Segment
        from dspark_proxy.stats import Stats
        from engine_shim.shim import Shim

        p = LayoutParams(max_reqs=max_reqs, num_spec=num_spec, window=window, row_bytes=row_bytes,
                         max_rows=max_reqs * window, resync_per_round=min(max_reqs, 8))
        self.seg = Segment.create(name, p, deadline_ms=60_000.0)
        self.shim = None
        try:
            self.seg.set_word(Word.STATE, State.READY)
            self.seg.set_word(Word.HEARTBEAT_NS, 1 << 62)
            self.client = _TimedNull(max_reqs=max_reqs, num_spec=num_spec, window=window, row_bytes=row_bytes)
            self.core = RoundCore(self.seg, self.client, Stats(), EventRing(64), CircuitBreaker(3, 50),
                                  RoundSettings(step_timeout_s=60.0))
            self.shim = Shim(name, max_reqs=max_reqs, num_spec=num_spec, window=window, row_bytes=row_bytes,
                             start_watchdog=False)
            if not self.shim.offer(Segment.open(name)):
                raise RuntimeError("scaling rig: the shim refused the segment")
        except BaseException:
            self.close()
            raise
        self.t = 0

    def round(self, kw: dict[str, Any]) -> tuple[int, int, int, int]:
        """One round: (enqueue ns, handle ns, worker step ns, read_reply ns)."""
        self.t += 1
        t = self.t
        clock = time.perf_counter_ns
        t0 = clock()
        self.shim.enqueue(t, **kw)
        t1 = clock()
        self.core.handle(t, 0.0)
        t2 = clock()
        reply = self.shim.read_reply(t)
        t3 = clock()
        if reply.status == 2:
            raise RuntimeError(f"scaling rig: round {t} failed ({reply.reason})")
        return t1 - t0, t2 - t1, self.client.last_ns, t3 - t2

    def close(self) -> None:
        if self.shim is not None:
            self.shim.close()
        self.seg.unlink()
        self.seg.close()


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
