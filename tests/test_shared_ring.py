"""The engine's shared ring (shm/ring_shm.py, ring_rows.py): a round's rows cross the engine side once.

- enqueue writes the rows into the ring only (the staging stays untouched) and the header names the ring;
- the proxy sends large rows as views of the ring (no copy of its own) and small ones gathered;
- the C runs and their reference give the same views (differential, hypothesis);
- a round the watchdog claims while the proxy is still sending from the ring marks every slot dirty, and
  every draft after it is right;
- a /dev/shm that cannot hold the ring gives a clear error, and the engine keeps a private ring.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_proxy import native
from dspark_proxy.round.ring_rows import GATHER_BELOW, RingRows
from dspark_proxy.shm import ring_shm
from dspark_proxy.shm.hostflag import HostFlags
from dspark_proxy.shm.layout import STATUS_ROUND_FAILED
from tests.rig import Rig, row_of

BIG = GATHER_BELOW  # rows this large go out as views of the ring


def _ring_bytes(rig: Rig) -> np.ndarray:
    return rig.shim.ring.rows.reshape(-1)


@pytest.mark.parametrize("kind", ["memfd", "named"])
def test_enqueue_writes_rows_once_into_the_named_ring(seg_name, monkeypatch, kind):
    monkeypatch.setenv("DSPARK_SHARED_RING", "1" if kind == "memfd" else "named")
    with Rig(seg_name, M=4, N=3, W=4, B=64) as rig:
        reply, b = rig.round([(1, 0, 3), (2, 1, 2)])
        assert reply.status == 0 and rig.check_drafts(reply, b) == 2
        name = ring_shm.read_ring_name(rig.seg.mm)
        assert name == rig.shim._shared.shm_name and rig.shim._shared.kind == kind
        path = name if kind == "memfd" else "/dev/shm" + name
        if kind == "memfd":
            assert name == f"/proc/{os.getpid()}/fd/{rig.shim._shared.fd}"
        else:
            assert name.startswith(f"/dspark-ring.{seg_name}.{os.getpid()}.")
        assert os.path.exists(path)
        assert not rig.seg.staging.any(), "rows were copied into the staging as well"
        assert np.array_equal(rig.shim.ring.window_rows(0, 0, 3), b["rows"][:3])
        assert np.array_equal(rig.client.sent_rows[-1], b["rows"])  # the proxy sent them from the ring
    assert not os.path.exists(path), "close() leaves the ring behind"


def test_private_ring_when_switched_off(seg_name, monkeypatch):
    monkeypatch.setenv("DSPARK_SHARED_RING", "0")
    with Rig(seg_name, M=4, N=3, W=4, B=64) as rig:
        reply, b = rig.round([(1, 0, 3), (2, 1, 2)])
        assert reply.status == 0 and rig.check_drafts(reply, b) == 2
        assert ring_shm.read_ring_name(rig.seg.mm) == ""
        assert np.array_equal(rig.seg.staging[:5], b["rows"])  # the old path: staged, sent from the staging


def test_large_rows_go_out_as_views_of_the_ring(seg_name):
    with Rig(seg_name, M=4, N=3, W=4, B=BIG) as rig:
        seen = []
        inner = rig.client.step

        def spy(prefix, entries, n_rows, **kw):
            seen.append(list(kw["rows"]))
            return inner(prefix, entries, n_rows, **kw)

        rig.client.step = spy
        for _ in range(2):  # slot 0 wraps in round 2 (W = 4): its entry is two runs of its block
            reply, b = rig.round([(1, 0, 3), (2, 2, 1)])
            assert reply.status == 0 and rig.check_drafts(reply, b) == 2
            assert np.array_equal(rig.client.sent_rows[-1], b["rows"])
        ring = rig.core.ring_rows.rows.view(np.uint8)
        for parts in seen:
            for v in parts:
                assert isinstance(v, memoryview)
                assert np.shares_memory(np.frombuffer(v, np.uint8), ring), "a row was copied before sending"
        assert len(seen[-1]) == 3  # slot 0's positions 3 | 4, 5 (ring rows 3 | 0, 1), slot 2's one row


def _enqueue_next(rig: Rig, reqs: list) -> tuple[int, dict, object]:
    """The engine enqueues the next round (not yet handled): (t, its batch, the client's own step)."""
    b_t = rig.batch(reqs)
    rig.t += 1
    rig.shim.enqueue(rig.t, **b_t)
    return rig.t, b_t, rig.client.step


def _handle_while_the_engine_moves_on(rig: Rig, t: int, inner, how) -> dict:
    """Round t handled while, inside its STEP and before its rows go out, the engine gets round t's
    reply (`how`: by the watchdog's claim, or published) and enqueues t + 1, in which request 1 sends
    W rows: one of them lands on the ring row of its round-t position. The batch of t + 1."""
    nxt: dict = {}

    def engine_moves_on(prefix, entries, n_rows, **kw):
        how()
        nxt["b"] = rig.batch([(1, 0, 4), (2, 1, 1), (3, 2, 1)])
        rig.shim.enqueue(t + 1, **nxt["b"])
        return inner(prefix, entries, n_rows, **kw)

    rig.client.step = engine_moves_on
    try:
        rig.core.handle(t, 0.0)
    finally:
        rig.client.step = inner
    return nxt["b"]


def _right_after(rig: Rig, reqs: list, b_next: dict) -> None:
    """Round t + 1 (already enqueued as b_next) and 8 more: every draft given is right, and by then
    every request gets them."""
    rig.t += 1
    rig.core.handle(rig.t, 0.0)
    reply = rig.shim.read_reply(rig.t)
    assert rig.check_drafts(reply, b_next) == int(reply.ok_mask.sum())
    for _ in range(8):
        reply, b = rig.round(reqs)
        assert rig.check_drafts(reply, b) == int(reply.ok_mask.sum())
    assert reply.ok_mask.all()


def _stub(ring: np.ndarray, M: int, W: int, B: int) -> RingRows:
    """A RingRows over a plain array (the reference's state only: no segment needed)."""
    rr = RingRows.__new__(RingRows)
    rr.M, rr.W, rr.B, rr._base, rr._ring_u8 = M, W, B, memoryview(ring), ring
    rr._row_t = np.dtype((np.void, B))
    rr.rows = ring.view(rr._row_t)
    rr._j = np.arange(M * W, dtype=np.int64)
    rr._gather = None
    return rr


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_ring_runs_and_gather_native_match_reference(data):
    M = data.draw(st.integers(1, 6))
    W = data.draw(st.integers(1, 9))
    B = data.draw(st.integers(1, 24))
    k = data.draw(st.integers(0, M))  # a round names each slot at most once
    slots = np.array(data.draw(st.lists(st.integers(0, M - 1), min_size=k, max_size=k, unique=True)), np.int64)
    first = np.array(data.draw(st.lists(st.integers(-2**62, 2**62), min_size=k, max_size=k)), np.int64)
    n_rows = np.array(data.draw(st.lists(st.integers(0, W), min_size=k, max_size=k)), np.int64)
    ring = np.random.default_rng(k).integers(0, 256, M * W * B, dtype=np.uint8)
    rr = _stub(ring, M, W, B)
    ref = [bytes(v) for v in rr.runs(slots, first, n_rows)]
    got = [bytes(v) for v in native.fastround.ring_runs(memoryview(ring), slots, first, n_rows, W, B)]
    assert got == ref
    # and the bytes are each entry's positions in order
    want = b"".join(ring[(s * W + (f + j) % W) * B:(s * W + (f + j) % W + 1) * B].tobytes()
                    for s, f, c in zip(slots.tolist(), first.tolist(), n_rows.tolist(), strict=True) for j in range(c))
    assert b"".join(got) == want
    out = np.full(M * W * B + 7, 0xEE, np.uint8)
    k = native.fastround.ring_gather(ring, slots, first, n_rows, W, B, out)
    assert k == int(n_rows.sum())
    assert out[:k * B].tobytes() == rr.gather(slots, first, n_rows).tobytes() == want
    assert (out[k * B:] == 0xEE).all(), "the gather wrote past its rows"


def test_ring_runs_refuse_what_is_outside_the_ring():
    ring = np.zeros(2 * 4 * 8, np.uint8)
    rr = _stub(ring, 2, 4, 8)
    out = np.zeros(ring.shape[0], np.uint8)
    for slots, n in (([2], [1]), ([-1], [1]), ([0], [5]), ([0], [-1])):
        s, f, c = np.array(slots, np.int64), np.zeros(1, np.int64), np.array(n, np.int64)
        with pytest.raises(ValueError):
            native.fastround.ring_runs(memoryview(ring), s, f, c, 4, 8)
        with pytest.raises(ValueError):
            rr.runs(s, f, c)
        with pytest.raises(ValueError):
            native.fastround.ring_gather(ring, s, f, c, 4, 8, out)
        with pytest.raises(ValueError):
            rr.gather(s, f, c)
    with pytest.raises(ValueError):  # more rows than `out` holds
        native.fastround.ring_gather(ring, np.zeros(1, np.int64), np.zeros(1, np.int64), np.full(1, 4), 4, 8,
                                     out[:31])


def test_watchdog_claim_while_sending_from_the_ring_marks_every_slot_dirty(seg_name):
    """The engine rewrites ring rows only in enqueue(t + 1), after t is claimed. Here the watchdog
    claims t and the engine enqueues t + 1 while the proxy's STEP for t is still going out from views
    of the ring: the worker gets t + 1's bytes for some of t's rows (torn, shown below). The proxy's
    publish of t loses, so it marks every slot dirty, and every draft after that is right."""
    with Rig(seg_name, M=4, N=3, W=4, B=BIG) as rig:
        reqs = [(1, 0, 1), (2, 1, 1), (3, 2, 1)]
        for _ in range(4):
            reply, b = rig.round(reqs)
            assert rig.check_drafts(reply, b) == 3
        flags = HostFlags(rig.seg)
        t, b_t, inner = _enqueue_next(rig, reqs)

        def claimed() -> None:
            assert flags.fail(t, 3) == 1  # the watchdog claims t mid-send
            assert rig.shim.read_reply(t).status == STATUS_ROUND_FAILED

        b_next = _handle_while_the_engine_moves_on(rig, t, inner, claimed)
        sent = rig.client.sent_rows[-1]
        assert not np.array_equal(sent[0], b_t["rows"][0]), "the race did not happen: nothing was torn"
        assert np.array_equal(sent[0], row_of(1, int(b_t["first_pos"][0]) + 4, rig.B))  # t + 1's row
        assert rig.core.slots.dirty.all()
        assert rig.stats.counter("watchdog_preempted") == 1
        _right_after(rig, reqs, b_next)


def test_no_room_for_the_ring_is_a_clear_error_and_the_engine_keeps_a_private_ring(seg_name, monkeypatch):
    def no_room(fd, off, size):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_room)
    with pytest.raises(ring_shm.RingError, match="/dev/shm has .*DSPARK_SHARED_RING=0"):
        ring_shm.SharedRing(seg_name, 4096)
    assert not glob.glob(f"/dev/shm/dspark-ring.{seg_name}.*"), "a ring left behind"
    monkeypatch.undo()

    def refuse(fd, size, name):
        raise ring_shm.RingError(f"the engine's row ring {name} needs more than /dev/shm has")

    monkeypatch.setattr(ring_shm, "_reserve", refuse)
    with Rig(seg_name, M=4, N=3, W=4, B=64) as rig:  # the Rig's segment is made before the shim's ring
        assert rig.shim.counters.counter("shared_ring_refused") == 1
        reply, b = rig.round([(1, 0, 3)])
        assert reply.status == 0 and rig.check_drafts(reply, b) == 1
        assert ring_shm.read_ring_name(rig.seg.mm) == ""


