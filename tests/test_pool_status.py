"""A status that explains itself, and the `--worker` list: each worker's link as `status` (human and JSON)
and Prometheus show it (connected; refused with the mismatched field and both values; backing off with
the next try), the `--worker` forms (one, several, @FILE) and the reload of a worker file."""

from __future__ import annotations

import socket
import time

import pytest

from dspark_proxy.config import ConfigError, ProxyConfig
from dspark_proxy.link.client import TcpDraftClient
from dspark_proxy.ops.metrics import worker_families
from dspark_proxy.ops.status import worker_lines
from dspark_proxy.pool.addresses import parse_worker_spec
from dspark_proxy.pool.client import PoolClient
from dspark_proxy.pool.member import link_of
from dspark_proxy.proxy import Proxy, worker_links
from dspark_proxy.worker import WorkerServer
from dspark_proxy.worker.session import slot_bytes

pytestmark = pytest.mark.timeout(60)

N, W, B, M = 3, 4, 16, 8


def _client(port: int, window: int = W) -> TcpDraftClient:
    c = TcpDraftClient("127.0.0.1", port, max_reqs=M, num_spec=N, window=window, row_bytes=B,
                       backoff_s=(0.05, 0.2), connect_timeout_s=0.5)
    c.disabled_retry_s = 0.3
    return c


def _until(cond, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def test_refused_link_names_the_field_and_both_values():
    # a worker that keeps its own shapes (--no-adopt-shapes), as a trained head fixes its window
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=B, max_reqs=M, adopt_shapes=False)
    srv.start()
    c = _client(srv.port, window=2 * W)
    c.start()
    try:
        _until(lambda: c.disabled)
        link = link_of(c)
        assert link["state"] == "refused"
        assert "window" in link["reason"] and str(W) in link["reason"] and str(2 * W) in link["reason"], link
        assert 0 <= link["next_try_s"] <= 0.3
        (line,) = worker_lines([link])
        assert "REFUSED" in line and "window" in line and f"127.0.0.1:{srv.port}" in line
    finally:
        c.stop()
        srv.stop()


def test_connected_then_backing_off_with_next_try():
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=B, max_reqs=M)
    srv.start()
    c = _client(srv.port)
    c.start()
    try:
        _until(lambda: c.connection_epoch() is not None)
        from dspark_proxy.round.breaker import CircuitBreaker

        link = link_of(c, CircuitBreaker(3, 5))
        assert link["state"] == "connected" and link["breaker"] == "closed" and link["drafter"] == "integrity"
        assert "connected (epoch 1, integrity); breaker closed" in worker_lines([link])[0]
    finally:
        c.stop()
        srv.stop()
    # nobody listening: backing off, with the reason and when the next try comes
    c = _client(_free_port())
    c.start()
    try:
        _until(lambda: c.link_error is not None)
        link = link_of(c)
        assert link["state"] == "backing_off" and "refused" in link["reason"].lower(), link
        assert 0.0 <= link["next_try_s"] <= 0.2, link
        assert "backing off, next try in" in worker_lines([link])[0]
    finally:
        c.stop()


def test_a_worker_whose_memory_is_taken_refuses_and_status_says_why():
    one = M * slot_bytes(W, B, chains=True)  # one session of the integrity worker's own shapes
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=B, max_reqs=M, memory_budget_bytes=one)
    srv.start()
    first, second = _client(srv.port), _client(srv.port)
    first.start()
    try:
        _until(lambda: first.connection_epoch() is not None)
        second.start()
        _until(lambda: second.link_error is not None)
        link = link_of(second)
        assert link["state"] == "refused" and "memory_budget" in link["reason"], link
        assert f"need {one} bytes" in link["reason"]
        first.stop()  # a proxy that goes away frees its share: the other gets in
        _until(lambda: second.connection_epoch() is not None)
    finally:
        first.stop()
        second.stop()
        srv.stop()


def test_prometheus_worker_families():
    links = [{"address": "a:1", "state": "connected", "breaker": "closed", "pool_state": "up", "slots": 3,
              "entries": 10, "usable": 9, "missed": 1},
             {"address": "b:2", "state": "refused", "reason": "mismatch: field=window worker 4, client 8",
              "breaker": "open", "next_try_s": 1.5}]
    fams = {f.name: f for f in worker_families(links)}
    st = {(s.labels["worker"], s.labels["state"]): s.value for s in fams["dspark_proxy_worker_link_state"].samples}
    assert st[("a:1", "connected")] == 1.0 and st[("b:2", "refused")] == 1.0 and st[("a:1", "refused")] == 0.0
    br = {(s.labels["worker"], s.labels["state"]): s.value for s in fams["dspark_proxy_worker_breaker_state"].samples}
    assert br[("b:2", "open")] == 1.0
    (why,) = fams["dspark_proxy_worker_refused_info"].samples
    assert why.labels == {"worker": "b:2", "reason": "mismatch: field=window worker 4, client 8"}
    assert [s.value for s in fams["dspark_proxy_worker_next_try_seconds"].samples] == [1.5]
    missed = [s for s in fams["dspark_proxy_worker_missed"].samples if s.name.endswith("_total")]
    assert [(s.labels["worker"], s.value) for s in missed] == [("a:1", 1.0)]
    assert list(worker_families([])) == []


