"""What a connection is served under: the shapes agreed at HELLO (FORMAT.md, "Handshake").

A worker's own `--num-spec/--window/--row-bytes/--max-reqs` are defaults, not a contract: a proxy
started with other shapes is served under its own where the drafter allows, so a worker started
without the proxy's shapes still serves it. Only what the drafter fixes is refused, naming the field
and both values: the `integrity` drafter fixes nothing; a trained head fixes its row layout, N and
window (its manifest's), and any drafter that does not say otherwise is taken to fix all three.
The memory budget bounds what is adopted: one session of the HELLO's shapes must fit in it, counted as
all its slots can hold (`session_bytes`: rows, CRC chain, the drafter's per-slot state), and a window
past the worker's `--max-window` is refused, so nothing a HELLO asks costs more than the budget charges
(the CRC shift tables of a window are about 2 sqrt(W) tables, built in milliseconds: crc.py).

The head's target is checked here too: a HELLO that names a target (`target_id`) is refused by a
drafter made for another one; a HELLO that names none is served, and the worker says so once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..wire import Hello, WireLayout

__all__ = ["SHAPE_FIELDS", "Refused", "drafter_fixes", "drafter_target", "agree"]

log = logging.getLogger("dspark_proxy.worker.server")  # one logger for the worker, as serve.py

SHAPE_FIELDS = ("num_spec", "window", "row_bytes")
_unnamed_said = threading.Event()  # "the proxy names no target" is logged once per process


class Refused(Exception):
    """The HELLO cannot be served: `field` names the parameter, the message gives both values."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def drafter_fixes(drafter: Any, own: WireLayout) -> dict[str, int]:
    """The shapes `drafter` fixes, field -> value. A drafter says which with a `fixes` tuple of
    SHAPE_FIELDS names (the integrity drafter: none); one that does not say fixes all three, at its
    own values where it has them, else at the worker's (what it was made with)."""
    names = getattr(drafter, "fixes", SHAPE_FIELDS)
    return {k: int(getattr(drafter, k, getattr(own, k))) for k in names}


def drafter_target(drafter: Any) -> str | None:
    """The target a drafter was made for (its head manifest's `target_id`), None when it has none."""
    man = getattr(drafter, "manifest", None)
    tid = getattr(man, "target_id", None) or getattr(drafter, "target_id", None)
    return str(tid) if tid else None


def agree(hello: Hello, own: WireLayout, *, drafter: Any, adopt: bool = True,
          budget_bytes: int | None = None, peer: object = None, max_window: int | None = None,
          session_bytes: Callable[[int, int, int], int] | None = None) -> WireLayout:
    """The layout this connection is served under (the protocol version already checked), or Refused
    naming the field. session_bytes(max_reqs, window, row_bytes): what one session of those shapes
    is charged (SessionTable.session_bytes; default: its windows of rows alone)."""
    fixed = drafter_fixes(drafter, own)
    for field in SHAPE_FIELDS:
        got = getattr(hello, field)
        want = fixed.get(field, None if adopt else getattr(own, field))
        if want is not None and got != want:
            why = (f"the {getattr(drafter, 'name', 'drafter')} drafter's" if field in fixed
                   else "this worker's (--no-adopt-shapes)")
            raise Refused(field, f"{field}: client {got}, worker {want} ({why})")
    if max_window is not None and hello.window > max_window:
        raise Refused("window", f"window: client {hello.window}, worker serves at most {max_window} "
                      "(--max-window)")
    if hello.max_reqs < 1 or (not adopt and hello.max_reqs > own.max_reqs):
        raise Refused("max_reqs", f"max_reqs: client {hello.max_reqs}, worker serves at most {own.max_reqs}")
    if hello.sampled and not own.sampled:
        raise Refused("sampled", "sampled: client wants sampled mode, worker started without --sampled")
    cost = session_bytes or (lambda m, w, rb: m * w * rb)
    if budget_bytes is not None:
        one = cost(1, hello.window, hello.row_bytes)
        if one > budget_bytes:  # not even one slot fits: the window (with its rows) is what is too large
            raise Refused("window", f"window: client {hello.window} (x row_bytes {hello.row_bytes}: {one} "
                          f"bytes a slot), worker's memory budget {budget_bytes} bytes (--memory-budget-mb)")
        need = cost(hello.max_reqs, hello.window, hello.row_bytes)
        if need > budget_bytes:
            raise Refused("max_reqs", f"max_reqs: client {hello.max_reqs} x window {hello.window} x row_bytes "
                          f"{hello.row_bytes} = {need} bytes a session (rows, chains, the drafter's state), "
                          f"worker's memory budget {budget_bytes} bytes (--memory-budget-mb)")
    _check_target(hello, drafter, peer)
    _check_rows(hello, drafter)
    return WireLayout(hello.num_spec, hello.window, hello.row_bytes, hello.max_reqs, hello.sampled)


def _check_rows(hello: Hello, drafter: Any) -> None:
    """The row layout a drafter reads (its `tap_layers`, `row_dtype`) against the HELLO's, where both say."""
    taps = tuple(getattr(drafter, "tap_layers", ()) or ())
    got = tuple(getattr(hello, "tap_layers", ()) or ())
    if taps and got and got != taps:
        raise Refused("tap_layers", f"tap_layers: client {list(got)}, worker {list(taps)} (the "
                      f"{getattr(drafter, 'name', 'drafter')} drafter's checkpoint)")
    mine = getattr(drafter, "row_dtype", "") if taps else ""
    said = getattr(hello, "row_dtype", "")
    if mine and said and said != mine:
        raise Refused("row_dtype", f"row_dtype: client {said}, worker {mine} (--row-dtype)")


def _check_target(hello: Hello, drafter: Any, peer: object) -> None:
    mine = drafter_target(drafter)
    if mine is None:
        return
    named = getattr(hello, "target_id", "")
    if not named:
        if not _unnamed_said.is_set():
            _unnamed_said.set()
            log.warning("[worker] peer=%s names no target (attach(..., target_id=...)): the head, made for "
                        "target_id=%s, is served unchecked", peer, mine)
        return
    if named != mine:
        raise Refused("target_id", f"target_id: client {named}, worker's head made for {mine}")
