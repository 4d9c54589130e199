"""Shapes agreed at HELLO (dspark_proxy/worker/terms.py, FORMAT.md "Handshake"): a worker adopts the
proxy's max_reqs, window, N and row_bytes where its drafter allows, and refuses only what the drafter
fixes, naming the field and both values. Drafts are checked against the integrity formula recomputed
here for the adopted shapes."""

from __future__ import annotations

import struct
import time
import zlib

import numpy as np
import pytest

import dspark_proxy.wire as wire
from dspark_proxy.link.client import TcpDraftClient
from dspark_proxy.worker import WorkerServer
from dspark_proxy.worker.testing import RawPeer, make_entries

pytestmark = pytest.mark.timeout(60)

# the worker's own settings: the WorkerConfig defaults (a worker started without the proxy's shapes)
WN, WW, WRB, WM = 5, 16, 256, 64


def integrity(token: int, anchor_pos: int, rows: np.ndarray, N: int, W: int) -> tuple[list[int], float]:
    h = zlib.crc32(struct.pack("<iq", token, anchor_pos) + rows.tobytes())
    return [(h ^ ((j * 0x9E3779B1) & 0xFFFFFFFF)) & 0x7FFFFFFF for j in range(N)], float(np.float32(rows.shape[0] / W))


@pytest.fixture
def worker():
    made: list[WorkerServer] = []

    def _make(**kw) -> WorkerServer:
        srv = WorkerServer("127.0.0.1", 0, **{**dict(num_spec=WN, window=WW, row_bytes=WRB, max_reqs=WM), **kw})
        srv.start()
        made.append(srv)
        return srv

    yield _make
    for s in made:
        s.stop()


def _serve_and_check(port: int, lay: wire.WireLayout, session: int, seed: int) -> None:
    """Handshake under `lay`, then a NEW_GEN entry and a continuation, drafts checked for `lay`."""
    peer = RawPeer(port, lay, session=session)
    try:
        w = peer.handshake()
        assert isinstance(w, wire.Welcome), w
        assert (w.num_spec, w.window, w.row_bytes, w.max_reqs) == (lay.num_spec, lay.window, lay.row_bytes,
                                                                   lay.max_reqs)
        rng = np.random.default_rng(seed)
        slot = lay.max_reqs - 1  # the last slot of the adopted max_reqs, past the worker's own
        k1, k2 = lay.window - 1, 3
        r1 = rng.integers(0, 256, (k1, lay.row_bytes), dtype=np.uint8)
        r2 = rng.integers(0, 256, (k2, lay.row_bytes), dtype=np.uint8)
        e1 = make_entries([dict(slot=slot, generation=1, first_pos=0, n_rows=k1, anchor_token=7,
                                flags=wire.RF_NEW_GEN | wire.RF_NEED_DRAFT)])
        rep = peer.step(e1, r1, 1)
        assert isinstance(rep, wire.StepReply) and rep.status[0] == wire.RS_PARTIAL_WINDOW
        ids, conf = integrity(7, k1, r1, lay.num_spec, lay.window)
        assert rep.draft_ids[0].tolist() == ids and rep.confidence[0, 0] == pytest.approx(conf)
        e2 = make_entries([dict(slot=slot, generation=1, first_pos=k1, n_rows=k2, anchor_token=9,
                                flags=wire.RF_NEED_DRAFT)])
        rep = peer.step(e2, r2, 2)
        assert rep.status[0] == wire.RS_OK and rep.window_rows[0] == lay.window
        win = np.concatenate([r1, r2])[-lay.window:]
        ids, conf = integrity(9, k1 + k2, win, lay.num_spec, lay.window)
        assert rep.draft_ids[0].tolist() == ids and conf == 1.0
    finally:
        peer.close()


def test_a_worker_started_without_the_proxys_shapes_serves_it(worker):
    """The issue's first-contact case: a worker on its defaults and a proxy of other shapes. Before:
    "mismatch: field=window window: client 32, worker 16" and no drafts ever."""
    srv = worker()
    c = TcpDraftClient("127.0.0.1", srv.port, max_reqs=128, num_spec=4, window=32, row_bytes=64,
                       backoff_s=(0.01, 0.05))
    c.start()
    try:
        assert c.wait_ready(5.0) is not None, c.disabled_reason
        assert not c.disabled and c.welcome is not None
        assert (c.welcome.num_spec, c.welcome.window, c.welcome.row_bytes, c.welcome.max_reqs) == (4, 32, 64, 128)
    finally:
        c.stop()
    assert srv.counters["handshakes_adopted"] == 1 and srv.counters["handshake_mismatch"] == 0


