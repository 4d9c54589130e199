"""A vLLM-v1-like scheduler over slots: arrivals, admission, chunked prefill, speculative decode with
random acceptance, finishing, and preemption with recompute.

The state of a running request lives in per-slot arrays, so one step is a few vectorised operations
whatever the batch size; only arrivals, admissions and preemptions (a few per step) are Python.

Per request (a slot), ``tokens`` is how many tokens are known (prompt + sampled output) and ``computed``
how many positions have hidden states. A step computes ``q`` query tokens: in prefill (more than one
token not computed) a chunk of the prompt, cut by the token budget; in decode (only the last sampled
token not computed) that token plus the ``d`` drafts proposed last round, of which ``k`` are accepted.
The positions finalised by the step are the rows it sends; the token after them is the anchor.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from .config import SimConfig

__all__ = ["Scheduler", "StepPlan", "COUNTERS"]

COUNTERS = (
    "steps", "idle_steps", "arrivals", "arrivals_dropped", "admitted", "resumes", "resumes_same_slot",
    "resumes_other_slot", "slot_reuse", "preemptions", "finished", "prefill_chunks", "mid_prefill_chunks",
    "long_chunks", "decode_steps", "drafts_verified", "drafts_accepted",
)


@dataclass
class StepPlan:
    """One step's outcome, in batch order (fresh arrays, owned by the caller)."""

    slots: np.ndarray  # int64 [n]
    req_ids: np.ndarray  # int64 [n]
    q: np.ndarray  # int64 [n] query span
    k_window: np.ndarray  # int64 [n] drafts verified (0 in prefill)
    valid: np.ndarray  # int64 [n] rows sent: the last min(W, finalised) finalised positions
    first_pos: np.ndarray  # int64 [n]
    anchor_pos: np.ndarray  # int64 [n] = first_pos + valid
    sampled: np.ndarray  # bool [n] a token was sampled (decode, or the prompt's last chunk)
    need_draft: np.ndarray  # bool [n] sampled and not finishing
    finished: np.ndarray  # bool [n] reaches its output length with this step

    @property
    def n(self) -> int:
        return int(self.slots.size)


