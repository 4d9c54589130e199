"""The bare hand-off through the segment's hostflag words, against a multiprocessing.Pipe, same run.

Two processes. The engine side (this process) times each round:

    staging write -> raise_gathered(t) -> wait_published(t) -> read_page(t) -> consume(t)

while the proxy side (a forked child) does wait_gathered(t) -> taken(t)? -> fill the page -> publish(t).
That is the whole cross-process cost of a round without any round logic (no RoundCore, no worker):
the floor under `dspark-proxy bench`'s hand-off section. Measured next to it, with the same rounds
and placement:

  words   a bare ping-pong on two words (store / wait_ge): what waking the other side costs
  pipe    a multiprocessing.Pipe round trip of 8 bytes, the usual way to hand work to a process

Placements (`--pin`): `same` puts both processes on one core, `split` each on its own, `unpinned`
leaves it to the scheduler. Each process pins itself before it builds its HostFlags, so the
adaptive spin sees the cores it really has (no spin at all on one core). Default: same,split.

    python -m dspark_proxy.bench.bare [--rounds 20000] [--warmup 2000] [--pin same,split,unpinned]
                                      [--max-reqs 256 --num-spec 5] [--json]

Prints p50 / p99 / p99.9 / max in µs and rounds per second for each (placement, method); with
--json, one JSON object. Asserts nothing about speed. `dspark-proxy bench` runs `run_handoff` as its hand-off section's
"bare_handoff" row; scripts/bench_handoff.py is this module's command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import multiprocessing as mp
import os
import platform
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..shm import hostflag as hf
from ..shm.hostflag import PAGE_OK, AdaptiveSpin, HostFlags
from ..shm.layout import LayoutParams
from ..shm.segment import Segment

__all__ = ["run_handoff", "run_words", "run_pipe", "main"]

CTX = mp.get_context("fork")
WAIT_S = 60.0  # a wait this long means the other side is gone (a stalled shared VM is measured, not failed)


def _pin(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def _spin(force_ns: int | None, peer_pid: int | None = None, peer_cpu: int | None = None) -> AdaptiveSpin:
    """The product's policy (spin unless this process and its peer can only share one core: it knows
    the peer's pid, as the product does from the segment), or a forced bound for comparison."""
    if peer_pid and peer_cpu is not None:
        end = time.monotonic() + 2.0  # a child pins itself as it starts: decide on its final placement
        while os.sched_getaffinity(peer_pid) != {peer_cpu} and time.monotonic() < end:
            time.sleep(0.001)
    s = AdaptiveSpin(peer_pid=peer_pid)
    if force_ns is not None:
        s.max_ns = s.spin_ns = force_ns
    return s


def _placements(names: list[str]) -> list[tuple[str, int | None, int | None]]:
    cpus = sorted(os.sched_getaffinity(0))
    table = {"same": (cpus[0], cpus[0]), "unpinned": (None, None)}
    if len(cpus) > 1:
        table["split"] = (cpus[0], cpus[1])
    out = []
    for n in names:
        if n not in table:
            print(f"[bench_handoff] placement {n!r} unavailable here (cpus {cpus}): skipped", file=sys.stderr)
            continue
        out.append((n, *table[n]))
    return out


# ------------------------------------------------------------------------------------------ proxy sides


def _proxy_handoff(name: str, cpu: int | None, total: int, force_ns: int | None) -> None:
    _pin(cpu)
    seg = Segment.open(name)
    prx = HostFlags(seg, _spin(force_ns, os.getppid()))
    page = np.zeros(seg.layout.reply.size, np.int32)
    for t in range(1, total + 1):
        if not prx.wait_gathered(t, WAIT_S):
            os._exit(3)
        if prx.taken(t):
            continue
        page[0] = t
        prx.publish(t, page)


def _proxy_words(mm: mmap.mmap, cpu: int | None, total: int, force_ns: int | None) -> None:
    _pin(cpu)
    spin = _spin(force_ns, os.getppid())
    for t in range(1, total + 1):
        t0 = time.perf_counter_ns()
        ok = hf.wait_ge(mm, 0, t, WAIT_S, spin.spin_ns)
        spin.update(time.perf_counter_ns() - t0, ok)
        if not ok:
            os._exit(3)
        hf.store(mm, 128, t)


def _proxy_pipe(conn, cpu: int | None, total: int) -> None:
    _pin(cpu)
    for _ in range(total):
        conn.send_bytes(conn.recv_bytes())


# ------------------------------------------------------------------------------------------ engine sides


def _time_rounds(total: int, one_round: Callable[[int], None]) -> np.ndarray:
    ns = np.empty(total, np.int64)
    clock = time.perf_counter_ns
    for t in range(1, total + 1):
        t0 = clock()
        one_round(t)
        ns[t - 1] = clock() - t0
    return ns


@contextlib.contextmanager
def _child(target, args) -> Iterator[mp.Process]:
    p = CTX.Process(target=target, args=args, daemon=True)
    p.start()
    try:
        yield p
    finally:
        if p.exitcode is None:
            p.join(5)
        if p.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            p.join(5)