def test_worker_spec_forms(tmp_path):
    assert parse_worker_spec("10.0.0.1:7470").addresses == ("10.0.0.1:7470",)
    assert not parse_worker_spec("10.0.0.1:7470").is_pool
    two = parse_worker_spec("10.0.0.1:7470, 10.0.0.2:7470")
    assert two.addresses == ("10.0.0.1:7470", "10.0.0.2:7470") and two.is_pool
    f = tmp_path / "workers"
    f.write_text("# the pool\n10.0.0.1:7470\n\n10.0.0.2:7470  # rack 2\n")
    spec = parse_worker_spec(f"@{f}")
    assert spec.addresses == ("10.0.0.1:7470", "10.0.0.2:7470") and spec.file == str(f) and spec.is_pool
    for bad, words in (("10.0.0.1:7470,10.0.0.1:7470", "twice"), ("10.0.0.1", "no port"), ("@", "file name"),
                       (f"@{tmp_path / 'none'}", "cannot read"), (" , ", "no worker address")):
        with pytest.raises(ConfigError, match=words):
            parse_worker_spec(bad)
    f.write_text("10.0.0.1:7470\n10.0.0.2\n")
    with pytest.raises(ConfigError, match=r"workers:2: "):
        parse_worker_spec(f"@{f}")
    with pytest.raises(ConfigError, match="no port"):
        ProxyConfig(worker="127.0.0.1:7470,b")


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def test_proxy_builds_a_pool_for_several_and_the_plain_client_for_one(tmp_path):
    one = Proxy(ProxyConfig(worker="127.0.0.1:7470"))
    assert isinstance(one.client, TcpDraftClient)
    links = worker_links(one.client, one.breaker)
    assert links[0]["address"] == "127.0.0.1:7470" and links[0]["breaker"] == "closed"
    several = Proxy(ProxyConfig(worker="127.0.0.1:7470,127.0.0.1:7471", breaker_threshold=2,
                                breaker_cooldown=7))
    assert isinstance(several.client, PoolClient)
    assert [m.address for m in several.client.members] == ["127.0.0.1:7470", "127.0.0.1:7471"]
    assert several.client.members[0].breaker.cooldown == 7
    assert [x["pool_state"] for x in worker_links(several.client, several.breaker)] == ["down", "down"]
    assert worker_links(Proxy(ProxyConfig(worker="inproc")).client, one.breaker) == []


def test_reload_of_the_worker_file(tmp_path):
    f = tmp_path / "workers"
    p1, p2 = _free_port(), _free_port()
    f.write_text(f"127.0.0.1:{p1}\n")
    pool = PoolClient([f"127.0.0.1:{p1}"], max_reqs=M, num_spec=N, window=W, row_bytes=B, max_rows=M * W,
                      deadline_ms=10.0, file=str(f))
    try:
        f.write_text(f"127.0.0.1:{p1}\n127.0.0.1:{p2}\n")
        pool.reload()
        _until(lambda: pool._pending is not None)  # noqa: SLF001 - the reload thread handed it over
        pool.moved_slots()
        assert [m.address for m in pool.members] == [f"127.0.0.1:{p1}", f"127.0.0.1:{p2}"]
        assert pool.counters["pool_reloads"] == 1
        f.write_text("127.0.0.1:notaport\n")  # a broken file changes nothing, and says so
        pool.reload()
        _until(lambda: pool.counters.get("pool_reload_errors", 0) == 1)
        pool.moved_slots()
        assert len(pool.members) == 2
    finally:
        pool.stop()


def test_a_pool_of_one_shows_the_rounds_breaker():
    from dspark_proxy.link.draft_client import StepOutcome
    from dspark_proxy.round.breaker import CircuitBreaker

    pool = PoolClient(["127.0.0.1:1"], max_reqs=M, num_spec=N, window=W, row_bytes=B, max_rows=M * W,
                      deadline_ms=10.0, breaker=(2, 5))
    for _ in range(4):
        pool._account(pool.members[0], StepOutcome(False, "timeout", None, 0.0), M, 4, 0.01)  # noqa: SLF001
    assert pool.members[0].breaker.state == "closed"  # alone, its own breaker is never used
    rb = CircuitBreaker(1, 5)
    rb.record(False, 1)
    (link,) = pool.links(rb)
    assert link["breaker"] == "open" and link["breaker_trips"] == 1
