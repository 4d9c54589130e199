"""The worker's memory is bounded per peer: slots by the agreed max_reqs, sessions by
connection, all windows by a memory budget, and no connection can evict, drop or step a session that
another open connection owns."""

from __future__ import annotations

import time

import numpy as np
import pytest

import dspark_proxy.wire as wire
from dspark_proxy.worker import WorkerServer
from dspark_proxy.worker.session import slot_bytes
from dspark_proxy.worker.testing import RawPeer, make_entries

pytestmark = pytest.mark.timeout(30)

N, W, RB, M = 3, 4, 1024, 4
LAYOUT = wire.WireLayout(num_spec=N, window=W, row_bytes=RB, max_reqs=M)
ND, NG = wire.RF_NEED_DRAFT, wire.RF_NEW_GEN
ONE_SESSION = M * slot_bytes(W, RB, chains=True)  # all one session of max_reqs M may hold (integrity: chains)


@pytest.fixture
def make():
    made: list = []

    def server(**kw) -> WorkerServer:
        srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=M, **kw)
        srv.start()
        made.append(srv)
        return srv

    def peer(srv: WorkerServer, session: int, layout: wire.WireLayout = LAYOUT) -> RawPeer:
        p = RawPeer(srv.port, layout, session=session)
        made.append(p)
        assert isinstance(p.handshake(), wire.Welcome)
        return p

    yield server, peer
    for obj in reversed(made):
        obj.close() if isinstance(obj, RawPeer) else obj.stop()


def step_new(p: RawPeer, slots, step_id: int, *, session: int | None = None, rows_each: int = 2):
    e = make_entries([dict(slot=s, first_pos=0, n_rows=rows_each, generation=1, flags=NG | ND) for s in slots])
    rows = np.full((rows_each * len(slots), RB), 7, np.uint8)
    return p.step(e, rows, step_id, session=session)


def test_slots_beyond_the_agreed_max_reqs_are_bad_entries(make):
    server, peer = make
    srv = server()
    p = peer(srv, 1)
    r = step_new(p, [0, 3, M, 399], 1)
    usable = wire.RS_PARTIAL_WINDOW
    assert r.status.tolist() == [usable, usable, wire.RS_BAD_ENTRY, wire.RS_BAD_ENTRY]
    assert srv.counters["bad_entry_slot"] == 2
    # the repro: one session asks for 400 slots; it holds at most max_reqs windows
    for k in range(100):
        step_new(p, [4 * k + j for j in range(4)], 2 + k)
    session = srv.sessions._sessions[1]
    assert len(session.slots) <= M and set(session.slots) <= set(range(M))
    # a peer that agreed a smaller max_reqs is held to its own
    small = peer(srv, 2, wire.WireLayout(num_spec=N, window=W, row_bytes=RB, max_reqs=2))
    r = step_new(small, [1, 2], 1)
    assert r.status.tolist() == [usable, wire.RS_BAD_ENTRY]


def test_sessions_per_connection_are_bounded(make):
    server, peer = make
    srv = server()
    p = peer(srv, 1)
    for sid in range(1, 5):
        assert isinstance(step_new(p, [0], sid, session=sid), wire.StepReply)
    refused = step_new(p, [0], 5, session=5)
    assert isinstance(refused, wire.ErrorMsg) and refused.code == "session_limit", refused
    assert "NEW_SESSION" in refused.message and srv.counters["session_refused_session_limit"] == 1
    p.send(wire.encode_control(wire.NewSession(previous=1, reason="test"), session=5))
    assert isinstance(step_new(p, [0], 6, session=5), wire.StepReply)  # its own session dropped: room again


def test_memory_budget_refuses_new_sessions_clearly(make):
    """Many proxies, one worker: each connection's shapes are charged at HELLO (refused past the budget,
    naming the bytes), its live session uses that charge, another session must fit its fair share (the
    budget over the proxies connected), and a proxy that goes away frees its windows."""
    server, peer = make
    srv = server(memory_budget_bytes=2 * ONE_SESSION)
    a, b = peer(srv, 1), peer(srv, 2)
    assert srv.sessions.reserved_bytes == 2 * ONE_SESSION  # charged at HELLO, before any STEP
    c = RawPeer(srv.port, LAYOUT, session=3)
    try:
        refused = c.handshake()
        assert isinstance(refused, wire.ErrorMsg) and refused.code == "memory_budget", refused
        assert refused.field == "max_reqs" and "--memory-budget-mb" in refused.message
        assert f"need {ONE_SESSION} bytes" in refused.message and srv.counters["handshake_memory_refused"] == 1
    finally:
        c.close()
    assert isinstance(step_new(a, [0, 1, 2, 3], 1), wire.StepReply)
    assert isinstance(step_new(b, [0], 1), wire.StepReply)
    assert srv.sessions.reserved_bytes == 2 * ONE_SESSION  # the sessions took the HELLO charges
    over = step_new(a, [0], 1, session=11)  # a second session: past a's fair share (one of two)
    assert isinstance(over, wire.ErrorMsg) and over.code == "memory_fair_share", over
    a.send(wire.encode_control(wire.NewSession(previous=1, reason="test"), session=12))
    assert isinstance(step_new(a, [0], 1, session=12), wire.StepReply)  # its charge holds the new one
    b.close()
    deadline = time.monotonic() + 5
    while (2 in srv.sessions or srv.sessions.reserved_bytes != ONE_SESSION) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.sessions.reserved_bytes == ONE_SESSION  # b's charge went with it
    c = peer(srv, 3)
    assert isinstance(step_new(c, [0], 2), wire.StepReply)  # b's windows are free again
    with pytest.raises(ValueError, match="below one session"):
        WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=M,
                     memory_budget_bytes=ONE_SESSION - 1)


def test_no_connection_can_evict_drop_or_step_another_open_connections_session(make):
    server, peer = make
    srv = server(max_sessions=4)
    victim = peer(srv, 111)
    r = step_new(victim, [0], 1)
    assert r.status.tolist() == [wire.RS_PARTIAL_WINDOW]
    rogue = peer(srv, 1000)
    outcomes = [step_new(rogue, [0], 1 + k, session=1000 + k) for k in range(6)]
    refused = [o for o in outcomes if isinstance(o, wire.ErrorMsg)]
    assert len(refused) == 3 and {o.code for o in refused} == {"session_limit"}, outcomes
    rogue.send(wire.encode_control(wire.NewSession(previous=111, reason="evil"), session=2000))
    took = step_new(rogue, [0], 10, session=111)
    assert isinstance(took, wire.ErrorMsg) and took.code == "session_owned", took
    # the victim's window is intact: a continuation row gives it 3 rows of its own
    e = make_entries([dict(slot=0, first_pos=2, n_rows=1, generation=1, flags=ND)])
    r = victim.step(e, np.full((1, RB), 9, np.uint8), 2)
    assert r.status.tolist() == [wire.RS_PARTIAL_WINDOW] and r.window_rows.tolist() == [3]
    assert srv.sessions.evicted == 0
