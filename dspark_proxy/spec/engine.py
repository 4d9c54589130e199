"""The reference speculative-decoding engine: the example of wiring any torch engine to dspark-proxy.

One step, for every request in the batch (requests join when a slot is free and leave when done):

1. every request verifies its drafts in ONE target forward over [anchor, d_1 .. d_k] at positions
   a .. a + k (k = the drafts the last reply gave, capped by the tokens still wanted); greedy
   accepts the longest prefix matching the target's argmax, sampled mode applies rejection
   sampling (verify.py); either way m drafts are accepted and m + 1 tokens emitted;
2. the positions this step finalised are the previous anchor and the accepted drafts (valid =
   m + 1, rows a .. a + m): their tapped rows are gathered, and the draft source (drafts.py) gets
   them with the new anchors: through the shim, `enqueue(t)` (`begin`), which returns at once;
3. while the round is in flight, the engine's own work: a slot freed this step gets its next
   request, prefilled now (its first token is its anchor). Its first verification has no drafts
   (one token), and the round after it carries the prompt's last rows in front of that position's;
4. `read_reply(t)` (`finish`), which returns by the round's deadline whatever the proxy does: the
   reply's drafts are what step 1 verifies next. A failed round (no proxy, a stalled worker) just
   means no drafts: one token per request that step, the output unchanged.

Draft length follows the drafter's confidence (`min_confidence`): a request verifies its drafts only
while the product of their confidences (the drafter's estimate that all of them so far will be
accepted) stays at or above it. On a target whose verification forward costs more for each token it
checks (a small model on a CPU), a draft that is unlikely to be accepted costs more than it earns.
It only ever verifies fewer drafts, so the output is unchanged (greedy and sampled alike: where a
request stops depends on the drafts alone, never on the target).

The KV cache is the target's (target.py): a rejected draft's entries are overwritten by the next
step, so nothing is rolled back explicitly.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from .drafts import Drafts, Finalised
from .target import TargetEngine
from .verify import accept_greedy, accept_sampled

__all__ = ["Request", "SpecEngine", "RunStats"]

SUPPORT = 32
_uids = itertools.count(1)  # the shim's request ids: unique per admission, across runs sharing a shim


@dataclass
class Request:
    rid: int
    prompt: np.ndarray  # int64 token ids
    max_new: int
    temperature: float = 0.0
    seed: int = 0


@dataclass
class RunStats:
    """One run: outputs by request id, and what it cost."""

    outputs: dict[int, np.ndarray] = field(default_factory=dict)
    margins: dict[int, np.ndarray] = field(default_factory=dict)  # [max_new, 3]: top1 logit, runner-up id, logit
    tokens: int = 0
    elapsed_s: float = 0.0
    steps: int = 0
    request_forwards: int = 0  # a request's part in a forward: one per step it was in the batch
    wanted_rounds: int = 0  # request-rounds that could use drafts and whose round did not fail
    full_rounds: int = 0  # those of them that could verify all N drafts (not cut by the length limit)
    full_accepted: int = 0  # drafts accepted in full_rounds
    drafted_rounds: int = 0  # request-rounds that verified at least one draft
    accepted: int = 0  # drafts accepted
    verified_by_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    accepted_by_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    forward_ms: list[float] = field(default_factory=list)  # verification / decode forwards
    round_ms: list[float] = field(default_factory=list)  # the engine thread's time in the round a step (begin + finish)
    timeline: list[tuple[float, int, bool]] = field(default_factory=list)  # a step: (end, tokens so far, round failed)
    started: float = 0.0  # time.perf_counter() at the start
    failed_rounds: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mean_accepted(self) -> float:
        """Accepted drafts per request-round that wanted drafts (a drafter with nothing to propose,
        such as prompt lookup without a match, scores 0 there; a failed round is the system's, not
        the drafter's, and is counted in failed_rounds instead)."""
        return self.accepted / self.wanted_rounds if self.wanted_rounds else 0.0

    @property
    def mean_accepted_full(self) -> float:
        """Accepted drafts per request-round of N: rounds whose request had at least N + 1 tokens left,
        so the length limit did not cut what could be verified (the drafter's own measure)."""
        return self.full_accepted / self.full_rounds if self.full_rounds else 0.0

    @property
    def accept_by_position(self) -> np.ndarray:
        """Share of full rounds (see mean_accepted_full) accepting draft j."""
        return self.accepted_by_pos / max(1, self.full_rounds)


class SpecEngine:
    """Generates for a stream of requests, at most `max_batch` at a time, drafting with `drafts`."""

    def __init__(self, target: TargetEngine, drafts, *, max_batch: int, window: int, seed: int = 0,
                 min_confidence: float = 0.0) -> None:
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"min_confidence {min_confidence}: a probability in [0, 1]")
        self.target, self.drafts = target, drafts
        self.min_conf = np.float32(min_confidence)
        self.N, self.W, self.B = int(drafts.num_spec), int(window), int(max_batch)
        if max_batch > target.slots:
            raise ValueError(f"max_batch {max_batch} > the target cache's {target.slots} slots")
        S, L, N = target.slots, target.max_len, self.N
        self.seq = np.zeros((S, L + N + 2), np.int64)
        self.margin = np.zeros((S, L + N + 2, 3), np.float32)
        self.length = np.zeros(S, np.int64)  # tokens in the cache; the anchor is seq[s, length]
        self.plen = np.zeros(S, np.int64)
        self.made = np.zeros(S, np.int64)  # tokens generated so far
        self.want = np.zeros(S, np.int64)
        self.rid = np.full(S, -1, np.int64)
        self.uid = np.zeros(S, np.int64)
        self.temp = np.zeros(S, np.float32)
        self.seed = np.zeros(S, np.int64)
        self.d_ids = np.full((S, N), -1, np.int64)
        self.d_n = np.zeros(S, np.int64)
        self.d_ok = np.zeros(S, bool)  # the round that answered this slot's drafts did not fail
        self.d_conf = np.ones((S, N), np.float32)  # the drafter's confidence in each draft (1: none given)
        self.d_sup = np.full((S, N, SUPPORT), -1, np.int32)
        self.d_q = np.zeros((S, N, SUPPORT), np.float32)
        self.gen = torch.Generator().manual_seed(seed)

    # ------------------------------------------------------------------ one run

    def run(self, requests: list[Request], stop: Callable[[RunStats], bool] | None = None) -> RunStats:
        """Generate for every request (or until `stop(stats)` says so after a step: the unfinished are
        dropped, their slots freed).

        The engine works while the round is in flight: a slot freed by this step's verification gets
        its next request prefilled between the round's `begin` and `finish`. The joiner's prompt rows
        go out with the next round, in front of the row that its first verification (of no drafts:
        one token) finalises."""
        st = RunStats(verified_by_pos=np.zeros(self.N, np.int64), accepted_by_pos=np.zeros(self.N, np.int64))
        queue = deque(requests)
        for r in requests:
            if len(r.prompt) + r.max_new + self.N + 1 > self.target.max_len:
                raise ValueError(f"request {r.rid}: prompt + max_new + N exceeds the cache's max_len")
        free = list(range(self.B))[::-1]
        active: list[int] = []  # slots whose request is prefilled and not finished
        t0 = st.started = time.perf_counter()
        held = self._join(queue, free, active, st)  # the first step has no round to prefill during
        while active:
            part = self._verify(np.array(active, np.int64), st)
            if held is not None:
                part = _merge(held, part, self.W)
            f = self._finalised([part])
            st.steps += 1
            done = self.made[f.slots] >= self.want[f.slots]
            for s in f.slots[done].tolist():
                self._retire(s, active, free, st)
            if done.any():
                f = _drop(f, ~done)
            pending, begun_s = None, 0.0
            if len(f.slots):
                r0 = time.perf_counter()
                pending = self.drafts.begin(f)
                begun_s = time.perf_counter() - r0
            held = self._join(queue, free, active, st)  # while the round is in flight
            failed = self._land(f, pending, begun_s, st) if len(f.slots) else False
            st.timeline.append((time.perf_counter(), int(st.tokens), failed))
            if stop is not None and stop(st):
                self.rid[np.array(active, np.int64)] = -1
                break
        st.elapsed_s = time.perf_counter() - t0
        return st

    def _land(self, f: Finalised, pending, begun_s: float, st: RunStats) -> bool:
        """Wait for the round in flight and take its drafts; True when it failed."""
        r0 = time.perf_counter()
        failed = self._finish(f, self.drafts.finish(pending), st)
        st.round_ms.append((begun_s + time.perf_counter() - r0) * 1e3)  # what the round cost the engine's thread
        return failed

    def _join(self, queue: deque, free: list[int], active: list[int], st: RunStats):
        """Admit queued requests into the free slots and prefill them (their first token); those that
        wanted only it are done at once. Returns their prefill part for the next round, or None."""
        held = None
        while queue and free:
            joined = []
            while queue and free:
                s = free.pop()
                self._admit(s, queue.popleft())
                joined.append(s)
            part = self._prefill(np.array(joined, np.int64), st)
            active.extend(joined)
            done = self.made[part[0]] >= self.want[part[0]]
            for s in part[0][done].tolist():
                self._retire(s, active, free, st)
            if not done.all():
                part = _keep_part(part, ~done)
                held = part if held is None else _concat_parts(held, part)
        return held

    def _retire(self, s: int, active: list[int], free: list[int], st: RunStats) -> None:
        rid = int(self.rid[s])
        st.outputs[rid] = self.seq[s, self.plen[s]:self.plen[s] + self.want[s]].copy()
        st.margins[rid] = self.margin[s, self.plen[s]:self.plen[s] + self.want[s]].copy()
        active.remove(s)
        free.append(s)
        self.rid[s] = -1

    def _admit(self, s: int, r: Request) -> None:
        P = len(r.prompt)
        self.seq[s, :P] = r.prompt
        self.plen[s], self.length[s], self.made[s], self.want[s] = P, 0, 0, r.max_new
        self.rid[s], self.temp[s], self.seed[s] = r.rid, r.temperature, r.seed
        self.uid[s] = next(_uids)
        self.d_n[s] = 0
        self.d_ok[s] = False

    # ------------------------------------------------------------------ the forwards

    def _emit(self, logits: torch.Tensor, drafts: torch.Tensor, k: torch.Tensor, slots: np.ndarray):
        """Acceptance for each row (greedy where temperature is 0, sampled elsewhere)."""
        temp = torch.from_numpy(self.temp[slots])
        v = accept_greedy(logits, drafts, k)
        hot = torch.nonzero(temp > 0).flatten()
        if len(hot):
            h = hot.numpy()
            sup = torch.from_numpy(self.d_sup[slots[h], :drafts.shape[1]])
            q = torch.from_numpy(self.d_q[slots[h], :drafts.shape[1]])
            vs = accept_sampled(logits[hot], temp[hot], drafts[hot], k[hot], sup, q, self.gen)
            v.m[hot], v.tokens[hot] = vs.m, vs.tokens
        return v

    def _write(self, slots: np.ndarray, at: np.ndarray, v, logits: torch.Tensor) -> None:
        """Emitted tokens (the first m + 1 of v.tokens) into seq from position `at`, with the top-2
        logits of each (for showing a near-tie flip if one ever happens)."""
        m = v.m.numpy()
        b, j = np.nonzero(np.arange(v.tokens.shape[1])[None] <= m[:, None])  # the m + 1 emitted, row by row
        s, p = slots[b], at[b] + j
        self.seq[s, p] = v.tokens.numpy()[b, j]
        top = logits[torch.from_numpy(b), torch.from_numpy(j)].topk(2, dim=-1)  # the emitted positions' only
        vals, ids = top.values.numpy(), top.indices.numpy()
        self.margin[s, p, 0] = vals[:, 0]
        self.margin[s, p, 1] = ids[:, 1]
        self.margin[s, p, 2] = vals[:, 1]

    def _prefill(self, slots: np.ndarray, st: RunStats):
        P = self.plen[slots]
        toks = torch.from_numpy(np.stack([np.pad(self.seq[s, :p], (0, int(P.max()) - p)) for s, p in zip(slots, P, strict=True)]))
        need = torch.zeros(toks.shape, dtype=torch.bool)
        need[torch.arange(len(slots)), torch.from_numpy(P - 1)] = True  # only the last prompt position's
        logits, rows = self.target.forward(slots, toks, np.zeros(len(slots), np.int64), need)
        rows_idx = torch.arange(len(slots))
        last = logits[rows_idx, torch.from_numpy(P - 1)][:, None]  # [n, 1, V]
        v = self._emit(last, torch.zeros(len(slots), 0, dtype=torch.long), torch.zeros(len(slots), dtype=torch.long),
                       slots)
        self._write(slots, P, v, last)
        self.length[slots] = P
        self.made[slots] = 1
        st.tokens += len(slots)
        st.request_forwards += len(slots)
        j = np.arange(toks.shape[1])[None]
        keep = (j < P[:, None]) & (j >= (P - self.W)[:, None])
        valid = np.minimum(P, self.W)
        return slots, P, valid, P - valid, np.zeros(len(slots), np.int64), _rows(rows, keep)

    def _verify(self, slots: np.ndarray, st: RunStats):
        a = self.length[slots]
        left = self.want[slots] - self.made[slots]
        could = self.d_ok[slots] & (left > 1)  # drafts were wanted and asked for
        full = could & (left > self.N)  # and the length limit does not cut them
        k = np.clip(np.minimum(self.d_n[slots], left - 1), 0, self.N)
        if self.min_conf > 0:  # verify while the drafter expects them all so far accepted
            sure = np.cumprod(self.d_conf[slots], axis=1) >= self.min_conf
            k = np.minimum(k, np.argmin(np.c_[sure, np.zeros(len(slots), bool)], axis=1))
        Q = int(k.max()) + 1
        j = np.arange(Q - 1)[None]
        drafts = np.where(j < k[:, None], self.d_ids[slots, :Q - 1], -1)
        toks = torch.from_numpy(np.concatenate([self.seq[slots, a][:, None], drafts.clip(min=0)], 1))
        f0 = time.perf_counter()
        need = torch.from_numpy(np.arange(Q)[None] <= k[:, None])  # the anchor's and each draft's
        logits, rows = self.target.forward(slots, toks, a, need)
        st.forward_ms.append((time.perf_counter() - f0) * 1e3)
        v = self._emit(logits, torch.from_numpy(drafts), torch.from_numpy(k), slots)
        self._write(slots, a + 1, v, logits)
        m = v.m.numpy()
        self.length[slots] = a + m + 1
        self.made[slots] += m + 1
        st.tokens += int((m + 1).sum())
        st.request_forwards += len(slots)
        st.wanted_rounds += int(could.sum())
        st.full_rounds += int(full.sum())
        st.drafted_rounds += int((k > 0).sum())
        st.accepted += int(m.sum())
        st.full_accepted += int(m[full].sum())
        pos = np.arange(self.N)[None]
        st.verified_by_pos += (pos < k[full][:, None]).sum(0)
        st.accepted_by_pos += (pos < m[full][:, None]).sum(0)
        jq = np.arange(Q)[None]
        keep = (jq <= m[:, None]) & (jq > (m - self.W)[:, None])
        valid = np.minimum(m + 1, self.W)
        return slots, Q * np.ones(len(slots), np.int64), valid, a + m + 1 - valid, k, _rows(rows, keep)

    # ------------------------------------------------------------------ the round

    def _finalised(self, parts) -> Finalised:
        slots = np.concatenate([p[0] for p in parts])
        rows = [p[5] for p in parts if p[5] is not None]
        anchor_pos = self.length[slots]
        left = self.want[slots] - self.made[slots]
        return Finalised(
            req_ids=self.uid[slots].copy(), slots=slots, qlen=np.concatenate([p[1] for p in parts]),
            valid=np.concatenate([p[2] for p in parts]), first_pos=np.concatenate([p[3] for p in parts]),
            anchor=self.seq[slots, anchor_pos], k_window=np.concatenate([p[4] for p in parts]),
            need_draft=left > 1, rows=np.concatenate(rows) if rows else None, temperature=self.temp[slots].copy(),
            seed=self.seed[slots].copy(),
            context=[self.seq[s, :p + 1] for s, p in zip(slots.tolist(), anchor_pos.tolist(), strict=True)])

    def _finish(self, f: Finalised, d: Drafts, st: RunStats) -> bool:
        """The reply's drafts become each request's next verification; True when the round failed."""
        st.failed_rounds += int(d.failed)
        s = f.slots
        self.d_n[s] = np.minimum(d.n, self.N)
        self.d_ok[s] = f.need_draft & (not d.failed)
        self.d_ids[s] = d.ids[:, :self.N]
        self.d_conf[s] = 1.0 if d.confidence is None else d.confidence[:, :self.N]
        if d.support is not None and d.q is not None:
            self.d_sup[s], self.d_q[s] = d.support, d.q
        else:
            self.d_sup[s], self.d_q[s] = -1, 0.0
        return d.failed


