"""The engine names its target and a head made for another is refused: attach(...,
target_id=...) in process mode (through the segment, dspark_proxy/shm/target.py) and in thread mode,
boot's DSPARK_PROXY_TARGET_ID, the proxy's --target-id, the HELLO's `target_id`, and the worker's check
against the head's manifest (dspark_proxy/worker/terms.py)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import dspark_proxy.wire as wire
import engine_shim
from dspark_proxy.config import ConfigError, ProxyConfig
from dspark_proxy.link.client import TcpDraftClient
from dspark_proxy.proxy import Proxy
from dspark_proxy.shm.target import TARGET_OFF, read_engine_target, write_engine_target
from dspark_proxy.sim import SimConfig, SimEngine
from dspark_proxy.worker import WorkerServer
from dspark_proxy.worker.testing import RawPeer

pytestmark = pytest.mark.timeout(90)

M, N, W, B = 8, 3, 4, 32
A, OTHER = "sha256:" + "a" * 64, "sha256:" + "b" * 64
HEAD = Path(__file__).resolve().parent.parent / "models" / "stdlib-llama-head"


def test_the_segment_field_round_trips_and_a_damaged_one_reads_as_none():
    mm = bytearray(4096)
    assert read_engine_target(mm) == ""
    write_engine_target(mm, A)
    assert read_engine_target(mm) == A
    write_engine_target(mm, "")
    assert read_engine_target(mm) == ""
    mm[TARGET_OFF:TARGET_OFF + 2] = (9999).to_bytes(2, "little")  # a length past the field
    assert read_engine_target(mm) == ""
    mm[TARGET_OFF:TARGET_OFF + 4] = b"\x02\x00\xff\x01"  # not printable ASCII
    assert read_engine_target(mm) == ""
    with pytest.raises(ValueError, match="printable"):
        write_engine_target(mm, "has space")
    with pytest.raises(ConfigError, match="target_id"):
        ProxyConfig(target_id="x" * 300)


@pytest.fixture
def head_worker():
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from dspark_proxy.model.manifest import HeadManifest

    man = HeadManifest.load(HEAD / "manifest.json")
    srv = WorkerServer("127.0.0.1", 0, num_spec=man.num_spec, window=man.window, row_bytes=man.row_bytes,
                       max_reqs=4, drafter="torch", weights=str(HEAD))
    srv.start()
    yield srv, man
    srv.stop()


def test_the_shipped_heads_manifest_is_checked_against_the_hello(head_worker, caplog):
    srv, man = head_worker
    lay = wire.WireLayout(num_spec=man.num_spec, window=man.window, row_bytes=man.row_bytes, max_reqs=4)
    caplog.set_level(logging.WARNING, logger="dspark_proxy.worker.server")
    for named, ok in ((OTHER, False), (man.target_id, True), ("", True), ("", True)):
        peer = RawPeer(srv.port, lay)
        try:
            msg = peer.handshake(target_id=named)
        finally:
            peer.close()
        if ok:
            assert isinstance(msg, wire.Welcome), msg
        else:
            assert isinstance(msg, wire.ErrorMsg) and msg.code == "mismatch" and msg.field == "target_id", msg
            assert OTHER in msg.message and man.target_id in msg.message  # both values
    said = [r for r in caplog.records if "names no target" in r.getMessage()]
    assert len(said) <= 1  # once per process, however many peers name none
    from dspark_proxy.worker import terms

    assert terms._unnamed_said.is_set()


@pytest.fixture
def target_worker():
    """An integrity worker whose drafter says it was made for target A (what a head's manifest says)."""
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=B, max_reqs=M)
    srv.start()
    srv.drafter.target_id = A
    yield srv
    srv.stop()


