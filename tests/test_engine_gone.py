"""An engine killed outright (SIGKILL: no detach, no close) while its proxy keeps running. It abandons
nothing, so before, the proxy waited for its next `gathered` for ever and the engine's shared ring
(M x W x row_bytes of /dev/shm: 2.2 GiB at the realistic shapes) stayed until another engine of the
name attached. Now the proxy sees the process gone within about a second (a pidfd, asked once a second
while it waits), starts a new incarnation, which removes the ring, and the next engine attaches as
usual. A live engine that merely goes quiet is never taken for gone."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import engine_shim
from dspark_proxy.config import ProxyConfig
from dspark_proxy.ops.status import read_status
from dspark_proxy.proxy import Proxy
from dspark_proxy.sim import SimConfig, SimEngine
from tests.rig import ScriptedClient
from tests.test_engine_restart import B, M, N, W

pytestmark = pytest.mark.timeout(90)

_ENGINE = textwrap.dedent("""
    import sys, time
    import engine_shim
    from dspark_proxy.sim import SimConfig, SimEngine
    name, M, N, W, B = sys.argv[1], *map(int, sys.argv[2:6])
    shim = engine_shim.attach(name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=10.0)
    sim = SimEngine(SimConfig(seed=5, max_reqs=M, num_spec=N, window=W, row_bytes=B))
    sim.run(shim, rounds=30)
    print("ran", flush=True)
    time.sleep(120)  # killed here, between rounds: the proxy waits for round 31's gathered
""")


def test_a_killed_engines_ring_is_removed_and_the_next_engine_attaches(seg_name):
    cfg = ProxyConfig(name=seg_name, worker="inproc", max_reqs=M, num_spec=N, window=W, row_bytes=B,
                      deadline_ms=500.0, log_every=0)
    proxy = Proxy(cfg, client=ScriptedClient(max_reqs=M, num_spec=N, window=W, row_bytes=B))
    th = threading.Thread(target=proxy.serve, name="test-proxy", daemon=True)
    th.start()
    child = None
    try:
        assert proxy.ready.wait(10.0)
        child = subprocess.Popen([sys.executable, "-c", _ENGINE, seg_name, str(M), str(N), str(W), str(B)],
                                 stdout=subprocess.PIPE, text=True,  # a named ring: seen in /dev/shm
                                 env=dict(os.environ, DSPARK_SHARED_RING="named"))
        assert child.stdout.readline().strip() == "ran"
        ring = glob.glob(f"/dev/shm/dspark-ring.{seg_name}.{child.pid}.*")
        assert len(ring) == 1, "the engine wrote its rows into a shared ring"
        assert proxy.incarnations == 1 and proxy.stats._counters.get("attaches") == 1
        child.send_signal(signal.SIGKILL)
        child.wait(10.0)
        deadline = time.monotonic() + 5.0
        while (os.path.exists(ring[0]) or proxy.incarnations < 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(ring[0]), "the dead engine's ring is still in /dev/shm"
        assert proxy.incarnations == 2 and proxy.stats._counters.get("engine_gone") == 1
        # `status` of the new incarnation says so at once, with the gone engine's rounds (a script that
        # reads the statistics when its engine exits finds them)
        deadline = time.monotonic() + 0.5
        while not read_status(seg_name)["proxy"].get("counters") and time.monotonic() < deadline:
            time.sleep(0.02)
        block = read_status(seg_name)["proxy"]
        assert block.get("counters", {}).get("engine_gone") == 1, block
        assert block["latency"]["rank0_round_us"]["count"] >= 30
        shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=10.0)
        try:  # the next engine: attached, drafts as usual
            usable: list[bool] = []
            SimEngine(SimConfig(seed=6, max_reqs=M, num_spec=N, window=W, row_bytes=B)).run(
                shim, rounds=100, on_round=lambda batch, reply: usable.append(bool(reply.ok_mask.any())) or batch.t >= 20)
            assert any(usable) and proxy.stats._counters.get("attaches") == 2
            time.sleep(2.5)  # idle for two looks at the engine, alive: not gone
            assert proxy.incarnations == 2 and proxy.stats._counters.get("engine_gone") == 1
        finally:
            shim.close()
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(10.0)
        proxy.stop()
        th.join(10.0)
    assert not th.is_alive()


@pytest.mark.parametrize("pidfd", [True, False])
def test_engine_alive_sees_an_exit_and_never_judges_a_pid_it_cannot_see(monkeypatch, pidfd):
    from dspark_proxy.engine_alive import EngineAlive

    if not pidfd:  # Linux before 5.3: the pid and its start time in /proc at every ask
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = EngineAlive(child.pid)
        assert (watch.fd >= 0) == pidfd and watch.alive()
        child.kill()
        child.wait(10.0)
        assert not watch.alive()
        watch.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10.0)
    gone = EngineAlive(child.pid)  # not there at attach (another PID namespace looks the same): never gone
    assert not gone.judged and gone.alive()
    me = EngineAlive(os.getpid())  # thread mode: the engine is this process
    assert me.alive()
    me.close()
