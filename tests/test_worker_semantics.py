"""The worker's window semantics (docs/design.md, "The worker") over the real protocol, with every
usable draft checked against the integrity formula recomputed here from the rows the test sent."""

from __future__ import annotations

import struct
import time
import zlib

import numpy as np
import pytest

import dspark_proxy.wire as wire
from dspark_proxy.worker import WorkerServer
from dspark_proxy.worker.testing import RawPeer, RowHistory, make_entries

pytestmark = pytest.mark.timeout(30)


def expected_drafts(anchor_token: int, anchor_pos: int, window_rows: np.ndarray, W: int, N: int,
                    n_out: int) -> tuple[list[int], list[float]]:
    """docs/design.md, "The worker": h = crc32(token i32 LE ‖ pos i64 LE ‖ rows), drafts (h ^ (j *
    0x9E3779B1)) & 0x7FFFFFFF."""
    h = zlib.crc32(struct.pack("<i", anchor_token) + struct.pack("<q", anchor_pos) + window_rows.tobytes())
    w = window_rows.shape[0]
    k = N if n_out == 0 else min(n_out, N)
    ids = [((h ^ ((j * 0x9E3779B1) & 0xFFFFFFFF)) & 0x7FFFFFFF) if j < k else -1 for j in range(N)]
    conf = [float(np.float32(w / W)) if j < k else 0.0 for j in range(N)]
    return ids, conf

N, W, RB = 5, 4, 16
MR = 256  # max_reqs: room for the spread-out slot numbers below (a slot must be < max_reqs)
LAYOUT = wire.WireLayout(num_spec=N, window=W, row_bytes=RB, max_reqs=MR, sampled=True)
ND, NG, RS = wire.RF_NEED_DRAFT, wire.RF_NEW_GEN, wire.RF_RESYNC


@pytest.fixture
def server():
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=MR, sampled=True)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


class Harness:
    """One raw peer plus the record of what it sent, and a checker for replies."""

    def __init__(self, port: int, session: int = 1) -> None:
        self.peer = RawPeer(port, LAYOUT, session=session)
        assert isinstance(self.peer.handshake(), wire.Welcome)
        self.hist = RowHistory(RB)
        self.rng = np.random.default_rng(session)
        self.step_id = 0

    def step(self, specs, *, session=None, step_flags=0, meta=None):
        e = make_entries(specs)
        n_rows = int(e["n_rows"].sum())
        rows = self.rng.integers(0, 256, (n_rows, RB), dtype=np.uint8)
        self.step_id += 1
        s = self.peer.session if session is None else session
        reply = self.peer.step(e, rows, self.step_id, session=s, step_flags=step_flags, sample_meta=meta)
        assert isinstance(reply, wire.StepReply), reply
        assert reply.step_id == self.step_id and reply.session == s
        # record only what the worker accepted: a refused entry does not change its window
        ok = wire.USABLE_STATUS_TABLE[reply.status]
        offs = np.concatenate(([0], np.cumsum(e["n_rows"], dtype=np.int64)))
        for i in np.flatnonzero(ok):
            self.hist.record(s, e[i:i + 1], rows[offs[i]:offs[i + 1]])
        self.check(e, reply, s)
        return reply

    def check(self, e, reply, session):
        for i in range(e.shape[0]):
            usable = bool(wire.USABLE_STATUS_TABLE[reply.status[i]])
            if usable and e["flags"][i] & ND:
                w = int(reply.window_rows[i])
                win = self.hist.window(session, int(e["slot"][i]), int(e["anchor_pos"][i]), w)
                ids, conf = expected_drafts(int(e["anchor_token"][i]), int(e["anchor_pos"][i]), win, W, N,
                                            int(e["n_out"][i]))
                assert reply.draft_ids[i].tolist() == ids
                assert reply.confidence[i].tolist() == conf
            else:
                assert (reply.draft_ids[i] == -1).all() and (reply.confidence[i] == 0).all()

    def close(self):
        self.peer.close()


@pytest.fixture
def h(server):
    hh = Harness(server.port)
    yield hh
    hh.close()


