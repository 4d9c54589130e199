"""The baselines' other side: small echo processes, and the engine-side loop that times each.

    python -m dspark_proxy.bench.peers futex PATH SPIN     # wait for ping >= i, store pong = i
    python -m dspark_proxy.bench.peers pipe FD             # multiprocessing Connection: echo bytes
    python -m dspark_proxy.bench.peers tcp                 # loopback TCP: echo 8 bytes
    python -m dspark_proxy.bench.peers sink                # loopback TCP: read a sized message, answer

Each prints one `ready ...` line on stdout once it can be timed. The futex peer goes through our own
hostflag words (`hostflag.store` / `wait_ge`, the same C calls as the hand-off) in a small file in
/dev/shm; SPIN is `adaptive` (the product's `AdaptiveSpin` policy) or `0` (sleep in the futex at once).
"""

from __future__ import annotations

import mmap
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Pipe

import numpy as np

from ..ops.launch import readable
from ..shm import hostflag as hf
from ..shm.hostflag import AdaptiveSpin
from .procs import on_cpu

__all__ = ["Peer", "spawn_peer", "time_futex", "time_pipe", "time_tcp", "RawSink", "recv_exact"]

PING_OFF, PONG_OFF = 0, 128  # one word per 128-byte line, like the segment's words
STOP = 1 << 62


# ---------------------------------------------------------------- child side

def _futex_child(path: str, spin: str) -> None:
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, 4096)
    os.close(fd)
    # the peer (our parent) is pinned before it starts us: the product's policy knows its peer's pid
    policy = AdaptiveSpin(peer_pid=os.getppid()) if spin == "adaptive" else None
    print("ready", flush=True)
    i = 1
    while True:
        t0 = hf.monotonic_ns()
        ok = hf.wait_ge(mm, PING_OFF, i, 1.0, policy.spin_ns if policy else 0)
        if policy:
            policy.update(hf.monotonic_ns() - t0, ok)
        if not ok:
            continue
        v = hf.load(mm, PING_OFF)
        if v >= STOP:
            return
        hf.store(mm, PONG_OFF, v)
        i = v + 1


def _pipe_child(fd: int) -> None:
    conn = Connection(fd)
    print("ready", flush=True)
    try:
        while True:
            conn.send_bytes(conn.recv_bytes())
    except (EOFError, OSError):
        return


def _tcp_listen() -> socket.socket:
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    print(f"ready {lst.getsockname()[1]}", flush=True)
    lst.settimeout(30.0)
    return lst


