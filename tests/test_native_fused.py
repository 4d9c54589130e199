"""The C path's fused front (round/fused.py `front`) where the usual round is interrupted: a new
connection epoch, a pool's moved slots, a worker not ready, an open breaker, a bad descriptor and a
watchdog's claim, each among usual rounds, through both paths side by side (test_native_diff.py's
comparisons: the same reply, page, STEP, ring models, gate and counters after every round), and the
stage the C front stopped at for each."""

from __future__ import annotations

import numpy as np

from dspark_proxy.round.gate import GateSettings

from .test_native_diff import Driver, _one, _state
from .test_native_diff_round import M, N, W, _rig

# round -> what happens to both rigs before it
EVENTS = {4: "epoch", 6: "moved", 8: "not_ready", 9: "not_ready", 11: "corrupt", 13: "watchdog", 15: "step_fail",
          16: "step_fail", 17: "step_fail", 18: "step_fail"}


def _apply(rig, event: str) -> None:
    c = rig.client
    c.ready = event != "not_ready"
    if event == "epoch":
        c.epoch += 1
    c.moved_slots = (lambda: np.array([0, 3], np.int64)) if event == "moved" else (lambda: None)


def test_interrupted_usual_rounds_match_the_reference():
    ref, nat = _rig(False, GateSettings(break_even=0.0), ()), _rig(True, GateSettings(break_even=0.0), ())
    stages = []
    try:
        drv = Driver(False)
        rng = np.random.default_rng(3)
        for t in range(1, 30):
            event = EVENTS.get(t, "none")
            r = {"n": M, "perm_seed": 1, "new": [False] * M, "valid": rng.integers(1, W + 1, M).tolist(),
                 "move": ["go"] * M, "need": [True] * M, "k_window": [N] * M}
            b, _ = drv.batch(r)
            for rig in (ref, nat):
                _apply(rig, event)
            fault = event if event in ("corrupt", "watchdog", "step_fail") else "none"
            before = list(nat.core.fused.fronts)
            got_ref, got_nat = _one(ref, t, b, fault), _one(nat, t, b, fault)
            assert got_nat == got_ref, f"round {t} ({event}): replies differ"
            s_ref, s_nat = _state(ref, t), _state(nat, t)
            for k in s_ref:
                assert s_nat[k] == s_ref[k], f"round {t} ({event}): {k} differs"
            after = nat.core.fused.fronts
            stages.append(next((i for i in range(4) if after[i] != before[i]), None))
        counters = nat.core.stats.snapshot()["counters"]
    finally:
        ref.close()
        nat.close()
    # round 1: the first epoch (read only); the epoch and moved rounds: read only, then applied in Python;
    # not ready: advanced and summed, no entries (the round fails after the advance); the corrupt
    # descriptor fails the read; the breaker trips after the failed steps and its open rounds (and the
    # resyncs that follow) stop before the entries; the usual rounds go all the way
    assert stages[0] == 0 and stages[3] == 0 and stages[5] == 0, stages
    assert stages[7] == 2 and stages[8] == 2, stages
    assert stages[10] == 0, stages  # the bad descriptor: the read (the front then raises BadDescriptor)
    assert stages[12] is None, stages  # claimed by the watchdog first: skipped, no front
    assert stages[1] == 3 and stages[2] == 3 and stages[-3:] == [3, 3, 3], stages
    assert counters.get("fallback_cooldown", 0) >= 1 and counters.get("pool_slots_resent") == 2
    assert counters.get("fallback_bad_descriptor") == 1