def test_new_gen_then_continuation_fills_and_slides_the_window(h):
    r = h.step([dict(slot=3, first_pos=10, n_rows=2, generation=1, flags=NG | ND, anchor_token=7)])
    assert r.status.tolist() == [wire.RS_PARTIAL_WINDOW] and r.window_rows.tolist() == [2]
    r = h.step([dict(slot=3, first_pos=12, n_rows=1, generation=1, flags=ND, anchor_token=8)])
    assert r.status.tolist() == [wire.RS_PARTIAL_WINDOW] and r.window_rows.tolist() == [3]
    r = h.step([dict(slot=3, first_pos=13, n_rows=3, generation=1, flags=ND, anchor_token=9)])
    assert r.status.tolist() == [wire.RS_OK] and r.window_rows.tolist() == [W]  # slid past W
    for p in range(16, 26):  # wraps the position % W ring several times
        r = h.step([dict(slot=3, first_pos=p, n_rows=1, generation=1, flags=ND, anchor_token=p)])
        assert r.status.tolist() == [wire.RS_OK]


def test_plain_entry_with_zero_rows_redrafts_the_same_window(h):
    h.step([dict(slot=0, first_pos=0, n_rows=3, generation=1, flags=NG | ND, anchor_token=1)])
    r = h.step([dict(slot=0, first_pos=3, n_rows=0, generation=1, flags=ND, anchor_token=2)])
    assert r.status.tolist() == [wire.RS_PARTIAL_WINDOW] and r.window_rows.tolist() == [3]


def test_gap_needs_resync_and_resync_recovers(h):
    h.step([dict(slot=1, first_pos=0, n_rows=2, generation=1, flags=NG | ND)])
    r = h.step([dict(slot=1, first_pos=5, n_rows=1, generation=1, flags=ND)])  # forward gap
    assert r.status.tolist() == [wire.RS_GAP]
    r = h.step([dict(slot=1, first_pos=1, n_rows=1, generation=1, flags=ND)])  # overlap / rewind
    assert r.status.tolist() == [wire.RS_GAP]
    r = h.step([dict(slot=1, first_pos=3, n_rows=4, generation=1, flags=NG | RS | ND, anchor_token=5)])
    assert r.status.tolist() == [wire.RS_OK] and r.window_rows.tolist() == [4]
    r = h.step([dict(slot=1, first_pos=7, n_rows=1, generation=1, flags=ND)])
    assert r.status.tolist() == [wire.RS_OK]


def test_generations(h):
    h.step([dict(slot=2, first_pos=0, n_rows=1, generation=5, flags=NG | ND)])
    r = h.step([dict(slot=2, first_pos=0, n_rows=1, generation=4, flags=NG | ND)])
    assert r.status.tolist() == [wire.RS_STALE_GENERATION]
    r = h.step([dict(slot=2, first_pos=1, n_rows=1, generation=4, flags=ND)])
    assert r.status.tolist() == [wire.RS_STALE_GENERATION]
    r = h.step([dict(slot=2, first_pos=1, n_rows=1, generation=6, flags=ND)])  # missed a NEW_GEN
    assert r.status.tolist() == [wire.RS_GAP]
    # the refused entries left generation 5's window as it was
    r = h.step([dict(slot=2, first_pos=1, n_rows=1, generation=5, flags=ND)])
    assert r.status.tolist() == [wire.RS_PARTIAL_WINDOW] and r.window_rows.tolist() == [2]
    # a newer generation restarts the window
    r = h.step([dict(slot=2, first_pos=100, n_rows=1, generation=6, flags=NG | ND)])
    assert r.status.tolist() == [wire.RS_PARTIAL_WINDOW] and r.window_rows.tolist() == [1]
    # same generation NEW_GEN (a dirty slot resent) is a restart, not stale
    r = h.step([dict(slot=2, first_pos=100, n_rows=2, generation=6, flags=NG | ND)])
    assert r.status.tolist() == [wire.RS_PARTIAL_WINDOW] and r.window_rows.tolist() == [2]


def test_unknown_slot(h):
    r = h.step([dict(slot=9, first_pos=4, n_rows=1, generation=1, flags=ND)])
    assert r.status.tolist() == [wire.RS_UNKNOWN_SLOT]


