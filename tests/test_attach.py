"""The shim's attach/detach state machine (engine_shim.attach): a table walk, as h11's test_state does."""

from __future__ import annotations

import itertools

import pytest

from engine_shim.attach import TRANSITIONS, AttachEvent, AttachState, IllegalTransition, next_state

S, E = AttachState, AttachEvent

# What the table must say, written out independently of it: a typo in either shows.
EXPECTED = {
    (S.DETACHED, E.FOUND): S.PENDING,
    (S.DETACHED, E.LOST): S.DETACHED,
    (S.DETACHED, E.CLOSE): S.CLOSED,
    (S.PENDING, E.ATTACH_OK): S.ATTACHED,
    (S.PENDING, E.ATTACH_REFUSED): S.DETACHED,
    (S.PENDING, E.LOST): S.DETACHED,
    (S.PENDING, E.CLOSE): S.CLOSED,
    (S.ATTACHED, E.LOST): S.DETACHED,
    (S.ATTACHED, E.CLOSE): S.CLOSED,
    (S.CLOSED, E.CLOSE): S.CLOSED,
}


def test_table_is_the_expected_one():
    assert TRANSITIONS == EXPECTED


@pytest.mark.parametrize(("state", "event"), sorted(EXPECTED, key=lambda k: (k[0].value, k[1].value)))
def test_every_row(state, event):
    assert next_state(state, event) is EXPECTED[(state, event)]


ILLEGAL = [(s, e) for s, e in itertools.product(S, E) if (s, e) not in EXPECTED]


def test_illegal_pairs_exist_for_every_state_but_none_for_close():
    # every state refuses something, and CLOSE is legal everywhere (close() is idempotent)
    assert {s for s, _ in ILLEGAL} == set(S)
    assert all(e is not E.CLOSE for _, e in ILLEGAL)


@pytest.mark.parametrize(("state", "event"), ILLEGAL, ids=[f"{s.value}-{e.value}" for s, e in ILLEGAL])
def test_illegal_pair_raises_and_leaves_the_state(state, event):
    cur = state
    with pytest.raises(IllegalTransition, match=f"{event.value} is not legal in state {state.value}"):
        cur = next_state(cur, event)
    assert cur is state


def test_illegal_transition_is_not_a_value_error():
    # a bug in the shim, not bad input from the engine: callers must not catch it as ShimError
    assert not issubclass(IllegalTransition, ValueError)


def test_closed_is_final():
    for e in E:
        if e is E.CLOSE:
            assert next_state(S.CLOSED, e) is S.CLOSED
        else:
            with pytest.raises(IllegalTransition):
                next_state(S.CLOSED, e)


def test_scripted_sequence():
    """A shim's life: no proxy, a proxy found and attached, it dies, a race lost, a new one, close."""
    script = [
        (E.LOST, S.DETACHED),  # a stale report while detached is harmless
        (E.FOUND, S.PENDING),
        (E.ATTACH_OK, S.ATTACHED),
        (E.LOST, S.DETACHED),  # proxy killed
        (E.FOUND, S.PENDING),
        (E.ATTACH_REFUSED, S.DETACHED),  # another engine attached first
        (E.FOUND, S.PENDING),
        (E.LOST, S.DETACHED),  # died before the engine's next round boundary
        (E.FOUND, S.PENDING),
        (E.ATTACH_OK, S.ATTACHED),
        (E.CLOSE, S.CLOSED),
        (E.CLOSE, S.CLOSED),
    ]
    state = S.DETACHED
    for event, want in script:
        state = next_state(state, event)
        assert state is want, (event, state)
    # and an illegal event in the middle of a run changes nothing
    state = next_state(S.DETACHED, E.FOUND)
    with pytest.raises(IllegalTransition):
        state = next_state(state, E.FOUND)
    assert state is S.PENDING
