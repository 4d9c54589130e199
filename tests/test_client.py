"""TcpDraftClient against a real WorkerServer on loopback: epochs, refusals, timeouts, late replies,
bad replies, handshake mismatch and auth, with usable drafts checked against the integrity formula."""

from __future__ import annotations

import socket
import struct
import time
import zlib

import numpy as np
import pytest

import dspark_proxy.wire as wire
from dspark_proxy.link.client import StepOutcome, TcpDraftClient
from dspark_proxy.worker import FaultPlan, WorkerServer

pytestmark = pytest.mark.timeout(60)

N, W, RB, M = 5, 4, 16, 8
ND, NG = wire.RF_NEED_DRAFT, wire.RF_NEW_GEN


def expected_ids(token: int, anchor_pos: int, window_rows: np.ndarray) -> list[int]:
    """The integrity formula (docs/design.md, "The worker"), recomputed here: crc32(token i32 ‖ pos i64
    ‖ rows), (h ^ j*0x9E3779B1) & 0x7FFFFFFF."""
    h = zlib.crc32(struct.pack("<iq", token, anchor_pos) + window_rows.tobytes())
    return [(h ^ ((j * 0x9E3779B1) & 0xFFFFFFFF)) & 0x7FFFFFFF for j in range(N)]


def make_server(**kw) -> WorkerServer:
    args = dict(num_spec=N, window=W, row_bytes=RB, max_reqs=M)
    args.update(kw)
    srv = WorkerServer("127.0.0.1", kw.pop("port", 0), **{k: v for k, v in args.items() if k != "port"})
    srv.start()
    return srv


def make_client(port: int, **kw) -> TcpDraftClient:
    args = dict(max_reqs=M, num_spec=N, window=W, row_bytes=RB, backoff_s=(0.01, 0.05))
    args.update(kw)
    c = TcpDraftClient("127.0.0.1", port, **args)
    c.start()
    return c


@pytest.fixture
def pair():
    made: list = []

    def _make(server_kw=None, client_kw=None):
        srv = make_server(**(server_kw or {}))
        made.append(srv)
        c = make_client(srv.port, **(client_kw or {}))
        made.append(c)
        return srv, c

    yield _make
    for obj in reversed(made):
        obj.stop()


class Stepper:
    """Drives one slot (0) forward one row per step, as the round would, through the in-place prefix."""

    def __init__(self, client: TcpDraftClient) -> None:
        self.c = client
        self.prefix = bytearray(wire.step_prefix_bytes(M, False))
        self.rows: list[np.ndarray] = []
        self.step_id = 0
        self.rng = np.random.default_rng(0)

    def step(self, *, epoch=None, new_gen=False, timeout_s=2.0, ask=True) -> tuple[StepOutcome, int]:
        """One step for slot 0; new_gen resends the whole window; ask: NEED_DRAFT. Returns (outcome,
        anchor_pos)."""
        nd = ND if ask else 0
        row = self.rng.integers(0, 256, (1, RB), dtype=np.uint8)
        self.rows.append(row[0])
        pos = len(self.rows) - 1
        e = wire.entries_view(self.prefix, 1)
        if new_gen:
            k = min(W, len(self.rows))
            send = np.stack(self.rows[-k:])
            e[0] = (0, k, 1, pos + 1 - k, pos + 1, 42, NG | nd, 0, 0, 0)
        else:
            send = row
            e[0] = (0, 1, 1, pos, pos + 1, 42, nd, 0, 0, 0)
        self.step_id += 1
        ep = self.c.connection_epoch() if epoch is None else epoch
        out = self.c.step(self.prefix, e, int(e["n_rows"].sum()), step_id=self.step_id, step_flags=0,
                          epoch=ep if ep is not None else 0, rows=[send], timeout_s=timeout_s)
        return out, pos + 1

    def check(self, out: StepOutcome, anchor_pos: int) -> None:
        assert out.ok, out
        r = out.reply
        assert r.step_id == self.step_id and r.status[0] in wire.USABLE_REQ_STATUS
        w = int(r.window_rows[0])
        win = np.stack(self.rows[anchor_pos - w:anchor_pos])
        assert r.draft_ids[0].tolist() == expected_ids(42, anchor_pos, win)


