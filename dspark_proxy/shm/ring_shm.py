"""The engine's row ring as a shared-memory object of its own, so that a round's rows cross the engine
side once: `enqueue` writes them there and the proxy sends from there (shm_layout.md §1, "The engine's
shared ring").

Why not a region of the segment: each proxy incarnation makes a new segment, while the ring must outlive
it (a restarted proxy resyncs the worker from the rows the engine still holds). So the engine owns
`/dspark-ring.<name>.<engine pid>.<n>` for its whole life (n counts the rings this process made, so two
shims of one name in one process never share or remove each other's), names it in the header of every
incarnation it claims (bytes 2304..2431, next to the engine target), and each incarnation's proxy maps it read-only.

Every page is reserved at creation (posix_fallocate, as the segment is): a /dev/shm too small for the
ring fails here, with a message, instead of a SIGBUS in whichever process touches a missing page.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import re
import shutil
import struct

import numpy as np
import posix_ipc

from .layout import HEADER_DTYPE, PAGE

__all__ = ["enabled", "unlink_rings", "reap_stale", "RING_OFF", "RingError", "SharedRing", "ring_shm_name", "write_ring_name", "read_ring_name",
           "open_ring"]

RING_OFF = 2304  # byte offset in the header page (the engine target ends at 2048 + 2 + 254)
_NAME_MAX = 126  # bytes of the object name (a u16 length before it)
_LEN = struct.Struct("<H")
_NAME_RE = re.compile(r"^/dspark-ring\.[A-Za-z0-9_.-]{1,100}\.[0-9]{1,10}\.[0-9]{1,10}$")
_made = itertools.count()  # shims' rings made by this process
assert HEADER_DTYPE.itemsize <= RING_OFF and RING_OFF + _LEN.size + _NAME_MAX <= PAGE


def enabled() -> bool:
    """Whether a shim built now puts its ring in shared memory (`DSPARK_SHARED_RING`, default on; `0`
    keeps the ring private and copies each round's rows into the segment's staging as well)."""
    return os.environ.get("DSPARK_SHARED_RING", "1").strip() != "0"


class RingError(RuntimeError):
    """The shared ring cannot be made (no room in /dev/shm) or opened (gone, wrong size)."""


def ring_shm_name(name: str, pid: int, n: int) -> str:
    """The ring's POSIX object name for a segment name, the engine's pid and its count of rings made."""
    return f"/dspark-ring.{name}.{int(pid)}.{int(n)}"


def _rings_of(name: str) -> list[tuple[str, int]]:
    """(object name, pid) of every ring of this segment name in /dev/shm."""
    prefix = f"dspark-ring.{name}."
    try:
        entries = os.listdir("/dev/shm")
    except OSError:
        return []
    out = []
    for e in entries:
        rest = e[len(prefix):].split(".") if e.startswith(prefix) else []
        if len(rest) == 2 and rest[0].isdigit() and rest[1].isdigit():  # a longer name has more parts
            out.append(("/" + e, int(rest[0])))
    return out


def unlink_rings(name: str) -> None:
    """Remove every ring of this segment name, whoever made it (test and fuzz clean-up)."""
    for obj, _pid in _rings_of(name):
        try:
            posix_ipc.unlink_shared_memory(obj)
        except posix_ipc.ExistentialError:
            pass


def reap_stale(name: str) -> None:
    """Unlink rings of this segment name left by engines that died without closing (best effort): a
    new shim of the name does it, and so does each new proxy incarnation (an engine killed outright
    would otherwise leave M x W x row_bytes in /dev/shm until the next engine of the name)."""
    for obj, pid in _rings_of(name):
        try:
            os.kill(pid, 0)
            continue  # alive (or not ours to judge)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            posix_ipc.unlink_shared_memory(obj)
        except posix_ipc.ExistentialError:
            pass


class SharedRing:
    """The engine's side: the object, created and reserved, mapped read-write; unlinked by close()."""

    def __init__(self, name: str, nbytes: int) -> None:
        self.pid = os.getpid()
        self.shm_name = ring_shm_name(name, self.pid, next(_made))
        self.nbytes = int(nbytes)
        reap_stale(name)
        try:
            shm = posix_ipc.SharedMemory(self.shm_name, posix_ipc.O_CREX, mode=0o600, size=self.nbytes)
        except posix_ipc.ExistentialError:  # a dead process's of the same pid (reused): stale
            posix_ipc.unlink_shared_memory(self.shm_name)
            shm = posix_ipc.SharedMemory(self.shm_name, posix_ipc.O_CREX, mode=0o600, size=self.nbytes)
        except posix_ipc.Error as e:
            raise RingError(f"the engine's row ring {self.shm_name}: {e}") from e
        try:
            _reserve(shm.fd, self.nbytes, self.shm_name)
            # mapped with its page tables filled: otherwise each of the first W rounds of a slot takes a
            # minor fault per 4 KiB it writes (measured: enqueue of 256 x 71,680 B rows 8.6 ms instead of
            # 0.9 ms until every slot had wrapped once)
            self.mm = mmap.mmap(shm.fd, self.nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        except BaseException:
            shm.close_fd()
            posix_ipc.unlink_shared_memory(self.shm_name)
            raise
        shm.close_fd()
        self.array = np.frombuffer(self.mm, dtype=np.uint8, count=self.nbytes)

    def close(self) -> None:
        """Remove the name; the mapping goes with the last view of it. Idempotent. A forked child that
        inherited this object leaves the name alone: it is its parent's ring, still in use."""
        if os.getpid() != self.pid:
            return
        try:
            posix_ipc.unlink_shared_memory(self.shm_name)
        except posix_ipc.ExistentialError:
            pass


def _reserve(fd: int, size: int, sname: str) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            return  # a filesystem without fallocate: pages come on first touch
        if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            try:
                free = f"{shutil.disk_usage('/dev/shm').free / 2**20:.0f} MiB free"
            except OSError:
                free = "less free"
            raise RingError(
                f"the engine's row ring {sname} needs {size / 2**20:.1f} MiB of shared memory (max_reqs x window "
                f"x row_bytes) and /dev/shm has {free}: give it more (docker run --shm-size=...) or set "
                f"DSPARK_SHARED_RING=0 to keep the ring private (rows are then copied twice)") from e
        raise


def write_ring_name(mm, shm_name: str) -> None:
    """Engine, holding the attach claim: name its ring ("" = a private ring: rows go by the staging)."""
    raw = shm_name.encode("ascii")
    if len(raw) > _NAME_MAX:
        raise ValueError(f"ring name {shm_name!r} longer than {_NAME_MAX} bytes")
    mm[RING_OFF + _LEN.size:RING_OFF + _LEN.size + len(raw)] = raw
    mm[RING_OFF:RING_OFF + _LEN.size] = _LEN.pack(len(raw))


def read_ring_name(mm) -> str:
    """Proxy, after `attached`: the ring the engine named, "" when none (or unreadable)."""
    (n,) = _LEN.unpack(bytes(mm[RING_OFF:RING_OFF + _LEN.size]))
    if n == 0 or n > _NAME_MAX:
        return ""
    try:
        raw = bytes(mm[RING_OFF + _LEN.size:RING_OFF + _LEN.size + n]).decode("ascii")
    except UnicodeDecodeError:
        return ""
    return raw if _NAME_RE.match(raw) else ""


def open_ring(shm_name: str, nbytes: int) -> np.ndarray:
    """Proxy: map the engine's ring read-only (the proxy never writes rows); RingError if it is gone or
    not the size the layout says."""
    try:
        shm = posix_ipc.SharedMemory(shm_name, 0, read_only=True)
    except posix_ipc.ExistentialError as e:
        raise RingError(f"the engine's ring {shm_name} is gone") from e
    try:
        if shm.size != nbytes:
            raise RingError(f"the engine's ring {shm_name} holds {shm.size} bytes, the layout says {nbytes}")
        mm = mmap.mmap(shm.fd, nbytes, prot=mmap.PROT_READ)
    finally:
        shm.close_fd()
    return np.frombuffer(mm, dtype=np.uint8, count=nbytes)
