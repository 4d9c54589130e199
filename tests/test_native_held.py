"""`_fastround.Held` (_fastround_held.c): long-lived arrays' buffers taken once. What the C paths rely on:
a held array lives as long as the Held (its memory cannot go while a pointer to it is kept), it is
released when the Held goes, and a function handed something else, or arrays of the wrong size or
dtype, refuses it."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from dspark_proxy import native

fr = native.fastround


def test_held_arrays_live_as_long_as_the_held():
    a, b = np.zeros(8, np.int64), np.zeros(8, np.bool_)
    h = fr.Held((a, b))
    assert len(h) == 2
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is not None  # the Held's export keeps it
    del h
    gc.collect()
    assert ref() is None  # released with the Held


def test_held_refuses_what_cannot_be_held():
    with pytest.raises(BufferError):
        fr.Held((b"read-only bytes",))  # not writable
    with pytest.raises(ValueError):
        fr.Held((np.zeros((4, 4))[:, ::2],))  # not contiguous


def test_functions_check_the_held_they_are_given():
    slots = np.zeros(1, np.int64)
    valid, kw = np.ones(1, np.int32), np.ones(1, np.int32)
    good = fr.Held((np.zeros(6, np.int64), np.zeros(4, np.int64), np.zeros(4, np.int64), np.zeros(4, np.int64),
                    np.zeros(4, np.int64)))
    assert fr.accept_round(slots, valid, kw, 5, good, True, False) == (1, 1, 0)
    with pytest.raises(TypeError):
        fr.accept_round(slots, valid, kw, 5, (np.zeros(6, np.int64),), True, False)  # not a Held
    short_hist = fr.Held((np.zeros(3, np.int64), np.zeros(4, np.int64), np.zeros(4, np.int64),
                          np.zeros(4, np.int64), np.zeros(4, np.int64)))
    with pytest.raises(ValueError):
        fr.accept_round(slots, valid, kw, 5, short_hist, True, False)  # hist shorter than num_spec + 1
    wrong_type = fr.Held((np.zeros(6, np.int32), np.zeros(4, np.int64), np.zeros(4, np.int64),
                          np.zeros(4, np.int64), np.zeros(4, np.int64)))
    with pytest.raises(ValueError):
        fr.accept_round(slots, valid, kw, 5, wrong_type, True, False)
    with pytest.raises(ValueError):
        fr.accept_round(slots, valid, kw, 5, fr.Held(()), True, False)  # too few arrays
