"""The engine side of a chaos run: a shim stand-in that times every hand-off, and a per-round record.

`EngineProbe` has the shim's surface (what `SimEngine.run` drives), forwards to the real shim, and
times `enqueue` and `read_reply` itself, so the waits are measured exactly where the engine would
feel them. `on_round` (SimEngine's callback) records, per round, the oracle's verdict: drafts needed,
usable, wrong, and full (usable drafts whose window held every row the engine wrote for the request,
up to W, by the oracle's own record), the batch size, and the resync windows the shim staged. The controller thread reads the record by index (a round's index is its position in
the record, not its round number) and waits for usable drafts to come back with `first_usable`.

Thread ownership: the engine thread appends to the lists and sets `_resumed`; the controller reads
lengths and slices (list appends and reads are atomic under the GIL) and sets `_watch_from`.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..shm.hostflag import gil_wait_ns

__all__ = ["EngineProbe"]

_NEVER = 1 << 62



class EngineProbe:
    """Times one shim's hand-offs and records every round's outcome (engine thread only)."""

    def __init__(self, shim: Any, deadline_ms: float) -> None:
        self.shim = shim
        self.deadline_ns = int(deadline_ms * 1e6)
        self.max_reqs, self.num_spec = shim.max_reqs, shim.num_spec
        self.window, self.row_bytes = shim.window, shim.row_bytes
        self.t: list[int] = []
        self.wait_ns: list[int] = []  # inside read_reply: what the engine waited for its drafts
        self.enqueue_ns: list[int] = []
        self.reply_end_ns: list[int] = []  # perf_counter_ns when read_reply returned
        self.late_ns: list[int] = []
        # the kernel's witness (/proc/thread-self/schedstat, run_delay: ns spent runnable but not running):
        # how much of the wait, and of the enqueue, the engine thread was kept off the CPU
        self.wait_run_delay_ns: list[int] = []
        self.enqueue_run_delay_ns: list[int] = []  # reply returned minus (gathered + deadline); gathered ~ enqueue's end
        # where a long wait went (report.py, worst_over_limit): the shim's wait outcome (WAIT_*, 0: none),
        # when its wait returned with the GIL held again relative to the round's deadline, read_reply's
        # Python after that, and the most any OTHER thread of this process was kept off the CPU meanwhile
        # (a thread holding the GIL while preempted makes the engine thread wait, asleep, for the GIL)
        self.wait_outcome: list[int] = []
        self.wait_on_cpu_ns: list[int] = []  # the engine thread on the CPU during read_reply (schedstat)
        self.gil_wait_ns: list[int] = []  # the wait's end to the GIL held again (0: the GIL was kept)
        # the part of gil_wait_ns the product's own Python thread here (the shim's watchdog) can have
        # caused: all of it unless that thread was asleep, holding no GIL, since before it began
        self.product_threads_ns: list[int] = []
        self.returned_past_deadline_ns: list[int] = []
        self.after_wait_ns: list[int] = []
        self.others_run_delay_ns: list[int] = []
        self.others_run_delay_tid: list[int] = []
        self.busiest_thread: list[tuple[int, int]] = []  # (ns on the CPU, tid): the other Python thread that ran most
        self.thread_names: dict[int, str] = {}  # native id -> threading name, for the report
        self._tasks: dict[int, int] = {}  # tid -> schedstat fd, every other thread of this process
        self._tasks_seen = -1
        self._py_tids: set[int] = set()
        self._others0: dict[int, int] = {}
        self._wait_extra = (0, 0, 0, 0, 0, 0, 0)
        self._busiest = (0, 0)
        self.status: list[int] = []
        self.needed: list[int] = []
        self.usable: list[int] = []
        self.wrong: list[int] = []
        self.full: list[int] = []  # usable drafts with a full window (sim/oracle.py)
        self.n_reqs: list[int] = []  # requests in the round
        self.staged: list[int] = []  # resync windows the shim staged with the round's enqueue
        self._staged = 0
        self.done_ns: list[int] = []  # perf_counter_ns when the round ended
        self.stop_requested = False
        self.restart_requested = False  # engine_restart: end this engine's run after the round
        self._enq_ns = 0
        self._enq_end = 0
        self._wait_ns = 0
        self._late_ns = 0
        self._reply_end = 0
        self._sched_fd = -1  # opened by the engine thread (thread-self resolves at open)
        self._wait_rd = 0
        self._wait_run = 0
        self._enq_rd = 0
        self._watch_from = _NEVER
        self._resumed = threading.Event()  # set by the engine thread: a usable round past _watch_from

    # ------------------------------------------------------------------ the shim's surface

    def _run_delay_ns(self) -> int:
        return self._sched()[1]

    def _sched(self) -> tuple[int, int]:
        """This thread's (ns on the CPU, ns runnable but kept off it) so far."""
        fd = self._sched_fd
        if fd == -1:
            try:
                fd = self._sched_fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            except OSError:
                fd = self._sched_fd = -2
        if fd < 0:
            return 0, 0
        f = os.pread(fd, 128, 0).split()
        return int(f[0]), int(f[1])

    def _others(self) -> dict[int, tuple[int, int]]:
        """(ns on the CPU, ns runnable off it) of every other thread of this process, engine thread only,
        re-listed every 64 rounds."""
        if self._tasks_seen != len(self.t) >> 6:
            self._tasks_seen = len(self.t) >> 6
            me = threading.get_native_id()
            names = {th.native_id: th.name for th in threading.enumerate() if th.native_id is not None}
            self.thread_names.update(names)
            try:
                tids = {int(x) for x in os.listdir("/proc/self/task")} - {me}
            except OSError:
                tids = set(names) - {me}
            self._py_tids = set(names)
            for tid in list(self._tasks):
                if tid not in tids:
                    os.close(self._tasks.pop(tid))
            for tid in tids - set(self._tasks):
                try:
                    self._tasks[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
                except OSError:
                    pass
        out = {}
        for tid, fd in self._tasks.items():
            try:
                f = os.pread(fd, 128, 0).split()
                out[tid] = (int(f[0]), int(f[1]))  # ns on the CPU, ns runnable but kept off it
            except (OSError, IndexError, ValueError):
                pass
        return out

    def close(self) -> None:
        fd, self._sched_fd = self._sched_fd, -2
        if fd >= 0:
            os.close(fd)
        for fd in self._tasks.values():
            os.close(fd)
        self._tasks.clear()

    def enqueue(self, t: int, **kwargs: Any) -> None:
        c = self.shim.counters
        w0 = c.counter("resync_windows_staged")
        rd0 = self._run_delay_ns()
        t0 = time.perf_counter_ns()
        self.shim.enqueue(t, **kwargs)
        self._enq_end = time.perf_counter_ns()
        self._staged = c.counter("resync_windows_staged") - w0
        self._enq_rd = self._run_delay_ns() - rd0
        self._enq_ns = self._enq_end - t0

    def read_reply(self, t: int) -> Any:
        shim = self.shim
        others0 = self._others()
        shim.last_wait = (0, 0)
        run0, rd0 = self._sched()
        t0 = time.perf_counter_ns()  # CLOCK_MONOTONIC on Linux, the shim's deadline clock
        reply = shim.read_reply(t)
        t1 = self._reply_end = time.perf_counter_ns()
        run1, rd1 = self._sched()
        self._wait_rd = rd1 - rd0
        self._wait_run = run1 - run0
        self._wait_ns = t1 - t0
        self._late_ns = t1 - self._enq_end - self.deadline_ns
        outcome, ret = getattr(shim, "last_wait", (0, 0))
        gil = gil_wait_ns() if outcome else 0
        worst, tid, busiest, btid = 0, 0, 0, 0
        for k, (run, rd) in self._others().items():
            if k not in self._py_tids:
                continue  # a C thread (the shim's deadline watcher) never holds the GIL
            run0, rd0 = others0.get(k, (run, rd))
            if rd - rd0 > worst:  # kept off the CPU: holding the GIL, or waiting for it
                worst, tid = rd - rd0, k
            if run - run0 > busiest:  # on the CPU: running Python (the GIL), or in a GIL-free call
                busiest, btid = run - run0, k
        self._busiest = (busiest, btid)
        # the product's one Python thread here, the shim's watchdog, asleep (no GIL) since before the
        # GIL wait began: then only the campaign's threads can have kept the GIL from the engine
        asleep = getattr(getattr(shim, "watchdog", None), "asleep_since_ns", 0)
        ours = 0 if (asleep and asleep <= ret - gil) else gil
        past = ret - getattr(shim, "_deadline_ns", ret) if ret else 0
        self._wait_extra = (outcome, past, t1 - ret if ret else 0, worst, tid, gil, ours)
        return reply

    # ------------------------------------------------------------------ SimEngine's callback

    def on_round(self, batch: Any, reply: Any) -> bool:
        """Record round `batch.t` (already checked by the oracle); True asks SimEngine.run to stop."""
        chk = batch.check
        usable = int(chk.usable.sum()) if chk is not None else 0
        idx = len(self.t)
        self.t.append(batch.t)
        self.wait_ns.append(self._wait_ns)
        self.enqueue_ns.append(self._enq_ns)
        self.late_ns.append(self._late_ns)
        self.reply_end_ns.append(self._reply_end)
        self.wait_run_delay_ns.append(self._wait_rd)
        self.enqueue_run_delay_ns.append(self._enq_rd)
        outcome, past, after, worst, tid, gil, ours = self._wait_extra
        self.wait_outcome.append(outcome)
        self.wait_on_cpu_ns.append(self._wait_run)
        self.gil_wait_ns.append(gil)
        self.product_threads_ns.append(ours)
        self.returned_past_deadline_ns.append(past)
        self.after_wait_ns.append(after)
        self.others_run_delay_ns.append(worst)
        self.others_run_delay_tid.append(tid)
        self.busiest_thread.append(self._busiest)
        self.status.append(int(reply.status))
        self.needed.append(int(batch.need_draft.sum()))
        self.usable.append(usable)
        self.wrong.append(int(chk.wrong.sum()) if chk is not None else 0)
        self.full.append(chk.n_full if chk is not None else 0)
        self.n_reqs.append(batch.n)
        self.staged.append(self._staged)
        self.done_ns.append(time.perf_counter_ns())
        if usable and idx >= self._watch_from:
            self._resumed.set()
        return self.stop_requested or self.restart_requested

    # ------------------------------------------------------------------ controller side

    @property
    def count(self) -> int:
        """Rounds recorded so far (the index the next round will get)."""
        return len(self.t)

    def first_usable(self, from_idx: int, timeout_s: float, idle: Any = None) -> int | None:
        """The index of the first round at or after `from_idx` with a usable draft, waiting up to
        timeout_s for it; `idle()` runs between looks (the controller polls the shim's events there).

        The scan of the record is what decides; the event only wakes the wait early."""
        self._resumed.clear()
        self._watch_from = from_idx
        end = time.monotonic() + timeout_s
        cursor = from_idx
        usable = self.usable
        try:
            while True:
                n = len(usable)
                for i in range(cursor, n):
                    if usable[i]:
                        return i
                cursor = max(cursor, n)
                left = end - time.monotonic()
                if left <= 0 or self.stop_requested:
                    return None
                self._resumed.wait(min(left, 0.05))
                self._resumed.clear()
                if idle is not None:
                    idle()
        finally:
            self._watch_from = _NEVER
