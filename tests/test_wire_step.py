"""wire/step.py: a STEP's prefix built in place, or from arrays of a caller's own, is the same bytes
as encode_step's."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_proxy import wire
from dspark_proxy.wire.step import StepPrefix, place, seal


def _entries(n: int) -> np.ndarray:
    e = np.zeros(n, wire.ENTRY_DTYPE)
    e["slot"] = np.arange(n)
    e["n_rows"] = 2
    e["generation"] = 1
    e["anchor_pos"] = 2
    e["anchor_token"] = np.arange(n) + 7
    e["flags"] = wire.RF_NEW_GEN | wire.RF_NEED_DRAFT
    return e


def _sample(n: int) -> np.ndarray:
    s = np.zeros(n, wire.SAMPLE_DTYPE)
    s["seed"] = np.arange(n) + 3
    s["temperature"] = 0.5
    return s


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("sampled", [False, True])
def test_built_prefix_matches_encode_step(in_place, sampled):
    n, rb = 3, 16
    e, s = _entries(n), (_sample(n) if sampled else None)
    rows = np.arange(2 * n * rb, dtype=np.uint8).reshape(2 * n, rb)
    flags = wire.SF_SAMPLED if sampled else 0
    want = wire.encode_step(e, rows, row_bytes=rb, step_flags=flags, sample_meta=s, session=5, epoch=2, step_id=9)
    p = StepPrefix(8, sampled)
    if in_place:
        pe = p.entries(n)
        pe[:] = e
        ps = p.sample(n) if sampled else None
        if sampled:
            ps[:] = s
        before = bytes(p)
        place(p, pe, ps)  # the in-place views: nothing copied, nothing changed
        assert bytes(p) == before
    else:
        place(p, e, s)
    head = seal(p, n_req=n, n_rows=2 * n, row_bytes=rb, step_flags=flags, session=5, epoch=2, step_id=9)
    assert bytes(head) == bytes(want[0])


def test_a_plain_bytearray_prefix_works_too():
    n, rb = 2, 8
    e = _entries(n)
    p = bytearray(wire.step_prefix_bytes(4, False))
    place(p, e, None)
    head = seal(p, n_req=n, n_rows=2 * n, row_bytes=rb, step_flags=0, session=1, epoch=1, step_id=1)
    rows = np.zeros((2 * n, rb), np.uint8)
    assert bytes(head) == bytes(wire.encode_step(e, rows, row_bytes=rb, session=1, epoch=1, step_id=1)[0])


def test_wrong_dtypes_are_refused():
    p = StepPrefix(4, True)
    with pytest.raises(wire.LocalProtocolError):
        place(p, np.zeros(2, np.int64), None)
    with pytest.raises(wire.LocalProtocolError):
        place(p, _entries(2), np.zeros(2, np.int64))
