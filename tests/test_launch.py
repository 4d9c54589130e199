"""launch.py starts the real CLI's processes for tests, chaos and the demo: it must work in a process that
already holds many descriptors (a long test run did: select() refuses any descriptor above 1023)."""

from __future__ import annotations

import os
import resource

import pytest

from dspark_proxy.launch import spawn_worker

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
