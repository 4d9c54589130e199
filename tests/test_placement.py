"""The shim's C watcher runs off the engine's CPUs when the engine is pinned (engine_shim/placement.py):
the CPU list, the default, and a real shim whose engine thread is pinned to one CPU."""

from __future__ import annotations

import os
import threading
import time

import pytest

from dspark_proxy.launch import spawn_proxy
from dspark_proxy.sim import SimConfig, SimEngine
from engine_shim import Shim, placement
from engine_shim.attach import AttachState
from engine_shim.placement import ENV_WATCHER_CPUS, parse_cpus, run_on, watcher_cpus

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


def _affinity_of_new_thread(cpus: set[int] | None) -> tuple[set[int], set[int]]:
    got: list[set[int]] = []
    t = threading.Thread(target=lambda: got.append(os.sched_getaffinity(0)))
    run_on(cpus, t.start)  # a thread is made at start()
    t.join()
    return got[0], os.sched_getaffinity(0)


@two_cpus
def test_run_on_starts_threads_there_and_gives_the_caller_its_cpus_back():
    mine = os.sched_getaffinity(0)
    other = {max(mine)}
    assert _affinity_of_new_thread(other) == (other, mine)
    assert _affinity_of_new_thread(None) == (mine, mine)
    assert _affinity_of_new_thread({100000}) == (mine, mine)  # no such CPU: as is


def _tasks() -> set[int]:
    return {int(x) for x in os.listdir("/proc/self/task")}


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
        SimEngine(SimConfig(seed=1, max_reqs=4, num_spec=3, window=8, row_bytes=64)).run(shim, rounds=5)
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
