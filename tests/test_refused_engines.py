"""Refusals are visible: an engine refused for its shapes is listed by `status`
(human and --json) with the field and both values (dspark_proxy/shm/refusals.py); the vLLM proposer
names its served model's target (engine_shim/vllm/link.py `target_of`) and logs one prefixed line when
it attaches and one when the proxy's worker refuses it (`LinkLog`)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

import engine_shim
from dspark_proxy.config import ProxyConfig
from dspark_proxy.model.manifest import HeadManifest, head_paths
from dspark_proxy.ops.launch import spawn_proxy
from dspark_proxy.proxy import Proxy
from dspark_proxy.shm.refusals import REFUSED_SLOTS, read_refusals, record_refusal
from dspark_proxy.shm.segment import LayoutMismatch
from dspark_proxy.worker import WorkerServer
from engine_shim.vllm.link import ENV_TARGET, LinkLog, target_of

pytestmark = pytest.mark.timeout(90)

M, N, W, B = 4, 3, 4, 32
A, OTHER = "sha256:" + "a" * 64, "sha256:" + "b" * 64
MODEL = "models/stdlib-llama"
MAN = HeadManifest.load(head_paths("models/stdlib-llama-head")[1])


def _status(name: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dspark_proxy.cli", "status", "--name", name, *extra],
                          capture_output=True, text=True, timeout=30)


def _wait(pred, timeout_s: float = 10.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def test_status_lists_an_engine_refused_for_its_shapes_with_the_field_and_both_values(seg_name):
    proxy = spawn_proxy(seg_name, "null", "--max-reqs", "8", "--num-spec", str(N), "--window", str(W),
                        "--row-bytes", str(B))
    try:
        for _ in range(2):  # the same engine refused twice: one record
            with pytest.raises(LayoutMismatch, match="max_reqs is 8 in the segment but the engine expects 16"):
                engine_shim.attach(seg_name, max_reqs=16, num_spec=N, window=W, row_bytes=B)
        js = _status(seg_name, "--json")
        assert js.returncode == 0, js.stderr
        refused = json.loads(js.stdout)["refused_engines"]
        assert [(r["pid"], r["field"], r["segment"], r["engine"]) for r in refused] == [(os.getpid(), "max_reqs", 8, 16)]
        text = _status(seg_name)
        assert text.returncode == 0, text.stderr
        assert text.stdout.count("REFUSED engine pid") == 1 and "Refused engines" in text.stdout, text.stdout
        flat = " ".join(text.stdout.split())  # status wraps at 80 columns
        assert f"REFUSED engine pid {os.getpid()} at " in flat
        assert "max_reqs is 8 in the segment, the engine has 16" in flat
    finally:
        proxy.stop()


def test_the_last_refusals_are_kept_each_whole():
    mm = bytearray(4096)
    assert read_refusals(mm) == []
    for k in range(REFUSED_SLOTS + 2):
        assert record_refusal(mm, "window", 16, 20 + k, pid=100 + k)
    assert not record_refusal(mm, "window", 16, 20 + REFUSED_SLOTS + 1, pid=100 + REFUSED_SLOTS + 1)  # a repeat
    got = read_refusals(mm)
    assert [r["engine"] for r in got] == [20 + k for k in range(2, REFUSED_SLOTS + 2)]  # oldest first
    record_refusal(mm, "target_id", "x" * 300, A, pid=1)
    assert read_refusals(mm)[-1]["segment"].endswith("...")  # long values cut, the record still whole


def _config(model: str) -> SimpleNamespace:
    return SimpleNamespace(model_config=SimpleNamespace(model=model, revision=None))


def test_the_proposer_names_its_served_models_target_as_the_reference_engine_does(monkeypatch, caplog):
    monkeypatch.delenv(ENV_TARGET, raising=False)
    assert target_of(_config(MODEL)) == MAN.target_id  # the shipped head was made for the shipped target
    monkeypatch.setenv(ENV_TARGET, OTHER)
    assert target_of(_config(MODEL)) == OTHER  # named: not hashed
    monkeypatch.delenv(ENV_TARGET)
    caplog.set_level(logging.WARNING, logger="engine_shim")
    assert target_of(_config("/no/such/model-dir")) == ""
    assert any("[shim] vLLM proposer" in r.getMessage() and "names no target" in r.getMessage()
               for r in caplog.records)


@pytest.fixture
def target_worker():
    """A worker whose drafter says it was made for target A (what a head's manifest says)."""
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=B, max_reqs=M)
    srv.start()
    srv.drafter.target_id = A
    yield srv
    srv.stop()


def test_the_proposer_logs_its_attach_and_a_refusal_by_the_proxys_worker(seg_name, target_worker, caplog):
    cfg = ProxyConfig(name=seg_name, worker=f"127.0.0.1:{target_worker.port}", max_reqs=M, num_spec=N, window=W,
                      row_bytes=B, deadline_ms=2000.0, log_every=0)
    proxy = Proxy(cfg)
    th = threading.Thread(target=proxy.serve, daemon=True)
    th.start()
    caplog.set_level(logging.INFO, logger="engine_shim")
    try:
        assert proxy.ready.wait(10)
        shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=5.0,
                                  target_id=OTHER)
        try:
            from dspark_proxy.sim import SimConfig, SimEngine

            SimEngine(SimConfig(seed=3, max_reqs=M, num_spec=N, window=W, row_bytes=B)).run(shim, rounds=3)
            link = LinkLog(seg_name, OTHER)
            clock = [0.0]

            def said() -> list[str]:
                clock[0] += 2.0  # past the once-a-second limit at every look
                link.look(shim, now=clock[0])
                return [r.getMessage() for r in caplog.records if r.getMessage().startswith("[shim] vLLM proposer")]

            assert _wait(lambda: any("refuses this engine" in m for m in said()))
            lines = said()
            attached = [m for m in lines if "attached to proxy" in m]
            refused = [m for m in lines if "refuses this engine" in m]
            assert len(attached) == 1 and OTHER in attached[0]
            assert len(refused) == 1 and "target_id" in refused[0] and OTHER in refused[0] and A in refused[0]
        finally:
            shim.close()
    finally:
        proxy.stop()
        th.join(10)
