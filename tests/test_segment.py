"""The segment's lifecycle and layout: create, attach, validate, reclaim, refuse, unlink; offsets and sizes.

Owners other than this process are real processes (forked, then SIGKILLed or left running), since
liveness is decided from /proc. The last test runs a small pytest session to prove that the run's
leak check (conftest.py) fails a run that leaves a segment behind.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import posix_ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_proxy.shm import hostflag as hf
from dspark_proxy.shm.layout import (
    CACHE_LINE,
    HEADER_BYTES,
    LAYOUT_VERSION,
    MAGIC,
    META_SLOTS,
    PAGE,
    SUPPORT_K,
    WORD_STRIDE,
    Layout,
    LayoutParams,
    ReplyPageLayout,
    State,
    Word,
    derive_sizes,
    header_name,
)
from dspark_proxy.shm.segment import (
    DEFAULT_NAME,
    LayoutMismatch,
    Segment,
    SegmentBusy,
    SegmentError,
    owner_alive,
    process_start_ticks,
    shm_name,
)

pytestmark = pytest.mark.timeout(60)

CTX = mp.get_context("fork")
SMALL = LayoutParams(max_reqs=4, num_spec=3, window=8, row_bytes=64, max_rows=32, resync_per_round=2)


def dev_shm(name: str) -> Path:
    return Path("/dev/shm") / shm_name(name).lstrip("/")


@contextlib.contextmanager
def created(name: str, p: LayoutParams = SMALL, deadline_ms: float = 5.0) -> Iterator[Segment]:
    seg = Segment.create(name, p, deadline_ms=deadline_ms)
    try:
        yield seg
    finally:
        seg.unlink()
        seg.close()


def _own_and_wait(name: str, ready, quit_) -> None:
    """A proxy stand-in in another process: create the segment, say so, wait to be told to go (or killed)."""
    seg = Segment.create(name, SMALL, deadline_ms=5.0)
    ready.send((seg.incarnation, os.getpid()))
    quit_.recv()
    seg.unlink()


@contextlib.contextmanager
def other_owner(name: str) -> Iterator[tuple[mp.Process, int]]:
    """A live process that owns `name`; yields (process, incarnation); killed and reaped on the way out."""
    ready_r, ready_w = CTX.Pipe(duplex=False)
    quit_r, quit_w = CTX.Pipe(duplex=False)
    p = CTX.Process(target=_own_and_wait, args=(name, ready_w, quit_r), daemon=True)
    p.start()
    try:
        assert ready_r.poll(20), "the owner process never created its segment"
        inc, pid = ready_r.recv()
        assert pid == p.pid
        yield p, inc
    finally:
        if p.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        p.join(5)


# ---------------------------------------------------------------------------------------------- names


def test_names_are_derived_in_one_place():
    assert shm_name(None) == f"/dspark-proxy.{DEFAULT_NAME}"
    assert shm_name("a-b_c.1") == "/dspark-proxy.a-b_c.1"
    for bad in ("", "a/b", "a b", "x" * 101, "..\0", "ü"):
        with pytest.raises(ValueError, match="segment name"):
            shm_name(bad)


# ---------------------------------------------------------------------------------------------- create / open


def test_create_writes_a_complete_header(seg_name):
    t0 = time.time_ns()
    with created(seg_name, deadline_ms=7.5) as seg:
        path = dev_shm(seg_name)
        st_ = path.stat()
        assert stat.S_IMODE(st_.st_mode) == 0o600
        assert st_.st_size == seg.layout.total_bytes
        h = seg.header
        assert int(h["magic"]) == MAGIC and int(h["layout_version"]) == LAYOUT_VERSION
        assert int(h["header_bytes"]) == HEADER_BYTES and int(h["total_bytes"]) == seg.layout.total_bytes
        for k in ("max_reqs", "num_spec", "window", "row_bytes", "max_rows", "resync_per_round"):
            assert int(h[header_name(k)]) == getattr(SMALL, k)
        assert int(h["max_slots"]) == SMALL.max_reqs  # the header keeps its on-disk name
        assert bool(h["sampled"]) is False and int(h["meta_rows"]) == SMALL.meta_rows == 4
        assert float(h["deadline_ms"]) == 7.5 == seg.deadline_ms
        assert int(h["owner_pid"]) == os.getpid()
        assert int(h["owner_start_ticks"]) == process_start_ticks(os.getpid()) > 0
        assert t0 <= int(h["start_time_ns"]) <= time.time_ns()
        assert seg.incarnation == int(h["incarnation"]) > 0
        assert seg.word(Word.STATE) == State.STARTING
        assert 0 < seg.word(Word.HEARTBEAT_NS) <= hf.monotonic_ns()
        for w in (Word.GATHERED, Word.CLAIMED, Word.PUBLISHED, Word.CONSUMED, Word.ATTACHED, Word.ABANDONED):
            assert seg.word(w) == 0
        assert seg.owner and seg.params == SMALL


def test_open_attaches_to_the_same_memory(seg_name):
    with created(seg_name) as seg:
        other = Segment.open(seg_name)
        try:
            assert not other.owner and other.incarnation == seg.incarnation and other.params == SMALL
            assert other.layout.regions == seg.layout.regions
            seg.staging[3, :4] = [1, 2, 3, 4]
            other.page[:3] = [7, 8, 9]
            seg.set_word(Word.GATHERED, 12)
            assert list(other.staging[3, :4]) == [1, 2, 3, 4] and list(seg.page[:3]) == [7, 8, 9]
            assert other.word(Word.GATHERED) == 12
            assert other.words()["gathered"] == 12 and set(other.words()) == set(Word.NAMES)
        finally:
            other.close()
        assert dev_shm(seg_name).exists()  # a non-owner's close never unlinks


def _attach_and_write(name: str) -> None:
    seg = Segment.open(name)
    seg.resync_req["count"] = 3
    seg.set_word(Word.ENGINE_PID, os.getpid())
    seg.close()


def test_open_from_another_process(seg_name):
    with created(seg_name) as seg:
        p = CTX.Process(target=_attach_and_write, args=(seg_name,))
        p.start()
        p.join(20)
        assert p.exitcode == 0
        assert seg.word(Word.ENGINE_PID) == p.pid and int(seg.resync_req["count"]) == 3


def test_views_sit_at_their_regions(seg_name):
    with created(seg_name) as seg:
        base = np.frombuffer(seg.mm, np.uint8).__array_interface__["data"][0]
        lay = seg.layout
        for view, region in ((seg.staging, "staging"), (seg.meta, "meta"), (seg.desc, "desc"),
                             (seg.windows, "resync_windows"), (seg.resync_req, "resync_req"),
                             (seg.page, "reply_page")):
            off, size = lay.regions[region]
            assert view.__array_interface__["data"][0] - base == off, region
            assert view.nbytes <= size, region
        assert seg.staging.shape == (SMALL.max_rows, SMALL.row_bytes)
        assert seg.meta.shape == (META_SLOTS,) and seg.desc.shape == (META_SLOTS,)
        assert seg.windows.shape == (SMALL.resync_per_round,)
        assert seg.page.shape == (lay.reply.size,) and seg.page.dtype == np.int32


# ---------------------------------------------------------------------------------------------- validation


def test_open_missing_says_what_to_run(seg_name):
    with pytest.raises(SegmentError, match=f"dspark-proxy start --name {seg_name}"):
        Segment.open(seg_name)


@pytest.mark.parametrize("field,value,message", [
    ("magic", 0x1234, "bad magic"),
    ("layout_version", LAYOUT_VERSION + 1, "layout version"),
    ("total_bytes", 1 << 30, "does not match its parameters"),
    ("max_slots", SMALL.max_reqs + 1, "does not match its parameters"),  # size no longer fits the params
    ("window", 0, "corrupt header"),
    ("resync_per_round", SMALL.max_reqs + 1, "corrupt header"),
])
def test_open_refuses_a_bad_header(seg_name, field, value, message):
    with created(seg_name) as seg:
        seg.header[field] = value
        with pytest.raises(SegmentError, match=message):
            Segment.open(seg_name)


def test_open_refuses_a_segment_smaller_than_its_header(seg_name):
    shm = posix_ipc.SharedMemory(shm_name(seg_name), posix_ipc.O_CREX, mode=0o600, size=100)
    shm.close_fd()
    with pytest.raises(SegmentError, match="smaller than its header"):
        Segment.open(seg_name)


@pytest.mark.parametrize("damage", ["magic", "version", "tiny", "empty"])
def test_create_reclaims_an_unreadable_leftover(seg_name, damage, monkeypatch):
    from dspark_proxy.shm import segment as segmod

    monkeypatch.setattr(segmod, "CREATING_GRACE_S", 0.0)  # old enough to be a leftover, not mid-create
    if damage in ("tiny", "empty"):
        shm = posix_ipc.SharedMemory(shm_name(seg_name), posix_ipc.O_CREX, size=100 if damage == "tiny" else 0)
        shm.close_fd()
    else:
        old = Segment.create(seg_name, SMALL, deadline_ms=5.0)
        old.header["magic" if damage == "magic" else "layout_version"] = 0
        old.close()
    with created(seg_name) as seg:
        again = Segment.open(seg_name)
        assert again.incarnation == seg.incarnation and again.params == SMALL
        again.close()


@pytest.mark.parametrize("field,expected", [
    ("max_reqs", 8), ("num_spec", 5), ("window", 16), ("row_bytes", 128), ("max_rows", 64),
    ("resync_per_round", 1), ("sampled", True),
])
def test_parameter_mismatch_names_the_field(seg_name, field, expected):
    with created(seg_name) as seg:
        with pytest.raises(LayoutMismatch) as ei:
            seg.check_params(**{field: expected})
        e = ei.value
        got = getattr(SMALL, field)
        assert e.field == field
        msg = str(e)
        assert field in msg and repr(got) in msg and repr(expected) in msg and seg_name in msg
        assert f"--{field.replace('_', '-')}" in msg  # says how to fix it
        seg.check_params(**{field: got})  # the right value passes
        seg.check_params(**{field: None})  # None: not checked


def test_parameter_check_reports_the_first_mismatch(seg_name):
    with created(seg_name) as seg:
        seg.check_params(max_reqs=4, num_spec=3, window=8, row_bytes=64, sampled=False)
        with pytest.raises(LayoutMismatch) as ei:
            seg.check_params(max_reqs=4, num_spec=9, window=99)
        assert ei.value.field == "num_spec"


# ---------------------------------------------------------------------------------------------- owners


def test_live_owner_is_refused(seg_name):
    with other_owner(seg_name) as (p, inc):
        with pytest.raises(SegmentBusy) as ei:
            Segment.create(seg_name, SMALL, deadline_ms=5.0)
        msg = str(ei.value)
        assert f"pid {p.pid}" in msg and f"dspark-proxy stop --name {seg_name}" in msg and "--name" in msg
        still = Segment.open(seg_name)  # refused without touching the owner's segment
        assert still.incarnation == inc and int(still.header["owner_pid"]) == p.pid
        still.close()


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_stale_segment_of_a_killed_owner_is_reclaimed(seg_name, reaped):
    with other_owner(seg_name) as (p, old_inc):
        os.kill(p.pid, signal.SIGKILL)
        if reaped:
            p.join(5)
        else:  # killed but not yet waited for: kill(pid, 0) still succeeds
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                with open(f"/proc/{p.pid}/stat", "rb") as f:
                    s = f.read()
                if s[s.rindex(b")") + 2:s.rindex(b")") + 3] == b"Z":
                    break
                time.sleep(0.005)
            else:
                pytest.fail("the killed owner never became a zombie")
        assert dev_shm(seg_name).exists()  # its segment was left behind
        with created(seg_name) as seg:
            assert seg.incarnation != old_inc and int(seg.header["owner_pid"]) == os.getpid()
            assert seg.word(Word.GATHERED) == 0  # a new segment, not the old one reinitialised


def test_a_reused_pid_is_not_the_owner(seg_name):
    """The owner is (pid, start ticks): a live process that merely has the pid does not keep it busy."""
    ppid = os.getppid()
    with created(seg_name) as first:
        first.header["owner_pid"] = ppid
        first.header["owner_start_ticks"] = process_start_ticks(ppid) + 1  # someone else, before a reboot
        with created(seg_name) as second:
            assert second.incarnation != first.incarnation
            second.header["owner_pid"] = ppid
            second.header["owner_start_ticks"] = process_start_ticks(ppid)  # really the live parent
            with pytest.raises(SegmentBusy, match=f"pid {ppid}"):
                Segment.create(seg_name, SMALL, deadline_ms=5.0)


def test_owner_alive():
    me = os.getpid()
    assert owner_alive(me, process_start_ticks(me))
    assert owner_alive(me, 0)  # no ticks recorded: a live pid is taken at its word
    assert not owner_alive(me, process_start_ticks(me) + 1)
    assert not owner_alive(0, 0) and not owner_alive(-5, 0)
    p = CTX.Process(target=time.sleep, args=(0,))
    p.start()
    p.join(5)
    assert not owner_alive(p.pid, 0)  # gone (reaped)
    assert process_start_ticks(p.pid) == 0


def test_create_in_the_same_process_replaces_its_own_leftover(seg_name):
    """A proxy restarted in-process (tests, the demo) is not refused by its own pid."""
    first = Segment.create(seg_name, SMALL, deadline_ms=5.0)
    try:
        with created(seg_name) as second:
            assert second.incarnation != first.incarnation
    finally:
        first.close()


# ---------------------------------------------------------------------------------------------- unlink


def test_exit_unlinks_for_the_owner_only(seg_name):
    with Segment.create(seg_name, SMALL, deadline_ms=5.0):
        with Segment.open(seg_name) as attached:
            assert attached.word(Word.GATHERED) == 0
        assert dev_shm(seg_name).exists()  # the attached side's exit leaves it
    assert not dev_shm(seg_name).exists()  # the owner's removes it
    with pytest.raises(SegmentError):
        Segment.open(seg_name)


def test_close_is_idempotent_and_keeps_the_name(seg_name):
    seg = Segment.create(seg_name, SMALL, deadline_ms=5.0)
    seg.close()
    seg.close()
    assert dev_shm(seg_name).exists()  # close() unmaps; unlink() is the separate, owner-only step
    seg.unlink()
    assert not dev_shm(seg_name).exists()
    seg.unlink()  # gone already: no error


def test_close_with_views_still_held(seg_name):
    code = f"""
