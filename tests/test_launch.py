"""launch.py starts the real CLI's processes for tests, chaos and the demo: it must work in a process that
already holds many descriptors (a long test run did: select() refuses any descriptor above 1023)."""

from __future__ import annotations

import os
import resource

import pytest

from dspark_proxy.ops.launch import spawn_worker

pytestmark = pytest.mark.timeout(60)


def test_a_worker_starts_from_a_process_holding_over_1024_descriptors():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1300:
        pytest.skip(f"RLIMIT_NOFILE {soft}: cannot hold 1,200 descriptors")
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1200)]
    w = None
    try:
        w = spawn_worker("--max-reqs", "4", "--num-spec", "2", "--window", "4", "--row-bytes", "16")
        assert w.address and w.proc.stdout is not None and w.proc.stdout.fileno() > 1023
    finally:
        if w is not None:
            w.stop()
        for fd in held:
            os.close(fd)


def test_a_worker_whose_start_fails_is_not_left_running(monkeypatch):
    """Whatever interrupts the wait for its address (here the wait itself raising), the child is stopped:
    a failed start left a worker process behind."""
    import subprocess

    import dspark_proxy.ops.launch as launch

    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def popen(*a, **k):
        p = real_popen(*a, **k)
        started.append(p)
        return p

    def broken(f, timeout_s):
        raise ValueError("the wait broke")

    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    monkeypatch.setattr(launch, "readable", broken)
    with pytest.raises(ValueError, match="the wait broke"):
        launch.spawn_worker("--max-reqs", "4", "--num-spec", "2", "--window", "4", "--row-bytes", "16")
    (p,) = started
    assert p.poll() is not None, "the worker outlived its failed start"
