"""A stuck round loop (heartbeat still going) is seen as a hung proxy."""

from __future__ import annotations

import time

import pytest

from engine_shim import api
from tests.rig import decode_batch

pytestmark = pytest.mark.timeout(60)

M, N, W, B = 8, 3, 4, 16
DEADLINE_MS = 20.0
HB_TIMEOUT_S = 0.5
HANG_MS = 2500.0


def _run_delay_ns() -> int:
    """ns this thread has spent runnable but not running (/proc/thread-self/schedstat; 0 without it)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def test_round_loop_hang_detaches_within_the_bound_and_drafts_resume(seg_name):
    shim = api.attach(seg_name, mode="thread", worker="inproc", max_reqs=M, num_spec=N, window=W, row_bytes=B,
                      deadline_ms=DEADLINE_MS, fault_round_hang_ms=HANG_MS, heartbeat_timeout_s=HB_TIMEOUT_S,
                      look_every_s=0.02)
    try:
        proxy = shim.proxy
        t, worst_ms = 0, 0.0

        def round_() -> bool:
            nonlocal t, worst_ms
            t += 1
            rd0, t0 = _run_delay_ns(), time.perf_counter()
            shim.enqueue(t, **decode_batch(t, B))
            r = shim.read_reply(t)
            # the engine's own time, less what it spent runnable but off the CPU (the kernel's witness,
            # as the chaos campaign excuses it): a busy machine's preemption is not a late claim
            worst_ms = max(worst_ms, (time.perf_counter() - t0) * 1e3 - (_run_delay_ns() - rd0) / 1e6)
            time.sleep(0.002)  # the engine's forward
            return bool(r.ok_mask.any())

        end = time.monotonic() + 10
        while not (round_() and shim.attached) and time.monotonic() < end:
            pass
        assert shim.attached and proxy.incarnations == 1
        worst_ms = 0.0
        hung_at = time.monotonic()
        proxy.hang_round_loop()
        while shim.attached and time.monotonic() - hung_at < 5:
            round_()
        detached_after = time.monotonic() - hung_at
        print(f"\nround_loop_hang: detached after {detached_after * 1e3:.0f} ms")
        assert not shim.attached, "a stuck round loop was never seen as a hung proxy"
        assert shim.counters.counter("detach_round_loop_hung") == 1
        assert any(e["how"] == "round_loop_hung" for e in shim.events.dump())
        # the bound: heartbeat_timeout_s of no progress, seen at the watchdog's next look (+ slack)
        assert detached_after < HB_TIMEOUT_S + 0.5, detached_after
        # the engine kept its deadline throughout (+ scheduling slack on a shared machine)
        assert worst_ms < DEADLINE_MS + 30, worst_ms
        # the hang ends, the proxy finds its incarnation abandoned, makes a new one: drafts resume
        got_ok = False
        while time.monotonic() - hung_at < HANG_MS / 1e3 + 8 and not got_ok:
            got_ok = round_() and shim.attached
        assert got_ok, f"no drafts after the hang ended (incarnations {proxy.incarnations})"
        assert proxy.incarnations == 2 and proxy.stats.counter("fault_round_hangs") == 1
        assert worst_ms < DEADLINE_MS + 30, worst_ms
    finally:
        shim.close()
