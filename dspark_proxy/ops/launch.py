"""Start a worker or a proxy as a child process through the real CLI, and stop it for sure.

Used by `demo`, the chaos campaign, benchmarks and the end-to-end tests, so all of them exercise the
same command lines a user types.
"""

from __future__ import annotations

import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..shm.layout import State, Word
from ..shm.segment import Segment, SegmentError


def readable(f, timeout_s: float) -> bool:
    """Whether f has something to read within timeout_s: poll(), not select(), which refuses any
    descriptor above 1023 (a long-lived process, a test run, may well hold that many)."""
    p = select.poll()
    p.register(f, select.POLLIN | select.POLLHUP)
    return bool(p.poll(max(0, int(timeout_s * 1000))))

__all__ = ["Child", "spawn_worker", "spawn_proxy", "wait_proxy_ready", "free_fixed_port"]


@dataclass
class Child:
    """A child process with a name; stop() is SIGTERM, a wait, then SIGKILL (idempotent)."""

    name: str
    proc: subprocess.Popen
    address: str = ""
    args: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def stop(self, timeout_s: float = 5.0) -> int | None:
        if self.alive():
            try:
                os.kill(self.proc.pid, signal.SIGCONT)  # a stopped child cannot handle SIGTERM
                self.proc.terminate()
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
            except ProcessLookupError:
                pass
        for s in (self.proc.stdout, self.proc.stderr):
            if s is not None:
                s.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(5.0)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dspark_proxy.cli", *args]


def spawn_worker(*args: str, listen: str = "127.0.0.1:0", timeout_s: float = 20.0,
                 stderr: int | None = subprocess.DEVNULL) -> Child:
    """`dspark-proxy worker --listen ... ARGS`; returns once it prints its bound address."""
    cmd = _cli("worker", "--listen", listen, *args)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True)
    child = Child("worker", proc, args=cmd)
    end = time.monotonic() + timeout_s
    assert proc.stdout is not None
    try:
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode} before listening: {' '.join(cmd)}")
            if readable(proc.stdout, 0.1):
                line = proc.stdout.readline()
                if line.startswith("worker listening on "):
                    child.address = line.split()[-1].strip()
                    return child
        raise RuntimeError(f"worker did not start within {timeout_s} s: {' '.join(cmd)}")
    except BaseException:  # whatever went wrong, the child does not outlive the call
        child.stop()
        raise


def spawn_proxy(name: str, worker: str, *args: str, timeout_s: float = 20.0,
                stderr: int | None = subprocess.DEVNULL) -> Child:
    """`dspark-proxy start --name NAME --worker ADDR ARGS`; returns once its segment is READY."""
    cmd = _cli("start", "--name", name, "--worker", worker, *args)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    child = Child("proxy", proc, args=cmd)
    try:
        wait_proxy_ready(name, proc.pid, timeout_s, proc)
    except BaseException:
        child.stop()
        raise
    return child


def wait_proxy_ready(name: str, pid: int | None, timeout_s: float, proc: subprocess.Popen | None = None) -> int:
    """Wait for a READY segment under `name` (owned by `pid` if given); returns its incarnation."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"proxy exited with {proc.returncode} before it was ready")
        try:
            seg = Segment.open(name)
        except SegmentError:
            time.sleep(0.02)
            continue
        try:
            if seg.word(Word.STATE) == State.READY and (pid is None or int(seg.header["owner_pid"]) == pid):
                return seg.incarnation
        finally:
            seg.close()
        time.sleep(0.02)
    raise RuntimeError(f"proxy {name} not ready within {timeout_s} s")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_fixed_port(rng: random.Random) -> int:
    """A free loopback port below the ephemeral range (never handed out to outgoing connections)."""
    hi = max(_ephemeral_low() - 1, 10001)
    for _ in range(200):
        port = rng.randint(10000, hi)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError("no free port below the ephemeral range")
