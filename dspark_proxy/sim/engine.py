"""The simulated engine: builds each step's batch, drives a shim, checks every usable draft, uses them.

Anything with the shim's surface works (duck typing): ``num_spec``, ``window``, ``max_reqs``,
``row_bytes``, ``enqueue(t, *, req_ids, slots, qsl, need_draft, k_window, rows, valid, first_pos,
anchor, sampled, seed, temperature)`` and ``read_reply(t)`` returning an object with ``status``, ``n``,
``ok_mask``, ``draft_ids``, ``confidence`` and ``n_drafts`` (optional: derived from the ok requests'
leading ids when absent); request i's drafts are ``draft_ids[i, :n_drafts[i]]``, nothing else. A round is: next_batch → enqueue → the engine's own
work (optional) → read_reply → check_reply → advance. The time spent inside read_reply is what the
product exists to keep small, so it is measured per round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .config import SimConfig
from .oracle import CheckResult, Oracle
from .rows import RowGen, mix64
from .sched import Scheduler, StepPlan

__all__ = ["Batch", "SimEngine", "SimResult"]

_STATUS_NAMES = {0: "ok", 1: "some_failed", 2: "round_failed"}


@dataclass
class Batch:
    """One step's enqueue arguments (numpy arrays, batch order). ``rows`` is a view of the engine's
    reusable buffer: valid until the next `SimEngine.next_batch`."""

    t: int
    req_ids: np.ndarray  # int64 [n]
    slots: np.ndarray  # int32 [n]
    qsl: np.ndarray  # int32 [n + 1]
    need_draft: np.ndarray  # bool [n]
    k_window: np.ndarray  # int32 [n]
    rows: np.ndarray  # uint8 [sum(valid), row_bytes]
    valid: np.ndarray  # int32 [n]
    first_pos: np.ndarray  # int64 [n]
    anchor: np.ndarray  # int64 [n]
    sampled: np.ndarray  # bool [n]
    anchor_pos: np.ndarray  # int64 [n] = first_pos + valid
    finished: np.ndarray  # bool [n]
    seed: np.ndarray | None = None  # int64 [n], sampled mode only
    temperature: np.ndarray | None = None  # float32 [n], sampled mode only
    check: CheckResult | None = None  # set by check_reply
    plan: StepPlan | None = field(default=None, repr=False)

    @property
    def n(self) -> int:
        return int(self.req_ids.size)

    @property
    def n_rows(self) -> int:
        return int(self.rows.shape[0])

    def enqueue_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``shim.enqueue(t, **kwargs)``."""
        return {"req_ids": self.req_ids, "slots": self.slots, "qsl": self.qsl, "need_draft": self.need_draft,
                "k_window": self.k_window, "rows": self.rows, "valid": self.valid,
                "first_pos": self.first_pos, "anchor": self.anchor, "sampled": self.sampled,
                "seed": self.seed, "temperature": self.temperature}


def _pct(ns: list[int], q: float) -> float:
    if not ns:
        return 0.0
    return float(np.percentile(np.asarray(ns, dtype=np.float64), q)) / 1000.0