class Scheduler:
    """Requests and slots. Thread ownership: the simulated engine's thread."""

    def __init__(self, cfg: SimConfig, rng: np.random.Generator) -> None:
        self.cfg = cfg
        self.rng = rng
        M = cfg.max_reqs
        self.uid = np.full(M, -1, dtype=np.int64)  # owner request, -1 free
        self.tokens = np.zeros(M, dtype=np.int64)
        self.computed = np.zeros(M, dtype=np.int64)
        self.target = np.zeros(M, dtype=np.int64)  # tokens at which the request is finished
        self.drafts = np.zeros(M, dtype=np.int64)  # drafts proposed for the next step
        self.order = np.zeros(M, dtype=np.int64)  # admission sequence: the running list's order
        self.last_owner = np.full(M, -1, dtype=np.int64)
        # free slots; admission takes the most recently freed half the time (as vLLM refills the hole a
        # removed request leaves) and a random one otherwise, so a preempted request that comes back
        # sometimes gets its old slot (a rewind in place) and sometimes another (a new owner there)
        self.free: list[int] = list(range(M - 1, -1, -1))
        # (uid, target, tokens, slot it was preempted from or -1)
        self.waiting: deque[tuple[int, int, int, int]] = deque()
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._seq = 0
        self._next_uid = int(cfg.uid_base)
        self._issued = 0

    # ---- queue -------------------------------------------------------------------------------

    @property
    def n_running(self) -> int:
        return len(self.uid) - len(self.free)

    def arrivals_possible(self) -> bool:
        cfg = self.cfg
        return cfg.arrivals_per_round > 0 and (cfg.max_requests is None or self._issued < cfg.max_requests)

    def exhausted(self) -> bool:
        """Nothing running, nothing waiting, and nothing more will arrive."""
        return self.n_running == 0 and not self.waiting and not self.arrivals_possible()

    def _arrive(self) -> None:
        cfg, rng = self.cfg, self.rng
        if not self.arrivals_possible():
            return
        k = int(rng.poisson(cfg.arrivals_per_round))
        if cfg.max_requests is not None:
            k = min(k, cfg.max_requests - self._issued)
        if k <= 0:
            return
        prompts = rng.integers(cfg.prompt_len[0], cfg.prompt_len[1] + 1, k)
        outs = rng.integers(cfg.output_len[0], cfg.output_len[1] + 1, k)
        self._issued += k
        self.counters["arrivals"] += k
        cap = cfg.waiting_cap
        for p, o in zip(prompts.tolist(), outs.tolist(), strict=True):
            if len(self.waiting) >= cap:
                self.counters["arrivals_dropped"] += 1
                continue
            self.waiting.append((self._next_uid, p + o, p, -1))
            self._next_uid += 1

    def _maybe_preempt(self) -> None:
        cfg, rng = self.cfg, self.rng
        if cfg.preempt_prob <= 0 or self.n_running == 0 or rng.random() >= cfg.preempt_prob:
            return
        running = np.flatnonzero(self.uid >= 0)
        s = int(running[rng.integers(running.size)])
        # back to the queue's head; its KV is gone, so it recomputes every known token from position 0
        self.waiting.appendleft((int(self.uid[s]), int(self.target[s]), int(self.tokens[s]), s))
        self.uid[s] = -1
        self.drafts[s] = 0
        self.free.append(s)
        self.counters["preemptions"] += 1

    def _admit(self, budget_left: int) -> tuple[list[int], list[int]]:
        slots: list[int] = []
        qs: list[int] = []
        c = self.counters
        while budget_left > 0 and self.waiting and self.free:
            uid, target, tokens, prev = self.waiting.popleft()
            free = self.free
            if len(free) > 1 and self.rng.random() < 0.5:
                j = int(self.rng.integers(len(free)))
                free[j], free[-1] = free[-1], free[j]
            s = free.pop()
            if prev >= 0:
                c["resumes"] += 1
                c["resumes_same_slot" if s == prev else "resumes_other_slot"] += 1
            else:
                c["admitted"] += 1
            if self.last_owner[s] >= 0 and self.last_owner[s] != uid:
                c["slot_reuse"] += 1
            self.last_owner[s] = uid
            self.uid[s] = uid
            self.target[s] = target
            self.tokens[s] = tokens
            self.computed[s] = 0
            self.drafts[s] = 0
            self.order[s] = self._seq
            self._seq += 1
            q = min(tokens, budget_left)
            budget_left -= q
            slots.append(s)
            qs.append(q)
        return slots, qs

    # ---- a step ------------------------------------------------------------------------------

    def _plan(self) -> tuple[np.ndarray, np.ndarray]:
        budget = int(self.cfg.token_budget)
        running = np.flatnonzero(self.uid >= 0)
        if running.size:
            running = running[np.argsort(self.order[running], kind="stable")]
            demand = self.tokens[running] - self.computed[running] + self.drafts[running]
            before = np.cumsum(demand) - demand
            got = np.clip(budget - before, 0, demand)
            keep = got > 0
            slots, q = running[keep], got[keep]
            budget -= int(q.sum())
        else:
            slots = q = np.zeros(0, dtype=np.int64)
        new_slots, new_q = self._admit(budget)
        if new_slots:
            slots = np.concatenate([slots, np.asarray(new_slots, dtype=np.int64)])
            q = np.concatenate([q, np.asarray(new_q, dtype=np.int64)])
        return slots, q

    def step(self, max_idle: int = 1_000_000) -> StepPlan | None:
        """Plan and apply one engine step; idle steps (nothing to run) pass silently. None when the
        workload is exhausted. Finished requests keep their slot until `finish`."""
        c = self.counters
        for _ in range(max_idle):
            self._arrive()
            self._maybe_preempt()
            slots, q = self._plan()
            if slots.size:
                break
            if self.exhausted():
                return None
            c["idle_steps"] += 1
        else:
            return None
        c["steps"] += 1
        return self._apply(slots, q)

    def _apply(self, slots: np.ndarray, q: np.ndarray) -> StepPlan:
        cfg, c = self.cfg, self.counters
        W = cfg.window
        c0 = self.computed[slots]
        t0 = self.tokens[slots]
        target = self.target[slots]
        dec = (t0 - c0) == 1
        d = np.where(dec, q - 1, 0)
        k = np.zeros_like(d)
        if d.any():
            ok = self.rng.random((d.size, cfg.num_spec)) < cfg.accept_prob
            run = np.cumprod(ok, axis=1).sum(axis=1)
            # never accept past the output length (the bonus token counts too)
            k = np.where(dec, np.minimum(np.minimum(run, d), target - t0 - 1), 0)
        fin_pos = np.where(dec, 1 + k, q)  # positions finalised this step
        c1 = c0 + fin_pos
        sampled = dec | (c1 == t0)
        t1 = np.where(sampled, c1 + 1, t0)
        valid = np.minimum(fin_pos, W)
        finished = sampled & (t1 >= target)
        self.computed[slots] = c1
        self.tokens[slots] = t1
        self.drafts[slots] = 0
        n_dec = int(dec.sum())
        c["decode_steps"] += n_dec
        c["prefill_chunks"] += slots.size - n_dec
        c["mid_prefill_chunks"] += int((~sampled).sum())
        c["long_chunks"] += int(((~dec) & (q > W)).sum())
        c["drafts_verified"] += int(d.sum())
        c["drafts_accepted"] += int(k.sum())
        return StepPlan(slots=slots, req_ids=self.uid[slots], q=q, k_window=d, valid=valid,
                        first_pos=c1 - valid, anchor_pos=c1, sampled=sampled,
                        need_draft=sampled & ~finished, finished=finished)

    def finish(self, plan: StepPlan, n_drafts: np.ndarray) -> None:
        """After the step's reply: set next step's drafts (``n_drafts`` [n], 0 where none are usable) and
        free the slots of finished requests."""
        slots = plan.slots
        room = np.maximum(self.target[slots] - self.tokens[slots] - 1, 0)
        self.drafts[slots] = np.where(plan.finished, 0, np.minimum(np.minimum(n_drafts, room),
                                                                    self.cfg.num_spec))
        done = slots[plan.finished]
        if done.size:
            self.uid[done] = -1
            self.free.extend(done.tolist())
            self.counters["finished"] += int(done.size)
