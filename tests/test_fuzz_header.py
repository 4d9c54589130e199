"""Fuzzing the engine side's validation of a segment header (docs/guarantees.md):
random and mutated headers make Segment.open and engine_shim.attach either accept the segment (the
damage missed what they check) or raise SegmentError / LayoutMismatch with a message; nothing else
escapes, nothing hangs, and the watchdog's search for a proxy never offers a segment whose parameters
are not the engine's."""

from __future__ import annotations

import numpy as np
import posix_ipc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import engine_shim
from dspark_proxy.shm.layout import HEADER_BYTES, HEADER_DTYPE, LayoutParams, State, Word
from dspark_proxy.shm.segment import LayoutMismatch, Segment, SegmentError
from engine_shim.shim import Shim
from tests.conftest import new_segment_name

pytestmark = pytest.mark.timeout(120)

M, N, W, B = 8, 3, 4, 16
PARAMS = LayoutParams(max_reqs=M, num_spec=N, window=W, row_bytes=B, max_rows=M * W, resync_per_round=2)
ENGINE = dict(max_reqs=M, num_spec=N, window=W, row_bytes=B)
FIELDS = [(name, HEADER_DTYPE.fields[name][1], HEADER_DTYPE.fields[name][0].itemsize) for name in HEADER_DTYPE.names]
EXTREMES = [0, 1, 2, 0xFF, 0xFFFF, 1 << 16, 1 << 20, 1 << 26, (1 << 26) + 1, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF,
            0x7FFF_FFFF_FFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF]


def fuzz(n: int) -> settings:
    return settings(deadline=None, max_examples=n, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def header_damage(draw):
    ops = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["field", "field", "byte", "flip", "block"]))
        if kind == "field":
            name, off, size = draw(st.sampled_from(FIELDS))
            ops.append(("field", off, size, draw(st.sampled_from(EXTREMES))))
        elif kind == "byte":
            ops.append(("byte", draw(st.integers(0, HEADER_DTYPE.itemsize - 1)), 1, draw(st.integers(0, 255))))
        elif kind == "flip":
            ops.append(("flip", draw(st.integers(0, HEADER_DTYPE.itemsize - 1)), 1, draw(st.integers(0, 7))))
        else:
            ops.append(("block", draw(st.integers(0, HEADER_BYTES - 1)), 0, draw(st.binary(min_size=1, max_size=160))))
    return ops


def _apply(hdr: np.ndarray, ops: list) -> None:
    for kind, off, size, v in ops:
        if kind == "field":
            hdr[off:off + size] = np.frombuffer((v & ((1 << (8 * size)) - 1)).to_bytes(size, "little"), np.uint8)
        elif kind == "byte":
            hdr[off] = v
        elif kind == "flip":
            hdr[off] ^= 1 << v
        else:
            chunk = np.frombuffer(v, np.uint8)[: HEADER_BYTES - off]
            hdr[off:off + chunk.shape[0]] = chunk


def _check_engine_side(name: str) -> str:
    """Open, attach and the watchdog's look, on whatever the header now says; returns the outcome."""
    outcome = "opened"
    try:
        seg = Segment.open(name)
    except SegmentError as e:
        assert str(e), "a SegmentError without a message"
        outcome = type(e).__name__
    else:
        seg.close()
    try:
        shim = engine_shim.attach(name, **ENGINE)
    except LayoutMismatch as e:
        assert e.field and e.field in str(e)
        return outcome + "/mismatch"
    except SegmentError as e:
        assert str(e)
        return outcome + "/refused"
    try:
        # the watchdog thread's search, run here: offers only a segment with the engine's parameters
        shim.watchdog._look_for_proxy()
        pending = shim._att.pending
        if pending is not None:
            p = pending.params
            assert (p.max_reqs, p.num_spec, p.window, p.row_bytes) == (M, N, W, B)
    finally:
        shim.close()
    return outcome + "/attached"


def _drop(seg: Segment) -> None:
    """Unlink by name: Segment.unlink() re-opens the segment to compare incarnations, which a damaged
    header refuses."""
    try:
        posix_ipc.unlink_shared_memory(seg.shm_name)
    except posix_ipc.ExistentialError:
        pass
    seg.close()


def _make(name: str) -> Segment:
    seg = Segment.create(name, PARAMS, deadline_ms=50.0)
    seg.set_word(Word.STATE, State.READY)
    return seg