def test_connect_step_and_continue(pair):
    srv, c = pair()
    assert c.wait_ready(5) == 1
    s = Stepper(c)
    out, a = s.step(new_gen=True)
    s.check(out, a)
    for _ in range(10):
        out, a = s.step()
        s.check(out, a)
    assert out.reply.status[0] == wire.RS_OK and out.rtt_us > 0
    assert c.counters["steps_sent"] == 11 and c.welcome.drafter == "integrity"


def test_not_ready_never_blocks_and_backs_off():
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    port = lst.getsockname()[1]
    lst.close()  # nothing listens there
    c = make_client(port)
    try:
        s = Stepper(c)
        t0 = time.perf_counter()
        out, _ = s.step(epoch=1)
        assert not out.ok and out.reason == "not_ready"
        assert time.perf_counter() - t0 < 0.05
        assert c.connection_epoch() is None
        time.sleep(0.3)
        assert c.counters["connect_failures"] >= 2 and not c.disabled
    finally:
        c.stop()


def test_reconnect_raises_the_epoch_and_old_epoch_is_refused(pair):
    srv, c = pair(server_kw=dict(faults=FaultPlan(drop_every=3)))
    assert c.wait_ready(5) == 1
    s = Stepper(c)
    s.check(*s.step(new_gen=True))
    s.check(*s.step())
    out, _ = s.step()  # the worker drops the connection at its 3rd step
    assert not out.ok and out.reason == "connection_lost"
    deadline = time.monotonic() + 5
    while c.connection_epoch() != 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert c.connection_epoch() == 2 and c.counters["reconnects"] == 1
    steps_before = srv.counters["steps"]
    out, _ = s.step(epoch=1)
    assert not out.ok and out.reason == "reconnected"
    assert c.counters["steps_refused_epoch"] == 1
    time.sleep(0.05)
    assert srv.counters["steps"] == steps_before  # nothing was sent
    # the new connection is a new session: the worker holds nothing, so resend the window
    s.check(*s.step(new_gen=True))


def test_worker_restart_on_the_same_port(pair):
    srv, c = pair()
    port = srv.port
    assert c.wait_ready(5) == 1
    s = Stepper(c)
    s.check(*s.step(new_gen=True))
    srv.stop()
    out, _ = s.step()
    assert not out.ok and out.reason in ("connection_lost", "timeout")
    srv2 = make_server(port=port)
    try:
        deadline = time.monotonic() + 5
        while c.connection_epoch() != 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert c.connection_epoch() == 2
        s.check(*s.step(new_gen=True))
    finally:
        srv2.stop()


def test_timed_out_reply_is_dropped_not_used_for_the_next_step(pair):
    srv, c = pair(server_kw=dict(faults=FaultPlan(delay_ms=150)))
    assert c.wait_ready(5) == 1
    s = Stepper(c)
    out, _ = s.step(new_gen=True, timeout_s=0.03)
    assert not out.ok and out.reason == "timeout"
    assert c.connection_epoch() == 1  # one timeout keeps the connection
    out, a = s.step(timeout_s=2.0)  # its reply comes after step 1's late one
    s.check(out, a)
    assert out.reply.step_id == 2
    assert c.counters["late_replies_dropped"] == 1


def test_draft_delay_slows_only_the_steps_that_ask_for_drafts(pair):
    """The draft_delay_ms fault (drafting made expensive, tests/test_gate_tps.py's end to end): a STEP
    that asks for drafts waits for it, one that only sends rows does not."""
    srv, c = pair(server_kw=dict(faults=FaultPlan(draft_delay_ms=300)))
    assert c.wait_ready(5) == 1
    s = Stepper(c)
    out, _ = s.step(new_gen=True, ask=False)
    assert out.ok and out.rtt_us < 250_000
    out, a = s.step(timeout_s=5.0)
    s.check(out, a)
    assert out.rtt_us >= 300_000


