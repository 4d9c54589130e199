"""Whether the attached engine's process still runs, asked by the proxy at every wait slice (4 Hz).

A killed engine abandons nothing, so the proxy must notice it itself to free the engine's shared ring
(proxy.py `_wait_gathered`). A pidfd opened at attach answers with one poll (readable once the process
has exited, zombie included) and cannot name a later process that reuses the pid; reading /proc for
the pid and its start time at every slice cost the idle proxy ~0.08% of a core here, a sixth of the
idle budget (docs/performance.md, "Idle, state by state"). Without pidfd_open (Linux before 5.3) /proc is read, as the shim does
for its proxy. An engine whose pid this process cannot see at attach (another PID namespace) is never
judged gone: the incarnation ends as before, when the next engine abandons it.
"""

from __future__ import annotations

import os
import select

from .shm.segment import owner_alive, process_start_ticks

__all__ = ["EngineAlive"]


class EngineAlive:
    """`alive()` per wait slice; `close()` when the incarnation ends."""

    def __init__(self, pid: int) -> None:
        self.pid, self.ticks = pid, process_start_ticks(pid)
        self.fd = -1
        self.judged = owner_alive(pid, self.ticks)  # not visible from here: never judged gone
        if not self.judged:
            return
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            return  # no pidfd here: /proc at every ask
        if not owner_alive(pid, self.ticks):  # reused between the check and the open: not our engine
            os.close(fd)
            return
        self.fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def alive(self) -> bool:
        if self.fd >= 0:
            return not self._poll.poll(0)
        return not self.judged or owner_alive(self.pid, self.ticks)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
