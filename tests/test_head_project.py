"""A STEP's bfloat16 rows to their projections in one native call (`HeadRunner.project_bf16`,
model/_headmm_proj.c) against its definition (`TorchDrafter._project_reference`: `_to_float`, then
`HeadRunner.project`): the same bytes on any row bytes (NaN, infinities, huge and tiny values), for the
shipped head and random heads of other shapes, on one thread and two; shapes that do not chain refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_proxy.model import headmm
from dspark_proxy.spec.run import DEFAULT_HEAD
from dspark_proxy.worker.drafters.torch_head import TorchDrafter

pytestmark = pytest.mark.timeout(180)

_SHIPPED = TorchDrafter(num_spec=5, window=16, row_bytes=1152, weights=DEFAULT_HEAD)
# random heads reading bf16 rows of one tap: hidden 24 and 40 (not multiples of the panel width)
_RANDOM = [TorchDrafter(num_spec=3, window=4, row_bytes=2 * h, row_dtype="bfloat16", d_model=d, seed=h)
           for h, d in ((24, 32), (40, 48))]
_SPECIAL = np.array([0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x8000, 0x0001, 0x7F7F, 0xFF7F, 0x4780, 0xC780, 0x461C, 0xC61C],
                    dtype=np.uint16)  # inf, -inf, NaNs, -0, a denormal, +-max, +-65536, +-10000


def _rows(rng: np.random.Generator, R: int, row_bytes: int, special: float) -> np.ndarray:
    v = rng.standard_normal((R, row_bytes // 2)).astype(np.float32) * np.float32(rng.choice([0.01, 1.0, 300.0]))
    u = (v.view(np.uint32) >> 16).astype(np.uint16)
    hit = rng.random(u.shape) < special
    u[hit] = rng.choice(_SPECIAL, int(hit.sum()))
    return u.view(np.uint8).reshape(R, row_bytes)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2), st.integers(1, 40), st.sampled_from([0.0, 0.02, 0.5]), st.integers(0, 2**32 - 1),
       st.sampled_from([1, 2]))
def test_the_native_projection_is_its_definition(which, R, special, seed, threads):
    dr = (_SHIPPED, *_RANDOM)[which]
    raw = _rows(np.random.default_rng(seed), R, dr.row_bytes, special)
    t = headmm.threads()
    try:
        headmm.set_threads(threads)
        got = dr.runner.project_bf16(raw)
    finally:
        headmm.set_threads(t)
    want = dr._project_reference(raw)
    assert got.shape == want.shape == (R, dr.runner.cache_width) and got.dtype == np.float32
    assert got.tobytes() == want.tobytes()


def test_the_drafter_projects_bf16_rows_natively_and_other_dtypes_by_the_reference(monkeypatch):
    raw = _rows(np.random.default_rng(1), 5, 1152, 0.1)
    calls = []
    monkeypatch.setattr(_SHIPPED.runner, "project_bf16", lambda r: calls.append(len(r)) or _SHIPPED._project_reference(r))
    _SHIPPED.project_rows(raw)
    assert calls == [5]
    f32 = TorchDrafter(num_spec=3, window=4, row_bytes=32, row_dtype="float32", d_model=32, seed=3)
    monkeypatch.setattr(f32.runner, "project_bf16", lambda r: pytest.fail("float32 rows are not bfloat16"))
    x = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32).view(np.uint8)
    assert f32.project_rows(x).tobytes() == f32._project_reference(x).tobytes()


def test_rows_that_do_not_chain_are_refused_by_name():
    r = _SHIPPED.runner
    with pytest.raises(ValueError, match="project_bf16"):
        r.project_bf16(np.zeros((2, 1150), np.uint8))  # not whole rows of 3 x 192 bf16 values
    with pytest.raises(ValueError, match="project_bf16"):
        headmm.project_bf16(np.zeros((2, 1152), np.uint8), 3, 192, r._pw[1], r.in_b, r._pw[0])  # matrices swapped
