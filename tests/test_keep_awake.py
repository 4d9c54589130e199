"""`start --keep-awake-ms`: SCHED_IDLE spinners on the proxy's CPUs after each round (keep_awake.py,
_keepawake.c). They must spin while rounds come, at SCHED_IDLE only, and stop within the window after
the last round, so the idle cost (docs/performance.md, "Idle, state by state") is what it is without them; off by default."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import engine_shim
from dspark_proxy.bench.procs import cpu_s
from dspark_proxy.ops import launch
from dspark_proxy.ops.launch import spawn_proxy
from dspark_proxy.ops.status import read_status
from tests.rig import decode_batch
from tests.test_idle_cpu import LAYOUT, SHAPE

pytestmark = pytest.mark.timeout(120)

SCHED_IDLE = 5


def _policies(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            st = f.read()
        out.append(int(st[st.rindex(")") + 2:].split()[38]))  # field 41: policy
    return out


def _assert_no_cpu_after_rounds(pid: int) -> None:
    """Under 5 ms of CPU in a second (the idle budget, docs/performance.md, "Idle, state by state"), in one of up to three seconds: a
    spinner left running spends the whole second in every one, while an idle proxy's snapshot or a
    loaded machine's costlier wakes can push one second past it (test_idle_cpu allows three windows
    for the same reason)."""
    used = []
    for _ in range(3):
        c0 = cpu_s(pid)
        time.sleep(1.0)
        used.append(cpu_s(pid) - c0)
        if used[-1] < 0.005:
            return
    pytest.fail(f"the proxy kept spending CPU after its rounds stopped: {used} s in each second")


def _keep_awake(name: str) -> dict:
    time.sleep(0.35)  # the proxy's next statistics snapshot (every 0.25 s)
    return read_status(name)["proxy"]["gauges"]["keep_awake"]


def test_spinners_spin_while_rounds_come_at_sched_idle_and_stop_after(seg_name):
    proxy = spawn_proxy(seg_name, "null", *LAYOUT, "--deadline-ms", "500", "--keep-awake-ms", "50",
                        "--log-every", "0")
    shim = None
    try:
        ka = _keep_awake(seg_name)
        assert ka["spinners"] == min(len(os.sched_getaffinity(proxy.pid)), 8) and ka["spins"] == 0
        assert ka["refused"] == 0
        assert _policies(proxy.pid).count(SCHED_IDLE) == ka["spinners"]  # they, and only they
        shim = engine_shim.attach(seg_name, **SHAPE, timeout_s=10.0)
        t, end = 0, time.monotonic() + 20.0
        while time.monotonic() < end:  # SCHED_IDLE gets a CPU only when nothing else wants it: on a
            for _ in range(40):  # loaded machine its first spin may take a while
                t += 1
                shim.enqueue(t, **decode_batch(t, SHAPE["row_bytes"]))
                assert shim.read_reply(t).status == 0
                time.sleep(0.002)  # a forward: rounds keep coming within the window
            if _keep_awake(seg_name)["spins"] >= 1:
                break
        ka = _keep_awake(seg_name)
        assert ka["spins"] >= 1, ka
        end = time.monotonic() + 10.0
        while ka["sleeping"] < ka["spinners"] and time.monotonic() < end:
            ka = _keep_awake(seg_name)
        assert ka["sleeping"] == ka["spinners"], ka  # the window after the last round ran out: all asleep
        _assert_no_cpu_after_rounds(proxy.pid)
    finally:
        if shim is not None:
            shim.close()
        proxy.stop()


def _gauges(name: str) -> dict:
    time.sleep(0.3)  # the proxy's next statistics snapshot (every 0.25 s)
    return read_status(name)["proxy"]["gauges"]


def test_no_spinning_while_the_gate_pauses_the_batch(seg_name):
    """While the acceptance gate pauses the whole batch the engine answers its rounds itself, so nothing
    waits on the proxy's next round, and a spinning CPU can slow the engine's own (on this VM a spinning
    vCPU slowed the other's work by 15%: docs/performance.md): the spinners are not kicked then, and
    they sleep while the paused rounds keep coming. Every round verifies drafts and accepts none, so the
    batch pauses after --accept-patience rounds (for good: the pause is longer than the test)."""
    proxy = spawn_proxy(seg_name, "null", *LAYOUT, "--deadline-ms", "500", "--keep-awake-ms", "30",
                        "--accept-patience", "4", "--accept-pause", "1000000", "--accept-pause-max", "1000000",
                        "--log-every", "0")
    shim = None
    t = 0

    def rounds(seconds: float) -> None:
        nonlocal t
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t += 1
            batch = decode_batch(t, SHAPE["row_bytes"])
            batch["k_window"][:] = 2  # two drafts verified, none accepted (valid 1: the bonus token only)
            shim.enqueue(t, **batch)
            assert shim.read_reply(t).status == 0
            time.sleep(0.002)  # a forward

    try:
        shim = engine_shim.attach(seg_name, **SHAPE, timeout_s=10.0)
        end = time.monotonic() + 20.0
        while _gauges(seg_name).get("accept_gate", {}).get("batch") != "paused" and time.monotonic() < end:
            rounds(0.2)
        assert _gauges(seg_name)["accept_gate"]["batch"] == "paused"
        rounds(0.2)  # the last kick's window (30 ms) runs out while paused rounds come
        ka = _gauges(seg_name)["keep_awake"]
        assert ka["spinners"] >= 1
        for _ in range(4):
            c0 = cpu_s(proxy.pid)
            rounds(0.5)
            used = cpu_s(proxy.pid) - c0
            ka = _gauges(seg_name)["keep_awake"]
            assert ka["sleeping"] == ka["spinners"], ka  # the rounds came, no spinner woke
            assert used < 0.25, f"the proxy spent {used:.2f} s of CPU in 0.5 s of paused rounds"
        assert _gauges(seg_name)["accept_gate"]["batch"] == "paused"
    finally:
        if shim is not None:
            shim.close()
        proxy.stop()


def test_off_by_default_no_spinner(seg_name):
    proxy = spawn_proxy(seg_name, "null", *LAYOUT, "--deadline-ms", "500", "--log-every", "0")
    try:
        assert _keep_awake(seg_name) == {"spinners": 0, "spins": 0, "sleeping": 0, "refused": 0}
        assert SCHED_IDLE not in _policies(proxy.pid)
    finally:
        proxy.stop()


def test_refused_sched_idle_spins_not_at_all(seg_name, monkeypatch):
    """Where SCHED_IDLE is refused (a container's seccomp profile), a spinner at normal priority would
    take CPU time from the proxy and the worker: it must not spin. The proxy runs under a seccomp
    filter that fails sched_setscheduler with EPERM (tests/no_sched_idle.py); its rounds still work,
    `status` counts the refusals, and the proxy spends no CPU after its rounds."""
    wrapper = str(Path(__file__).with_name("no_sched_idle.py"))
    probe = subprocess.run([sys.executable, wrapper, sys.executable, "-c", "pass"], timeout=30)
    if probe.returncode == 77:
        pytest.skip("no seccomp filter here (x86_64 only, and the kernel must allow one)")
    assert probe.returncode == 0
    cli = launch._cli
    monkeypatch.setattr(launch, "_cli", lambda *a: [sys.executable, wrapper, *cli(*a)])
    proxy = spawn_proxy(seg_name, "null", *LAYOUT, "--deadline-ms", "500", "--keep-awake-ms", "50",
                        "--log-every", "0")
    shim = None
    try:
        ka = _keep_awake(seg_name)
        n = min(len(os.sched_getaffinity(proxy.pid)), 8)
        assert ka == {"spinners": 0, "spins": 0, "sleeping": 0, "refused": n}, ka
        assert SCHED_IDLE not in _policies(proxy.pid)
        shim = engine_shim.attach(seg_name, **SHAPE, timeout_s=10.0)
        for t in range(1, 101):
            shim.enqueue(t, **decode_batch(t, SHAPE["row_bytes"]))
            assert shim.read_reply(t).status == 0
            time.sleep(0.002)
        assert _keep_awake(seg_name) == ka  # kicked 100 times: still nothing spins
        _assert_no_cpu_after_rounds(proxy.pid)
    finally:
        if shim is not None:
            shim.close()
        proxy.stop()


def test_worker_keeps_its_cpus_awake_after_each_reply():
    """`worker --keep-awake-ms`: the same spinners, kicked after each reply (the next STEP wakes a warm
    CPU, the gap between the proxy's round trip and the worker's own time: docs/performance.md); they
    sleep once STEPs stop, and stop with the worker. Off by default."""
    from tests.test_client import Stepper, make_client, make_server

    srv = make_server()
    assert srv._awake.snapshot() == {"spinners": 0, "spins": 0, "sleeping": 0, "refused": 0}  # off
    srv.stop()
    srv = make_server(keep_awake_ms=50.0)
    c = make_client(srv.port)
    try:
        ka = srv._awake.snapshot()
        assert ka["spinners"] == min(len(os.sched_getaffinity(0)), 8) and ka["spins"] == 0, ka
        end = time.monotonic() + 10.0
        while c.connection_epoch() is None and time.monotonic() < end:
            time.sleep(0.01)
        s = Stepper(c)
        s.check(*s.step(new_gen=True))
        end = time.monotonic() + 20.0
        while srv._awake.snapshot()["spins"] < 1 and time.monotonic() < end:  # SCHED_IDLE: the machine's
            for _ in range(20):  # spare CPU only
                s.check(*s.step())
                time.sleep(0.002)
        ka = srv._awake.snapshot()
        assert ka["spins"] >= 1, ka
        end = time.monotonic() + 10.0
        while ka["sleeping"] < ka["spinners"] and time.monotonic() < end:
            time.sleep(0.05)
            ka = srv._awake.snapshot()
        assert ka["sleeping"] == ka["spinners"], ka  # the window after the last reply ran out
        # STEPs that ask no drafts (the proxy's gate paused them: nobody waits on their replies) kick
        # nothing: the spinners stay asleep while they come
        for _ in range(3):
            end = time.monotonic() + 0.3
            while time.monotonic() < end:
                out, _ = s.step(ask=False)
                assert out.ok, out
                time.sleep(0.002)
            ka = srv._awake.snapshot()
            assert ka["sleeping"] == ka["spinners"], ka
    finally:
        c.stop()
        srv.stop()
    assert SCHED_IDLE not in _policies(os.getpid())  # the last owner's close stopped them