from dspark_proxy.shm.segment import Segment
from dspark_proxy.shm.layout import LayoutParams
p = LayoutParams(max_reqs=4, num_spec=3, window=8, row_bytes=64, max_rows=32, resync_per_round=2)
seg = Segment.create({seg_name!r}, p, deadline_ms=5.0)
page, rows = seg.page, seg.staging[2]  # a caller keeps views
seg.unlink()
seg.close()  # must neither raise nor pull the memory from under those views
page[0] = 1
rows[:] = 7
assert page[0] == 1 and rows.sum() == 7 * 64
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "ok" in r.stdout, f"rc={r.returncode} (-11 = SIGSEGV) {r.stderr[-400:]}"


def test_unlink_never_removes_a_newer_incarnation(seg_name):
    old = Segment.create(seg_name, SMALL, deadline_ms=5.0)
    try:
        with created(seg_name) as new:  # a restart: the name now belongs to a new incarnation
            old.unlink()
            assert dev_shm(seg_name).exists()
            again = Segment.open(seg_name)
            assert again.incarnation == new.incarnation
            again.close()
            old.__exit__(None, None, None)  # the old owner's clean exit: still not the new one's name
            assert dev_shm(seg_name).exists()
    finally:
        old.close()
    assert not dev_shm(seg_name).exists()