def test_stalled_worker_is_dropped_after_consecutive_timeouts(pair):
    srv, c = pair(server_kw=dict(faults=FaultPlan(stall_after=1)), client_kw=dict(max_consecutive_timeouts=2))
    assert c.wait_ready(5) == 1
    s = Stepper(c)
    s.check(*s.step(new_gen=True))
    for _ in range(2):
        out, _ = s.step(timeout_s=0.03)
        assert out.reason == "timeout"
    assert c.counters["connections_dropped"] == 1
    deadline = time.monotonic() + 5
    while c.connection_epoch() != 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert c.connection_epoch() == 2


@pytest.mark.parametrize("fault", ["garbage_every", "wrong_step_every", "wrong_session_every"])
def test_bad_reply_is_discarded_and_counted(pair, fault):
    srv, c = pair(server_kw=dict(faults=FaultPlan(**{fault: 2})))
    assert c.wait_ready(5) == 1
    s = Stepper(c)
    s.check(*s.step(new_gen=True))
    out, _ = s.step()
    assert not out.ok and out.reason == "bad_reply" and out.reply is None
    assert c.counters["bad_replies"] == 1
    want = {"wrong_step_every": "bad_reply_step_id", "wrong_session_every": "bad_reply_session"}.get(fault)
    if want:
        assert c.counters[want] == 1
    # the stream stayed in sync: the next step works on the same connection
    s.check(*s.step())
    assert c.connection_epoch() == 1


def test_worker_error_reply(pair):
    srv, c = pair()
    assert c.wait_ready(5) == 1
    prefix = bytearray(wire.step_prefix_bytes(M, False))
    e = wire.entries_view(prefix, 1)
    e[0] = (0, 1, 1, 0, 1, 0, NG | ND, 0, 0, 0)
    # a row of the wrong size passes our local checks only if n_rows says so: fake a bad STEP by
    # lying about row_bytes in the prefix after fill (the worker refuses it with ERROR)
    c.layout = wire.WireLayout(N, W, RB * 2, M)
    out = c.step(prefix, e, 1, step_id=1, step_flags=0, epoch=1, rows=[np.zeros(RB * 2, np.uint8)],
                 timeout_s=2.0)
    assert not out.ok and out.reason == "worker_error"
    assert srv.counters["bad_step"] == 1


def test_new_session_tells_the_worker(pair):
    srv, c = pair()
    assert c.wait_ready(5) == 1
    s = Stepper(c)
    s.check(*s.step(new_gen=True))
    old = c.session_id
    c.new_session("test")
    assert c.session_id != old
    out, _ = s.step()
    assert out.ok and out.reply.status[0] == wire.RS_UNKNOWN_SLOT  # the old session's window is gone
    assert old not in srv.sessions and c.session_id in srv.sessions
    s.check(*s.step(new_gen=True))


@pytest.mark.parametrize("client_kw,field", [
    (dict(num_spec=4), "num_spec"), (dict(window=8), "window"), (dict(row_bytes=32), "row_bytes"),
    (dict(max_reqs=M + 1), "max_reqs"), (dict(sampled=True), "sampled"),
])
def test_handshake_mismatch_disables(pair, client_kw, field):
    srv, c = pair(server_kw=dict(adopt_shapes=False), client_kw=client_kw)  # a worker of its own shapes only
    deadline = time.monotonic() + 5
    while not c.disabled and time.monotonic() < deadline:
        time.sleep(0.005)
    assert c.disabled and field in c.disabled_reason
    assert c.connection_epoch() is None
    out = c.step(bytearray(wire.step_prefix_bytes(M + 1, True)), np.zeros(0, wire.ENTRY_DTYPE), 0,
                 step_id=1, step_flags=0, epoch=1, rows=[], timeout_s=0.1)
    assert out.reason == "disabled"
    n = srv.counters["connections"]
    time.sleep(0.2)
    assert srv.counters["connections"] == n == 1  # a disabled client retries only every disabled_retry_s


