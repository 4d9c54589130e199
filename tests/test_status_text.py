"""`status` for people: 80 columns, sections, events as a table, an idle gap between rounds
named so (not a 17 s "max" that reads as a stall); idle and refused-peer logs throttled."""

from __future__ import annotations

import logging
import time

import pytest

from dspark_proxy.ops.logthrottle import KeyedThrottle
from dspark_proxy.ops.status import WIDTH, format_status

pytestmark = pytest.mark.timeout(60)


def _lat(n: int, p50: float, mx: float) -> dict:
    return {"count": n, "p50_us": p50, "p90_us": p50, "p99_us": mx, "p999_us": mx, "max_us": mx, "mean_us": p50}


def _status() -> dict:
    counters = {f"spec_decode_num_accepted_tokens_per_pos_{j}": 500 - j for j in range(8)}
    counters.update({"rounds_ok": 120, "rounds_decode": 81, "rounds_prefill": 39, "rows_sent": 2906,
                     "spec_decode_num_drafts": 715, "spec_decode_num_draft_tokens": 2792,
                     "spec_decode_num_accepted_tokens": 1296, "fallback_timeout": 3, "attaches": 1,
                     "req_status_ok": 955, "resync_windows_not_staged": 12345678})
    events = [{"id": i, "round": 1000 + i, "time": 1796528747.382 + i, "how": "late_publish", "phase": "decode",
               "n": 8, "rows": 64, "longest_query": 1, "proxy_wait_ms": 12.5, "incarnation": 7} for i in range(12)]
    return {
        "name": "dspark",
        "header": {"state": "ready", "owner_pid": 3068, "owner_alive": True, "incarnation": 1796528747325158770,
                   "heartbeat_age_ms": 57.4, "max_slots": 256, "num_spec": 8, "window": 128, "row_bytes": 71680,
                   "max_rows": 4096, "resync_per_round": 16, "sampled": 1, "deadline_ms": 5.0,
                   "bytes": 300 << 20},
        "words": {"gathered": 123456789, "claimed": 123456789, "published": 123456789, "consumed": 123456789,
                  "attached": 1, "engine_pid": 3068, "abandoned": 0},
        "proxy": {"counters": counters,
                  "gauges": {"breaker": {"state": "closed", "trips": 0}, "watchdog_events": events,
                             "workers": [{"address": "drafter-0.drafters.default.svc.cluster.local:7470",
                                          "state": "refused", "breaker": "open", "next_try_s": 1.5,
                                          "reason": "mismatch window: the worker has 16, this proxy has 32 "
                                                    "(a trained head fixes its window)"}]},
                  "latency": {"gather_us": _lat(120, 564.0, 17006814.0), "rtt_us_decode": _lat(81, 120.5, 663.3),
                              "proxy_parked_us_prefill": _lat(39, 187.0, 9040.3)}},
        "shim": {"counters": {"attaches": 1, "replies_ok": 120}, "gauges": {}},
        "drafting": {"num_spec": 8, "num_drafts": 715, "num_draft_tokens": 2792, "num_accepted_tokens": 1296,
                     "num_accepted_tokens_per_pos": [500 - j for j in range(8)], "mean_accepted": 1.8126,
                     "accepted_by_position": [0.7] * 8, "acceptance_rate": 0.4642, "rounds": 123, "rounds_failed": 3,
                     "fallbacks": {"timeout": 3}, "gate": {"enabled": True, "counters": {},
                                                                          "tps_rule": True, "tps_plain": 250.0,
                                                                          "tps_drafting": 180.46,
                                                                          "tps_by_size": {"1": "pays", "5-8": 256}}},
    }


def test_status_fits_80_columns_in_sections():
    text = format_status(_status())
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= WIDTH, "\n".join(ln for ln in lines if len(ln) > WIDTH)
    for title in ("Layout", "Words", "Proxy", "Proxy latency", "Drafting", "Proxy events (last 8 of 12)", "Shim"):
        assert title in lines, title
    assert "spec_decode_num_accepted_tokens_per_pos_0" not in text  # in Drafting, not among the counters
    assert "mean accepted 1.81 of 8" in text and "REFUSED" in text
    assert "tokens/s a request: 180.5 with drafts, 250.0 without" in text  # the throughput rule's rates
    assert "by batch size: 1 drafts, 5-8 paused (256 rounds)" in text


