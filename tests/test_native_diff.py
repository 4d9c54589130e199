"""The C hot paths (dspark_proxy/round/_fastround.c) against their Python reference models, side by side.

Two rigs over two segments, one built with DSPARK_NATIVE=0 (the reference), one with the default (C),
driven through the same random rounds: new and continuing requests, prefill chunks, forward jumps and
rewinds, cleared slots, rows that do not fit the staging, resync windows asked for, bad inputs, rounds
the watchdog claims first, corrupted descriptors, failing STEPs, pages the engine must not trust. After every round both must hold the
same bytes on the reply page, in the staging, the meta and desc slots, the resync request and windows,
the same STEP (prefix bytes, entries, rows), the same ring models and engine ring, the same reply and
every counter the same.
"""

from __future__ import annotations

import contextlib
import os
import uuid

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_proxy.shm.layout import META_SLOTS
from engine_shim.inputs import ShimError

from .rig import Rig, ScriptedClient

M, N, W, B = 8, 3, 4, 16


@contextlib.contextmanager
def _native(on: bool):
    old = os.environ.get("DSPARK_NATIVE")
    os.environ["DSPARK_NATIVE"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["DSPARK_NATIVE"]
        else:
            os.environ["DSPARK_NATIVE"] = old


class RecordingClient(ScriptedClient):
    """ScriptedClient that also keeps each STEP's prefix bytes (headers, entries, sample meta)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.prefixes: list[bytes] = []

    def step(self, prefix, entries, n_rows, **kw):
        out = super().step(prefix, entries, n_rows, **kw)
        self.prefixes.append(bytes(prefix))
        return out


def _rig(on: bool, max_rows: int, sampled: bool) -> Rig:
    with _native(on):
        client = RecordingClient(max_reqs=M, num_spec=N, window=W, row_bytes=B)
        rig = Rig(f"t_native_{'c' if on else 'py'}_{uuid.uuid4().hex[:8]}", M=M, N=N, W=W, B=B, max_rows=max_rows,
                  R=2, sampled=sampled, client=client)
    assert rig.shim.native is on and rig.core.desc.native is on
    return rig


_round = st.fixed_dictionaries({
    "n": st.integers(0, M),
    "perm_seed": st.integers(0, 2**16),
    # a new request in this batch position (rarely: windows must grow to W for resyncs to happen)
    "new": st.lists(st.sampled_from([False] * 9 + [True]), min_size=M, max_size=M),
    "valid": st.lists(st.integers(0, W), min_size=M, max_size=M),
    "move": st.lists(st.sampled_from(["go"] * 8 + ["jump", "rewind"]), min_size=M, max_size=M),
    "fault": st.sampled_from(["none"] * 6 + ["bad_dup", "bad_valid", "bad_qsl", "watchdog", "corrupt", "step_fail",
                                             "dirty", "raise", "bad_page"]),
    "need": st.lists(st.booleans(), min_size=M, max_size=M),
    "k_window": st.lists(st.integers(0, 300), min_size=M, max_size=M),  # the entry keeps at most 255
})


class Driver:
    """The engine's schedule, shared by both rigs: which request sits in which slot, its next position."""

    def __init__(self, sampled: bool) -> None:
        self.owner = list(range(M))
        self.next_req = M
        self.pos = [0] * M
        self.sampled = sampled
        self.rng = np.random.default_rng(7)

    def batch(self, r: dict) -> tuple[dict, np.ndarray]:
        n = r["n"]
        slots = np.random.default_rng(r["perm_seed"]).permutation(M)[:n].astype(np.int64)
        valid = np.array(r["valid"][:n], dtype=np.int64)
        first = np.zeros(n, np.int64)
        req = np.zeros(n, np.int64)
        for i, s in enumerate(slots.tolist()):
            if r["new"][i]:
                self.owner[s] = self.next_req
                self.next_req += 1
                self.pos[s] = 0
            mv = r["move"][i]
            if mv == "jump":
                self.pos[s] += 2 * W
            elif mv == "rewind":
                self.pos[s] = max(0, self.pos[s] - 3)
            req[i] = self.owner[s]
            first[i] = self.pos[s]
            self.pos[s] += int(valid[i])
        q = np.maximum(valid, 1)
        qsl = np.zeros(n + 1, np.int64)
        np.cumsum(q, out=qsl[1:])
        rows = self.rng.integers(0, 256, (int(valid.sum()), B), dtype=np.uint8)
        b = dict(req_ids=req, slots=slots, qsl=qsl, need_draft=np.array(r["need"][:n], bool),
                 k_window=np.array(r["k_window"][:n], np.int64), rows=rows, valid=valid, first_pos=first,
                 anchor=(first + valid) % 1000)
        if self.sampled:
            b.update(sampled=np.arange(n) % 2 == 0, seed=np.arange(n, dtype=np.int64) + 11,
                     temperature=np.full(n, 0.7, np.float32))
        return b, slots


def _bad(b: dict, fault: str) -> dict:
    b = dict(b)
    n = b["slots"].shape[0]
    if fault == "bad_dup" and n >= 2:
        s = b["slots"].copy()
        s[1] = s[0]
        b["slots"] = s
    elif fault == "bad_valid" and n:
        v = b["valid"].copy()
        v[0] = W + 1
        b["valid"] = v
    elif fault == "bad_qsl" and n:
        q = b["qsl"].copy()
        q[1] = q[0] - 1
        b["qsl"] = q
    return b


def _one(rig: Rig, t: int, b: dict, fault: str) -> tuple:
    """Round t through one rig; what it did, as comparable values."""
    err = ""
    try:
        rig.shim.enqueue(t, **b)
    except ShimError as e:
        err = str(e)
    flags = rig.shim._flags
    if fault == "watchdog" and not err:
        flags.fail(t, int(b["slots"].shape[0]))
    if fault == "corrupt" and not err:
        d = rig.seg.desc[t % META_SLOTS]
        d["rows_gathered"] = int(d["rows_gathered"]) + 1  # stamps intact: the validation must catch it
    rig.client.fail_reason = "worker_error" if fault == "step_fail" else None
    rig.client.raise_next = fault == "raise"
    if fault == "dirty":
        rig.core.slots.mark_dirty(np.arange(0, M, 3))
    rig.core.handle(t, 0.0)
    if fault == "bad_page" and not err:  # a page whose n_drafts is out of range: the engine must not trust it
        page = np.frombuffer(rig.seg.mm, np.int32, count=rig.seg.layout.reply.size, offset=rig.seg.layout.page)
        page[rig.seg.layout.reply.o_ok] = N + 1
        del page
    rep = rig.shim.read_reply(t)
    fields = [rep.status, rep.n, rep.reason, rep.ok_mask.tobytes(), rep.draft_ids.tobytes(),
              rep.confidence.tobytes(), None if rep.n_drafts is None else rep.n_drafts.tobytes()]
    if rep.sample_mask is not None:
        fields += [rep.sample_mask.tobytes(), rep.support_ids.tobytes(), rep.proposal_q.tobytes()]
    return err, fields


def _state(rig: Rig, t: int) -> dict:
    seg, lay = rig.seg, rig.seg.layout
    mm = np.frombuffer(seg.mm, np.uint8)
    region = {k: mm[off:off + size].tobytes() for k, off, size in lay.region_table()
              if k in ("reply_page", "staging", "resync_req", "resync_windows", "meta", "desc")}
    i = t % META_SLOTS
    out = {"regions": region, "meta": seg.meta[i:i + 1].tobytes(), "desc": seg.desc[i:i + 1].tobytes(),
           "page": rig.core.page.tobytes(), "proxy_counters": rig.core.stats.snapshot()["counters"],
           # the latency keys and how many each holds (their values are times, not the same twice)
           "proxy_latency_counts": {k: v["count"] for k, v in rig.core.stats.snapshot()["latency"].items()},
           "shim_counters": rig.shim.counters.snapshot()["counters"],
           "client": (len(rig.client.prefixes), rig.client.prefixes[-1:],
                      [e.tobytes() for e in rig.client.sent_entries[-1:]],
                      [r.tobytes() for r in rig.client.sent_rows[-1:]], dict(rig.client.counters)),
           "engine_ring": rig.shim.ring.rows.tobytes()}
    for side, tab in (("proxy", rig.core.slots), ("engine", rig.shim.ring.table)):
        for f in ("owner", "generation", "lo", "hi", "dirty", "announced", "unknown"):
            out[f"{side}_{f}"] = getattr(tab, f).tobytes()
        out[f"{side}_n_unknown"] = tab.n_unknown
    out["want_resync"] = rig.core.want_resync.tobytes()
    acc = rig.core.accept  # the acceptance sums and gate, which the C path's fused advance also writes
    for f in ("state", "sum", "cnt", "left", "until", "pause"):
        out[f"gate_{f}"] = getattr(acc.gate, f).tobytes()
    out["gate_counts"] = (acc.gate.n_paused, acc.gate.n_probing, acc.gate.next_wake, acc.gate.next_tick,
                          acc.gate.b_state, acc.gate.b_left)
    out["effect"] = (acc.effect.hist.tobytes(), acc.effect.drafts, acc.effect.tokens)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=st.lists(_round, min_size=1, max_size=60), small_staging=st.booleans(), sampled=st.booleans())
