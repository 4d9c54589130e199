"""The acceptance measure and gate's C sums (`_fastround.accept_round`) against their reference (numpy
in acceptance.py), side by side: two Acceptance objects driven through the same random rounds (requests
in random slots, new owners, verified or not, valid and k_window in and out of range) with settings
small enough that every transition happens (pauses, probes that earn and fail, the batch's pause). After
every round both must hold the same histogram, totals, per-slot arrays, batch state and counters; and
both must clear the same NEED_DRAFT flags."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_proxy import native
from dspark_proxy.ops.stats import Stats
from dspark_proxy.round.acceptance import Acceptance
from dspark_proxy.round.gate import GateSettings

M, N = 6, 4

_round = st.fixed_dictionaries({
    "n": st.integers(0, M),
    "perm_seed": st.integers(0, 2**16),
    "new": st.lists(st.sampled_from([False] * 7 + [True]), min_size=M, max_size=M),
    "valid": st.lists(st.integers(0, 8), min_size=M, max_size=M),
    "k_window": st.lists(st.sampled_from([0, 0, 1, 2, 3, 4, 4, 4, 7, 300, -3]), min_size=M, max_size=M),
    "dt": st.integers(0, 9),  # the engine's step before the round, in ms (the throughput rule's clock)
    "skip": st.sampled_from([False] * 9 + [True]),  # a round the proxy skipped before this one
    "prefill": st.sampled_from([False] * 4 + [True]),  # a round with prefill rows (not timed)
})

# the throughput rule: samples, pauses and probes within the rounds drawn
TPS_GATE = GateSettings(break_even=0.5, patience=4, pause=3, pause_max=12, probe=1, tps_every=6, tps_margin=0.1)
_gates = st.sampled_from([
    GateSettings(break_even=0.0),  # the gate off: the measure only
    GateSettings(break_even=1.0, patience=2, pause=3, pause_max=12, probe=1),
    GateSettings(break_even=1.5, patience=3, pause=2, pause_max=8, probe=2),
    GateSettings(),
    TPS_GATE,
])


def _state(a: Acceptance) -> dict:
    g, e = a.gate, a.effect
    out = {f: getattr(g, f).tobytes() for f in ("state", "sum", "cnt", "left", "until", "pause")}
    out.update(hist=e.hist.tobytes(), drafts=e.drafts, tokens=e.tokens, n_paused=g.n_paused, n_probing=g.n_probing,
               next_wake=g.next_wake, next_tick=g.next_tick, batch=(g.b_state, g.b_left, g.b_from, g.b_until, g.b_pause),
               counters=g.stats.snapshot()["counters"], b_flags=(g.b_sample, g.b_tps, g.b_slow, g.b_more, g.b_judged))
    if g.tps is not None:
        r = g.tps
        out.update(tps=(r.plain, r.drafting, r.plain_at, r.n_d, r.n_p, r.req_d, r.first_t))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=st.lists(_round, min_size=1, max_size=80), gate=_gates)
def test_native_and_reference_acceptance_agree(rounds, gate):
    now = [0]
    ref = Acceptance(M, N, gate, Stats(), native_path=False, clock=lambda: now[0])
    nat = Acceptance(M, N, gate, Stats(), native_path=True, clock=lambda: now[0])
    t, masked = 0, False
    for r in rounds:
        t += 2 if r["skip"] else 1
        n = r["n"]
        slots = np.random.default_rng(r["perm_seed"]).permutation(M)[:n].astype(np.int64)
        valid = np.array(r["valid"][:n], np.int32)
        kw = np.array(r["k_window"][:n], np.int32)
        if masked:  # the engine verifies no drafts after a round that asked none
            kw[:] = 0
        new_owner = np.array(r["new"][:n], bool)
        now[0] += r["dt"] * (5 if np.any(kw > 0) else 1) * 1_000_000  # drafting rounds cost more
        needs = []
        for a in (ref, nat):
            a.round(t, slots, valid, kw, new_owner, int(new_owner.sum()), not r["prefill"])
            need = np.ones(n, bool)
            a.mask(slots, need)
            needs.append(need.tobytes())
        assert needs[0] == needs[1], f"round {t}: NEED_DRAFT differs"
        masked = n > 0 and not need.any()
        s_ref, s_nat = _state(ref), _state(nat)
        for k in s_ref:
            assert s_nat[k] == s_ref[k], f"round {t}: {k} differs"
    ref.flush()
    nat.flush()
    assert ref.gate.stats.snapshot()["counters"] == nat.gate.stats.snapshot()["counters"]


def test_every_transition_is_exercised_by_the_settings_above():
    """The differential test means something only if its rounds reach the gate's transitions: one fixed
    schedule under the second settings pauses, probes, resumes, fails a probe and pauses the batch."""
    a = Acceptance(M, N, GateSettings(break_even=1.0, patience=2, pause=3, pause_max=12, probe=1), Stats(),
                   native_path=True)
    slots = np.arange(2, dtype=np.int64)
    no = np.zeros(2, bool)
    kw = np.full(2, 4, np.int32)
    for t in range(1, 60):
        good = (t // 10) % 2 == 1  # 10 rounds earning nothing, 10 earning, ...
        valid = np.array([4 if good else 1, 1], np.int32)
        a.round(t, slots, valid, kw, no, 0)
    c = a.gate.stats.snapshot()["counters"]
    for key in ("accept_paused", "accept_probes", "accept_resumed", "accept_probe_failed", "accept_batch_paused",
                "accept_batch_probes"):
        assert c.get(key, 0) > 0, key


def test_bad_arrays_are_refused_not_read():
    """The C path checks what it is handed: a slot outside the gate's arrays, or valid of the wrong
    dtype, is a ValueError and nothing is added."""
    a = Acceptance(M, N, GateSettings(break_even=1.0, patience=2, pause=3, pause_max=12, probe=1), Stats(),
                   native_path=True)
    kw = np.ones(1, np.int32)
    with pytest.raises(ValueError):
        a.round(1, np.array([M], np.int64), np.ones(1, np.int32), kw, np.zeros(1, bool), 0)
    with pytest.raises(ValueError):
        a.round(1, np.array([0], np.int64), np.ones(1, np.int64), kw, np.zeros(1, bool), 0)
    assert not a.effect.hist.any() and not a.gate.sum.any() and not a.gate.cnt.any()


def test_the_path_follows_the_environment(monkeypatch):
    monkeypatch.setenv("DSPARK_NATIVE", "0")
    assert Acceptance(M, N, GateSettings(), Stats()).native is False
    monkeypatch.delenv("DSPARK_NATIVE")
    assert Acceptance(M, N, GateSettings(), Stats()).native is native.enabled() is True


def test_every_throughput_transition_is_exercised_by_tps_gate():
    """The same for the throughput rule: an engine that obeys the mask, whose drafting steps cost 5 plain
    ones and, from round 60 on, 1: plain samples, pauses, probes that fail, then one that resumes."""
    a = Acceptance(M, N, TPS_GATE, Stats(), native_path=True, clock=lambda: now)
    slots = np.arange(2, dtype=np.int64)
    no = np.zeros(2, bool)
    now, masked = 0, False
    for t in range(1, 200):
        kw = np.full(2, 0 if masked else 4, np.int32)
        now += (5 if t < 60 else 1) * 1_000_000 if kw.any() else 1_000_000
        a.round(t, slots, np.where(kw > 0, 3, 1).astype(np.int32), kw, no, 0)
        need = np.ones(2, bool)
        a.mask(slots, need)
        masked = not need.any()
    c = a.gate.stats.snapshot()["counters"]
    for key in ("accept_batch_tps_samples", "accept_batch_tps_paused", "accept_batch_probes",
                "accept_batch_tps_probe_failed", "accept_batch_tps_resumed"):
        assert c.get(key, 0) > 0, (key, c)