def test_bad_entry_alone_in_a_good_batch(h):
    good = [dict(slot=s, first_pos=0, n_rows=2, generation=1, flags=NG | ND, anchor_token=s) for s in range(4)]
    bad_specs = [
        dict(slot=10, first_pos=0, n_rows=2, generation=1, flags=NG | ND, n_out=N + 1),   # n_out > N
        dict(slot=10, first_pos=0, n_rows=2, generation=1, flags=RS | ND),               # RESYNC w/o NEW_GEN
        dict(slot=10, first_pos=0, n_rows=W + 1, generation=1, flags=NG | ND),           # over W rows
        dict(slot=10, first_pos=0, n_rows=2, generation=1, flags=NG | ND, anchor_pos=5),  # anchor off
        dict(slot=10, first_pos=0, n_rows=2, generation=1, flags=NG | ND | 0x40),        # unknown flag
        dict(slot=1, first_pos=0, n_rows=1, generation=1, flags=NG | ND),                # duplicate slot
    ]
    for bad in bad_specs:
        specs = [dict(d, slot=d["slot"] + 20 * h.step_id) for d in good]
        if bad["slot"] != 1:
            bad = dict(bad, slot=bad["slot"] + 20 * h.step_id)
        else:
            bad = dict(bad, slot=specs[1]["slot"])
        r = h.step(specs[:2] + [bad] + specs[2:])
        assert r.status.tolist() == [1, 1, wire.RS_BAD_ENTRY, 1, 1], bad


def test_n_out_and_need_draft(h):
    r = h.step([dict(slot=0, first_pos=0, n_rows=2, generation=1, flags=NG | ND, n_out=2),
                dict(slot=1, first_pos=0, n_rows=2, generation=1, flags=NG)])
    assert (r.draft_ids[0, 2:] == -1).all() and (r.draft_ids[0, :2] >= 0).all()
    assert r.status.tolist() == [1, 1] and (r.draft_ids[1] == -1).all()


def test_two_sessions_are_isolated(server, h):
    other = Harness(server.port, session=2)
    try:
        h.step([dict(slot=0, first_pos=0, n_rows=2, generation=1, flags=NG | ND, anchor_token=3)])
        other.step([dict(slot=0, first_pos=0, n_rows=2, generation=1, flags=NG | ND, anchor_token=3)])
        r1 = h.step([dict(slot=0, first_pos=2, n_rows=1, generation=1, flags=ND, anchor_token=4)])
        r2 = other.step([dict(slot=0, first_pos=2, n_rows=1, generation=1, flags=ND, anchor_token=4)])
        assert r1.draft_ids[0].tolist() != r2.draft_ids[0].tolist()  # different rows, same positions
        # a session the worker never saw holds nothing, even for a slot another session has
        r = h.step([dict(slot=0, first_pos=3, n_rows=1, generation=1, flags=ND)], session=77)
        assert r.status.tolist() == [wire.RS_UNKNOWN_SLOT]
    finally:
        other.close()


def test_new_session_drops_the_previous_one(server, h):
    h.step([dict(slot=0, first_pos=0, n_rows=2, generation=1, flags=NG | ND)])
    assert 1 in server.sessions
    h.peer.send(wire.encode_control(wire.NewSession(previous=1, reason="test"), session=2))
    h.peer.session = 2
    r = h.step([dict(slot=0, first_pos=2, n_rows=1, generation=1, flags=ND)])
    assert r.status.tolist() == [wire.RS_UNKNOWN_SLOT]
    assert 1 not in server.sessions and 2 in server.sessions


def test_closing_the_connection_drops_its_sessions(server):
    hh = Harness(server.port, session=5)
    hh.step([dict(slot=0, first_pos=0, n_rows=1, generation=1, flags=NG | ND)])
    assert 5 in server.sessions
    hh.close()
    deadline = time.monotonic() + 5
    while 5 in server.sessions and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 5 not in server.sessions


def test_sampled_integrity_extras(h):
    meta = np.zeros(2, dtype=wire.SAMPLE_DTYPE)
    meta["temperature"] = [0.8, 0.0]
    r = h.step([dict(slot=0, first_pos=0, n_rows=2, generation=1, flags=NG | ND, n_out=3),
                dict(slot=1, first_pos=0, n_rows=2, generation=1, flags=NG | ND)],
               step_flags=wire.SF_SAMPLED | wire.SF_WANT_MARGIN, meta=meta)
    assert r.sampled_mask.tolist() == [1, 0]
    assert np.array_equal(r.margin, r.confidence)
    ids = r.draft_ids[0].astype(np.int64)
    for j in range(N):
        if j < 3:
            assert r.support_ids[0, j].tolist() == [int((ids[j] + k) & 0x7FFFFFFF) for k in range(32)]
            assert r.proposal_q[0, j, 0] == 1.0 and r.proposal_q[0, j, 1:].sum() == 0
        else:
            assert (r.support_ids[0, j] == -1).all() and (r.proposal_q[0, j] == 0).all()


