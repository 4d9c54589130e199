"""Process mode and thread mode run the same round loop: for the same seeded engine, the same drafts.

Process mode is `dspark-proxy start` as a child process; thread mode is `engine_shim.attach(...,
mode="thread")`, the proxy on a thread of this process. Both talk to the same `dspark-proxy worker`
child (each over its own connection and session), with a deadline long enough that no round fails on
time, so every round's ok_mask, draft_ids and confidence must agree bit for bit.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import engine_shim
from dspark_proxy.ops.launch import spawn_proxy, spawn_worker
from dspark_proxy.shm.segment import Segment
from dspark_proxy.sim import SimConfig, SimEngine

pytestmark = pytest.mark.timeout(120)

M, N, W, B = 16, 4, 8, 64
LAYOUT = ["--max-reqs", str(M), "--num-spec", str(N), "--window", str(W), "--row-bytes", str(B)]
ROUNDS = 300
DEADLINE_MS = 3000.0


@pytest.fixture(scope="module")
def worker():
    w = spawn_worker(*LAYOUT)
    yield w
    w.stop()


def _run(shim) -> list[tuple]:
    sim = SimEngine(SimConfig(seed=11, max_reqs=M, num_spec=N, window=W, row_bytes=B, preempt_prob=0.02))
    seen: list[tuple] = []

    def keep(batch, reply) -> None:
        seen.append((batch.t, int(reply.status), np.array(reply.ok_mask, copy=True),
                     np.array(reply.draft_ids, copy=True), np.array(reply.confidence, copy=True)))

    res = sim.run(shim, rounds=ROUNDS, on_round=keep)
    assert res.wrong_drafts == 0, res.first_wrong
    # the shim's counters say why a round failed (rounds_detached: it ran before the shim attached)
    assert res.status.get("round_failed", 0) == 0, (res.status, shim.stats()["counters"])
    return seen


def _proxy_connected(name: str, timeout_s: float) -> None:
    """Wait until the proxy's client is connected to the worker (its stats say so)."""
    end = time.monotonic() + timeout_s
    seg = Segment.open(name)
    try:
        while time.monotonic() < end:
            raw = seg.read_block("proxy")
            if raw and json.loads(raw).get("gauges", {}).get("client", {}).get("connects", 0) >= 1:
                return
            time.sleep(0.02)
    finally:
        seg.close()
    raise AssertionError(f"proxy {name} did not connect to the worker within {timeout_s} s")


def test_process_and_thread_modes_give_identical_drafts(seg_name, make_seg_name, worker):
    proxy = spawn_proxy(seg_name, worker.address, *LAYOUT, "--deadline-ms", str(DEADLINE_MS), "--log-every", "0")
    try:
        shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=5.0)
        try:
            assert shim.state.value == "pending"
            _proxy_connected(seg_name, 10.0)
            proc = _run(shim)
        finally:
            shim.close()
    finally:
        proxy.stop()

    thread_name = make_seg_name("thread")
    shim = engine_shim.attach(thread_name, mode="thread", worker=worker.address, max_reqs=M, num_spec=N,
                              window=W, row_bytes=B, deadline_ms=DEADLINE_MS, timeout_s=5.0)
    try:
        assert shim.proxy is not None and shim.proxy.client.wait_ready(10.0) is not None
        assert shim.state.value in ("pending", "attached")  # attach() waited for the watchdog to find it
        thr = _run(shim)
        assert shim.proxy.stats.counter("attaches") == 1
    finally:
        shim.close()
    assert shim.proxy._stop.is_set()  # close() stopped the proxy thread

    assert len(proc) == len(thr) == ROUNDS
    usable = 0
    for p, t in zip(proc, thr, strict=True):
        assert p[0] == t[0] and p[1] == t[1], (p[:2], t[:2])
        assert np.array_equal(p[2], t[2]), f"round {p[0]}: ok_mask differs"
        assert np.array_equal(p[3], t[3]), f"round {p[0]}: draft_ids differ"
        assert np.array_equal(p[4].view(np.uint32), t[4].view(np.uint32)), f"round {p[0]}: confidence differs"
        usable += int(p[2].sum())
    assert usable > ROUNDS  # the comparison is of real drafts, not of empty rounds


def test_thread_mode_says_at_once_why_its_proxy_could_not_start(seg_name, monkeypatch):
    """A proxy thread that fails to create its segment (here: /dev/shm full) fails attach() with the
    reason, at once, instead of a generic "did not become ready" after the timeout."""
    import errno
    import os

    def no_space(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="failed to start: segment .* needs .* MiB of shared memory"):
        engine_shim.attach(seg_name, mode="thread", worker="inproc", max_reqs=M, num_spec=N, window=W,
                           row_bytes=B, timeout_s=5.0)
    assert time.monotonic() - t0 < 2.0