@pytest.mark.parametrize("shape", [(4, 32, 64, 128), (2, 3, 8, 1), (WN, WW, WRB, WM), (7, 16, 256, 8)])
def test_integrity_adopts_any_shape_and_drafts_for_it(worker, shape):
    srv = worker()
    n, w, rb, m = shape
    _serve_and_check(srv.port, wire.WireLayout(num_spec=n, window=w, row_bytes=rb, max_reqs=m), 5, 1)
    assert srv.counters["drafter_errors"] == 0


def test_two_proxies_of_different_shapes_share_one_worker(worker):
    srv = worker()
    _serve_and_check(srv.port, wire.WireLayout(num_spec=3, window=8, row_bytes=32, max_reqs=4), 11, 2)
    _serve_and_check(srv.port, wire.WireLayout(num_spec=6, window=20, row_bytes=48, max_reqs=300), 12, 3)
    _serve_and_check(srv.port, wire.WireLayout(num_spec=3, window=8, row_bytes=32, max_reqs=4), 13, 4)


def test_a_closed_sessions_id_reused_under_other_shapes_gets_fresh_windows(worker):
    srv = worker()
    _serve_and_check(srv.port, wire.WireLayout(num_spec=3, window=8, row_bytes=32, max_reqs=4), 21, 5)
    end = time.monotonic() + 5
    while 21 in srv.sessions and time.monotonic() < end:  # dropped when its connection closed
        time.sleep(0.01)
    _serve_and_check(srv.port, wire.WireLayout(num_spec=2, window=5, row_bytes=24, max_reqs=4), 21, 6)


@pytest.mark.parametrize("field,value", [("num_spec", WN + 1), ("window", WW * 2), ("row_bytes", WRB + 8),
                                         ("max_reqs", WM + 1)])
def test_no_adopt_shapes_refuses_by_field_with_both_values(worker, field, value):
    srv = worker(adopt_shapes=False)
    peer = RawPeer(srv.port, wire.WireLayout(num_spec=WN, window=WW, row_bytes=WRB, max_reqs=WM))
    try:
        msg = peer.handshake(**{field: value})
        assert isinstance(msg, wire.ErrorMsg) and msg.code == "mismatch" and msg.field == field, msg
        assert f"client {value}" in msg.message and str(getattr(srv.layout, field)) in msg.message, msg
    finally:
        peer.close()


def test_a_shape_past_the_memory_budget_is_refused_at_hello(worker):
    srv = worker(memory_budget_bytes=1 << 20)
    peer = RawPeer(srv.port, wire.WireLayout(num_spec=WN, window=64, row_bytes=1024, max_reqs=64))
    try:
        msg = peer.handshake()
        assert isinstance(msg, wire.ErrorMsg) and msg.code == "mismatch" and msg.field == "max_reqs", msg
        assert "memory budget" in msg.message and str(1 << 20) in msg.message
    finally:
        peer.close()


def test_a_head_refuses_only_what_it_fixes(worker):
    pytest.importorskip("torch")
    srv = worker(num_spec=2, window=4, row_bytes=8, max_reqs=4, drafter="torch")
    own = wire.WireLayout(num_spec=2, window=4, row_bytes=8, max_reqs=4)
    for field, value in (("num_spec", 3), ("window", 8), ("row_bytes", 16)):
        peer = RawPeer(srv.port, own)
        try:
            msg = peer.handshake(**{field: value})
            assert isinstance(msg, wire.ErrorMsg) and msg.code == "mismatch" and msg.field == field, msg
            assert f"client {value}" in msg.message and f"worker {getattr(own, field)}" in msg.message, msg
            assert "torch drafter" in msg.message
        finally:
            peer.close()
    peer = RawPeer(srv.port, wire.WireLayout(num_spec=2, window=4, row_bytes=8, max_reqs=40))
    try:  # max_reqs is not the head's: adopted
        w = peer.handshake()
        assert isinstance(w, wire.Welcome) and w.max_reqs == 40
        e = make_entries([dict(slot=39, generation=1, first_pos=0, n_rows=4, anchor_token=3,
                               flags=wire.RF_NEW_GEN | wire.RF_NEED_DRAFT)])
        rep = peer.step(e, np.arange(32, dtype=np.uint8).reshape(4, 8), 1)
        assert rep.status[0] == wire.RS_OK and (rep.draft_ids[0] >= 0).all()
    finally:
        peer.close()
