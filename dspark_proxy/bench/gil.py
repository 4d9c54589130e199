"""Section 2, GIL isolation: the full round (shim -> proxy -> local worker process -> shim) with the
proxy in its own process and with the proxy on a thread of the engine process (thread mode), while
0, 2 and 4 pure-Python threads in the engine process hold its GIL.

Reported per mode and load: the proxy's own round time (gathered seen -> published, its
`rank0_round_us`: from the proxy process's statistics, or from `shim.proxy` in thread mode), the
worker round trip inside it (`rtt_us`), the difference of their p50s (the proxy's own work, which
the worker's timing does not blur), and the engine's side: `enqueue` and the wait in
`read_reply` after a 10 ms forward (a sleep: the GIL is free, as in a CUDA step; every case runs at
this cadence, so idle and loaded cases compare like with like). Each mode and load gets a fresh
proxy so its statistics are its own; one worker
process (integrity drafter, loopback TCP) serves them all. The deadline is long (5 s) so that slow
rounds are measured rather than cut off; rounds that failed anyway are counted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .batches import RoundGen, wait_connected
from .measure import Samples, default_prefix, from_stats, ratio, summarize
from .procs import BusyThreads, cores, on_cpu, pinned

__all__ = ["run_gil", "GIL_SHAPE", "BUSY_LEVELS"]

GIL_SHAPE = {"max_reqs": 64, "num_spec": 5, "window": 16, "row_bytes": 1024, "n": 32}
BUSY_LEVELS = (0, 2, 4)
DEADLINE_MS = 5000.0  # slow rounds are measured, not cut off; a stall of the machine is not a failure
ENGINE_STEP_MS = 10.0  # between enqueue and read_reply; every case runs at this cadence


def _drive(shim: Any, gen: RoundGen, seconds: float, max_rounds: int, warmup: int) -> dict[str, Any]:
    enq, read = [], []
    failed = 0
    clock = time.perf_counter_ns
    end = time.monotonic() + seconds
    step_s = ENGINE_STEP_MS / 1e3
    i = 0
    while i < warmup + max_rounds and (i < warmup + 20 or time.monotonic() < end):
        kw = gen.next()
        t0 = clock()
        shim.enqueue(gen.t, **kw)
        t1 = clock()
        time.sleep(step_s)  # the target's forward: the GIL is free meanwhile, as in a CUDA step
        t2 = clock()
        reply = shim.read_reply(gen.t)
        t3 = clock()
        if i >= warmup:
            enq.append(t1 - t0)
            read.append(t3 - t2)
            failed += reply.status == 2
        i += 1
    e, r = np.asarray(enq, np.int64), np.asarray(read, np.int64)
    return {"enqueue": e, "read_reply": r, "round": e + r, "failed": int(failed)}


def _one(mode: str, busy: int, worker_addr: str, name: str, seconds: float, max_rounds: int,
         warmup: int, other_cpu: int | None) -> dict[str, Any]:
    import engine_shim
    from dspark_proxy.ops.launch import spawn_proxy
    from dspark_proxy.ops.status import read_status

    s = GIL_SHAPE
    layout = {k: s[k] for k in ("max_reqs", "num_spec", "window", "row_bytes")}
    gen = RoundGen(s["n"], num_spec=s["num_spec"], window=s["window"], row_bytes=s["row_bytes"])
    proxy = shim = None
    try:
        if mode == "process":
            with on_cpu(other_cpu):
                proxy = spawn_proxy(name, worker_addr, "--max-reqs", str(s["max_reqs"]), "--num-spec",
                                    str(s["num_spec"]), "--window", str(s["window"]), "--row-bytes",
                                    str(s["row_bytes"]), "--deadline-ms", str(DEADLINE_MS),
                                    "--log-every", "0")
            wait_connected(name)
            shim = engine_shim.attach(name, timeout_s=10.0, **layout)
        else:
            shim = engine_shim.attach(name, mode="thread", worker=worker_addr, deadline_ms=DEADLINE_MS,
                                      timeout_s=10.0, **layout)
            _wait_ready(shim)
        with BusyThreads(busy):
            res = _drive(shim, gen, seconds, max_rounds, warmup)
        if mode == "process":
            time.sleep(0.35)  # the proxy publishes its statistics every 0.25 s
            lat = read_status(name)["proxy"].get("latency", {})
            res["proxy_round"] = from_stats(lat.get("rank0_round_us"))
            res["worker_rtt"] = from_stats(lat.get("rtt_us"))
        else:
            st = shim.proxy.stats
            res["proxy_round"] = from_stats(st.latency("rank0_round_us"))
            res["worker_rtt"] = from_stats(st.latency("rtt_us"))
        return res
    finally:
        if shim is not None:
            shim.close()
        if proxy is not None:
            proxy.stop()


def _wait_ready(shim: Any, timeout_s: float = 10.0) -> None:
    """Thread mode: the in-process proxy's client connects and the watchdog finds the segment in the
    background; rounds before both are target-only and would measure nothing."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if shim.proxy.client.connection_epoch() is not None and shim.state.value != "detached":
            return
        time.sleep(0.01)
    raise RuntimeError("thread-mode proxy did not connect to the worker or attach")