def run_handoff(params: LayoutParams, total: int, prx_cpu: int | None, force_ns: int | None) -> np.ndarray:
    name = f"bench-handoff-{os.getpid()}"
    seg = Segment.create(name, params, deadline_ms=1000.0)
    try:
        with _child(_proxy_handoff, (name, prx_cpu, total, force_ns)) as p:
            eng = HostFlags(seg, _spin(force_ns, p.pid, prx_cpu))  # after both pinned: sees the placement
            dst = np.zeros(seg.layout.reply.size, np.int32)
            staged = seg.staging.view(np.int64)

            def one_round(t: int) -> None:
                staged[0, 0] = t
                eng.raise_gathered(t)
                if not eng.wait_published(t, WAIT_S):
                    raise RuntimeError(f"round {t} not published (proxy exit {p.exitcode})")
                if eng.read_page(t, dst) != PAGE_OK or dst[0] != t:
                    raise RuntimeError(f"round {t}: bad page")
                eng.consume(t)

            return _time_rounds(total, one_round)
    finally:
        seg.unlink()
        seg.close()


def run_words(total: int, prx_cpu: int | None, force_ns: int | None) -> np.ndarray:
    mm = mmap.mmap(-1, 4096)  # MAP_SHARED: the forked child sees the same words (ping at 0, pong at 128)
    with _child(_proxy_words, (mm, prx_cpu, total, force_ns)) as p:
        spin = _spin(force_ns, p.pid, prx_cpu)

        def one_round(t: int) -> None:
            hf.store(mm, 0, t)
            t0 = time.perf_counter_ns()
            ok = hf.wait_ge(mm, 128, t, WAIT_S, spin.spin_ns)
            spin.update(time.perf_counter_ns() - t0, ok)
            if not ok:
                raise RuntimeError(f"words: no pong {t} (peer exit {p.exitcode})")

        return _time_rounds(total, one_round)


def run_pipe(total: int, prx_cpu: int | None) -> np.ndarray:
    mine, theirs = CTX.Pipe()
    with _child(_proxy_pipe, (theirs, prx_cpu, total)):
        msg = b"\0" * 8

        def one_round(t: int) -> None:
            mine.send_bytes(msg)
            mine.recv_bytes()

        return _time_rounds(total, one_round)


def summarize(ns: np.ndarray, warmup: int) -> dict[str, float]:
    us = ns[warmup:] / 1e3
    return {"rounds": int(us.size), "p50_us": round(float(np.percentile(us, 50)), 2),
            "p99_us": round(float(np.percentile(us, 99)), 2), "p99_9_us": round(float(np.percentile(us, 99.9)), 2),
            "max_us": round(float(us.max()), 2), "mean_us": round(float(us.mean()), 2),
            "rounds_per_s": round(float(us.size / (us.sum() / 1e6)), 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20_000, help="timed rounds per (placement, method)")
    ap.add_argument("--warmup", type=int, default=2_000, help="untimed rounds first")
    ap.add_argument("--pin", default="same,split", help="placements: same, split, unpinned (comma list)")
    ap.add_argument("--max-reqs", type=int, default=256, help="M: sets the reply page's size")
    ap.add_argument("--num-spec", type=int, default=5, help="N: sets the reply page's size")
    ap.add_argument("--force-spin-ns", type=int, default=None,
                    help="override the adaptive spin's bound on both sides (also on one core): a comparison")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    a = ap.parse_args(argv)
    total = a.rounds + a.warmup
    params = LayoutParams(max_reqs=a.max_reqs, num_spec=a.num_spec, window=4, row_bytes=64, max_rows=8,
                          resync_per_round=1)
    page_bytes = 4 * (2 + a.max_reqs + 2 * a.max_reqs * a.num_spec)
    result: dict[str, Any] = {
        "bench": "handoff", "rounds": a.rounds, "warmup": a.warmup, "page_bytes": page_bytes,
        "force_spin_ns": a.force_spin_ns, "loadavg_1m": os.getloadavg()[0],
        "machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                    "machine": platform.machine(), "kernel": platform.release()},
        "placements": {},
    }
    home = os.sched_getaffinity(0)
    try:
        for place, eng_cpu, prx_cpu in _placements([p.strip() for p in a.pin.split(",") if p.strip()]):
            _pin(eng_cpu)
            row: dict[str, Any] = {"engine_cpu": eng_cpu, "proxy_cpu": prx_cpu}
            row["handoff"] = summarize(run_handoff(params, total, prx_cpu, a.force_spin_ns), a.warmup)
            row["words"] = summarize(run_words(total, prx_cpu, a.force_spin_ns), a.warmup)
            row["pipe"] = summarize(run_pipe(total, prx_cpu), a.warmup)
            row["pipe_over_handoff_p50"] = round(row["pipe"]["p50_us"] / row["handoff"]["p50_us"], 2)
            result["placements"][place] = row
            os.sched_setaffinity(0, home)
    finally:
        os.sched_setaffinity(0, home)
    if a.json:
        print(json.dumps(result))
        return 0
    print(f"hand-off through the segment vs multiprocessing.Pipe: {a.rounds} rounds after {a.warmup} warm-up, "
          f"reply page {page_bytes} B, {result['machine']['cpus']} cpus, load average {os.getloadavg()[0]:.1f}"
          + ("" if a.force_spin_ns is None else f", spin forced to {a.force_spin_ns} ns"))
    print(f"{'placement':<10} {'method':<8} {'p50 µs':>9} {'p99 µs':>9} {'p99.9 µs':>9} {'max µs':>9} {'rounds/s':>10}")
    for place, row in result["placements"].items():
        for method in ("handoff", "words", "pipe"):
            s = row[method]
            print(f"{place:<10} {method:<8} {s['p50_us']:>9.2f} {s['p99_us']:>9.2f} {s['p99_9_us']:>9.2f} "
                  f"{s['max_us']:>9.1f} {s['rounds_per_s']:>10.0f}")
        print(f"{place:<10} pipe / handoff at p50: {row['pipe_over_handoff_p50']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
