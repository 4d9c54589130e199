"""stats.py: counters, gauges, histogram accuracy and bounds, atomic JSON, size-limited snapshots."""

from __future__ import annotations

import json
import math
import os
import threading
import time
import timeit

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_proxy.ops import stats as stats_mod
from dspark_proxy.ops.stats import LATENCY_FIELDS, Stats

pytestmark = pytest.mark.timeout(60)


def _nearest_rank(sorted_x: np.ndarray, q: float) -> float:
    return float(sorted_x[max(1, math.ceil(q * len(sorted_x))) - 1])


def test_counters_and_gauges():
    s = Stats()
    s.inc("rounds_ok")
    s.inc("rounds_ok", 4)
    s.inc("rows_sent", 0)
    s.set("breaker", {"state": "closed", "trips": 0})
    s.set("breaker", {"state": "open", "trips": 1})  # a gauge is replaced, not merged
    snap = s.snapshot()
    assert snap["counters"] == {"rounds_ok": 5, "rows_sent": 0}
    assert snap["gauges"] == {"breaker": {"state": "open", "trips": 1}}
    assert snap["latency"] == {}
    assert s.counter("rounds_ok") == 5 and s.counter("missing") == 0
    assert s.gauge("missing", 7) == 7
    snap["counters"]["rounds_ok"] = 99  # a snapshot is a copy
    assert s.counter("rounds_ok") == 5


@pytest.mark.parametrize(
    "name,sample",
    [
        ("lognormal", lambda r: r.lognormal(3.0, 2.0, 50_000)),
        ("uniform_small", lambda r: r.uniform(0.1, 2.0, 20_000)),
        ("wide", lambda r: 10.0 ** r.uniform(-1.0, 8.0, 50_000)),  # 0.1 µs .. 100 s
        ("bimodal", lambda r: np.concatenate([r.normal(50, 2, 9_000), r.normal(5_000, 100, 1_000)])),
    ],
)
def test_percentiles_within_one_percent_of_exact(name, sample):
    x = sample(np.random.default_rng(7))
    s = Stats()
    for v in x.tolist():
        s.observe("k", v)
    got = s.latency("k")
    assert got is not None and set(got) == set(LATENCY_FIELDS)
    xs = np.sort(x)
    for field, q in stats_mod.PERCENTILES:
        exact = _nearest_rank(xs, q)
        assert abs(got[field] - exact) <= 0.008 * exact + 0.001, (name, field, got[field], exact)
    assert got["count"] == len(x)
    assert got["max_us"] == pytest.approx(float(xs[-1]), abs=1e-3)
    assert got["mean_us"] == pytest.approx(float(x.mean()), rel=1e-6, abs=1e-3)


@settings(deadline=None, max_examples=300)
@given(st.floats(min_value=0.07, max_value=1.3e8, allow_nan=False))
def test_bucket_midpoint_is_close_to_the_value(v):
    m, e = math.frexp(v)
    i = e * stats_mod._SUB + int(m * 2 * stats_mod._SUB) + stats_mod._OFFSET
    assert 0 <= i < stats_mod._N_BUCKETS
    assert abs(stats_mod._MIDS_US[i] - v) <= 0.0079 * v


def test_buckets_are_ordered_and_bounded():
    mids = stats_mod._MIDS_US
    assert len(mids) == stats_mod._N_BUCKETS == 31 * 64
    assert np.all(np.diff(mids) > 0)
    assert mids[0] < 0.1 and mids[-1] > 1e8  # covers 0.1 µs .. 100 s


def test_edge_values_are_clamped_not_fatal():
    s = Stats()
    for v in (0.0, -5.0, float("nan"), 0.01, float("inf"), 1e12):
        s.observe("k", v)
    got = s.latency("k")
    assert got["count"] == 6
    # 0, -5 and nan count as 0; 0.01 is below the lowest bucket: p50 (the 3rd value) is the underflow bucket
    assert 0.0 <= got["p50_us"] < 0.07
    assert got["p99_us"] == pytest.approx(2.0**27, rel=0.008)  # inf and 1e12 clamp to the top bucket
    assert got["max_us"] == pytest.approx(2.0**27)
    assert math.isfinite(got["mean_us"])
    assert s.latency("never") is None


def test_empty_percentiles_are_none():
    s = Stats()
    s._lat["k"] = stats_mod._Hist()
    assert s.snapshot()["latency"]["k"] == {f: (0 if f == "count" else None) for f in LATENCY_FIELDS}


def test_memory_is_bounded_by_buckets_not_samples():
    s = Stats()
    for v in np.random.default_rng(1).lognormal(3, 3, 20_000).tolist():
        s.observe("k", v)
    assert len(s._lat["k"].counts) == stats_mod._N_BUCKETS
    assert sum(s._lat["k"].counts) == 20_000


def test_write_json_is_atomic_and_leaves_no_temp(tmp_path):
    s = Stats()
    s.inc("rounds_ok", 3)
    s.observe("rtt_us", 120.0)
    s.set("watchdog_events", [{"round": 1, "how": "watchdog"}])
    s.set("np_gauge", np.int64(5))
    path = tmp_path / "stats.json"
    path.write_text("old")
    s.write_json(path)
    got = json.loads(path.read_text())
    assert got["counters"] == {"rounds_ok": 3}
    assert got["gauges"]["np_gauge"] == 5
    assert got["latency"]["rtt_us"]["count"] == 1
    assert os.listdir(tmp_path) == ["stats.json"]