def test_native_and_reference_write_the_same_bytes(rounds, small_staging, sampled):
    max_rows = 6 if small_staging else M * W  # 6: some rounds' rows do not fit the staging
    ref, nat = _rig(False, max_rows, sampled), _rig(True, max_rows, sampled)
    try:
        drv = Driver(sampled)
        for t, r in enumerate(rounds, start=1):
            b, _slots = drv.batch(r)
            b = _bad(b, r["fault"])
            got_ref = _one(ref, t, b, r["fault"])
            got_nat = _one(nat, t, b, r["fault"])
            assert got_nat == got_ref, f"round {t} ({r['fault']}): replies differ"
            s_ref, s_nat = _state(ref, t), _state(nat, t)
            for k in s_ref:
                assert s_nat[k] == s_ref[k], f"round {t} ({r['fault']}): {k} differs"
    finally:
        ref.close()
        nat.close()


def test_the_choice_is_made_from_the_environment():
    """DSPARK_NATIVE=0 builds the reference; the default builds the C paths."""
    for on in (False, True):
        rig = _rig(on, M * W, False)
        rig.close()


def test_positions_near_the_int64_limit_behave_the_same():
    """A caller's position so large that first_pos + valid wraps: the C ring write stays inside the
    slot's block (numpy's wrapping and non-negative modulo) and both paths keep the same bytes."""
    from engine_shim.row_ring import EngineRing

    rings = [EngineRing(M, W, B, native=on) for on in (False, True)]
    rng = np.random.default_rng(5)
    for first in (2**63 - 2, 2**63 - 1, 5, 2**63 - W):
        slots = np.array([3, 0], np.int64)
        valid = np.array([W, 2], np.int64)
        fp = np.array([first, first], np.int64)
        rows = rng.integers(0, 256, (int(valid.sum()), B), dtype=np.uint8)
        out = [r.write(slots, np.array([1, 2], np.int64), fp, valid, rows) for r in rings]
        assert np.array_equal(out[0], out[1])
        assert rings[0].rows.tobytes() == rings[1].rows.tobytes()
        for f in ("owner", "generation", "lo", "hi", "dirty", "announced"):
            assert np.array_equal(getattr(rings[0].table, f), getattr(rings[1].table, f)), f