@fuzz(400)
@given(header_damage())
def test_mutated_header(ops):
    name = new_segment_name("fuzzhdr")
    seg = _make(name)
    try:
        hdr = np.ndarray((HEADER_BYTES,), np.uint8, buffer=seg.mm, offset=0)
        _apply(hdr, ops)
        event(_check_engine_side(name))
    finally:
        _drop(seg)


@fuzz(150)
@given(st.binary(min_size=0, max_size=HEADER_BYTES))
def test_random_header(data):
    name = new_segment_name("fuzzhdr")
    seg = _make(name)
    try:
        hdr = np.ndarray((HEADER_BYTES,), np.uint8, buffer=seg.mm, offset=0)
        hdr[: len(data)] = np.frombuffer(data, np.uint8)
        outcome = _check_engine_side(name)
        if len(data) >= 8 and data[:8] != seg.header["magic"].tobytes():
            assert outcome.startswith("SegmentError")
    finally:
        _drop(seg)


def test_truncated_segment_is_refused(seg_name):
    """A segment smaller than its header (a creator caught mid-ftruncate) is refused with a message."""
    from dspark_proxy.shm.segment import shm_name

    shm = posix_ipc.SharedMemory(shm_name(seg_name), posix_ipc.O_CREX, mode=0o600, size=100)
    shm.close_fd()
    try:
        with pytest.raises(SegmentError, match="smaller than its header"):
            Segment.open(seg_name)
        shim = engine_shim.attach(seg_name, **ENGINE)  # the engine starts detached, never fails
        try:
            shim.watchdog._look_for_proxy()
            assert shim._att.pending is None
        finally:
            shim.close()
    finally:
        posix_ipc.unlink_shared_memory(shm_name(seg_name))


def test_mismatch_names_the_field(seg_name):
    seg = _make(seg_name)
    try:
        with pytest.raises(LayoutMismatch, match="window") as ei:
            engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W * 2, row_bytes=B)
        assert ei.value.field == "window"
        shim = Shim(seg_name, max_reqs=M, num_spec=N, window=W * 2, row_bytes=B, start_watchdog=False)
        try:
            shim.watchdog._look_for_proxy()
            assert shim._att.pending is None and shim.counters.counter("attach_mismatch") == 1
        finally:
            shim.close()
    finally:
        seg.unlink()
        seg.close()


@pytest.mark.parametrize("pid", [1 << 31, (1 << 32) + 3032, (1 << 63) - 1, -5])
def test_owner_pid_outside_pid_t(seg_name, pid):
    """Found by test_mutated_header: an owner_pid beyond pid_t made os.kill raise OverflowError out of
    owner_alive(), so attach() raised, the watchdog's ticks failed, `status` crashed and the proxy could
    not reclaim the segment. Such a pid belongs to nobody."""
    from dspark_proxy.ops.status import read_status
    from dspark_proxy.shm.segment import owner_alive

    assert owner_alive(pid, 0) is False
    seg = _make(seg_name)
    try:
        seg.header["owner_pid"] = pid
        shim = engine_shim.attach(seg_name, **ENGINE)
        try:
            shim.watchdog._look_for_proxy()  # a dead owner: not offered
            assert shim._att.pending is None
            assert shim.watchdog._proxy_lost(seg) == "proxy_dead"
        finally:
            shim.close()
        assert read_status(seg_name)["header"]["owner_alive"] is False
        fresh = Segment.create(seg_name, PARAMS, deadline_ms=50.0)  # the stale segment is reclaimed
        try:
            assert fresh.incarnation != seg.incarnation
        finally:
            fresh.unlink()
            fresh.close()
    finally:
        seg.close()


@fuzz(200)
@given(st.lists(st.tuples(st.sampled_from(list(range(Word.COUNT))), st.sampled_from(EXTREMES + [3, 1 << 40])),
                min_size=1, max_size=6))
def test_mutated_words(words):
    """Any values in the segment's words (a proxy that died mid-write, or a stray writer): the watchdog's
    look and its liveness check, and `status`, answer without raising."""
    from dspark_proxy.ops.status import read_status

    name = new_segment_name("fuzzwords")
    seg = _make(name)
    try:
        for w, v in words:
            seg.set_word(w, v & 0xFFFF_FFFF_FFFF_FFFF)
        shim = engine_shim.attach(name, **ENGINE)
        try:
            shim.watchdog._look_for_proxy()
            why = shim.watchdog._proxy_lost(seg)
            assert why is None or isinstance(why, str)
        finally:
            shim.close()
        st_ = read_status(name)
        assert set(st_) >= {"header", "words"}
    finally:
        _drop(seg)
