"""Fuzzing the proxy's reading of a round's descriptor and metadata (docs/guarantees.md ("The campaign"
on": malformed descriptors never crash or hang either side, and are counted).

Random bytes and mutations go into round t's desc or meta slot of a real segment, between the shim's
enqueue and RoundCore.handle (tests/rig.py: one thread, the real shim and round). Whatever the bytes:
handle() returns, a reply for t is published and read; a round the validation refused is a failed
reply with its counter bumped; and the next good rounds give drafts again, every one of them right
by the integrity oracle.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dspark_proxy.chaos import CORRUPTION_MODES, corrupt_round
from dspark_proxy.shm.layout import STATUS_ROUND_FAILED, Word
from tests.conftest import new_segment_name
from tests.rig import Rig

pytestmark = pytest.mark.timeout(120)

REQS = [(1, 0, 1), (2, 3, 1), (3, 5, 2)]  # (request, slot, rows per round)
EXTREMES = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF,
            0x8000_0000_0000_0000]


def fuzz(n: int) -> settings:
    return settings(deadline=None, max_examples=n, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _slot_view(rig: Rig, region: str, t: int) -> tuple[np.ndarray, np.dtype]:
    lay = rig.seg.layout
    off, dt = (lay.desc_off(t), lay.desc_dtype) if region == "desc" else (lay.meta_off(t), lay.meta_dtype)
    return np.ndarray((dt.itemsize,), np.uint8, buffer=rig.seg.mm, offset=off), dt


@st.composite
def damage(draw):
    region = draw(st.sampled_from(["desc", "meta"]))
    ops = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["byte", "flip", "u32", "u64", "block"]))
        pos = draw(st.floats(0.0, 1.0, exclude_max=True))  # scaled to the slot's size later
        if kind == "byte":
            ops.append((kind, pos, draw(st.integers(0, 255))))
        elif kind == "flip":
            ops.append((kind, pos, draw(st.integers(0, 7))))
        elif kind in ("u32", "u64"):
            ops.append((kind, pos, draw(st.sampled_from(EXTREMES))))
        else:
            ops.append((kind, pos, draw(st.binary(min_size=1, max_size=96))))
    keep_stamps = draw(st.booleans())  # True: only the body is damaged (the stamp check passes)
    return region, ops, keep_stamps


def _apply(raw: np.ndarray, dt: np.dtype, ops: list, keep_stamps: bool, t: int) -> None:
    size = raw.shape[0]
    before = raw.copy()
    for kind, pos, v in ops:
        i = int(pos * size)
        if kind == "byte":
            raw[i] = v
        elif kind == "flip":
            raw[i] ^= 1 << v
        elif kind in ("u32", "u64"):
            w = 4 if kind == "u32" else 8
            i = min(i - i % w, size - w)
            raw[i:i + w] = np.frombuffer((v & ((1 << (8 * w)) - 1)).to_bytes(w, "little"), np.uint8)
        else:
            chunk = np.frombuffer(v, np.uint8)[: size - i]
            raw[i:i + chunk.shape[0]] = chunk
    if keep_stamps:
        for f in ("stamp_start", "t", "stamp_end"):
            o = dt.fields[f][1]
            raw[o:o + 8] = before[o:o + 8]


def _good_rounds(rig: Rig, k: int) -> int:
    """k good rounds; every usable draft checked against the oracle; returns how many there were."""
    checked = 0
    for _ in range(k):
        reply, b = rig.round(REQS)
        checked += rig.check_drafts(reply, b)
    return checked


def _damaged_round(rig: Rig, mutate) -> tuple[object, bool]:
    b = rig.batch(REQS)
    rig.t += 1
    t = rig.t
    rig.shim.enqueue(t, **b)
    mutate(t)
    refused_before = rig.stats.counter("fallback_bad_descriptor") + rig.stats.counter("fallback_internal_error")
    rig.core.handle(t, 0.0)  # must return, whatever the bytes
    assert rig.seg.word(Word.PUBLISHED) == t
    reply = rig.shim.read_reply(t)
    refused = (rig.stats.counter("fallback_bad_descriptor")
               + rig.stats.counter("fallback_internal_error")) > refused_before
    if refused:
        assert reply.status == STATUS_ROUND_FAILED and not reply.ok_mask.any()
    return reply, refused


def _with_rig(fn) -> None:
    name = new_segment_name("fuzzdesc")
    rig = Rig(name)
    try:
        fn(rig)
    finally:
        rig.close()


@fuzz(250)
@given(damage())
def test_damaged_descriptor_or_metadata(d):
    region, ops, keep_stamps = d

    def run(rig: Rig) -> None:
        assert _good_rounds(rig, 3) > 0

        def mutate(t: int) -> None:
            raw, dt = _slot_view(rig, region, t)
            _apply(raw, dt, ops, keep_stamps, t)

        _, refused = _damaged_round(rig, mutate)
        event(f"refused={refused} internal_error={rig.stats.counter('fallback_internal_error')}")
        # the next good rounds draft again, and every draft is right (the round after a lie included)
        assert _good_rounds(rig, 8) > 0

    _with_rig(run)


@fuzz(60)
@given(st.sampled_from(CORRUPTION_MODES), st.integers(0, 2**32 - 1))
def test_every_chaos_corruption_is_refused(mode, seed):
    """The campaign's corruptions (dspark_proxy.chaos.corrupt) are all caught by the validation."""

    def run(rig: Rig) -> None:
        _good_rounds(rig, 2)
        rng = np.random.default_rng(seed)
        _, refused = _damaged_round(rig, lambda t: corrupt_round(rig.seg, t, mode, rng))
        assert refused, mode
        assert rig.stats.counter("fallback_bad_descriptor") == 1
        assert rig.stats.counter("fallback_internal_error") == 0
        assert _good_rounds(rig, 8) > 0

    _with_rig(run)


@fuzz(150)
@given(st.sampled_from(["desc", "meta"]), st.binary(min_size=0, max_size=4096))
def test_random_bytes_over_the_slot(region, data):
    """The whole slot overwritten (stamps included): refused by the stamp check, counted."""

    def run(rig: Rig) -> None:
        _good_rounds(rig, 2)

        def mutate(t: int) -> None:
            raw, dt = _slot_view(rig, region, t)
            chunk = np.frombuffer(data, np.uint8)[: raw.shape[0]]
            raw[: chunk.shape[0]] = chunk
            if chunk.shape[0] >= 8 and int.from_bytes(raw[:8].tobytes(), "little") == t:
                raw[0] ^= 1  # a stamp that happens to read t is no longer garbage

        _, refused = _damaged_round(rig, mutate)
        if len(data) >= 8:
            assert refused
        assert _good_rounds(rig, 8) > 0

    _with_rig(run)
