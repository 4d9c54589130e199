"""The real system through the real CLI: a worker process, a proxy process, the engine side in the test
(the real shim driven by the simulated engine, every usable draft checked against the oracle)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import engine_shim
from dspark_proxy.ops.launch import spawn_proxy, spawn_worker, wait_proxy_ready
from dspark_proxy.shm.segment import Segment, SegmentError
from dspark_proxy.sim import SimConfig, SimEngine

pytestmark = pytest.mark.timeout(120)

M, N, W, B = 16, 4, 8, 64
LAYOUT = ["--max-reqs", str(M), "--num-spec", str(N), "--window", str(W), "--row-bytes", str(B)]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dspark_proxy.cli", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def worker():
    w = spawn_worker(*LAYOUT)
    yield w
    w.stop()


def _segment_gone(name: str) -> bool:
    return not os.path.exists(f"/dev/shm/dspark-proxy.{name}")


def test_proxy_and_worker_through_the_cli(seg_name, worker):
    # the simulated engine's step (~0.6 ms) is shorter than a drafting STEP's round trip: there the gate's
    # throughput rule rightly finds that drafting does not pay and pauses it (docs/design.md,
    # "Acceptance-aware drafting"; tests/test_gate_tps_e2e.py runs it through the CLI). This test checks
    # the hand-off's drafts, so it asks for them throughout.
    proxy = spawn_proxy(seg_name, worker.address, *LAYOUT, "--deadline-ms", "50", "--log-every", "0",
                        "--accept-tps-every", "0")
    shim = None
    try:
        shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=5.0)
        sim = SimEngine(SimConfig(seed=3, max_reqs=M, num_spec=N, window=W, row_bytes=B))
        res = sim.run(shim, rounds=1500)
        assert res.wrong_drafts == 0, res.first_wrong
        assert res.usable_rate > 0.9, res.to_dict()
        time.sleep(0.4)  # one heartbeat-thread snapshot later
        out = _cli("status", "--name", seg_name, "--json")
        assert out.returncode == 0, out.stderr
        st = json.loads(out.stdout)
        assert set(st) >= {"header", "words", "proxy", "shim"}
        assert st["header"]["state"] == "ready" and st["header"]["owner_pid"] == proxy.pid
        assert st["proxy"]["counters"]["rounds_ok"] >= 1000
        assert "rank0_round_us" in st["proxy"]["latency"]
        g = st["proxy"]["gauges"]
        assert g["config"]["deadline_ms"] == 50.0 and g["config_sources"]["deadline_ms"] == "cli"
        assert g["config_sources"]["breaker_threshold"] == "default"
        assert st["words"]["published"] >= 1500
        human = _cli("status", "--name", seg_name)
        assert "rounds_ok=" in human.stdout and "\n  rank0_round " in human.stdout  # the latency table, in ms
        # SIGTERM: the proxy fails every round ahead (a waiting engine is released), then unlinks
        proxy.signal(signal.SIGTERM)
        assert proxy.proc.wait(10) == 0
        assert _segment_gone(seg_name)
        # the engine keeps going, target-only, without waiting
        b = shim._t + 1
        batch = sim.next_batch(b)
        t0 = time.perf_counter()
        shim.enqueue(b, **batch.enqueue_kwargs())
        reply = shim.read_reply(b)
        assert reply.status == 2 and (time.perf_counter() - t0) < 0.05
    finally:
        if shim is not None:
            shim.close()
        proxy.stop()
    assert _segment_gone(seg_name)


def test_stop_command_and_live_owner_refused(seg_name, worker):
    proxy = spawn_proxy(seg_name, worker.address, *LAYOUT)
    try:
        again = _cli("start", "--name", seg_name, "--worker", worker.address, *LAYOUT)
        assert again.returncode == 3
        assert "live proxy" in again.stderr and str(proxy.pid) in again.stderr
        out = _cli("stop", "--name", seg_name)
        assert out.returncode == 0, out.stderr
        assert proxy.proc.wait(10) == 0
        assert _segment_gone(seg_name)
    finally:
        proxy.stop()


def test_mismatched_engine_is_refused_with_the_field_named(seg_name, worker):
    proxy = spawn_proxy(seg_name, worker.address, *LAYOUT)
    try:
        with pytest.raises(SegmentError, match="window"):
            engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W * 2, row_bytes=B)
    finally:
        proxy.stop()


def _phase(sim: SimEngine, shim, **kw) -> dict:
    """Run the sim for a while; the figures of just this stretch (SimEngine's result is cumulative)."""
    before, k = sim.result(), len(sim._wait_ns)
    after = sim.run(shim, **kw)
    waits = sim._wait_ns[k:]
    return {"rounds": after.rounds - before.rounds, "wrong": after.wrong_drafts - before.wrong_drafts,
            "usable": after.usable_drafts - before.usable_drafts,
            "needed": after.drafts_needed - before.drafts_needed,
            "wait_us_max": max(waits, default=0) / 1000.0}


def test_proxy_killed_stopped_and_restarted_under_a_running_engine(seg_name, worker):
    """SIGSTOP, then SIGKILL, then a new proxy: the engine never waits past the deadline (+ margin)
    and drafts resume from the new incarnation."""
    deadline_ms, margin_ms = 20.0, 15.0
    args = [*LAYOUT, "--deadline-ms", str(deadline_ms), "--log-every", "0"]
    proxy = spawn_proxy(seg_name, worker.address, *args)
    shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=5.0,
                              heartbeat_timeout_s=0.3)
    sim = SimEngine(SimConfig(seed=5, max_reqs=M, num_spec=N, window=W, row_bytes=B, engine_work_us=500.0))
    phases: dict[str, dict] = {}
    try:
        p = phases["healthy"] = _phase(sim, shim, rounds=300)
        assert p["usable"] > 0.8 * p["needed"]
        proxy.signal(signal.SIGSTOP)
        phases["stopped"] = _phase(sim, shim, duration_s=1.0)
        proxy.kill()
        phases["killed"] = _phase(sim, shim, duration_s=0.5)
        proxy = spawn_proxy(seg_name, worker.address, *args)
        # rounds keep running while the new proxy appears; drafts come back within a second
        end = time.monotonic() + 5.0
        back = None
        while time.monotonic() < end and back is None:
            p = _phase(sim, shim, rounds=20)
            back = p if p["usable"] else None
        assert back is not None, "drafts did not resume after the proxy restart"
        p = phases["restarted"] = _phase(sim, shim, rounds=300)
        assert p["usable"] > 0.8 * p["needed"], p
        assert sim.result().wrong_drafts == 0
        for name, ph in phases.items():
            assert ph["wait_us_max"] < (deadline_ms + margin_ms) * 1000, (name, ph)
    finally:
        shim.close()
        proxy.stop()
    assert _segment_gone(seg_name)


