"""A proxy side and an engine side over one real segment, in one thread: round by round, no timing.

The rig itself is the package's (dspark_proxy/bench/rig.py, shared with the benchmarks).
`Rig.round(...)` enqueues through the real Shim, runs RoundCore.handle for that round, and reads the
reply through the real Shim, so every test goes through the actual hand-off code (stamps, words,
publish, seqlock read) while staying deterministic.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dspark_proxy.bench.rig import RoundRig
from dspark_proxy.integrity import integrity_drafts, integrity_hash
from dspark_proxy.link.draft_client import StepOutcome
from dspark_proxy.round.core import RoundSettings
from dspark_proxy.shm.layout import META_SLOTS, LayoutParams
from dspark_proxy.worker.inproc import InProcessClient


def row_of(req: int, pos: int, row_bytes: int) -> np.ndarray:
    """Deterministic row bytes for (request, position)."""
    rng = np.random.default_rng(req * 1_000_003 + pos)
    return rng.integers(0, 256, row_bytes, dtype=np.uint8)


class ScriptedClient(InProcessClient):
    """The in-process worker, plus knobs: fail the next steps, raise, go not-ready or disabled."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.fail_reason: str | None = None
        self.raise_next = False
        self.ready = True
        self.before_step = None  # callable run inside step() (e.g. the watchdog claiming the round)
        self.sent_rows: list[np.ndarray] = []
        self.sent_entries: list[np.ndarray] = []

    def connection_epoch(self):
        return self.epoch if self.ready and not self.disabled else None

    def step(self, prefix, entries, n_rows, **kw):
        if self.before_step is not None:
            self.before_step()
        if self.raise_next:
            self.raise_next = False
            raise RuntimeError("injected client bug")
        self.sent_entries.append(entries.copy())
        parts = [np.asarray(r, dtype=np.uint8).reshape(-1, self.row_bytes) for r in kw["rows"]]  # views of the ring too
        self.sent_rows.append(np.concatenate(parts) if parts else np.zeros((0, self.row_bytes), np.uint8))
        if self.fail_reason is not None:
            return StepOutcome(False, self.fail_reason, None, 10.0)
        return super().step(prefix, entries, n_rows, **kw)


class Rig(RoundRig):
    """The shared round rig (dspark_proxy/bench/rig.py) over a ScriptedClient, plus batches of
    deterministic rows and an oracle check of the drafts."""

    def __init__(self, name: str, *, M: int = 8, N: int = 3, W: int = 4, B: int = 16, max_rows: int | None = None,
                 R: int = 2, breaker: tuple[int, int] = (3, 5), deadline_ms: float = 10_000.0,
                 sampled: bool = False, settings: RoundSettings | None = None, client=None) -> None:
        """client: any DraftClient (default: a ScriptedClient of these shapes)."""
        self.M, self.N, self.W, self.B = M, N, W, B
        p = LayoutParams(max_reqs=M, num_spec=N, window=W, row_bytes=B, max_rows=max_rows or M * W,
                         resync_per_round=R, sampled=sampled)
        super().__init__(name, p, client or ScriptedClient(max_reqs=M, num_spec=N, window=W, row_bytes=B),
                         deadline_ms=deadline_ms, breaker=breaker, settings=settings)
        self.pos: dict[int, int] = {}  # request -> next position (its rows so far)

    def __enter__(self) -> Rig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ rounds

    def batch(self, reqs: list[tuple[int, int, int]], *, first_pos: dict[int, int] | None = None) -> dict:
        """reqs: (request id, slot, rows this round). Positions continue per request unless overridden."""
        n = len(reqs)
        rows, valid, fp, anchor = [], [], [], []
        for r, _s, v in reqs:
            p0 = (first_pos or {}).get(r, self.pos.get(r, 0))
            rows += [row_of(r, p0 + j, self.B) for j in range(v)]
            valid.append(v)
            fp.append(p0)
            anchor.append((r * 7919 + p0 + v) % 50_000)
            self.pos[r] = p0 + v
        return dict(req_ids=np.array([r for r, _, _ in reqs], np.int64), slots=np.array([s for _, s, _ in reqs]),
                    qsl=np.arange(n + 1), need_draft=np.ones(n, bool), k_window=np.zeros(n, np.int64),
                    rows=np.array(rows, np.uint8).reshape(-1, self.B), valid=np.array(valid),
                    first_pos=np.array(fp), anchor=np.array(anchor))

    def round(self, reqs: list[tuple[int, int, int]], *, handle: bool = True, **kw):
        b = self.batch(reqs, **kw)
        return self.run(b, handle=handle), b

    def check_drafts(self, reply, b) -> int:
        """Usable drafts checked against the integrity oracle; returns how many were checked."""
        checked = 0
        for i in np.flatnonzero(reply.ok_mask):
            r = int(b["req_ids"][i])
            anchor_pos = int(b["first_pos"][i] + b["valid"][i])
            w = int(round(float(reply.confidence[i][0]) * self.W))
            assert 1 <= w <= self.W
            rows = np.concatenate([row_of(r, p, self.B) for p in range(anchor_pos - w, anchor_pos)])
            h = integrity_hash(int(b["anchor"][i]), anchor_pos, rows)
            ids = np.zeros(self.N, np.int32)
            conf = np.zeros(self.N, np.float32)
            integrity_drafts(h, w, self.W, self.N, 0, ids, conf)
            assert np.array_equal(reply.draft_ids[i], ids), f"request {r}: wrong drafts"
            checked += 1
        return checked


