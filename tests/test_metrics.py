"""metrics.py: a real scrape over 127.0.0.1 of a Stats snapshot through the custom collector."""

from __future__ import annotations

import socket
import sys
import urllib.request

import pytest

from dspark_proxy.stats import Stats

prom = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from dspark_proxy import metrics  # noqa: E402

pytestmark = pytest.mark.timeout(30)


def _scrape(server) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(server.url, timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture
def stats() -> Stats:
    s = Stats()
    s.inc("rounds_ok", 7)
    s.inc("fallback_not-ready", 2)  # sanitised
    for v in (100.0, 200.0, 300.0, 400.0):
        s.observe("rtt_us", v)
    s.set("breaker", {"state": "open", "trips": 2, "opened_round": None})
    s.set("watchdog_events", [{"round": 1}, {"round": 2}])
    s.set("incarnation", 3)
    s.set("label", "text")  # a top-level string gauge is skipped
    return s


def test_scrape_exposes_counters_gauges_and_latency(stats):
    server = metrics.start_metrics_server(0, stats.snapshot)
    try:
        assert server.port > 0 and server.host == "127.0.0.1"
        got = _scrape(server)
        assert got[("dspark_proxy_stats_up", ())] == 1.0
        assert got[("dspark_proxy_rounds_ok_total", ())] == 7.0
        assert got[("dspark_proxy_fallback_not_ready_total", ())] == 2.0
        assert got[("dspark_proxy_breaker_trips", ())] == 2.0
        assert got[("dspark_proxy_breaker_state", (("value", "open"),))] == 1.0
        assert got[("dspark_proxy_watchdog_events_len", ())] == 2.0
        assert got[("dspark_proxy_incarnation", ())] == 3.0
        assert not any(name.startswith("dspark_proxy_label") for name, _ in got)
        assert got[("dspark_proxy_rtt_seconds_count", ())] == 4.0
        assert got[("dspark_proxy_rtt_seconds_sum", ())] == pytest.approx(1000e-6)
        assert got[("dspark_proxy_rtt_seconds", (("quantile", "0.5"),))] == pytest.approx(200e-6, rel=0.01)
        assert got[("dspark_proxy_rtt_seconds", (("quantile", "0.99"),))] == pytest.approx(400e-6, rel=0.01)
        assert got[("dspark_proxy_rtt_max_seconds", ())] == pytest.approx(400e-6)
        stats.inc("rounds_ok")  # each scrape reads the stats afresh
        assert _scrape(server)[("dspark_proxy_rounds_ok_total", ())] == 8.0
    finally:
        server.stop()
    server.stop()  # idempotent
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=1):
        pass


def test_getter_may_return_a_stats_object(stats):
    with metrics.start_metrics_server(0, lambda: stats) as server:
        assert _scrape(server)[("dspark_proxy_rounds_ok_total", ())] == 7.0


def test_failing_getter_reports_down_not_500():
    def boom():
        raise RuntimeError("segment gone")

    with metrics.start_metrics_server(0, boom) as server:
        got = _scrape(server)
    assert got == {("dspark_proxy_stats_up", ()): 0.0}


def test_missing_prometheus_client_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(RuntimeError, match=r"pip install 'dspark-proxy\[metrics\]'"):
        metrics.start_metrics_server(0, dict)
