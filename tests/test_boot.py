"""Auto-attach on engine boot: engine_shim.boot() and the vLLM general plugin never block or fail the
engine's boot, whatever is (or is not) there."""

from __future__ import annotations

import logging
import threading
import time
from importlib.metadata import entry_points

import numpy as np
import pytest

import engine_shim
from dspark_proxy.shm.layout import LayoutParams, State, Word
from dspark_proxy.shm.segment import Segment
from engine_shim import api
from engine_shim.attach import AttachState

pytestmark = pytest.mark.timeout(30)

M, N, W, B = 8, 3, 4, 16
SHAPES = {"max_reqs": M, "num_spec": N, "window": W, "row_bytes": B}


def _boot_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dspark-boot"]


def _join_boot() -> None:
    for t in _boot_threads():
        t.join(5)
        assert not t.is_alive()


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    """No DSPARK_PROXY* from the outside, no shim left from another test; close what boot made."""
    for k in ("", "_MAX_REQS", "_NUM_SPEC", "_WINDOW", "_ROW_BYTES"):
        monkeypatch.delenv(f"DSPARK_PROXY{k}", raising=False)
    monkeypatch.setattr(api, "_current", None)
    yield
    _join_boot()
    shim = api.current()
    if shim is not None:
        shim.close()


def _segment(name: str, **over) -> Segment:
    p = LayoutParams(**{"max_reqs": M, "num_spec": N, "window": W, "row_bytes": B, "max_rows": M * W,
                        "resync_per_round": 2, **over})
    seg = Segment.create(name, p, deadline_ms=20.0)
    seg.set_word(Word.HEARTBEAT_NS, 1 << 62)
    seg.set_word(Word.STATE, State.READY)
    return seg


def test_boot_without_the_variable_does_nothing():
    before = set(threading.enumerate())
    assert engine_shim.boot(**SHAPES) is None
    assert set(threading.enumerate()) <= before  # no thread started, no shim made
    assert engine_shim.current() is None


def test_boot_without_a_proxy_gives_a_detached_shim(monkeypatch, seg_name):
    monkeypatch.setenv("DSPARK_PROXY", seg_name)
    for k, v in SHAPES.items():
        monkeypatch.setenv(f"DSPARK_PROXY_{k.upper()}", str(v))
    t0 = time.perf_counter()
    engine_shim.boot()
    assert time.perf_counter() - t0 < 0.05
    _join_boot()
    shim = engine_shim.current()
    assert shim is not None and shim.state is AttachState.DETACHED
    assert (shim.max_reqs, shim.num_spec, shim.window, shim.row_bytes) == (M, N, W, B)
    # the engine's rounds are target-only, at once
    shim.enqueue(1, req_ids=[1], slots=[0], qsl=[0, 1], need_draft=[True], k_window=[0],
                 rows=np.zeros((1, B), np.uint8), valid=[1], first_pos=[0], anchor=[5])
    assert shim.read_reply(1).reason == "detached"


def test_boot_never_blocks_the_engine(monkeypatch, seg_name):
    monkeypatch.setenv("DSPARK_PROXY", seg_name)
    release = threading.Event()

    def slow_attach(*a, **kw):
        release.wait(5)
        raise RuntimeError("slow and broken")

    monkeypatch.setattr(api, "attach", slow_attach)
    t0 = time.perf_counter()
    engine_shim.boot(**SHAPES)
    assert time.perf_counter() - t0 < 0.05
    release.set()
    _join_boot()
    assert engine_shim.current() is None


def test_boot_without_shapes_logs_and_stays_target_only(monkeypatch, seg_name, caplog):
    monkeypatch.setenv("DSPARK_PROXY", seg_name)
    caplog.set_level(logging.INFO, logger="engine_shim")
    engine_shim.boot()
    _join_boot()
    assert engine_shim.current() is None
    assert any(r.levelno == logging.ERROR and "could not attach" in r.getMessage() for r in caplog.records)