def _rows(rows: torch.Tensor | None, keep: np.ndarray) -> np.ndarray | None:
    """The kept positions' rows, request by request in position order, as bytes ([sum(keep), row_bytes]
    uint8): numpy from here on, so the shim's enqueue takes them without a torch call (each a few us
    when the round runs cold, as it does between forwards)."""
    if rows is None:
        return None
    return rows.view(torch.uint8).numpy()[keep]


def _keep_part(part, keep: np.ndarray):
    """A forward's part (slots, qlen, valid, first_pos, k, rows) for the kept requests only."""
    slots, qlen, valid, first, k, rows = part
    if rows is not None:
        rows = rows[np.repeat(keep, valid)]
    return slots[keep], qlen[keep], valid[keep], first[keep], k[keep], rows


def _concat_parts(a, b):
    return (*(np.concatenate([x, y]) for x, y in zip(a[:5], b[:5], strict=True)),
            None if a[5] is None else np.concatenate([a[5], b[5]]))


def _merge(held, part, W: int):
    """The verification part with each joiner's prompt rows (its prefill part, `held`) in front of the
    row its first verification finalised: positions [first_pos, first_pos + valid) of the two are
    contiguous, and only the last W go out. One gather for the whole part, no loop over requests
    (tests/test_spec_rounds.py holds it to the request-by-request definition)."""
    hs, _, hv, hf, _, hr = held
    slots, qlen, valid, first, k, rows = part
    hidx = np.full(int(max(slots.max(initial=0), hs.max(initial=0))) + 1, -1, dtype=np.int64)
    hidx[hs] = np.arange(len(hs))
    h = hidx[slots]  # the joiner's index in held, -1 for a request that is not joining
    j = h >= 0
    hj = h[j]
    if not np.array_equal(hf[hj] + hv[hj], first[j]):
        raise AssertionError("a joiner's prompt rows end where its first verification's begin")
    take = np.zeros(len(slots), dtype=np.int64)  # prompt rows put in front: as many as fit in W
    take[j] = np.minimum(hv[hj] + valid[j], W) - valid[j]
    out_rows = None
    if rows is not None:
        h_end = np.cumsum(hv)  # end of each joiner's prompt rows in hr
        o_start = np.cumsum(valid) - valid  # start of each request's own rows in `rows`
        starts = np.empty(2 * len(slots), dtype=np.int64)  # per request: its prompt rows, then its own
        lens = np.empty(2 * len(slots), dtype=np.int64)
        starts[0::2] = np.where(j, h_end[np.maximum(h, 0)] - take, 0) if len(hv) else 0
        starts[1::2] = len(hr) + o_start
        lens[0::2], lens[1::2] = take, valid
        seg_at = np.cumsum(lens) - lens
        idx = np.repeat(starts - seg_at, lens) + np.arange(int(lens.sum()))
        out_rows = np.concatenate([hr, rows])[idx]
    return slots, qlen, (valid + take).astype(valid.dtype), (first - take).astype(first.dtype), k, out_rows


def _drop(f: Finalised, keep: np.ndarray) -> Finalised:
    """Only the requests that go on (a finished request is not enqueued: its slot's next owner is new)."""
    rows = None
    if f.rows is not None:
        per = np.repeat(keep, f.valid)
        rows = f.rows[per]
    arr = {k: getattr(f, k)[keep] for k in ("req_ids", "slots", "qlen", "valid", "first_pos", "anchor", "k_window",
                                           "need_draft", "temperature", "seed")}
    return Finalised(**arr, rows=rows, context=[c for c, k in zip(f.context, keep, strict=True) if k])
