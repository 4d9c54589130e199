"""Fuzzing both ends of the wire over real sockets (docs/guarantees.md: malformed
frames never crash or hang either side, and are counted). test_wire_fuzz.py fuzzes the sans-IO decoder;
this file feeds mutated frames to the live programs:

- a live WorkerServer gets mutated STEP frames (after a real handshake): it answers with a REPLY or
  an ERROR, or drops that connection; after every one it still serves a good STEP with right drafts;
- a live TcpDraftClient gets mutated REPLY frames from a fake worker: step() returns an outcome (ok, or
  a named failure) within its timeout, never raises or hangs; bad frames are counted; a good reply
  afterwards (on the same connection or a new one) is accepted.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import dspark_proxy.wire as wire
from dspark_proxy.link.client import STEP_FAILURE_REASONS, TcpDraftClient
from dspark_proxy.link.conn import FramedConnection
from dspark_proxy.worker import WorkerServer
from dspark_proxy.worker.testing import RawPeer, make_entries

pytestmark = pytest.mark.timeout(120)

N, W, RB, M = 3, 4, 8, 6
LAYOUT = wire.WireLayout(num_spec=N, window=W, row_bytes=RB, max_reqs=M)
EXTREMES = [0, 1, 0xFF, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF, 65536]


def fuzz(n: int) -> settings:
    return settings(deadline=None, max_examples=n, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@st.composite
def mutated(draw, base: bytes):
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 6))):
        if not data:
            break
        kind = draw(st.sampled_from(["flip", "set", "cut", "insert", "delete", "u32", "u32"]))
        i = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[i] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[i:]
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[i:i + draw(st.integers(1, 16))]
        else:
            data[i:i + 4] = draw(st.sampled_from(EXTREMES)).to_bytes(4, "little")
    return bytes(data)


# ---------------------------------------------------------------------------------------- the worker


def _step_frame(session: int, step_id: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    e = make_entries([{"slot": 1, "n_rows": 2, "first_pos": 0, "generation": 1, "anchor_token": 7,
                       "flags": wire.RF_NEW_GEN | wire.RF_NEED_DRAFT},
                      {"slot": 4, "n_rows": 1, "first_pos": 5, "generation": 1, "anchor_token": 9,
                       "flags": wire.RF_NEW_GEN | wire.RF_NEED_DRAFT}])
    rows = np.arange(3 * RB, dtype=np.uint8).reshape(3, RB)
    parts = wire.encode_step(e, rows, row_bytes=RB, step_flags=0, session=session, epoch=1, step_id=step_id)
    return b"".join(bytes(p) for p in parts), e, rows


@pytest.fixture(scope="module")
def worker():
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=M)
    srv.start()
    yield srv
    srv.stop()


def _drain_until_eof(conn: FramedConnection, timeout_s: float) -> list:
    """Every frame the worker sends until it closes the connection; [] if it closed without one."""
    frames = []
    end = time.monotonic() + timeout_s
    while True:
        try:
            f = conn.recv_frame(end)
        except (ConnectionError, OSError):
            return frames
        except wire.RemoteProtocolError as e:  # the worker must never send a bad frame
            raise AssertionError(f"the worker sent a malformed frame: {e}") from e
        if f is None:
            raise AssertionError(f"the worker neither answered nor closed within {timeout_s} s")
        frames.append(f)


_GOOD_SESSIONS = itertools.count(1000)


def _worker_serves_a_good_step(port: int) -> None:
    # a fresh session id each time: the previous check's connection may not be closed on the worker's
    # side yet, and a session of a connection still open is not another connection's to step
    sid = next(_GOOD_SESSIONS)
    peer = RawPeer(port, LAYOUT, session=sid)
    try:
        assert isinstance(peer.handshake(), wire.Welcome)
        frame, e, rows = _step_frame(sid, 1)
        peer.send(frame)
        r = peer.recv(5.0, n_req=2, step_flags=0)
        assert isinstance(r, wire.StepReply) and r.step_id == 1
        assert all(wire.USABLE_STATUS_TABLE[s] for s in r.status), r.status
    finally:
        peer.close()


@fuzz(150)
@given(st.data())
def test_worker_survives_mutated_steps(worker, data):
    base, _, _ = _step_frame(5, 3)
    frame = data.draw(mutated(base))
    peer = RawPeer(worker.port, LAYOUT, session=5)
    try:
        assert isinstance(peer.handshake(), wire.Welcome)
        peer.conn.send_parts([frame], time.monotonic() + 2.0)
        peer.conn.sock.shutdown(socket.SHUT_WR)  # EOF after the frame: a short frame cannot make it wait
        frames = _drain_until_eof(peer.conn, 5.0)
    finally:
        peer.close()
    for f in frames:
        assert f.header.type in (wire.MSG_REPLY, wire.MSG_ERROR), f.header
        if f.header.type == wire.MSG_ERROR:
            msg = wire.decode_control(f)
            assert isinstance(msg, wire.ErrorMsg) and msg.code
    event("answered" if frames else "dropped")
    _worker_serves_a_good_step(worker.port)


def test_worker_connections_are_released(worker):
    """After the fuzzing above, no connection thread is left (each mutated frame's connection closed)."""
    end = time.monotonic() + 5.0
    while worker.admission.conns and time.monotonic() < end:
        time.sleep(0.01)
    assert not worker.admission.conns
    _worker_serves_a_good_step(worker.port)


# ---------------------------------------------------------------------------------------- the client


class FakeWorker:
    """Accepts TcpDraftClient connections, handshakes, and discards their STEPs; the test thread sends
    REPLY bytes of its choosing on the current connection."""

    def __init__(self) -> None:
        self.lst = socket.socket()
        self.lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lst.bind(("127.0.0.1", 0))
        self.lst.listen(8)
        self.port = self.lst.getsockname()[1]
        self.current: socket.socket | None = None
        self.accepted = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        t = threading.Thread(target=self._accept, name="fake-worker-accept", daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                s, _ = self.lst.accept()
            except OSError:
                return
            self._socks.append(s)
            conn = FramedConnection(s, wire.Decoder({wire.MSG_HELLO: wire.MAX_CONTROL_PAYLOAD},
                                                    max_frame_bytes=1 << 16))
            try:
                f = conn.recv_frame(time.monotonic() + 2.0)
                hello = wire.decode_control(f)
                conn.send_parts([wire.encode_control(wire.Welcome(
                    protocol_version=wire.PROTOCOL_VERSION, num_spec=hello.num_spec, window=hello.window,
                    row_bytes=hello.row_bytes, max_reqs=hello.max_reqs, sampled=False, worker_id="fake",
                    drafter="fake"))], time.monotonic() + 2.0)
            except Exception:  # noqa: BLE001 - a failed handshake: the client retries
                s.close()
                continue
            self.accepted += 1
            self.current = s
            t = threading.Thread(target=self._discard, args=(s,), name="fake-worker-read", daemon=True)
            t.start()
            self._threads.append(t)

    def _discard(self, s: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                if not s.recv(1 << 16):
                    return
            except OSError:
                return

    def send(self, data: bytes) -> bool:
        s = self.current
        if s is None:
            return False
        try:
            s.sendall(data)
            return True
        except OSError:
            return False

    def drop_current(self) -> None:
        s, self.current = self.current, None
        if s is not None:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        self._stop.set()
        try:
            self.lst.shutdown(socket.SHUT_RDWR)  # wakes the accept(); close() alone does not
        except OSError:
            pass
        self.lst.close()
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self._threads:
            t.join(2.0)


@pytest.fixture(scope="module")
def client_and_fake():
    fake = FakeWorker()
    c = TcpDraftClient("127.0.0.1", fake.port, max_reqs=M, num_spec=N, window=W, row_bytes=RB,
                    backoff_s=(0.001, 0.01), max_consecutive_timeouts=1)
    c.start()
    yield c, fake
    c.stop()
    fake.stop()


class _Steps:
    step_id = 0
    prefix = bytearray(wire.step_prefix_bytes(M, False))


def _reply_bytes(session: int, epoch: int, step_id: int, n: int) -> bytes:
    w = wire.ReplyWriter(n, N, 0)
    w.status[:] = 0
    w.window_rows[:] = 1
    w.draft_ids[:] = 123
    w.confidence[:] = 0.25
    return bytes(w.finish(session=session, epoch=epoch, step_id=step_id, worker_us=5.0))


def _ready(c: TcpDraftClient, fake: FakeWorker) -> int:
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        ep = c.connection_epoch()
        if ep is not None and fake.current is not None and fake.accepted == ep:
            return ep
        time.sleep(0.001)
    raise AssertionError("the client did not reconnect to the fake worker within 5 s")


def _step(c: TcpDraftClient, epoch: int, timeout_s: float):
    _Steps.step_id += 1
    e = wire.entries_view(_Steps.prefix, 2)
    e[:] = make_entries([{"slot": 0, "n_rows": 1, "first_pos": 0, "generation": 1, "flags": wire.RF_NEED_DRAFT},
                         {"slot": 1, "n_rows": 1, "first_pos": 0, "generation": 1, "flags": wire.RF_NEED_DRAFT}])
    rows = np.zeros((2, RB), np.uint8)
    t0 = time.monotonic()
    out = c.step(_Steps.prefix, e, 2, step_id=_Steps.step_id, step_flags=0, epoch=epoch, rows=[rows],
                 timeout_s=timeout_s)
    return out, time.monotonic() - t0


@fuzz(200)
@given(st.data())
def test_client_survives_mutated_replies(client_and_fake, data):
    c, fake = client_and_fake
    epoch = _ready(c, fake)
    sid = _Steps.step_id + 1
    frame = data.draw(mutated(_reply_bytes(c.session_id, epoch, sid, 2)))
    bad_before = c.counters["bad_replies"] + c.counters["bad_frames"]
    fake.send(frame)
    out, took_s = _step(c, epoch, 0.05)
    assert took_s < 1.0, "step() overran its timeout"
    assert out.ok or out.reason in STEP_FAILURE_REASONS, out
    if out.ok:
        r = out.reply
        assert r.step_id == sid and r.status.shape == (2,) and r.draft_ids.shape == (2, N)
    elif out.reason == "bad_reply":
        assert c.counters["bad_replies"] + c.counters["bad_frames"] > bad_before
    event("ok" if out.ok else out.reason)
    # afterwards a good reply is accepted: on this connection if the stream is still in sync, else on a new one
    for _attempt in range(2):
        epoch = _ready(c, fake)
        fake.send(_reply_bytes(c.session_id, epoch, _Steps.step_id + 1, 2))
        out, _ = _step(c, epoch, 0.5)
        if out.ok:
            break
        fake.drop_current()  # a desynchronised stream: make the client reconnect
    assert out.ok, out
    assert out.reply.draft_ids[0, 0] == 123
