"""Section 4, rows throughput: large-row rounds through the proxy to a local worker process, against
a raw socket sending the same bytes, in the same run.

Each case is (row_bytes, n requests, rows per request) with the window W equal to the rows a request
sends per round, so the `integrity` worker stores and hashes each byte it receives once. Path:
engine `enqueue` (rows -> engine ring and staging) -> proxy: STEP sent straight from the staging
(scatter-gather, no copy) -> worker (receive, store in the windows, CRC, drafts) -> REPLY -> page.

Each case runs with one worker and with two (a pool, `--worker A,B`: each round's requests split
between them by rendezvous hashing, their rows gathered into one STEP per worker, both sent before
either reply is read).

Figures per case, all p50, as MB/s of row bytes:
- proxy round (`rank0_round_us`, gathered seen -> published): what the proxy sustains;
- proxy path (`rank0_round_us - worker_us`): the proxy round without the worker's own work (the
  `integrity` oracle hashes every byte it receives at about 4 GB/s, in Python per request: that is
  the drafter's cost, not the path's), the figure comparable with the raw socket, whose sink does
  no work either;
- transport (`rtt_us - worker_us`): the STEP/REPLY round trip alone;
- engine round (`enqueue + read_reply`): what the engine pays, including its two row copies;
- raw: 16 header bytes + the STEP's bytes (prefix and rows) by sendmsg to a sink process that reads
  them into one reused buffer and answers with a REPLY-sized message (no protocol, no work).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .batches import RoundGen, wait_connected
from .measure import Samples, default_prefix, from_stats, mb_per_s, ratio, summarize
from .peers import RawSink

__all__ = ["run_rows", "FULL_CASES", "QUICK_CASES"]

NUM_SPEC = 5
FULL_CASES = ((43008, 256, 1), (71680, 256, 1), (71680, 64, 6))
QUICK_CASES = ((43008, 256, 1), (71680, 256, 1))


def _case(row_bytes: int, n: int, k: int, rounds: int, warmup: int, sink: RawSink,
          name: str, workers: int = 1) -> dict[str, Any]:
    import engine_shim
    from dspark_proxy import wire
    from dspark_proxy.ops.launch import spawn_proxy, spawn_worker
    from dspark_proxy.ops.status import read_status

    layout = ["--max-reqs", str(n), "--num-spec", str(NUM_SPEC), "--window", str(k),
              "--row-bytes", str(row_bytes)]
    procs = [spawn_worker(*layout)]
    proxy = shim = None
    try:
        procs += [spawn_worker(*layout) for _ in range(workers - 1)]
        proxy = spawn_proxy(name, ",".join(w.address for w in procs), *layout, "--deadline-ms", "10000",
                            "--log-every", "0")
        wait_connected(name, workers=workers)
        shim = engine_shim.attach(name, max_reqs=n, num_spec=NUM_SPEC, window=k, row_bytes=row_bytes,
                                  timeout_s=10.0)
        gen = RoundGen(n, num_spec=NUM_SPEC, window=k, row_bytes=row_bytes, fixed_valid=k)
        enq, read = [], []
        failed = 0
        clock = time.perf_counter_ns
        for i in range(warmup + rounds):
            kw = gen.next()
            t0 = clock()
            shim.enqueue(gen.t, **kw)
            t1 = clock()
            reply = shim.read_reply(gen.t)
            t2 = clock()
            if i >= warmup:
                enq.append(t1 - t0)
                read.append(t2 - t1)
                failed += reply.status == 2
        time.sleep(0.35)  # the proxy publishes its statistics every 0.25 s
        lat = read_status(name)["proxy"].get("latency", {})
    finally:
        if shim is not None:
            shim.close()
        if proxy is not None:
            proxy.stop()
        for w in procs:
            w.stop()
    # the raw floor: the same bytes, the same reply size
    row_data = gen.rows_buf[:n * k]
    prefix = bytearray(wire.step_prefix_bytes(n, False))
    reply_bytes = wire.APP_HEADER_SIZE + wire.reply_layout(n, NUM_SPEC, 0).payload_bytes
    raw = np.asarray([sink.round_trip([prefix, row_data], reply_bytes) for _ in range(warmup + rounds)],
                     np.int64)[warmup:]
    e, r = np.asarray(enq, np.int64), np.asarray(read, np.int64)
    nbytes = int(row_data.nbytes)
    res: dict[str, Any] = {
        "row_bytes": row_bytes, "n": n, "rows_per_request": k, "rows": n * k, "workers": workers,
        "row_mb_per_round": nbytes / 1e6,
        "rounds": rounds, "failed_rounds": int(failed),
        "proxy_round": from_stats(lat.get("rank0_round_us")), "rtt": from_stats(lat.get("rtt_us")),
        "worker": from_stats(lat.get("worker_us")), "enqueue": summarize(e), "read_reply": summarize(r),
        "engine_round": summarize(e + r), "raw": summarize(raw),
    }
    tr = path = None
    wk = res["worker"]["p50_us"]
    if res["rtt"]["p50_us"] is not None and wk is not None:
        tr = res["rtt"]["p50_us"] - wk
    if res["proxy_round"]["p50_us"] is not None and wk is not None:
        path = res["proxy_round"]["p50_us"] - wk
    res["mb_per_s"] = {"proxy_round": mb_per_s(nbytes, res["proxy_round"]["p50_us"]),
                       "proxy_path": mb_per_s(nbytes, path),
                       "transport": mb_per_s(nbytes, tr),
                       "engine_round": mb_per_s(nbytes, res["engine_round"]["p50_us"]),
                       "raw": mb_per_s(nbytes, res["raw"]["p50_us"])}
    mb = res["mb_per_s"]
    res["ratios_vs_raw"] = {k2: ratio(mb[k2], mb["raw"])
                            for k2 in ("proxy_round", "proxy_path", "transport", "engine_round")}
    return res


def run_rows(quick: bool = False, say: Callable[[str], None] = lambda s: None,
             prefix: str = "") -> tuple[dict, Samples]:
    cases, rounds, warmup = (QUICK_CASES, 15, 3) if quick else (FULL_CASES, 100, 10)
    samples = Samples()
    out: dict[str, Any] = {"num_spec": NUM_SPEC, "cases": []}
    sink = RawSink()
    try:
        for i, (row_bytes, n, k) in enumerate(cases):
            for workers in (1, 2):
                say(f"rows: {n} x {k} rows of {row_bytes} bytes, {workers} worker(s)")
                name = f"{prefix or default_prefix()}-rows-{i}-{workers}"
                out["cases"].append(_case(row_bytes, n, k, rounds, warmup, sink, name, workers))
    finally:
        sink.close()
    return out, samples
