"""breaker.py: every row of the transition table, every illegal event, and a scripted replay."""

from __future__ import annotations

import itertools

import pytest

from dspark_proxy.round.breaker import TRANSITIONS, BreakerError, BreakerEvent, BreakerState, CircuitBreaker

pytestmark = pytest.mark.timeout(10)

S, E = BreakerState, BreakerEvent

EXPECTED_TABLE = {
    (S.CLOSED, E.SUCCESS): S.CLOSED,
    (S.CLOSED, E.FAILURE): S.CLOSED,
    (S.CLOSED, E.FAILURE_AT_THRESHOLD): S.OPEN,
    (S.OPEN, E.COOLDOWN_OVER): S.HALF_OPEN,
    (S.HALF_OPEN, E.SUCCESS): S.CLOSED,
    (S.HALF_OPEN, E.FAILURE): S.OPEN,
}


def _in_state(state: BreakerState, threshold: int = 3, cooldown: int = 5) -> CircuitBreaker:
    """A breaker brought to ``state`` through the public API only (round numbers 1, 2, ...)."""
    b = CircuitBreaker(threshold, cooldown)
    if state is S.CLOSED:
        assert b.allow(1) and b.record(False, 1) is None  # a run of one failure, still closed
        return b
    for t in range(1, threshold + 1):
        assert b.allow(t)
        b.record(False, t)
    if state is S.OPEN:
        return b
    assert b.allow(threshold + cooldown + 1)  # the probe
    return b


def test_table_is_exactly_the_documented_one():
    assert TRANSITIONS == EXPECTED_TABLE


def test_closed_success_resets_the_run():
    b = _in_state(S.CLOSED)
    assert b.consecutive_failures == 1
    assert b.record(True, 2) is None
    assert (b.current, b.consecutive_failures) == (S.CLOSED, 0)


def test_closed_failure_below_threshold_stays_closed():
    b = _in_state(S.CLOSED)
    assert b.record(False, 2) is None
    assert (b.current, b.consecutive_failures, b.trips) == (S.CLOSED, 2, 0)
    assert b.allow(3)


def test_closed_failure_at_threshold_trips():
    b = _in_state(S.CLOSED)
    b.record(False, 2)
    assert b.record(False, 3) == "tripped"
    assert (b.state, b.trips, b.opened_round, b.consecutive_failures) == ("open", 1, 3, 0)


def test_open_cooldown_over_grants_one_probe():
    b = _in_state(S.OPEN, threshold=3, cooldown=5)  # tripped at round 3
    assert [b.allow(t) for t in range(4, 9)] == [False] * 5  # rounds 4..8: the 5 cooldown rounds
    assert b.state == "open"
    assert b.allow(9)
    assert (b.state, b.probes) == ("half_open", 1)
    assert not b.allow(9)  # the probe is outstanding: no second round through


def test_half_open_success_recovers():
    b = _in_state(S.HALF_OPEN)
    assert b.record(True, 9) == "recovered"
    assert (b.state, b.recoveries, b.trips, b.consecutive_failures) == ("closed", 1, 1, 0)
    assert b.allow(10)


def test_half_open_failure_reopens_for_a_new_cooldown():
    b = _in_state(S.HALF_OPEN, cooldown=5)
    assert b.record(False, 9) == "tripped"
    assert (b.state, b.trips, b.opened_round) == ("open", 2, 9)
    assert [b.allow(t) for t in range(10, 16)] == [False] * 5 + [True]


@pytest.mark.parametrize("pair", sorted(EXPECTED_TABLE, key=lambda p: (p[0].value, p[1].value)))
def test_every_row_through_apply(pair):
    src, event = pair
    b = _in_state(src)
    b.apply(event, 100)
    assert b.current is EXPECTED_TABLE[pair]


ILLEGAL = [p for p in itertools.product(BreakerState, BreakerEvent) if p not in EXPECTED_TABLE]


@pytest.mark.parametrize("pair", ILLEGAL, ids=[f"{s.value}-{e.value}" for s, e in ILLEGAL])
def test_illegal_events_raise_and_change_nothing(pair):
    src, event = pair
    b = _in_state(src)
    before = b.snapshot()
    with pytest.raises(BreakerError, match=event.value):
        b.apply(event, 100)
    assert b.snapshot() == before and b.current is src


def test_recording_while_open_is_illegal():
    b = _in_state(S.OPEN)
    before = b.snapshot()
    for ok in (True, False):
        with pytest.raises(BreakerError):
            b.record(ok, 4)
    assert b.snapshot() == before


def test_probe_that_never_went_out_is_neutral():
    b = _in_state(S.HALF_OPEN, cooldown=5)  # probe granted in round 9, nothing recorded
    assert not b.allow(9)
    assert b.allow(10)  # round 9 ended without an outcome: round 10 is the probe
    assert (b.state, b.probes, b.trips) == ("half_open", 2, 1)
    assert b.record(True, 10) == "recovered"


def test_zero_cooldown_probes_the_next_round():
    b = CircuitBreaker(threshold=1, cooldown=0)
    assert b.allow(1) and b.record(False, 1) == "tripped"
    assert not b.allow(1)
    assert b.allow(2) and b.state == "half_open"


def test_bad_parameters():
    with pytest.raises(ValueError, match="breaker_threshold"):
        CircuitBreaker(0, 5)
    with pytest.raises(ValueError, match="breaker_cooldown"):
        CircuitBreaker(3, -1)


# (round, outcome) where outcome is True/False for a round that went out and None for one that did not
# (open breaker, or a neutral round); then the expected allow(), record() result and state afterwards.
SCRIPT = [
    # round, allowed, outcome, result, state after
    (1, True, True, None, "closed"),
    (2, True, False, None, "closed"),
    (3, True, None, None, "closed"),  # neutral: nothing to draft, the run of failures is kept
    (4, True, False, None, "closed"),
    (5, True, True, None, "closed"),  # a success breaks the run
    (6, True, False, None, "closed"),
    (7, True, False, None, "closed"),
    (8, True, False, "tripped", "open"),  # 3 in a row
    (9, False, None, None, "open"),
    (10, False, None, None, "open"),
    (11, True, False, "tripped", "open"),  # cooldown 2 over: the probe fails
    (12, False, None, None, "open"),
    (13, False, None, None, "open"),
    (14, True, None, None, "half_open"),  # probe granted, but nothing went out
    (15, True, True, "recovered", "closed"),  # the probe moves to round 15 and succeeds
    (16, True, False, None, "closed"),
]


def test_scripted_replay():
    b = CircuitBreaker(threshold=3, cooldown=2)
    for t, allowed, outcome, result, state in SCRIPT:
        assert b.allow(t) is allowed, t
        got = b.record(outcome, t) if outcome is not None else None
        assert (got, b.state) == (result, state), t
    assert b.snapshot() == {"state": "closed", "trips": 2, "recoveries": 1, "probes": 3,
                            "consecutive_failures": 1, "threshold": 3, "cooldown": 2, "opened_round": 11}
