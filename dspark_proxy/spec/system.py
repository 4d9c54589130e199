"""A real worker and proxy for the reference engine, as child processes through the CLI a user types,
and the faults `eval` injects into them (stall, kill and restart on the same port, proxy kill and
restart under the same name: the shim re-attaches to the new incarnation by itself)."""

from __future__ import annotations

import os
import random
import signal
import time
from contextlib import contextmanager

from ..model.head_shapes import head_drafter, load_head_shapes, worker_head_args
from ..ops.launch import Child, free_fixed_port, spawn_proxy, spawn_worker

__all__ = ["SpecSystem"]


@contextmanager
def _env(**kv: str):
    old = {k: os.environ.get(k) for k in kv}
    os.environ.update(kv)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class SpecSystem:
    """worker (the drafter for HEAD's kind: `torch` for a manifest head, `dspark` for a DSpark checkpoint
    with `target` as its target) on a fixed loopback port + proxy `name`; a context manager."""

    def __init__(self, name: str, head: str, *, max_reqs: int, deadline_ms: float, sampled: bool = False,
                 worker_threads: int = 1, seed: int = 0, target: str | None = None, keep_awake_ms: float = 0.0,
                 spin_us: float = 0.0) -> None:
        man = load_head_shapes(head)
        self.manifest = man
        self.drafter = head_drafter(man)
        self.head_args = worker_head_args(head, target)
        self.name, self.head, self.deadline_ms, self.sampled = name, str(head), deadline_ms, sampled
        self.layout = ["--max-reqs", str(max_reqs), "--num-spec", str(man.num_spec), "--window", str(man.window),
                       "--row-bytes", str(man.row_bytes)] + (["--sampled"] if sampled else [])
        self.address = f"127.0.0.1:{free_fixed_port(random.Random(seed ^ os.getpid()))}"
        self.threads = str(worker_threads)
        # both processes' --keep-awake-ms: SCHED_IDLE spinners keep their CPUs warm between rounds
        self.awake = ["--keep-awake-ms", str(keep_awake_ms)] if keep_awake_ms > 0 else []
        # and their --spin-us: each waits for the other's frame spinning on the socket a while
        self.awake += ["--spin-us", str(spin_us)] if spin_us > 0 else []
        self.worker: Child | None = None
        self.proxy: Child | None = None

    def __enter__(self) -> SpecSystem:
        try:
            self.start_worker()
            self.start_proxy()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start_worker(self) -> None:
        last: Exception | None = None
        for _ in range(20):  # the port may still be held by a killed worker's socket for a moment
            try:
                with _env(OMP_NUM_THREADS=self.threads, MKL_NUM_THREADS=self.threads):
                    self.worker = spawn_worker(*self.layout, *self.head_args, *self.awake, listen=self.address, timeout_s=60.0)
                return
            except RuntimeError as e:
                last = e
                time.sleep(0.2)
        raise RuntimeError(f"worker could not start on {self.address}: {last}")

    def start_proxy(self) -> None:
        self.proxy = spawn_proxy(self.name, self.address, *self.layout, "--deadline-ms", str(self.deadline_ms),
                                 "--log-every", "0", *self.awake)

    # ------------------------------------------------------------------ faults

    def stall_worker(self, seconds: float) -> None:
        """SIGSTOP the worker for `seconds` (the engine's rounds fail at the deadline meanwhile)."""
        assert self.worker is not None
        self.worker.signal(signal.SIGSTOP)
        time.sleep(seconds)
        self.worker.signal(signal.SIGCONT)

    def kill_worker(self, restart: bool = True) -> None:
        assert self.worker is not None
        self.worker.kill()
        self.worker.stop()
        if restart:
            self.start_worker()

    def kill_proxy(self, restart: bool = True) -> None:
        assert self.proxy is not None
        self.proxy.kill()
        self.proxy.stop()
        if restart:
            self.start_proxy()

    def close(self) -> None:
        for c in (self.proxy, self.worker):
            if c is not None:
                c.stop()
        self.proxy = self.worker = None
