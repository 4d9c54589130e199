"""One open Shim per segment name and process.

Two shims of one name in one process each take the proxy's incarnation from the other, abandoning it
for good (the watchdog's attach claim, shm_layout.md §8): through `engine_shim.attach()` the second
is the first, shared; a second `Shim(...)` built directly is refused here with one line saying so.
Keyed by pid, so a forked child (whose copy of the parent's shim has no threads) makes its own; held
weakly, so a shim dropped without close() does not block the name for ever."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from dspark_proxy.shm.segment import DEFAULT_NAME

from .attach import AttachState

__all__ = ["check_free", "claim", "release"]

_open: weakref.WeakValueDictionary[tuple[int, str], Any] = weakref.WeakValueDictionary()
_lock = threading.Lock()


def _key(name: str | None) -> tuple[int, str]:
    return os.getpid(), DEFAULT_NAME if name is None else name


def _refuse(name: str | None) -> None:
    from .inputs import ShimError

    n = DEFAULT_NAME if name is None else name
    raise ShimError(f"Shim({n!r}): this process already has an open shim for that name (one per name and "
                    f"process: two abandon each other's proxy); close it first, or use "
                    f"engine_shim.attach({n!r}, ...), which returns the open one")


def _taken(key: tuple[int, str], me: Any = None) -> bool:
    other = _open.get(key)
    return other is not None and other is not me and other.state is not AttachState.CLOSED


def check_free(name: str | None) -> None:
    """Raise ShimError when another open shim of this process has the name (before anything is made)."""
    with _lock:
        if _taken(_key(name)):
            _refuse(name)


def claim(name: str | None, shim: Any) -> None:
    """Record `shim` as the name's open shim; ShimError if another got there first (the caller then
    closes its own)."""
    key = _key(name)
    with _lock:
        if _taken(key, shim):
            _refuse(name)
        _open[key] = shim


def release(name: str | None, shim: Any) -> None:
    """`shim` closed: the name is free again (if it was the one recorded)."""
    key = _key(name)
    with _lock:
        if _open.get(key) is shim:
            del _open[key]