def staged_slots(rig: Rig, t: int) -> list[int]:
    """The windows the engine staged with round t, from round t's descriptor."""
    d = rig.seg.desc[t % META_SLOTS]
    return d["staged_slots"][: int(d["n_staged"])].tolist()


def full_windows(rig: Rig, reply, b) -> list[bool]:
    """Per request: a usable draft computed from every row the engine holds for it (up to W), counted
    from the rig's own record of the rows written (the inproc worker reports rows used / W as the
    first confidence)."""
    out = []
    for i, r in enumerate(b["req_ids"].tolist()):
        held = min(rig.W, rig.pos[r])
        used = int(round(float(reply.confidence[i][0]) * rig.W)) if reply.ok_mask[i] else 0
        out.append(used == held)
    return out


def rounds_until_full(rig: Rig, reqs: list[tuple[int, int, int]], rounds: int, paced: list[int], *,
                      each: Callable[[], None] | None = None) -> int | None:
    """Run `rounds` rounds of reqs after a fault, every draft checked right meanwhile; until every live
    window is full, record each round's pacing (the resync cap) in `paced`; after, assert it stays
    full. Returns the round it got full, None if never. `each` runs after every round."""
    full_at = None
    for _ in range(rounds):
        reply, b = rig.round(reqs)
        assert rig.check_drafts(reply, b) == int(reply.ok_mask.sum())  # every draft right meanwhile
        if each is not None:
            each()
        if full_at is None:
            paced.append(rig.core.pacer.resync_cap)
            if all(full_windows(rig, reply, b)):
                full_at = rig.t
        else:
            assert all(full_windows(rig, reply, b)), f"round {rig.t} lost its whole window again"
    return full_at


def decode_batch(t: int, row_bytes: int, n: int = 2) -> dict:
    """Round t of n requests in slots 0..n-1, one decode row each at position t: the enqueue
    arguments of an engine that only keeps decoding (thread-mode tests drive whole proxies with it)."""
    return dict(req_ids=np.arange(n, dtype=np.int64), slots=np.arange(n), qsl=np.arange(n + 1),
                need_draft=np.ones(n, bool), k_window=np.zeros(n, np.int64),
                rows=np.full((n, row_bytes), t % 251, np.uint8), valid=np.ones(n, np.int64),
                first_pos=np.full(n, t, np.int64), anchor=np.full(n, t, np.int64))