@dataclass
class SimResult:
    """What a run did and what the engine waited. ``wrong_drafts`` must be 0."""

    rounds: int
    requests_served: int
    requests_admitted: int
    drafts_needed: int
    usable_drafts: int
    usable_rate: float
    wrong_drafts: int
    partial_windows: int
    full_windows: int  # usable drafts whose window held every row the engine holds (up to W)
    full_window_rate: float  # full_windows / usable_drafts (1.0 with no usable draft)
    status: dict[str, int]
    wait_us_p50: float
    wait_us_p99: float
    wait_us_max: float
    enqueue_us_p50: float
    enqueue_us_p99: float
    sim_us_p50: float
    sim_us_p99: float
    mean_batch: float
    mean_rows: float
    tokens_per_step: float
    elapsed_s: float
    rounds_per_s: float
    first_wrong: list[dict] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class SimEngine:
    """A seeded simulated engine. Thread ownership: one thread calls everything."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.rowgen = RowGen(cfg.row_bytes, vocab_size=cfg.vocab_size, stamp_stride_bytes=cfg.stamp_stride_bytes)
        self.oracle = Oracle(self.rowgen, window=cfg.window, num_spec=cfg.num_spec, max_slots=cfg.max_reqs)
        self.sched = Scheduler(cfg, self.rng)
        self._t = 0
        self._pending: Batch | None = None
        self._acc = {"rounds": 0, "needed": 0, "usable": 0, "wrong": 0, "partial": 0, "full": 0, "reqs": 0, "rows": 0,
                     "tokens": 0}
        self._status: dict[str, int] = {}
        self.first_wrong: list[dict] = []
        self._wait_ns: list[int] = []
        self._enqueue_ns: list[int] = []
        self._sim_ns: list[int] = []
        self._elapsed_ns = 0

    @property
    def wait_ns(self) -> list[int]:
        """The engine's wait inside read_reply, per round driven by `run`, in order (the live list: a
        caller that wants one stretch's figures slices it from a length it noted before)."""
        return self._wait_ns

    # ---- one round ---------------------------------------------------------------------------

    def next_batch(self, t: int | None = None) -> Batch | None:
        """Plan and apply the next step (idle steps pass silently); None once a finite workload is
        served. Round numbers count from 1 unless ``t`` says otherwise."""
        if self._pending is not None:
            raise RuntimeError(f"round {self._pending.t} was not advanced; call advance() first")
        plan = self.sched.step()
        if plan is None:
            return None
        t = self._t + 1 if t is None else int(t)
        if t <= self._t:
            raise ValueError(f"round {t} after round {self._t}: rounds only grow")
        self._t = t
        rg = self.rowgen
        valid = plan.valid
        n_rows = int(valid.sum())
        rows = rg.buffer(n_rows)
        starts = np.cumsum(valid) - valid
        pos = np.arange(n_rows, dtype=np.int64) + np.repeat(plan.first_pos - starts, valid)
        rg.stamp(rows, np.repeat(plan.req_ids, valid), pos)
        crc = rg.row_crc(np.repeat(rg.uid_lin(plan.req_ids), valid), pos)
        self.oracle.record(plan.slots, plan.req_ids, plan.first_pos, valid, crc)
        n = plan.n
        qsl = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(plan.q, out=qsl[1:])
        seed = temperature = None
        if self.cfg.sampled_mode:
            h = mix64(plan.req_ids.astype(np.uint64) ^ np.uint64(0x5A3D))
            seed = (h >> np.uint64(1)).astype(np.int64)
            temperature = (0.5 + (h % np.uint64(1000)).astype(np.float32) / np.float32(1000.0)).astype(np.float32)
        b = Batch(t=t, req_ids=plan.req_ids, slots=plan.slots.astype(np.int32), qsl=qsl,
                  need_draft=plan.need_draft, k_window=plan.k_window.astype(np.int32), rows=rows,
                  valid=valid.astype(np.int32), first_pos=plan.first_pos,
                  anchor=rg.tokens(plan.req_ids, plan.anchor_pos), sampled=plan.sampled,
                  anchor_pos=plan.anchor_pos, finished=plan.finished, seed=seed, temperature=temperature,
                  plan=plan)
        self._pending = b
        self._acc["tokens"] += int(plan.q.sum())
        return b

    def check_reply(self, batch: Batch, reply: Any) -> int:
        """Check every ok draft of the round against the integrity oracle; returns the wrong ones.
        Usable drafts (right, needed, at least one) are remembered on the batch for `advance`."""
        if batch.check is not None:
            return int(batch.check.wrong.sum())
        n = batch.n
        status = int(reply.status)
        name = _STATUS_NAMES.get(status, f"status_{status}")
        self._status[name] = self._status.get(name, 0) + 1
        empty = CheckResult(wrong=np.zeros(n, dtype=bool), usable=np.zeros(n, dtype=bool),
                            n_drafts=np.zeros(n, dtype=np.int64))
        if status not in (0, 1):
            batch.check = empty
            return 0
        if int(reply.n) != n:
            empty.wrong[:] = True
            batch.check = empty
            self._record_wrong(1, [{"round": batch.t, "reason": "reply shape", "n_sent": n,
                                    "n_reply": int(reply.n)}])
            return 1
        res = self.oracle.check(
            t=batch.t, slots=batch.slots.astype(np.int64), req_ids=batch.req_ids, anchor=batch.anchor,
            anchor_pos=batch.anchor_pos, need_draft=batch.need_draft,
            ok_mask=np.asarray(reply.ok_mask)[:n].astype(bool), draft_ids=np.asarray(reply.draft_ids)[:n],
            confidence=np.asarray(reply.confidence)[:n], mode=self.cfg.oracle,
            max_details=max(0, self.cfg.max_wrong_details - len(self.first_wrong)),
            reply_n_drafts=None if getattr(reply, "n_drafts", None) is None else np.asarray(reply.n_drafts)[:n])
        batch.check = res
        n_wrong = int(res.wrong.sum())
        self._acc["partial"] += res.partial
        if n_wrong:
            self._record_wrong(n_wrong, res.details)
        return n_wrong

    def _record_wrong(self, n_wrong: int, details: list[dict]) -> None:
        self._acc["wrong"] += n_wrong
        room = self.cfg.max_wrong_details - len(self.first_wrong)
        self.first_wrong.extend(details[:max(0, room)])

    def advance(self, batch: Batch, reply: Any) -> None:
        """End the step: the next step verifies the usable drafts (1 + drafts query tokens, a random
        number accepted); finished requests free their slots."""
        if batch is not self._pending or batch.plan is None:
            raise RuntimeError(f"round {batch.t} is not the pending round")
        if batch.check is None:
            self.check_reply(batch, reply)
        assert batch.check is not None
        self.sched.finish(batch.plan, batch.check.n_drafts)
        a = self._acc
        a["rounds"] += 1
        a["reqs"] += batch.n
        a["rows"] += batch.n_rows
        a["needed"] += int(batch.need_draft.sum())
        a["usable"] += int(batch.check.usable.sum())
        a["full"] += batch.check.n_full
        self._pending = None

    # ---- a run -------------------------------------------------------------------------------

    def _check_shim(self, shim: Any) -> None:
        for f in ("max_reqs", "num_spec", "window", "row_bytes"):
            v = getattr(shim, f, None)
            if v is not None and int(v) != int(getattr(self.cfg, f)):
                raise ValueError(f"shim.{f} = {v} but SimConfig.{f} = {getattr(self.cfg, f)}: "
                                 f"start the simulated engine with the shim's layout")

    def _work(self) -> Callable[[], None] | None:
        us = self.cfg.engine_work_us
        if us <= 0:
            return None
        if self.cfg.engine_work == "sleep":
            s = us / 1e6
            return lambda: time.sleep(s)
        ns = int(us * 1000)

        def busy() -> None:
            end = time.perf_counter_ns() + ns
            while time.perf_counter_ns() < end:
                pass
        return busy

    def run(self, shim: Any, rounds: int | None = None, duration_s: float | None = None,
            on_round: Callable[[Batch, Any], object] | None = None) -> SimResult:
        """Drive ``shim`` for ``rounds`` rounds, ``duration_s`` seconds, or until a finite workload is
        served, whichever comes first. ``on_round(batch, reply)`` runs after each round; a truthy return
        stops the run."""
        if rounds is None and duration_s is None and self.cfg.max_requests is None:
            raise ValueError("run() needs rounds, duration_s or SimConfig.max_requests, or it never ends")
        self._check_shim(shim)
        work = self._work()
        clock = time.perf_counter_ns
        end_ns = None if duration_s is None else clock() + int(duration_s * 1e9)
        done = 0
        start = clock()
        while rounds is None or done < rounds:
            s0 = clock()
            if end_ns is not None and s0 >= end_ns:
                break
            b = self.next_batch()
            if b is None:
                break
            s1 = clock()
            shim.enqueue(b.t, **b.enqueue_kwargs())
            s2 = clock()
            if work is not None:
                work()
            s3 = clock()
            reply = shim.read_reply(b.t)
            s4 = clock()
            self.check_reply(b, reply)
            self.advance(b, reply)
            s5 = clock()
            self._enqueue_ns.append(s2 - s1)
            self._wait_ns.append(s4 - s3)
            self._sim_ns.append((s1 - s0) + (s5 - s4))
            done += 1
            if on_round is not None and on_round(b, reply):
                break
        self._elapsed_ns += clock() - start
        return self.result()

    def result(self) -> SimResult:
        """Everything so far (waits and sim cost cover rounds driven by `run`)."""
        a = self._acc
        c = dict(self.sched.counters)
        elapsed = self._elapsed_ns / 1e9
        rounds = a["rounds"]
        return SimResult(
            rounds=rounds, requests_served=c["finished"], requests_admitted=c["admitted"],
            drafts_needed=a["needed"], usable_drafts=a["usable"],
            usable_rate=a["usable"] / a["needed"] if a["needed"] else 0.0, wrong_drafts=a["wrong"],
            partial_windows=a["partial"], full_windows=a["full"],
            full_window_rate=a["full"] / a["usable"] if a["usable"] else 1.0, status=dict(self._status),
            wait_us_p50=_pct(self._wait_ns, 50), wait_us_p99=_pct(self._wait_ns, 99),
            wait_us_max=max(self._wait_ns, default=0) / 1000.0,
            enqueue_us_p50=_pct(self._enqueue_ns, 50), enqueue_us_p99=_pct(self._enqueue_ns, 99),
            sim_us_p50=_pct(self._sim_ns, 50), sim_us_p99=_pct(self._sim_ns, 99),
            mean_batch=a["reqs"] / rounds if rounds else 0.0, mean_rows=a["rows"] / rounds if rounds else 0.0,
            tokens_per_step=a["tokens"] / rounds if rounds else 0.0, elapsed_s=elapsed,
            rounds_per_s=len(self._wait_ns) / elapsed if elapsed > 0 else 0.0,
            first_wrong=list(self.first_wrong), counters=c)