def recv_exact(s: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        k = s.recv_into(view[got:])
        if k == 0:
            return False
        got += k
    return True


def _tcp_child() -> None:
    s, _ = _tcp_listen().accept()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = memoryview(bytearray(8))
    while recv_exact(s, buf):
        s.sendall(buf)


def _sink_child() -> None:
    """[u64 payload bytes][u64 reply bytes][payload] in, `reply bytes` out: the raw-socket floor of a
    STEP/REPLY round trip (one receive into a reused buffer, no parsing, no work)."""
    s, _ = _tcp_listen().accept()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = memoryview(bytearray(64 << 20))
    reply = bytes(4 << 20)
    hdr = memoryview(bytearray(16))
    while recv_exact(s, hdr):
        total, rlen = int.from_bytes(hdr[:8], "little"), int.from_bytes(hdr[8:], "little")
        while total:
            k = min(total, len(buf))
            if not recv_exact(s, buf[:k]):
                return
            total -= k
        s.sendall(reply[:rlen])


def main(argv: list[str]) -> None:
    kind = argv[0]
    if kind == "futex":
        _futex_child(argv[1], argv[2])
    elif kind == "pipe":
        _pipe_child(int(argv[1]))
    elif kind == "tcp":
        _tcp_child()
    elif kind == "sink":
        _sink_child()
    else:
        raise SystemExit(f"unknown peer {kind!r}")


# ---------------------------------------------------------------- parent side

@dataclass
class Peer:
    """A running echo process; `close()` ends it for sure (idempotent)."""

    proc: subprocess.Popen
    info: str = ""
    cleanup: list = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        for fn in self.cleanup:
            try:
                fn()
            except OSError:
                pass
        self.cleanup.clear()
        if self.proc.poll() is None:
            try:
                self.proc.wait(2.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def spawn_peer(*args: str, pass_fds: tuple[int, ...] = (), cpu: int | None = None,
               timeout_s: float = 20.0) -> Peer:
    """Start `python -m dspark_proxy.bench.peers ARGS` (on `cpu` only, if given); returns once it
    printed `ready`."""
    cmd = [sys.executable, "-m", "dspark_proxy.bench.peers", *args]
    with on_cpu(cpu):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, pass_fds=pass_fds)
    assert proc.stdout is not None
    line = proc.stdout.readline() if readable(proc.stdout, timeout_s) else ""
    if not line.startswith("ready"):
        proc.kill()
        proc.wait(5.0)
        raise RuntimeError(f"bench peer {' '.join(args)} did not start (got {line!r})")
    return Peer(proc, line[5:].strip())


def _rounds(fn, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        fn(i + 1)
        out[i] = clock() - t0
    return out


def time_futex(n: int, spin: str, other_cpu: int | None = None) -> np.ndarray:
    """n ping-pongs through two hostflag words with a peer process: the hand-off's physical floor.
    The peer is started on `other_cpu` (inherited affinity, as `taskset` does) when given."""
    fd, path = tempfile.mkstemp(prefix="dspark-bench-futex-", dir="/dev/shm")
    try:
        os.ftruncate(fd, 4096)
        mm = mmap.mmap(fd, 4096)
    finally:
        os.close(fd)
    peer = spawn_peer("futex", path, spin, cpu=other_cpu)
    try:
        policy = AdaptiveSpin(peer_pid=peer.pid) if spin == "adaptive" else None  # as the product does
        mono = hf.monotonic_ns

        def one(i: int) -> None:
            hf.store(mm, PING_OFF, i)
            if policy is None:
                ok = hf.wait_ge(mm, PONG_OFF, i, 5.0, 0)
            else:
                t0 = mono()
                ok = hf.wait_ge(mm, PONG_OFF, i, 5.0, policy.spin_ns)
                policy.update(mono() - t0, ok)
            if not ok:
                raise RuntimeError("futex peer did not answer within 5 s")

        return _rounds(one, n)
    finally:
        hf.store(mm, PING_OFF, STOP)
        peer.close()
        mm.close()
        os.unlink(path)


def time_pipe(n: int, other_cpu: int | None = None) -> np.ndarray:
    """n round trips of 8 bytes over a multiprocessing.Pipe (send_bytes / recv_bytes)."""
    a, b = Pipe(duplex=True)
    peer = spawn_peer("pipe", str(b.fileno()), pass_fds=(b.fileno(),), cpu=other_cpu)
    b.close()
    peer.cleanup.append(a.close)
    try:
        msg = b"x" * 8

        def one(i: int) -> None:
            a.send_bytes(msg)
            a.recv_bytes()

        return _rounds(one, n)
    finally:
        peer.close()


def time_tcp(n: int, other_cpu: int | None = None) -> np.ndarray:
    """n round trips of 8 bytes over loopback TCP (TCP_NODELAY, blocking sockets)."""
    peer = spawn_peer("tcp", cpu=other_cpu)
    s = socket.create_connection(("127.0.0.1", int(peer.info)))
    peer.cleanup.append(s.close)
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = b"x" * 8
        buf = memoryview(bytearray(8))

        def one(i: int) -> None:
            s.sendall(msg)
            if not recv_exact(s, buf):
                raise RuntimeError("tcp peer closed")

        return _rounds(one, n)
    finally:
        peer.close()


class RawSink:
    """A raw-socket round trip of a given payload and reply size: the floor the STEP/REPLY path is
    compared against (scatter-gather sendmsg of the same buffers, no protocol, no work)."""

    def __init__(self) -> None:
        self.peer = spawn_peer("sink")
        self.sock = socket.create_connection(("127.0.0.1", int(self.peer.info)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer.cleanup.append(self.sock.close)
        self._hdr = bytearray(16)
        self._rbuf = memoryview(bytearray(4 << 20))

    def round_trip(self, parts: list, reply_bytes: int) -> int:
        """Send 16 header bytes + `parts` (buffers), wait for `reply_bytes`; returns ns."""
        total = sum(memoryview(p).nbytes for p in parts)
        self._hdr[:8] = total.to_bytes(8, "little")
        self._hdr[8:] = reply_bytes.to_bytes(8, "little")
        t0 = time.perf_counter_ns()
        todo = [memoryview(self._hdr)] + [memoryview(p).cast("B") for p in parts]
        while todo:
            sent = self.sock.sendmsg(todo[:512])
            while sent:
                if sent >= todo[0].nbytes:
                    sent -= todo[0].nbytes
                    todo.pop(0)
                else:
                    todo[0] = todo[0][sent:]
                    sent = 0
        if not recv_exact(self.sock, self._rbuf[:reply_bytes]):
            raise RuntimeError("raw sink closed")
        return time.perf_counter_ns() - t0

    def close(self) -> None:
        self.peer.close()


if __name__ == "__main__":
    main(sys.argv[1:])
