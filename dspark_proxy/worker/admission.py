"""Who gets into the draft worker: the handshake (FORMAT.md) and the two budgets around it.

Kept apart from the STEP path (server.py) because it is the worker's defence against peers that do
not speak: connections still in the handshake (`pending`) have their own small budget
(`max_handshakes`) and a short timeout; when it is full, a new socket displaces the oldest one that
has not sent a byte, so idle unauthenticated sockets cannot keep a proxy out. `max_connections`
counts only connections that passed the handshake. Thread ownership: `conns`, `pending` and
`threads` are guarded by `lock` (the accept thread adds, connection threads remove).
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..link.conn import FramedConnection
from ..ops.logthrottle import KeyedThrottle
from ..wire import (
    APP_HEADER_SIZE,
    MAX_CONTROL_PAYLOAD,
    MSG_AUTH,
    MSG_HELLO,
    NONCE_BYTES,
    PROTOCOL_VERSION,
    Auth,
    Challenge,
    Decoder,
    ErrorMsg,
    Hello,
    Welcome,
    WireLayout,
    check_proof,
    client_proof,
    decode_control,
    encode_control,
    worker_proof,
)
from .terms import Refused

__all__ = ["Admission", "send_error"]

log = logging.getLogger("dspark_proxy.worker.server")  # one logger for the worker, as serve.py


def send_error(conn: FramedConnection, code: str, message: str, *, field: str | None = None,
               session: int = 0, epoch: int = 0, step_id: int = 0) -> None:
    """Best effort: the peer may already be gone, and an ERROR is a courtesy before the close."""
    try:
        conn.send_parts([encode_control(ErrorMsg(code=code, message=message[:4000], field=field),
                                        session=session, epoch=epoch, step_id=step_id)],
                        time.monotonic() + 1.0)
    except OSError:
        pass


class Admission:
    """The worker's connection table, its two budgets, and the handshake that moves a connection
    from the first to the second."""

    def __init__(self, layout: WireLayout, *, token: bytes | None, worker_id: str, max_connections: int,
                 max_handshakes: int, handshake_timeout_s: float, counters: Counter[str],
                 terms: Callable[[Hello, Any], WireLayout],
                 charge: Callable[[int, WireLayout], str | None] | None = None) -> None:
        if max_handshakes < 1:
            raise ValueError(f"max_handshakes={max_handshakes}: at least 1")
        self.layout = layout
        self.token = token
        self.worker_id = worker_id
        self.max_connections = max_connections
        self.max_handshakes = max_handshakes
        self.handshake_timeout_s = handshake_timeout_s
        self.counters = counters
        self.terms = terms  # the HELLO -> the layout served, or Refused (terms.py)
        self.charge = charge  # (connection, its agreed layout) -> refusal or None (one session's bytes, session.py)
        self.lock = threading.Lock()
        self.conns: dict[int, FramedConnection] = {}
        self.pending: dict[int, FramedConnection] = {}  # still in the handshake, oldest first
        self.threads: dict[int, threading.Thread] = {}
        self._next_conn = 0
        # a proxy refused for its settings retries every couple of seconds: one WARNING a minute per cause
        # and peer host, with the count of those held back (the counters count every one)
        self.refusal_log = KeyedThrottle(60.0)

    # ------------------------------------------------------------------ the table

    def add(self, sock: socket.socket, peer,
            serve: Callable[[int, FramedConnection, Any], None]) -> threading.Thread:
        """A new socket, in the handshake budget (displacing an idle one if full); the thread that will
        run serve(cid, conn, peer) on it, unstarted."""
        with self.lock:
            if len(self.pending) >= self.max_handshakes:
                self._evict_handshake()
            cid = self._next_conn = self._next_conn + 1
            conn = FramedConnection(sock, Decoder({MSG_HELLO: MAX_CONTROL_PAYLOAD},
                                                  max_frame_bytes=APP_HEADER_SIZE + MAX_CONTROL_PAYLOAD,
                                                  reuse_payload=True))
            self.conns[cid] = conn
            self.pending[cid] = conn
            t = self.threads[cid] = threading.Thread(target=serve, args=(cid, conn, peer),
                                                     name=f"dspark-worker-conn-{cid}", daemon=True)
        self.counters["connections"] += 1
        return t

    def _evict_handshake(self) -> None:
        """The handshake budget is full (under lock): make room by closing the oldest connection
        that has not sent a byte (a proxy sends its HELLO at once), else the oldest of all. Idle
        sockets can so delay, never lock out, a peer that speaks."""
        victim = next((k for k, c in self.pending.items() if c.idle()), None)
        if victim is None:
            victim = next(iter(self.pending))
        self.pending.pop(victim).shutdown()
        self.counters["handshakes_evicted"] += 1

    def _admit(self, cid: int) -> bool:
        """The handshake passed: leave the handshake budget for the connection limit, which counts
        only connections that passed theirs."""
        with self.lock:
            if self.pending.pop(cid, None) is None:
                return False  # evicted meanwhile: its socket is shut down
            return len(self.conns) - len(self.pending) <= self.max_connections

    def forget(self, cid: int) -> None:
        """The connection's thread is ending."""
        with self.lock:
            self.conns.pop(cid, None)
            self.pending.pop(cid, None)
            self.threads.pop(cid, None)

    def live(self) -> tuple[list[FramedConnection], list[threading.Thread]]:
        """The connections and their threads now (stop() shuts and joins them)."""
        with self.lock:
            return list(self.conns.values()), list(self.threads.values())

    # ------------------------------------------------------------------ the handshake

    def handshake(self, cid: int, conn: FramedConnection, peer, *, drafter: str,
                  vocab_size: int) -> WireLayout | None:
        """HELLO, the challenge if there is a token, the terms (terms.py: the shapes adopted or refused,
        the target), then the connection limit: the connection's layout on WELCOME, None (after an
        ERROR where one helps) to close."""
        deadline = time.monotonic() + self.handshake_timeout_s
        f = conn.recv_frame(deadline)
        if f is None:
            self.counters["handshake_timeout"] += 1
            return None
        hello = decode_control(f)
        assert isinstance(hello, Hello)  # the decoder only accepts HELLO frames here
        if hello.protocol_version != PROTOCOL_VERSION:  # before auth: the rest may not even parse alike
            return self._refuse(conn, peer, Refused("protocol_version", f"protocol version "
                                                    f"{hello.protocol_version}, worker speaks {PROTOCOL_VERSION}"))
        if self.token is not None and not self._authenticate(conn, peer, hello, deadline):
            return None
        try:
            agreed = self.terms(hello, peer)
        except Refused as e:
            return self._refuse(conn, peer, e)
        if not self._charge_memory(cid, conn, agreed):
            return None
        if not self._admit(cid):
            self.counters["connections_refused"] += 1
            send_error(conn, "busy", f"the worker serves {self.max_connections} connections already")
            return None
        a = agreed
        # counted before the WELCOME: a peer that has it finds the handshake counted
        self.counters["handshakes"] += 1
        adopted = [k for k in ("num_spec", "window", "row_bytes", "max_reqs")
                   if getattr(a, k) != getattr(self.layout, k)]
        if adopted:
            self.counters["handshakes_adopted"] += 1
        conn.send_parts([encode_control(Welcome(protocol_version=PROTOCOL_VERSION, num_spec=a.num_spec,
                                                window=a.window, row_bytes=a.row_bytes, max_reqs=a.max_reqs,
                                                sampled=a.sampled, worker_id=self.worker_id, drafter=drafter,
                                                vocab_size=vocab_size))],
                        deadline)
        log.info("[worker] peer=%s client=%s ready N=%d W=%d row_bytes=%d max_reqs=%d sampled=%s%s", peer,
                 hello.client_id, a.num_spec, a.window, a.row_bytes, a.max_reqs, a.sampled,
                 f" (adopted from the HELLO: {', '.join(adopted)})" if adopted else "")
        return agreed

    def _refuse(self, conn: FramedConnection, peer, e: Refused) -> None:
        """A HELLO this worker cannot serve: ERROR mismatch naming the field, then the close."""
        self.counters["handshake_mismatch"] += 1
        self.refusal_log.log(log, logging.WARNING, ("mismatch", _host(peer), str(e)), "[worker] peer=%s mismatch %s",
                             peer, e)
        send_error(conn, "mismatch", str(e), field=e.field)

    def _charge_memory(self, cid: int, conn: FramedConnection, agreed: WireLayout) -> bool:
        """The shapes adopted at HELLO are charged to the worker's memory budget now (one session of them,
        all its slots can hold), shared fairly by the proxies connected (SessionTable.charge_conn): past
        it, the handshake is refused naming the bytes."""
        refusal = self.charge(cid, agreed) if self.charge is not None else None
        if refusal is None:
            return True
        self.counters["handshake_memory_refused"] += 1
        self.refusal_log.log(log, logging.WARNING, ("memory_budget",), "[worker] conn=%d refused: %s", cid, refusal)
        send_error(conn, "memory_budget", refusal, field="max_reqs")
        return False

    def _authenticate(self, conn: FramedConnection, peer, hello: Hello, deadline: float) -> bool:
        """The HMAC challenge-response: nothing else is read from a peer before it passes."""
        assert self.token is not None
        wn = secrets.token_bytes(NONCE_BYTES)
        conn.decoder.set_limits({MSG_AUTH: MAX_CONTROL_PAYLOAD},
                                max_frame_bytes=APP_HEADER_SIZE + MAX_CONTROL_PAYLOAD)
        conn.send_parts([encode_control(Challenge(nonce=wn, proof=worker_proof(self.token, hello.nonce, wn)))],
                        deadline)
        f = conn.recv_frame(deadline)
        if f is None:
            self.counters["handshake_timeout"] += 1
            return False
        auth = decode_control(f)
        assert isinstance(auth, Auth)
        if not check_proof(client_proof(self.token, hello.nonce, wn), auth.proof):
            self.counters["auth_refused"] += 1
            self.refusal_log.log(log, logging.WARNING, ("auth", _host(peer)), "[worker] peer=%s refused: wrong token",
                                 peer)
            send_error(conn, "auth_refused", "wrong token")
            return False
        return True


def _host(peer: Any) -> str:
    """A peer's host (its port changes with every reconnect, its host does not)."""
    return str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)