@pytest.mark.parametrize("worker_token,client_token,reason", [
    (b"alpha", b"alpha", None),
    (b"alpha", b"beta", "auth_refused"),
    (b"alpha", None, "auth_required"),
    (None, b"alpha", "auth_refused"),
])
def test_auth(pair, worker_token, client_token, reason):
    srv, c = pair(server_kw=dict(token=worker_token), client_kw=dict(token=client_token))
    if reason is None:
        assert c.wait_ready(5) == 1
        s = Stepper(c)
        s.check(*s.step(new_gen=True))
    else:
        deadline = time.monotonic() + 5
        while not c.disabled and time.monotonic() < deadline:
            time.sleep(0.005)
        assert c.disabled and c.disabled_reason.startswith(reason), c.disabled_reason
        if worker_token is not None:  # refused by the worker (or by us before AUTH)
            assert srv.counters["handshakes"] == 0
        n = srv.counters["connections"]
        time.sleep(0.1)
        assert srv.counters["connections"] == n  # no retries


def test_many_row_buffers_and_large_rows_in_one_send(pair):
    rb = 71680
    srv, c = pair(server_kw=dict(row_bytes=rb, window=128, max_reqs=64),
                  client_kw=dict(row_bytes=rb, window=128, max_reqs=64))
    assert c.wait_ready(5) == 1
    n, k = 40, 3  # 120 rows of 70 KiB = 8.6 MB, sent as 120 separate buffers
    prefix = bytearray(wire.step_prefix_bytes(64, False))
    e = wire.entries_view(prefix, n)
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 256, (n * k, rb), dtype=np.uint8)
    for i in range(n):
        e[i] = (i, k, 1, 0, k, i, NG | ND, 0, 0, 0)
    out = c.step(prefix, e, n * k, step_id=1, step_flags=0, epoch=1, rows=[rows[j] for j in range(n * k)],
                 timeout_s=10.0)
    assert out.ok, out
    assert out.reply.window_rows.tolist() == [k] * n
    for i in (0, n // 2, n - 1):
        h = zlib.crc32(struct.pack("<iq", i, k) + rows[i * k:(i + 1) * k].tobytes())
        assert out.reply.draft_ids[i, 0] == h & 0x7FFFFFFF


def test_entries_passed_as_a_separate_array_are_copied_in(pair):
    srv, c = pair()
    assert c.wait_ready(5) == 1
    prefix = bytearray(wire.step_prefix_bytes(M, False))
    e = np.zeros(1, wire.ENTRY_DTYPE)
    e[0] = (0, 2, 1, 0, 2, 9, NG | ND, 0, 0, 0)
    rows = np.arange(2 * RB, dtype=np.uint8).reshape(2, RB)
    out = c.step(prefix, e, 2, step_id=1, step_flags=0, epoch=1, rows=[rows], timeout_s=2.0)
    assert out.ok and out.reply.draft_ids[0].tolist() == expected_ids(9, 2, rows)


def test_local_errors_raise(pair):
    srv, c = pair()
    assert c.wait_ready(5) == 1
    prefix = bytearray(wire.step_prefix_bytes(M, False))
    e = wire.entries_view(prefix, 1)
    e[0] = (0, 2, 1, 0, 2, 9, NG | ND, 0, 0, 0)
    with pytest.raises(wire.LocalProtocolError):  # n_rows does not match the entries
        c.step(prefix, e, 3, step_id=1, step_flags=0, epoch=1, rows=[np.zeros((3, RB), np.uint8)], timeout_s=1)
    with pytest.raises(wire.LocalProtocolError):  # rows do not match n_rows
        c.step(prefix, e, 2, step_id=1, step_flags=0, epoch=1, rows=[np.zeros((1, RB), np.uint8)], timeout_s=1)
    with pytest.raises(wire.LocalProtocolError):  # sampled flag on a client without sampled mode
        c.step(prefix, e, 2, step_id=1, step_flags=wire.SF_SAMPLED, epoch=1,
               rows=[np.zeros((2, RB), np.uint8)], timeout_s=1)


def test_stop_is_idempotent(pair):
    srv, c = pair()
    assert c.wait_ready(5) == 1
    c.stop()
    c.stop()
    assert c.connection_epoch() is None
    out, _ = Stepper(c).step(epoch=1)
    assert out.reason == "not_ready"
