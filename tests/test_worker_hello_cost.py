"""What a HELLO may cost the worker: a peer's window buys no work outside the memory
budget and nothing slow under a lock another connection needs; a window past `--max-window`, or shapes
whose slots do not fit the budget, are refused naming the field and both values; and the budget counts
all a slot really holds (rows, CRC chain, the drafter's per-slot state), so a session's RSS stays within
a small factor of what it reserved."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib

import numpy as np
import pytest

import dspark_proxy.wire as wire
from dspark_proxy.worker import WorkerServer
from dspark_proxy.worker.testing import RawPeer, make_entries

pytestmark = pytest.mark.timeout(60)

N = 5
ND, NG = wire.RF_NEED_DRAFT, wire.RF_NEW_GEN


def integrity_ids(token: int, anchor_pos: int, rows: np.ndarray) -> list[int]:
    h = zlib.crc32(struct.pack("<iq", token, anchor_pos) + rows.tobytes())
    return [(h ^ ((j * 0x9E3779B1) & 0xFFFFFFFF)) & 0x7FFFFFFF for j in range(N)]


@pytest.fixture
def worker():
    made: list = []

    def _make(**kw) -> WorkerServer:
        srv = WorkerServer("127.0.0.1", 0, **{**dict(num_spec=N, window=16, row_bytes=256, max_reqs=8), **kw})
        srv.start()
        made.append(srv)
        return srv

    yield _make, made
    for obj in reversed(made):
        obj.close() if isinstance(obj, RawPeer) else obj.stop()


def _first_draft(peer: RawPeer, rows: np.ndarray, timeout_s: float = 30.0):
    e = make_entries([dict(slot=0, generation=1, first_pos=0, n_rows=rows.shape[0], anchor_token=7,
                           flags=NG | ND)])
    return peer.step(e, rows, 1, timeout_s=timeout_s)


def test_a_hostile_hellos_window_does_not_hold_up_another_proxys_first_step(worker):
    """The issue's reproduction: HELLO window=2^15, row_bytes=1, max_reqs=1 (32 KiB of windows) made the
    worker build 32,769 CRC tables in Python under the lock every connection takes before its first
    STEP: a well-behaved proxy's first STEP waited ~7-12 s. Now it is answered well within a second, and
    the hostile peer's own drafts are right (the windows' CRC shifts assembled from ~2 sqrt(W) tables)."""
    make, made = worker
    srv = make()
    hw = 1 << 15
    hostile = RawPeer(srv.port, wire.WireLayout(N, hw, 1, 1), session=2)
    made.append(hostile)
    got: list = []
    t = threading.Thread(target=lambda: got.append(hostile.handshake()), daemon=True)
    t.start()
    time.sleep(0.05)  # its HELLO first
    honest = RawPeer(srv.port, wire.WireLayout(N, 32, 128, 8))
    made.append(honest)
    t0 = time.monotonic()
    assert isinstance(honest.handshake(), wire.Welcome)
    rows = np.arange(4 * 128, dtype=np.uint32).astype(np.uint8).reshape(4, 128)
    reply = _first_draft(honest, rows)
    took = time.monotonic() - t0
    assert isinstance(reply, wire.StepReply), reply
    assert took < 1.0, f"the honest proxy's first STEP was answered after {took:.2f} s"
    assert reply.draft_ids[0].tolist() == integrity_ids(7, 4, rows)
    t.join(30)
    assert got and isinstance(got[0], wire.Welcome), got  # 2^15 is within --max-window: served
    hrows = np.arange(1000, dtype=np.uint32).astype(np.uint8).reshape(1000, 1)
    e = make_entries([dict(slot=0, generation=1, first_pos=0, n_rows=1000, anchor_token=3, flags=NG | ND)])
    r = hostile.step(e, hrows, 1)
    assert isinstance(r, wire.StepReply) and r.draft_ids[0].tolist() == integrity_ids(3, 1000, hrows)


@pytest.mark.parametrize("window", [65537, 1 << 20])
def test_a_window_past_max_window_is_refused_naming_window(worker, window):
    """Up to the protocol's 2^20: refused at once (ERROR mismatch naming `window` and both values, then
    the close), not served after minutes of table building."""
    make, made = worker
    srv = make()
    peer = RawPeer(srv.port, wire.WireLayout(N, window, 1, 1))
    made.append(peer)
    t0 = time.monotonic()
    msg = peer.handshake()
    assert time.monotonic() - t0 < 1.0
    assert isinstance(msg, wire.ErrorMsg) and msg.code == "mismatch" and msg.field == "window", msg
    assert f"client {window}" in msg.message and "at most 65536" in msg.message and "--max-window" in msg.message
    with pytest.raises(ConnectionError):  # then the close
        peer.recv(2.0)
    small = make(max_window=64)
    p2 = RawPeer(small.port, wire.WireLayout(N, 65, 1, 1))
    made.append(p2)
    msg = p2.handshake()
    assert isinstance(msg, wire.ErrorMsg) and msg.field == "window" and "client 65, worker serves at most 64" in \
        msg.message, msg


def test_shapes_whose_slots_do_not_fit_the_budget_are_refused(worker):
    """The budget charges what a slot holds, not only its rows: 64 slots of 4096 one-byte rows are 256 KiB
    of rows but 1.4 MiB with their CRC chains, past a 1 MiB budget (served before: the chains were not
    counted). A window whose single slot is past the budget is refused naming `window`."""
    from dspark_proxy.worker.session import slot_bytes

    make, made = worker
    srv = make(window=4, row_bytes=8, max_reqs=2, memory_budget_bytes=1 << 20)
    peer = RawPeer(srv.port, wire.WireLayout(N, 4096, 1, 64))
    made.append(peer)
    msg = peer.handshake()
    assert isinstance(msg, wire.ErrorMsg) and msg.code == "mismatch" and msg.field == "max_reqs", msg
    assert f"= {64 * slot_bytes(4096, 1, chains=True)} bytes" in msg.message and str(1 << 20) in msg.message
    p2 = RawPeer(srv.port, wire.WireLayout(N, 65536, 32, 1))
    made.append(p2)
    msg = p2.handshake()
    assert isinstance(msg, wire.ErrorMsg) and msg.field == "window", msg
    assert "client 65536" in msg.message and f"budget {1 << 20} bytes" in msg.message
    ok = RawPeer(srv.port, wire.WireLayout(N, 4096, 1, 8))  # 8 such slots fit
    made.append(ok)
    assert isinstance(ok.handshake(), wire.Welcome)
    assert srv.sessions.reserved_bytes == 8 * slot_bytes(4096, 1, chains=True)


_RSS_SCRIPT = textwrap.dedent("""
    import gc, sys
    import numpy as np
    from dspark_proxy.worker.session import SessionTable
    from dspark_proxy.wire import RF_NEW_GEN
    W, L, M = 1 << 15, 1, 64
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096
    rows = np.random.default_rng(0).integers(0, 256, (W, L), dtype=np.uint8)
    table = SessionTable(W, L, M, 4, chains=True)
    gc.collect()
    before = rss()
    s = table.get(1, 0, M)
    for slot in range(M):
        s.apply(slot, 1, 0, W, RF_NEW_GEN, rows)
    gc.collect()
    print(rss() - before, table.reserved_bytes)
