"""A pool through the real CLI: two worker processes, a proxy given both (`--worker A,B`), the engine
side in the test (the real shim driven by the simulated engine, every usable draft checked against the
oracle). One worker is SIGKILLed mid-run: no wrong draft, drafting goes on through the survivor, and
`status --json` shows the dead worker's link backing off and the live one connected."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import engine_shim
from dspark_proxy.ops.launch import spawn_proxy, spawn_worker
from dspark_proxy.sim import SimConfig, SimEngine

pytestmark = pytest.mark.timeout(150)

M, N, W, B = 16, 4, 8, 64
LAYOUT = ["--max-reqs", str(M), "--num-spec", str(N), "--window", str(W), "--row-bytes", str(B)]


def _status(name: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "dspark_proxy.cli", "status", "--name", name, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# the simulated engine's step is shorter than a drafting STEP's round trip, where the gate's throughput rule
# rightly pauses drafting (docs/design.md, "Acceptance-aware drafting"); these tests check the pool's
# drafts, so they ask for them throughout
DRAFT_THROUGHOUT = ("--accept-tps-every", "0")


def test_two_worker_processes_one_killed(seg_name):
    a, b = spawn_worker(*LAYOUT), spawn_worker(*LAYOUT)
    proxy = shim = None
    try:
        proxy = spawn_proxy(seg_name, f"{a.address},{b.address}", *LAYOUT, "--deadline-ms", "50",
                            "--log-every", "0", *DRAFT_THROUGHOUT)
        shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=5.0)
        sim = SimEngine(SimConfig(seed=5, max_reqs=M, num_spec=N, window=W, row_bytes=B))
        before = sim.run(shim, rounds=600)
        assert before.wrong_drafts == 0, before.first_wrong
        assert before.usable_rate > 0.9, before.to_dict()
        time.sleep(0.4)  # a heartbeat snapshot later
        links = _status(seg_name)["proxy"]["gauges"]["workers"]
        assert [w["state"] for w in links] == ["connected", "connected"], links
        assert all(w["entries"] > 0 for w in links), links
        b.kill()
        b.stop()
        after = sim.run(shim, rounds=600)
        assert after.wrong_drafts == 0, after.first_wrong
        assert after.usable_rate > 0.85, after.to_dict()  # the killed worker's share resumed on the survivor
        time.sleep(0.4)
        st = _status(seg_name)
        links = st["proxy"]["gauges"]["workers"]
        assert links[0]["state"] == "connected" and links[0]["slots"] == M, links
        assert links[1]["state"] in ("backing_off", "connecting") and links[1]["pool_state"] == "down", links
        assert st["proxy"]["counters"]["pool_slots_resent"] >= 1
    finally:
        if shim is not None:
            shim.close()
        if proxy is not None:
            proxy.stop()
        a.stop()
        b.stop()


def test_two_engines_share_two_workers(make_seg_name):
    """Many engines, one pool: two proxies (one per engine, taking turns) given the same two workers
    both draft through both, with no wrong draft (the worker's budget split between them is
    tests/test_worker_bounds.py's)."""
    a, b = spawn_worker(*LAYOUT), spawn_worker(*LAYOUT)
    names = [make_seg_name("pool-e1"), make_seg_name("pool-e2")]
    proxies, shims = [], []
    try:
        for nm in names:
            proxies.append(spawn_proxy(nm, f"{a.address},{b.address}", *LAYOUT, "--deadline-ms", "50",
                                       "--log-every", "0", *DRAFT_THROUGHOUT))
            shims.append(engine_shim.attach(nm, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=5.0))
        sims = [SimEngine(SimConfig(seed=7 + i, max_reqs=M, num_spec=N, window=W, row_bytes=B)) for i in range(2)]
        for _ in range(3):  # the two engines take turns
            for sim, shim in zip(sims, shims, strict=True):
                res = sim.run(shim, rounds=150)
                assert res.wrong_drafts == 0, res.first_wrong
        time.sleep(0.4)
        for nm in names:
            st = _status(nm)
            assert st["proxy"]["counters"]["rounds_ok"] >= 400
            links = st["proxy"]["gauges"]["workers"]
            assert [w["state"] for w in links] == ["connected", "connected"] and all(w["usable"] > 0 for w in links)
    finally:
        for shim in shims:
            shim.close()
        for p in proxies:
            p.stop()
        a.stop()
        b.stop()
