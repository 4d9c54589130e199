"""decode_reply's checks of a REPLY's per-request sections: one C pass (`_fastround.check_reply`,
_fastround_reply.c) and its numpy definition (DSPARK_NATIVE=0 runs it; tests/test_wire_codec.py holds
the two to the same answers). In C because the four numpy checks were ~15 us of the proxy's round trip
on a loaded machine (docs/performance.md, "The STEP's round trip beyond the worker's own time")."""

from __future__ import annotations

import numpy as np

from ..native import fastround as _fastround
from .dtypes import RS_MAX, USABLE_STATUS_TABLE

__all__ = ["REPLY_SECTION_ERRORS", "reply_section_error", "reply_section_error_reference"]

_USABLE_U8 = USABLE_STATUS_TABLE.view(np.uint8)
REPLY_SECTION_ERRORS = {1: "unknown request status in REPLY", 2: "window_rows over W in REPLY",
                        3: "usable status with an empty window in REPLY", 4: "non-finite confidence in REPLY"}


def reply_section_error(payload, lay, window: int) -> int:
    """The first failed check (a REPLY_SECTION_ERRORS key) of the payload's sections at `lay` (its
    reply_layout), 0 when none fails; in C."""
    return _fastround.check_reply(payload, lay.o_status, lay.o_window_rows, lay.o_confidence, lay.n_req,
                                  lay.num_spec, window, RS_MAX, _USABLE_U8)


def reply_section_error_reference(status: np.ndarray, window_rows: np.ndarray, confidence: np.ndarray,
                                  window: int) -> int:
    """The first of decode_reply's checks of the per-request sections that fails, over the whole batch
    (0: none): a status over RS_MAX, window_rows over W, a usable status with an empty window, a
    non-finite confidence. The definition `_fastround.check_reply` is held to."""
    if int(status.max()) > RS_MAX:
        return 1
    if int(window_rows.max()) > window:
        return 2
    if (window_rows[USABLE_STATUS_TABLE[status]] == 0).any():
        return 3
    if not np.isfinite(confidence).all():
        return 4
    return 0
