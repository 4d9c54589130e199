"""The draft worker's server: accepts connections, handshakes, and answers STEPs (FORMAT.md).

One thread per connection (a worker serves a handful of proxies); sessions are shared across
connections in a `SessionTable` and each session's steps are serialised by its own lock. The STEP
path decodes the frame into views (no copy of the rows until they are written into the slot
windows), applies entries in batch order, drafts for the usable requests, and sends one REPLY
buffer. Thread ownership: the connection table is admission.py's, under its lock; `counters` is
incremented from connection threads (single dict ops under the GIL) and read by anyone.

Who gets in (the handshake, its budget and the connection limit) is admission.py's.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import socket
import threading
import time
from collections import Counter, OrderedDict
from typing import NamedTuple

import numpy as np

from .. import __version__
from ..crc import WindowShifts
from ..link.conn import FramedConnection, listen_tcp
from ..ops.keep_awake import KeepAwake
from ..ops.metrics import LATENCY_BOUNDS_S
from ..wire import (
    APP_HEADER_SIZE,
    MAX_CONTROL_PAYLOAD,
    MSG_NEW_SESSION,
    MSG_PING,
    MSG_REPLY,
    MSG_STEP,
    RF_NEED_DRAFT,
    Frame,
    Hello,
    NewSession,
    Ping,
    Pong,
    RemoteProtocolError,
    ReplyWriter,
    StepView,
    WireLayout,
    decode_control,
    decode_step,
    encode_control,
    pack_app_header,
)
from .admission import Admission, send_error
from .drafters import Drafter, drafter_slot_bytes, make_drafter
from .faults import FaultAction, FaultCounter, FaultPlan
from .metrics import WorkerObserved
from .serve import serve_step
from .session import Session, SessionRefused, SessionTable
from .terms import agree

__all__ = ["WorkerServer", "is_loopback", "CRASH_EXIT_CODE"]

log = logging.getLogger(__name__)

CRASH_EXIT_CODE = 70  # os._exit code of the crash_after fault
DEFAULT_BUDGET_SESSIONS = 8  # without --memory-budget-mb: windows for 8 sessions of the worker's max_reqs
DEFAULT_BUDGET_ADOPTING = 1 << 30  # ... and at least this while adopting the proxies' shapes (terms.py)
_SERVED_KEPT = 16  # drafters kept for layouts other than the worker's own (a connection keeps its own)
MAX_WINDOW = 65536  # default --max-window: the largest window a proxy can be started with (config.py)


def is_loopback(host: str) -> bool:
    """True when every address host resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    try:
        return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)
    except ValueError:
        return False


