"""The shim's C watcher runs off the engine's CPUs when the engine is pinned (engine_shim/placement.py):
the CPU list, the default, and a real shim whose engine thread is pinned to one CPU."""

from __future__ import annotations

import os
import time

import pytest

from dspark_proxy.ops.launch import spawn_proxy
from dspark_proxy.ops.status import read_status
from dspark_proxy.shm.hostflag import HostFlags
from dspark_proxy.shm.layout import LayoutParams
from dspark_proxy.shm.segment import Segment
from dspark_proxy.sim import SimConfig, SimEngine
from engine_shim import Shim, placement
from engine_shim.attach import AttachState
from engine_shim.placement import ENV_WATCHER_CPUS, parse_cpus, watcher_cpus

pytestmark = pytest.mark.timeout(60)

two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin apart")


def test_cpu_lists():
    assert parse_cpus("3") == {3} and parse_cpus("1, 2") == {1, 2} and parse_cpus("0-2,5") == {0, 1, 2, 5}
    for bad in ("", "x", "3-1", "-1", "1,,2"):
        with pytest.raises(ValueError):
            parse_cpus(bad)


def test_the_default_is_the_machines_cpus_the_engine_may_not_use(monkeypatch):
    monkeypatch.delenv(ENV_WATCHER_CPUS, raising=False)
    monkeypatch.setattr(placement.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(placement.os, "sched_getaffinity", lambda _pid: {0, 1, 2})
    assert watcher_cpus() == {3}  # vLLM pinned to 0-2: the proxy's side
    monkeypatch.setattr(placement.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    assert watcher_cpus() is None  # unpinned: the engine thread's own
    monkeypatch.setenv(ENV_WATCHER_CPUS, "1-2")
    assert watcher_cpus() == {1, 2}
    monkeypatch.setenv(ENV_WATCHER_CPUS, "inherit")
    assert watcher_cpus() is None
    monkeypatch.setenv(ENV_WATCHER_CPUS, "two")
    assert watcher_cpus() is None  # logged, and the engine's CPUs: a bad value never stops the engine


def _tasks() -> set[int]:
    return {int(x) for x in os.listdir("/proc/self/task")}


@two_cpus
def test_the_watcher_starts_on_its_cpus_and_its_creator_never_moves(seg_name, monkeypatch):
    """Watcher.start(cpus) sets the new thread's CPUs as it is made; the calling thread's own are never
    touched (no sched_setaffinity from Python at all); CPUs the process may not use: the creator's."""
    mine = os.sched_getaffinity(0)
    other = {max(mine)}
    seg = Segment.create(seg_name, LayoutParams(max_reqs=4, num_spec=3, window=8, row_bytes=64, max_rows=32,
                                                resync_per_round=2), deadline_ms=50.0)
    calls: list[tuple] = []
    real = os.sched_setaffinity
    monkeypatch.setattr(os, "sched_setaffinity", lambda *a: (calls.append(a), real(*a))[1])
    try:
        for cpus, want in ((other, other), (None, mine), ({100000}, mine)):
            before = _tasks()
            w = HostFlags(seg).watcher(0, 10**9, cpus)
            try:
                new = _tasks() - before
                assert len(new) == 1, new
                assert os.sched_getaffinity(new.pop()) == want, cpus
                assert os.sched_getaffinity(0) == mine
            finally:
                w.stop()
        assert calls == []
    finally:
        seg.unlink()
        seg.close()


@two_cpus
def test_a_pinned_engines_watcher_runs_on_the_other_cpus(seg_name, monkeypatch):
    """The engine thread pinned to one CPU (as vLLM pins its worker, as the demo pins vLLM): the watcher
    it starts at attach lands on the rest of the machine, and the engine thread stays where it was."""
    monkeypatch.delenv(ENV_WATCHER_CPUS, raising=False)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) != (os.cpu_count() or 0):
        pytest.skip("this process may not use every CPU of the machine")
    engine_cpu, rest = {cpus[0]}, set(cpus[1:])
    layout = ["--max-reqs", "4", "--num-spec", "3", "--window", "8", "--row-bytes", "64"]
    proxy = spawn_proxy(seg_name, "null", *layout, "--deadline-ms", "200", "--log-every", "0")
    before = os.sched_getaffinity(0)
    shim = None
    try:
        os.sched_setaffinity(0, engine_cpu)  # this thread only
        shim = Shim(seg_name, max_reqs=4, num_spec=3, window=8, row_bytes=64, look_every_s=0.01)
        end = time.monotonic() + 10
        while shim.state is not AttachState.PENDING and time.monotonic() < end:
            time.sleep(0.01)
        tasks = _tasks()
        moved: list[tuple] = []  # the engine thread must not move, even for an instant (placement.py)
        real = os.sched_setaffinity
        monkeypatch.setattr(os, "sched_setaffinity", lambda *a: (moved.append(a), real(*a))[1])
        SimEngine(SimConfig(seed=1, max_reqs=4, num_spec=3, window=8, row_bytes=64)).run(shim, rounds=5)
        monkeypatch.setattr(os, "sched_setaffinity", real)
        assert moved == []
        assert shim.state is AttachState.ATTACHED
        new = _tasks() - tasks
        assert new, "no watcher thread started at attach"
        assert all(os.sched_getaffinity(t) == rest for t in new), {t: os.sched_getaffinity(t) for t in new}
        assert os.sched_getaffinity(0) == engine_cpu
    finally:
        os.sched_setaffinity(0, before)
        if shim is not None:
            shim.close()
        proxy.stop()


def _spin_max_ns(name: str) -> int | None:
    return read_status(name)["proxy"].get("gauges", {}).get("spin_max_ns")


@two_cpus
def test_the_proxy_decides_again_whether_to_spin_when_the_engine_is_re_pinned(seg_name):
    """The proxy decides at attach whether its round's waits may spin, from the CPUs its threads and the
    engine's thread may use (hostflag.py `spin_useful`); an engine that re-pins its thread after it
    attached gets the decision taken again within a second of idle (proxy.py `_relook`), both ways.
    `status` shows it as the gauge spin_max_ns."""
    cpus = sorted(os.sched_getaffinity(0))
    shared, own = {cpus[0]}, {cpus[1]}
    before = os.sched_getaffinity(0)
    layout = ["--max-reqs", "4", "--num-spec", "3", "--window", "8", "--row-bytes", "64"]
    sim = SimEngine(SimConfig(seed=2, max_reqs=4, num_spec=3, window=8, row_bytes=64))
    proxy = shim = None

    def settled(want: int) -> int | None:
        time.sleep(1.3)  # idle past the proxy's once-a-second look
        sim.run(shim, rounds=2)  # rounds make its next snapshot due
        end = time.monotonic() + 10
        while _spin_max_ns(seg_name) != want and time.monotonic() < end:
            time.sleep(0.05)
        return _spin_max_ns(seg_name)

    try:
        os.sched_setaffinity(0, shared)  # the proxy starts from this thread: engine and proxy share a CPU
        proxy = spawn_proxy(seg_name, "null", *layout, "--deadline-ms", "500", "--log-every", "0")
        shim = Shim(seg_name, max_reqs=4, num_spec=3, window=8, row_bytes=64, look_every_s=0.01)
        end = time.monotonic() + 10
        while shim.state is not AttachState.ATTACHED and time.monotonic() < end:
            sim.run(shim, rounds=1)
        assert shim.state is AttachState.ATTACHED
        assert settled(0) == 0  # one CPU for both: no spin
        os.sched_setaffinity(0, own)  # the engine thread moves to a CPU of its own
        assert settled(100_000) == 100_000
        os.sched_setaffinity(0, shared)  # and back
        assert settled(0) == 0
    finally:
        os.sched_setaffinity(0, before)
        if shim is not None:
            shim.close()
        if proxy is not None:
            proxy.stop()