""")


def test_a_sessions_real_memory_stays_within_what_the_budget_reserved():
    """64 integrity slots of 2^15 one-byte rows, each filled: the process grows by about what the table
    reserved for the session (it held 40x that when each slot's CRC chain was a list of Python ints)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT], capture_output=True, text=True, timeout=50, env=env)
    assert out.returncode == 0, out.stderr
    grew, reserved = map(int, out.stdout.split())
    assert reserved > 0 and grew <= 2 * reserved + (2 << 20), f"RSS grew {grew} bytes, {reserved} reserved"


def test_every_drafter_is_charged_what_it_keeps_per_slot():
    """A drafter declares what a slot holds for it, rows included (`slot_bytes`): the torch drafter's
    projections are charged beside the rows, at HELLO and for each session, and a drafter that keeps
    keys and values per slot is charged the same way."""
    from dspark_proxy.worker.session import SessionTable, slot_bytes

    kv = SessionTable(8, 16, 4, 4, chains=False, drafter_slot_bytes=lambda w, rb: w * (rb + 2 * 64 * 4))
    assert kv.session_bytes(4) == 4 * slot_bytes(8, 16, chains=False, drafter_bytes=8 * (16 + 2 * 64 * 4))
    assert kv.session_bytes(4) > 4 * 8 * 16 + 4 * 2 * 8 * 64 * 4
    pytest.importorskip("torch")
    srv = WorkerServer("127.0.0.1", 0, num_spec=2, window=4, row_bytes=8, max_reqs=2, drafter="torch")
    srv.start()
    try:
        width = srv.drafter.runner.cache_width
        assert srv.sessions.session_bytes(2) == 2 * slot_bytes(4, 8, chains=False, drafter_bytes=4 * (8 + width * 4))
        peer = RawPeer(srv.port, wire.WireLayout(2, 4, 8, 2))
        try:
            assert isinstance(peer.handshake(), wire.Welcome)
            assert srv.sessions.reserved_bytes == srv.sessions.session_bytes(2)
        finally:
            peer.close()
    finally:
        srv.stop()


def test_a_slow_layout_is_made_outside_the_lock_other_connections_take(worker, monkeypatch):
    """Whatever a new layout's drafter and tables cost, they are made outside the lock every connection
    takes before its first STEP: a layout whose tables take 3 s does not delay another layout's STEP."""
    import dspark_proxy.worker.server as server_mod

    real = server_mod.WindowShifts

    def slow(row_bytes: int, window: int):
        if window == 999:
            time.sleep(3.0)
        return real(row_bytes, window)

    monkeypatch.setattr(server_mod, "WindowShifts", slow)
    make, made = worker
    srv = make()
    slow_peer = RawPeer(srv.port, wire.WireLayout(N, 999, 4, 1), session=2)
    made.append(slow_peer)
    assert isinstance(slow_peer.handshake(), wire.Welcome)  # its connection now makes its tables
    time.sleep(0.1)
    honest = RawPeer(srv.port, wire.WireLayout(N, 32, 128, 8))
    made.append(honest)
    t0 = time.monotonic()
    assert isinstance(honest.handshake(), wire.Welcome)
    rows = np.full((4, 128), 9, np.uint8)
    reply = _first_draft(honest, rows)
    took = time.monotonic() - t0
    assert isinstance(reply, wire.StepReply) and reply.draft_ids[0].tolist() == integrity_ids(7, 4, rows)
    assert took < 1.0, f"the other layout's first STEP was answered after {took:.2f} s"
