"""The system under test: a worker and a proxy as child processes (the real CLI, `launch.py`) and the
shim attached to the proxy's segment, plus what the fault schedule does to them.

The worker always listens on one fixed port, chosen below the kernel's ephemeral range: a restarted
worker comes back at the address the proxy knows, and no outgoing connection (the proxy's reconnects
while the worker is down) can take the port meanwhile. The ports are drawn at random, not from the
campaign's seed: two campaigns of one seed at once (two CI jobs on one host) drew the same ports, and
the second worker to bind exited 3. A worker that finds its port taken before the proxy knows the
address (the first worker, every second worker of the pool kinds) moves to another. Children's stderr goes to log files, so a
fault's message (the client's handshake refusal, say) can be shown in the report.
"""

from __future__ import annotations

import glob
import logging
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import IO, Any

from ..ops.launch import Child, free_fixed_port, spawn_proxy, spawn_worker
from ..shm.segment import Segment, SegmentError, shm_name

__all__ = ["ChaosSystem", "Layout4"]

log = logging.getLogger(__name__)

Layout4 = tuple[int, int, int, int]  # max_reqs, num_spec, window, row_bytes

_MOVES = 5  # a worker whose port was taken before the proxy knew it moves to another port at most this often


class WorkerExited(RuntimeError):
    """A worker could not listen on its fixed port."""


def layout_args(lay: Layout4) -> list[str]:
    m, n, w, b = lay
    return ["--max-reqs", str(m), "--num-spec", str(n), "--window", str(w), "--row-bytes", str(b)]