def test_attach_waits_for_a_proxy_that_comes_later(seg_name, worker):
    shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B)
    proxy = None
    try:
        sim = SimEngine(SimConfig(seed=9, max_reqs=M, num_spec=N, window=W, row_bytes=B))
        r = sim.run(shim, rounds=20)  # no proxy: target-only, instantly
        assert r.usable_drafts == 0 and r.wait_us_max < 5000
        proxy = spawn_proxy(seg_name, worker.address, *LAYOUT, "--deadline-ms", "50")
        wait_proxy_ready(seg_name, proxy.pid, 5.0)
        end = time.monotonic() + 5.0
        got = 0
        while time.monotonic() < end and got == 0:
            got = sim.run(shim, rounds=20).usable_drafts
        assert got > 0
        assert sim.run(shim, rounds=200).wrong_drafts == 0
    finally:
        shim.close()
        if proxy is not None:
            proxy.stop()
    with pytest.raises(SegmentError):
        Segment.open(seg_name)


def test_demo_command_end_to_end(seg_name):
    out = _cli("demo", "--rounds", "2000", "--json", "--name", seg_name, "--max-reqs", "16", "--window", "8",
               "--row-bytes", "64")
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["rounds"] == 2000 and r["wrong_drafts"] == 0
    assert r["usable_rate"] > 0.9
    # the proxy's own cost per round (round - its STEP's rtt, per round): positive, well under the rtt
    assert 0 < r["proxy_cost_us_p50"] < r["proxy_round_us_p50"]
    assert _segment_gone(seg_name)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert seg_name not in ps  # the demo's proxy is gone


