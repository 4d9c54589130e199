"""Framed socket I/O: the only module that calls sendmsg / recv_into.

The socket is kept non-blocking and waits go through poll() with the caller's deadline, so a send or
a receive never blocks past it, and one syscall pattern serves both the round's timed step() and the
worker's untimed loop. Frames are received through the sans-IO `wire.Decoder`: recv_into writes into
the decoder's buffers, and a payload buffer is only allocated after its header passed the limits.
Rows are sent with scatter-gather sendmsg straight from the caller's buffers; partial sends advance
through memoryview slices, never a copy.

A connection may spin (`spin_s`, the proxy's and the worker's `--spin-us`): a receive that finds nothing
tries again at once for up to that long before it sleeps in poll(), so a frame that arrives meanwhile
costs no wake-up of a sleeping thread (docs/performance.md, "The STEP's round trip beyond the worker's
own time"). The spin is bounded by the caller's deadline, and a thread that spins keeps its CPU busy at
normal priority: off by default.
"""

from __future__ import annotations

import math
import os
import select
import socket
import time
from collections.abc import Sequence

from ..wire import NEED_DATA, Decoder, Frame, LocalProtocolError

__all__ = ["FramedConnection", "PartialSend", "SendTimeout", "byte_view", "connect_tcp", "listen_tcp", "IOV_MAX"]

IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024)


class SendTimeout(TimeoutError):
    """The deadline passed during a send. `partial`: some bytes went out, so the stream is torn and
    the connection must be dropped."""

    def __init__(self, msg: str, *, partial: bool) -> None:
        super().__init__(msg)
        self.partial = partial


def byte_view(p) -> memoryview:
    """A flat unsigned-byte memoryview of a C-contiguous buffer (no copy)."""
    mv = p if isinstance(p, memoryview) else memoryview(p)
    if mv.ndim != 1 or mv.format != "B":
        if not mv.c_contiguous:
            raise LocalProtocolError("a buffer to send is not C-contiguous")
        mv = mv.cast("B")
    return mv


def _configure(sock: socket.socket) -> None:
    sock.setblocking(False)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect_tcp(host: str, port: int, timeout_s: float) -> socket.socket:
    """Connect (blocking, bounded by timeout_s) and return a configured non-blocking socket."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    _configure(sock)
    return sock


def listen_tcp(host: str, port: int, backlog: int = 64) -> socket.socket:
    """A listening socket (SO_REUSEADDR); port 0 picks a free port."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def _timeout_ms(deadline: float | None) -> int | None:
    """poll() timeout for a monotonic deadline: None blocks, 0 does not wait."""
    if deadline is None:
        return None
    rem = deadline - time.monotonic()
    return 0 if rem <= 0 else max(1, math.ceil(rem * 1000.0))


class PartialSend:
    """The views of a send in progress, the next one to send, and whether any byte went (a send cut
    short after some bytes tears the stream)."""

    __slots__ = ("views", "i", "sent_any")

    def __init__(self, views: list[memoryview]) -> None:
        self.views = views
        self.i = 0
        self.sent_any = False


class FramedConnection:
    """One connected socket plus its frame decoder. Not thread-safe: one owner thread at a time
    (the client hands it from its connect thread to the stepping thread once; the worker has one
    thread per connection). close() may be called from any thread."""

    def __init__(self, sock: socket.socket, decoder: Decoder) -> None:
        _configure(sock)
        self.sock = sock
        self.decoder = decoder
        self._poll_in = select.poll()
        self._poll_in.register(sock.fileno(), select.POLLIN)
        self._poll_out = select.poll()
        self._poll_out.register(sock.fileno(), select.POLLOUT)
        self.closed = False
        self.bytes_sent = 0
        self.bytes_received = 0
        self.spin_s = 0.0  # how long a receive retries before it sleeps (the module docstring)

    def send_parts(self, parts: Sequence, deadline: float | None = None) -> None:
        """Send the concatenation of parts (bytes-like buffers) completely, or raise SendTimeout /
        OSError. One sendmsg for up to IOV_MAX parts at a time; a short send resumes mid-buffer. One
        part (the worker's every REPLY) goes by one send(), without the iovec list and its bookkeeping."""
        if len(parts) == 1:
            v = byte_view(parts[0])
            try:
                n = self.sock.send(v)
            except BlockingIOError:
                n = 0
            self.bytes_sent += n
            if n == len(v):
                return
            ps = PartialSend([v[n:]])
            ps.sent_any = n > 0
        else:
            ps = self.begin_send(parts)
        while not self.send_some(ps):
            ms = _timeout_ms(deadline)
            if ms == 0:
                raise SendTimeout("send deadline passed", partial=ps.sent_any)
            self._poll_out.poll(ms)

    @staticmethod
    def begin_send(parts: Sequence) -> PartialSend:
        """A send in progress (`send_some` advances it): a pool sends to several workers at once."""
        return PartialSend([v for v in (byte_view(p) for p in parts) if len(v)])

    def send_some(self, ps: PartialSend) -> bool:
        """Send what the socket takes now, without waiting; True once all of `ps` went. OSError on
        socket errors."""
        views = ps.views
        sock = self.sock
        while ps.i < len(views):
            try:
                n = sock.sendmsg(views[ps.i:ps.i + IOV_MAX])
            except BlockingIOError:
                return False
            if n:
                ps.sent_any = True
                self.bytes_sent += n
            while n:
                k = len(views[ps.i])
                if n >= k:
                    n -= k
                    ps.i += 1
                else:
                    views[ps.i] = views[ps.i][n:]
                    n = 0
        return True

    def recv_frame(self, deadline: float | None = None) -> Frame | None:
        """The next frame, or None once the deadline passed (a partial frame stays buffered for
        the next call). Raises ConnectionError when the peer closed, RemoteProtocolError on a bad
        header (drop the connection), OSError on socket errors."""
        dec = self.decoder
        sock = self.sock
        spin_until = None  # set at the first empty receive
        if deadline is None and not self.spin_s and not dec.buffered_bytes and not dec.has_frame:
            # untimed (the worker's loop between STEPs): nothing is buffered, and the next frame is most
            # likely still to come, so wait first rather than fail a recv (its exception) and then wait
            self._poll_in.poll()
        while True:
            f = dec.next_frame()
            if f is not NEED_DATA:
                return f
            try:
                n = sock.recv_into(dec.recv_buffer())
            except BlockingIOError:
                if self.spin_s:
                    now = time.monotonic()
                    if spin_until is None:
                        spin_until = now + self.spin_s if deadline is None else min(now + self.spin_s, deadline)
                    if now < spin_until:
                        continue
                ms = _timeout_ms(deadline)
                if ms == 0:
                    return None
                self._poll_in.poll(ms)
                continue
            if n == 0:
                raise ConnectionError("peer closed the connection")
            self.bytes_received += n
            dec.advance(n)

    def idle(self) -> bool:
        """Nothing ever received and nothing waiting to be: a peer that has not spoken yet. Any
        thread may ask (its own poll object: the owner's may be in use)."""
        if self.bytes_received or self.decoder.buffered_bytes:
            return False
        p = select.poll()
        try:
            p.register(self.sock.fileno(), select.POLLIN)
        except (OSError, ValueError):
            return False  # closed meanwhile
        return not p.poll(0)

    def shutdown(self) -> None:
        """Wake any thread blocked on this socket (it then sees the connection closed)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.shutdown()
        try:
            self.sock.close()
        except OSError:
            pass
