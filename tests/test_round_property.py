"""Whatever rounds the engine runs and whatever fails on the way, every usable draft is the oracle's.

Hypothesis drives the real Shim, RoundCore and in-process integrity worker (tests/rig.py, one thread,
no timing) through random rounds: new requests and slot reuse, 0..W rows, rewinds that rewrite rows
with new bytes, STEP timeouts, reconnects (the worker loses every window), the breaker, and a STEP row
cap. Every row written gets fresh random bytes, so a draft computed from a stale, missing or misrouted
row differs from the one recomputed here from the rows the engine last wrote at those positions.
A long run: ROUND_PROPERTY_EXAMPLES=5000 pytest tests/test_round_property.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dspark_proxy.integrity import integrity_drafts, integrity_hash
from tests.conftest import _unlink, new_segment_name
from tests.rig import Rig

EXAMPLES = int(os.environ.get("ROUND_PROPERTY_EXAMPLES", "60"))
pytestmark = pytest.mark.timeout(120 if EXAMPLES <= 60 else 0)  # a long run is bounded by its examples

M, N, W, B = 6, 3, 4, 8
EVENTS = ["ok"] * 8 + ["timeout", "reconnect", "cap", "uncap"]


class _Engine:
    """The engine's view: who owns each slot, each request's next position, the bytes of every row."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.owner: dict[int, int] = {}
        self.pos: dict[int, int] = {}
        self.rows: dict[tuple[int, int], np.ndarray] = {}
        self.next_req = 1
        self.run: dict[int, tuple[int, int, int]] = {}  # slot -> (request, first, end) sent contiguously

    def batch(self, plan: list[tuple[int, bool, int, int | None]]) -> dict:
        """plan: (slot, new owner?, rows, rewind to) per request."""
        n = len(plan)
        req_ids, slots, valid, first, anchor, rows = [], [], [], [], [], []
        for s, new, v, rewind in plan:
            if new or s not in self.owner:
                self.owner[s] = self.next_req
                self.next_req += 1
            r = self.owner[s]
            p0 = self.pos.get(r, 0)
            if rewind is not None:
                p0 = min(rewind, p0)
            for p in range(p0, p0 + v):
                self.rows[(r, p)] = self.rng.integers(0, 256, B, dtype=np.uint8)  # new bytes every write
                rows.append(self.rows[(r, p)])
            self.pos[r] = p0 + v
            held = self.run.get(s)
            if held is not None and held[0] == r and held[2] == p0 and held[2] > held[1] and v > 0:
                self.run[s] = (r, held[1], p0 + v)
            else:
                self.run[s] = (r, p0, p0 + v)
            req_ids.append(r)
            slots.append(s)
            valid.append(v)
            first.append(p0)
            anchor.append(int(self.rng.integers(0, 50_000)))
        return dict(req_ids=np.array(req_ids, np.int64), slots=np.array(slots), qsl=np.arange(n + 1),
                    need_draft=np.ones(n, bool), k_window=np.zeros(n, np.int64),
                    rows=np.array(rows, np.uint8).reshape(-1, B), valid=np.array(valid),
                    first_pos=np.array(first), anchor=np.array(anchor))

    def held(self, slot: int, anchor_pos: int) -> int:
        """Rows this engine holds for the slot's anchor, up to W (its own record, not the proxy's)."""
        _r, first, end = self.run[slot]
        assert end == anchor_pos
        return min(W, anchor_pos - first)

    def check(self, reply, b: dict, full: list[int] | None = None) -> int:
        """Every usable draft against the oracle; `full` gets how many had a full window."""
        checked = 0
        assert np.array_equal(reply.ok_mask, reply.n_drafts > 0)
        assert (reply.draft_ids[~reply.ok_mask] == -1).all()
        for i in np.flatnonzero(reply.ok_mask):
            r = int(b["req_ids"][i])
            anchor_pos = int(b["first_pos"][i] + b["valid"][i])
            w = int(round(float(reply.confidence[i][0]) * W))
            assert 1 <= w <= min(W, anchor_pos), (r, w, anchor_pos)
            window = np.concatenate([self.rows[(r, p)] for p in range(anchor_pos - w, anchor_pos)])
            ids = np.zeros(N, np.int32)
            conf = np.zeros(N, np.float32)
            integrity_drafts(integrity_hash(int(b["anchor"][i]), anchor_pos, window), w, W, N, 0, ids, conf)
            assert np.array_equal(reply.draft_ids[i], ids), f"request {r}: a wrong draft reached the engine"
            assert reply.n_drafts[i] == N
            checked += 1
            if full is not None:
                full.append(int(w >= self.held(int(b["slots"][i]), anchor_pos)))
        return checked

    def tail(self, rig: Rig, data) -> None:
        """Fault-free rounds over a drawn subset of the owned slots, each going on without a rewind:
        every usable draft is full again within ceil(live / windows a round) + 1 rounds of the first
        round whose reply is not ROUND_FAILED (its STEP reached the worker)."""
        rig.client.fail_reason = None
        rig.core.pacer.row_cap = 0
        owned = sorted(self.owner)
        live = data.draw(st.lists(st.sampled_from(owned), min_size=1, max_size=len(owned), unique=True),
                         label="live slots") if owned else []
        if not live:
            return
        windows = int(rig.stats.gauge("resync_windows_per_round", 0) or rig.core.R)
        bound = -(-len(live) // windows) + 1
        r0 = None
        for k in range(bound + rig.breaker.cooldown + 4):
            plan = [(s, False, data.draw(st.integers(1, W), label="tail rows"), None) for s in live]
            b = self.batch(plan)
            rig.t += 1
            rig.shim.enqueue(rig.t, **b)
            rig.core.handle(rig.t, 0.0)
            reply = rig.shim.read_reply(rig.t)
            full: list[int] = []
            self.check(reply, b, full)
            if r0 is None and reply.status != 2:
                r0 = k
            if r0 is not None and k - r0 + 1 > bound:
                assert all(full), (f"round {k - r0 + 1} after the first that reached the worker: {full.count(0)} "
                                   f"of {len(full)} usable drafts not from the full window (bound {bound})")
        assert r0 is not None, "no tail round reached the worker"


def _draw_plan(data) -> list[tuple[int, bool, int, int | None]]:
    """One round's requests: (slot, new owner?, rows 0..W, rewind to) for a random set of slots."""
    slots = data.draw(st.lists(st.integers(0, M - 1), min_size=1, max_size=M, unique=True), label="slots")
    return [(s, data.draw(st.integers(0, 5), label="new owner") == 0, data.draw(st.integers(0, W), label="rows"),
             data.draw(st.one_of(st.none(), st.integers(0, 8)), label="rewind")) for s in slots]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_usable_draft_is_the_oracles(data):
    name = new_segment_name("round-property")
    rig = Rig(name, M=M, N=N, W=W, B=B, R=2, breaker=(3, 2))
    eng = _Engine(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    checked = 0
    try:
        for _ in range(data.draw(st.integers(5, 40), label="rounds")):
            ev = data.draw(st.sampled_from(EVENTS), label="event")
            rig.client.fail_reason = "timeout" if ev == "timeout" else None
            if ev == "reconnect":
                rig.client.epoch += 1
                rig.client.new_session("test: the worker lost every window")
            elif ev == "cap":
                rig.core.pacer.row_cap = data.draw(st.integers(1, 2 * W), label="cap")
            elif ev == "uncap":
                rig.core.pacer.row_cap = 0
            b = eng.batch(_draw_plan(data))
            rig.t += 1
            rig.shim.enqueue(rig.t, **b)
            rig.core.handle(rig.t, 0.0)
            checked += eng.check(rig.shim.read_reply(rig.t), b)
        eng.tail(rig, data)
        event(f"drafts checked: {'0' if not checked else '1-9' if checked < 10 else '10+'}")
        event(f"resync rounds: {'0' if not rig.stats.counter('resync_rounds') else '1+'}")
        event(f"left out by the row cap: {'0' if not rig.stats.counter('requests_over_link_cap') else '1+'}")
    finally:
        rig.close()
        _unlink(name)


@pytest.fixture(scope="module")
def worker():
    from dspark_proxy.worker import WorkerServer

    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=B, max_reqs=M)
    srv.start()
    yield srv
    srv.stop()


@settings(max_examples=max(10, EXAMPLES // 3), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.data())
def test_every_usable_draft_is_the_oracles_through_the_real_worker(worker, data):
    """The same over TCP to the real worker (its CRC chains, its statuses, the wire), with the worker
    dropping every window now and then (a new session: it answers UNKNOWN_SLOT and the round resyncs)."""
    from dspark_proxy.link.client import TcpDraftClient

    name = new_segment_name("round-property-tcp")
    client = TcpDraftClient("127.0.0.1", worker.port, max_reqs=M, num_spec=N, window=W, row_bytes=B)
    rig = Rig(name, M=M, N=N, W=W, B=B, R=2, breaker=(3, 2), client=client)
    eng = _Engine(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    try:
        client.start()
        assert client.wait_ready(5.0) is not None
        client.new_session("test: a fresh session per example")
        checked = 0
        for _ in range(data.draw(st.integers(5, 30), label="rounds")):
            ev = data.draw(st.sampled_from(["ok"] * 8 + ["lose", "cap", "uncap"]), label="event")
            if ev == "lose":
                client.new_session("test: the worker forgets every window")
            elif ev == "cap":
                rig.core.pacer.row_cap = data.draw(st.integers(1, 2 * W), label="cap")
            elif ev == "uncap":
                rig.core.pacer.row_cap = 0
            b = eng.batch(_draw_plan(data))
            rig.t += 1
            rig.shim.enqueue(rig.t, **b)
            rig.core.handle(rig.t, 0.0)
            checked += eng.check(rig.shim.read_reply(rig.t), b)
        eng.tail(rig, data)
        event(f"drafts checked: {'0' if not checked else '1-9' if checked < 10 else '10+'}")
    finally:
        client.stop()
        rig.close()
        _unlink(name)


def test_the_property_sees_a_wrong_draft():
    """The check above can fail: a worker that keeps a stale row is caught (a mutant of the real path)."""
    name = new_segment_name("round-property-mutant")
    rig = Rig(name, M=M, N=N, W=W, B=B)
    eng = _Engine(0)
    try:
        b = eng.batch([(0, True, 2, None)])
        rig.t += 1
        rig.shim.enqueue(rig.t, **b)
        rig.core.handle(rig.t, 0.0)
        assert eng.check(rig.shim.read_reply(rig.t), b) == 1
        eng.rows[(1, 0)] = eng.rows[(1, 0)] ^ 1  # the engine "rewrote" position 0; the worker was not told
        b = eng.batch([(0, False, 1, None)])
        rig.t += 1
        rig.shim.enqueue(rig.t, **b)
        rig.core.handle(rig.t, 0.0)
        with pytest.raises(AssertionError, match="wrong draft"):
            eng.check(rig.shim.read_reply(rig.t), b)
    finally:
        rig.close()
        _unlink(name)