# ---------------------------------------------------------------------------------------------- layout


layout_params = st.builds(
    lambda m, n, w, rb, rows_frac, r_frac, sampled: LayoutParams(
        max_reqs=m, num_spec=n, window=w, row_bytes=rb, max_rows=max(1, int(m * w * rows_frac)),
        resync_per_round=max(1, int(m * r_frac)), sampled=sampled),
    st.integers(1, 1024), st.integers(1, 16), st.integers(1, 512), st.integers(1, 80_000),
    st.floats(0, 1), st.floats(0, 1), st.booleans())

PAGE_ALIGNED = {"words", "reply_page", "staging", "meta", "resync_windows"}


@settings(deadline=None, max_examples=300)
@given(layout_params)
def test_regions_are_aligned_sized_and_disjoint(p):
    lay = Layout(p)
    table = lay.region_table()
    assert table[0] == ("header", 0, HEADER_BYTES)
    assert [n for n, _, _ in table] == ["header", "words", "reply_page", "staging", "meta", "desc", "resync_req",
                                        "resync_windows", "proxy_stats", "shim_stats"]
    end = 0
    for name, off, size in table:
        assert off >= end, f"{name} overlaps the region before it"
        assert off % (PAGE if name in PAGE_ALIGNED else CACHE_LINE) == 0, name
        assert size >= 0
        end = off + size
    assert lay.total_bytes >= end and lay.total_bytes % PAGE == 0
    r = lay.regions
    assert r["words"][1] == Word.COUNT * WORD_STRIDE
    assert r["reply_page"][1] == lay.reply.nbytes
    assert r["staging"][1] == p.max_rows * p.row_bytes
    assert r["meta"][1] == META_SLOTS * lay.meta_dtype.itemsize
    assert r["desc"][1] == META_SLOTS * lay.desc_dtype.itemsize
    assert r["resync_windows"][1] == p.resync_per_round * lay.window_dtype.itemsize
    # each word alone on its 128-byte range; every slot on whole cache lines, stamps 8-aligned
    assert all(lay.word_off(i) % WORD_STRIDE == 0 for i in range(Word.COUNT))
    for dt in (lay.meta_dtype, lay.desc_dtype, lay.window_dtype, lay.resync_req_dtype):
        assert dt.itemsize % CACHE_LINE == 0
    for dt in (lay.meta_dtype, lay.desc_dtype):
        assert dt.fields["stamp_start"][1] == 0 and dt.fields["stamp_end"][1] % 8 == 0
        assert dt.fields["stamp_end"][1] + 8 <= dt.itemsize
    assert lay.window_dtype.fields["rows"][1] % CACHE_LINE == 0
    assert lay.window_dtype.fields["rows"][0].shape == (p.window, p.row_bytes)
    for t in (0, 1, 63, 64, 65, 10**9):
        assert lay.meta_off(t) == r["meta"][0] + (t % META_SLOTS) * lay.meta_dtype.itemsize
        assert lay.desc_off(t) == r["desc"][0] + (t % META_SLOTS) * lay.desc_dtype.itemsize
        assert lay.meta_off(t) % CACHE_LINE == 0 and lay.desc_off(t) % CACHE_LINE == 0
    assert lay.meta_off(64) == lay.meta_off(0)
    meta_end = r["meta"][0] + r["meta"][1]
    assert lay.meta_off(63) + lay.meta_dtype.itemsize == meta_end