def _wait(pred, timeout_s: float = 10.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def _sim() -> SimEngine:
    return SimEngine(SimConfig(seed=3, max_reqs=M, num_spec=N, window=W, row_bytes=B))


def _rounds(sim: SimEngine, shim, n: int = 40) -> int:
    """Run n more sim rounds; the number of usable drafts the engine got."""
    got = [0]

    def keep(batch, reply) -> None:
        got[0] += int(np.count_nonzero(reply.ok_mask))

    res = sim.run(shim, rounds=n, on_round=keep)
    assert res.wrong_drafts == 0
    return got[0]


@pytest.mark.parametrize("named,refused", [(OTHER, True), (A, False)])
def test_process_mode_the_engines_target_reaches_the_hello(seg_name, target_worker, named, refused):
    cfg = ProxyConfig(name=seg_name, worker=f"127.0.0.1:{target_worker.port}", max_reqs=M, num_spec=N, window=W,
                      row_bytes=B, deadline_ms=2000.0, log_every=0)
    proxy = Proxy(cfg)
    th = threading.Thread(target=proxy.serve, daemon=True)
    th.start()
    try:
        assert proxy.ready.wait(10)
        client = proxy.client
        assert isinstance(client, TcpDraftClient) and client.wait_ready(5.0) is not None  # no target yet: served
        shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=5.0,
                                  target_id=named)
        try:
            sim = _sim()
            _rounds(sim, shim, 3)  # the engine attaches at its first round; the proxy then names its target
            assert _wait(lambda: client.target_id == named)
            if refused:
                assert _wait(lambda: client.disabled)
                assert "target_id" in client.disabled_reason and OTHER in client.disabled_reason
                assert A in client.disabled_reason
            else:
                assert _wait(lambda: client.connection_epoch() is not None and client.counters["retargets"] == 1)
                assert _rounds(sim, shim, 40) > 0 and not client.disabled
            assert proxy.stats.gauge("target_id") == named
        finally:
            shim.close()
    finally:
        proxy.stop()
        th.join(10)


def test_thread_mode_names_the_target_in_its_first_hello(seg_name, target_worker):
    shim = engine_shim.attach(seg_name, mode="thread", worker=f"127.0.0.1:{target_worker.port}", max_reqs=M,
                              num_spec=N, window=W, row_bytes=B, deadline_ms=2000.0, timeout_s=5.0, target_id=OTHER)
    try:
        client = shim.proxy.client
        assert client.target_id == OTHER
        assert _wait(lambda: client.disabled) and "target_id" in client.disabled_reason
        assert target_worker.counters["handshakes"] == 0  # never served under the wrong target
    finally:
        shim.close()


def test_boot_takes_the_target_from_the_environment(monkeypatch, seg_name):
    got = {}

    def fake_attach(name, **kw):
        got.update(kw, name=name)

    monkeypatch.setattr(engine_shim.api, "attach", fake_attach)
    monkeypatch.setenv("DSPARK_PROXY", seg_name)
    monkeypatch.setenv("DSPARK_PROXY_TARGET_ID", A)
    engine_shim.boot(max_reqs=M, num_spec=N, window=W, row_bytes=B)
    assert _wait(lambda: "target_id" in got, 5.0) and got["target_id"] == A and got["name"] == seg_name


def test_a_head_worker_takes_its_shapes_from_the_manifest():
    """`worker --drafter torch --weights DIR` with no shape flags: the manifest's N, window and row bytes
    (before: refused at start, "head manifest row_bytes=1152 but the worker has 256")."""
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from dspark_proxy.model.manifest import HeadManifest
    from dspark_proxy.ops.launch import spawn_worker

    man = HeadManifest.load(HEAD / "manifest.json")
    w = spawn_worker("--drafter", "torch", "--head", str(HEAD), timeout_s=60.0)
    try:
        port = int(w.address.rsplit(":", 1)[1])
        lay = wire.WireLayout(num_spec=man.num_spec, window=man.window, row_bytes=man.row_bytes, max_reqs=16)
        peer = RawPeer(port, lay)
        try:
            msg = peer.handshake(target_id=man.target_id)
            assert isinstance(msg, wire.Welcome) and msg.row_bytes == man.row_bytes and msg.max_reqs == 16, msg
        finally:
            peer.close()
    finally:
        w.stop()
