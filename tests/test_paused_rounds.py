"""Paused rounds the engine answers itself (shm_layout.md §3, "Paused rounds"): while the acceptance gate
pauses the batch, the proxy promises those rounds no drafts (PAUSED_THROUGH), the shim's `read_reply`
claims them at once instead of waiting for the proxy, and the proxy still sends their rows to the worker
when it gets to them, unless the engine had begun a later round's rows meanwhile (ENQUEUING): then the
windows are resent. One test per way a promised round can go, each with the drafts checked exact once
drafting resumes."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_proxy.round.core import RoundSettings
from dspark_proxy.round.gate import PAUSED, PAYS, PROMISE_AHEAD, SWITCH_AFTER, GateSettings
from dspark_proxy.round.gate_tps import StepRates, bucket
from dspark_proxy.shm.layout import Word
from engine_shim.shim import WAIT_ANSWERED_PAUSED
from tests.rig import Rig, ScriptedClient, full_windows

pytestmark = pytest.mark.timeout(60)

REQS = [(1, 0, 1), (2, 1, 1)]  # two requests decoding, one row a round each


@contextlib.contextmanager
def _paused_rig(seg_name: str, rounds: int = 4):
    """A rig (deadline 10 s: a round that waited for the proxy would show) whose batch the gate pauses at
    round 2 for `rounds` rounds; round 2 is handled by the proxy, which promises the rest."""
    gate = GateSettings(break_even=0.5, patience=4, pause=8, pause_max=16, probe=1, tps_every=0)
    client = ScriptedClient(max_reqs=4, num_spec=3, window=4, row_bytes=16)
    with Rig(seg_name, M=4, N=3, W=4, B=16, settings=RoundSettings(gate=gate), client=client) as rig:
        reply, b = rig.round(REQS)
        assert reply.ok_mask.all() and rig.check_drafts(reply, b) == 2
        rig.core.accept.gate._batch_paused(rig.t, rig.t + 1 + rounds, "accept_batch_paused")
        reply, _ = rig.round(REQS)  # the proxy's own: published before its STEP, the pause promised
        assert reply.ok and not reply.ok_mask.any()
        assert rig.seg.word(Word.PAUSED_THROUGH) == rig.t + rounds - 1
        yield rig, client


def _answered_at_once(rig: Rig) -> tuple[object, dict]:
    """The next round as an engine runs it when the proxy is slower than its step: enqueue, then
    read_reply before the proxy has looked at the round."""
    b = rig.batch(REQS)
    rig.t += 1
    rig.shim.enqueue(rig.t, **b)
    t0 = time.perf_counter()
    reply = rig.shim.read_reply(rig.t)
    assert time.perf_counter() - t0 < 1.0, "a promised round must not wait for the proxy"
    return reply, b


def _resume(rig: Rig) -> None:
    """Rounds until the pause is over and drafting is back, then drafts checked exact from whole windows."""
    for _ in range(8):
        reply, b = rig.round(REQS)
        if reply.ok_mask.all():
            break
    assert rig.core.accept.gate.b_state != PAUSED
    assert rig.check_drafts(reply, b) == 2 and all(full_windows(rig, reply, b))


def test_a_promised_round_is_answered_by_the_engine_and_its_rows_still_reach_the_worker(seg_name):
    with _paused_rig(seg_name) as (rig, client):
        for _ in range(3):
            sent = len(client.sent_entries)
            reply, _ = _answered_at_once(rig)
            assert reply.ok and reply.status == 0 and not reply.ok_mask.any() and np.all(reply.n_drafts == 0)
            assert rig.shim.last_wait[0] == WAIT_ANSWERED_PAUSED
            rig.core.handle(rig.t, 0.0)  # the proxy gets there after the engine answered
            assert len(client.sent_entries) == sent + 1, "the round's rows must still go to the worker"
            ent = client.sent_entries[-1]
            assert not np.any(ent["flags"] & 1) and ent["n_rows"].tolist() == [1, 1]
        st = rig.core.stats
        assert st.counter("rounds_answered_by_engine") == 3 and st.counter("paused_rows_overtaken") == 0
        assert rig.shim.counters.counter("rounds_answered_paused") == 3
        assert not st.counter("rounds_failed") and not st.counter("watchdog_preempted")
        _resume(rig)
        assert not st.counter("resync_rows"), "rows read before the engine moved on need no resync"


def test_a_promised_round_the_proxy_reaches_first_is_published_as_before(seg_name):
    with _paused_rig(seg_name) as (rig, client):
        reply, _ = rig.round(REQS)  # the proxy handles it before the engine reads the reply
        assert reply.ok and not reply.ok_mask.any() and rig.shim.last_wait[0] != WAIT_ANSWERED_PAUSED
        assert rig.core.stats.counter("rounds_published_first") == 2
        assert not rig.core.stats.counter("rounds_answered_by_engine")
        _resume(rig)


def test_a_promised_round_whose_rows_the_engine_overtook_sends_nothing_and_the_windows_are_resent(seg_name):
    with _paused_rig(seg_name) as (rig, client):
        _answered_at_once(rig)
        t = rig.t
        sent = len(client.sent_entries)
        b = rig.batch(REQS)  # the engine's next round begins before the proxy read round t's rows
        rig.t += 1
        rig.shim.enqueue(rig.t, **b)
        assert rig.seg.word(Word.ENQUEUING) == t + 1
        rig.core.handle(t, 0.0)
        st = rig.core.stats
        assert st.counter("paused_rows_overtaken") == 1
        assert len(client.sent_entries) == sent, "rows the engine may have rewritten must not be sent"
        assert rig.shim.read_reply(rig.t).ok
        rig.core.handle(rig.t, 0.0)
        _resume(rig)
        assert st.counter("resync_rows") > 0, "the overtaken round's windows are resent before drafting"


def test_a_round_past_the_promise_waits_for_the_proxy_as_before(seg_name):
    with _paused_rig(seg_name, rounds=2) as (rig, client):
        promised = rig.seg.word(Word.PAUSED_THROUGH)
        while rig.t < promised:
            _answered_at_once(rig)
            rig.core.handle(rig.t, 0.0)
        rig.shim.deadline_override_ms = 50.0
        b = rig.batch(REQS)
        rig.t += 1
        rig.shim.enqueue(rig.t, **b)
        t0 = time.perf_counter()
        reply = rig.shim.read_reply(rig.t)  # nobody publishes it: the deadline fails it, as any round
        assert time.perf_counter() - t0 >= 0.04 and not reply.ok and rig.shim.last_wait[0] != WAIT_ANSWERED_PAUSED


def test_a_step_whose_stamp_may_be_a_later_rounds_is_a_gap():
    now = [0]
    r = StepRates(clock=lambda: now[0])
    for t in range(1, 4):
        now[0] = t * 1_000_000
        r.round(t, 2, False)
    assert r.n_p == 2
    now[0] = -1  # round 4: the engine gathered round 5 already
    r.round(4, 2, False)
    now[0] = 6_000_000
    r.round(5, 2, False)  # its interval would span from a stamp that was not round 4's
    assert r.n_p == 2
    now[0] = 7_000_000
    r.round(6, 2, False)
    assert r.n_p == 3 and r._p[2] == 1_000_000


def test_through_real_processes_a_paused_batch_costs_the_engine_no_wait_and_no_wrong_draft(seg_name):
    """A real worker and proxy, and the simulated engine fast enough (0.2 ms a step) that the proxy falls
    behind it while paused: the engine answers the promised rounds itself, the proxy sends their rows
    or has overtaken windows resent, and every probe's drafts are right."""
    import engine_shim
    from dspark_proxy.ops.launch import spawn_proxy, spawn_worker
    from dspark_proxy.ops.status import read_status
    from dspark_proxy.sim import SimConfig, SimEngine

    M, N, W, B = 8, 4, 8, 32
    layout = ("--max-reqs", str(M), "--num-spec", str(N), "--window", str(W), "--row-bytes", str(B))
    worker = spawn_worker(*layout)
    try:
        # acceptance can never reach 255: every block pauses, every probe fails, pauses of 8-16 rounds
        proxy = spawn_proxy(seg_name, worker.address, *layout, "--deadline-ms", "2000", "--accept-break-even", "255",
                            "--accept-patience", "4", "--accept-pause", "8", "--accept-pause-max", "16",
                            "--accept-tps-every", "0")
        try:
            shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=10.0)
            try:
                cfg = SimConfig(seed=5, max_reqs=M, num_spec=N, window=W, row_bytes=B, arrivals_per_round=0.05,
                                prompt_len=(8, 32), output_len=(64, 256), preempt_prob=0.0, engine_work_us=200.0)
                r = SimEngine(cfg).run(shim, duration_s=3.0)
                answered = shim.stats()["counters"].get("rounds_answered_paused", 0)
                time.sleep(0.5)  # the proxy's next stats snapshot (its heartbeat's)
                st = read_status(seg_name)["proxy"]
            finally:
                shim.close()
        finally:
            proxy.stop()
    finally:
        worker.stop()
    c = st["counters"]
    print(f"rounds {r.rounds}, answered by the engine {answered}, published first "
          f"{c.get('rounds_published_first', 0)}, overtaken {c.get('paused_rows_overtaken', 0)}, usable drafts "
          f"{r.usable_drafts}, full windows {r.full_window_rate:.3f}, wait p50 {r.wait_us_p50:.0f} us")
    assert r.wrong_drafts == 0
    assert r.usable_drafts > 0, "the probes drafted"
    assert answered > 0 and c.get("rounds_answered_by_engine", 0) > 0
    assert c.get("rounds_answered_by_engine", 0) + c.get("rounds_published_first", 0) > r.rounds // 2