def test_boot_with_a_mismatched_proxy_names_the_field(monkeypatch, seg_name, caplog):
    seg = _segment(seg_name, window=W * 2)
    try:
        monkeypatch.setenv("DSPARK_PROXY", seg_name)
        caplog.set_level(logging.INFO, logger="engine_shim")
        engine_shim.boot(**SHAPES)
        _join_boot()
        assert engine_shim.current() is None  # target-only: no shim to hand rounds to
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "window" in errors[0] and "target-only" in errors[0], errors
        assert seg.word(Word.ATTACHED) == 0
    finally:
        seg.unlink()
        seg.close()


def test_a_mismatched_proxy_that_comes_later_is_refused_by_the_watchdog(monkeypatch, seg_name, caplog):
    monkeypatch.setenv("DSPARK_PROXY", seg_name)
    caplog.set_level(logging.INFO, logger="engine_shim")
    engine_shim.boot(**SHAPES)
    _join_boot()
    shim = engine_shim.current()
    assert shim is not None
    seg = _segment(seg_name, num_spec=N + 1)
    try:
        end = time.monotonic() + 3
        while time.monotonic() < end and shim.counters.counter("attach_mismatch") == 0:
            time.sleep(0.01)
        time.sleep(0.3)  # several more looks: logged once per incarnation
        assert shim.counters.counter("attach_mismatch") == 1
        assert shim.state is AttachState.DETACHED and seg.word(Word.ATTACHED) == 0
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "num_spec" in errors[0]
    finally:
        seg.unlink()
        seg.close()


def test_boot_attaches_to_a_matching_proxy(monkeypatch, seg_name):
    seg = _segment(seg_name)
    try:
        monkeypatch.setenv("DSPARK_PROXY", seg_name)
        engine_shim.boot(**SHAPES)
        _join_boot()
        shim = engine_shim.current()
        assert shim is not None
        end = time.monotonic() + 3
        while time.monotonic() < end and shim.state is not AttachState.PENDING:
            time.sleep(0.01)
        assert shim.state is AttachState.PENDING  # attaches at the engine's first round
    finally:
        seg.unlink()
        seg.close()


def _plugin():
    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "dspark_proxy"]
    assert len(eps) == 1, "the vllm.general_plugins entry point is not installed (pip install -e .)"
    return eps[0].load()


def test_vllm_plugin_entry_point_loads_and_attaches_nothing(monkeypatch, seg_name):
    """vLLM calls the plugin in each of its three processes; only the proposer, built in the model
    runner's process, attaches (before: a shim and a watchdog in every process that set the shapes)."""
    register = _plugin()
    assert register is engine_shim.plugin.register
    assert register() is None  # no DSPARK_PROXY: nothing
    assert engine_shim.current() is None and not _boot_threads()
    monkeypatch.setenv("DSPARK_PROXY", seg_name)
    for k, v in SHAPES.items():
        monkeypatch.setenv(f"DSPARK_PROXY_{k.upper()}", str(v))
    seg = _segment(seg_name)  # a proxy with exactly those shapes is there: still nothing attaches
    try:
        assert register() is None
        assert not _boot_threads()
        _join_boot()
        assert engine_shim.current() is None
    finally:
        seg.unlink()
        seg.close()


def test_a_dead_proxys_leftover_segment_does_not_refuse_the_engine(monkeypatch, seg_name):
    """A SIGKILLed proxy leaves its segment behind; the next proxy (maybe with the engine's new
    parameters) replaces it. Its stale parameters must not keep the engine target-only for good."""
    seg = _segment(seg_name, window=W * 2)
    seg.header["owner_pid"] = 0  # nobody: a dead owner
    try:
        monkeypatch.setenv("DSPARK_PROXY", seg_name)
        engine_shim.boot(**SHAPES)
        _join_boot()
        shim = engine_shim.current()
        assert shim is not None and shim.state is AttachState.DETACHED
        # and a live proxy with the right parameters is attached when it comes
        seg.unlink()
        seg.close()
        seg = _segment(seg_name)
        end = time.monotonic() + 3
        while time.monotonic() < end and shim.state is not AttachState.PENDING:
            time.sleep(0.01)
        assert shim.state is AttachState.PENDING
    finally:
        seg.unlink()
        seg.close()