def test_events_are_a_table_not_python_dicts():
    text = format_status(_status())
    assert "{'" not in text and "'how'" not in text
    rows = [ln for ln in text.splitlines() if "late_publish" in ln]
    assert len(rows) == 8 and all(ln.split()[1].isdigit() and ln.split()[-1] == "12.5" for ln in rows)
    assert "Proxy events (last 8 of 12)" in text.splitlines()


def test_an_idle_gap_between_rounds_is_not_shown_as_a_stall():
    text = format_status(_status())
    assert "17006814" not in text and "gather_us" not in text
    assert "longest 17.0 s (the engine idle: not a stall)" in text
    assert "rtt_decode" in text and "0.663" in text  # the latencies in ms, without _us inside their names


def test_keyed_throttle_logs_once_per_key_and_counts_the_rest(caplog):
    now = [0.0]
    th = KeyedThrottle(60.0, clock=lambda: now[0])
    log = logging.getLogger("dspark_proxy.test_throttle")
    with caplog.at_level(logging.WARNING, logger=log.name):
        for _ in range(30):  # a proxy retrying every 2 s for a minute
            th.log(log, logging.WARNING, ("mismatch", "10.0.0.5"), "peer %s mismatch", "10.0.0.5")
            th.log(log, logging.WARNING, ("mismatch", "10.0.0.6"), "peer %s mismatch", "10.0.0.6")
            now[0] += 1.9
        now[0] = 61.0
        th.log(log, logging.WARNING, ("mismatch", "10.0.0.5"), "peer %s mismatch", "10.0.0.5")
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 3, msgs
    assert msgs[-1] == "peer 10.0.0.5 mismatch (and 29 more like it in the last 60 s, not logged)"


def test_worker_warns_once_for_a_proxy_that_keeps_retrying(caplog):
    """A proxy of other shapes reconnects every ~0.3 s at first: the worker's WARNING is written once."""
    from dspark_proxy.link.client import TcpDraftClient
    from dspark_proxy.worker.server import WorkerServer

    srv = WorkerServer("127.0.0.1", 0, num_spec=2, window=4, row_bytes=8, max_reqs=4, adopt_shapes=False)
    srv.start()
    c = TcpDraftClient("127.0.0.1", srv.port, max_reqs=4, num_spec=2, window=8, row_bytes=8)
    try:
        with caplog.at_level(logging.WARNING, logger="dspark_proxy.worker"):
            c.start()
            end = time.monotonic() + 20
            while srv.counters["handshake_mismatch"] < 3:
                assert time.monotonic() < end, "the client did not retry"
                time.sleep(0.05)
        warned = [r for r in caplog.records if r.name.startswith("dspark_proxy.worker") and r.levelno >= logging.WARNING]
        assert len(warned) == 1, [r.getMessage() for r in warned]
    finally:
        c.stop()
        srv.stop()


def test_an_idle_proxy_logs_ever_less_often(monkeypatch, seg_name, caplog):
    """No WARNING for an engine that is attached but idle; the INFO line comes at doubling waits."""
    import engine_shim
    from dspark_proxy import proxy as proxy_mod
    from dspark_proxy.sim import SimConfig, SimEngine

    monkeypatch.setattr(proxy_mod, "IDLE_LOG_FIRST_S", 0.05)
    monkeypatch.setattr(proxy_mod, "IDLE_LOG_MAX_S", 0.4)
    with caplog.at_level(logging.INFO, logger="dspark_proxy"):
        shim = engine_shim.attach(seg_name, mode="thread", worker="inproc", max_reqs=4, num_spec=2, window=4,
                                  row_bytes=8, deadline_ms=2000.0, timeout_s=5.0)
        try:
            SimEngine(SimConfig(seed=1, max_reqs=4, num_spec=2, window=4, row_bytes=8)).run(shim, rounds=3)
            time.sleep(1.6)  # then idle: every 0.05 s would be 32 lines
        finally:
            shim.close()
    idle = [r for r in caplog.records if "not gathered" in r.getMessage()]
    assert idle and all(r.levelno == logging.INFO for r in idle)
    assert len(idle) <= 8, [r.getMessage() for r in idle]  # 0.05, 0.1, 0.2, 0.4, 0.8, 1.2, 1.6