def test_a_forked_child_closing_leaves_the_parents_ring(seg_name):
    ring = ring_shm.SharedRing(seg_name, 4096, kind="named")
    try:
        pid = os.fork()
        if pid == 0:  # the child: close what it inherited, then leave without running anything else
            ring.close()
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.path.exists("/dev/shm" + ring.shm_name)
    finally:
        ring.close()
    assert not os.path.exists("/dev/shm" + ring.shm_name)


def test_two_shims_of_one_name_in_one_process_have_rings_of_their_own(seg_name):
    a = ring_shm.SharedRing(seg_name, 4096, kind="named")
    b = ring_shm.SharedRing(seg_name, 4096, kind="named")
    try:
        assert a.shm_name != b.shm_name
        a.array[:] = 1
        b.array[:] = 2
        a.close()
        assert os.path.exists("/dev/shm" + b.shm_name) and (b.array == 2).all()
    finally:
        a.close()
        b.close()
    assert not glob.glob(f"/dev/shm/dspark-ring.{seg_name}.*")


def test_stale_rings_of_dead_engines_are_removed_and_names_checked(seg_name):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # a pid that is gone
    stale = f"/dev/shm/dspark-ring.{seg_name}.{pid}.0"
    longer = f"/dev/shm/dspark-ring.{seg_name}.x.{pid}.0"  # another name's ring: left alone
    for p in (stale, longer):
        with open(p, "wb") as f:
            f.write(b"\0" * 64)
    try:
        ring = ring_shm.SharedRing(seg_name, 4096)
        ring.close()
        assert not os.path.exists(stale) and os.path.exists(longer)
    finally:
        for p in (stale, longer):
            if os.path.exists(p):
                os.unlink(p)
    assert ring_shm.read_ring_name(bytearray(4096)) == ""
    page = bytearray(4096)
    for bad in ("/dspark-proxy.x", "/dspark-ring.a.1", "/dspark-ring.a/../b.1.2", "/dspark-ring.a.1.2 "):
        ring_shm.write_ring_name(page, bad)
        assert ring_shm.read_ring_name(page) == "", bad
    ring_shm.write_ring_name(page, "/dspark-ring.a.1.2")
    assert ring_shm.read_ring_name(page) == "/dspark-ring.a.1.2"


