"""_hostflag and hostflag.HostFlags, one process: the semantics of every call, its timing, its refusals.

The multi-process races (claims, torn pages, killed proxies, seqlock) are in test_hostflag_race.py.
Calls that could crash the interpreter on a bug run in a child process, so a crash is a failure here
and not the end of the run. Timing bounds are generous (this runs on loaded 2-vCPU machines); the
figures themselves are printed with -s and measured properly in test_hostflag_race.py.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_proxy.limits import SUPPORT_K
from dspark_proxy.shm import _hostflag as hf
from dspark_proxy.shm import hostflag
from dspark_proxy.shm.hostflag import (
    PAGE_NOT_PUBLISHED,
    PAGE_NOT_THIS_ROUND,
    PAGE_OK,
    WAIT_CLAIMED_UNPUBLISHED,
    WAIT_FAILED_BY_ME,
    WAIT_OUT_OF_ORDER,
    WAIT_PUBLISHED,
    AdaptiveSpin,
    HostFlags,
    OutOfOrder,
)
from dspark_proxy.shm.layout import STATUS_ROUND_FAILED, LayoutParams, ReplyPageLayout, Word
from dspark_proxy.shm.segment import Segment

pytestmark = pytest.mark.timeout(30)

STRIDE = hf.WORD_STRIDE
G, C, P, K = (i * STRIDE for i in (hf.GATHERED, hf.CLAIMED, hf.PUBLISHED, hf.CONSUMED))
WORDS = 0  # raw buffers: words region at 0, page at PAGE_OFF
PAGE_OFF = 4096
PAGE_INTS = 64
ZERO_BYTES = 16  # a failed page zeroes this many bytes after [status, n]
LATE_MS = 20.0  # a timed wait may return this much after its deadline on a loaded machine (measured: < 1)


@pytest.fixture
def mm() -> Iterator[mmap.mmap]:
    """A bare 3-page anonymous mapping: the C functions do not care that it is not a segment."""
    m = mmap.mmap(-1, 3 * 4096)
    yield m
    m.close()


def page_of(m: mmap.mmap) -> np.ndarray:
    return np.frombuffer(m, np.int32, PAGE_INTS, PAGE_OFF)


def filled(v: int) -> np.ndarray:
    return np.full(PAGE_INTS, v, np.int32)


@pytest.fixture
def seg(seg_name: str) -> Iterator[Segment]:
    p = LayoutParams(max_reqs=4, num_spec=3, window=8, row_bytes=64, max_rows=32, resync_per_round=2)
    s = Segment.create(seg_name, p, deadline_ms=5.0)
    try:
        yield s
    finally:
        s.unlink()
        s.close()


def in_thread(fn, *args) -> tuple[threading.Thread, dict]:
    """Run fn in a thread; the result and its duration (perf_counter ns) land in the returned dict."""
    out: dict = {}

    def run() -> None:
        t0 = time.perf_counter_ns()
        try:
            out["result"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            out["error"] = e
        out["elapsed_ns"] = time.perf_counter_ns() - t0

    th = threading.Thread(target=run, name="test-waiter", daemon=True)
    th.start()
    return th, out


def run_child(code: str, timeout_s: float = 20.0, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (a crash there is a return code here, not the end of pytest)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, **(env or {})})


# ---------------------------------------------------------------------------------------- constants


def test_module_constants_match_the_layout():
    assert hf.WORD_STRIDE == 128 and hf.SLEEPERS_OFF == 8
    assert (hf.GATHERED, hf.CLAIMED, hf.PUBLISHED, hf.CONSUMED, hf.N_ROUND_WORDS) == (0, 1, 2, 3, 4)
    assert hf.PUBLISHED_NS == Word.PUBLISHED_NS == 15
    assert hf.ROUND_FAILED == STATUS_ROUND_FAILED
    assert abs(hf.monotonic_ns() - time.monotonic_ns()) < 50_000_000  # the same clock (CLOCK_MONOTONIC)


# ---------------------------------------------------------------------------------------- plain words


def test_load_store_roundtrip(mm):
    assert hf.load(mm, G) == 0
    for v in (1, 7, 1 << 32, (1 << 63) + 5, (1 << 64) - 1):
        hf.store(mm, G, v)
        assert hf.load(mm, G) == v
        assert hf.load_after(mm, G) == v
    assert int.from_bytes(mm[G:G + 8], "little") == (1 << 64) - 1  # little-endian 64-bit, in place
    with pytest.raises(OverflowError):
        hf.store(mm, G, 1 << 64)


def test_cas_only_from_expected(mm):
    hf.store(mm, C, 5)
    assert hf.cas(mm, C, 4, 9) is False and hf.load(mm, C) == 5
    assert hf.cas(mm, C, 5, 6) is True and hf.load(mm, C) == 6
    assert hf.cas(mm, C, 5, 7) is False and hf.load(mm, C) == 6


def test_raise_to_never_moves_backwards(mm):
    assert hf.raise_to(mm, C, 10) == 0 and hf.load(mm, C) == 10
    assert hf.raise_to(mm, C, 3) == 10 and hf.load(mm, C) == 10  # lower: no change, returns current
    assert hf.raise_to(mm, C, 10) == 10 and hf.load(mm, C) == 10
    assert hf.raise_to(mm, C, 1 << 40) == 10 and hf.load(mm, C) == 1 << 40


def test_begin_write_and_wake_do_what_they_say(mm):
    hf.begin_write(mm, 512, 42)
    assert hf.load(mm, 512) == 42 and hf.load_after(mm, 512) == 42
    hf.store(mm, G, 3)
    assert hf.wake(mm, G) is None and hf.load(mm, G) == 3  # a wake never changes the word


# ---------------------------------------------------------------------------------------- wait_ge


@pytest.mark.parametrize("spin_ns", [0, 20_000])
def test_wait_ge_immediate_when_already_there(mm, spin_ns):
    hf.store(mm, G, 5)
    for target in (0, 4, 5):
        t0 = time.perf_counter_ns()
        assert hf.wait_ge(mm, G, target, 0.0, spin_ns) is True
        assert hf.wait_ge(mm, G, target, 10.0, spin_ns) is True
        assert time.perf_counter_ns() - t0 < 5_000_000
    assert hf.wait_ge(mm, G, 6, 0.0, spin_ns) is False


@pytest.mark.parametrize("spin_ns", [0, 30_000])
@pytest.mark.parametrize("timeout_s", [0.0005, 0.005, 0.04])
def test_wait_ge_honours_its_timeout(mm, timeout_s, spin_ns):
    """Never early (the deadline is the C side's own CLOCK_MONOTONIC), and late by at most LATE_MS."""
    late = []
    for _ in range(5):
        t0 = time.monotonic_ns()
        assert hf.wait_ge(mm, G, 1, timeout_s, spin_ns) is False
        elapsed = time.monotonic_ns() - t0
        assert elapsed >= timeout_s * 1e9
        late.append((elapsed - timeout_s * 1e9) / 1e6)
    assert max(late) < LATE_MS, f"timeout {timeout_s}s overshot by {late} ms"
    print(f"wait_ge timeout={timeout_s * 1e3:g}ms spin={spin_ns}ns late_ms max={max(late):.3f}")


@pytest.mark.parametrize("how", ["store", "raise_to", "cas"])
def test_wait_ge_woken_by_another_thread(mm, how):
    th, out = in_thread(hf.wait_ge, mm, G, 3, 10.0, 0)
    time.sleep(0.03)  # the waiter is asleep in the futex by now
    assert th.is_alive()
    {"store": lambda: hf.store(mm, G, 3), "raise_to": lambda: hf.raise_to(mm, G, 7),
     "cas": lambda: hf.cas(mm, G, 0, 3)}[how]()
    th.join(5)
    assert not th.is_alive() and out["result"] is True
    assert out["elapsed_ns"] < 2e9  # woken, not timed out


def test_wait_ge_tolerates_spurious_wakeups(mm):
    """Wakes without the target (a bare wake(), values below it) neither end the wait early nor wrongly."""
    th, out = in_thread(hf.wait_ge, mm, G, 10, 0.3, 0)
    for v in range(1, 10):
        time.sleep(0.01)
        hf.store(mm, G, v)
        hf.wake(mm, G)
    th.join(5)
    assert out["result"] is False and out["elapsed_ns"] >= 0.3e9  # ran to its timeout
    th, out = in_thread(hf.wait_ge, mm, G, 10, 10.0, 0)
    for _ in range(5):
        time.sleep(0.01)
        hf.wake(mm, G)
    assert th.is_alive()
    hf.store(mm, G, 10)
    th.join(5)
    assert out["result"] is True and out["elapsed_ns"] < 2e9


def test_wait_ge_negative_timeout_waits_until_woken(mm):
    th, out = in_thread(hf.wait_ge, mm, G, 1, -1.0, 0)
    try:
        time.sleep(0.2)
        assert th.is_alive(), "a negative timeout must wait forever"
    finally:
        hf.store(mm, G, 1)  # frees the waiter even when the assert above failed
        th.join(5)
    assert out["result"] is True


def test_wait_ge_sleeper_count_returns_to_zero(mm):
    """The futex sleepers count (word + 8) is what lets a store skip the wake syscall: it must not leak."""
    sleepers = lambda: hf.load(mm, G + hf.SLEEPERS_OFF) & 0xFFFFFFFF  # noqa: E731
    hf.wait_ge(mm, G, 1, 0.002, 0)
    assert sleepers() == 0
    th, out = in_thread(hf.wait_ge, mm, G, 1, 10.0, 0)
    deadline = time.monotonic() + 2
    while sleepers() == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert sleepers() == 1
    hf.store(mm, G, 1)
    th.join(5)
    assert out["result"] is True and sleepers() == 0


# ---------------------------------------------------------------------------------------- the page


def test_publish_won_lost_out_of_order(mm):
    pg = page_of(mm)
    assert hf.publish(mm, WORDS, PAGE_OFF, 1, filled(11)) == 1
    assert (pg == 11).all() and hf.load(mm, C) == 1 and hf.load(mm, P) == 1
    assert hf.publish(mm, WORDS, PAGE_OFF, 1, filled(99)) == 0  # claimed >= t: lost, page untouched
    assert (pg == 11).all() and hf.load(mm, P) == 1
    assert hf.publish(mm, WORDS, PAGE_OFF, 3, filled(99)) == -1  # claimed < t-1: out of order, nothing done
    assert (pg == 11).all() and hf.load(mm, C) == 1 and hf.load(mm, P) == 1
    assert hf.publish(mm, WORDS, PAGE_OFF, 2, filled(22)) == 1
    assert (pg == 22).all() and (hf.load(mm, C), hf.load(mm, P)) == (2, 2)
    with pytest.raises(ValueError, match="rounds start at 1"):
        hf.publish(mm, WORDS, PAGE_OFF, 0, filled(1))


def test_publish_stamps_when_its_reply_came(mm):
    """The winner stamps PUBLISHED_NS (CLOCK_MONOTONIC, after its copy): the engine's spin learns from it
    (AdaptiveSpin). A publish that loses its claim stamps nothing."""
    stamp = hf.PUBLISHED_NS * STRIDE
    t0 = hf.monotonic_ns()
    assert hf.publish(mm, WORDS, PAGE_OFF, 1, filled(11)) == 1
    first = hf.load(mm, stamp)
    assert t0 <= first <= hf.monotonic_ns()
    assert hf.publish(mm, WORDS, PAGE_OFF, 1, filled(99)) == 0
    assert hf.load(mm, stamp) == first


def test_fail_round_writes_a_failed_page(mm):
    pg = page_of(mm)
    pg[:] = 7
    assert hf.fail_round(mm, WORDS, PAGE_OFF, ZERO_BYTES, 1, 5) == 1
    assert pg[0] == STATUS_ROUND_FAILED and pg[1] == 5
    assert (pg[2:2 + ZERO_BYTES // 4] == 0).all() and (pg[2 + ZERO_BYTES // 4:] == 7).all()
    assert (hf.load(mm, C), hf.load(mm, P)) == (1, 1)
    assert hf.fail_round(mm, WORDS, PAGE_OFF, ZERO_BYTES, 1, 6) == 0 and pg[1] == 5
    assert hf.fail_round(mm, WORDS, PAGE_OFF, ZERO_BYTES, 5, 6) == -1 and hf.load(mm, C) == 1


def test_read_page_seqlock_rule(mm):
    dst = np.zeros(PAGE_INTS, np.int32)
    assert hf.read_page(mm, WORDS, PAGE_OFF, 1, dst) == -1 and (dst == 0).all()  # not published yet
    hf.publish(mm, WORDS, PAGE_OFF, 1, filled(11))
    assert hf.read_page(mm, WORDS, PAGE_OFF, 1, dst) == 1 and (dst == 11).all()
    assert hf.read_page(mm, WORDS, PAGE_OFF, 2, dst) == -1
    assert hf.cas(mm, C, 1, 2)  # someone claimed round 2 (and is writing the page): round 1 is gone
    dst[:] = 0
    assert hf.read_page(mm, WORDS, PAGE_OFF, 1, dst) == 0
    assert hf.read_page(mm, WORDS, PAGE_OFF, 2, dst) == -1  # claimed but not yet published


def test_fail_all_is_a_monotonic_far_ahead_release(mm):
    pg, dst = page_of(mm), np.zeros(PAGE_INTS, np.int32)
    hf.publish(mm, WORDS, PAGE_OFF, 1, filled(11))
    T = 1 + hostflag.FAR_AHEAD
    assert hf.fail_all(mm, WORDS, PAGE_OFF, ZERO_BYTES, T) is True
    assert (hf.load(mm, C), hf.load(mm, P)) == (T, T)
    assert pg[0] == STATUS_ROUND_FAILED and pg[1] == 0
    assert hf.fail_all(mm, WORDS, PAGE_OFF, ZERO_BYTES, T - 5) is False  # never backwards
    assert hf.fail_all(mm, WORDS, PAGE_OFF, ZERO_BYTES, T) is False
    assert (hf.load(mm, C), hf.load(mm, P)) == (T, T)
    for t in (1, 2, 1000, T - 1):  # every round up to T: released at once, and not this round's page
        assert hf.wait_ge(mm, P, t, 0.0, 0) is True
        assert hf.read_page(mm, WORDS, PAGE_OFF, t, dst) == 0
        assert hf.publish(mm, WORDS, PAGE_OFF, t, filled(5)) == 0  # later publishes lose
        assert hf.fail_round(mm, WORDS, PAGE_OFF, ZERO_BYTES, t, 1) == 0
    # round T itself: fail_all is its claimant, so its (failed) page is that round's reply
    assert hf.read_page(mm, WORDS, PAGE_OFF, T, dst) == 1 and dst[0] == STATUS_ROUND_FAILED
    assert hf.publish(mm, WORDS, PAGE_OFF, T, filled(5)) == 0 and pg[0] == STATUS_ROUND_FAILED
    assert hf.publish(mm, WORDS, PAGE_OFF, T + 1, filled(5)) == 1 and (pg == 5).all()


def test_fail_all_wakes_a_waiter(mm):
    th, out = in_thread(hf.wait_ge, mm, P, 3, 10.0, 0)
    time.sleep(0.03)
    hf.fail_all(mm, WORDS, PAGE_OFF, ZERO_BYTES, 3 + hostflag.FAR_AHEAD + 1)  # low 32 bits change too
    th.join(5)
    assert out["result"] is True and out["elapsed_ns"] < 2e9


def test_fail_all_never_publishes_a_round_someone_else_holds(mm):
    """claimed == T held by a claimant frozen between its claim and its copy (SIGSTOP, page fault, a
    second fail_all racing the first): fail_all(T) must not make round T readable before that copy.
    (Regression: fail_all used to raise published to T whether or not it had claimed T.)"""
    dst = np.zeros(PAGE_INTS, np.int32)
    hf.publish(mm, WORDS, PAGE_OFF, 1, filled(11))
    assert hf.cas(mm, C, 1, 2)  # round 2's claimant, before its memcpy
    hf.fail_all(mm, WORDS, PAGE_OFF, ZERO_BYTES, 2)
    assert hf.read_page(mm, WORDS, PAGE_OFF, 2, dst) != PAGE_OK


@pytest.mark.parametrize("sampled", [False, True])
def test_publish_and_read_rows_copy_the_header_and_the_rounds_requests_only(sampled):
    """With a rows spec, publish copies the header and the first page[1] requests of every block, and
    read_page the first n: all a reader of a round of n parses (reply.py), and no more. Every other
    word keeps what was there; a page's n outside 0..M is clamped, never trusted."""
    lay = ReplyPageLayout(6, 3, sampled)
    M, N, K = 6, 3, SUPPORT_K
    blocks = [(lay.o_ok, 1), (lay.o_ids, N), (lay.o_conf, N)] + (
        [(lay.o_sample_mask, 1), (lay.o_qids, N * K), (lay.o_q, N * K)] if sampled else [])
    assert np.frombuffer(lay.rows_spec, np.int64).tolist() == [M, *(w for b in blocks for w in b)]
    mm = mmap.mmap(-1, 4096 + ((lay.nbytes + 4095) // 4096) * 4096)
    try:
        pg = np.frombuffer(mm, np.int32, lay.size, 4096)
        for t, n, page_n in [(1, 2, 2), (2, 0, 0), (3, M, M), (4, 5, -3), (5, M, M + 9), (6, 1, 1)]:
            pg[:] = -77
            src = np.arange(lay.size, dtype=np.int32) + 1000 * t
            src[1] = page_n
            want = pg.copy()
            rows = max(0, min(page_n, M))
            want[:2] = src[:2]
            for off, per in blocks:
                want[off:off + rows * per] = src[off:off + rows * per]
            assert hf.publish(mm, 0, 4096, t, src, lay.rows_spec) == 1
            assert (pg == want).all(), (t, n)
            dst = np.full(lay.size, 5, np.int32)
            got = dst.copy()
            got[:2] = pg[:2]
            for off, per in blocks:
                got[off:off + n * per] = pg[off:off + n * per]
            assert hf.read_page(mm, 0, 4096, t, dst, lay.rows_spec, n) == PAGE_OK
            assert (dst == got).all(), (t, n)
        # the seqlock rule holds with rows: not published, then the claim moved on
        dst = np.zeros(lay.size, np.int32)
        assert hf.read_page(mm, 0, 4096, 7, dst, lay.rows_spec, 1) == PAGE_NOT_PUBLISHED and (dst == 0).all()
        assert hf.cas(mm, C, 6, 7)
        assert hf.read_page(mm, 0, 4096, 6, dst, lay.rows_spec, 1) == PAGE_NOT_THIS_ROUND
    finally:
        del pg
        mm.close()


@pytest.mark.parametrize("spec", [
    np.array([], np.int64), np.array([4, 2], np.int64), np.array([-1, 2, 1], np.int64),
    np.array([4, 1, 1], np.int64), np.array([4, 2, -1], np.int64), np.array([4, 60, 2], np.int64),
    np.array([1 << 30, 2, 1], np.int64), b"\x00" * 12])
def test_a_bad_rows_spec_is_refused_before_anything_is_claimed(mm, spec):
    """A rows spec that does not fit the page (or is not one) is a ValueError: no claim, no copy."""
    pg = page_of(mm)
    pg[:] = 3
    with pytest.raises(ValueError, match="rows spec"):
        hf.publish(mm, WORDS, PAGE_OFF, 1, filled(11), spec)
    assert hf.load(mm, C) == 0 and (pg == 3).all()
    with pytest.raises(ValueError, match="rows spec"):
        hf.read_page(mm, WORDS, PAGE_OFF, 1, np.zeros(PAGE_INTS, np.int32), spec, 1)


# ---------------------------------------------------------------------------------------- wait_or_fail


def test_wait_or_fail_published_before_the_deadline(mm):
    hf.publish(mm, WORDS, PAGE_OFF, 1, filled(11))
    dl = hf.monotonic_ns() + 10_000_000
    assert hf.wait_or_fail(mm, WORDS, PAGE_OFF, ZERO_BYTES, 1, 3, dl, 0) == 1
    th, out = in_thread(hf.wait_or_fail, mm, WORDS, PAGE_OFF, ZERO_BYTES, 2, 3, hf.monotonic_ns() + 5 * 10**9, 0)
    time.sleep(0.02)
    assert hf.publish(mm, WORDS, PAGE_OFF, 2, filled(22)) == 1
    th.join(5)
    assert out["result"] == 1 and out["elapsed_ns"] < 2e9
    assert (page_of(mm) == 22).all()


def test_wait_or_fail_claims_at_the_deadline(mm):
    pg = page_of(mm)
    late_us = []
    for t in range(1, 21):
        dl = hf.monotonic_ns() + 2_000_000
        r = hf.wait_or_fail(mm, WORDS, PAGE_OFF, ZERO_BYTES, t, 40 + t, dl, 0)
        back = hf.monotonic_ns()
        assert r == 2 and back >= dl  # never before the deadline
        late_us.append((back - dl) / 1e3)
        assert (hf.load(mm, C), hf.load(mm, P)) == (t, t)
        assert pg[0] == STATUS_ROUND_FAILED and pg[1] == 40 + t
        assert hf.publish(mm, WORDS, PAGE_OFF, t, filled(9)) == 0  # the late proxy loses
    late_us.sort()
    print(f"wait_or_fail claim lateness (return - deadline) us: p50={late_us[10]:.0f} max={late_us[-1]:.0f}")
    assert late_us[-1] < LATE_MS * 1e3
    # a deadline already past: claims at once
    t0 = hf.monotonic_ns()
    assert hf.wait_or_fail(mm, WORDS, PAGE_OFF, ZERO_BYTES, 21, 1, t0 - 10**9, 50_000) == 2
    assert hf.monotonic_ns() - t0 < LATE_MS * 1e6


def test_wait_or_fail_someone_else_holds_the_claim(mm):
    assert hf.cas(mm, C, 0, 1)  # a proxy claimed round 1 and is still copying (or hung)
    dl = hf.monotonic_ns() + 2_000_000
    assert hf.wait_or_fail(mm, WORDS, PAGE_OFF, ZERO_BYTES, 1, 3, dl, 0) == 3
    assert hf.monotonic_ns() >= dl and hf.load(mm, P) == 0 and hf.load(mm, C) == 1  # nothing done


def test_wait_or_fail_out_of_order(mm):
    dl = hf.monotonic_ns() + 1_000_000
    assert hf.wait_or_fail(mm, WORDS, PAGE_OFF, ZERO_BYTES, 3, 3, dl, 0) == 4  # round 1 never claimed
    assert (hf.load(mm, C), hf.load(mm, P)) == (0, 0)


def test_wait_or_fail_rejects_round_zero_and_bad_ranges(mm):
    with pytest.raises(ValueError):
        hf.wait_or_fail(mm, WORDS, PAGE_OFF, ZERO_BYTES, 0, 3, 0, 0)
    with pytest.raises(ValueError):
        hf.wait_or_fail(mm, WORDS, len(mm) - 8, ZERO_BYTES, 1, 3, 0, 0)


# ---------------------------------------------------------------------------------------- seqlock blocks


def test_seq_write_read_roundtrip(mm):
    seq, data = 1024, 2048
    dst = bytearray(64)
    assert hf.seq_read(mm, seq, data, dst, 10) == 0  # nothing written yet
    assert hf.seq_write(mm, seq, data, b"a" * 64) == 2
    assert hf.seq_read(mm, seq, data, dst, 10) == 2 and dst == bytearray(b"a" * 64)
    assert hf.seq_write(mm, seq, data, b"b" * 64) == 4
    assert hf.seq_read(mm, seq, data, dst, 10) == 4 and dst == bytearray(b"b" * 64)
    assert hf.seq_read(mm, seq, data, dst, 0) == 0  # no tries: no copy


def test_seq_read_gives_up_on_a_writer_that_died_mid_write(mm):
    seq, data = 1024, 2048
    hf.seq_write(mm, seq, data, b"x" * 32)
    hf.store(mm, seq, 3)  # odd: a writer stopped between its two stores
    dst = bytearray(32)
    t0 = time.perf_counter()
    assert hf.seq_read(mm, seq, data, dst, 1000) == 0
    assert time.perf_counter() - t0 < 1.0  # bounded by tries, never blocks
    assert hf.seq_write(mm, seq, data, b"y" * 32) == 6  # the next writer starts from the next even value
    assert hf.seq_read(mm, seq, data, dst, 10) == 6 and dst == bytearray(b"y" * 32)


# ---------------------------------------------------------------------------------------- refusals


def test_bad_offsets_raise_value_error(mm):
    n = len(mm)
    dst = np.zeros(PAGE_INTS, np.int32)
    for bad in (-8, n, n - 4, 1 << 40):
        with pytest.raises(ValueError):
            hf.load(mm, bad)
        with pytest.raises(ValueError):
            hf.store(mm, bad, 1)
    for misaligned in (4, 12, 1):
        with pytest.raises(ValueError, match="aligned"):
            hf.load(mm, misaligned)
        with pytest.raises(ValueError, match="aligned"):
            hf.cas(mm, misaligned, 0, 1)
        with pytest.raises(ValueError, match="aligned"):
            hf.raise_to(mm, misaligned, 1)
    with pytest.raises(ValueError, match="aligned"):
        hf.wait_ge(mm, 8, 1, 0.0, 0)  # a wait needs its word's own line (word + sleepers)
    with pytest.raises(ValueError):
        hf.wait_ge(mm, n - 8, 1, 0.0, 0)
    with pytest.raises(ValueError):
        hf.publish(mm, 8, PAGE_OFF, 1, filled(1))  # words region not 64-aligned
    with pytest.raises(ValueError):
        hf.publish(mm, WORDS, PAGE_OFF + 4, 1, filled(1))
    with pytest.raises(ValueError):
        hf.publish(mm, WORDS, n - 64, 1, filled(1))  # the page would run past the buffer
    with pytest.raises(ValueError):
        hf.publish(mm, n - 256, PAGE_OFF, 1, filled(1))  # the four words would run past it
    with pytest.raises(ValueError):
        hf.read_page(mm, WORDS, n - 64, 1, dst)
    with pytest.raises(ValueError):
        hf.fail_all(mm, WORDS, n - 8, ZERO_BYTES, 5)
    with pytest.raises(ValueError):
        hf.seq_write(mm, 1020, 2048, b"x")
    with pytest.raises(ValueError):
        hf.seq_read(mm, 1024, n - 8, bytearray(16), 1)
    assert (hf.load(mm, C), hf.load(mm, P)) == (0, 0)  # no refusal touched a word


@pytest.mark.parametrize("call", [
    "store(mm, C, -1)", "store(mm, C, 1 << 64)", "raise_to(mm, C, -1)", "cas(mm, C, 7, -1)",
    "fail_all(mm, WORDS, PAGE_OFF, ZERO_BYTES, -1)", "publish(mm, WORDS, PAGE_OFF, -1, filled(1))",
    "wait_ge(mm, G, -1, 0.0, 0)", "read_page(mm, WORDS, PAGE_OFF, 1 << 64, np.zeros(4, np.int32))",
])
def test_out_of_range_values_raise_overflow(mm, call):
    """A word must never jump to 2**64-1 (every round released for good) or wrap to 0 on a caller's bug."""
    hf.store(mm, C, 7)
    with pytest.raises(OverflowError):
        eval("hf." + call)
    assert hf.load(mm, C) == 7 and hf.load(mm, P) == 0


def test_nan_timeout_is_refused(mm):
    """(Regression: NaN used to convert to INT64_MIN, and the deadline arithmetic overflowed to 'forever'.)"""
    th, out = in_thread(hf.wait_ge, mm, G, 1, float("nan"), 0)
    th.join(1.0)
    hf.store(mm, G, 1)  # frees a waiter that took NaN for "forever"
    th.join(5)
    assert isinstance(out.get("error"), ValueError), out


def test_read_only_and_wrong_buffers_are_refused(mm):
    with pytest.raises(TypeError):
        hf.load(bytes(64), 0)  # needs a writable buffer
    with pytest.raises(TypeError):
        hf.read_page(mm, WORDS, PAGE_OFF, 1, b"\0" * 16)  # dst must be writable
    with pytest.raises(TypeError):
        hf.store(mm, 0, "1")


_GUARD_PAGE_CHILD = """
    import ctypes, mmap, sys
    from dspark_proxy.shm import _hostflag as hf
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    mm = mmap.mmap(-1, 8192)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    assert libc.mprotect(base + 4096, 4096, 0) == 0  # the page after the buffer faults on any access
    buf = memoryview(mm)[:4096]
    try:
        {call}
    except ValueError:
        print("refused")
    else:
        print("accepted")
"""


@pytest.mark.parametrize("call", ["hf.load(buf, 4088)", "hf.load_after(buf, 4088)", "hf.wake(buf, 4088)"])
def test_last_word_of_a_buffer_is_safe(call):
    r = run_child(_GUARD_PAGE_CHILD.format(call=call))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("call", ["hf.store(buf, 4088, 1)", "hf.cas(buf, 4088, 0, 1)", "hf.raise_to(buf, 4088, 1)"])
def test_word_store_at_buffer_end_never_reads_past_it(call):
    """A storing call also touches the word's sleepers count and wake sequence (+8..+16): it must check
    that they are in the buffer, not fault (regression: only the 8 bytes of the word were checked)."""
    r = run_child(_GUARD_PAGE_CHILD.format(call=call))
    assert r.returncode == 0, f"child died with {r.returncode} (SIGSEGV = -11): {r.stderr[-300:]}"


_NEG_ZERO_CHILD = """
    import mmap
    from dspark_proxy.shm import _hostflag as hf
    mm = mmap.mmap(-1, 3 * 4096)
    try:
        {call}
    except ValueError:
        print("refused")
"""


@pytest.mark.parametrize("call", [
    "hf.fail_round(mm, 0, 4096, -1, 1, 0)",
    "hf.fail_all(mm, 0, 4096, -8, 5)",
    "hf.wait_or_fail(mm, 0, 4096, -4, 1, 0, 0, 0)",
])
def test_negative_zero_bytes_is_refused(call):
    """(Regression: check_range accepted zero_bytes + 8 >= 0, and memset got a huge size_t.)"""
    r = run_child(_NEG_ZERO_CHILD.format(call=call))
    assert r.returncode == 0 and "refused" in r.stdout, f"rc={r.returncode} {r.stderr[-300:]}"


# ---------------------------------------------------------------------------------------- lost wake-up

_SLOW_FUTEX_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <sys/syscall.h>
#include <time.h>
/* Delay every FUTEX_WAIT by 5 ms: widens the window between the sleeper's last look at the word and
 * its entry into the kernel's wait queue, which is where a wake can be lost. */
long syscall(long nr, ...) {
    va_list ap; va_start(ap, nr);
    long a[6]; for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
    va_end(ap);
    static long (*real)(long, ...);
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    if (nr == SYS_futex && (a[1] & FUTEX_CMD_MASK) == FUTEX_WAIT) {
        struct timespec d = {0, 5000000}; nanosleep(&d, 0);
    }
    return real(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}
"""

_LOST_WAKE_CHILD = """
    import mmap, multiprocessing as mp, time
    from dspark_proxy.shm import _hostflag as hf
    mm = mmap.mmap(-1, 4096)
    def poker():
        while hf.load(mm, 8) & 0xFFFFFFFF == 0:  # the sleeper registered: between its check and FUTEX_WAIT
            pass
        hf.raise_to(mm, 0, 5 + {step})  # sees the sleeper, calls FUTEX_WAKE: nobody is queued yet
    hf.store(mm, 0, 5)
    p = mp.get_context("fork").Process(target=poker)
    p.start()
    t0 = time.perf_counter()
    ok = hf.wait_ge(mm, 0, 6, 1.0, 0)
    print(ok, round((time.perf_counter() - t0) * 1e3, 1))
    p.join(5)
"""


@pytest.fixture(scope="module")
def slow_futex_lib(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler for the LD_PRELOAD shim")
    d = tmp_path_factory.mktemp("slowfutex")
    (d / "slowfutex.c").write_text(_SLOW_FUTEX_C)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(d / "slowfutex.so"), str(d / "slowfutex.c"),
                    "-ldl"], check=True, capture_output=True)
    return d / "slowfutex.so"


def _woken_ms(lib: Path, step: int) -> float:
    r = run_child(_LOST_WAKE_CHILD.format(step=step), env={"LD_PRELOAD": str(lib)})
    assert r.returncode == 0, r.stderr
    ok, ms = r.stdout.split()
    assert ok == "True"
    return float(ms)


def test_wake_in_the_sleepers_window_is_not_lost(slow_futex_lib):
    """The Dekker handshake plus the futex's value check: a store that lands after the sleeper's last
    look but before it sleeps makes FUTEX_WAIT return at once (value changed)."""
    assert _woken_ms(slow_futex_lib, 1) < 500


@pytest.mark.parametrize("step", [1 << 32, hostflag.FAR_AHEAD])
def test_wake_by_a_high_bits_only_store_is_not_lost(slow_futex_lib, step):
    """A store that changes only the high 32 bits (fail_all to t + FAR_AHEAD = t + 2**40) in the same
    window. Regression: the futex used to sleep on the word's low half, which such a store leaves
    unchanged, so the sleeper slept to its timeout (forever with a negative one)."""
    assert _woken_ms(slow_futex_lib, step) < 500


# ---------------------------------------------------------------------------------------- signals


@pytest.mark.timeout(20, method="thread")  # pytest-timeout's own method uses SIGALRM: keep it off
@pytest.mark.parametrize("call", ["wait_ge", "wait_or_fail"])
def test_signal_handler_exception_interrupts_a_long_wait(mm, call):
    class Alarm(Exception):
        pass

    def handler(signum, frame):
        raise Alarm

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        t0 = time.monotonic()
        with pytest.raises(Alarm):
            if call == "wait_ge":
                hf.wait_ge(mm, G, 1, -1.0, 0)  # forever
            else:
                hf.wait_or_fail(mm, WORDS, PAGE_OFF, ZERO_BYTES, 1, 1, hf.monotonic_ns() + 60 * 10**9, 0)
        assert time.monotonic() - t0 < 2.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert (hf.load(mm, C), hf.load(mm, P)) == (0, 0)  # an interrupted wait_or_fail claims nothing
    assert hf.load(mm, G + hf.SLEEPERS_OFF) & 0xFFFFFFFF == 0
    assert hf.load(mm, P + hf.SLEEPERS_OFF) & 0xFFFFFFFF == 0


@pytest.mark.timeout(20, method="thread")
def test_signal_handler_that_returns_resumes_the_wait(mm):
    hits = []
    old = signal.signal(signal.SIGALRM, lambda s, f: hits.append(time.monotonic()))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)  # a signal every 20 ms during a 150 ms wait
        t0 = time.monotonic_ns()
        assert hf.wait_ge(mm, G, 1, 0.15, 0) is False
        elapsed = time.monotonic_ns() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert len(hits) >= 3  # the handlers ran during the wait (it gave the GIL back to run them)
    assert 0.15e9 <= elapsed < 0.15e9 + LATE_MS * 1e6  # and the wait kept its own deadline


# ---------------------------------------------------------------------------------------- HostFlags


def test_hostflags_one_round_each_side(seg):
    eng, prx = HostFlags(seg), HostFlags(seg)
    lay = seg.layout.reply
    page = np.arange(lay.size, dtype=np.int32)
    dst = np.zeros(lay.size, np.int32)
    assert eng.values() == {"gathered": 0, "claimed": 0, "published": 0, "consumed": 0}
    assert prx.wait_gathered(1, 0.001) is False
    t_ns = hf.monotonic_ns()
    eng.raise_gathered(1)
    assert 0 <= seg.word(Word.GATHERED_NS) - t_ns < 10**9  # the deadline's start, same clock
    assert prx.wait_gathered(1, 0.0) is True
    assert not prx.taken(1) and prx.reply_consumed(0)
    assert eng.read_page(1, dst) == PAGE_NOT_PUBLISHED
    assert prx.publish(1, page) is True and prx.taken(1)
    assert eng.wait_published(1, 0.0) is True
    assert eng.read_page(1, dst) == PAGE_OK and (dst == page).all()
    assert (seg.page == page).all()
    eng.consume(1)
    assert prx.reply_consumed(1)
    eng.consume(0)  # consumed never moves back
    assert eng.values() == {"gathered": 1, "claimed": 1, "published": 1, "consumed": 1}
    assert prx.publish(1, page) is False
    with pytest.raises(OutOfOrder, match="round 2 is unclaimed"):
        prx.publish(3, page)


def test_hostflags_watchdog_side(seg):
    eng, prx = HostFlags(seg), HostFlags(seg)
    eng.raise_gathered(1)
    assert eng.wait_or_fail(1, 3, hf.monotonic_ns() + 1_000_000) == WAIT_FAILED_BY_ME
    assert seg.page[0] == STATUS_ROUND_FAILED and seg.page[1] == 3
    assert (seg.page[2:2 + seg.params.max_reqs] == 0).all()  # fail_zero_bytes covers ok_mask
    assert prx.taken(1) and prx.publish(1, np.zeros(seg.layout.reply.size, np.int32)) is False
    assert eng.fail(2, 1) == 1 and eng.fail(2, 1) == 0 and eng.fail(4, 1) == -1
    assert eng.wait_or_fail(4, 1, hf.monotonic_ns()) == WAIT_OUT_OF_ORDER
    assert eng.wait_or_fail(2, 1, hf.monotonic_ns()) == WAIT_PUBLISHED
    assert seg.word(Word.CLAIMED) == 2 and hf.cas(seg.mm, seg.layout.word_off(Word.CLAIMED), 2, 3)
    assert eng.wait_or_fail(3, 1, hf.monotonic_ns() + 500_000) == WAIT_CLAIMED_UNPUBLISHED
    assert prx.fail_all(3 + hostflag.FAR_AHEAD) is True
    assert eng.wait_published(10**6, 0.0) is True
    assert eng.read_page(10**6, np.zeros(4, np.int32)) == PAGE_NOT_THIS_ROUND


def test_rebase_moves_the_round_words_forward_only(seg):
    eng = HostFlags(seg)
    eng.rebase(100)
    assert eng.values() == {"gathered": 99, "claimed": 99, "published": 99, "consumed": 99}
    eng.rebase(50)
    assert eng.values() == {"gathered": 99, "claimed": 99, "published": 99, "consumed": 99}
    eng.raise_gathered(100)
    assert HostFlags(seg).publish(100, np.ones(seg.layout.reply.size, np.int32)) is True  # first round: t0


def test_adaptive_spin(monkeypatch):
    s = AdaptiveSpin(max_ns=50_000)
    if s.max_ns == 0:
        pytest.skip("one core: no spin at all (tested below)")
    assert s.spin_ns == 50_000
    for _ in range(20):
        s.update(1_000_000, True)  # slow answers: halve every time
    assert s.spin_ns == 0
    s.update(3_000, True)  # a quick one: back to twice it (at least 2 us)
    assert s.spin_ns == 6_000
    s.update(100, True)
    assert s.spin_ns == 6_000  # never shrinks on a quick answer
    s.update(40_000, True)
    assert s.spin_ns == 50_000  # capped
    s.update(10, False)  # a timeout counts as slow
    assert s.spin_ns == 25_000
    m = AdaptiveSpin(max_ns=50_000, min_ns=8_000)
    for _ in range(20):
        m.update(10**9, False)
    assert m.spin_ns == 8_000
    monkeypatch.setattr(hostflag, "spin_useful", lambda peer_pid=None: False)
    one = AdaptiveSpin(max_ns=50_000, min_ns=8_000)
    assert (one.max_ns, one.min_ns, one.spin_ns) == (0, 0, 0)
    one.update(100, True)
    assert one.spin_ns == 0


@pytest.mark.parametrize("side", ["proxy", "engine"])
@pytest.mark.parametrize("stamped", [True, False])
def test_the_spin_learns_when_the_answer_came_not_when_the_wait_woke(seg, side, stamped):
    """A wait that slept returns at its wake-up, tens of µs after the answer came in a VM (docs/performance.md,
    "Keeping the proxy's CPUs awake"): counted so, an answer that comes 10 µs into every wait keeps the
    spin at zero, and both sides then sleep and wake each other every round. The writers' stamps say
    when it came (gathered_ns before `gathered`, published_ns in publish), and the spin grows to twice
    that. A stamp older than the wait (an earlier round's, or no writer stamped) is not trusted: the
    wait's own length counts, as before. The waits learn in their C call (spin_learn); here the answer
    is stamped 5 ms into a real futex sleep and its word moves 30 ms in, with a 50 ms spin bound."""
    flags = HostFlags(seg)
    if flags.spin.max_ns == 0:
        pytest.skip("one core: no spin at all")
    flags.spin.max_ns, flags.spin.spin_ns = 50_000_000, 0  # no spin: the wait sleeps at once
    word, stamp = (Word.GATHERED, Word.GATHERED_NS) if side == "proxy" else (Word.PUBLISHED, Word.PUBLISHED_NS)
    if side == "engine":
        seg.set_word(Word.GATHERED, 1)
        assert hf.cas(seg.mm, seg.layout.word_off(Word.CLAIMED), 0, 1)  # the proxy's claim; its copy "takes" 30 ms
    start = [0]  # taken just before the wait (after the thread's start, which a busy machine delays)

    def answer() -> None:
        time.sleep(0.030)
        hf.store(seg.mm, seg.layout.word_off(stamp), start[0] + 5_000_000 if stamped else 1)
        seg.set_word(word, 1)  # (a store that wakes the sleeper)

    th = threading.Thread(target=answer)
    th.start()
    start[0] = hf.monotonic_ns()
    try:
        if side == "proxy":
            assert flags.wait_gathered(1, 5.0)
        else:
            assert flags.wait_or_fail(1, 1, hf.monotonic_ns() + 5 * 10**9) == WAIT_PUBLISHED
    finally:
        th.join(5)
    if stamped:  # 5 ms less the call's own start (µs after `start`, ms if preempted there), doubled
        assert 4_000_000 <= flags.spin.spin_ns <= 10_000_000, flags.spin.spin_ns
    else:  # at least 30 ms, doubled, capped at 50
        assert flags.spin.spin_ns >= 40_000_000, flags.spin.spin_ns


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-10, 10**9), st.booleans()), max_size=40),
       st.integers(0, 10**8), st.integers(0, 10**8), st.integers(0, 10**8))
def test_the_c_spin_rule_is_adaptive_spins(waits, spin, mx, mn):
    """The waits' C rule (spin_learn) gives the state AdaptiveSpin.update gives, wait after wait."""
    ref = AdaptiveSpin(max_ns=0)
    ref.state[:] = (min(spin, mx), mx, min(mn, mx))
    c = ref.state.copy()
    for waited, ok in waits:
        ref.update(waited, ok)
        hf.spin_learn(c, waited, ok)
        assert c.tolist() == ref.state.tolist()


def test_a_bad_spin_state_is_refused(seg):
    flags = HostFlags(seg)
    for bad in (np.zeros(2, np.int64), np.zeros(3, np.int32), np.zeros(4, np.int64)):
        with pytest.raises(ValueError, match="spin state"):
            hf.wait_ge(seg.mm, seg.layout.word_off(Word.GATHERED), 1, 0.0, 0, bad, -1)
        with pytest.raises(ValueError, match="spin state"):
            hf.spin_learn(bad, 1, True)
    with pytest.raises(ValueError, match="spin state"):
        hf.wait_or_fail(seg.mm, flags.words_off, flags.page_off, flags.zero_bytes, 1, 1, 0, 0, np.zeros(2, np.int64))


@contextlib.contextmanager
def _peer_on(cpu: int) -> Iterator[int]:
    """A child process pinned to `cpu`, blocked until the block ends (this thread's CPUs restored then);
    yields its pid, for the spin decisions' peer."""
    saved = os.sched_getaffinity(0)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(w)
            os.read(r, 1)  # until the parent closes its end
        finally:
            os._exit(0)
    os.close(r)
    try:
        os.sched_setaffinity(child, {cpu})
        yield child
    finally:
        os.sched_setaffinity(0, saved)
        os.close(w)
        os.waitpid(child, 0)


def _two_cores() -> tuple[int, int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two cores")
    return cpus[0], cpus[1]


def test_spin_useful_looks_at_both_processes():
    """Pinned to different cores each: spin (the best case); both on the same single core: never."""
    a, b = _two_cores()
    with _peer_on(b) as child:
        os.sched_setaffinity(0, {a})
        assert hostflag.spin_useful(child) is True  # each on its own core
        os.sched_setaffinity(0, {b})
        assert hostflag.spin_useful(child) is False  # sharing the one core
        assert hostflag.spin_useful(None) is False  # peer unknown and we are pinned to one core


def test_relook_follows_a_peer_re_pinned_after_the_decision():
    """The decision at construction is taken again by relook(): each transition (no spin -> spin -> no
    spin) restarts the spin from the new bound, and a look that changes nothing leaves what the waits
    learned alone."""
    a, b = _two_cores()
    with _peer_on(a) as child:
        os.sched_setaffinity(0, {a})
        spin = AdaptiveSpin(max_ns=80_000, min_ns=3_000, peer_pid=child)
        assert spin.state.tolist() == [0, 0, 0]  # one shared core: no spin
        assert spin.relook() is False
        os.sched_setaffinity(child, {b})  # the peer moves to a core of its own
        assert spin.relook() is True and spin.state.tolist() == [80_000, 80_000, 3_000]
        spin.update(10_000, True)
        spin.update(0, False)
        learned = spin.state.tolist()
        assert spin.relook() is False and spin.state.tolist() == learned  # nothing changed: kept
        os.sched_setaffinity(child, {a})  # back onto ours
        assert spin.relook() is True and spin.state.tolist() == [0, 0, 0]


@pytest.mark.parametrize("waiting_on", ["gathered", "published", "idle"])
def test_watcher_stop_wakes_its_wait_at_once(seg, waiting_on):
    """stop() ends the watcher's wait at once instead of at its end: the watchdog joins it before
    failing far ahead for a dead proxy, so a slow join delayed that release. Its waits: the nap between
    looks for a new round, the nap to a round's deadline, and once idle (0.1 s without a round) the
    futex on `gathered`."""
    flags = HostFlags(seg)
    took = []
    for _ in range(5):
        w = flags.watcher(seg.word(Word.GATHERED), int(60e9))  # a far deadline: never claims
        if waiting_on == "published":
            flags.raise_gathered(seg.word(Word.GATHERED) + 1, 1)
        time.sleep(0.15 if waiting_on == "idle" else 0.005)  # in its wait, far from its end
        t0 = time.perf_counter()
        w.stop()
        took.append(time.perf_counter() - t0)
        assert not w.running
    took.sort()
    assert took[2] < 0.02, f"stop() took {[round(x * 1e3, 2) for x in took]} ms"


def _sleepers(seg: Segment, word: int) -> int:
    return hf.load(seg.mm, seg.layout.word_off(word) + hf.SLEEPERS_OFF) & 0xFFFFFFFF


def test_the_watcher_sleeps_on_no_round_word_while_rounds_come(seg):
    """A sleeper on `gathered` or `published` makes every raise_gathered (the engine's enqueue) and every
    publish (the proxy's round) pay a FUTEX_WAKE, 7-10 µs each in this project's VM, twice a round on
    the hand-off's critical path: the watcher naps on a word of its own while rounds come. Idle (0.1 s
    without a new round), it sleeps on `gathered` again, and the next round's raise wakes it; it still
    claims a round left unpublished at its deadline."""
    eng, prx = HostFlags(seg), HostFlags(seg)
    delta_ns = int(200e6)  # (a deadline the 3 ms sleeps below cannot reach, even preempted)
    w = eng.watcher(seg.word(Word.GATHERED), delta_ns)
    try:
        page = np.zeros(seg.layout.reply.size, np.int32)
        for t in range(1, 4):
            eng.raise_gathered(t, 1)
            time.sleep(0.003)  # the watcher looks (at most every half deadline) and naps to the deadline
            assert _sleepers(seg, Word.GATHERED) == 0 and _sleepers(seg, Word.PUBLISHED) == 0
            assert prx.publish(t, page) is True
            eng.consume(t)
        time.sleep(0.03)  # round 3 published: naps between looks for round 4
        assert _sleepers(seg, Word.GATHERED) == 0 and _sleepers(seg, Word.PUBLISHED) == 0
        deadline = time.monotonic() + 2.0
        while _sleepers(seg, Word.GATHERED) != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _sleepers(seg, Word.GATHERED) == 1  # idle: on the futex of `gathered`
        t0 = hf.monotonic_ns()
        eng.raise_gathered(4, 1)  # nobody publishes it: the watcher claims it at its deadline
        deadline = time.monotonic() + 2.0
        while seg.word(Word.CLAIMED) < 4 and time.monotonic() < deadline:
            time.sleep(0.001)
        late_ms = (hf.monotonic_ns() - t0 - delta_ns) / 1e6
        assert seg.word(Word.CLAIMED) == 4 and seg.word(Word.PUBLISHED) == 4
        assert -1.0 < late_ms < LATE_MS, late_ms  # at its deadline, not before
        assert [(t, outcome) for t, outcome, *_ in w.drain()] == [(4, 2)]  # 2: claimed by the watcher
    finally:
        w.stop()
