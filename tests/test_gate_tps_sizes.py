"""The throughput rule per batch size (dspark_proxy/round/gate.py `_switch`, gate_tps.py `bucket`):
what a target step costs grows with the tokens it verifies, so drafting can pay at one request and not at
four. Each size has its own plain rate and blocks never mix two; a size where the rule paused drafting
pauses again at once when the batch comes back to it, until a probe there pays; a throughput pause ends
when the batch moves to a size where drafting was found to pay, and goes on at a size not judged yet.

Driven by test_gate_tps.py's simulated engine: a step takes `draft_ns` when the round before asked
drafts, PLAIN otherwise, and every verified request accepts 3 of 5."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_proxy.round.gate import ACTIVE, PAUSED, PAYS, PROMISE_AHEAD, SWITCH_AFTER, GateSettings
from dspark_proxy.round.gate_tps import StepRates, bucket, size_label
from tests.test_gate_tps import PLAIN, S, Sim

pytestmark = pytest.mark.timeout(60)

SLOW = 8 * PLAIN  # a drafting step: 4 tokens a request in 8 plain steps' time (half the plain rate)
CHEAP = PLAIN  # 4 tokens a request in one


def _resize(s: Sim, n: int, draft_ns: int) -> None:
    """The batch at n requests for the rounds the rule takes to count the new size (SWITCH_AFTER)."""
    s.resize(n)
    s.run(SWITCH_AFTER, draft_ns)


def _until_paused(s: Sim, draft_ns: int) -> int:
    """Draft at draft_ns until the rule pauses the batch; the pause."""
    before = s.c("accept_batch_tps_paused")
    s.until(lambda: s.c("accept_batch_tps_paused") > before, draft_ns)
    return s.g.b_pause


def test_buckets():
    assert [bucket(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 256)] == [0, 1, 2, 3, 3, 4, 4, 5, 5, 6, 9]
    assert [size_label(b) for b in range(1, 7)] == ["1", "2", "3-4", "5-8", "9-16", "17-32"]


@pytest.mark.parametrize("native_path", [False, True])
def test_a_size_where_drafting_was_slow_pauses_again_at_once(native_path):
    s = Sim(n=4, native_path=native_path)
    _until_paused(s, SLOW)
    assert s.g.b_bucket == 3 and s.g.b_recall[3] == 0  # one slow verdict: not remembered yet
    s.until(lambda: s.c("accept_batch_tps_probe_failed") == 1, SLOW)  # its probe confirms it
    p = s.g.b_pause
    assert s.g.b_recall[3] == p == 2 * S.pause
    _resize(s, 1, CHEAP)  # a size not judged yet: the pause goes on, and its probe there pays
    assert s.g.b_state == PAUSED and s.g.b_bucket == 1
    s.until(lambda: s.c("accept_batch_tps_resumed") == 1, CHEAP)
    assert s.g.b_recall[1] == PAYS and s.c("accept_batch_tps_probe_failed") == 1
    assert s.g.snapshot()["tps_by_size"] == {"1": "pays", "3-4": p}  # what status shows
    assert s.g.b_recall[3] == p and s.g.b_recall_other and not s.g.steady(s.t)  # four requests' pause kept
    s.run(20, CHEAP)
    assert s.g.b_state == ACTIVE and s.need.all() and s.c("accept_batch_tps_paused") == 1
    s.resize(4)
    s.run(SWITCH_AFTER - 1, SLOW)
    assert s.g.b_state == ACTIVE and s.need.all()  # not counted yet
    s.step(SLOW)  # counted: paused in that round, for the pause it had
    assert s.g.b_state == PAUSED and s.g.b_tps and s.c("accept_batch_tps_recalled") == 1
    assert s.g.b_until == s.t + p and not s.need.any()
    assert s.c("accept_batch_tps_paused") == 1  # recalled, not learnt anew


def test_one_slow_verdict_is_not_remembered():
    """A pause from slow blocks alone (no probe has failed there yet) is not recalled: on a busy machine
    one verdict may be noise, and a remembered pause costs every return to the size."""
    s = Sim(n=4)
    _until_paused(s, SLOW)
    _resize(s, 1, CHEAP)
    s.until(lambda: s.c("accept_batch_tps_resumed") == 1, CHEAP)
    _resize(s, 4, CHEAP)
    assert s.c("accept_batch_tps_recalled") == 0 and s.g.b_state == ACTIVE and s.need.all()


def test_a_probe_that_pays_forgets_the_sizes_pause():
    s = Sim(n=4)
    _until_paused(s, SLOW)
    s.until(lambda: s.c("accept_batch_tps_resumed") == 1, CHEAP)  # the machine quiets: drafting pays at four too
    assert s.g.b_recall[3] == PAYS and not s.g.b_recall_other
    _resize(s, 1, CHEAP)
    s.run(20, CHEAP)
    _resize(s, 4, CHEAP)
    s.run(20, CHEAP)
    assert s.c("accept_batch_tps_recalled") == 0 and s.g.b_state == ACTIVE


def test_each_size_keeps_the_plain_rate_learnt_there():
    r = StepRates(clock=iter(range(0, 10_000, 10)).__next__)
    for t in range(1, 7):
        r.round(t, 2, 0)
    assert r.learn_plain(6) == pytest.approx(1e8)
    r.switch(2, 3)  # none learnt at 3-4 requests: two's stands in; the block goes on
    assert r.plain == pytest.approx(1e8) and r.plain_at == 6 and r.n_p == 5
    for t in range(7, 14):
        r.round(t, 4, 0)
    r.begin()
    for t in range(14, 20):
        r.round(t, 4, 0)
    r.plain = None
    assert r.learn_plain(19) == pytest.approx(1e8)
    r.plain = 5e7  # (as if learnt so)
    r.switch(3, 2)
    assert r.plain == pytest.approx(1e8) and r.plain_at == 6
    r.switch(2, 3)
    assert r.plain == pytest.approx(5e7) and r.plain_at == 19


def test_a_size_not_judged_yet_goes_on_as_it_was():
    """Neither its block restarted (a size that moves every few rounds would never have one judged) nor
    a pause ended."""
    s = Sim(n=1)
    s.run(S.patience // 4, CHEAP)
    left = s.g.b_left
    _resize(s, 4, CHEAP)
    assert s.g.b_state == ACTIVE and s.g.b_left == left - SWITCH_AFTER and s.g.b_bucket == 3
    s = Sim(n=4)
    _until_paused(s, SLOW)
    until = s.g.b_until
    _resize(s, 1, CHEAP)
    assert s.g.b_state == PAUSED and s.g.b_until == until


def test_a_batch_hovering_next_to_a_size_found_slow_does_not_pause():
    """Three requests found slow; the batch at two, one round in SWITCH_AFTER at three: never counted there."""
    s = Sim(n=2)
    s.g.b_recall[bucket(3)] = 16
    for k in range(10 * SWITCH_AFTER):
        s.resize(3 if k % SWITCH_AFTER == SWITCH_AFTER - 1 else 2)
        s.step(CHEAP)
    assert s.g.b_bucket == 2 and s.c("accept_batch_tps_recalled") == 0 and s.g.b_state == ACTIVE
    s.resize(3)
    s.run(SWITCH_AFTER, CHEAP)
    assert s.c("accept_batch_tps_recalled") == 1


def test_the_promise_goes_a_few_rounds_ahead_and_a_size_change_ends_the_pause_after_it():
    """A throughput pause of pause_max rounds: the engine is promised PROMISE_AHEAD rounds past the one
    handled, not the whole pause; the batch moving to a size where drafting pays ends the pause, and its
    promised rounds still ask no drafts."""
    s = Sim(GateSettings(break_even=0.5, patience=8, pause=256, pause_max=1024, probe=2, tps_every=400), n=1)
    s.until(lambda: s.g.b_recall[1] == PAYS, CHEAP)  # one request: drafting found to pay
    _resize(s, 4, SLOW)
    _until_paused(s, SLOW)
    assert s.g.b_until - s.t == 256 and s.g.b_promised == s.t + PROMISE_AHEAD
    s.run(10, CHEAP)
    assert s.g.b_promised == s.t + PROMISE_AHEAD
    promised = s.g.b_promised
    _resize(s, 1, CHEAP)
    assert s.g.b_state == ACTIVE and s.g.b_promised == promised + SWITCH_AFTER - 1
    rounds = 0
    while not s.need.all():
        assert s.t <= s.g.b_promised
        s.step(CHEAP)
        rounds += 1
    assert s.t == s.g.b_promised + 1 and rounds <= PROMISE_AHEAD


def test_a_sample_ends_where_drafting_pays_and_becomes_a_pause_where_it_was_slow():
    s = Sim(n=1)
    s.until(lambda: s.g.b_recall[1] == PAYS, CHEAP)
    s.g.b_recall[bucket(2)] = 40  # (as if found slow at two requests)
    _resize(s, 4, CHEAP)
    s.until(lambda: s.g.b_sample, CHEAP)
    _resize(s, 1, CHEAP)  # drafting pays at one request: the sample is over
    assert s.g.b_state == ACTIVE and not s.g.b_sample
    _resize(s, 4, CHEAP)
    s.until(lambda: s.g.b_sample, CHEAP)
    until = s.g.b_until
    _resize(s, 2, CHEAP)  # found slow at two: the sample becomes that size's pause
    assert s.g.b_state == PAUSED and not s.g.b_sample and s.g.b_tps and s.g.b_pause == 40
    assert s.g.b_until == max(until, s.t + 40) and s.c("accept_batch_tps_recalled") == 1


def test_an_acceptance_pause_is_not_the_sizes():
    """Low acceptance pauses the batch whatever its size: nothing is recalled from it."""
    s = Sim(n=4)
    s.until(lambda: s.c("accept_batch_paused") == 1, CHEAP, acc=0)
    assert s.g.b_recall == [0] * len(s.g.b_recall)
    _resize(s, 1, CHEAP)
    assert s.g.b_state == PAUSED  # (its course is the acceptance's)
    s.until(lambda: s.g.b_state != PAUSED, CHEAP)
    s.run(20, CHEAP)
    _resize(s, 4, CHEAP)
    assert s.c("accept_batch_tps_recalled") == 0


def test_load_that_moves_between_sizes_drafts_at_the_small_one_and_not_at_the_large():
    """Eight cycles of 160 rounds at one request (drafting 4x the plain rate) and 160 at four (half of it),
    the proxy's pause_max: once learnt, four requests draft only in probes, one request all but its first
    rounds (four requests' pause promised ahead, the rounds the size takes to count). Before the rule was per size, the batch
    drafted whole blocks at four requests to learn it again, and its pauses, doubled up to pause_max,
    ran on through the rounds at one."""
    s = Sim(GateSettings(break_even=0.5, patience=8, pause=16, pause_max=1024, probe=2, tps_every=400), n=1)
    asked = {1: 0, 4: 0}
    for cycle in range(8):
        for n, draft_ns in ((1, CHEAP), (4, SLOW)):
            s.resize(n)
            for _ in range(160):
                if cycle:
                    asked[n] += int(s.need.any())
                s.step(draft_ns)
    assert s.c("accept_batch_tps_recalled") >= 6
    assert asked[4] < 0.08 * 7 * 160, asked  # probes only (each a few rounds: fails at its first look)
    assert asked[1] > 0.7 * 7 * 160, asked
    assert np.isfinite(s.g.tps.plain)