def test_the_proxys_segment_keeps_no_rows_by_default_and_a_private_ring_engine_says_so(seg_name, monkeypatch):
    import engine_shim
    from dspark_proxy.bench.rig import RoundRig
    from dspark_proxy.config import ProxyConfig
    from dspark_proxy.proxy import layout_params
    from dspark_proxy.shm.layout import Layout, LayoutParams, State, Word
    from dspark_proxy.shm.segment import LayoutMismatch, Segment
    from tests.rig import ScriptedClient

    p = layout_params(ProxyConfig(max_reqs=256, num_spec=5, window=128, row_bytes=71680))
    lay = Layout(p)
    assert not p.segment_rows and lay.regions["staging"][1] == 0
    assert lay.regions["resync_windows"][1] == p.resync_per_round * 64  # the records alone
    assert lay.total_bytes < 2 << 20  # 1.1 MB, where the staging and the windows made it 511 MiB
    assert Layout(layout_params(ProxyConfig(max_reqs=256, num_spec=5, window=128, row_bytes=71680,
                                            segment_rows=True))).total_bytes > 500 << 20
    small = LayoutParams(max_reqs=4, num_spec=3, window=4, row_bytes=64, max_rows=16, resync_per_round=2,
                         segment_rows=False)
    rig = RoundRig(seg_name, small, ScriptedClient(max_reqs=4, num_spec=3, window=4, row_bytes=64))
    try:  # the engine's shared ring: rounds go through a segment without rows
        assert rig.seg.staging.shape == (0, 64)
        rows = np.arange(3 * 64, dtype=np.uint8).reshape(3, 64)
        reply = rig.run(dict(req_ids=np.array([7]), slots=np.array([1]), qsl=np.array([0, 3]),
                             need_draft=np.array([True]), k_window=np.zeros(1, np.int64), rows=rows,
                             valid=np.array([3]), first_pos=np.array([0]), anchor=np.array([5])))
        assert reply.status == 0 and reply.ok_mask.all()
        assert np.array_equal(rig.client.sent_rows[-1], rows)
    finally:
        rig.close()
    seg = Segment.create(seg_name, small, deadline_ms=50.0)
    try:
        seg.set_word(Word.STATE, State.READY)
        monkeypatch.setenv("DSPARK_SHARED_RING", "0")  # a private ring needs the rows in the segment
        with pytest.raises(LayoutMismatch, match="segment_rows is False .* --segment-rows"):
            engine_shim.attach(seg_name, max_reqs=4, num_spec=3, window=4, row_bytes=64)
    finally:
        seg.unlink()
        seg.close()


