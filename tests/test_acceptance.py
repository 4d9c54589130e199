"""The drafting's effect and the acceptance gate (dspark_proxy/round/acceptance.py, gate.py): accepted drafts read from
the engine's valid / k_window, counted under vLLM's spec_decode names; the per-slot and whole-batch
state machines, one test per transition; and, through the real round (tests/rig.py), a paused request's
entry still carries its rows without NEED_DRAFT and its window stays whole."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_proxy.ops.stats import Stats
from dspark_proxy.round.acceptance import Acceptance, DraftEffect, accepted_drafts
from dspark_proxy.round.core import RoundSettings
from dspark_proxy.round.gate import ACTIVE, PAUSED, PROBING, GateSettings
from tests.rig import Rig, full_windows

pytestmark = pytest.mark.timeout(60)

S = GateSettings(break_even=0.5, patience=4, pause=10, pause_max=25, probe=2)


def test_accepted_drafts_from_valid_and_k_window():
    valid = np.array([1, 3, 6, 9, 2, 0], np.int64)  # 9: a prefill chunk; 0: nothing (k_window 0)
    kw = np.array([0, 4, 5, 0, 1, 0], np.int32)
    ver, acc = accepted_drafts(valid, kw, 5)
    assert ver.tolist() == [False, True, True, False, True, False]
    assert acc.tolist() == [0, 2, 5, 0, 1, 0]
    ver, acc = accepted_drafts(np.array([7], np.int64), np.array([9], np.int32), 5)  # capped at N
    assert acc.tolist() == [5]


def test_draft_effect_counts_like_vllm():
    st = Stats()
    eff = DraftEffect(st, 3)
    eff.observe(3, np.array([0, 2, 3, 0], np.int32), np.array([3, 3, 3, 0], np.int32))
    eff.observe(1, np.array([1, 0], np.int32), np.array([2, 0], np.int32))
    eff.flush()
    c = st.snapshot()["counters"]
    assert c["spec_decode_num_drafts"] == 4 and c["spec_decode_num_draft_tokens"] == 11
    assert c["spec_decode_num_accepted_tokens"] == 6
    assert [c.get(f"spec_decode_num_accepted_tokens_per_pos_{j}", 0) for j in range(3)] == [3, 2, 1]
    eff.flush()  # nothing new: nothing added
    assert st.snapshot()["counters"]["spec_decode_num_drafts"] == 4


class G:
    """One Acceptance over 4 slots (N = 5), driven round by round with accepted drafts per request."""

    def __init__(self, settings: GateSettings = S) -> None:
        self.st = Stats()
        self.a = Acceptance(4, 5, settings, self.st)
        self.g = self.a.gate
        self.t = 0

    def round(self, slots, acc, verified=None, new_owner=None):
        self.t += 1
        slots = np.array(slots, np.int64)
        ver = np.ones(len(slots), bool) if verified is None else np.array(verified, bool)
        valid = np.where(ver, np.array(acc) + 1, 1).astype(np.int32)
        kw = np.where(ver, 5, 0).astype(np.int32)
        no = np.zeros(len(slots), bool) if new_owner is None else np.array(new_owner, bool)
        self.a.round(self.t, slots, valid, kw, no, int(no.sum()))
        need = np.ones(len(slots), bool)
        self.a.mask(slots, need)
        return need

    def c(self, k):
        return self.st.counter(k)


def test_active_stays_active_while_drafts_earn():
    g = G()
    for _ in range(20):
        assert g.round([0, 1], [2, 1]).all()
    assert g.g.state[:2].tolist() == [ACTIVE, ACTIVE] and g.c("accept_paused") == 0


def test_active_to_paused_after_patience_rounds_below_break_even():
    g = G()
    for _ in range(S.patience - 1):  # not before patience verified rounds
        assert g.round([0, 1], [0, 3]).all()
    need = g.round([0, 1], [0, 3])
    assert g.g.state[0] == PAUSED and g.g.state[1] == ACTIVE and g.c("accept_paused") == 1
    assert need.tolist() == [False, True]  # observed before the round's flags are built: from this round
    assert g.round([0, 1], [0, 3], verified=[False, True]).tolist() == [False, True]
    assert g.c("accept_drafts_not_asked") == 2


def test_paused_to_probing_when_the_pause_is_over():
    g = G()
    for _ in range(S.patience):
        g.round([0, 1], [0, 3])
    paused_at = g.t
    while g.t < paused_at + S.pause - 1:
        assert g.round([0, 1], [0, 3], verified=[False, True]).tolist() == [False, True]
    assert g.round([0, 1], [0, 3], verified=[False, True]).tolist() == [True, True]  # round paused_at + pause
    assert g.g.state[0] == PROBING and g.c("accept_probes") == 1


def _to_probing(g: G) -> None:
    for _ in range(S.patience):
        g.round([0, 1], [0, 3])
    for _ in range(S.pause):
        g.round([0, 1], [0, 3], verified=[False, True])
    assert g.g.state[0] == PROBING


def test_probing_to_active_when_the_probe_earns():
    g = G()
    _to_probing(g)
    g.round([0, 1], [1, 3])
    assert g.g.state[0] == PROBING  # a probe lasts `probe` verified rounds
    g.round([0, 1], [1, 3])
    assert g.g.state[0] == ACTIVE and g.c("accept_resumed") == 1 and g.g.pause[0] == S.pause


def test_probing_to_paused_with_the_pause_doubled_when_the_probe_fails():
    g = G()
    _to_probing(g)
    g.round([0, 1], [0, 3])
    g.round([0, 1], [0, 3])
    assert g.g.state[0] == PAUSED and g.c("accept_probe_failed") == 1
    assert g.g.until[0] == g.t + 2 * S.pause
    for _ in range(3):  # doubled each failed probe, at most pause_max
        while g.g.state[0] == PAUSED:
            g.round([0, 1], [0, 3], verified=[False, True])
        g.round([0, 1], [0, 3])
        g.round([0, 1], [0, 3])
    assert g.g.pause[0] == S.pause_max


def test_a_new_request_in_a_paused_slot_starts_active():
    g = G()
    for _ in range(S.patience):
        g.round([0, 1], [0, 3])
    assert g.g.state[0] == PAUSED and g.g.n_paused == 1
    assert g.round([0, 1], [0, 3], verified=[False, True], new_owner=[True, False]).tolist() == [True, True]
    assert g.g.state[0] == ACTIVE and g.g.n_paused == 0 and g.g.cnt[0] == 0


def test_drafts_verified_while_paused_are_not_a_probe():
    """The round after a pause may verify drafts asked before it: they change nothing."""
    g = G()
    for _ in range(S.patience):
        g.round([0, 1], [0, 3])
    g.round([0, 1], [5, 3])  # verified, but paused: ignored
    assert g.g.state[0] == PAUSED and g.c("accept_resumed") == 0


def test_the_whole_batch_pauses_probes_and_resumes():
    s = GateSettings(break_even=0.5, patience=100, pause=5, pause_max=20, probe=2)  # slots never pause here
    g = G(s)
    for _ in range(s.patience):
        g.round([0, 1, 2], [0, 1, 0])  # mean 1/3 < 0.5 a round
    assert g.g.b_state == PAUSED and g.c("accept_batch_paused") == 1
    assert not g.round([0, 1, 2], [0, 0, 0], verified=[False] * 3).any()  # nobody asks drafts
    while g.g.b_state == PAUSED:
        g.round([0, 1, 2], [0, 0, 0], verified=[False] * 3)
    assert g.g.b_state == PROBING and g.c("accept_batch_probes") == 1
    g.round([0, 1, 2], [0, 0, 0])
    g.round([0, 1, 2], [0, 0, 0])
    assert g.g.b_state == PAUSED and g.c("accept_batch_probe_failed") == 1 and g.g.b_pause == 10
    while g.g.b_state == PAUSED:
        g.round([0, 1, 2], [0, 0, 0], verified=[False] * 3)
    g.round([0, 1, 2], [3, 2, 1])
    g.round([0, 1, 2], [3, 2, 1])
    assert g.g.b_state == ACTIVE and g.c("accept_batch_resumed") == 1 and g.g.b_pause == s.pause


def test_off_and_the_engines_no_wins():
    g = G(GateSettings(break_even=0.0))
    for _ in range(50):
        assert g.round([0], [0]).all()
    assert g.c("accept_paused") == 0
    g = G()
    for _ in range(S.patience):
        g.round([0, 1], [3, 3])
    need = np.array([False, True])
    g.g.mask(np.array([0, 1]), need)  # the gate never sets a flag the engine cleared
    assert need.tolist() == [False, True]


def test_a_paused_request_keeps_its_rows_and_its_whole_window(seg_name):
    """Through the real round: a slot whose drafts are all rejected stops getting NEED_DRAFT, its entry
    still carries its rows (the worker's window stays whole), and drafting resumes on a probe."""
    gate = GateSettings(break_even=0.5, patience=3, pause=4, pause_max=8, probe=1)
    with Rig(seg_name, M=4, N=3, W=4, B=16, settings=RoundSettings(gate=gate)) as rig:
        reqs = [(1, 0, 1), (2, 1, 1)]
        for _ in range(3):  # fill the windows, no drafts verified yet
            rig.round(reqs)
        paused_seen = resumed = False
        for _ in range(20):
            # request 1 accepts none; request 2 all 3 (so the batch's own machine, on their mean, drafts on)
            b = rig.batch([(1, 0, 1), (2, 1, 4)])
            b["k_window"] = np.array([3, 3], np.int64)
            if rig.core.accept.gate.state[0] == PAUSED:
                paused_seen = True
            reply = rig.run(b)
            ent = rig.client.sent_entries[-1]
            assert ent["n_rows"].tolist() == [1, 4]  # rows always sent
            assert rig.core.accept.gate.b_state != PAUSED
            if not ent["flags"][0] & 1:
                assert not reply.ok_mask[0]
            assert all(full_windows(rig, reply, b)[i] or not reply.ok_mask[i] for i in range(2))
        assert paused_seen and rig.core.stats.counter("accept_paused") >= 1
        assert rig.core.stats.counter("accept_probes") >= 1
        # now request 1 accepts everything: its next probe resumes it, with a whole window
        for _ in range(20):
            b = rig.batch([(1, 0, 4), (2, 1, 4)])  # 3 accepted + the bonus token: 4 rows each
            b["k_window"] = np.array([3, 3], np.int64)
            reply = rig.run(b)
            if rig.core.accept.gate.state[0] == ACTIVE and rig.client.sent_entries[-1]["flags"][0] & 1:
                resumed = True
                assert reply.ok_mask[0] and full_windows(rig, reply, b)[0]
        assert resumed and rig.core.stats.counter("accept_resumed") >= 1
        c = rig.core.stats.snapshot()["counters"]
        assert c["spec_decode_num_drafts"] > 0 and c["spec_decode_num_accepted_tokens"] > 0
