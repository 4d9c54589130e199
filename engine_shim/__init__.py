"""What the engine imports: enqueue gathers, read published replies, never wait past the deadline.

    shim = engine_shim.attach("dspark", max_reqs=M, num_spec=N, window=W, row_bytes=B)
    shim.enqueue(t, req_ids=..., slots=..., ..., rows=rows)   # after the target's forward of step t
    reply = shim.read_reply(t)                                 # within the deadline, whatever happens

Until a proxy is there (or after it dies) every round is target-only: `read_reply` returns at once
with status round_failed, and the watchdog attaches the next proxy incarnation at a round boundary.
"""

from __future__ import annotations

from .api import attach, boot, current
from .reply import Reply
from .shim import Shim, ShimError

__all__ = ["attach", "boot", "current", "Shim", "ShimError", "Reply"]