class WorkerServer:
    """The remote side of the protocol: windows per session and slot, and a drafter.

    Without a token it refuses to bind a non-loopback address unless insecure=True. With a token
    every peer must pass the HMAC challenge-response before anything else.
    """

    def __init__(self, host: str, port: int, *, num_spec: int, window: int, row_bytes: int, max_reqs: int,
                 drafter: str = "integrity", sampled: bool = False, token: bytes | None = None,
                 insecure: bool = False, faults: FaultPlan | None = None, torch_device: str = "cpu",
                 weights: str | None = None, seed: int = 0, max_slots: int = 1 << 20,
                 max_sessions: int = 64, max_connections: int = 64, max_frame_bytes: int | None = None,
                 handshake_timeout_s: float = 1.0, memory_budget_bytes: int | None = None,
                 max_sessions_per_conn: int = 4, max_handshakes: int = 16, adopt_shapes: bool = True,
                 max_window: int = MAX_WINDOW, target: str | None = None,
                 row_dtype: str = "bfloat16", gpu_memory_budget_mb: int = 0, keep_awake_ms: float = 0.0,
                 spin_us: float = 0.0) -> None:
        self.layout = WireLayout(num_spec=num_spec, window=window, row_bytes=row_bytes, max_reqs=max_reqs,
                                 sampled=sampled)
        if token is not None and len(token) == 0:
            raise ValueError("empty token: give a non-empty shared token or none")
        if token is None and not insecure and not is_loopback(host):
            raise ValueError(f"refusing to listen on non-loopback address {host!r} without a token: "
                             "give --token-file, or --insecure to accept unauthenticated peers")
        self.host = host
        self._port = port
        self.drafter_name = drafter
        self.adopt_shapes = adopt_shapes
        self.token = token
        self.faults = faults or FaultPlan()
        self._max_frame_bytes = max_frame_bytes  # None: each connection's largest legal STEP
        self.max_frame_bytes = max_frame_bytes or (APP_HEADER_SIZE + self.layout.max_step_payload())
        self.worker_id = f"dspark-worker/{__version__} pid={os.getpid()}"
        self.counters: Counter[str] = Counter()
        self.drafter: Drafter | None = None  # made at start()
        self.observed = WorkerObserved(LATENCY_BOUNDS_S)  # the drafter's time a round, rounds per peer
        self._peer_of: dict[int, str] = {}  # connection id -> the peer's host (worker/metrics.py)
        self.admission = Admission(self.layout, token=token, worker_id=self.worker_id,
                                   max_connections=max_connections, max_handshakes=max_handshakes,
                                   handshake_timeout_s=handshake_timeout_s, counters=self.counters,
                                   terms=self._terms,
                                   charge=self._charge)
        if max_window < window:
            raise ValueError(f"max_window {max_window} is below this worker's own window {window}")
        self.max_window = max_window
        # adopting: a session's slots are bounded by its connection's agreed max_reqs and the budget; every
        # slot is charged all it can hold, the drafter's own per-slot state too (session.py)
        self.sessions = SessionTable(window, row_bytes, max_slots if adopt_shapes else min(max_slots, max_reqs),
                                     max_sessions, chains=drafter == "integrity", per_conn=max_sessions_per_conn,
                                     drafter_slot_bytes=lambda w, rb: drafter_slot_bytes(self.drafter, w, rb))
        one = self.sessions.session_bytes(max_reqs)  # a session of this worker's max_reqs (the drafter's part
        # is checked again at start, once the drafter is made)
        budget = memory_budget_bytes or max(DEFAULT_BUDGET_SESSIONS * one, DEFAULT_BUDGET_ADOPTING if adopt_shapes else 0)
        self.budget_bytes = self.sessions.budget_bytes = budget
        self._check_budget()
        self._drafter_args = dict(num_spec=num_spec, window=window, row_bytes=row_bytes, device=torch_device,
                                  weights=weights, seed=seed, target=target, row_dtype=row_dtype,
                                  gpu_memory_budget_mb=gpu_memory_budget_mb, max_reqs=max_reqs)
        self._served: OrderedDict[tuple[int, int, int], _Served] = OrderedDict()  # by (N, W, row_bytes)
        self._served_lock = threading.Lock()
        self._draft_lock = threading.Lock()
        self._fault_counter = FaultCounter(self.faults)
        self.keep_awake_ms = keep_awake_ms
        self.spin_s = spin_us / 1e6  # each connection waits for its next STEP spinning this long (--spin-us)
        self._awake = KeepAwake(0.0)  # start() makes the configured one (spinners live while it serves)
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._port

    def _check_budget(self) -> None:
        """ValueError when the budget cannot hold one session of this worker's own shapes."""
        one = self.sessions.session_bytes(self.layout.max_reqs)
        if self.budget_bytes < one:
            lay = self.layout
            raise ValueError(f"memory budget of {self.budget_bytes} bytes is below one session's slots ({one} "
                             f"bytes: max_reqs {lay.max_reqs} x (window {lay.window} x row_bytes {lay.row_bytes}"
                             " + chains and the drafter's state)); raise --memory-budget-mb")

    def _charge(self, cid: int, layout: WireLayout) -> str | None:
        """Admission's HELLO charge: one session of the agreed shapes, all its slots can hold."""
        need = self.sessions.session_bytes(layout.max_reqs, layout.window, layout.row_bytes)
        return self.sessions.charge_conn(cid, need)

    @property
    def drafter_identity(self) -> str:
        a = self._drafter_args
        if self.drafter_name == "dspark":
            return f"dspark head={a['weights']}"
        extra = f" weights={a['weights']}" if a["weights"] else f" seed={a['seed']}"
        return self.drafter_name + ("" if self.drafter_name == "integrity" else extra)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Create the drafter, bind and listen, and start accepting on a thread."""
        if self._listener is not None:
            return
        self.drafter = make_drafter(self.drafter_name, **self._drafter_args)
        self._check_budget()  # now with the drafter's per-slot state
        self._awake = KeepAwake(self.keep_awake_ms, who="worker")
        try:
            self._listener = listen_tcp(self.host, self._port)
        except OSError as e:
            shown = f"[{self.host}]" if ":" in self.host else self.host
            raise OSError(f"--listen {shown}:{self._port}: cannot listen there ({e.strerror or e})") from None
        self._port = self._listener.getsockname()[1]
        log.info("[worker] listening host=%s port=%d drafter=%s N=%d W=%d row_bytes=%d max_reqs=%d "
                 "sampled=%s auth=%s faults=%s", self.host, self._port, self.drafter_identity,
                 self.layout.num_spec, self.layout.window, self.layout.row_bytes, self.layout.max_reqs,
                 self.layout.sampled, self.token is not None, self.faults)
        self._accept_thread = threading.Thread(target=self._accept_loop, name="dspark-worker-accept",
                                               daemon=True)
        self._accept_thread.start()

    def request_stop(self) -> None:
        """Signal-handler safe: only sets the stop flag; serve_forever() then stops the server."""
        self._stop.set()

    def serve_forever(self) -> None:
        """Start if needed and block until stop is requested; then shut down cleanly."""
        self.start()
        while not self._stop.wait(0.5):
            pass
        self.stop()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Idempotent: close the listener and every connection, join the threads."""
        self._stop.set()
        lst, self._listener = self._listener, None
        if lst is not None:
            try:
                lst.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            lst.close()
        conns, threads = self.admission.live()
        for c in conns:
            c.shutdown()
        if self._accept_thread is not None and self._accept_thread is not threading.current_thread():
            self._accept_thread.join(timeout_s)
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout_s)
        self._awake.close()

    def __enter__(self) -> WorkerServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ connections

    def _accept_loop(self) -> None:
        lst = self._listener
        while not self._stop.is_set() and lst is not None:
            try:
                sock, peer = lst.accept()
            except OSError:
                if self._stop.is_set():
                    break
                self.counters["accept_errors"] += 1
                self._stop.wait(0.05)
                continue
            t = self.admission.add(sock, peer, self._conn_main)
            t.start()

    def _conn_main(self, cid: int, conn: FramedConnection, peer) -> None:
        self.sessions.open_conn(cid)
        self._peer_of[cid] = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)
        try:
            layout = self.admission.handshake(cid, conn, peer, drafter=self.drafter_identity,
                                              vocab_size=int(getattr(self.drafter, "vocab_size", 0)))
            if layout is None:
                return
            served = self._served_for(layout)
            conn.decoder.set_limits({MSG_STEP: layout.max_step_payload(),
                                     MSG_NEW_SESSION: MAX_CONTROL_PAYLOAD, MSG_PING: MAX_CONTROL_PAYLOAD},
                                    max_frame_bytes=self._max_frame_bytes
                                    or APP_HEADER_SIZE + layout.max_step_payload())
            conn.spin_s = self.spin_s
            while not self._stop.is_set():
                f = conn.recv_frame(None)
                if f is None:
                    continue
                if not self._on_frame(cid, conn, f, layout, served):
                    break
        except RemoteProtocolError as e:
            self.counters[e.counter] += 1
            log.warning("[worker] conn=%d peer=%s dropped: %s", cid, peer, e)
        except (ConnectionError, OSError) as e:
            log.debug("[worker] conn=%d peer=%s closed: %s", cid, peer, e)
        finally:
            dropped = self.sessions.close_conn(cid)  # first: a peer that saw the close finds them gone
            conn.close()
            self.admission.forget(cid)
            self._peer_of.pop(cid, None)
            log.info("[worker] conn=%d peer=%s closed sessions_dropped=%d", cid, peer, dropped)

    # ------------------------------------------------------------------ frames

    def _on_frame(self, cid: int, conn: FramedConnection, f: Frame, layout: WireLayout, served: _Served) -> bool:
        """Handle one frame; False closes the connection."""
        h = f.header
        if h.type == MSG_STEP:
            return self._on_step(cid, conn, f, layout, served)
        try:
            msg = decode_control(f)
        except RemoteProtocolError as e:
            self.counters[e.counter] += 1
            send_error(conn, e.counter, str(e), session=h.session, epoch=h.epoch, step_id=h.step_id)
            return True
        if isinstance(msg, NewSession):
            self.sessions.drop(msg.previous, cid)
            self.counters["new_sessions"] += 1
            log.info("[worker] conn=%d new session=%d previous=%d reason=%s", cid, h.session, msg.previous,
                     msg.reason)
        elif isinstance(msg, Ping):
            conn.send_parts([encode_control(Pong(token=msg.token), session=h.session, epoch=h.epoch,
                                            step_id=h.step_id)], time.monotonic() + 1.0)
        return True

    def _on_step(self, cid: int, conn: FramedConnection, f: Frame, layout: WireLayout, served: _Served) -> bool:
        t0 = time.perf_counter()
        h = f.header
        action = self._fault_counter.next_step()
        if action is FaultAction.CRASH:
            log.error("[worker] fault: crash after %s steps", self.faults.crash_after)
            logging.shutdown()
            os._exit(CRASH_EXIT_CODE)
        if action is FaultAction.STALL:
            self.counters["fault_stall"] += 1
            self._stop.wait()
            return False
        if action is FaultAction.DROP:
            self.counters["fault_drop"] += 1
            return False
        try:
            sv = decode_step(f, layout)
        except RemoteProtocolError as e:
            self.counters[e.counter] += 1
            send_error(conn, e.counter, str(e), session=h.session, epoch=h.epoch, step_id=h.step_id)
            return True
        try:
            session = self.sessions.get(h.session, cid, layout.max_reqs, window=layout.window,
                                        row_bytes=layout.row_bytes)
        except SessionRefused as e:
            self.counters[f"session_refused_{e.code}"] += 1
            (log.warning if self.counters[f"session_refused_{e.code}"] == 1 else log.debug)(
                "[worker] conn=%d session=%d refused (%s): %s", cid, h.session, e.code, e)
            send_error(conn, e.code, str(e), session=h.session, epoch=h.epoch, step_id=h.step_id)
            return True
        out = ReplyWriter(sv.n_req, layout.num_spec, sv.step_flags)
        t_draft = time.perf_counter()
        with session.lock:
            self._serve(session, sv, out, layout, served)
        self.observed.round(self._peer_of.get(cid, "?"), time.perf_counter() - t_draft)
        self.counters["steps"] += 1
        self.counters["rows"] += sv.n_rows
        delay_ms = self.faults.delay_ms
        if self.faults.draft_delay_ms > 0 and np.any(sv.entries["flags"] & RF_NEED_DRAFT):
            delay_ms += self.faults.draft_delay_ms
        if delay_ms > 0:
            self._stop.wait(delay_ms / 1000.0)
        step_id = h.step_id
        if action is FaultAction.WRONG_STEP:
            self.counters["fault_wrong_step"] += 1
            step_id = (step_id + 1) & (2**64 - 1)
        session_id = h.session
        if action is FaultAction.WRONG_SESSION:
            self.counters["fault_wrong_session"] += 1
            session_id ^= 1
        buf = out.finish(session=session_id, epoch=h.epoch, step_id=step_id,
                         worker_us=(time.perf_counter() - t0) * 1e6)
        if action is FaultAction.GARBAGE:
            self.counters["fault_garbage"] += 1
            junk = bytearray(APP_HEADER_SIZE) + os.urandom(secrets.randbelow(256))
            pack_app_header(junk, 0, MSG_REPLY, session=h.session, epoch=h.epoch, step_id=step_id,
                            payload_len=len(junk) - APP_HEADER_SIZE)
            buf = memoryview(junk)
        if action is FaultAction.DUPLICATE:
            self.counters["fault_duplicate_reply"] += 1
            conn.send_parts([buf, buf])
            return True
        conn.send_parts([buf])
        if self.keep_awake_ms > 0 and (sv.entries["flags"] & RF_NEED_DRAFT).any():
            # the next STEP's CPU awake and warm; not after a STEP that asked no drafts (the proxy's gate
            # paused them: nobody waits on the next reply, and a spinning CPU can slow the engine's)
            self._awake.kick()
        return True

    def _serve(self, session: Session, sv: StepView, out: ReplyWriter, layout: WireLayout, served: _Served) -> None:
        """Apply the entries in order and draft for the usable ones (worker/serve.py, shared with the
        in-process worker)."""
        serve_step(session, sv.entries, sv.rows, sv.sample_meta, out, layout, served.drafter, self.counters,
                   shift_w=served.shift_w, draft_lock=self._draft_lock, drafter_name=self.drafter_name)

    # ------------------------------------------------------------------ terms (terms.py)

    def _terms(self, hello: Hello, peer) -> WireLayout:
        """The layout a HELLO is served under, or terms.Refused naming the field (Admission calls it)."""
        return agree(hello, self.layout, drafter=self.drafter, adopt=self.adopt_shapes,
                     budget_bytes=self.budget_bytes, peer=peer, max_window=self.max_window,
                     session_bytes=self.sessions.session_bytes)

    def _served_for(self, layout: WireLayout) -> _Served:
        """The drafter (and the integrity drafter's CRC shifts) for an agreed layout: the worker's own
        drafter where its shapes are those, else one made for them, kept for the next connection. Made
        outside the lock, so a connection of new shapes never holds up another's first STEP (two
        connections of one new layout may both make it: the first kept wins)."""
        key = (layout.num_spec, layout.window, layout.row_bytes)
        with self._served_lock:
            got = self._served.get(key)
            if got is not None:
                self._served.move_to_end(key)
                return got
        own = (self.layout.num_spec, self.layout.window, self.layout.row_bytes)
        a = {**self._drafter_args, "num_spec": key[0], "window": key[1], "row_bytes": key[2]}
        drafter = self.drafter if key == own else make_drafter(self.drafter_name, **a)
        # integrity: shift(w * row_bytes) for w = 0..W, to assemble window CRCs from the slots' chains
        # (about 2 sqrt(W) tables past 512 rows, built in milliseconds: crc.py)
        shift_w = WindowShifts(key[2], key[1]) if self.drafter_name == "integrity" else None
        with self._served_lock:
            got = self._served.setdefault(key, _Served(drafter, shift_w))
            self._served.move_to_end(key)
            while len(self._served) > _SERVED_KEPT:  # open connections keep theirs
                self._served.popitem(last=False)
            return got


class _Served(NamedTuple):
    """What one agreed layout's STEPs are drafted with."""

    drafter: Drafter
    shift_w: WindowShifts | None
