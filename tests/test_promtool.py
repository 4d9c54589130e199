"""Both Prometheus endpoints pass `promtool check metrics` (Debian's prometheus package; .ci/run installs
it) with real traffic: the proxy's with an engine attached and a worker serving it, and the worker's
while it serves. Without promtool this fails, never skips: an unchecked endpoint is how lints crept in."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

import engine_shim
from dspark_proxy.ops.launch import spawn_proxy, spawn_worker
from dspark_proxy.ops.metrics import snapshot_to_families
from dspark_proxy.sim import SimConfig, SimEngine

pytestmark = pytest.mark.timeout(120)

M, N, W, B = 8, 4, 8, 32
DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana-dashboard.json"
# counted only when they happen (no fallback in a healthy run): checked from a snapshot that has them
CONDITIONAL = {"counters": {"fallback_timeout": 1, "rounds_failed": 1}}
LAYOUT = ("--max-reqs", str(M), "--num-spec", str(N), "--window", str(W), "--row-bytes", str(B))


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _scrape(url: str, want: str, timeout_s: float = 20.0) -> str:
    """The endpoint's text once it has `want` in it (the worker's counters appear after its first round)."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
            if want in text:
                return text
        except OSError:
            pass
        assert time.monotonic() < end, f"{url} never showed {want}"
        time.sleep(0.1)


def _promtool(text: str) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: apt-get install prometheus (.ci/run does)"
    return subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)


def test_proxy_and_worker_endpoints_pass_promtool(seg_name):
    pytest.importorskip("prometheus_client")
    wport, pport = _free_port("127.0.0.2"), _free_port()
    worker = spawn_worker(*LAYOUT, "--metrics-host", "127.0.0.2", "--metrics-port", str(wport))
    proxy = None
    try:
        proxy = spawn_proxy(seg_name, worker.address, *LAYOUT, "--deadline-ms", "2000", "--metrics-port", str(pport))
        shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=10.0)
        try:
            res = SimEngine(SimConfig(seed=3, max_reqs=M, num_spec=N, window=W, row_bytes=B)).run(shim, rounds=60)
            assert res.wrong_drafts == 0
            # the link's counters join the statistics at the proxy's next publish (its heartbeat), after the
            # first round trip's latency: wait for them, not only for the latency
            proxy_text = _scrape(f"http://127.0.0.1:{pport}/metrics", "dspark_proxy_client_steps_sent_total")
            worker_text = _scrape(f"http://127.0.0.2:{wport}/metrics", "dspark_worker_rounds_total{peer=")
        finally:
            shim.close()
    finally:
        if proxy is not None:
            proxy.stop()
        worker.stop()
    for text in (proxy_text, worker_text):
        r = _promtool(text)
        assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr
    assert "dspark_proxy_client_steps_sent_total" in proxy_text and "dspark_proxy_worker_link_state" in proxy_text
    for name in ("dspark_worker_sessions 1.0", "dspark_worker_memory_used_bytes", "dspark_worker_memory_budget_bytes",
                 "dspark_worker_draft_seconds_bucket", 'dspark_worker_refusals_total{cause="mismatch"} 0.0',
                 'dspark_worker_rounds_total{peer="127.0.0.1"}'):
        assert name in worker_text, name
    _dashboard_names_exist(proxy_text + worker_text)
    assert "_us" not in "".join(ln.split("{")[0].split(" ")[0] for ln in proxy_text.splitlines()
                                 if not ln.startswith("#"))


def test_worker_refusals_by_cause_are_counted():
    """A proxy of other shapes is refused at its HELLO (adopt off): the worker counts it as a mismatch."""
    pytest.importorskip("prometheus_client")
    from dspark_proxy.link.client import TcpDraftClient
    from dspark_proxy.ops.metrics import start_metrics_server
    from dspark_proxy.worker.metrics import WorkerCollector
    from dspark_proxy.worker.server import WorkerServer

    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=B, max_reqs=M, adopt_shapes=False)
    srv.start()
    client = TcpDraftClient("127.0.0.1", srv.port, max_reqs=M, num_spec=N, window=W + 1, row_bytes=B)
    try:
        with start_metrics_server(0, None, collector=WorkerCollector(srv)) as ms:
            client.start()
            text = _scrape(ms.url, 'dspark_worker_refusals_total{cause="mismatch"} 1.0')
        assert _promtool(text).returncode == 0
    finally:
        client.stop()
        srv.stop()


def _sample_names(text: str) -> set[str]:
    return {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln and not ln.startswith("#")}


def _dashboard_names_exist(scraped: str) -> None:
    """Every metric an expression of docs/grafana-dashboard.json names is one the endpoints serve."""
    from prometheus_client import CollectorRegistry, generate_latest

    class _Snap:
        def collect(self):
            return snapshot_to_families(CONDITIONAL)

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Snap())
    have = _sample_names(scraped) | _sample_names(generate_latest(reg).decode())
    named = _dashboard_metrics()
    assert named - have == set(), f"the dashboard names metrics no endpoint serves: {sorted(named - have)}"


def _dashboard_metrics() -> set[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return {m for e in exprs for m in re.findall(r"\bdspark_(?:proxy|worker)_[a-z0-9_]+", e)}


def test_dashboard_is_grafana_json_on_both_endpoints():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["panels"] and all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in dash["panels"])
    names = _dashboard_metrics()
    assert any(n.startswith("dspark_proxy_") for n in names) and any(n.startswith("dspark_worker_") for n in names)
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
