"""Unauthenticated sockets cannot take the worker's connection slots: handshakes
have their own small budget and a short timeout, an idle socket gives way to one that speaks, and an
authenticated proxy connects and reconnects through a flood of hundreds of idle sockets."""

from __future__ import annotations

import time

import pytest

from dspark_proxy.chaos.flood import IdleFlood
from dspark_proxy.worker import FaultPlan, WorkerServer
from tests.test_client import RB, M, N, Stepper, W, make_client

pytestmark = pytest.mark.timeout(60)

TOKEN = b"flood-test-token"


def test_an_authenticated_proxy_connects_and_reconnects_through_an_idle_socket_flood():
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=M, token=TOKEN,
                       faults=FaultPlan(drop_every=5))
    srv.start()
    flood = IdleFlood("127.0.0.1", srv.port, count=300, max_s=30.0)
    c = None
    try:
        flood.start()
        assert flood.wait_open(200, 5.0), (flood.opened, flood.open_now)
        time.sleep(0.2)  # the flood holds every slot it can before the proxy comes
        c = make_client(srv.port, token=TOKEN, backoff_s=(0.01, 0.2))
        t0 = time.monotonic()
        assert c.wait_ready(3.0) == 1, (dict(c.counters), dict(srv.counters))
        connect_s = time.monotonic() - t0
        s = Stepper(c)
        s.check(*s.step(new_gen=True))
        for epoch in (2, 3):  # the worker drops the connection every 5th step: the proxy reconnects
            deadline = time.monotonic() + 3.0
            while c.connection_epoch() != epoch and time.monotonic() < deadline:
                if c.connection_epoch() is not None:
                    s.step(new_gen=True, timeout_s=0.5)
                time.sleep(0.005)
            assert c.connection_epoch() == epoch, (dict(c.counters), dict(srv.counters))
            s.check(*s.step(new_gen=True))  # a fresh session on the new connection
        assert flood.open_now >= 100  # the flood was still on throughout
        assert srv.counters["handshakes_evicted"] > 0 and srv.counters["auth_refused"] == 0
        assert len(srv.admission.pending) <= srv.admission.max_handshakes
        print(f"connected after {connect_s * 1e3:.0f} ms; flood opened {flood.opened}, the worker closed "
              f"{flood.closed_by_peer}; evicted {srv.counters['handshakes_evicted']}")
    finally:
        flood.stop()
        if c is not None:
            c.stop()
        srv.stop()


def test_idle_handshakes_time_out_quickly():
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=M, handshake_timeout_s=0.2)
    srv.start()
    try:
        with IdleFlood("127.0.0.1", srv.port, count=5, max_s=5.0, per_tick=0) as flood:
            assert flood.wait_open(5, 2.0)
            deadline = time.monotonic() + 3.0
            # The worker counts a timeout before its close reaches the flood's thread, which sees it at
            # its next poll: wait for both, or the second is read a moment too early (CI, stop 24).
            while (srv.counters["handshake_timeout"] < 5 or flood.closed_by_peer < 5) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert srv.counters["handshake_timeout"] == 5 and flood.closed_by_peer == 5
    finally:
        srv.stop()