def run_gil(quick: bool = False, say: Callable[[str], None] = lambda s: None,
            prefix: str = "") -> tuple[dict, Samples]:
    from dspark_proxy.ops.launch import spawn_worker

    s = GIL_SHAPE
    seconds, max_rounds, warmup = (1.5, 600, 10) if quick else (8.0, 4000, 30)
    samples = Samples()
    cs = cores()
    eng, other = (cs[0], cs[1]) if len(cs) > 1 else (None, None)
    out: dict[str, Any] = {"shape": s, "deadline_ms": DEADLINE_MS, "engine_step_ms": ENGINE_STEP_MS,
                           "seconds_per_case": seconds,
                           "engine_cpu": eng, "proxy_worker_cpu": other, "modes": {}}
    ctx = pinned({eng}) if eng is not None else contextlib.nullcontext()
    with ctx:
        with on_cpu(other):
            worker = spawn_worker("--max-reqs", str(s["max_reqs"]), "--num-spec", str(s["num_spec"]),
                                  "--window", str(s["window"]), "--row-bytes", str(s["row_bytes"]))
        try:
            _modes(out, samples, worker.address, other, seconds, max_rounds, warmup, say,
                   prefix or default_prefix())
        finally:
            worker.stop()
    return out, samples


def _modes(out: dict, samples: Samples, worker_addr: str, other: int | None, seconds: float, max_rounds: int,
           warmup: int, say: Callable[[str], None], prefix: str) -> None:
    for mode in ("process", "thread"):
        cases: dict[str, Any] = {}
        for busy in BUSY_LEVELS:
            say(f"gil: {mode} mode, {busy} busy threads")
            r = _one(mode, busy, worker_addr, f"{prefix}-gil-{mode}-{busy}", seconds,
                     max_rounds, warmup, other)
            cases[f"busy_{busy}"] = {"rounds": int(r["round"].size), "failed_rounds": r["failed"],
                                     "proxy_round": r["proxy_round"], "worker_rtt": r["worker_rtt"],
                                     "engine_wait": summarize(r["read_reply"]),
                                     "enqueue": summarize(r["enqueue"]), "round": summarize(r["round"])}
            c = cases[f"busy_{busy}"]
            p, w = c["proxy_round"]["p50_us"], c["worker_rtt"]["p50_us"]
            c["proxy_cost_p50_us"] = None if p is None or w is None else round(p - w, 1)
            samples.add(f"{mode}/busy_{busy}/engine_wait", r["read_reply"])
        idle = cases["busy_0"]
        for busy in BUSY_LEVELS[1:]:
            c = cases[f"busy_{busy}"]
            c["ratios_vs_idle"] = {
                "proxy_round_p50": ratio(c["proxy_round"]["p50_us"], idle["proxy_round"]["p50_us"]),
                "proxy_round_p99": ratio(c["proxy_round"]["p99_us"], idle["proxy_round"]["p99_us"]),
                "proxy_cost_p50": ratio(c["proxy_cost_p50_us"], idle["proxy_cost_p50_us"]),
                "engine_wait_p50": ratio(c["engine_wait"]["p50_us"], idle["engine_wait"]["p50_us"]),
            }
        out["modes"][mode] = cases