class ChaosSystem:
    """Owns every child it starts and the shim; `close()` stops them all and reports what was left."""

    def __init__(self, name: str, layout: Layout4, *, deadline_ms: float, heartbeat_timeout_s: float,
                 log_dir: Path, pool: bool = False) -> None:
        self.name = name
        self.layout = layout
        self.deadline_ms = deadline_ms
        self.heartbeat_timeout_s = heartbeat_timeout_s
        # round_loop_hang: SIGUSR1 blocks the proxy's round loop this long (past the shim's bound)
        self.round_hang_ms = round(2e3 * heartbeat_timeout_s + 300)
        self.log_dir = log_dir
        self._ports = random.Random()  # not the seed's (see the module docstring)
        self.port = free_fixed_port(self._ports)
        self.address = f"127.0.0.1:{self.port}"
        self.worker: Child | None = None
        self.worker_log: Path | None = None  # the worker's stderr: its HELLO lines
        self.proxy: Child | None = None
        self.shim: Any = None
        self.retired_shim_counters: dict[str, int] = {}  # summed over engines closed by engine_restart
        self.children: list[Child] = []  # everything ever started, for the leftover check
        self._logs: list[IO[str]] = []
        self._n_logs = 0
        self.proxy_logs: list[Path] = []
        self.actions: list[tuple[int, int, str]] = []  # (start ns, end ns, what): to set beside slow rounds
        # the pool_* kinds: the proxy reads its workers from a file (`--worker @FILE`, re-read on SIGHUP)
        # that lists the worker alone except while such a kind adds a second one on its own fixed port
        self.pool_file: Path | None = None
        self.pool_port = self.pool_address = None
        if pool:
            self.pool_file = log_dir / "workers.txt"
            self.pool_file.write_text(self.address + "\n")
            self._new_pool_port()
        self.pool_worker: Child | None = None

    def _act(self, what: str, fn, *args, **kw):
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kw)
        finally:
            self.actions.append((t0, time.perf_counter_ns(), what))

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        self.spawn_first_worker()
        self.spawn_proxy()
        self.shim = self._attach_engine()

    def _attach_engine(self) -> Any:
        import engine_shim

        m, n, w, b = self.layout
        shim = engine_shim.attach(self.name, max_reqs=m, num_spec=n, window=w, row_bytes=b, timeout_s=5.0,
                                  heartbeat_timeout_s=self.heartbeat_timeout_s)
        if shim.state.value == "detached":  # pending: attaches at the engine's first round
            shim.close()
            raise RuntimeError(f"the shim found no ready proxy segment {self.name} within 5 s")
        return shim

    def replace_engine(self) -> Any:
        """Engine thread: close this engine's shim (the proxy sees its incarnation abandoned and makes a
        new one) and attach a new engine's shim to the same proxy; returns it."""
        old, self.shim = self.shim, None
        if old is not None:
            for k, v in old.counters.snapshot()["counters"].items():
                if isinstance(v, int):
                    self.retired_shim_counters[k] = self.retired_shim_counters.get(k, 0) + v
            self._act("close_shim", old.close)
        self.shim = self._act("attach_shim", self._attach_engine)
        return self.shim

    def shim_counters(self) -> dict[str, int]:
        """The shims' counters, summed over every engine of the run (engine_restart replaces it)."""
        out = dict(self.retired_shim_counters)
        if self.shim is not None:
            for k, v in self.shim.counters.snapshot()["counters"].items():
                if isinstance(v, int):
                    out[k] = out.get(k, 0) + v
        return out

    def _log_file(self, kind: str) -> tuple[IO[str], Path]:
        self._n_logs += 1
        path = self.log_dir / f"{self._n_logs:03d}-{kind}.log"
        f = open(path, "w")  # noqa: SIM115 - closed in close()
        self._logs.append(f)
        return f, path

    def spawn_first_worker(self) -> Child:
        """The first worker: no proxy knows its address yet, so a port taken since it was drawn is left
        for another one (and the pool file follows)."""
        for _ in range(_MOVES - 1):
            try:
                return self.spawn_worker(tries=1)
            except WorkerExited:
                self.port = free_fixed_port(self._ports)
                self.address = f"127.0.0.1:{self.port}"
                if self.pool_file is not None:
                    self.pool_file.write_text(self.address + "\n")
        return self.spawn_worker()  # the last port, retried as a restart is: its error says why

    def spawn_worker(self, *extra: str, layout: Layout4 | None = None, tries: int = 20) -> Child:
        """A worker on the fixed port (extra: fault flags); retried briefly if the port is still busy."""
        lay = layout or self.layout
        last: Exception | None = None
        for _ in range(tries):
            f, path = self._log_file("worker")
            try:
                w = self._act("spawn_worker", spawn_worker, *layout_args(lay), *extra, listen=self.address, stderr=f)
            except RuntimeError as e:  # bind failed (a socket in the way): try again shortly
                last = e
                time.sleep(0.1)
                continue
            self.worker, self.worker_log = w, path
            self.children.append(w)
            return w
        raise WorkerExited(f"worker could not listen on {self.address}: {last}")

    def spawn_proxy(self) -> Child:
        f, path = self._log_file("proxy")
        worker = self.address if self.pool_file is None else f"@{self.pool_file}"
        # the gate's throughput rule off: the probe's engine steps are no forward, so on a loaded machine
        # the rule rightly finds drafting slower and pauses it, and the campaign measures faults, not that
        # (docs/chaos.md); acceptance pauses stay on
        p = self._act("spawn_proxy", spawn_proxy, self.name, worker, *layout_args(self.layout),
                      "--deadline-ms", str(self.deadline_ms), "--log-every", "0", "--accept-tps-every", "0",
                      "--fault-round-hang-ms", str(self.round_hang_ms), stderr=f)
        self.proxy = p
        self.children.append(p)
        self.proxy_logs.append(path)
        return p

    # ------------------------------------------------------------------ the second worker (pool_* kinds)

    def spawn_pool_worker(self, *extra: str) -> Child:
        """A second worker on its own fixed port (not yet in the proxy's list: `set_pool`)."""
        assert self.pool_address is not None, "the system was not started for the pool kinds"
        for k in range(_MOVES):  # not in the proxy's list yet: a port taken meanwhile is left for another
            f, _path = self._log_file("worker2")
            try:
                w = self._act("spawn_worker2", spawn_worker, *layout_args(self.layout), *extra,
                              listen=self.pool_address, stderr=f)
                break
            except RuntimeError:
                if k == _MOVES - 1:
                    raise
                self._new_pool_port()
        self.pool_worker = w
        self.children.append(w)
        return w

    def _new_pool_port(self) -> None:
        port = free_fixed_port(self._ports)
        while port == self.port:
            port = free_fixed_port(self._ports)
        self.pool_port, self.pool_address = port, f"127.0.0.1:{port}"

    def set_pool(self, addresses: list[str]) -> None:
        """The proxy's workers: rewrite its file and SIGHUP it (it re-reads the file)."""
        assert self.pool_file is not None
        tmp = self.pool_file.with_suffix(".tmp")
        tmp.write_text("".join(a + "\n" for a in addresses))
        tmp.replace(self.pool_file)  # atomic: the proxy never reads a half-written list
        self.signal_proxy(signal.SIGHUP)

    def stop_pool_worker(self) -> None:
        w, self.pool_worker = self.pool_worker, None
        if w is not None:
            try:
                w.signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            self._act("stop_worker2", w.kill)
            w.stop()

    # ------------------------------------------------------------------ faults

    def signal_worker(self, sig: int) -> None:
        assert self.worker is not None
        self._act(f"worker {signal.Signals(sig).name}", self.worker.signal, sig)

    def signal_proxy(self, sig: int) -> None:
        assert self.proxy is not None
        self._act(f"proxy {signal.Signals(sig).name}", self.proxy.signal, sig)

    def kill_worker(self) -> None:
        if self.worker is not None:
            self._act("kill_worker", self.worker.kill)
            self.worker.stop()

    def restart_worker(self, *extra: str, layout: Layout4 | None = None) -> Child:
        """SIGKILL the worker and start another on the same port (with fault flags or another layout)."""
        self.kill_worker()
        return self.spawn_worker(*extra, layout=layout)

    def proxy_served(self) -> bool:
        """The worker has agreed a proxy's HELLO (its log's `peer=... ready` line, worker/admission.py):
        from here on the proxy's STEPs reach it."""
        try:
            text = self.worker_log.read_text(errors="replace") if self.worker_log is not None else ""
        except OSError:
            return False
        return any(" ready N=" in ln and "client=dspark-proxy" in ln for ln in text.splitlines())

    def kill_proxy(self) -> None:
        if self.proxy is not None:
            self._act("kill_proxy", self.proxy.kill)
            self.proxy.stop()

    def stop_proxy(self) -> int | None:
        """SIGTERM: the clean stop (fails every round ahead, STOPPING, unlinks)."""
        return self._act("stop_proxy", self.proxy.stop, 10.0) if self.proxy is not None else None

    def proxy_log_text(self) -> str:
        return self._act("read_proxy_logs", self._proxy_log_text)

    def _proxy_log_text(self) -> str:
        out = []
        for p in self.proxy_logs:
            try:
                out.append(p.read_text(errors="replace"))
            except OSError:
                pass
        return "\n".join(out)

    # ------------------------------------------------------------------ close

    def close(self) -> list[str]:
        """Stop the shim and every child; returns what was left behind (processes, the segment)."""
        left: list[str] = []
        if self.shim is not None:
            try:
                self.shim.close()
            except Exception as e:  # noqa: BLE001 - keep closing the rest
                left.append(f"shim.close() raised {e!r}")
        for c in reversed(self.children):
            try:
                c.signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            rc = c.stop(10.0)
            if c.alive():
                left.append(f"{c.name} pid {c.pid} still running after stop (rc {rc})")
                c.kill()
        for f in self._logs:
            f.close()
        if self._segment_exists():
            left.append(f"segment {shm_name(self.name)} still in /dev/shm")
            try:
                import posix_ipc

                posix_ipc.unlink_shared_memory(shm_name(self.name))
            except Exception:  # noqa: BLE001
                pass
        rings = f"/dev/shm/dspark-ring.{self.name}.*"  # every engine ended: no named ring 2 s on (§9)
        end = time.monotonic() + 2.0
        while glob.glob(rings) and time.monotonic() < end:
            time.sleep(0.05)
        for left_ring in glob.glob(rings):
            left.append(f"ring {left_ring} still in /dev/shm 2 s after its engine ended")
            try:
                os.unlink(left_ring)
            except OSError:
                pass
        if _any_child_named(self.name):
            left.append(f"a process with {self.name!r} on its command line is still running")
        return left

    def _segment_exists(self) -> bool:
        try:
            seg = Segment.open(self.name)
        except SegmentError:
            return os.path.exists(f"/dev/shm{shm_name(self.name)}")
        seg.close()
        return True


def _any_child_named(name: str) -> bool:
    """A process of ours (this process's children) whose command line names the segment."""
    try:
        out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(os.getpid())], capture_output=True,
                             text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(f"--name {name}" in line for line in out.splitlines())
