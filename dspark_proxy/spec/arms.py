"""The draft sources `eval` compares, each opened once and reused by every repetition: target-only,
prompt lookup, the head behind a real proxy process and worker process, and the same head run in the
engine process (thread mode: the proxy's round loop on a thread, the head behind an in-process client)."""

from __future__ import annotations

from typing import Any

from ..model.head_shapes import DSparkShapes, head_drafter, load_head_shapes
from ..worker.inproc import InProcessClient

__all__ = ["HeadInProcessClient", "thread_shim"]


class HeadInProcessClient(InProcessClient):
    """The in-process worker with the head's own drafter (`torch` for a manifest head, `dspark` for a
    DSpark checkpoint: the drafter the remote worker would run) instead of the integrity oracle."""

    def __init__(self, head: str, *, max_reqs: int, target: str | None = None) -> None:
        from ..worker.drafters import make_drafter

        man = load_head_shapes(head)
        super().__init__(max_reqs=max_reqs, num_spec=man.num_spec, window=man.window, row_bytes=man.row_bytes)
        self.drafter_name = head_drafter(man)
        extra: dict[str, Any] = {}
        if isinstance(man, DSparkShapes):  # the worker's own defaults: CPU here, its target the engine's
            extra = {"head": man.path, "target": target, "row_dtype": man.row_dtype, "device": "cpu",
                     "max_reqs": max_reqs}
        self._drafter = make_drafter(self.drafter_name, num_spec=man.num_spec, window=man.window,
                                     row_bytes=man.row_bytes, weights=head if not extra else None, **extra)


def thread_shim(name: str, head: str, *, max_reqs: int, deadline_ms: float, target_id: str = "",
                target: str | None = None) -> Any:
    """A thread-mode shim whose proxy thread drafts with the head in this process."""
    import engine_shim

    man = load_head_shapes(head)
    return engine_shim.attach(name, mode="thread", max_reqs=max_reqs, num_spec=man.num_spec, window=man.window,
                              row_bytes=man.row_bytes, deadline_ms=deadline_ms, worker="inproc",
                              client=HeadInProcessClient(head, max_reqs=max_reqs, target=target),
                              target_id=target_id)
