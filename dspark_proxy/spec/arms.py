"""The draft sources `eval` compares, each opened once and reused by every repetition: target-only,
prompt lookup, the head behind a real proxy process and worker process, and the same head run in the
engine process (thread mode: the proxy's round loop on a thread, the head behind an in-process client)."""

from __future__ import annotations

from typing import Any

from ..inproc import InProcessClient
from ..model.manifest import HeadManifest, head_paths

__all__ = ["HeadInProcessClient", "thread_shim"]


class HeadInProcessClient(InProcessClient):
    """The in-process worker with the `torch` drafter and the head instead of the integrity oracle."""

    def __init__(self, head: str, *, max_reqs: int) -> None:
        from ..worker.torch_drafter import TorchDrafter

        man = HeadManifest.load(head_paths(head)[1])
        super().__init__(max_reqs=max_reqs, num_spec=man.num_spec, window=man.window, row_bytes=man.row_bytes)
        self._drafter = TorchDrafter(num_spec=man.num_spec, window=man.window, row_bytes=man.row_bytes,
                                     weights=head)


def thread_shim(name: str, head: str, *, max_reqs: int, deadline_ms: float, target_id: str = "") -> Any:
    """A thread-mode shim whose proxy thread drafts with the head in this process."""
    import engine_shim

    man = HeadManifest.load(head_paths(head)[1])
    return engine_shim.attach(name, mode="thread", max_reqs=max_reqs, num_spec=man.num_spec, window=man.window,
                              row_bytes=man.row_bytes, deadline_ms=deadline_ms, worker="inproc",
                              client=HeadInProcessClient(head, max_reqs=max_reqs), target_id=target_id)
