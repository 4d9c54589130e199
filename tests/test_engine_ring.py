"""EngineRing: rows land where their positions say, and a staged window is exactly the held rows.

The property test keeps a plain dict (slot, position) -> row bytes plus each slot's held positions
(docs/design.md step 2's restart rule, one request at a time) and compares every slot after every round.
Every row written carries a unique counter, so a stale, misplaced or misordered row cannot look right.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_proxy.round.ring_model import SlotTable
from engine_shim.row_ring import EngineRing

I64 = np.int64
RB = 8  # row bytes: one little-endian int64 counter per row


def arr(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=I64)


def rows_of(*values: int) -> np.ndarray:
    return np.array(values, dtype="<i8").view(np.uint8).reshape(len(values), RB)


def as_values(rows: np.ndarray) -> list[int]:
    return np.ascontiguousarray(rows).view("<i8").reshape(-1).tolist()


def test_rows_land_at_position_mod_w() -> None:
    r = EngineRing(3, 4, RB)
    a = r.write(arr(2), arr(7), arr(5), arr(3), rows_of(50, 60, 70))
    assert a.tolist() == [8]
    assert as_values(r.rows[2, [1, 2, 3]]) == [50, 60, 70]  # positions 5, 6, 7
    assert not r.rows[[0, 1]].any() and not r.rows[2, 0].any()  # nothing else was touched
    r.write(arr(2), arr(7), arr(8), arr(2), rows_of(80, 90))  # positions 8, 9 wrap onto 0, 1
    assert as_values(r.rows[2]) == [80, 90, 60, 70]
    assert as_values(r.window_rows(2, 6, 4)) == [60, 70, 80, 90]


def test_stage_window_copies_the_ring_block_and_says_what_it_holds() -> None:
    r = EngineRing(2, 4, RB)
    r.write(arr(0, 1), arr(1, 2), arr(0, 10), arr(3, 2), rows_of(1, 2, 3, 11, 12))
    r.write(arr(0), arr(1), arr(3), arr(3), rows_of(4, 5, 6))  # slot 0 holds positions 2..5
    dst = np.full((4, RB), 0xEE, dtype=np.uint8)
    assert r.stage_window(0, dst) == (1, 2, 5)
    assert as_values(dst) == [5, 6, 3, 4]  # index = position % 4
    assert not np.shares_memory(dst, r.rows)
    gen, lo, hi = r.stage_window(1, dst)
    assert (gen, lo, hi) == (1, 10, 11) and as_values(dst[[2, 3]]) == [11, 12]
    with pytest.raises(IndexError):
        r.stage_window(2, dst)


def test_more_than_w_rows_keep_the_last_w_in_order() -> None:
    r = EngineRing(1, 4, RB)
    r.write(arr(0), arr(1), arr(100), arr(6), rows_of(0, 1, 2, 3, 4, 5))
    assert (int(r.table.lo[0]), int(r.table.hi[0])) == (102, 105)
    assert as_values(r.window_rows(0, 102, 4)) == [2, 3, 4, 5]


def test_over_w_request_in_a_batch_keeps_other_requests_rows_aligned() -> None:
    r = EngineRing(3, 2, RB)
    r.write(arr(0, 1, 2), arr(1, 2, 3), arr(0, 7, 3), arr(1, 5, 2), rows_of(10, 20, 21, 22, 23, 24, 30, 31))
    assert as_values(r.window_rows(0, 0, 1)) == [10]
    assert as_values(r.window_rows(1, 10, 2)) == [23, 24]
    assert as_values(r.window_rows(2, 3, 2)) == [30, 31]


def test_restart_and_clear_follow_the_table_rules() -> None:
    r = EngineRing(2, 4, RB)
    r.write(arr(0), arr(1), arr(0), arr(4), rows_of(0, 1, 2, 3))
    r.write(arr(0), arr(1), arr(1), arr(2), rows_of(91, 92))  # rewind: restart as positions 1, 2
    assert (int(r.table.lo[0]), int(r.table.hi[0])) == (1, 2)
    assert as_values(r.window_rows(0, 1, 2)) == [91, 92]
    with pytest.raises(ValueError, match="holds positions 1..2"):
        r.window_rows(0, 0, 3)
    r.write(arr(0), arr(1), arr(3), arr(0), rows_of())  # clear
    with pytest.raises(ValueError):
        r.window_rows(0, 1, 1)
    assert r.window_rows(0, 5, 0).shape == (0, RB)


def test_write_refuses_rows_that_do_not_match_valid() -> None:
    r = EngineRing(2, 4, RB)
    with pytest.raises(ValueError, match="rows must be uint8"):
        r.write(arr(0), arr(1), arr(0), arr(3), rows_of(1, 2))
    with pytest.raises(ValueError, match="rows must be uint8"):
        r.write(arr(0), arr(1), arr(0), arr(1), np.zeros((1, RB), dtype=np.int8))
    assert int(r.table.owner[0]) == -1  # a refused write changes nothing


def test_non_contiguous_rows_are_accepted() -> None:
    r = EngineRing(1, 4, RB)
    big = np.zeros((3, 2 * RB), dtype=np.uint8)
    big[:, :RB] = rows_of(5, 6, 7)
    r.write(arr(0), arr(1), arr(0), arr(3), big[:, :RB])
    assert as_values(r.window_rows(0, 0, 3)) == [5, 6, 7]


def test_constructor_checks() -> None:
    with pytest.raises(ValueError, match="row_bytes"):
        EngineRing(2, 4, 0)
    r = EngineRing(2, 4, RB)
    assert r.rows.shape == (2, 4, RB) and r.W == 4 and r.max_slots == 2


# ---------------------------------------------------------------------------- the property test

M = 5


@pytest.mark.timeout(60)
@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(W=st.sampled_from([1, 3, 4, 6]), data=st.data())
def test_ring_matches_reference_rows_under_random_rounds(W: int, data) -> None:
    ring, model = EngineRing(M, W, RB), SlotTable(M, W)  # model: the proxy's copy, fed only metadata
    ref_rows: dict[tuple[int, int], int] = {}
    held: list[list[int]] = [[] for _ in range(M)]
    owner = [-1] * M
    counter = 0
    for _ in range(data.draw(st.integers(1, 25), label="rounds")):
        n = data.draw(st.integers(0, M), label="n")
        slots = data.draw(st.permutations(range(M)), label="slots")[:n]
        req, fps, vals = [], [], []
        for s in slots:
            kind, a, b = data.draw(st.tuples(st.sampled_from(["cont", "cont", "cont", "jump", "new", "any"]),
                                             st.integers(1, 2 * W + 2), st.integers(0, 30)), label=f"slot {s}")
            nxt = held[s][-1] + 1 if held[s] else b
            r = owner[s] if owner[s] >= 0 and kind != "new" else 1000 + counter + s
            if kind == "cont":
                fp, v = nxt, min(a, W)
            elif kind == "jump":
                fp, v = b, min(a, W)
            elif kind == "new":
                fp, v = 0, min(a, W)
            else:
                fp, v = b, a - 2  # clears (0, -1) and more than W rows included
            req.append(r)
            fps.append(fp)
            vals.append(v)
        total = sum(max(v, 0) for v in vals)
        rows = np.arange(counter, counter + total, dtype="<i8").view(np.uint8).reshape(total, RB)
        counter += total

        # the reference: one request at a time
        o = 0
        for s, r, fp, v in zip(slots, req, fps, vals, strict=True):
            if owner[s] != r:
                owner[s], held[s] = r, []
            if v <= 0:
                held[s] = []
                continue
            new = list(range(fp, fp + v))
            held[s] = (held[s] + new)[-W:] if not held[s] or held[s][-1] + 1 == fp else new[-W:]
            for j, p in enumerate(new):
                if j >= v - W:  # of more than W rows only the last W are written
                    ref_rows[(s, p)] = int(rows[o + j].view("<i8")[0])
            o += v

        s_arr, r_arr, f_arr, v_arr = arr(*slots), arr(*req), arr(*fps), arr(*vals)
        anchors = ring.write(s_arr, r_arr, f_arr, v_arr, rows)
        model.begin_requests(s_arr, r_arr)
        assert model.apply(s_arr, f_arr, v_arr).tolist() == anchors.tolist()

        dst = np.empty((W, RB), dtype=np.uint8)
        for s in range(M):
            lo, hi = (held[s][0], held[s][-1]) if held[s] else (0, -1)
            assert (int(ring.table.lo[s]), int(ring.table.hi[s])) == (lo, hi)
            assert (int(model.lo[s]), int(model.hi[s]), int(model.generation[s])) == (
                lo, hi, int(ring.table.generation[s]))
            want = [ref_rows[(s, p)] for p in held[s]]
            assert as_values(ring.window_rows(s, lo, len(held[s]))) == want
            gen, slo, shi = ring.stage_window(s, dst)
            assert (gen, slo, shi) == (int(model.generation[s]), lo, hi)
            assert [as_values(dst[p % W:p % W + 1])[0] for p in held[s]] == want
