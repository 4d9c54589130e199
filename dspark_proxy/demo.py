"""The whole system once: a worker and a proxy as child processes, the simulated engine through the
shim, every usable draft checked against the `integrity` oracle (`dspark-proxy demo` prints it)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

__all__ = ["run_demo"]


def run_demo(*, rounds: int | None, duration_s: float | None, max_reqs: int, num_spec: int, window: int,
             row_bytes: int, deadline_ms: float, seed: int, engine_work_us: float, name: str | None = None,
             quiet: bool = False, staging_budget_mb: int | None = None) -> dict[str, Any]:
    """Run the whole system once; returns the summary (also what --json prints)."""
    import engine_shim
    from dspark_proxy.ops.launch import spawn_proxy, spawn_worker
    from dspark_proxy.ops.status import read_status
    from dspark_proxy.sim import SimConfig, SimEngine

    name = name or f"demo-{os.getpid()}"
    layout = ["--num-spec", str(num_spec), "--window", str(window), "--row-bytes", str(row_bytes),
              "--max-reqs", str(max_reqs)]
    say = (lambda *a: None) if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    worker = proxy = shim = None
    try:
        worker = spawn_worker(*layout)
        say(f"[demo] worker pid {worker.pid} on {worker.address}")
        extra = [] if staging_budget_mb is None else ["--staging-budget-mb", str(staging_budget_mb)]
        proxy = spawn_proxy(name, worker.address, *layout, "--deadline-ms", str(deadline_ms), "--log-every", "0",
                            *extra)
        say(f"[demo] proxy pid {proxy.pid}, segment {name}")
        shim = engine_shim.attach(name, max_reqs=max_reqs, num_spec=num_spec, window=window, row_bytes=row_bytes,
                                  timeout_s=5.0)
        sim = SimEngine(SimConfig(seed=seed, max_reqs=max_reqs, num_spec=num_spec, window=window,
                                  row_bytes=row_bytes, engine_work_us=engine_work_us))
        t0 = time.monotonic()
        res = sim.run(shim, rounds=rounds, duration_s=None if rounds else duration_s).to_dict()
        res["elapsed_s"] = round(time.monotonic() - t0, 3)
        time.sleep(0.3)  # let the proxy's heartbeat thread publish its last snapshot
        st = read_status(name)
        lat = st["proxy"].get("latency", {})
        r0, rtt = lat.get("rank0_round_us", {}), lat.get("rtt_us", {})
        res["proxy_round_us_p50"] = r0.get("p50_us")
        res["rtt_us_p50"] = rtt.get("p50_us")
        res["proxy_cost_us_p50"] = lat.get("proxy_cost_us", {}).get("p50_us")  # round - rtt, per round
        res["proxy_counters"] = st["proxy"].get("counters", {})
        res["deadline_ms"] = deadline_ms
        return res
    finally:
        if shim is not None:
            shim.close()
        for child in (proxy, worker):
            if child is not None:
                child.stop()
