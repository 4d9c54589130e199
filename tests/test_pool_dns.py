"""`--worker dns:NAME:PORT` (pool/dns.py): every address of a name becomes a pool member, re-resolved while
the proxy runs; members join and leave through the pool's reload path; a failed answer keeps them."""

from __future__ import annotations

import threading
import time

import pytest

from dspark_proxy.config import ConfigError, ProxyConfig
from dspark_proxy.pool import dns as pool_dns
from dspark_proxy.pool.addresses import parse_worker_spec
from dspark_proxy.pool.client import PoolClient
from dspark_proxy.proxy import Proxy

pytestmark = pytest.mark.timeout(30)


class StubResolver:
    """Answers a DNS name with what the test says (an OSError instance: the lookup fails)."""

    def __init__(self, answer):
        self.answer = answer
        self.asked: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def __call__(self, name: str, port: int):
        with self.lock:
            self.asked.append((name, port))
            a = self.answer
        if isinstance(a, OSError):
            raise a
        return [f"{h}:{port}" for h in a]


def test_dns_spec_parses_and_bad_ones_name_the_field():
    spec = parse_worker_spec("dns:drafters.default.svc.cluster.local:7470")
    assert spec.dns == ("drafters.default.svc.cluster.local", 7470) and spec.is_pool and spec.addresses == ()
    for bad in ("dns:", "dns:name", "dns::7470", "dns:name:0", "dns:name:http"):
        with pytest.raises(ConfigError, match="dns:NAME:PORT"):
            parse_worker_spec(bad)
    ProxyConfig(worker="dns:drafters:7470")  # valid config: nothing is resolved at validation


def test_members_join_and_leave_as_the_name_resolves(monkeypatch):
    stub = StubResolver(["10.0.0.1", "10.0.0.2"])
    monkeypatch.setattr(pool_dns, "resolve_all", stub)
    monkeypatch.setattr(pool_dns, "DnsWatcher", _fast_watcher(pool_dns.DnsWatcher))
    proxy = Proxy(ProxyConfig(worker="dns:drafters.svc:7470", max_reqs=8, num_spec=3, window=4, row_bytes=16))
    pool = proxy.client
    assert isinstance(pool, PoolClient)
    assert [m.address for m in pool.members] == []  # applied at the first round, like a reloaded file
    pool.moved_slots()
    assert [m.address for m in pool.members] == ["10.0.0.1:7470", "10.0.0.2:7470"]
    pool.start()
    try:
        stub.answer = ["10.0.0.2", "10.0.0.3"]  # a pod went, another came
        _until(lambda: pool._pending is not None)  # noqa: SLF001 - the watcher handed the new list over
        pool.moved_slots()
        assert [m.address for m in pool.members] == ["10.0.0.2:7470", "10.0.0.3:7470"]
        assert pool.counters["pool_reloads"] == 2
        stub.answer = OSError("Name or service not known")  # a DNS hiccup keeps the members
        n = len(stub.asked)
        _until(lambda: len(stub.asked) >= n + 2)
        stub.answer = []  # so does an empty answer
        n = len(stub.asked)
        _until(lambda: len(stub.asked) >= n + 2)
        pool.moved_slots()
        assert [m.address for m in pool.members] == ["10.0.0.2:7470", "10.0.0.3:7470"]
        assert pool.watchers[0].failures >= 4
        assert all(q == ("drafters.svc", 7470) for q in stub.asked)
    finally:
        pool.stop()
    assert not pool.watchers[0]._thread.is_alive()  # noqa: SLF001 - stop() ends the re-resolving


def test_a_name_that_does_not_resolve_at_start_starts_an_empty_pool_that_fills(monkeypatch):
    stub = StubResolver(OSError("Name or service not known"))
    monkeypatch.setattr(pool_dns, "resolve_all", stub)
    monkeypatch.setattr(pool_dns, "DnsWatcher", _fast_watcher(pool_dns.DnsWatcher))
    pool = Proxy(ProxyConfig(worker="dns:later.svc:7470", max_reqs=8, num_spec=3, window=4,
                             row_bytes=16)).client
    pool.start()
    try:
        pool.moved_slots()
        assert pool.members == []
        stub.answer = ["10.0.0.9"]
        _until(lambda: pool._pending is not None)  # noqa: SLF001
        pool.moved_slots()
        assert [m.address for m in pool.members] == ["10.0.0.9:7470"]
    finally:
        pool.stop()


def test_resolve_all_gives_every_address_sorted():
    assert pool_dns.resolve_all("localhost", 7470)[0].endswith(":7470")
    assert pool_dns.resolve_all("127.0.0.1", 99) == ("127.0.0.1:99",)


def _fast_watcher(cls):
    def make(name, port, apply, **kw):
        return cls(name, port, apply, every_s=0.02, resolve=pool_dns.resolve_all)
    return make


def _until(cond, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.01)


def test_a_proxy_drafts_through_the_members_dns_gives_it(monkeypatch, seg_name):
    """End to end: rounds run target-only while the name does not resolve, then the worker it comes to
    name drafts them (a real worker, a thread-mode proxy, the simulated engine)."""
    import engine_shim
    from dspark_proxy.sim import SimConfig, SimEngine
    from dspark_proxy.worker.server import WorkerServer

    M, N, W, B = 4, 2, 4, 16
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=B, max_reqs=M)
    srv.start()
    stub = StubResolver(OSError("Name or service not known"))
    monkeypatch.setattr(pool_dns, "resolve_all", stub)
    monkeypatch.setattr(pool_dns, "DnsWatcher", _fast_watcher(pool_dns.DnsWatcher))
    shim = engine_shim.attach(seg_name, mode="thread", worker=f"dns:drafters.svc:{srv.port}", max_reqs=M,
                              num_spec=N, window=W, row_bytes=B, deadline_ms=500.0, timeout_s=5.0)
    try:
        eng = SimEngine(SimConfig(seed=2, max_reqs=M, num_spec=N, window=W, row_bytes=B))
        res = eng.run(shim, rounds=10)
        assert res.wrong_drafts == 0 and srv.counters["steps"] == 0
        stub.answer = ["127.0.0.1"]
        end = time.monotonic() + 20
        while srv.counters["steps"] < 5:
            assert time.monotonic() < end, "the pool never drafted through the resolved worker"
            res = eng.run(shim, rounds=5)
            assert res.wrong_drafts == 0
    finally:
        shim.close()
        srv.stop()