@settings(deadline=None, max_examples=200)
@given(st.integers(1, 2048), st.integers(1, 16), st.booleans())
def test_reply_layout_formula(m, n, sampled):
    r = ReplyPageLayout(m, n, sampled)
    base = 2 + m + 2 * m * n
    assert (r.o_ok, r.o_ids, r.o_conf) == (2, 2 + m, 2 + m + m * n)
    assert r.size == (base + m + 2 * m * n * SUPPORT_K if sampled else base)
    assert r.nbytes == 4 * r.size and r.fail_zero_bytes == 4 * m  # a failed page zeroes ok_mask exactly
    if sampled:
        assert (r.o_sample_mask, r.o_qids, r.o_q) == (base, base + m, base + m + m * n * SUPPORT_K)


@pytest.mark.parametrize("m,n,w,rb,budget_mb,expected", [
    (256, 5, 128, 71_680, 256, (3744, 29)),  # docs/deploy.md's realistic shape: the budget decides both
    (8, 5, 16, 64, 256, (128, 8)),  # small rows: every row of every window fits; every slot resyncs
    (16, 5, 128, 71_680, 1, (96, 4)),  # tiny budget: one decode round M*(N+1) and 4 windows at least
    (2, 5, 128, 71_680, 1, (14, 2)),  # ... but never more windows than slots (1 MiB / 70 KiB = 14 rows)
    (1024, 7, 128, 71_680, 256, (8192, 29)),
])
def test_derive_sizes_examples(m, n, w, rb, budget_mb, expected):
    assert derive_sizes(m, n, w, rb, budget_mb) == expected