_step = st.tuples(st.sampled_from(["proxy", "engine", "overtake"]), st.integers(0, 6), st.booleans())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_step, min_size=4, max_size=40))
def test_any_order_of_engine_and_proxy_on_promised_rounds_keeps_every_draft_right(make_seg_name, steps):
    """Rounds in any order the two processes can take them: the proxy first, the engine first (a promised
    round), or the engine already on the next round before the proxy read this one's rows; pauses of
    random length, a request now and then replaced by a new one. Every draft is checked against the
    oracle of the rows the engine wrote, and once drafting is back every window is whole."""
    gate = GateSettings(break_even=0.5, patience=4, pause=8, pause_max=16, probe=1, tps_every=0)
    with Rig(make_seg_name("pp"), M=4, N=3, W=4, B=16, settings=RoundSettings(gate=gate)) as rig:
        g = rig.core.accept.gate
        reqs = [[1, 0, 1], [2, 1, 1]]
        next_id = 3
        for order, pause, renew in steps:
            if renew:  # slot 1 gets a new request: its window starts afresh
                reqs[1] = [next_id, 1, 1]
                next_id += 1
            if pause and g.b_state != PAUSED:
                g._batch_paused(rig.t, rig.t + 1 + pause, "accept_batch_paused")
            b = rig.batch([tuple(r) for r in reqs])
            rig.t += 1
            rig.shim.enqueue(rig.t, **b)
            promised = rig.t <= rig.seg.word(Word.PAUSED_THROUGH)
            if order == "proxy" or not promised:
                rig.core.handle(rig.t, 0.0)
                reply = rig.shim.read_reply(rig.t)
            else:
                reply = rig.shim.read_reply(rig.t)  # at once, the proxy not there yet
                assert reply.ok and not reply.ok_mask.any()
                if order == "overtake":  # the engine's next round begins before the proxy reads this one
                    t = rig.t
                    b2 = rig.batch([tuple(r) for r in reqs])
                    rig.t += 1
                    rig.shim.enqueue(rig.t, **b2)
                    rig.core.handle(t, 0.0)
                    if rig.t > rig.seg.word(Word.PAUSED_THROUGH):
                        rig.core.handle(rig.t, 0.0)
                        reply, b = rig.shim.read_reply(rig.t), b2
                    else:
                        reply, b = rig.shim.read_reply(rig.t), b2
                        rig.core.handle(rig.t, 0.0)
                else:
                    rig.core.handle(rig.t, 0.0)
            assert rig.check_drafts(reply, b) == int(reply.ok_mask.sum())
        for _ in range(40):  # drafting back: every window whole again
            reply, b = rig.round([tuple(r) for r in reqs])
            assert rig.check_drafts(reply, b) == int(reply.ok_mask.sum())
            if g.b_state != PAUSED and reply.ok_mask.all() and all(full_windows(rig, reply, b)):
                break
        else:
            raise AssertionError("the windows never came whole again")


