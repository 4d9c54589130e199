"""`dspark-proxy worker` as a process: the ready line, serving, SIGTERM stops it cleanly, the crash
fault exits with its code, and a non-loopback address without a token is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

import dspark_proxy.wire as wire
from dspark_proxy.commands.worker import worker
from dspark_proxy.link.client import TcpDraftClient
from dspark_proxy.worker import CRASH_EXIT_CODE

pytestmark = pytest.mark.timeout(60)

ARGS = ["--num-spec", "3", "--window", "4", "--row-bytes", "8", "--max-reqs", "4"]


def _spawn(*extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "dspark_proxy.commands.worker", "--listen", "127.0.0.1:0",
                          *ARGS, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    assert line.startswith("worker listening on 127.0.0.1:"), (line, p.stderr.read() if p.poll() else "")
    return p, int(line.rsplit(":", 1)[1])


def _steps(port: int, k: int) -> list:
    c = TcpDraftClient("127.0.0.1", port, max_reqs=4, num_spec=3, window=4, row_bytes=8, backoff_s=(0.01, 0.05))
    c.start()
    outs = []
    try:
        assert c.wait_ready(10) == 1
        prefix = bytearray(wire.step_prefix_bytes(4, False))
        e = wire.entries_view(prefix, 1)
        for i in range(k):
            e[0] = (0, 1, 1, i, i + 1, 1, wire.RF_NEED_DRAFT | (wire.RF_NEW_GEN if i == 0 else 0), 0, 0, 0)
            outs.append(c.step(prefix, e, 1, step_id=i + 1, step_flags=0, epoch=1, rows=[np.zeros(8, np.uint8)],
                               timeout_s=5.0))
    finally:
        c.stop()
    return outs


def test_serves_and_stops_on_sigterm():
    p, port = _spawn()
    try:
        outs = _steps(port, 3)
        assert all(o.ok for o in outs)
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()


def test_crash_fault_exits():
    p, port = _spawn("--fault-crash-after", "2")
    try:
        outs = _steps(port, 3)
        assert [o.ok for o in outs] == [True, True, False]
        assert p.wait(10) == CRASH_EXIT_CODE
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()


def test_non_loopback_without_token_is_refused():
    r = CliRunner().invoke(worker, ["--listen", "0.0.0.0:0", *ARGS])
    assert r.exit_code != 0 and "token" in r.output.lower()


def test_ready_line_via_click(monkeypatch):
    """The click command prints the ready line once bound (serve loop stubbed out)."""
    from dspark_proxy.worker import WorkerServer

    monkeypatch.setattr(WorkerServer, "serve_forever", lambda self: None)
    t0 = time.monotonic()
    r = CliRunner().invoke(worker, ["--listen", "127.0.0.1:0", *ARGS])
    assert r.exit_code == 0, r.output
    assert "worker listening on 127.0.0.1:" in r.output and time.monotonic() - t0 < 10