@settings(deadline=None, max_examples=300)
@given(st.integers(1, 4096), st.integers(1, 16), st.integers(1, 512), st.integers(1, 200_000),
       st.floats(0.001, 4096))
def test_derive_sizes_formula(m, n, w, rb, budget_mb):
    rows, r = derive_sizes(m, n, w, rb, budget_mb)
    budget = int(budget_mb * 1024 * 1024)
    assert rows == min(m * w, max(m * (n + 1), budget // rb))
    assert r == min(m, max(4, budget // (w * rb)))
    assert 1 <= rows <= m * w and 1 <= r <= m
    LayoutParams(max_reqs=m, num_spec=n, window=w, row_bytes=rb, max_rows=rows, resync_per_round=r)


@pytest.mark.parametrize("field,value", [
    ("max_reqs", 0), ("num_spec", 0), ("num_spec", 256), ("window", 0), ("row_bytes", 0),
    ("max_rows", 0), ("resync_per_round", 0), ("max_reqs", 1.5),
])
def test_layout_params_are_validated(field, value):
    kw = dict(max_reqs=4, num_spec=3, window=8, row_bytes=64, max_rows=32, resync_per_round=2)
    kw[field] = value
    with pytest.raises(ValueError, match=field):
        LayoutParams(**kw)


def test_more_resync_windows_than_slots_is_refused():
    with pytest.raises(ValueError, match="resync_per_round=5 > max_reqs=4"):
        LayoutParams(max_reqs=4, num_spec=3, window=8, row_bytes=64, max_rows=32, resync_per_round=5)


def test_sampled_segment_carries_its_extra_metadata(seg_name):
    p = LayoutParams(max_reqs=4, num_spec=3, window=8, row_bytes=64, max_rows=32, resync_per_round=2,
                     sampled=True)
    with created(seg_name, p) as seg:
        assert bool(seg.header["sampled"]) and int(seg.header["meta_rows"]) == 6
        assert seg.page.size == ReplyPageLayout(4, 3, True).size
        other = Segment.open(seg_name)
        assert other.params == p
        other.close()


# ---------------------------------------------------------------------------------------------- the run's leak check

_LEAKY_TESTS = '''
import multiprocessing as mp
import os
import posix_ipc


def test_fixture_names_are_cleaned(seg_name):
    posix_ipc.SharedMemory("/dspark-proxy." + seg_name, posix_ipc.O_CREX, size=4096).close_fd()


def test_leaks_one_in_process():
    posix_ipc.SharedMemory("/dspark-proxy." + os.environ["LEAK_A"], posix_ipc.O_CREX, size=4096).close_fd()


def _child():
    posix_ipc.SharedMemory("/dspark-proxy." + os.environ["LEAK_B"], posix_ipc.O_CREX, size=4096).close_fd()


def test_leaks_one_in_a_forked_child():
    p = mp.get_context("fork").Process(target=_child)
    p.start()
    p.join(10)
    assert p.exitcode == 0
'''


def _sub_pytest(tmp_path: Path, tests: str, env: dict) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (tmp_path / "test_leaky.py").write_text(tests)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, env={**os.environ, **env})


def test_session_fails_loudly_on_a_leaked_segment(tmp_path, make_seg_name):
    a, b = make_seg_name("leak-a"), make_seg_name("leak-b")  # ours to clean if the check does not
    r = _sub_pytest(tmp_path, _LEAKY_TESTS, {"LEAK_A": a, "LEAK_B": b})
    out = r.stdout + r.stderr
    assert "3 passed" in out, out
    assert r.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "LEAKED SHARED MEMORY" in out and f"dspark-proxy.{a}" in out and f"dspark-proxy.{b}" in out
    assert out.count("/dev/shm/dspark-proxy.") == 2  # the fixture's segment was not a leak
    assert not dev_shm(a).exists() and not dev_shm(b).exists()  # and the check removed what leaked


def test_session_passes_when_nothing_leaks(tmp_path):
    r = _sub_pytest(tmp_path, "def test_ok(seg_name):\n    assert seg_name\n", {})
    assert r.returncode == 0 and "LEAKED" not in r.stdout, r.stdout + r.stderr


def test_a_segment_being_created_is_not_reclaimed(seg_name, monkeypatch):
    """No magic yet and young: another proxy is creating it (its header comes magic-last): refuse,
    never unlink it from under that proxy. Old and headerless: a leftover, reclaimed."""
    import posix_ipc

    from dspark_proxy.shm import segment as segmod
    from dspark_proxy.shm.segment import SegmentBusy, shm_name

    shm = posix_ipc.SharedMemory(shm_name(seg_name), posix_ipc.O_CREX, mode=0o600, size=8192)
    shm.close_fd()
    with pytest.raises(SegmentBusy, match="being created"):
        Segment.create(seg_name, SMALL, deadline_ms=5.0)
    assert dev_shm(seg_name).exists()
    monkeypatch.setattr(segmod, "CREATING_GRACE_S", 0.0)
    seg = Segment.create(seg_name, SMALL, deadline_ms=5.0)
    try:
        assert Segment.open(seg_name).incarnation == seg.incarnation
    finally:
        seg.unlink()
        seg.close()


def test_the_segment_has_all_its_pages_from_the_start(seg_name):
    """tmpfs gives a page on first touch; a /dev/shm too small for the segment would SIGBUS whoever
    touches a missing page first (the engine as likely as the proxy). create() reserves them all."""
    with created(seg_name) as seg:
        st_ = dev_shm(seg_name).stat()
        assert st_.st_blocks * 512 >= seg.layout.total_bytes  # allocated, not only sized


def test_too_little_shared_memory_is_a_clear_error_at_create(seg_name, monkeypatch):
    import errno

    def no_space(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(SegmentError, match=r"needs .* MiB of shared memory and /dev/shm has .*--shm-size"):
        Segment.create(seg_name, SMALL, deadline_ms=5.0)
    assert not dev_shm(seg_name).exists()  # nothing left behind
