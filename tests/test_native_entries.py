"""The worker's entry check in C (`_fastround.bad_entries`, wire/codec.py `bad_entry_mask`) against its
numpy reference (`bad_entry_mask_reference`): the same mask on random STEP entries of any values,
DSPARK_NATIVE=0 selecting the reference, and arguments the C pass cannot take refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dspark_proxy.wire as wire
from dspark_proxy.native import entry_offsets
from dspark_proxy.round import _fastround

pytestmark = pytest.mark.timeout(120)

_U32 = st.one_of(st.integers(0, 40), st.integers(0, 2**32 - 1))
_I64 = st.one_of(st.integers(-5, 80), st.integers(-(2**63), 2**63 - 1))
_ENTRY = st.tuples(_U32, _U32, _I64, _I64, st.integers(0, 255), st.integers(0, 255), st.integers(0, 255))


def _entries(rows) -> np.ndarray:
    e = np.zeros(len(rows), dtype=wire.ENTRY_DTYPE)
    for i, (slot, n_rows, first, anchor, flags, k, n_out) in enumerate(rows):
        e[i]["slot"], e[i]["n_rows"], e[i]["first_pos"], e[i]["anchor_pos"] = slot, n_rows, first, anchor
        e[i]["flags"], e[i]["k_window"], e[i]["n_out"] = flags, k, n_out
    return e


@settings(max_examples=400, deadline=None)
@given(st.lists(_ENTRY, max_size=40), st.integers(1, 70), st.integers(1, 9), st.integers(1, 50),
       st.randoms(use_true_random=False))
def test_the_c_pass_is_the_reference(rows, W, N, M, rnd):
    if rows and rnd.random() < 0.5:  # repeat some slots: the duplicate rule
        rows = [(rows[rnd.randrange(len(rows))][0], *r[1:]) if rnd.random() < 0.4 else r for r in rows]
    e = _entries(rows)
    lay = wire.WireLayout(num_spec=N, window=W, row_bytes=8, max_reqs=M)
    assert wire.bad_entry_mask(e, lay).tobytes() == wire.bad_entry_mask_reference(e, lay).tobytes()


def test_a_large_batch_and_its_duplicates():
    rng = np.random.default_rng(3)
    n, M = 4096, 300
    e = np.zeros(n, dtype=wire.ENTRY_DTYPE)
    e["slot"] = rng.integers(0, M + 20, n)
    e["n_rows"] = rng.integers(0, 20, n)
    e["first_pos"] = rng.integers(-2, 100, n)
    e["anchor_pos"] = e["first_pos"] + e["n_rows"] - (rng.random(n) < 0.1)
    e["flags"] = rng.integers(0, 8, n)
    e["n_out"] = rng.integers(0, 7, n)
    lay = wire.WireLayout(num_spec=5, window=16, row_bytes=8, max_reqs=M)
    got, want = wire.bad_entry_mask(e, lay), wire.bad_entry_mask_reference(e, lay)
    assert np.array_equal(got, want) and 0 < want.sum() < n


def test_dspark_native_0_selects_the_reference(monkeypatch):
    import dspark_proxy.wire.codec as codec

    e = _entries([(0, 3, 0, 3, 3, 0, 1), (0, 3, 0, 3, 3, 0, 1)])
    lay = wire.WireLayout(num_spec=5, window=16, row_bytes=8, max_reqs=4)
    seen = []
    real = codec.bad_entry_mask_reference
    monkeypatch.setattr(codec, "bad_entry_mask_reference", lambda *a: seen.append(1) or real(*a))
    monkeypatch.setenv("DSPARK_NATIVE", "0")
    assert codec.bad_entry_mask(e, lay).tolist() == [False, True] and seen == [1]
    monkeypatch.setenv("DSPARK_NATIVE", "1")
    assert codec.bad_entry_mask(e, lay).tolist() == [False, True] and seen == [1]


def test_arguments_the_c_pass_cannot_take_are_refused_by_name():
    e = _entries([(0, 3, 0, 3, 3, 0, 1)] * 3)
    offs = entry_offsets(wire.ENTRY_DTYPE)
    table = np.zeros(256, np.uint8)
    with pytest.raises(ValueError, match="out"):
        _fastround.bad_entries(e, offs, table, table, 16, 5, 4, np.zeros(2, np.uint8))
    with pytest.raises(ValueError, match="flags_bad"):
        _fastround.bad_entries(e, offs, table[:10], table, 16, 5, 4, np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match="field offset"):
        _fastround.bad_entries(e, offs + 40, table, table, 16, 5, 4, np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match="entries"):
        _fastround.bad_entries(np.zeros(3, np.int64), offs, table, table, 16, 5, 4, np.zeros(3, np.uint8))
