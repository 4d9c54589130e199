"""A second `Shim(...)` of one name in one process is refused with one line naming the name and
attach() (engine_shim/one_per_name.py): two would each abandon the other's proxy incarnation."""

from __future__ import annotations

import os

import pytest

import engine_shim
from engine_shim.inputs import ShimError
from engine_shim.shim import Shim

pytestmark = pytest.mark.timeout(30)

SHAPES = {"max_reqs": 4, "num_spec": 3, "window": 4, "row_bytes": 16}


def _rings(name: str) -> list[str]:
    """The engine rings of this name in /dev/shm (shm/ring_shm.py names them after the segment)."""
    return sorted(p for p in os.listdir("/dev/shm") if name in p and "ring" in p)


def test_second_shim_of_a_name_is_refused_until_the_first_closes(seg_name):
    first = Shim(seg_name, **SHAPES, start_watchdog=False)
    try:
        rings = _rings(seg_name)
        with pytest.raises(ShimError) as e:
            Shim(seg_name, **SHAPES, start_watchdog=False)
        msg = str(e.value)
        assert "\n" not in msg and f"Shim({seg_name!r})" in msg and f"engine_shim.attach({seg_name!r}" in msg, msg
        assert _rings(seg_name) == rings  # refused before it made anything
        other = Shim(seg_name + "-b", **SHAPES, start_watchdog=False)  # another name is fine
        other.close()
    finally:
        first.close()
    again = Shim(seg_name, **SHAPES, start_watchdog=False)  # closed: the name is free
    again.close()


def test_attach_still_shares_the_open_shim(seg_name):
    a = engine_shim.attach(seg_name, **SHAPES)
    try:
        assert engine_shim.attach(seg_name, **SHAPES) is a
        with pytest.raises(ShimError, match="one per name and process"):
            Shim(seg_name, **SHAPES)
    finally:
        a.close()
