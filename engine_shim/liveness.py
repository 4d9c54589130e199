"""Is the attached segment's proxy alive? Asked by the watchdog at every tick, so it must cost little.

`owner_alive` (pid, start time, not a zombie) reads /proc twice, ~23 µs of a warm core and several
times that on a cold, loaded one, ten times a second while the engine idles. A pidfd answers the
same question with one poll(0): it becomes readable when the process exits, zombie or reaped, and
it cannot name a later process that reuses the pid. It is opened once per segment, after
`owner_alive` has checked the pid and start time, and that check is made again once the pidfd is
open, so a pid reused in between is not taken for the owner. Where pidfd_open is missing (Linux before
5.3, seccomp), every ask falls back to `owner_alive`.
"""

from __future__ import annotations

import os
import select

from dspark_proxy.shm.segment import Segment, owner_alive

__all__ = ["OwnerWatch"]


class OwnerWatch:
    """The liveness of one segment's owner, through a pidfd held while that segment is watched."""

    def __init__(self) -> None:
        self._seg: Segment | None = None
        self._fd = -1
        self._poll: select.poll | None = None
        self._dead = False

    def alive(self, seg: Segment) -> bool:
        if seg is not self._seg:
            self._open(seg)
        if self._dead:
            return False
        if self._poll is None:
            h = seg.header
            return owner_alive(int(h["owner_pid"]), int(h["owner_start_ticks"]))
        if self._poll.poll(0):
            self._dead = True  # exited: it never comes back
        return not self._dead

    def _open(self, seg: Segment) -> None:
        self.close()
        self._seg = seg
        h = seg.header
        pid, ticks = int(h["owner_pid"]), int(h["owner_start_ticks"])
        if not owner_alive(pid, ticks):
            self._dead = True
            return
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            return  # no pidfd here (or the pid just went): owner_alive at every ask
        if not owner_alive(pid, ticks):  # reused between the check and the open: not our owner
            os.close(fd)
            self._dead = True
            return
        self._fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def fd(self, seg: Segment) -> int:
        """The pidfd of `seg`'s owner (readable once it exits), or -1 where there is none."""
        if seg is not self._seg:
            self._open(seg)
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._seg, self._fd, self._poll, self._dead = None, -1, None, False
