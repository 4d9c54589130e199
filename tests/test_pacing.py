"""Link pacing (dspark_proxy/round/pacing.py): every transition of the row cap's table, the resync pacing, and
what a round may send. Time is passed in: each test replays an exact sequence."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_proxy.round.pacing import TRANSITIONS, LinkEvent, LinkPacer, LinkState, PacingError

W, MAX_ROWS, RESYNC_MAX = 8, 256, 4
DEADLINE_NS = 10_000_000  # 10 ms: half of it is 5000 µs


def _pacer() -> tuple[LinkPacer, list[tuple[str, int]]]:
    told: list[tuple[str, int]] = []
    p = LinkPacer(window=W, max_rows=MAX_ROWS, resync_max=RESYNC_MAX, deadline_ns=DEADLINE_NS,
                  publish=lambda k, v: told.append((k, v)))
    return p, told


def test_starts_uncapped_asking_for_what_one_enqueue_stages():
    p, told = _pacer()
    assert p.state is LinkState.UNCAPPED and p.row_cap == 0 and p.resync_cap == RESYNC_MAX
    assert told == [("resync_windows_per_round", RESYNC_MAX)]


def test_uncapped_reply_keeps_it_uncapped():
    p, told = _pacer()
    p.on_reply(64, 100.0)
    assert p.state is LinkState.UNCAPPED and p.row_cap == 0
    assert ("row_cap", 0) not in told


def test_uncapped_timeout_caps_at_half_the_step():
    p, told = _pacer()
    p.on_timeout(64, 5000.0)
    assert p.state is LinkState.CAPPED and p.row_cap == 32 and ("row_cap", 32) in told


def test_timeout_cap_never_below_a_window():
    p, _ = _pacer()
    p.on_timeout(W + 1, 5000.0)
    assert p.row_cap == W


def test_capped_timeout_only_lowers_the_cap():
    p, _ = _pacer()
    p.on_timeout(64, 5000.0)  # cap 32
    p.on_timeout(200, 5000.0)  # half is 100: the cap stays 32
    assert p.row_cap == 32
    p.on_timeout(40, 5000.0)  # half is 20
    assert p.state is LinkState.CAPPED and p.row_cap == 20


def test_capped_reply_far_below_the_cap_changes_nothing():
    p, _ = _pacer()
    p.on_timeout(128, 5000.0)  # cap 64
    p.on_reply(W, 1.0)  # 2 * 8 < 64: says nothing about the link at the cap
    assert p.state is LinkState.CAPPED and p.row_cap == 64


def test_capped_reply_near_the_cap_follows_the_link_at_most_twice_the_cap():
    p, _ = _pacer()
    p.on_timeout(128, 5000.0)  # cap 64
    p.on_reply(64, 4000.0)  # 64 rows in 4 ms: 80 rows in 5 ms
    assert p.state is LinkState.CAPPED and p.row_cap == 80
    p.on_reply(80, 2500.0)  # 160 in 5 ms, but at most twice the cap
    assert p.row_cap == 160
    p.on_reply(160, 20000.0)  # slower: 40 in 5 ms
    assert p.row_cap == 40


def test_capped_reply_that_carries_max_rows_lifts_the_cap():
    p, told = _pacer()
    p.on_timeout(256, 5000.0)  # cap 128
    p.on_reply(128, 100.0)  # fits far more than max_rows in half the deadline (and 2 x 128 = 256)
    assert p.state is LinkState.UNCAPPED and p.row_cap == 0 and told[-1] == ("row_cap", 0)


def test_capped_reply_without_a_round_trip_counts_as_a_timeout():
    p, _ = _pacer()
    p.on_timeout(128, 5000.0)  # cap 64
    p.on_reply(100, 0.0)
    assert p.row_cap == 50


def test_steps_below_a_window_are_not_recorded():
    p, told = _pacer()
    p.on_timeout(W - 1, 1.0)
    p.on_reply(W - 1, 1e9)
    assert p.row_cap == 0 and p.rows_per_us == 0.0 and len(told) == 1


@pytest.mark.parametrize("event", [LinkEvent.FAR_BELOW, LinkEvent.CARRIES_ALL])
def test_an_illegal_pair_raises_and_changes_nothing(event):
    p, told = _pacer()
    with pytest.raises(PacingError):
        p.apply(event, 64, 100.0)
    assert p.state is LinkState.UNCAPPED and p.row_cap == 0 and len(told) == 1


def test_the_table_covers_each_state():
    assert {s for s, _ in TRANSITIONS} == set(LinkState)
    assert set(TRANSITIONS.values()) == set(LinkState)


def test_resync_pacing_follows_the_rate():
    p, told = _pacer()
    p.on_reply(W, 5000.0)  # 8 rows per 5 ms: one window in half the deadline
    assert p.resync_cap == 1 and told[-1] == ("resync_windows_per_round", 1)
    assert p.windows(3) == 1
    for _ in range(60):  # the EWMA climbs towards 64 rows per 5 ms (8 windows), capped at RESYNC_MAX
        p.on_reply(64, 5000.0)
    assert p.resync_cap == RESYNC_MAX and p.windows(3) == 3


def test_a_timeout_is_an_upper_bound_on_the_rate():
    p, _ = _pacer()
    p.learn_rate(1000, 1.0)  # very fast
    p.on_timeout(W, 10_000.0)  # 8 rows did not come back in 10 ms
    assert p.rows_per_us == pytest.approx(W / 10_000.0) and p.resync_cap == 1


def test_keep_cuts_to_the_cap_keeping_at_least_one():
    p, _ = _pacer()
    p.on_timeout(20, 5000.0)  # cap 10
    rows = np.array([4, 4, 4, 4], dtype=np.int64)
    assert p.over_cap(16, 4) and not p.over_cap(16, 1) and not p.over_cap(10, 4)
    assert p.keep(rows) == (2, 8)
    assert p.keep(np.array([30, 1], dtype=np.int64)) == (1, 30)