def test_a_new_proxy_incarnation_removes_the_rings_of_dead_engines(seg_name):
    from dspark_proxy.shm.layout import LayoutParams
    from dspark_proxy.shm.segment import Segment

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    stale = f"/dev/shm/dspark-ring.{seg_name}.{pid}.0"  # an engine killed before it could close
    live = ring_shm.SharedRing(seg_name, 4096, kind="named")  # this process's: alive, kept
    with open(stale, "wb") as f:
        f.write(b"\0" * 64)
    try:
        p = LayoutParams(max_reqs=4, num_spec=3, window=4, row_bytes=64, max_rows=16, resync_per_round=2)
        seg = Segment.create(seg_name, p, deadline_ms=50.0)
        seg.unlink()
        seg.close()
        assert not os.path.exists(stale) and os.path.exists("/dev/shm" + live.shm_name)
    finally:
        live.close()
        if os.path.exists(stale):
            os.unlink(stale)


def test_a_reply_published_before_its_step_sends_its_own_rows(seg_name):
    """A round the acceptance gate asked no drafts of is published before its STEP (round/late.py,
    `_publish_first`): the engine may read that reply and enqueue t + 1 while the STEP for t is still
    going out, rewriting ring rows of round t. Its rows are taken first, so the worker gets round t's
    bytes, and the drafts after the pause are right."""
    from dspark_proxy.round.core import RoundSettings
    from dspark_proxy.round.gate import GateSettings

    gate = GateSettings(break_even=0.5, patience=4, pause=8, pause_max=16, probe=1, tps_every=64)
    with Rig(seg_name, M=4, N=3, W=4, B=BIG, settings=RoundSettings(gate=gate)) as rig:
        reqs = [(1, 0, 1), (2, 1, 1), (3, 2, 1)]
        for _ in range(4):
            reply, b = rig.round(reqs)
            assert rig.check_drafts(reply, b) == 3
        copies = []
        for i in range(2):
            before = rig.stats.counter("rounds_published_first")
            rig.core.accept.gate._batch_paused(rig.t, rig.t + 3, "accept_batch_tps_paused")
            t, b_t, inner = _enqueue_next(rig, reqs)

            def published_first(t=t) -> None:
                got = rig.shim.read_reply(t)  # the engine has its reply before the STEP
                assert got.ok and not got.ok_mask.any()

            b_next = _handle_while_the_engine_moves_on(rig, t, inner, published_first)
            assert rig.stats.counter("rounds_published_first") == before + 1
            assert np.array_equal(rig.client.sent_rows[-1], b_t["rows"]), "round t's STEP sent torn rows"
            copies.append(rig.core._first_rows)
            if i == 0:
                _right_after(rig, reqs, b_next)
            else:  # the gate's second pause may last longer: the drafts are right, if fewer
                rig.t += 1
                rig.core.handle(rig.t, 0.0)
                reply = rig.shim.read_reply(rig.t)
                assert rig.check_drafts(reply, b_next) == int(reply.ok_mask.sum())
        assert copies[0] is not None and copies[1] is copies[0], "the copy's buffer is made once, not a round"
