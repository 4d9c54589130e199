"""The acceptance gate's throughput rule (dspark_proxy/round/gate.py, gate_tps.py): the whole batch stops
drafting while drafting's tokens per request-second of engine time fall below those without drafts.

Driven by a small simulated engine with a fake clock: each round's requests verified drafts exactly when
the previous round asked for them (the gate's mask), and the engine's step took `draft_ns` then, `plain_ns`
otherwise. One test per transition of the batch's throughput machine, noise that must not flap it, and
the whole loop's throughput against not drafting."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest

from dspark_proxy.ops.stats import Stats
from dspark_proxy.round.acceptance import Acceptance
from dspark_proxy.round.core import RoundSettings
from dspark_proxy.round.gate import ACTIVE, PAUSED, PROBING, GateSettings
from dspark_proxy.round.gate_tps import MIN_SAMPLES, StepRates
from dspark_proxy.shm.layout import Word
from tests.rig import Rig, ScriptedClient, full_windows

pytestmark = pytest.mark.timeout(60)

S = GateSettings(break_even=0.5, patience=8, pause=16, pause_max=64, probe=2, tps_every=400, tps_margin=0.1)
PLAIN = 4_000_000  # a step without drafts: 4 ms


class Sim:
    """n requests in slots 0..n-1, each accepting `acc` of 5 drafts when it verifies them."""

    def __init__(self, settings: GateSettings = S, n: int = 2, native_path: bool | None = None, seed: int = 0) -> None:
        self.st = Stats()
        self.now = 10**12
        self.a = Acceptance(4, 5, settings, self.st, native_path=native_path, clock=lambda: self.now)
        self.g = self.a.gate
        self.slots = np.arange(n, dtype=np.int64)
        self.need = np.ones(n, bool)  # the last reply's NEED_DRAFT: this round verifies where it was set
        self.t = 0
        self.rng = np.random.default_rng(seed)
        self.tokens = 0
        self.elapsed = 0

    def step(self, draft_ns: int, plain_ns: int = PLAIN, acc: int = 3, noise: float = 0.0, skip: bool = False,
             late: bool = False) -> None:
        ver = self.need.copy()
        dt = draft_ns if ver.any() else plain_ns
        if late:  # the drafts missed the deadline: the engine waited draft_ns for them and verified none
            ver[:] = False
        if noise:
            dt = int(dt * (1 + noise * self.rng.uniform(-1, 1)))
        self.now += dt
        self.t += 2 if skip else 1
        valid = np.where(ver, acc + 1, 1).astype(np.int32)
        kw = np.where(ver, 5, 0).astype(np.int32)
        self.tokens += int(valid.sum())
        self.elapsed += dt
        no = np.zeros(self.slots.shape[0], bool)
        self.a.round(self.t, self.slots, valid, kw, no, 0)
        need = np.ones(self.slots.shape[0], bool)
        self.a.mask(self.slots, need)
        self.need = need

    def resize(self, n: int) -> None:
        """The batch grows or shrinks to n requests (slots 0..n-1), those there asking drafts as it did."""
        self.slots = np.arange(n, dtype=np.int64)
        self.need = np.full(n, self.need.any())

    def run(self, rounds: int, draft_ns: int, **kw) -> None:
        for _ in range(rounds):
            self.step(draft_ns, **kw)

    def until(self, pred, draft_ns: int, limit: int = 2000, **kw) -> None:
        for _ in range(limit):
            if pred():
                return
            self.step(draft_ns, **kw)
        raise AssertionError(f"not reached in {limit} rounds (t={self.t}, batch {self.g.b_state})")

    def c(self, k: str) -> int:
        return self.st.counter(k)


def _sampled(s: Sim, draft_ns: int) -> None:
    """Through the first plain sample (after tps_every / 4 rounds)."""
    s.until(lambda: s.g.b_sample, draft_ns)
    assert s.g.b_state == PAUSED and s.c("accept_batch_tps_samples") == 1
    s.until(lambda: s.g.b_state == ACTIVE, draft_ns)


@pytest.mark.parametrize("native_path", [False, True])
def test_the_first_plain_sample_comes_after_a_quarter_of_tps_every_and_learns_the_plain_rate(native_path):
    s = Sim(native_path=native_path)
    s.until(lambda: s.g.b_state != ACTIVE, 2 * PLAIN)
    assert s.g.b_sample and S.tps_every // 4 <= s.t < S.tps_every // 4 + S.patience  # the first judgement past it
    assert s.g.tps.drafting == pytest.approx(4 * 1e9 / (2 * PLAIN))  # 3 accepted + 1 in 8 ms
    s.step(2 * PLAIN)
    assert not s.need.any()  # nobody is asked for drafts during the sample
    s.until(lambda: s.g.b_state != PAUSED, 2 * PLAIN)
    assert s.g.b_state == ACTIVE and not s.g.b_sample and s.g.b_left == S.patience
    assert s.g.tps.plain == pytest.approx(1e9 / PLAIN) and s.g.tps.plain_at == s.t
    assert s.c("accept_batch_probes") == 0 and s.c("accept_batch_tps_paused") == 0


@pytest.mark.parametrize("native_path", [False, True])
def test_active_to_paused_when_drafting_is_slower_than_not(native_path):
    s = Sim(native_path=native_path)
    _sampled(s, 6 * PLAIN)  # 4 tokens in 6 plain steps' time
    s.run(S.patience, 6 * PLAIN)
    assert s.g.b_state == ACTIVE and s.g.b_slow == 1  # one slow block may be noise
    s.run(S.patience, 6 * PLAIN)
    assert s.g.b_state == PAUSED and not s.g.b_sample and s.g.b_tps and s.g.b_slow == 0
    assert s.c("accept_batch_tps_paused") == 1 and s.c("accept_batch_paused") == 0
    assert s.g.b_until == s.t + S.pause
    s.step(6 * PLAIN)
    assert not s.need.any()


def test_drafting_below_half_the_plain_rate_pauses_after_one_block():
    s = Sim()
    _sampled(s, 10 * PLAIN)  # 4 tokens in 10 plain steps' time
    s.run(S.patience, 10 * PLAIN)
    assert s.g.b_state == PAUSED and s.g.b_tps and s.c("accept_batch_tps_paused") == 1


def test_active_stays_active_while_drafting_pays():
    s = Sim()
    _sampled(s, 2 * PLAIN)
    s.run(S.tps_every - 2 * S.patience, 2 * PLAIN)
    assert s.g.b_state == ACTIVE and s.c("accept_batch_tps_paused") == 0 and s.c("accept_batch_tps_samples") == 1


def test_no_margin_on_the_way_down():
    """Drafting a little faster than not: stays ACTIVE (the margin is only asked of a probe)."""
    s = Sim()
    _sampled(s, int(3.9 * PLAIN))
    s.run(3 * S.patience, int(3.9 * PLAIN))
    assert s.g.b_state == ACTIVE and s.c("accept_batch_tps_paused") == 0


def test_one_slow_block_between_good_ones_does_not_pause():
    s = Sim()
    _sampled(s, 2 * PLAIN)
    for _ in range(5):
        s.run(S.patience, 6 * PLAIN)  # a whole ACTIVE block, slow
        assert s.g.b_slow == 1
        s.until(lambda: s.g.b_state == ACTIVE and s.g.b_left == S.patience, 2 * PLAIN)  # after a sample, if any
        s.run(S.patience, 2 * PLAIN)
        assert s.g.b_slow == 0
    assert s.g.b_state == ACTIVE and s.c("accept_batch_tps_paused") == 0


def test_a_slow_block_against_an_old_plain_rate_measures_it_again_first():
    """The plain rate was learnt blocks ago (the machine's load may have changed since): a slow block
    takes a plain sample, and the next slow block, against the fresh rate, pauses."""
    s = Sim()
    _sampled(s, 2 * PLAIN)
    s.run(3 * S.patience, 2 * PLAIN)
    assert s.c("accept_batch_tps_samples") == 1
    s.run(S.patience, 6 * PLAIN)
    assert s.g.b_state == PAUSED and s.g.b_sample and s.g.b_slow == 1 and s.c("accept_batch_tps_samples") == 2
    s.until(lambda: s.g.b_state == ACTIVE, 6 * PLAIN)
    s.run(S.patience, 6 * PLAIN)
    assert s.g.b_state == PAUSED and s.g.b_tps and s.c("accept_batch_tps_paused") == 1


def _paused(s: Sim, draft_ns: int = 6 * PLAIN) -> None:
    _sampled(s, draft_ns)
    s.run(2 * S.patience, draft_ns)
    assert s.g.b_state == PAUSED and s.g.b_tps


@pytest.mark.parametrize("native_path", [False, True])
def test_paused_to_probing_for_a_whole_block(native_path):
    s = Sim(native_path=native_path)
    _paused(s)
    s.until(lambda: s.g.b_state != PAUSED, 6 * PLAIN)
    assert s.g.b_state == PROBING and s.c("accept_batch_probes") == 1
    assert s.g.b_left == MIN_SAMPLES and s.g.b_more == S.patience - MIN_SAMPLES  # a first look, then the block
    assert s.g.tps.plain == pytest.approx(1e9 / PLAIN) and s.g.tps.plain_at == s.t  # the pause refreshed it
    s.step(6 * PLAIN)
    assert s.need.all()


@pytest.mark.parametrize("native_path", [False, True])
def test_the_machine_quiets_the_probe_earns_and_drafting_resumes(native_path):
    s = Sim(native_path=native_path)
    _paused(s)
    s.until(lambda: s.g.b_state == PROBING, 6 * PLAIN)
    s.run(S.patience, 2 * PLAIN)  # drafting now pays twice over
    assert s.g.b_state == ACTIVE and s.c("accept_batch_tps_resumed") == 1 and s.g.b_pause == S.pause
    assert not s.g.b_tps and s.c("accept_batch_resumed") == 0
    s.run(3 * S.patience, 2 * PLAIN)
    assert s.g.b_state == ACTIVE


def test_a_probe_that_does_not_earn_pauses_again_with_the_pause_doubled():
    s = Sim()
    _paused(s)
    for k in range(3):
        s.until(lambda: s.g.b_state == PROBING, 6 * PLAIN)
        s.until(lambda: s.g.b_state == PAUSED, 6 * PLAIN)
        assert s.c("accept_batch_tps_probe_failed") == k + 1
        assert s.g.b_pause == min(S.pause * 2 ** (k + 1), S.pause_max) and s.g.b_until == s.t + s.g.b_pause


def test_a_probe_not_conclusive_at_its_first_look_goes_on_to_a_whole_block():
    s = Sim()
    _paused(s)
    s.until(lambda: s.g.b_state == PROBING, 6 * PLAIN)
    s.run(MIN_SAMPLES, 6 * PLAIN)  # 2/3 of the plain rate: more than half the bar
    assert s.g.b_state == PROBING and s.g.b_left == S.patience - MIN_SAMPLES and s.g.b_more == 0
    s.run(S.patience - MIN_SAMPLES, 6 * PLAIN)
    assert s.g.b_state == PAUSED and s.c("accept_batch_tps_probe_failed") == 1


def test_a_probe_far_below_its_bar_fails_at_its_first_look():
    """Drafting that costs 10 plain steps for 4 tokens: each probe costs MIN_SAMPLES rounds, not a block."""
    s = Sim()
    _paused(s, 10 * PLAIN)
    s.until(lambda: s.g.b_state == PROBING, 10 * PLAIN)
    s.run(MIN_SAMPLES, 10 * PLAIN)
    assert s.g.b_state == PAUSED and s.c("accept_batch_tps_probe_failed") == 1 and s.g.b_more == 0
    assert s.g.b_pause == 2 * S.pause


def test_a_probe_must_beat_the_plain_rate_by_the_margin():
    s = Sim()
    _paused(s)
    s.until(lambda: s.g.b_state == PROBING, 6 * PLAIN)
    s.run(S.patience, int(3.8 * PLAIN))  # 5% faster than not drafting: below the 10% margin
    assert s.g.b_state == PAUSED and s.c("accept_batch_tps_probe_failed") == 1


def test_the_plain_sample_is_taken_again_every_tps_every_rounds():
    s = Sim()
    _sampled(s, 2 * PLAIN)
    first = s.g.tps.plain_at
    s.until(lambda: s.c("accept_batch_tps_samples") == 2, 2 * PLAIN, plain_ns=2 * PLAIN)
    assert s.t - first >= S.tps_every
    s.until(lambda: s.g.b_state == ACTIVE, 2 * PLAIN, plain_ns=2 * PLAIN)
    assert s.g.tps.plain == pytest.approx(1e9 / (2 * PLAIN))  # what the machine does now


def test_low_acceptance_still_pauses_first():
    s = Sim()
    s.run(S.patience, PLAIN, acc=0)  # drafts that earn nothing (0 < break_even): the acceptance rule
    assert s.g.b_state == PAUSED and not s.g.b_sample and s.c("accept_batch_paused") == 1
    assert s.c("accept_batch_tps_samples") == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_noise_does_not_flap(seed):
    """Every step ±40% at random: drafting that pays 1.5 times over is never paused, drafting at half
    the plain rate, once paused, is never resumed."""
    s = Sim(seed=seed)
    s.run(3000, int(PLAIN * 4 / 1.5), noise=0.4)
    assert s.c("accept_batch_tps_paused") == 0 and s.c("accept_batch_tps_samples") >= 3
    s = Sim(seed=seed)
    s.run(3000, 8 * PLAIN, noise=0.4)
    assert s.c("accept_batch_tps_paused") == 1 and s.c("accept_batch_tps_resumed") == 0
    assert s.g.b_pause == S.pause_max


@pytest.mark.parametrize("native_path", [False, True])
def test_drafts_that_always_come_late_are_judged_and_paused(native_path):
    """A drafter that misses every deadline: each drafting step is the engine's wait (3 plain steps) and
    verifies nothing. Those steps are drafting's cost, not plain ones, and they fill its blocks: the
    rule pauses it (before, every such step was a plain sample, no block was ever whole, and the batch
    drafted late for ever: the DSpark arm's 0.65x on a busy machine)."""
    s = Sim(GateSettings(break_even=0.5, patience=8, pause=16, pause_max=512, probe=2, tps_every=400),
            native_path=native_path)
    s.until(lambda: s.c("accept_batch_tps_paused") == 1, 3 * PLAIN, limit=S.tps_every, late=True)
    assert s.g.tps.plain == pytest.approx(1e9 / PLAIN)
    assert s.g.tps.drafting == pytest.approx(1e9 / (3 * PLAIN))  # 1 token a request in 3 plain steps
    tokens, elapsed = s.tokens, s.elapsed
    s.run(5000, 3 * PLAIN, late=True)  # (the probes, 4 late steps each, are what is lost)
    assert (s.tokens - tokens) / (s.elapsed - elapsed) * 1e9 > 0.95 * s.slots.shape[0] * 1e9 / PLAIN


def test_late_drafts_dilute_what_drafting_earns():
    """Half the drafting steps late: the rate counts their requests at 1 token each."""
    r = StepRates(clock=iter(range(0, 1000, 10)).__next__)
    for t in range(1, 10):
        r.round(t, 2, True)
    assert r.n_d == 8 and r.req_d == 18
    assert r.learn_drafting(accepted=9) == pytest.approx((1 + 9 / 18) * 1e9 / 10)


def test_throughput_never_much_below_not_drafting():
    """The whole loop: drafting that costs 6 plain steps for 4 tokens. Without the rule the batch keeps
    drafting at 2/3 of the plain rate; with it, once paused, within a few percent of the plain rate (what
    is lost: the probes, a few rounds of drafting every pause_max rounds once the pause has grown)."""
    on_settings = GateSettings(break_even=0.5, patience=8, pause=16, pause_max=512, probe=2, tps_every=400)
    off = Sim(GateSettings(break_even=0.5, patience=8, pause=16, pause_max=512, probe=2))
    off.run(5000, 6 * PLAIN)
    on = Sim(on_settings)
    on.until(lambda: on.c("accept_batch_tps_paused") == 1, 6 * PLAIN)  # the first tps_every / 4 rounds draft
    assert on.t < on_settings.tps_every // 4 + 4 * on_settings.patience
    tokens, elapsed = on.tokens, on.elapsed
    on.run(5000, 6 * PLAIN)
    plain = on.slots.shape[0] * 1e9 / PLAIN
    assert off.tokens / off.elapsed * 1e9 < 0.7 * plain
    assert (on.tokens - tokens) / (on.elapsed - elapsed) * 1e9 > 0.95 * plain


def test_a_skipped_round_is_a_gap_not_a_sample():
    r = StepRates(clock=iter([0, 5, 100, 103, 106, 109]).__next__)
    r.round(1, 2, 2)
    r.round(2, 2, 2)  # 5 ns
    r.round(4, 2, 2)  # round 3 skipped: no sample
    assert r.n_d == 1 and r.req_d == 6
    r.round(5, 2, 0)
    r.round(6, 0, 0)  # no requests: no sample
    assert r.n_p == 1
    assert r.learn_plain(6) is None  # fewer than MIN_SAMPLES
    assert MIN_SAMPLES > 1


def test_a_prefill_round_is_no_sample_but_its_requests_count():
    r = StepRates(clock=iter([0, 5, 50, 53]).__next__)
    r.round(1, 2, 2)
    r.round(2, 2, 2, decode=False)  # a step with prefill chunks: long with drafts or without
    r.round(3, 2, 2)
    r.round(4, 2, 0, decode=False)
    assert r.n_d == 1 and r.n_p == 0 and r.req_d == 6


def test_the_first_sample_counts_rounds_from_the_gates_first_not_the_engines():
    """A proxy that attaches to an engine already at round 10000 drafts tps_every / 4 rounds first too."""
    s = Sim()
    s.t = 10_000
    s.run(S.tps_every // 4 - S.patience, 2 * PLAIN)
    assert s.c("accept_batch_tps_samples") == 0
    s.until(lambda: s.g.b_sample, 2 * PLAIN)
    assert s.t - 10_000 >= S.tps_every // 4


def test_off_no_samples_and_no_rates():
    s = Sim(GateSettings(break_even=0.5, patience=8, pause=16, pause_max=64, probe=2, tps_every=0))
    s.run(500, 6 * PLAIN)
    assert s.g.tps is None and s.c("accept_batch_tps_samples") == 0 and s.g.b_state == ACTIVE
    snap = s.g.snapshot()
    assert snap["tps_rule"] is False and "tps_plain" not in snap
    on = Sim()
    _sampled(on, 6 * PLAIN)
    snap = on.g.snapshot()
    assert snap["tps_rule"] is True and snap["tps_plain"] == pytest.approx(250.0)
    assert snap["tps_drafting"] == pytest.approx(4 * 1e9 / (6 * PLAIN), rel=1e-3)


class SlowDrafts(ScriptedClient):
    """The in-process worker, `delay_s` slower on a STEP that asks for drafts (drafting made expensive)."""

    delay_s = 0.0

    def step(self, prefix, entries, n_rows, **kw):
        if self.delay_s and np.any(entries["flags"] & 1):
            time.sleep(self.delay_s)
        return super().step(prefix, entries, n_rows, **kw)


def test_through_the_round_expensive_drafting_is_paused_then_resumed(seg_name):
    """The real round, timed by the engine's GATHERED_NS stamps: drafts that cost 20 ms a round for 3
    accepted are paused (entries go out without NEED_DRAFT, rows still sent); once drafting is cheap
    again a probe resumes it."""
    gate = GateSettings(break_even=0.5, patience=4, pause=8, pause_max=16, probe=1, tps_every=64)
    client = SlowDrafts(max_reqs=4, num_spec=3, window=4, row_bytes=16)
    with Rig(seg_name, M=4, N=3, W=4, B=16, settings=RoundSettings(gate=gate), client=client) as rig:
        g, st = rig.core.accept.gate, rig.core.stats
        asked = [False]

        def one() -> np.ndarray:  # an engine that verifies (and accepts 3 of 3) what the last round drafted
            time.sleep(0.002)  # its forward (a paused round's STEP overlaps it: its reply was published first)
            v = 4 if asked[0] else 1
            b = rig.batch([(1, 0, v), (2, 1, v)])
            b["k_window"] = np.full(2, 3 if asked[0] else 0, np.int64)
            asked[0] = bool(rig.run(b).ok_mask[0])  # drafts given: the next step verifies them
            return client.sent_entries[-1]

        client.delay_s = 0.02
        for _ in range(80):
            one()
            if st.counter("accept_batch_tps_paused"):
                break
        assert g.b_state == PAUSED and g.b_tps and st.counter("accept_batch_tps_samples") >= 1
        assert g.tps.drafting < g.tps.plain
        ent = one()
        assert not np.any(ent["flags"] & 1) and ent["n_rows"].tolist() == [1, 1]  # rows sent, no drafts asked
        client.delay_s = 0.0
        for _ in range(120):
            one()
            if st.counter("accept_batch_tps_resumed"):
                break
        assert g.b_state == ACTIVE and st.counter("accept_batch_tps_resumed") == 1
        assert np.all(one()["flags"] & 1)


@contextlib.contextmanager
def _watched_steps(seg_name: str):
    """A rig with the gate on, and (round, published word) as each of its STEPs went out."""
    gate = GateSettings(break_even=0.5, patience=4, pause=8, pause_max=16, probe=1, tps_every=64)
    client = SlowDrafts(max_reqs=4, num_spec=3, window=4, row_bytes=16)
    with Rig(seg_name, M=4, N=3, W=4, B=16, settings=RoundSettings(gate=gate), client=client) as rig:
        seen: list[tuple[int, int]] = []
        client.before_step = lambda: seen.append((rig.t, rig.seg.word(Word.PUBLISHED)))
        rig.round([(1, 0, 1), (2, 1, 1)])
        assert seen[-1] == (1, 0)  # drafting: published after the STEP
        yield rig, client, seen


def test_a_paused_batch_is_published_before_its_step(seg_name):
    """The batch paused: each round's reply (no drafts) is published before its STEP goes out, so the
    engine does not wait for the worker; the STEP still carries the rows (the windows stay whole), and
    once drafting resumes the drafts are exact."""
    with _watched_steps(seg_name) as (rig, client, seen):
        g, st = rig.core.accept.gate, rig.core.stats
        g._batch_paused(rig.t, rig.t + 4, "accept_batch_tps_paused")  # rounds 2-4 paused
        for _ in range(3):
            reply, _ = rig.round([(1, 0, 1), (2, 1, 1)])
            assert reply.ok and not reply.ok_mask.any() and np.all(reply.draft_ids == -1)
            assert seen[-1] == (rig.t, rig.t), "a paused round's reply must be out before its STEP"
            ent = client.sent_entries[-1]
            assert not np.any(ent["flags"] & 1) and ent["n_rows"].tolist() == [1, 1]  # rows sent, no drafts asked
        assert st.counter("rounds_published_first") == 3
        for _ in range(3):  # the pause over: drafts again, from whole windows
            reply, b = rig.round([(1, 0, 1), (2, 1, 1)])
        assert g.b_state != PAUSED and reply.ok_mask.all() and rig.check_drafts(reply, b) == 2
        assert all(full_windows(rig, reply, b))
        assert seen[-1] == (rig.t, rig.t - 1)


def test_a_round_whose_every_slot_is_paused_is_published_before_its_step(seg_name):
    """Each slot paused on its own (the batch drafting): the round's reply (no drafts) is out before its
    STEP, which still carries the rows, so the engine does not wait for the worker."""
    with _watched_steps(seg_name) as (rig, client, seen):
        rig.core.accept.gate._pause(rig.t, np.array([0, 1]), "accept_paused")
        reply, _ = rig.round([(1, 0, 1), (2, 1, 1)])
        assert reply.ok and not reply.ok_mask.any() and np.all(reply.draft_ids == -1)
        assert seen[-1] == (2, 2), "the reply must be out before the STEP"
        assert not np.any(client.sent_entries[-1]["flags"] & 1) and client.sent_entries[-1]["n_rows"].tolist() == [1, 1]
        assert rig.core.stats.counter("rounds_published_first") == 1


@pytest.mark.parametrize("ratio", [2.0, 1.3])
def test_where_drafting_pays_the_rule_costs_under_one_percent(ratio):
    """The proxy's defaults (a plain sample of 16 rounds every 2048) on a run where drafting is `ratio`
    times the plain rate, each step ±30% at random: no pause, and tokens/s within 1% of the rule off."""
    on, off = Sim(GateSettings(tps_every=2048), n=4, seed=5), Sim(GateSettings(tps_every=0), n=4, seed=5)
    for s in (on, off):
        s.run(20000, int(PLAIN * 4 / ratio), noise=0.3)
    assert on.c("accept_batch_tps_paused") == 0 and on.c("accept_batch_tps_samples") >= 9
    assert on.tokens / on.elapsed > 0.99 * off.tokens / off.elapsed
