"""Section 1, hand-off: engine -> proxy -> engine with a null worker inside a real proxy process,
against a raw futex ping-pong through our own hostflag words (the floor), a multiprocessing.Pipe
round trip and a loopback TCP round trip, all in the same run and placement.

The engine side is a real Shim in this process driving minimal rounds (one request, 1-6 rows of 256
bytes, M=256, N=5, W=128); a round is `enqueue` + `read_reply`, timed around both. The proxy is
`dspark-proxy start --worker null` (the round's whole proxy side runs; the worker answers in ~3 µs
without a socket). Its own time per round (gathered seen -> published, `rank0_round_us`) comes
from its statistics.

Also the bare hand-off (bench/bare.py, also scripts/bench_handoff.py's): the same words and page
copy through a real segment with no round logic (no Shim, no RoundCore): the distance between it
and the full hand-off is what the Python work on both sides costs.

Both paths: the keys above run the default (native: dspark_proxy/round/_fastround.c) hot paths; each
placement also has `reference`, the same rounds with DSPARK_NATIVE=0 on both sides (the Python reference
models), and the unpinned placement `decode_n256` (n = 256 requests of one 256-byte row each) on both
paths: the figures of the same run, side by side.

Placements: unpinned (the scheduler decides, 2+ cores: both sides may spin), both processes on one
core, each on its own core. Pinned processes are started pinned (affinity inherited, like taskset),
so their adaptive spin sees the single core it has.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

from .batches import RoundGen
from .measure import Samples, default_prefix, from_stats, ratio, summarize
from .peers import time_futex, time_pipe, time_tcp
from .procs import on_cpu, pinned, placements

__all__ = ["run_handoff", "HANDOFF_SHAPE"]

HANDOFF_SHAPE = {"max_reqs": 256, "num_spec": 5, "window": 128, "row_bytes": 256, "n": 1}
# back to back, the proxy's round runs with its caches warm; between a real engine's forwards its CPU
# idles, and the round runs cold (the paced figure, docs/performance.md, "Hand-off")
PACED_GAP_MS = 3.0
KEEP_AWAKE = ("--keep-awake-ms", "20")  # the proxy's CPUs kept awake, as docs/performance.md sets it up for a real engine


def _layout_args(shape: dict[str, int]) -> list[str]:
    return ["--max-reqs", str(shape["max_reqs"]), "--num-spec", str(shape["num_spec"]),
            "--window", str(shape["window"]), "--row-bytes", str(shape["row_bytes"])]


@contextlib.contextmanager
def _path(native: bool):
    """DSPARK_NATIVE for what is built inside (this process's shim, the proxy process spawned)."""
    old = os.environ.get("DSPARK_NATIVE")
    os.environ["DSPARK_NATIVE"] = "1" if native else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DSPARK_NATIVE", None)
        else:
            os.environ["DSPARK_NATIVE"] = old


def time_handoff(name: str, rounds: int, warmup: int, other_cpu: int | None,
                 shape: dict[str, int] = HANDOFF_SHAPE, native: bool = True,
                 fixed_valid: int | None = None, gap_ms: float = 0.0,
                 proxy_args: tuple[str, ...] = (), published_first: bool = False) -> dict[str, Any]:
    """Rounds through a null-worker proxy process; returns raw ns arrays and the proxy's own figures.
    `native` False: both sides on the Python reference models. `gap_ms`: the engine busy on its own
    CPU that long before each round (a forward), as a real engine paces its rounds. `proxy_args`: more
    of the proxy's flags (`--keep-awake-ms`). `published_first`: read_reply is called only once the
    reply is published (the engine looks at the word first), so it times the read of a published
    reply: its copy, checks and `consumed`, no wait."""
    import numpy as np

    import engine_shim
    from dspark_proxy.ops.launch import spawn_proxy
    from dspark_proxy.ops.status import read_status
    from dspark_proxy.shm import hostflag as hf_c
    from dspark_proxy.shm.layout import Word
    from dspark_proxy.shm.segment import Segment

    with on_cpu(other_cpu), _path(native):
        proxy = spawn_proxy(name, "null", *_layout_args(shape), "--deadline-ms", "5000", "--log-every", "0",
                            *proxy_args)
    shim = None
    try:
        with _path(native):
            shim = engine_shim.attach(name, max_reqs=shape["max_reqs"], num_spec=shape["num_spec"],
                                      window=shape["window"], row_bytes=shape["row_bytes"], timeout_s=10.0)
        gen = RoundGen(shape["n"], num_spec=shape["num_spec"], window=shape["window"],
                       row_bytes=shape["row_bytes"], fixed_valid=fixed_valid)
        total = warmup + rounds
        enq = np.empty(total, np.int64)
        read = np.empty(total, np.int64)
        failed = 0
        clock = time.perf_counter_ns
        words = Segment.open(name) if published_first else None
        try:
            published = words.layout.word_off(Word.PUBLISHED) if words is not None else 0
            for i in range(total):
                if gap_ms:
                    busy_until = clock() + int(gap_ms * 1e6)
                    while clock() < busy_until:
                        pass
                kw = gen.next()
                t0 = clock()
                shim.enqueue(gen.t, **kw)
                t1 = clock()
                if words is not None:  # the engine looks at the word first (bounded: the proxy may be gone)
                    hf_c.wait_ge(words.mm, published, gen.t, 5.0, 100_000)
                    t1 = clock()
                reply = shim.read_reply(gen.t)
                t2 = clock()
                enq[i], read[i] = t1 - t0, t2 - t1
                failed += reply.status == 2
        finally:
            if words is not None:
                words.close()
        time.sleep(0.35)  # the proxy publishes its statistics every 0.25 s
        lat = read_status(name)["proxy"].get("latency", {})
        return {"enqueue": enq[warmup:], "read_reply": read[warmup:], "round": (enq + read)[warmup:],
                "failed": int(failed), "proxy_round": from_stats(lat.get("rank0_round_us")),
                "worker": from_stats(lat.get("rtt_us"))}
    finally:
        if shim is not None:
            shim.close()
        proxy.stop()


def _summary(h: dict[str, Any]) -> dict[str, Any]:
    """One path's figures: the round, its two engine calls, the proxy's own time."""
    return {"handoff": summarize(h["round"]), "enqueue": summarize(h["enqueue"]),
            "read_reply": summarize(h["read_reply"]), "proxy_round": h["proxy_round"],
            "failed_rounds": h["failed"]}


def time_bare_handoff(pings: int, other_cpu: int | None) -> tuple[Any, str]:
    """The bare hand-off (bench/bare.py): raw ns, or None and why not."""
    try:
        from dspark_proxy.shm.layout import LayoutParams

        from .bare import run_handoff as bare_handoff

        s = HANDOFF_SHAPE
        params = LayoutParams(max_reqs=s["max_reqs"], num_spec=s["num_spec"], window=4, row_bytes=64,
                              max_rows=8, resync_per_round=1)
        return bare_handoff(params, pings, other_cpu, None), ""
    except Exception as e:  # noqa: BLE001 - the floor is a comparison: its failure is a note, not the section's
        return None, f"bare hand-off failed: {e!r}"


def run_handoff(quick: bool = False, say: Callable[[str], None] = lambda s: None,
                prefix: str = "") -> tuple[dict, Samples]:
    rounds, warmup, pings = (1500, 200, 2000) if quick else (20000, 1000, 20000)
    samples = Samples()
    out: dict[str, Any] = {"shape": HANDOFF_SHAPE, "rounds": rounds, "pings": pings, "placements": {}}
    for i, (place, eng, other) in enumerate(placements()):
        say(f"hand-off: {place}")
        ctx = pinned({eng}) if eng is not None else contextlib.nullcontext()
        with ctx:
            name = f"{prefix or default_prefix()}-handoff-{i}"
            h = time_handoff(name, rounds, warmup, other)
            more = rounds // 2 if quick else rounds  # the rounds of the comparison rows (quick: fewer)
            ref = time_handoff(name + "-ref", more, warmup, other, native=False)
            big, pub = {}, None
            if i == 0:  # n = 256 one-row decode rounds, both paths, in the first placement only
                shape256 = dict(HANDOFF_SHAPE, n=256)
                for path, nat in (("native", True), ("reference", False)):
                    big[path] = time_handoff(f"{name}-256{path[0]}", more // 2, warmup, other, shape256,
                                             native=nat, fixed_valid=1)
                pub = time_handoff(f"{name}-pub", more // 2, warmup, other, published_first=True)
            base = {"futex_adaptive": time_futex(pings, "adaptive", other),
                    "futex_sleep": time_futex(pings, "0", other),
                    "pipe": time_pipe(pings, other),
                    "tcp": time_tcp(pings, other)}
            bare, why = time_bare_handoff(pings, other)
        skip = pings // 10
        r: dict[str, Any] = {"handoff": summarize(h["round"]), "enqueue": summarize(h["enqueue"]),
                             "read_reply": summarize(h["read_reply"]), "proxy_round": h["proxy_round"],
                             "null_worker": h["worker"], "failed_rounds": h["failed"]}
        r["reference"] = _summary(ref)
        if big:
            r["decode_n256"] = {path: _summary(x) for path, x in big.items()}
        if pub is not None:  # read_reply of a reply already published (no wait in it)
            r["read_reply_published"] = {**summarize(pub["read_reply"]), "failed_rounds": pub["failed"]}
        for k, v in base.items():
            r[k] = summarize(v, skip)
            samples.add(f"{place}/{k}", v, skip)
        if bare is not None:
            r["bare_handoff"] = summarize(bare, skip)
            samples.add(f"{place}/bare_handoff", bare, skip)
        else:
            r["bare_handoff_note"] = why
        samples.add(f"{place}/handoff", h["round"])
        hp50 = r["handoff"]["p50_us"]
        floor = min(r["futex_adaptive"]["p50_us"], r["futex_sleep"]["p50_us"])
        r["ratios"] = {
            "handoff_over_futex_floor_p50": ratio(hp50, floor),
            "pipe_over_handoff_p50": ratio(r["pipe"]["p50_us"], hp50),
            "tcp_over_handoff_p50": ratio(r["tcp"]["p50_us"], hp50),
            "proxy_round_over_futex_floor_p50": ratio(r["proxy_round"]["p50_us"], floor),
        }
        r["ratios"]["reference_over_handoff_p50"] = ratio(r["reference"]["handoff"]["p50_us"], hp50)
        if bare is not None:
            r["ratios"]["bare_handoff_over_futex_floor_p50"] = ratio(r["bare_handoff"]["p50_us"], floor)
            r["ratios"]["handoff_over_bare_handoff_p50"] = ratio(hp50, r["bare_handoff"]["p50_us"])
        out["placements"][place] = r
    if len(placements()) > 2:  # a real engine's pace: the same rounds, each after a forward
        _, eng, other = placements()[2]
        say(f"hand-off: paced, a round every {PACED_GAP_MS} ms, cross_core")
        with pinned({eng}):
            h = time_handoff(f"{prefix or default_prefix()}-handoff-paced", rounds // 5, warmup // 5, other,
                             gap_ms=PACED_GAP_MS)
        out["paced"] = {"gap_ms": PACED_GAP_MS, "placement": "cross_core", **_summary(h)}
        # the same two ways with the proxy's CPUs kept awake between rounds (docs/performance.md, "Keeping the proxy's
        # CPUs awake"): an idle vCPU is a cold one here, back to back too once the proxy sleeps
        say("hand-off: unpinned and paced, the proxy kept awake")
        h = time_handoff(f"{prefix or default_prefix()}-handoff-ka", rounds // 2, warmup, None, proxy_args=KEEP_AWAKE)
        with pinned({eng}):
            hp = time_handoff(f"{prefix or default_prefix()}-handoff-paced-ka", rounds // 5, warmup // 5, other,
                              gap_ms=PACED_GAP_MS, proxy_args=KEEP_AWAKE)
        out["keep_awake"] = {"keep_awake_ms": float(KEEP_AWAKE[1]), "placement": "unpinned", **_summary(h),
                             "paced": {"gap_ms": PACED_GAP_MS, "placement": "cross_core", **_summary(hp)}}
    return out, samples
