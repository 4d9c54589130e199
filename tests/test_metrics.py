"""metrics.py: a real scrape over 127.0.0.1 of a Stats snapshot through the custom collector."""

from __future__ import annotations

import socket
import sys
import urllib.request

import pytest

from dspark_proxy.ops.deps import MissingDependency
from dspark_proxy.ops.stats import Stats

prom = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from dspark_proxy.ops import metrics  # noqa: E402

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
    s.inc("fallback_not-ready", 2)  # a label value keeps the cause as written
    s.inc("fallback_timeout", 1)
    s.inc("req_status_gap", 4)
    s.inc("spec_decode_num_drafts", 10)
    s.inc("spec_decode_num_accepted_tokens_per_pos_0", 8)
    s.inc("spec_decode_num_accepted_tokens_per_pos_1", 5)
    for v in (100.0, 200.0, 300.0, 400.0):
        s.observe("rtt_us", v)
    s.set("breaker", {"state": "open", "trips": 2, "opened_round": None})
    s.set("watchdog_events", [{"round": 1}, {"round": 2}])
    s.set("incarnation", 3)
    s.set("label", "text")  # a top-level string gauge is skipped
    s.set("config", {"max_reqs": 64, "worker": "127.0.0.1:7470", "n_out_table": [5, 4], "stats_file": None})
    s.set("config_sources", {"max_reqs": "cli"})
    s.set("client", {"connects": 1, "disabled": 0})
    return s


def test_scrape_follows_prometheus_conventions(stats):
    """Counters end in _total (kinds as labels), the settings are one _info metric, latencies are
    histograms in seconds (summaries only for a snapshot without buckets)."""
    server = metrics.start_metrics_server(0, lambda: stats)
    try:
        assert server.port > 0 and server.host == "127.0.0.1"
        got = _scrape(server)
        assert got[("dspark_proxy_stats_up", ())] == 1.0
        assert got[("dspark_proxy_rounds_ok_total", ())] == 7.0
        assert got[("dspark_proxy_fallbacks_total", (("cause", "not-ready"),))] == 2.0
        assert got[("dspark_proxy_fallbacks_total", (("cause", "timeout"),))] == 1.0
        assert got[("dspark_proxy_request_status_total", (("status", "gap"),))] == 4.0
        assert got[("dspark_proxy_spec_decode_num_drafts_total", ())] == 10.0
        assert got[("dspark_proxy_spec_decode_num_accepted_tokens_per_pos_total", (("position", "0"),))] == 8.0
        assert got[("dspark_proxy_spec_decode_num_accepted_tokens_per_pos_total", (("position", "1"),))] == 5.0
        assert got[("dspark_proxy_client_connects_total", ())] == 1.0
        info = [k for k in got if k[0] == "dspark_proxy_config_info"]
        assert len(info) == 1 and got[info[0]] == 1.0
        labels = dict(info[0][1])
        assert labels["max_reqs"] == "64" and labels["worker"] == "127.0.0.1:7470" and labels["n_out_table"] == "5,4"
        assert not any(name.startswith("dspark_proxy_config_max_reqs") or "config_sources" in name for name, _ in got)
        assert got[("dspark_proxy_breaker_trips", ())] == 2.0
        assert got[("dspark_proxy_breaker_state", (("value", "open"),))] == 1.0
        assert got[("dspark_proxy_watchdog_events_len", ())] == 2.0
        assert got[("dspark_proxy_incarnation", ())] == 3.0
        assert not any(name.startswith("dspark_proxy_label") for name, _ in got)
        assert got[("dspark_proxy_rtt_seconds_count", ())] == 4.0
        assert got[("dspark_proxy_rtt_seconds_sum", ())] == pytest.approx(1000e-6)
        assert got[("dspark_proxy_rtt_seconds_bucket", (("le", "0.0001"),))] == 0.0  # 100 us: its bucket's top is above
        assert got[("dspark_proxy_rtt_seconds_bucket", (("le", "0.00025"),))] == 2.0
        assert got[("dspark_proxy_rtt_seconds_bucket", (("le", "0.0005"),))] == 4.0
        assert got[("dspark_proxy_rtt_seconds_bucket", (("le", "+Inf"),))] == 4.0
        assert not any(k[0] == "dspark_proxy_rtt_seconds" for k in got)  # no summary quantiles
        assert got[("dspark_proxy_rtt_max_seconds", ())] == pytest.approx(400e-6)
        stats.inc("rounds_ok")  # each scrape reads the stats afresh
        assert _scrape(server)[("dspark_proxy_rounds_ok_total", ())] == 8.0
    finally:
        server.stop()
    server.stop()  # idempotent
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=1):
        pass


def test_a_snapshot_without_buckets_gives_a_summary(stats):
    with metrics.start_metrics_server(0, stats.snapshot) as server:
        got = _scrape(server)
    assert got[("dspark_proxy_rounds_ok_total", ())] == 7.0
    assert got[("dspark_proxy_rtt_seconds", (("quantile", "0.5"),))] == pytest.approx(200e-6, rel=0.01)
    assert got[("dspark_proxy_rtt_seconds_count", ())] == 4.0


def test_failing_getter_reports_down_not_500():
    def boom():
        raise RuntimeError("segment gone")

    with metrics.start_metrics_server(0, boom) as server:
        got = _scrape(server)
    assert got == {("dspark_proxy_stats_up", ()): 0.0}


def test_missing_prometheus_client_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(MissingDependency, match=r"pip install 'dspark-proxy\[metrics\]'"):
        metrics.start_metrics_server(0, dict)