def test_write_json_failure_keeps_old_file_and_removes_temp(tmp_path, monkeypatch):
    s = Stats()
    s.inc("a")
    path = tmp_path / "stats.json"
    path.write_text('{"old": true}')

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(stats_mod.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        s.write_json(path)
    assert json.loads(path.read_text()) == {"old": True}
    assert os.listdir(tmp_path) == ["stats.json"]


def _busy_stats() -> Stats:
    s = Stats()
    for i in range(40):
        s.inc(f"counter_{i:02d}", i)
    for k in ("rtt_us", "worker_us", "rank0_round_us"):
        for v in (10.0, 20.0, 30.0):
            s.observe(k, v)
    s.observe("rare_us", 5.0)
    s.set("watchdog_events", [{"round": r, "how": "watchdog", "phase": "decode", "n": 64} for r in range(64)])
    s.set("breaker", {"state": "closed", "trips": 0})
    return s


def test_snapshot_bytes_fits_unchanged_when_it_can():
    s = _busy_stats()
    full = s.snapshot_bytes(1 << 20)
    assert msgspec.json.decode(full) == json.loads(json.dumps(s.snapshot()))
    assert b" " not in full  # compact


def test_snapshot_bytes_drops_largest_gauges_first():
    s = _busy_stats()
    full_len = len(s.snapshot_bytes(1 << 20))
    events_len = len(msgspec.json.encode(s.gauge("watchdog_events")))
    out = msgspec.json.decode(s.snapshot_bytes(full_len - events_len // 2))
    assert "watchdog_events" not in out["gauges"] and out["gauges"]["breaker"]["state"] == "closed"
    assert out["dropped"] == {"gauges": 1, "latency": 0, "counters": 0}
    assert len(out["counters"]) == 40 and len(out["latency"]) == 4


def test_snapshot_bytes_then_drops_rare_latency_then_small_counters():
    s = _busy_stats()
    no_gauges = Stats()
    no_gauges._counters, no_gauges._lat = s._counters, s._lat
    base = len(no_gauges.snapshot_bytes(1 << 20)) + len(b',"dropped":{"gauges":2,"latency":0,"counters":0}')
    out = msgspec.json.decode(s.snapshot_bytes(base - 10))
    assert out["gauges"] == {} and "rare_us" not in out["latency"] and len(out["latency"]) == 3
    out = msgspec.json.decode(s.snapshot_bytes(400))
    assert out["latency"] == {} and 0 < len(out["counters"]) < 40
    assert "counter_39" in out["counters"] and "counter_00" not in out["counters"]  # largest kept


@settings(deadline=None, max_examples=60)
@given(st.integers(min_value=120, max_value=9000))
def test_snapshot_bytes_never_exceeds_the_limit(limit):
    data = _busy_stats().snapshot_bytes(limit)
    assert len(data) <= limit
    msgspec.json.decode(data)


def test_snapshot_bytes_too_small_raises():
    with pytest.raises(ValueError, match="cannot hold"):
        _busy_stats().snapshot_bytes(20)


def test_format_line():
    s = Stats()
    s.inc("rounds_ok", 10)
    s.inc("rounds_failed", 2)
    for v in (100.0, 200.0, 300.0):
        s.observe("rtt_us", v)
    line = s.format_line("[stats] proxy")
    assert line.startswith("[stats] proxy rounds_failed=2 rounds_ok=10 | rtt_us p50/p99/max=")
    assert "n=3" in line and "\n" not in line
    some = s.format_line("x", counters=["rounds_ok", "resync_rounds"], latency=["rtt_us", "worker_us"])
    assert "rounds_ok=10 resync_rounds=0" in some and "rounds_failed" not in some and "worker_us -" in some


@pytest.mark.timeout(20)
def test_snapshot_from_another_thread_while_owner_inserts_keys():
    s = Stats()
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader():
        try:
            while not stop.is_set():
                s.snapshot()
                s.snapshot_bytes(1 << 16)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    th = threading.Thread(target=reader, name="stats-reader")
    th.start()
    try:
        deadline = time.monotonic() + 0.5
        i = 0
        while time.monotonic() < deadline:
            s.inc(f"c{i}")
            s.observe(f"l{i % 500}", float(i))
            s.set(f"g{i % 300}", i)
            i += 1
    finally:
        stop.set()
        th.join(5)
    assert not th.is_alive() and not errors


def test_hot_path_cost():
    """observe() and inc() must stay well under the few-µs budget; print the figures for the report."""
    s = Stats()
    s.observe("rtt_us", 1.0)
    n = 50_000
    observe_us = min(timeit.repeat("o('rtt_us', 123.4)", globals={"o": s.observe}, number=n, repeat=3)) / n * 1e6
    inc_us = min(timeit.repeat("i('rounds_ok')", globals={"i": s.inc}, number=n, repeat=3)) / n * 1e6
    print(f"Stats.observe {observe_us:.3f} us/call, Stats.inc {inc_us:.3f} us/call")
    assert observe_us < 5.0 and inc_us < 2.0
