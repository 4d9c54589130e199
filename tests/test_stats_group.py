"""stats.py's HistGroup: the round's latencies recorded in one call (`_fastround.hist_observe`) against
its reference (`HistGroup.observe_ref`, Stats.observe's arithmetic), and a group's keys read like any
other latency key."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_proxy import native
from dspark_proxy.ops.stats import Stats
from dspark_proxy.round.stats import ROUND_KEYS, RoundLatencies

KEYS = ("a", "b", "c", "d")

# values across every branch: the buckets, both clamps, the edges, NaN, infinities, negatives, subnormals
_value = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(0.0, 1e3),
                   st.sampled_from([0.0, -0.0, 2.0 ** -4, 2.0 ** -4 + 1e-12, 2.0 ** 27, 2.0 ** 27 - 1e-6, 5e-324,
                                    math.nan, math.inf, -math.inf, 1.0, 127.5 / 128]))
_call = st.lists(st.tuples(st.integers(0, len(KEYS) - 1), _value), min_size=1, max_size=8)


def _state(s: Stats) -> dict:
    lat = s._lat
    return {k: (np.asarray(h.counts).tobytes(), h.sum_us, h.min_us, h.max_us) for k, h in sorted(lat.items())}


@settings(max_examples=200, deadline=None)
@given(calls=st.lists(_call, max_size=30), before=st.lists(_value, max_size=3))
def test_c_and_reference_record_the_same(calls, before):
    out = []
    for on in (True, False):
        s = Stats()
        for v in before:  # observed before the group existed: carried over into it
            s.observe("b", v)
        g = s.group(KEYS, on)
        assert (g._held is not None) is on
        for call in calls:
            at = tuple(i for i, _ in call)
            g.observe(at, *[v for _, v in call])
        out.append(_state(s))
    c, ref = out
    assert c.keys() == ref.keys()
    for k in ref:  # bitwise: the same buckets, and sums added in the same order
        assert c[k][0] == ref[k][0], k
        for x, y in zip(c[k][1:], ref[k][1:], strict=True):
            assert x == y or (math.isnan(x) and math.isnan(y)), k


@pytest.mark.parametrize("on", [True, False])
def test_a_group_key_reads_like_a_plain_one(on):
    """Summaries, histograms and the log line of a group's key are those of the same values observed one
    by one; a key appears only once observed; a plain observe of a group's key lands in the group."""
    vals = [0.5, 3.0, 3.1, 17.0, 250.0, 1e4]
    plain, grouped = Stats(), Stats()
    for v in vals:
        plain.observe("a", v)
    plain.observe("c", 9.0)
    g = grouped.group(KEYS, on)
    for v in vals[:-1]:
        g.observe((0,), v)
    grouped.observe("a", vals[-1])
    grouped.observe("c", 9.0)
    assert grouped.snapshot()["latency"] == plain.snapshot()["latency"]
    assert set(grouped.snapshot()["latency"]) == {"a", "c"}
    assert grouped.histograms([1, 10, 100]) == plain.histograms([1, 10, 100])
    assert grouped.format_line("x") == plain.format_line("x")
    assert grouped.group(KEYS, on) is g  # a later RoundCore shares it
    with pytest.raises(ValueError, match="another group"):
        grouped.group(("z", "a"), on)


def test_bad_calls_record_nothing():
    s = Stats()
    g = s.group(KEYS, True)
    with pytest.raises(TypeError):
        native.fastround.hist_observe(g._held, (0, 1), 1.0)
    with pytest.raises(IndexError):
        native.fastround.hist_observe(g._held, (0, 9), 1.0, 2.0)
    with pytest.raises(TypeError):
        native.fastround.hist_observe(g._held, (0, 1), 1.0, "x")
    with pytest.raises(TypeError):
        native.fastround.hist_observe(object(), (0,), 1.0)
    assert not g.counts.any() and not g.sums.any()
    with pytest.raises(TypeError):
        g.observe_ref((0, 1), 1.0)


@pytest.mark.parametrize("on", [True, False])
def test_round_latencies_keep_their_keys(on):
    """The round's keys as round/core.py always wrote them: every round its time by phase; with a reply, the
    STEP's figures and the proxy's cost per round."""
    s = Stats()
    lat = RoundLatencies(s, on)
    lat.done("decode", 20.0, 6.0, 3.0)
    lat.done("prefill", 9.0, -1.0, -1.0)
    lat.skipped(2.0)
    got = {k: (v["count"], v["max_us"]) for k, v in s.snapshot()["latency"].items()}
    assert got == {"rank0_round_us": (3, 20.0), "proxy_parked_us_decode": (1, 20.0), "proxy_cost_us": (1, 14.0),
                   "rtt_us": (1, 6.0), "rtt_us_decode": (1, 6.0), "worker_us": (1, 3.0),
                   "proxy_parked_us_prefill": (1, 9.0)}
    assert set(got) <= set(ROUND_KEYS)
