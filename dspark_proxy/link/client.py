"""The proxy's side of the wire (`TcpDraftClient`, a `draft_client.DraftClient`): a background connector
and a synchronous, deadline-bounded step().

Threads and ownership:
- the connect thread ("dspark-client-connect") connects with exponential backoff, handshakes, and
  publishes a `_Live` (connection, epoch, session) by one attribute store; it never touches a
  published connection again except to shut it down in stop();
- the stepping thread (the round's) owns the published connection: it sends and receives on it in
  step(), and on a failure unpublishes it (`_live = None`), closes it and wakes the connect thread,
  which reconnects and raises the epoch. step() never waits on a connect.

Timeouts: a step whose reply does not come by its deadline returns "timeout" and keeps the
connection; its reply, if it comes later, is drained and dropped by a later step (counted in
`late_replies_dropped`), never returned for another step. After `max_consecutive_timeouts`
timeouts in a row (a stalled worker) the connection is dropped and re-established (a new epoch). A
send that times out after some bytes went out tears the stream, so that connection is dropped at
once. Step ids must increase from step to step: a reply whose step id is below the current one is
late, above it is bad. Replies are matched to steps in order, one frame each; a frame that answers an
older step when none is owed any more (the worker sent one frame twice) is discarded and counted in
`extra_replies_dropped`, and the current step's reply is still awaited.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import threading
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np

from ..wire import (
    APP_HEADER_SIZE,
    ENTRY_DTYPE,
    MAX_CONTROL_PAYLOAD,
    MSG_CHALLENGE,
    MSG_ERROR,
    MSG_PONG,
    MSG_REPLY,
    MSG_WELCOME,
    NONCE_BYTES,
    PROTOCOL_VERSION,
    SF_ALL,
    SF_SAMPLED,
    Auth,
    Challenge,
    Decoder,
    ErrorMsg,
    Hello,
    LocalProtocolError,
    NewSession,
    RemoteProtocolError,
    StepReply,
    Welcome,
    WireLayout,
    check_proof,
    client_proof,
    decode_control,
    decode_reply,
    encode_control,
    worker_proof,
)
from ..wire.step import place, seal
from .conn import FramedConnection, SendTimeout, byte_view, connect_tcp
from .draft_client import STEP_FAILURE_REASONS, StepOutcome

__all__ = ["TcpDraftClient", "StepOutcome", "StepReply", "STEP_FAILURE_REASONS"]

log = logging.getLogger(__name__)

_NOT_READY = StepOutcome(False, "not_ready", None, 0.0)
_DISABLED = StepOutcome(False, "disabled", None, 0.0)
_RECONNECTED = StepOutcome(False, "reconnected", None, 0.0)


class _Disable(Exception):
    """The handshake found a permanent problem (mismatch, auth): stop reconnecting."""


class _Live:
    """A published connection. `session` and `pending` belong to the stepping thread."""

    __slots__ = ("conn", "epoch", "session", "pending", "timeouts", "welcome", "owed", "target_id")

    def __init__(self, conn: FramedConnection, epoch: int, session: int, welcome: Welcome,
                 target_id: str = "") -> None:
        self.conn = conn
        self.target_id = target_id  # what its HELLO named
        self.epoch = epoch
        self.session = session
        self.pending: bytes | None = None  # a NEW_SESSION frame to send before the next STEP
        self.timeouts = 0
        self.welcome = welcome
        self.owed = 0  # STEPs sent on this connection whose REPLY (or ERROR) has not been read yet


def _new_session_id() -> int:
    return secrets.randbits(63) | 1


class TcpDraftClient:
    """Connection to one draft worker, for one proxy (a `DraftClient`). See the module docstring for
    the threading."""

    def __init__(self, host: str, port: int, *, max_reqs: int, num_spec: int, window: int, row_bytes: int,
                 sampled: bool = False, token: bytes | None = None, connect_timeout_s: float = 1.0,
                 max_frame_bytes: int = 64 << 20, backoff_s: tuple[float, float] = (0.05, 1.0),
                 max_consecutive_timeouts: int = 3, client_id: str | None = None, target_id: str = "",
                 tap_layers: tuple[int, ...] = (), row_dtype: str = "", spin_us: float = 0.0) -> None:
        """spin_us: wait for each REPLY spinning on the socket for up to this long before sleeping
        (`--spin-us`, FramedConnection.spin_s)."""
        self.host = host
        self.port = port
        self.layout = WireLayout(num_spec=num_spec, window=window, row_bytes=row_bytes, max_reqs=max_reqs,
                                 sampled=sampled)
        self.token = token
        self.connect_timeout_s = connect_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.backoff_s = backoff_s
        self.max_consecutive_timeouts = max_consecutive_timeouts
        self.disabled_retry_s = 2.0  # a refused handshake (mismatch, auth) is tried again this often
        self.client_id = client_id or f"dspark-proxy pid={os.getpid()}"
        self.target_id = target_id  # named in the HELLO (set_target_id changes it)
        self.tap_layers = tuple(tap_layers)  # named in the HELLO: the row layout the engine taps ("" / (): unsaid)
        self.row_dtype = row_dtype
        self.spin_s = spin_us / 1e6
        self._retry = threading.Event()  # wakes a disabled client's wait early (set_target_id, stop)
        self.counters: Counter[str] = Counter()
        self.disabled = False
        self.disabled_reason: str | None = None
        self.welcome: Welcome | None = None
        self._epoch = 0
        self._live: _Live | None = None
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread: threading.Thread | None = None
        self._inflight: tuple | None = None  # the sent STEP whose reply collect() reads (stepping thread)
        self._sending: tuple | None = None  # a deferred send still going (PartialSend, the NEW_SESSION held)
        # the link as `status` shows it (links.py), written by the connect thread
        self.link_error: str | None = None  # why the last connect failed (None after a success)
        self.next_try_at: float | None = None  # monotonic time of the next connect attempt while backing off
        reply_max = self.layout.max_reply_payload()
        if reply_max + APP_HEADER_SIZE > max_frame_bytes:
            raise ValueError(f"max_frame_bytes={max_frame_bytes} is below the largest REPLY for these "
                             f"parameters ({reply_max + APP_HEADER_SIZE} bytes)")

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._connect_loop, name="dspark-client-connect", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Idempotent: stop reconnecting, close the connection, join the connect thread."""
        self._stop.set()
        self._lost.set()
        self._retry.set()
        live = self._live
        if live is not None:
            live.conn.shutdown()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(self.connect_timeout_s + 2.0)
        live, self._live = self._live, None
        if live is not None:
            live.conn.close()

    def connection_epoch(self) -> int | None:
        """The current connection's epoch (raised by every successful handshake); None while not ready."""
        live = self._live
        return None if live is None else live.epoch

    @property
    def session_id(self) -> int | None:
        live = self._live
        return None if live is None else live.session

    def moved_slots(self) -> None:
        """One worker: no slot ever moves (the round marks every slot dirty on a new epoch instead)."""
        return None

    def wait_ready(self, timeout_s: float) -> int | None:
        """Tests and tools: wait (polling lightly) until connected or disabled; the epoch or None."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.disabled:
            e = self.connection_epoch()
            if e is not None:
                return e
            self._stop.wait(0.005)
        return self.connection_epoch()

    def set_target_id(self, target_id: str) -> None:
        """The engine names its target (the stepping thread, at attach): a HELLO that named another
        is done again, so the worker checks its head against this one. No change: nothing happens."""
        if target_id == self.target_id:
            return
        log.info("[client] target_id %s -> %s: handshaking again", self.target_id or "(none)", target_id or "(none)")
        self.target_id = target_id
        self.counters["retargets"] += 1
        live = self._live
        if live is not None:
            self._drop(live, "the engine names another target")
        self._retry.set()

    def new_session(self, reason: str) -> None:
        """Steps from now on go under a fresh session id; the next STEP is preceded by a NEW_SESSION
        that tells the worker to drop the old one. Called from the stepping thread."""
        live = self._live
        if live is None:
            return  # the next connection starts a fresh session anyway
        old, live.session = live.session, _new_session_id()
        live.pending = encode_control(NewSession(previous=old, reason=reason[:4000]), session=live.session,
                                      epoch=live.epoch)
        self.counters["new_sessions"] += 1
        log.info("[client] new session=%d previous=%d reason=%s", live.session, old, reason)

    # ------------------------------------------------------------------ the round's call

    def step(self, prefix: bytearray, entries: np.ndarray, n_rows: int, *, step_id: int, step_flags: int,
             epoch: int, rows: Sequence, sample_meta: np.ndarray | None = None,
             timeout_s: float) -> StepOutcome:
        """Send one STEP (the prefix as wire/step.py builds it, then rows, one sendmsg) and wait
        for its REPLY until timeout_s. Never raises for network or peer problems: the outcome says
        why it failed. Raises LocalProtocolError for arguments that cannot be a valid STEP."""
        out = self.send_step(prefix, entries, n_rows, step_id=step_id, step_flags=step_flags, epoch=epoch,
                             rows=rows, sample_meta=sample_meta, timeout_s=timeout_s)
        if out is not None:
            return out
        out = self.collect(True)
        assert out is not None
        return out

    def send_step(self, prefix: bytearray, entries: np.ndarray, n_rows: int, *, step_id: int, step_flags: int,
                  epoch: int, rows: Sequence, sample_meta: np.ndarray | None = None,
                  timeout_s: float, defer: bool = False) -> StepOutcome | None:
        """step()'s first half: send the STEP; None when it went out (its reply is then `collect`ed),
        else the failed outcome. `defer`: send only what the socket takes now, the rest from
        `collect(False)` (a pool, pool/client.py, sends to every worker at once and collects after)."""
        t0 = time.perf_counter()
        self._inflight = self._sending = None
        if self.disabled:
            return _DISABLED
        live = self._live
        if live is None:
            return _NOT_READY
        if epoch != live.epoch:
            self.counters["steps_refused_epoch"] += 1
            return _RECONNECTED
        lay = self.layout
        n = entries.shape[0]
        if n > lay.max_reqs or entries.dtype != ENTRY_DTYPE:
            raise LocalProtocolError(f"{n} entries of dtype {entries.dtype}: at most {lay.max_reqs} of ENTRY_DTYPE")
        if step_flags & ~SF_ALL:
            raise LocalProtocolError(f"unknown step flags 0x{step_flags:x}")
        sampled = bool(step_flags & SF_SAMPLED)
        if sampled and (not lay.sampled or sample_meta is None or sample_meta.shape[0] != n):
            raise LocalProtocolError("SF_SAMPLED needs sampled=True and sample_meta for every entry")
        place(prefix, entries, sample_meta if sampled else None)
        if int(entries["n_rows"].sum(dtype=np.int64)) != n_rows:
            raise LocalProtocolError("entries' n_rows do not add up to n_rows")
        views = [byte_view(r) for r in rows]
        if sum(len(v) for v in views) != n_rows * lay.row_bytes:
            raise LocalProtocolError(f"rows hold {sum(len(v) for v in views)} bytes, expected "
                                     f"{n_rows} x {lay.row_bytes}")
        head = seal(prefix, n_req=n, n_rows=n_rows, row_bytes=lay.row_bytes, step_flags=step_flags,
                    session=live.session, epoch=epoch, step_id=step_id)
        parts: list = [head, *views]
        if live.pending is not None:
            parts.insert(0, live.pending)
        deadline = time.monotonic() + timeout_s
        conn = live.conn
        if defer:
            return self._send_deferred(live, parts, (live, step_id, n, step_flags, epoch, deadline, t0), t0)
        try:
            conn.send_parts(parts, deadline)
        except SendTimeout as e:
            self.counters["send_timeouts"] += 1
            if e.partial:
                self._drop(live, "send timed out mid-frame")
            return self._fail("timeout", t0)
        except OSError as e:
            self._drop(live, f"send failed: {e}")
            return self._fail("connection_lost", t0)
        live.pending = None
        live.owed += 1
        self.counters["steps_sent"] += 1
        self._inflight = (live, step_id, n, step_flags, epoch, deadline, t0)
        return None

    def _send_deferred(self, live: _Live, parts: list, inflight: tuple, t0: float) -> StepOutcome | None:
        ps = live.conn.begin_send(parts)
        try:
            done = live.conn.send_some(ps)
        except OSError as e:
            self._drop(live, f"send failed: {e}")
            return self._fail("connection_lost", t0)
        self._sending = None if done else (ps, live.pending)
        live.pending = None
        live.owed += 1
        self.counters["steps_sent"] += 1
        self._inflight = inflight
        return None

    def inflight(self) -> tuple[int, float, bool] | None:
        """The STEP in flight: its socket's fileno, its deadline, and whether it is still being sent
        (None: nothing in flight); a pool polls the socket."""
        f = self._inflight
        return None if f is None else (f[0].conn.sock.fileno(), f[5], self._sending is not None)

    def _pump(self) -> StepOutcome | None:
        """A deferred send goes on (collect(False)); the failed outcome if it cannot finish."""
        ps, pending = self._sending
        live, deadline, t0 = self._inflight[0], self._inflight[5], self._inflight[6]
        try:
            if live.conn.send_some(ps):
                self._sending = None
                return None
        except OSError as e:
            self._sending = self._inflight = None
            self._drop(live, f"send failed: {e}")
            return self._fail("connection_lost", t0)
        if time.monotonic() < deadline:
            return None
        self._sending = self._inflight = None
        self.counters["send_timeouts"] += 1
        if ps.sent_any:
            self._drop(live, "send timed out mid-frame")
        else:  # nothing went: the connection is whole, and the NEW_SESSION still to send
            live.owed -= 1
            live.pending = pending
        return self._fail("timeout", t0)

    def collect(self, wait: bool) -> StepOutcome | None:
        """step()'s second half: the sent STEP's outcome. wait=False reads only what has arrived and
        returns None while the reply is incomplete and its deadline has not passed."""
        assert self._inflight is not None, "collect() without a STEP in flight"
        if self._sending is not None:
            out = self._pump()
            if out is not None or self._sending is not None:
                return out  # failed, or still sending
        live, step_id, n, step_flags, epoch, deadline, t0 = self._inflight
        conn = live.conn
        lay = self.layout
        try:
            while True:
                f = conn.recv_frame(deadline if wait else 0.0)
                if f is None:
                    if not wait and time.monotonic() < deadline:
                        return None  # still in flight
                    self._inflight = None
                    self.counters["timeouts"] += 1
                    live.timeouts += 1
                    if live.timeouts >= self.max_consecutive_timeouts:
                        self._drop(live, f"{live.timeouts} consecutive timeouts")
                    return self._fail("timeout", t0)
                h = f.header
                if h.type == MSG_PONG or (h.type == MSG_ERROR and h.step_id == 0):
                    continue  # not the answer to a STEP
                # the worker answers a connection's STEPs in order, one frame each: while older steps
                # are owed a reply, this frame is theirs, whatever step id it carries
                live.owed -= 1
                if live.owed > 0:
                    self.counters["late_replies_dropped"] += 1
                    if h.step_id >= step_id:
                        self.counters["bad_reply_step_id"] += 1
                    continue
                if h.step_id < step_id:
                    # by the count this frame is ours, but it answers an older step: a frame nobody
                    # waits for (a duplicate). Discarded, this step's reply is still owed; keeping
                    # it would leave every later step reading its predecessor's reply
                    live.owed = 1
                    self.counters["extra_replies_dropped"] += 1
                    continue
                self._inflight = None
                live.owed = 0
                if h.step_id != step_id:
                    self.counters["bad_replies"] += 1
                    self.counters["bad_reply_step_id"] += 1
                    return self._fail("bad_reply", t0)
                live.timeouts = 0
                if h.session != live.session or h.epoch != epoch:
                    self.counters["bad_replies"] += 1
                    self.counters["bad_reply_session"] += 1
                    return self._fail("bad_reply", t0)
                if h.type == MSG_ERROR:
                    return self._worker_error(f, t0)
                try:
                    reply = decode_reply(f, lay, n_req=n, step_flags=step_flags,
                                         vocab_size=live.welcome.vocab_size)
                except RemoteProtocolError as e:
                    self.counters["bad_replies"] += 1
                    self.counters[e.counter] += 1
                    return self._fail("bad_reply", t0)
                return StepOutcome(True, None, reply, (time.perf_counter() - t0) * 1e6)
        except RemoteProtocolError as e:
            # a bad frame header: the stream cannot be trusted any more
            self._inflight = None
            self.counters["bad_frames"] += 1
            self.counters[e.counter] += 1
            self._drop(live, f"bad frame: {e}")
            return self._fail("bad_reply", t0)
        except OSError as e:
            self._inflight = None
            self._drop(live, f"receive failed: {e}")
            return self._fail("connection_lost", t0)

    # ------------------------------------------------------------------ internals (stepping thread)

    def _fail(self, reason: str, t0: float) -> StepOutcome:
        self.counters[f"step_{reason}"] += 1
        return StepOutcome(False, reason, None, (time.perf_counter() - t0) * 1e6)

    def _worker_error(self, f, t0: float) -> StepOutcome:
        try:
            msg = decode_control(f)
        except RemoteProtocolError as e:
            self.counters["bad_replies"] += 1
            self.counters[e.counter] += 1
            return self._fail("bad_reply", t0)
        self.counters["worker_errors"] += 1
        if isinstance(msg, ErrorMsg):
            log.debug("[client] worker error code=%s message=%s", msg.code, msg.message)
        return self._fail("worker_error", t0)

    def _drop(self, live: _Live, why: str) -> None:
        """Unpublish and close a connection, and wake the connect thread to make a new one."""
        if self._live is live:
            self._live = None
        live.conn.close()
        self.counters["connections_dropped"] += 1
        log.warning("[client] connection epoch=%d dropped: %s", live.epoch, why)
        self._lost.set()

    # ------------------------------------------------------------------ the connect thread

    def _connect_loop(self) -> None:
        lo, hi = self.backoff_s
        delay = lo
        while not self._stop.is_set():
            if self._live is not None:
                self._lost.wait()
                self._lost.clear()
                continue
            try:
                live = self._connect_once()
            except _Disable as e:
                if not self.disabled or str(e) != self.disabled_reason:
                    log.error("[client] disabled: %s (trying again every %.1f s)", e, self.disabled_retry_s)
                self.disabled_reason = str(e)
                self.disabled = True
                self.counters["disabled"] += 1
                self.link_error = str(e)
                self.next_try_at = time.monotonic() + self.disabled_retry_s
                self._retry.wait(self.disabled_retry_s)  # the worker may be fixed and restarted
                self._retry.clear()
                continue
            except (OSError, RemoteProtocolError, TimeoutError) as e:
                self.counters["connect_failures"] += 1
                log.debug("[client] connect to %s:%d failed: %s (retry in %.3fs)", self.host, self.port, e, delay)
                wait = delay * (0.5 + random.random() / 2)
                self.link_error = str(e) or type(e).__name__
                self.next_try_at = time.monotonic() + wait
                self._stop.wait(wait)
                delay = min(hi, delay * 2)
                continue
            delay = lo
            self.link_error = self.next_try_at = None
            if self._stop.is_set():
                live.conn.close()
                return
            if self.disabled:
                log.warning("[client] enabled again: the worker at %s:%d now agrees", self.host, self.port)
                self.disabled, self.disabled_reason = False, None
            # Counted before the connection is visible: whoever sees the new epoch sees it counted.
            self.counters["reconnects" if live.epoch > 1 else "connects"] += 1
            self._live = live
            if live.target_id != self.target_id:  # set_target_id ran during the handshake: do it again
                live.conn.shutdown()
            log.info("[client] connected to %s:%d epoch=%d worker=%s drafter=%s", self.host, self.port,
                     live.epoch, live.welcome.worker_id, live.welcome.drafter)

    def _connect_once(self) -> _Live:
        lay, tid = self.layout, self.target_id
        sock = connect_tcp(self.host, self.port, self.connect_timeout_s)
        ctl = {t: MAX_CONTROL_PAYLOAD for t in (MSG_CHALLENGE, MSG_WELCOME, MSG_ERROR)}
        conn = FramedConnection(sock, Decoder(ctl, max_frame_bytes=APP_HEADER_SIZE + MAX_CONTROL_PAYLOAD))
        ok = False
        try:
            deadline = time.monotonic() + self.connect_timeout_s
            cn = secrets.token_bytes(NONCE_BYTES)
            conn.send_parts([encode_control(Hello(protocol_version=PROTOCOL_VERSION, num_spec=lay.num_spec,
                                                  window=lay.window, row_bytes=lay.row_bytes,
                                                  max_reqs=lay.max_reqs, sampled=lay.sampled,
                                                  client_id=self.client_id[:256], nonce=cn,
                                                  target_id=tid, tap_layers=self.tap_layers,
                                                  row_dtype=self.row_dtype))], deadline)
            msg = self._recv_control(conn, deadline)
            if isinstance(msg, Challenge):
                if self.token is None:
                    raise _Disable("auth_required: the worker requires a shared token; configure the same "
                                   "token file on the proxy")
                if not check_proof(worker_proof(self.token, cn, msg.nonce), msg.proof):
                    raise _Disable("auth_refused: the worker's proof does not match our token (the two sides "
                                   "have different tokens)")
                conn.send_parts([encode_control(Auth(proof=client_proof(self.token, cn, msg.nonce)))], deadline)
                msg = self._recv_control(conn, deadline)
            elif self.token is not None and isinstance(msg, Welcome):
                raise _Disable("auth_refused: the worker did not authenticate itself (it runs without a "
                               "token); refusing an unauthenticated worker")
            if isinstance(msg, ErrorMsg):
                if msg.code in ("mismatch", "auth_refused"):
                    field = f" field={msg.field}" if msg.field else ""
                    raise _Disable(f"{msg.code}:{field} {msg.message}".strip())
                raise RemoteProtocolError(f"worker refused the handshake: {msg.code} {msg.message}",
                                          counter="handshake_refused")
            if not isinstance(msg, Welcome):
                raise RemoteProtocolError(f"unexpected {type(msg).__name__} in handshake", counter="bad_handshake")
            self._check_welcome(msg)
            conn.decoder.set_limits({MSG_REPLY: lay.max_reply_payload(), MSG_ERROR: MAX_CONTROL_PAYLOAD,
                                     MSG_PONG: MAX_CONTROL_PAYLOAD}, max_frame_bytes=self.max_frame_bytes)
            conn.spin_s = self.spin_s  # from here on the STEPs' replies
            self._epoch += 1
            self.welcome = msg
            ok = True
            return _Live(conn, self._epoch, _new_session_id(), msg, tid)
        finally:
            if not ok:
                conn.close()

    @staticmethod
    def _recv_control(conn: FramedConnection, deadline: float):
        f = conn.recv_frame(deadline)
        if f is None:
            raise TimeoutError("handshake timed out")
        return decode_control(f)

    def _check_welcome(self, w: Welcome) -> None:
        lay = self.layout
        if w.protocol_version != PROTOCOL_VERSION:
            raise _Disable(f"mismatch: field=protocol_version worker {w.protocol_version}, "
                           f"client {PROTOCOL_VERSION}")
        for field in ("num_spec", "window", "row_bytes"):
            if getattr(w, field) != getattr(lay, field):
                raise _Disable(f"mismatch: field={field} worker {getattr(w, field)}, client {getattr(lay, field)}")
        if w.max_reqs < lay.max_reqs:
            raise _Disable(f"mismatch: field=max_reqs worker serves {w.max_reqs}, client needs {lay.max_reqs}")
        if lay.sampled and not w.sampled:
            raise _Disable("mismatch: field=sampled the worker does not support sampled mode")
