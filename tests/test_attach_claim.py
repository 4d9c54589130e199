"""No window in which a live attacher looks dead, and one shim per (process, name)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from dspark_proxy.config import ProxyConfig
from dspark_proxy.proxy import Proxy
from dspark_proxy.shm import hostflag as hf
from dspark_proxy.shm.layout import LayoutParams, State, Word
from dspark_proxy.shm.segment import Segment
from engine_shim import api
from engine_shim import attachment as attachment_mod
from engine_shim.attach import AttachState
from engine_shim.shim import Shim

pytestmark = pytest.mark.timeout(60)

M, N, W, B = 8, 3, 4, 16
SHAPES = {"max_reqs": M, "num_spec": N, "window": W, "row_bytes": B}


def _batch(n: int = 2) -> dict:
    return dict(req_ids=np.arange(n, dtype=np.int64), slots=np.arange(n), qsl=np.arange(n + 1),
                need_draft=np.ones(n, bool), k_window=np.zeros(n, np.int64),
                rows=np.zeros((n, B), np.uint8), valid=np.ones(n, np.int64), first_pos=np.zeros(n, np.int64),
                anchor=np.ones(n, np.int64))


_OTHER_ENGINE = textwrap.dedent("""
    import os, sys
    from engine_shim.shim import Shim
    s = Shim(sys.argv[1], max_reqs=8, num_spec=3, window=4, row_bytes=16, start_watchdog=False,
             look_every_s=0.0)
    s.watchdog._look_for_proxy()  # what another engine's watchdog does every 0.1 s
    print(s.state.value, flush=True)
    os._exit(0)  # no close(): a pending shim's close abandons what it found
""")


def test_another_engine_looking_mid_attach_leaves_the_attacher_alone(seg_name, monkeypatch):
    """Another engine's watchdog that looks at the incarnation between the winner's claim and the rest
    of its attach must see it taken by a live engine: neither abandon it nor take it."""
    p = LayoutParams(max_reqs=M, num_spec=N, window=W, row_bytes=B, max_rows=M * W, resync_per_round=2)
    seg = Segment.create(seg_name, p, deadline_ms=1000.0)
    seg.set_word(Word.HEARTBEAT_NS, 1 << 62)
    seg.set_word(Word.STATE, State.READY)
    seen: list[str] = []

    class _PauseAfterClaim:
        """hostflag as the shim sees it, but a won claim runs the other engine before returning."""

        def __getattr__(self, k):
            return getattr(hf, k)

        def cas(self, mm, off, expected, new):
            won = hf.cas(mm, off, expected, new)
            if won:
                out = subprocess.run([sys.executable, "-c", _OTHER_ENGINE, seg_name], capture_output=True,
                                     text=True, timeout=30)
                assert out.returncode == 0, out.stderr
                seen.append(out.stdout.strip())
            return won

    shim = Shim(seg_name, **SHAPES, start_watchdog=False)
    try:
        assert shim.offer(Segment.open(seg_name))
        monkeypatch.setattr(attachment_mod, "hf", _PauseAfterClaim())
        shim.enqueue(5, **_batch())
        monkeypatch.undo()
        assert seen == ["detached"], seen  # it looked, found the incarnation taken, offered nothing
        assert seg.word(Word.ABANDONED) == 0, "a live attacher's incarnation was abandoned"
        assert shim.attached and seg.word(Word.ATTACHED) == 5
    finally:
        shim.close()
        seg.unlink()
        seg.close()


@pytest.fixture
def proxy(seg_name):
    cfg = ProxyConfig(name=seg_name, worker="inproc", deadline_ms=1000.0, log_every=0, **SHAPES)
    px = Proxy(cfg)
    th = threading.Thread(target=px.serve, daemon=True)
    th.start()
    assert px.ready.wait(10)
    yield px
    px.stop()
    th.join(10)


@pytest.fixture
def no_boot_env(monkeypatch):
    for k in ("", "_MAX_REQS", "_NUM_SPEC", "_WINDOW", "_ROW_BYTES"):
        monkeypatch.delenv(f"DSPARK_PROXY{k}", raising=False)
    monkeypatch.setattr(api, "_current", None)


def _booted(monkeypatch, seg_name: str) -> Shim:
    """boot() as the vLLM plugin calls it, and the shim it makes once it is there."""
    monkeypatch.setenv("DSPARK_PROXY", seg_name)
    api.boot(**SHAPES)
    t_end = time.monotonic() + 10
    while api.current() is None and time.monotonic() < t_end:
        time.sleep(0.005)
    shim = api.current()
    assert shim is not None
    return shim


def test_a_shared_shim_waits_for_the_proxy_as_asked(seg_name, proxy, monkeypatch, no_boot_env):
    """attach(timeout_s=5) returning boot()'s shim waits, as a new shim would, until the watchdog has
    found the proxy: returned at once, the engine's first rounds ran detached (CI, stop 35)."""
    from engine_shim.watchdog import Watchdog

    real_look = Watchdog._look_for_proxy
    slow_first: list[float] = []

    def late_first_look(self):
        if not slow_first:
            slow_first.append(time.monotonic())
            time.sleep(0.3)  # a busy machine: the watchdog's first look comes late
        real_look(self)

    monkeypatch.setattr(Watchdog, "_look_for_proxy", late_first_look)
    shim = _booted(monkeypatch, seg_name)
    try:
        assert api.attach(seg_name, **SHAPES, timeout_s=5.0) is shim
        assert shim.state is not AttachState.DETACHED, "attach(timeout_s=5) returned before the proxy was found"
        shim.enqueue(1, **_batch())
        assert shim.read_reply(1).ok and shim.attached
    finally:
        shim.close()


def test_boot_then_attach_share_one_shim(seg_name, proxy, monkeypatch, no_boot_env):
    """The vLLM plugin's boot() and the engine's explicit attach() in one process: one shim, which
    keeps its incarnation; different parameters are refused naming the field."""
    first = _booted(monkeypatch, seg_name)
    try:
        again = api.attach(seg_name, **SHAPES, timeout_s=5.0)
        assert again is first
        with pytest.raises(ValueError, match="window=4, not 8"):
            api.attach(seg_name, **{**SHAPES, "window": 8})
        with pytest.raises(ValueError, match="deadline_ms"):
            api.attach(seg_name, **SHAPES, deadline_ms=3.0)
        ok = 0
        for t in range(1, 41):
            first.enqueue(t, **_batch())
            ok += first.read_reply(t).ok
        assert first.attached and ok >= 38, ok
        assert proxy.incarnations == 1 and proxy.stats.counter("abandoned") == 0
    finally:
        first.close()
    # closed: the name is free again
    third = api.attach(seg_name, **SHAPES)
    try:
        assert third is not first and third.state is not AttachState.CLOSED
    finally:
        third.close()