def test_sampled_mode_end_to_end(seg_name):
    """--sampled on both sides: seed and temperature travel, support ids and q come back for the
    requests that sampled (the integrity drafter's support is draft + k, q one-hot on k = 0)."""
    w = spawn_worker(*LAYOUT, "--sampled")
    proxy = spawn_proxy(seg_name, w.address, *LAYOUT, "--sampled", "--deadline-ms", "50")
    shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, sampled=True,
                              timeout_s=5.0)
    seen = {"sampled": 0}

    def check(batch, reply):
        ok = reply.ok_mask & reply.sample_mask
        for i in np.flatnonzero(ok):
            ids = reply.draft_ids[i].astype(np.int64)
            sup = reply.support_ids[i]
            assert np.array_equal(sup[:, 0], ids) and np.array_equal(sup[:, 5], (ids + 5) & 0x7FFFFFFF)
            assert np.all(reply.proposal_q[i][:, 0] == 1.0)
            seen["sampled"] += 1

    try:
        sim = SimEngine(SimConfig(seed=4, max_reqs=M, num_spec=N, window=W, row_bytes=B, sampled_mode=True))
        res = sim.run(shim, rounds=400, on_round=check)
        assert res.wrong_drafts == 0 and res.usable_rate > 0.9, res.to_dict()
        assert seen["sampled"] > 100
    finally:
        shim.close()
        proxy.stop()
        w.stop()


def test_n_out_table_and_token_auth_through_the_cli(seg_name, tmp_path):
    """A shared token on both sides, and an n-out table that cuts drafts by batch size: the cut drafts
    are -1 with confidence 0 and every usable one still matches the oracle."""
    secret = tmp_path / "token"
    secret.write_text("s3cret-token\n")
    w = spawn_worker(*LAYOUT, "--token-file", str(secret))
    proxy = spawn_proxy(seg_name, w.address, *LAYOUT, "--token-file", str(secret), "--deadline-ms", "50",
                        "--n-out-table", "2")
    shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=5.0)
    cut = {"rounds": 0}

    def check(batch, reply):
        if reply.ok_mask.any():
            ids = reply.draft_ids[reply.ok_mask]
            assert (ids[:, 2:] == -1).all() and (ids[:, :2] >= 0).all()
            assert (reply.confidence[reply.ok_mask][:, 2:] == 0).all()
            cut["rounds"] += 1

    try:
        sim = SimEngine(SimConfig(seed=6, max_reqs=M, num_spec=N, window=W, row_bytes=B))
        res = sim.run(shim, rounds=300, on_round=check)
        assert res.wrong_drafts == 0 and res.usable_rate > 0.9, res.to_dict()
        assert cut["rounds"] > 200
    finally:
        shim.close()
        proxy.stop()
        w.stop()


def test_wrong_token_keeps_the_engine_target_only(seg_name, tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("right")
    bad.write_text("wrong")
    w = spawn_worker(*LAYOUT, "--token-file", str(good))
    proxy = spawn_proxy(seg_name, w.address, *LAYOUT, "--token-file", str(bad), "--deadline-ms", "50")
    shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=5.0)
    try:
        sim = SimEngine(SimConfig(seed=8, max_reqs=M, num_spec=N, window=W, row_bytes=B))
        time.sleep(0.5)  # the refused handshake
        res = sim.run(shim, rounds=100)
        assert res.usable_drafts == 0 and res.wrong_drafts == 0
        assert max(sim.wait_ns) < 50e6 + 20e6  # the deadline, and the campaign's slack for a busy machine
        time.sleep(0.4)
        st = json.loads(_cli("status", "--name", seg_name, "--json").stdout)
        assert st["proxy"]["counters"].get("fallback_disabled", 0) >= 50
    finally:
        shim.close()
        proxy.stop()
        w.stop()


def test_start_with_too_little_shared_memory_fails_clearly(seg_name):
    """/dev/shm smaller than the segment (Docker's 64 MB default): `start` must refuse with a message
    that says what to do, not leave the engine to die of SIGBUS on its first write to a missing page.
    Runs in a private mount namespace with a 2 MiB /dev/shm (skipped where that is not permitted)."""
    import shutil

    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1)")
    probe = subprocess.run([unshare, "-m", "sh", "-c", "mount -t tmpfs -o size=2m tmpfs /dev/shm"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private /dev/shm here: {probe.stderr.strip()[:200]}")
    cmd = (f"mount -t tmpfs -o size=2m tmpfs /dev/shm && exec {sys.executable} -m dspark_proxy.cli start "
           f"--name {seg_name} --worker inproc --max-reqs 64 --num-spec 5 --window 16 --row-bytes 4096 "
           f"--segment-rows --log-level WARNING")  # with the staging: a segment larger than 2 MiB
    out = subprocess.run([unshare, "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=60)
    from dspark_proxy.ops.exitcodes import EXIT_STARTUP_FAILURE

    assert out.returncode == EXIT_STARTUP_FAILURE, (out.returncode, out.stderr[-2000:])
    assert "needs 8.4 MiB of shared memory and /dev/shm has 2 MiB free" in out.stderr, out.stderr[-2000:]
    assert "--shm-size" in out.stderr and "--staging-budget-mb" in out.stderr
