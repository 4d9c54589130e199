"""A proxy side and an engine side over one real segment, in one thread: the rig that the tests
(tests/rig.py), the scaling bench (bench/scaling.py) and scripts/bench_round.py all build on.

`RoundRig` creates a segment (READY, heartbeat far in the future, so the shim never sees the proxy
as dead), a RoundCore over a given client, and a real Shim without its watchdog thread attached to
that segment. `RoundRig.run` enqueues round t through the shim, runs `RoundCore.handle(t)` and
reads the reply: every round goes through the actual hand-off code (stamps, words, publish, the
seqlock read) while staying deterministic, with nothing waiting on another process.
"""

from __future__ import annotations

import time
from typing import Any

from ..link.draft_client import DraftClient
from ..ops.events import EventRing
from ..ops.stats import Stats
from ..round.breaker import CircuitBreaker
from ..round.core import RoundCore, RoundSettings
from ..shm.layout import LayoutParams, State, Word
from ..shm.segment import Segment

__all__ = ["RoundRig", "TimedClient"]


_ns = time.perf_counter_ns


class TimedClient:
    """A client wrapper that keeps the time of each step() (`last_ns`), so a bench can subtract it."""

    def __init__(self, inner: DraftClient) -> None:
        self.inner = inner
        self.last_ns = 0
        # the round calls these every round: bound here, so that the wrapper adds no lookup to what is timed
        self.connection_epoch, self.moved_slots = inner.connection_epoch, inner.moved_slots

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def step(self, prefix: Any, entries: Any, n_rows: int, *, step_id: int, step_flags: int, epoch: int, rows: list,
             sample_meta: Any = None, timeout_s: float = 1.0) -> Any:
        # the round's call, spelled out: forwarding *a, **kw would add its own cost to the round timed
        t0 = _ns()
        out = self.inner.step(prefix, entries, n_rows, step_id=step_id, step_flags=step_flags, epoch=epoch, rows=rows,
                              sample_meta=sample_meta, timeout_s=timeout_s)
        self.last_ns = _ns() - t0
        return out


class RoundRig:
    """A segment, a RoundCore over `client` and an attached Shim for one layout."""

    def __init__(self, name: str, params: LayoutParams, client: DraftClient, *, deadline_ms: float = 10_000.0,
                 breaker: tuple[int, int] = (3, 5), settings: RoundSettings | None = None) -> None:
        from engine_shim.shim import Shim  # the engine side: imported only where a rig is built

        self.params = params
        self.seg = Segment.create(name, params, deadline_ms=deadline_ms)
        self.shim: Any = None
        try:
            self.seg.set_word(Word.STATE, State.READY)
            self.seg.set_word(Word.HEARTBEAT_NS, 1 << 62)
            self.client = client
            self.stats = Stats()
            self.breaker = CircuitBreaker(*breaker)
            self.core = RoundCore(self.seg, client, self.stats, EventRing(64), self.breaker,
                                  settings or RoundSettings())
            self.shim = Shim(name, max_reqs=params.max_reqs, num_spec=params.num_spec, window=params.window,
                             row_bytes=params.row_bytes, sampled=params.sampled, start_watchdog=False)
            if not self.shim.offer(Segment.open(name)):
                raise RuntimeError("round rig: the shim refused the segment")
        except BaseException:
            self.close()
            raise
        self.t = 0

    def run(self, batch: dict[str, Any], *, handle: bool = True) -> Any:
        """One round: enqueue (the next t), handle unless told not to, read the reply."""
        self.t += 1
        self.shim.enqueue(self.t, **batch)
        if handle:
            self.core.handle(self.t, 0.0)
        return self.shim.read_reply(self.t)

    def close(self) -> None:
        """Idempotent enough for a finally: detach the shim, unlink and close the segment."""
        if self.shim is not None:
            self.shim.close()
            self.shim = None
        if self.seg is not None:
            self.seg.unlink()
            self.seg.close()
            self.seg = None
