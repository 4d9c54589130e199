"""A thread-mode proxy thread that dies after start-up is logged, restarted, counted
and shown by `status`."""

from __future__ import annotations

import logging
import time

import pytest

from dspark_proxy.ops.status import format_status as _table
from dspark_proxy.ops.status import read_status
from dspark_proxy.shm.layout import Word
from dspark_proxy.shm.segment import Segment
from engine_shim import api
from tests.rig import decode_batch

pytestmark = pytest.mark.timeout(60)

M, N, W, B = 8, 3, 4, 16


def test_a_dead_proxy_thread_is_restarted_logged_counted_and_shown(seg_name, monkeypatch, caplog):
    shim = api.attach(seg_name, mode="thread", worker="inproc", max_reqs=M, num_spec=N, window=W, row_bytes=B,
                      deadline_ms=50.0, look_every_s=0.02)
    t = 0

    def run_until_ok(limit_s: float) -> bool:
        nonlocal t
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            t += 1
            shim.enqueue(t, **decode_batch(t, B))
            if shim.read_reply(t).ok_mask.any() and shim.attached:
                return True
            time.sleep(0.002)
        return False

    try:
        assert run_until_ok(10)
        first = shim.proxy
        # the next incarnation cannot be made: the thread's serve() raises out, after start-up
        real = Segment.create.__func__
        armed = [True]

        def create(cls, *a, **k):
            if armed[0]:
                armed[0] = False
                raise OSError(28, "injected: no space left on /dev/shm")
            return real(cls, *a, **k)

        monkeypatch.setattr(Segment, "create", classmethod(create))
        caplog.set_level(logging.ERROR, logger="engine_shim.thread_mode")
        shim.segment.set_word(Word.ABANDONED, 1)  # end incarnation 1
        end = time.monotonic() + 5
        while shim.attached and time.monotonic() < end:
            t += 1
            shim.enqueue(t, **decode_batch(t, B))
            shim.read_reply(t)
            time.sleep(0.002)
        assert not shim.attached
        assert run_until_ok(10), "drafts never resumed after the proxy thread died"
        assert shim.proxy is not first and first.incarnations == 1
        deaths = [r for r in caplog.records if "proxy thread died" in r.getMessage()]
        assert len(deaths) == 1 and "injected: no space left" in deaths[0].getMessage()
        # the death's own traceback (exc_info=True outside the except logged "NoneType: None")
        assert deaths[0].exc_info and deaths[0].exc_info[0] is OSError, deaths[0].exc_info
        text = logging.Formatter().format(deaths[0])
        assert "Traceback" in text and "in create" in text and "NoneType: None" not in text, text
        assert shim.counters.counter("thread_restarts") == 1
        end = time.monotonic() + 5
        while time.monotonic() < end:  # the proxy's stats block is republished every 0.25 s
            st = read_status(seg_name)
            if st["proxy"].get("counters", {}).get("thread_restarts") == 1:
                break
            time.sleep(0.05)
        assert st["proxy"]["counters"]["thread_restarts"] == 1
        assert "proxy thread restarted 1 times; last death: OSError" in _table(st)
    finally:
        shim.close()
