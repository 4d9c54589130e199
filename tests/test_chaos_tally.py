"""The campaign's proxy-event attribution: a new engine numbers its rounds from 1 again, so events are
tied to an injection by when they happened, not by round number alone."""

from __future__ import annotations

import pytest

from dspark_proxy.chaos.tally import ProxyTally

pytestmark = pytest.mark.timeout(10)


def _tally(events: list[tuple[int, int, float]]) -> ProxyTally:
    t = ProxyTally("unused")
    for i, (pid, rnd, when) in enumerate(events):
        t.events[(pid, i)] = {"id": i, "round": rnd, "time": when, "how": "skipped"}
    return t


def test_events_of_an_earlier_engine_with_the_same_round_numbers_are_not_taken():
    # the first engine's rounds 100..110 at t = 10 s; after an engine restart, rounds 100..110 again at 50 s
    first = [(7, r, 10.0 + r / 1000) for r in range(100, 111)]
    second = [(7, r, 50.0 + r / 1000) for r in range(100, 111)]
    t = _tally(first + second)
    got = t.events_between(100, 110, 49.0, 51.0)
    assert [e["time"] for e in got] == [e[2] for e in second]
    # by rounds alone both engines' events match: what the wall-clock span is for
    assert len(t.events_between(100, 110)) == 22


def test_an_injection_over_an_engine_restart_takes_the_events_of_its_span():
    # rounds run backwards across the restart (t_start 500 > t_end 3): the span still finds them
    evs = [(7, 499, 20.0), (7, 500, 20.1), (7, 2, 20.5), (7, 3, 20.6), (7, 4, 30.0)]
    t = _tally(evs)
    got = t.events_between(500, 3, 20.05, 20.7)
    assert [(e["round"], e["time"]) for e in got] == [(2, 20.5), (3, 20.6), (500, 20.1)]
    assert t.events_between(500, 3) == []
