"""The head kernel's helper threads (model/_headmm_par.c): every product, top-1 and draft is the bytes
of one thread, whatever the thread count and whichever thread took which chunk; the count comes from
DSPARK_HEAD_THREADS or the CPUs, and bad values are refused by name; `ThreadChoice` keeps the faster
count per batch size and keeps trying the other."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_proxy.model import headmm
from dspark_proxy.model.head_threads import ThreadChoice
from dspark_proxy.model.headmm import Packed, mm, mm_reference, top1, top1_reference

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def split_all():
    """Two threads, every product split (one panel a chunk), no solo spell: the helper's path is
    taken whatever the machine's load."""
    t, old = headmm.threads(), headmm.tune(0, 1, 0)
    headmm.set_threads(2)
    yield
    headmm.set_threads(t)
    headmm.tune(*old)


def _one_thread(f):
    t = headmm.threads()
    headmm.set_threads(1)
    try:
        return f()
    finally:
        headmm.set_threads(t)


def _helper_ran(f, limit_s=20.0) -> bool:
    """Repeat f until a helper has run a chunk (it needs a core; on a loaded machine it may wait)."""
    before, t0 = headmm.par_stats()[2], time.monotonic()
    while time.monotonic() - t0 < limit_s:
        f()
        if headmm.par_stats()[2] > before:
            return True
    return False


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), R=st.integers(1, 21), K=st.integers(1, 60), M=st.integers(1, 200),
       with_b=st.booleans(), with_resid=st.booleans(), with_rms=st.booleans())
def test_two_threads_write_the_bytes_of_one(split_all, seed, R, K, M, with_b, with_resid, with_rms):
    """Every tile shape (4-row tiles with a repeated-row tail, single rows 4 panels at a time, a partial
    last panel) cut across chunk boundaries of rows and panels: the bytes of one thread and of the
    reference order."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((R, K)).astype(np.float32)
    w = rng.standard_normal((K, M)).astype(np.float32)
    b = rng.standard_normal(M).astype(np.float32) if with_b else None
    resid = rng.standard_normal((R, M)).astype(np.float32) if with_resid else None
    p = Packed(w)
    two = mm(x, p, b, resid, with_rms)
    assert two.tobytes() == _one_thread(lambda: mm(x, p, b, resid, with_rms)).tobytes()
    assert two.tobytes() == mm_reference(x, w, b, resid, with_rms).tobytes()


def test_the_helper_really_takes_chunks_and_the_served_shapes_stay_exact(split_all):
    """The shipped head's products and its top-1 over 2048 ids, shared: a helper does take chunks,
    and the bytes are one thread's."""
    rng = np.random.default_rng(1)
    cases = []
    for R, K, M in [(1, 192, 2048), (4, 192, 2048), (8, 192, 2048), (20, 192, 768), (20, 768, 192), (12, 576, 192)]:
        x, w = rng.standard_normal((R, K)).astype(np.float32), rng.standard_normal((K, M)).astype(np.float32)
        cases.append((x, Packed(w), _one_thread(lambda x=x, w=w: mm(x, Packed(w)))))
    lg = (rng.standard_normal((8, 2048)) * 4).astype(np.float32)
    assert _helper_ran(lambda: [mm(x, p) for x, p, _ in cases] and top1(lg)), "no helper ever ran a chunk"
    for x, p, want in cases:
        assert mm(x, p).tobytes() == want.tobytes()
    c, cm = top1(lg)
    c1, cm1 = top1_reference(lg)
    assert c.tobytes() == c1.tobytes() and cm.tobytes() == cm1.tobytes()


def test_the_thread_count_comes_from_the_environment_or_the_cpus(monkeypatch):
    import os

    monkeypatch.setenv(headmm.THREADS_ENV, "3")
    assert headmm.default_threads() == 3
    monkeypatch.delenv(headmm.THREADS_ENV)
    assert headmm.default_threads() == max(1, min(len(os.sched_getaffinity(0)), 2))
    for bad in ("0", "9", "two", "-1", "1.5"):
        monkeypatch.setenv(headmm.THREADS_ENV, bad)
        with pytest.raises(ValueError, match=f"{headmm.THREADS_ENV}='{bad}'.*1 to 8"):
            headmm.default_threads()
    t = headmm.threads()
    for bad in (0, 9):
        with pytest.raises(ValueError, match="1 to 8"):
            headmm.set_threads(bad)
    assert headmm.threads() == t


def test_a_rounds_choice_leaves_the_configured_count_for_the_next_drafter():
    """A worker's round at one thread (`use_threads`) does not lower what the next drafter is
    configured with, and no round goes above it."""
    from dspark_proxy.model import _headmm

    t = headmm.threads()
    try:
        headmm.set_threads(2)
        headmm.use_threads(1)
        assert headmm.threads() == 2 and _headmm.threads() == 1
        headmm.use_threads(5)
        assert _headmm.threads() == 2
        headmm.set_threads(1)
        headmm.use_threads(2)
        assert _headmm.threads() == 1
    finally:
        headmm.set_threads(t)


def test_thread_choice_keeps_the_faster_count_and_tries_the_other():
    """Rounds at 2 threads cost 1.0, at 1 thread 2.0 (then the load changes: 2 threads cost 3.0): it
    measures both, settles on the faster, tries the other every `explore` rounds, and follows the
    change; each batch size on its own."""
    ch = ThreadChoice(2, explore=8, keep=5)
    cost = {1: 2.0, 2: 1.0}
    picks = []
    for _ in range(64):
        k = ch.pick(4)
        picks.append(k)
        ch.record(4, cost[k])
    assert picks[:6].count(1) >= 3 and picks[:6].count(2) >= 3  # both measured first
    tail = picks[16:]
    assert tail.count(1) == len(tail) // 8 and tail.count(2) == len(tail) - len(tail) // 8
    cost[2] = 3.0
    picks = []
    for _ in range(80):
        k = ch.pick(4)
        picks.append(k)
        ch.record(4, cost[k])
    assert picks[-24:].count(1) >= 20
    assert ch.pick(7) in (1, 2)  # another size starts measuring afresh
    assert ThreadChoice(1).pick(4) == 1
