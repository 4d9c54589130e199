"""Which implementation of the per-round hot paths runs: the C one (`_fastround.c`, the default) or the
Python reference model it mirrors (inputs.py, row_ring.py, shm/stamped.py), and the slot field offsets
the C side is handed.

The choice is made when each object is built (a Shim, a RoundCore), from `DSPARK_NATIVE`: `0` selects the
reference model for everything built afterwards in this process, anything else (or unset) the C paths.
Both write the same bytes and counters (tests/test_native_diff.py drives them side by side); the
reference stays the readable definition and the C one is its fast copy.
"""

from __future__ import annotations

import os

import numpy as np

from .round import _fastround

__all__ = ["enabled", "meta_offsets", "desc_offsets", "entry_offsets", "fastround"]

fastround = _fastround

# the slot fields in the order _fastround.c's M_* / D_* enums list them
_META_FIELDS = ("stamp_start", "t", "n", "rows_staged", "valid", "first_pos", "anchor", "staged_rows", "sampled",
                "seed", "temperature", "stamp_end")
_DESC_FIELDS = ("stamp_start", "t", "n", "max_q", "rows_gathered", "n_staged", "staged_slots", "req_id", "slot",
                "qsl", "need_draft", "k_window", "stamp_end")
_ENTRY_FIELDS = ("slot", "n_rows", "generation", "first_pos", "anchor_pos", "anchor_token", "flags", "k_window", "n_out")
assert len(_META_FIELDS) == _fastround.META_FIELDS and len(_DESC_FIELDS) == _fastround.DESC_FIELDS
assert len(_ENTRY_FIELDS) == _fastround.ENTRY_FIELDS


def enabled() -> bool:
    """Whether objects built now use the C hot paths (`DSPARK_NATIVE` is not `0`)."""
    return os.environ.get("DSPARK_NATIVE", "1").strip() != "0"


def _offsets(dtype: np.dtype, names: tuple[str, ...]) -> np.ndarray:
    return np.array([dtype.fields[k][1] for k in names], dtype=np.int64)


def meta_offsets(dtype: np.dtype) -> np.ndarray:
    """The meta slot's field offsets, for write_round / read_round."""
    return _offsets(dtype, _META_FIELDS)


def desc_offsets(dtype: np.dtype) -> np.ndarray:
    """The desc slot's field offsets, for write_round / read_round."""
    return _offsets(dtype, _DESC_FIELDS)


def entry_offsets(dtype: np.dtype) -> np.ndarray:
    """A STEP entry's field offsets (wire/dtypes.py ENTRY_DTYPE), for fill_entries."""
    return _offsets(dtype, _ENTRY_FIELDS)
