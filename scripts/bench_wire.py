#!/usr/bin/env python3
"""STEP round-trip throughput to a local worker, next to a raw-socket send of the same bytes.

For each (row_bytes, n requests, rows per request) the client sends STEPs to a `dspark-proxy worker`
subprocess (integrity drafter; every entry is a NEW_GEN of this round's rows, so the worker stores
and hashes each byte once) and waits for the REPLY. The baseline, measured in the same run against
a raw sink subprocess, sends the very same buffers with the same scatter-gather sendmsg and waits for
a reply of the same size, with no protocol at all. Prints a table (or --json): median and p99 round
trip, rows/s and MB/s for both, and the wire/raw throughput ratio.

    python scripts/bench_wire.py [--seconds 1.5] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np

from dspark_proxy import wire
from dspark_proxy.bench.peers import recv_exact
from dspark_proxy.link.client import TcpDraftClient
from dspark_proxy.link.conn import byte_view

N, W = 5, 128

FULL = [(256, 1, 1), (256, 16, 1), (256, 64, 1), (256, 256, 1), (256, 64, 16),
        (71680, 16, 1), (71680, 64, 1), (71680, 128, 1), (71680, 256, 1), (71680, 32, 8)]
QUICK = [(256, 16, 1), (256, 256, 1), (71680, 64, 1), (71680, 256, 1)]


# ---------------------------------------------------------------- raw sink (a subprocess)

def _sink_main(port_file: str) -> None:
    """Accept one connection; read [u64 total][u64 reply][payload] and answer `reply` bytes, forever."""
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    with open(port_file, "w") as f:
        f.write(str(lst.getsockname()[1]))
    s, _ = lst.accept()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(64 << 20)
    mv = memoryview(buf)
    reply = bytes(1 << 20)
    hdr = bytearray(16)

    def read_exact(view: memoryview) -> bool:
        return recv_exact(s, view)

    while read_exact(memoryview(hdr)):
        total, rlen = int.from_bytes(hdr[:8], "little"), int.from_bytes(hdr[8:], "little")
        left = total
        while left:
            k = min(left, len(buf))
            if not read_exact(mv[:k]):
                return
            left -= k
        s.sendall(reply[:rlen])


def _start_sink() -> tuple[subprocess.Popen, int]:
    pf = f"/tmp/bench_wire_sink_{os.getpid()}.port"
    if os.path.exists(pf):
        os.unlink(pf)
    p = subprocess.Popen([sys.executable, __file__, "--_sink", pf])
    deadline = time.monotonic() + 10
    while not os.path.exists(pf) or not open(pf).read():
        if time.monotonic() > deadline:
            raise RuntimeError("raw sink did not start")
        time.sleep(0.01)
    port = int(open(pf).read())
    os.unlink(pf)
    return p, port


def _start_worker(row_bytes: int, max_reqs: int) -> tuple[subprocess.Popen, int]:
    p = subprocess.Popen([sys.executable, "-m", "dspark_proxy.commands.worker", "--listen", "127.0.0.1:0",
                          "--num-spec", str(N), "--window", str(W), "--row-bytes", str(row_bytes),
                          "--max-reqs", str(max_reqs), "--log-level", "WARNING"],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("worker listening on"):
        p.kill()
        raise RuntimeError(f"worker did not start: {line!r}")
    return p, int(line.rsplit(":", 1)[1])


# ---------------------------------------------------------------- measurement

def _stats(rtts: list[float], rows: int, nbytes: int, worker_us: list[float] | None = None) -> dict:
    a = np.array(rtts)
    mean = float(a.mean())
    out = {"rounds": len(rtts), "rtt_us_p50": float(np.median(a) * 1e6),
           "rtt_us_p99": float(np.percentile(a, 99) * 1e6), "rows_per_s": rows / mean,
           "mb_per_s": nbytes / mean / 1e6}
    if worker_us:
        wu = np.array(worker_us)
        out["worker_us_p50"] = float(np.median(wu))
        # the round trip without the worker's own time: transport, framing, validation, both ends' I/O
        out["net_us_p50"] = float(np.median(a * 1e6 - wu))
    return out


def bench_case(client: TcpDraftClient, sink: socket.socket, row_bytes: int, n: int, k: int,
               seconds: float) -> dict:
    prefix = wire.StepPrefix(client.layout.max_reqs, False)
    e = wire.entries_view(prefix, n)
    e["slot"] = np.arange(n)
    e["n_rows"] = k
    e["generation"] = 1
    e["first_pos"] = 0
    e["anchor_pos"] = k
    e["anchor_token"] = np.arange(n)
    e["flags"] = wire.RF_NEW_GEN | wire.RF_NEED_DRAFT
    rows = np.random.default_rng(0).integers(0, 256, (n * k, row_bytes), dtype=np.uint8)
    # the rows as the round sends them: one view per request (rows gathered per request)
    row_views = [rows[i * k:(i + 1) * k] for i in range(n)]
    n_rows = n * k
    msg_bytes = wire.step_prefix_bytes(n, False) + n_rows * row_bytes
    reply_bytes = wire.APP_HEADER_SIZE + wire.reply_layout(n, N, 0).payload_bytes
    epoch = client.connection_epoch()
    worker_us: list[float] = []
    step_id = int(time.monotonic_ns())

    def one_wire() -> float:
        nonlocal step_id
        step_id += 1
        t0 = time.perf_counter()
        out = client.step(prefix, e, n_rows, step_id=step_id, step_flags=0, epoch=epoch, rows=row_views,
                          timeout_s=10.0)
        dt = time.perf_counter() - t0
        if not out.ok or not wire.USABLE_STATUS_TABLE[out.reply.status].all():
            raise RuntimeError(f"step failed: {out.reason}")
        worker_us.append(out.reply.worker_us)
        return dt

    hdr = bytearray(16)
    prefix_view = memoryview(prefix)[:wire.step_prefix_bytes(n, False)]
    raw_parts = [hdr, prefix_view, *(byte_view(v) for v in row_views)]
    rbuf = bytearray(reply_bytes)

    def one_raw() -> float:
        hdr[:8] = msg_bytes.to_bytes(8, "little")
        hdr[8:] = reply_bytes.to_bytes(8, "little")
        t0 = time.perf_counter()
        parts = list(raw_parts)
        while parts:
            sent = sink.sendmsg(parts[:1024])
            while sent:
                if sent >= len(parts[0]):
                    sent -= len(parts[0])
                    parts.pop(0)
                else:
                    parts[0] = memoryview(parts[0])[sent:]
                    sent = 0
        got = 0
        rv = memoryview(rbuf)
        while got < reply_bytes:
            got += sink.recv_into(rv[got:])
        return time.perf_counter() - t0

    res = {"row_bytes": row_bytes, "n_req": n, "rows_per_req": k, "rows": n_rows, "msg_bytes": msg_bytes,
           "reply_bytes": reply_bytes}
    for name, fn in (("wire", one_wire), ("raw", one_raw)):
        for _ in range(3):
            fn()
        worker_us.clear()
        rtts: list[float] = []
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end or len(rtts) < 5:
            rtts.append(fn())
        res[name] = _stats(rtts, n_rows, msg_bytes, worker_us if name == "wire" else None)
    res["ratio_mb_per_s"] = res["wire"]["mb_per_s"] / res["raw"]["mb_per_s"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.5, help="measuring time per case and path")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--quick", action="store_true", help="fewer cases")
    ap.add_argument("--_sink", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._sink:
        _sink_main(args._sink)
        return
    cases = QUICK if args.quick else FULL
    results = []
    sink_proc, sink_port = _start_sink()
    sink = socket.create_connection(("127.0.0.1", sink_port))
    sink.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        for rb in sorted({c[0] for c in cases}):
            max_reqs = max(c[1] for c in cases if c[0] == rb)
            wproc, wport = _start_worker(rb, max_reqs)
            client = TcpDraftClient("127.0.0.1", wport, max_reqs=max_reqs, num_spec=N, window=W, row_bytes=rb,
                                 max_frame_bytes=256 << 20)
            client.start()
            try:
                if client.wait_ready(10) is None:
                    raise RuntimeError(f"client not ready: {client.disabled_reason}")
                for case in cases:
                    if case[0] == rb:
                        results.append(bench_case(client, sink, rb, case[1], case[2], args.seconds))
                        if not args.json:
                            print(".", end="", flush=True, file=sys.stderr)
            finally:
                client.stop()
                wproc.terminate()
                wproc.wait(10)
    finally:
        sink.close()
        sink_proc.terminate()
        sink_proc.wait(10)
    if args.json:
        print(json.dumps({"num_spec": N, "window": W, "cpus": os.cpu_count(), "results": results}, indent=1))
        return
    print(file=sys.stderr)
    print(f"STEP round trips to a local worker (integrity drafter) vs raw TCP of the same bytes "
          f"(N={N}, W={W}, {os.cpu_count()} CPUs)")
    hdr = (f"{'row_bytes':>9} {'n':>4} {'k':>3} {'MB/msg':>7} | {'wire p50 us':>11} {'p99 us':>8} "
           f"{'worker us':>9} {'net us':>8} {'rows/s':>10} {'MB/s':>8} | {'raw p50 us':>10} {'MB/s':>8} | "
           f"{'wire/raw':>8} {'net/raw':>7}")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        wr, rr = r["wire"], r["raw"]
        print(f"{r['row_bytes']:>9} {r['n_req']:>4} {r['rows_per_req']:>3} {r['msg_bytes'] / 1e6:>7.2f} | "
              f"{wr['rtt_us_p50']:>11.0f} {wr['rtt_us_p99']:>8.0f} {wr['worker_us_p50']:>9.0f} "
              f"{wr['net_us_p50']:>8.0f} {wr['rows_per_s']:>10.0f} {wr['mb_per_s']:>8.0f} | "
              f"{rr['rtt_us_p50']:>10.0f} {rr['mb_per_s']:>8.0f} | {r['ratio_mb_per_s']:>8.2f} "
              f"{rr['rtt_us_p50'] / wr['net_us_p50']:>7.2f}")
    print("wire/raw: throughput ratio of the whole STEP round trip; net/raw: raw round trip over the STEP "
          "round trip minus the worker's own time (worker_us, mostly the integrity oracle: per-request "
          "window bookkeeping and a CRC of every row)")


if __name__ == "__main__":
    main()