def test_malformed_step_is_answered_with_error_and_the_connection_stays(server, h):
    e = make_entries([dict(slot=0, first_pos=0, n_rows=1, generation=1, flags=NG | ND)])
    parts = wire.encode_step(e, np.zeros((1, RB), np.uint8), row_bytes=RB, session=1, step_id=50)
    prefix = bytearray(parts[0])
    prefix[40 + 4:40 + 8] = (2).to_bytes(4, "little")  # header says 2 rows, payload holds 1
    h.peer.send(bytes(prefix) + bytes(parts[1]))
    msg = h.peer.recv()
    assert isinstance(msg, wire.ErrorMsg) and msg.code == "bad_step"
    assert server.counters["bad_step"] == 1
    r = h.step([dict(slot=0, first_pos=0, n_rows=1, generation=1, flags=NG | ND)])
    assert r.status.tolist() == [wire.RS_PARTIAL_WINDOW]


def test_bad_frame_header_drops_the_connection(server):
    peer = RawPeer(server.port, LAYOUT)
    try:
        assert isinstance(peer.handshake(), wire.Welcome)
        peer.send(b"\x00" * 40)
        with pytest.raises(ConnectionError):
            peer.recv(2.0)
        assert server.counters["bad_magic"] == 1
    finally:
        peer.close()


def test_handshake_mismatch_names_the_field():
    server = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=MR, sampled=True,
                          adopt_shapes=False)  # its own shapes only: the integrity drafter fixes none
    server.start()
    try:
        for field, value in (("num_spec", N + 1), ("window", W * 2), ("row_bytes", RB + 8), ("max_reqs", MR + 1),
                             ("protocol_version", 9)):
            peer = RawPeer(server.port, LAYOUT)
            try:
                msg = peer.handshake(**{field: value})
                assert isinstance(msg, wire.ErrorMsg) and msg.code == "mismatch" and msg.field == field, msg
            finally:
                peer.close()
    finally:
        server.stop()


def test_sampled_needs_worker_support():
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=MR, sampled=False)
    srv.start()
    peer = RawPeer(srv.port, LAYOUT)
    try:
        msg = peer.handshake()
        assert isinstance(msg, wire.ErrorMsg) and msg.field == "sampled"
    finally:
        peer.close()
        srv.stop()


def test_auth_token():
    token = b"s3cret-token"
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=MR, sampled=True, token=token)
    srv.start()
    try:
        good = RawPeer(srv.port, LAYOUT, token=token)
        assert isinstance(good.handshake(), wire.Welcome)
        good.close()
        bad = RawPeer(srv.port, LAYOUT, token=b"wrong")
        with pytest.raises(ValueError, match="proof"):  # the worker's proof does not verify under the wrong token
            bad.handshake()
        bad.close()
        # a peer that answers the challenge with a wrong proof is refused
        raw = RawPeer(srv.port, LAYOUT)
        raw.send(wire.encode_control(wire.Hello(protocol_version=1, num_spec=N, window=W, row_bytes=RB,
                                                max_reqs=MR, sampled=True, client_id="x", nonce=b"\x01" * 32)))
        assert isinstance(raw.recv(), wire.Challenge)
        raw.send(wire.encode_control(wire.Auth(proof=b"\x00" * 32)))
        msg = raw.recv()
        assert isinstance(msg, wire.ErrorMsg) and msg.code == "auth_refused"
        raw.close()
        # a STEP before authenticating is refused outright
        raw = RawPeer(srv.port, LAYOUT)
        raw.send(b"".join(bytes(p) for p in wire.encode_step(make_entries([]), np.zeros((0, RB), np.uint8),
                                                             row_bytes=RB)))
        with pytest.raises(ConnectionError):
            raw.recv(2.0)
        raw.close()
        assert srv.counters["auth_refused"] == 1 and srv.counters["handshakes"] == 1
    finally:
        srv.stop()


def test_non_loopback_needs_token_or_insecure():
    with pytest.raises(ValueError, match="token"):
        WorkerServer("0.0.0.0", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=MR)
    WorkerServer("0.0.0.0", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=MR, insecure=True)  # not started
    WorkerServer("0.0.0.0", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=MR, token=b"t")


def test_stop_is_idempotent_and_closes_connections(server):
    peer = RawPeer(server.port, LAYOUT)
    assert isinstance(peer.handshake(), wire.Welcome)
    server.stop()
    server.stop()
    with pytest.raises(ConnectionError):
        peer.recv(2.0)
    peer.close()
