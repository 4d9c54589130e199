"""`--spin-us`: a receive that finds nothing retries before it sleeps in poll() (link/conn.py), so a
frame that comes meanwhile wakes no sleeping thread; bounded by the caller's deadline; off by default.
Through the real worker CLI: a worker that spins keeps a CPU busy between STEPs and stops spinning
after its window."""

from __future__ import annotations

import socket
import threading
import time

import pytest

import dspark_proxy.wire as wire
from dspark_proxy.bench.procs import cpu_s
from dspark_proxy.link.conn import FramedConnection
from dspark_proxy.ops.launch import spawn_worker
from tests.test_client import RB, M, N, Stepper, W, make_client

pytestmark = pytest.mark.timeout(60)


class _CountingPoll:
    """Stands in for a connection's poll object: counts the sleeps."""

    def __init__(self, real) -> None:
        self.real, self.calls = real, 0

    def poll(self, *a):
        self.calls += 1
        return self.real.poll(*a)


@pytest.fixture
def pair():
    """A loopback TCP pair: (the receiving FramedConnection, with its poll counted; the sending socket)."""
    ls = socket.create_server(("127.0.0.1", 0))
    tx = socket.create_connection(ls.getsockname())
    rx, _ = ls.accept()
    ls.close()
    conn = FramedConnection(rx, wire.Decoder({wire.MSG_PING: wire.MAX_CONTROL_PAYLOAD}, max_frame_bytes=1 << 16))
    conn._poll_in = _CountingPoll(conn._poll_in)
    try:
        yield conn, tx
    finally:
        conn.close()
        tx.close()


def _send_later(tx: socket.socket, after_s: float) -> threading.Thread:
    frame = wire.encode_control(wire.Ping())
    t = threading.Thread(target=lambda: (time.sleep(after_s), tx.sendall(frame)), daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("deadline", [True, False], ids=["timed", "untimed"])
def test_a_frame_that_comes_while_spinning_wakes_no_sleeper(pair, deadline):
    conn, tx = pair
    conn.spin_s = 2.0
    t = _send_later(tx, 0.05)
    f = conn.recv_frame(time.monotonic() + 5.0 if deadline else None)
    t.join()
    assert f is not None and f.header.type == wire.MSG_PING
    assert conn._poll_in.calls == 0  # it never slept


@pytest.mark.parametrize("deadline", [True, False], ids=["timed", "untimed"])
def test_off_by_default_a_receive_sleeps(pair, deadline):
    conn, tx = pair
    assert conn.spin_s == 0.0
    t = _send_later(tx, 0.05)
    f = conn.recv_frame(time.monotonic() + 5.0 if deadline else None)
    t.join()
    assert f is not None and conn._poll_in.calls >= 1


def test_the_spin_ends_at_the_deadline(pair):
    conn, _ = pair
    conn.spin_s = 30.0
    t0 = time.monotonic()
    assert conn.recv_frame(t0 + 0.1) is None
    assert time.monotonic() - t0 < 2.0  # the deadline, not the 30 s spin
    assert conn.recv_frame(0.0) is None  # a deadline already past (a pool's collect): no spin at all


def test_after_its_spin_a_receive_sleeps(pair):
    conn, tx = pair
    conn.spin_s = 0.02
    t = _send_later(tx, 0.3)
    f = conn.recv_frame(None)
    t.join()
    assert f is not None and conn._poll_in.calls == 1  # spun 20 ms, then slept until the frame


def _stepping(c) -> Stepper:
    """A Stepper on `c` once it is connected, its first STEP (the whole window) answered."""
    end = time.monotonic() + 20.0
    while c.connection_epoch() is None and time.monotonic() < end:
        time.sleep(0.01)
    s = Stepper(c)
    s.check(*s.step(new_gen=True))
    return s


def test_worker_spins_between_steps_through_its_cli():
    """`worker --spin-us`: after each reply its connection's thread spins (a CPU busy), and stops once
    the window passes without a STEP; the client's own `spin_us` the same while it waits for replies.
    CPU shares are loose: a machine busy with other work gives the spinner less."""
    w = spawn_worker("--max-reqs", str(M), "--num-spec", str(N), "--window", str(W), "--row-bytes", str(RB),
                     "--spin-us", "300000", timeout_s=30.0)
    c = make_client(int(w.address.rsplit(":", 1)[1]), spin_us=300_000)
    try:
        s = _stepping(c)
        cpu0, t0 = cpu_s(w.pid), time.monotonic()
        while time.monotonic() - t0 < 1.0:  # a STEP every 100 ms: the worker spins between them
            s.check(*s.step())
            time.sleep(0.1)
        busy = (cpu_s(w.pid) - cpu0) / (time.monotonic() - t0)
        time.sleep(0.5)  # past the 0.3 s window
        cpu1, t1 = cpu_s(w.pid), time.monotonic()
        time.sleep(1.0)
        idle = (cpu_s(w.pid) - cpu1) / (time.monotonic() - t1)
    finally:
        c.stop()
        w.stop()
    assert busy > 0.3, busy
    assert idle < 0.1, idle


@pytest.mark.parametrize("spin_us", [0.0, 1e6])
def test_the_client_spins_while_its_reply_is_on_the_way(spin_us):
    """The proxy's `--spin-us` (TcpDraftClient): a reply 100 ms late is waited for on a busy CPU with
    it, asleep without it."""
    from dspark_proxy.worker import FaultPlan
    from tests.test_client import make_server

    srv = make_server(faults=FaultPlan(delay_ms=100.0))
    c = make_client(srv.port, spin_us=spin_us)
    try:
        s = _stepping(c)
        t0, wall0 = time.thread_time(), time.monotonic()
        s.check(*s.step())
        cpu, wall = time.thread_time() - t0, time.monotonic() - wall0
    finally:
        c.stop()
        srv.stop()
    assert wall >= 0.09
    if spin_us:
        assert cpu > 0.3 * wall, (cpu, wall)  # a machine busy with other work gives the spinner less
    else:
        assert cpu < 0.03, cpu