def test_a_long_pause_is_promised_a_few_rounds_ahead_and_ends_at_a_size_where_drafting_pays(seg_name):
    """A throughput pause of 400 rounds: PAUSED_THROUGH goes PROMISE_AHEAD rounds past the round handled,
    not to the pause's end; the batch moving to a size where drafting was found to pay ends the pause,
    the promised rounds still get no drafts, and the first round past them drafts, exact."""
    gate = GateSettings(break_even=0.5, patience=4, pause=8, pause_max=512, probe=1, tps_every=1000)
    client = ScriptedClient(max_reqs=4, num_spec=3, window=4, row_bytes=16)
    with Rig(seg_name, M=4, N=3, W=4, B=16, settings=RoundSettings(gate=gate), client=client) as rig:
        g = rig.core.accept.gate
        rig.round(REQS)
        g.b_recall[bucket(1)] = PAYS
        g.b_tps = True
        g._batch_paused(rig.t, rig.t + 400, "accept_batch_tps_paused")
        for _ in range(5):
            reply, _ = rig.round(REQS)
            assert reply.ok and not reply.ok_mask.any()
            assert rig.seg.word(Word.PAUSED_THROUGH) == rig.t + PROMISE_AHEAD
        drafted_at = None
        for _ in range(PROMISE_AHEAD + SWITCH_AFTER):
            reply, b = rig.round(REQS[:1])  # one request
            if reply.ok_mask.any():
                drafted_at = rig.t
                assert rig.check_drafts(reply, b) == 1 and all(full_windows(rig, reply, b))
                break
        assert g.b_state != PAUSED and g.b_bucket == bucket(1)
        assert drafted_at == rig.seg.word(Word.PAUSED_THROUGH) + 1
