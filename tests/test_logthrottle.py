"""A systematic error in the round is logged once per 10 s with a count of what was held back, not a
traceback per round."""

from __future__ import annotations

import logging

import pytest

import dspark_proxy.round.core as round_mod
from dspark_proxy.ops.logthrottle import LogThrottle
from tests.rig import Rig

pytestmark = pytest.mark.timeout(30)


def test_throttle_writes_one_record_per_interval_and_counts_the_rest(caplog):
    now = [100.0]
    th = LogThrottle(10.0, clock=lambda: now[0])
    lg = logging.getLogger("test.throttle")
    with caplog.at_level(logging.ERROR, logger="test.throttle"):
        for i in range(5):
            try:
                raise ValueError(f"boom {i}")
            except ValueError:
                th.exception(lg, "round %d failed", i)
            now[0] += 1.0
        assert len(caplog.records) == 1 and th.suppressed == 4
        now[0] = 111.0
        try:
            raise ValueError("boom again")
        except ValueError:
            assert th.exception(lg, "round %d failed", 9)
    assert len(caplog.records) == 2
    last = caplog.records[-1]
    assert "round 9 failed" in last.getMessage() and "4 more like it" in last.getMessage()
    assert last.exc_info is not None and th.suppressed == 0 and th.suppressed_total == 4


def test_an_error_in_every_round_is_logged_once(seg_name, caplog, monkeypatch):
    monkeypatch.setattr(round_mod, "_ROUND_ERRORS", LogThrottle(10.0), raising=False)
    rig = Rig(seg_name)
    try:
        with caplog.at_level(logging.ERROR, logger="dspark_proxy.round.core"):
            for _ in range(30):
                rig.client.raise_next = True  # the client raises inside the round: an internal error
                reply, _ = rig.round([(1, 0, 1)])
                assert not reply.ok_mask.any()
        failed = [r for r in caplog.records if "failed" in r.getMessage()]
        assert len(failed) == 1, [r.getMessage() for r in failed]
        assert rig.stats.snapshot()["counters"]["fallback_internal_error"] == 30
        assert round_mod._ROUND_ERRORS.suppressed == 29
    finally:
        rig.close()
