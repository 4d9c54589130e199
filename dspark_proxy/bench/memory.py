"""Section 5, memory and idle cost at the realistic shapes (M=256, N=5, W=128, 71,680-byte rows).

- The segment, region by region (`Layout.region_table()`, as the proxy created it).
- Resident memory of the proxy and the worker (/proc/<pid>/status: VmRSS, and RssShmem apart, so the
  proxy's own memory is VmRSS - RssShmem) after start and after a few decode rounds of 256 requests.
- The shim's added memory in the engine process: this process's VmRSS before attaching (the
  benchmark's own input rows already allocated), after attaching, and after the rounds. The engine
  ring ([M, W, row_bytes]) is shared memory reserved and mapped when the shim is made (RssShmem; a
  private ring, DSPARK_SHARED_RING=0, grows with the rows written), the worker's windows grow with the
  rows written; M x W x row_bytes is reported next to the measured figures.
- Idle: the engine stays attached and does nothing for 10 s (--quick: 2 s); CPU used meanwhile by the
  proxy (all threads, /proc/<pid>/task/*/schedstat), by the worker, by this whole process (the
  shim's watchdog thread and nothing else runs) and by the watchdog thread alone (its CPU-time
  clock), as % of one core.
- Idle, state by state (`idle_states`, bench/idle.py): the proxy waiting for an engine, an engine
  attached before its first round, after rounds, the shim alone, thread mode; each for the same time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .batches import RoundGen, wait_connected
from .measure import Samples, default_prefix
from .procs import cpu_s, rss_kb, thread_cpu_s

__all__ = ["run_memory", "REALISTIC"]

REALISTIC = {"max_reqs": 256, "num_spec": 5, "window": 128, "row_bytes": 71680, "n": 256}


def _mb(kb: dict[str, int]) -> dict[str, float]:
    out = {k: round(v / 1024, 1) for k, v in kb.items()}
    if "VmRSS" in kb and "RssShmem" in kb:
        out["own_mb"] = round((kb["VmRSS"] - kb["RssShmem"]) / 1024, 1)  # resident outside shared memory
    names = {"VmRSS": "vm_rss", "VmHWM": "vm_hwm", "RssAnon": "rss_anon", "RssFile": "rss_file",
             "RssShmem": "rss_shmem", "AnonHugePages": "anon_huge_pages", "own_mb": "own_mb"}
    return {names.get(k, k): v for k, v in out.items()}


def _idle(proxy_pid: int, worker_pid: int, watchdog: Any, seconds: float) -> dict[str, Any]:
    p0, w0, e0 = cpu_s(proxy_pid), cpu_s(worker_pid), time.process_time()
    d0 = thread_cpu_s(watchdog)
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    p1, w1, e1 = cpu_s(proxy_pid), cpu_s(worker_pid), time.process_time()
    d1 = thread_cpu_s(watchdog)

    def pct(x: float) -> float:
        return round(100.0 * x / wall, 3)

    out = {"seconds": round(wall, 2), "proxy_pct_core": pct(p1 - p0), "worker_pct_core": pct(w1 - w0),
           "engine_process_pct_core": pct(e1 - e0), "shim_watchdog_pct_core": pct(d1 - d0)}
    out["proxy_plus_shim_pct_core"] = round(out["proxy_pct_core"] + out["engine_process_pct_core"], 3)
    return out


def run_memory(quick: bool = False, say: Callable[[str], None] = lambda s: None,
               prefix: str = "") -> tuple[dict, Samples]:
    import engine_shim
    from dspark_proxy.ops.launch import spawn_proxy, spawn_worker
    from dspark_proxy.ops.status import read_status

    r = REALISTIC
    rounds, idle_s = (3, 2.0) if quick else (8, 10.0)
    name = f"{prefix or default_prefix()}-memory"
    layout = ["--max-reqs", str(r["max_reqs"]), "--num-spec", str(r["num_spec"]), "--window",
              str(r["window"]), "--row-bytes", str(r["row_bytes"])]
    gen = RoundGen(r["n"], num_spec=r["num_spec"], window=r["window"], row_bytes=r["row_bytes"])
    out: dict[str, Any] = {"shape": r, "rounds": rounds}
    engine_before = rss_kb()
    say("memory: starting a worker and a proxy at the realistic shapes")
    worker = spawn_worker(*layout)
    proxy = shim = None
    try:
        proxy = spawn_proxy(name, worker.address, *layout, "--deadline-ms", "20000", "--log-every", "0")
        wait_connected(name)
        st = read_status(name)
        regions = st["header"]["regions"]
        out["segment"] = {"total_mb": round(st["header"]["bytes"] / 2**20, 1),
                          "max_rows": st["header"]["max_rows"],
                          "resync_per_round": st["header"]["resync_per_round"],
                          "regions_mb": {k: round(v["bytes"] / 2**20, 3) for k, v in regions.items()}}
        proxy_start, worker_start = rss_kb(proxy.pid), rss_kb(worker.pid)
        shim = engine_shim.attach(name, max_reqs=r["max_reqs"], num_spec=r["num_spec"], window=r["window"],
                                  row_bytes=r["row_bytes"], timeout_s=10.0)
        engine_attached = rss_kb()
        say(f"memory: {rounds} decode rounds of {r['n']} requests")
        failed = 0
        row_bytes_sent = 0
        for _ in range(rounds):
            kw = gen.next()
            shim.enqueue(gen.t, **kw)
            failed += shim.read_reply(gen.t).status == 2
            row_bytes_sent += int(kw["rows"].nbytes)
        out["failed_rounds"] = int(failed)
        out["row_mb_sent"] = round(row_bytes_sent / 1e6, 1)
        out["rows_held_per_slot"] = int(gen.pos.max())
        full_mb = r["max_reqs"] * r["window"] * r["row_bytes"] / 2**20
        out["proxy"] = {"after_start": _mb(proxy_start), "after_rounds": _mb(rss_kb(proxy.pid))}
        out["worker"] = {"after_start": _mb(worker_start), "after_rounds": _mb(rss_kb(worker.pid)),
                         "windows_full_mb": round(full_mb, 1)}
        engine_after = rss_kb()
        out["engine"] = {"before_attach": _mb(engine_before), "after_attach": _mb(engine_attached),
                         "after_rounds": _mb(engine_after),
                         "shim_added_mb": round((engine_after["VmRSS"] - engine_before["VmRSS"]) / 1024, 1),
                         "shim_added_own_mb": round(((engine_after["VmRSS"] - engine_after["RssShmem"])
                                                     - (engine_before["VmRSS"] - engine_before["RssShmem"]))
                                                    / 1024, 1),
                         "engine_ring_full_mb": round(full_mb, 1)}
        say(f"memory: idle for {idle_s:.0f} s")
        out["idle"] = _idle(proxy.pid, worker.pid, shim.watchdog._thread, idle_s)
    finally:
        if shim is not None:
            shim.close()
        if proxy is not None:
            proxy.stop()
        worker.stop()
    from .idle import idle_states

    out["idle_states"] = idle_states(idle_s, name, say)
    return out, Samples()
