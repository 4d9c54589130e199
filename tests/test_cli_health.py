"""`status` and `stop` as health checks, through the real CLI (docs/exit-codes.md): a dead, hung or
refused proxy exits non-zero with one line saying which, and `stop` of a dead proxy removes its segment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dspark_proxy.ops.exitcodes import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_PROXY_DEAD,
    EXIT_PROXY_HUNG,
    EXIT_PROXY_REFUSED,
)
from dspark_proxy.ops.launch import spawn_proxy, spawn_worker
from dspark_proxy.ops.status import HUNG_AFTER_S

pytestmark = pytest.mark.timeout(90)

M, N, W, B = 8, 4, 8, 64
LAYOUT = ["--max-reqs", str(M), "--num-spec", str(N), "--window", str(W), "--row-bytes", str(B)]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dspark_proxy.cli", *args], capture_output=True, text=True,
                          timeout=60)


def _err_line(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


@pytest.fixture
def worker():
    w = spawn_worker(*LAYOUT)
    yield w
    w.stop()


def test_killed_proxy_is_dead_to_status_and_stop_removes_its_segment(seg_name, worker):
    proxy = spawn_proxy(seg_name, worker.address, *LAYOUT, "--log-every", "0")
    try:
        ok = _cli("status", "--name", seg_name, "--json")
        assert ok.returncode == EXIT_OK, ok.stderr
        assert json.loads(ok.stdout)["health"] == {"state": "ok", "why": ""}
        proxy.kill()  # SIGKILL: no clean-up of its own
        seg = f"/dev/shm/dspark-proxy.{seg_name}"
        assert os.path.exists(seg)
        st = _cli("status", "--name", seg_name)
        assert st.returncode == EXIT_PROXY_DEAD, (st.returncode, st.stderr)
        assert "(DEAD)" in st.stdout and "health   DEAD" in st.stdout
        assert f"{seg_name}: dead: proxy pid {proxy.pid} is not running" in _err_line(st)
        js = _cli("status", "--name", seg_name, "--json")
        assert js.returncode == EXIT_PROXY_DEAD and json.loads(js.stdout)["health"]["state"] == "dead"
        out = _cli("stop", "--name", seg_name)
        assert out.returncode == EXIT_PROXY_DEAD, (out.returncode, out.stderr)
        line = _err_line(out)
        assert f"proxy pid {proxy.pid} was not running" in line and f"removed its segment {seg}" in line
        assert not os.path.exists(seg)
        # nothing left: both commands say there is no such segment
        assert _cli("stop", "--name", seg_name).returncode == EXIT_FAILURE
        assert _cli("status", "--name", seg_name).returncode == EXIT_FAILURE
    finally:
        proxy.stop()


def test_stopped_proxy_is_hung_to_status_and_stop(seg_name, worker):
    proxy = spawn_proxy(seg_name, worker.address, *LAYOUT, "--log-every", "0")
    try:
        proxy.signal(signal.SIGSTOP)  # alive, but its heartbeat stops
        time.sleep(HUNG_AFTER_S + 0.5)
        st = _cli("status", "--name", seg_name)
        assert st.returncode == EXIT_PROXY_HUNG, (st.returncode, st.stderr)
        assert f"{seg_name}: hung: heartbeat" in _err_line(st) and "(alive)" in st.stdout
        out = _cli("stop", "--name", seg_name, "--timeout", "0.3")
        assert out.returncode == EXIT_PROXY_HUNG, (out.returncode, out.stderr)
        assert f"pid {proxy.pid} still running after 0.3 s" in _err_line(out)
        proxy.signal(signal.SIGCONT)  # the SIGTERM it got now ends it cleanly
        assert proxy.proc.wait(10) == 0
        assert not os.path.exists(f"/dev/shm/dspark-proxy.{seg_name}")
    finally:
        proxy.stop()


def test_proxy_every_worker_refused_is_refused_to_status(seg_name):
    # a worker keeping its own window (--no-adopt-shapes) refuses a proxy with another window
    w = spawn_worker(*LAYOUT, "--no-adopt-shapes")
    other = LAYOUT[:5] + [str(2 * W)] + LAYOUT[6:]
    proxy = spawn_proxy(seg_name, w.address, *other, "--log-every", "0")
    try:
        end = time.monotonic() + 20
        while True:
            st = _cli("status", "--name", seg_name)
            if st.returncode != EXIT_OK or time.monotonic() > end:
                break
            time.sleep(0.2)
        assert st.returncode == EXIT_PROXY_REFUSED, (st.returncode, st.stderr, st.stdout)
        line = _err_line(st)
        assert f"{seg_name}: refused: every worker refused it: {w.address}" in line and "window" in line, line
        assert _cli("stop", "--name", seg_name).returncode == EXIT_OK
    finally:
        proxy.stop()
        w.stop()


def test_exit_code_page_is_the_table_in_exitcodes():
    """docs/exit-codes.md lists every EXIT_* of exitcodes.py with its value, and nothing else."""
    import re
    from pathlib import Path

    from dspark_proxy.ops import exitcodes

    page = (Path(__file__).resolve().parents[1] / "docs" / "exit-codes.md").read_text()
    rows = {name: int(code) for code, name in re.findall(r"^\| (\d+) \| `(EXIT_\w+)` \|", page, re.M)}
    assert rows == {n: getattr(exitcodes, n) for n in exitcodes.__all__}, rows
