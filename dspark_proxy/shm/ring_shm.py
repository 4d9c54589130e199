"""The engine's row ring as a shared object of its own, so that a round's rows cross the engine side
once: `enqueue` writes them there and the proxy sends from there (shm_layout.md §1, "The engine's
shared ring").

Why not a region of the segment: each proxy incarnation makes a new segment, while the ring must outlive
it (a restarted proxy resyncs the worker from the rows the engine still holds). So the engine owns its
ring for its whole life, names it in the header of every incarnation it claims (bytes 2304..2431, next
to the engine target), and each incarnation's proxy maps it read-only.

The ring is a memfd sealed against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
named in the header as `/proc/<engine pid>/fd/<fd>`: the proxy opens that path and maps it only if the
seals are there, so nothing a peer does (an ftruncate by anything with the engine's uid) can make a
mapped page go away under the proxy's reads (a SIGBUS in the proxy, shm_layout.md §9). A memfd has no
name another user can squat and vanishes with its last holder, whatever way the engine ends. Where
memfd_create or sealing is refused (a kernel before 3.17, a seccomp filter) the ring is a POSIX object
`/dspark-ring.<name>.<engine pid>.<random token>`: nobody can predict its name, a taken one is never
unlinked (another try with another token), and any refusal leaves the engine a private ring. Such a
named ring is not sealed (tmpfs files cannot be): its truncation can still fault the proxy (§9).

Every page is reserved at creation (posix_fallocate, as the segment is): a /dev/shm too small for the
ring fails here, with a message, instead of a SIGBUS in whichever process touches a missing page.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import mmap
import os
import re
import secrets
import shutil
import struct

import numpy as np
import posix_ipc

from .layout import HEADER_DTYPE, PAGE

__all__ = ["enabled", "mode", "unlink_rings", "reap_stale", "RING_OFF", "RingError", "SharedRing", "ring_shm_name",
           "write_ring_name", "read_ring_name", "open_ring", "SEALS"]

RING_OFF = 2304  # byte offset in the header page (the engine target ends at 2048 + 2 + 254)
_NAME_MAX = 126  # bytes of the object name (a u16 length before it)
_LEN = struct.Struct("<H")
_NAME_RE = re.compile(r"^/dspark-ring\.[A-Za-z0-9_.-]{1,100}\.[0-9]{1,10}\.[0-9a-f]{1,32}$")
_PROC_RE = re.compile(r"^/proc/([0-9]{1,10})/fd/([0-9]{1,10})$")
_TOKEN_RE = re.compile(r"^[0-9a-f]{1,32}$")
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL  # the memfd's: its size is fixed for good
_TRIES = 4  # named rings: tokens tried before the engine keeps a private ring
_named_live: set[tuple[int, str]] = set()  # (creator pid, name) of named rings not closed yet (atexit)
assert HEADER_DTYPE.itemsize <= RING_OFF and RING_OFF + _LEN.size + _NAME_MAX <= PAGE


def mode() -> str:
    """`DSPARK_SHARED_RING`: "memfd" (the default, `1`: a sealed memfd, else a named ring), "named" (a
    named ring only: kernels or sandboxes without memfd, tests) or "private" (`0`: the ring stays private
    and each round's rows are copied into the segment's staging as well)."""
    v = os.environ.get("DSPARK_SHARED_RING", "1").strip().lower()
    return "private" if v == "0" else "named" if v == "named" else "memfd"


def enabled() -> bool:
    """Whether a shim built now puts its ring in shared memory (`mode()` is not "private")."""
    return mode() != "private"


class RingError(RuntimeError):
    """The shared ring cannot be made (no room in /dev/shm) or opened (gone, wrong size, not sealed)."""


def ring_shm_name(name: str, pid: int, token: str) -> str:
    """A named ring's POSIX object name for a segment name, the engine's pid and a random token."""
    return f"/dspark-ring.{name}.{int(pid)}.{token}"


def _rings_of(name: str) -> list[tuple[str, int]]:
    """(object name, pid) of every named ring of this segment name in /dev/shm."""
    prefix = f"dspark-ring.{name}."
    try:
        entries = os.listdir("/dev/shm")
    except OSError:
        return []
    out = []
    for e in entries:
        rest = e[len(prefix):].split(".") if e.startswith(prefix) else []
        if len(rest) == 2 and rest[0].isdigit() and _TOKEN_RE.match(rest[1]):  # a longer name has more parts
            out.append(("/" + e, int(rest[0])))
    return out


def _unlink(obj: str) -> None:
    """Remove a named ring; one that is gone, or another user's (a sticky /dev/shm refuses), is left."""
    try:
        posix_ipc.unlink_shared_memory(obj)
    except posix_ipc.Error:
        pass


def unlink_rings(name: str) -> None:
    """Remove every named ring of this segment name this user may remove (test and fuzz clean-up)."""
    for obj, _pid in _rings_of(name):
        _unlink(obj)


def _ended(pid: int) -> bool:
    """The process is gone or a zombie (it exited: its parent has not reaped it yet). A pid of another
    user's live process, or one this process cannot see, is not judged ended."""
    if not 0 < pid <= 0x7FFF_FFFF:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            st = f.read()
    except OSError:
        return False
    return st[st.rindex(b")") + 2:st.rindex(b")") + 3] in (b"Z", b"X")


def reap_stale(name: str) -> None:
    """Unlink named rings of this segment name left by engines that ended without closing (best
    effort: killed, or a zombie not reaped yet): a new shim of the name does it, each new proxy
    incarnation, and a proxy waiting for an engine once a second (shm_layout.md §9). Another user's
    object is left alone (the unlink is refused) and never stops the caller."""
    for obj, pid in _rings_of(name):
        if _ended(pid):
            _unlink(obj)


class SharedRing:
    """The engine's side: the ring, created and reserved, mapped read-write; close() lets it go.

    `shm_name` is what the header names: `/proc/<pid>/fd/<fd>` for a sealed memfd, the object's name
    for a named ring. `kind` is "memfd" or "named"."""

    def __init__(self, name: str, nbytes: int, kind: str | None = None) -> None:
        self.pid = os.getpid()
        self.nbytes = int(nbytes)
        if self.nbytes <= 0:
            raise RingError(f"the engine's row ring needs a size > 0, got {self.nbytes}")
        self.fd = -1
        reap_stale(name)  # named rings of ended engines of this name (a memfd leaves none)
        kind = kind or mode()
        if kind == "memfd":
            try:
                self._memfd(name)
                return
            except RingError:
                raise  # no room: a named ring would not fit either
            except OSError:
                pass  # no memfd or no sealing here: a named ring
        self._named(name)

    def _memfd(self, name: str) -> None:
        fd = os.memfd_create(f"dspark-ring.{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, self.nbytes)
            _reserve(fd, self.nbytes, f"memfd:dspark-ring.{name}")
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            self.mm = _map(fd, self.nbytes)
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.kind = fd, "memfd"
        self.shm_name = f"/proc/{self.pid}/fd/{fd}"
        self.array = np.frombuffer(self.mm, dtype=np.uint8, count=self.nbytes)

    def _named(self, name: str) -> None:
        why = ""
        for _ in range(_TRIES):
            sname = ring_shm_name(name, self.pid, secrets.token_hex(8))
            try:
                shm = posix_ipc.SharedMemory(sname, posix_ipc.O_CREX, mode=0o600, size=self.nbytes)
                break
            except posix_ipc.ExistentialError:  # taken (by whom we cannot tell): never unlinked, another token
                why = f"{sname} exists"
            except posix_ipc.Error as e:
                raise RingError(f"the engine's row ring {sname}: {e}") from e
        else:
            raise RingError(f"the engine's row ring: {_TRIES} names taken (last: {why})")
        try:
            _reserve(shm.fd, self.nbytes, sname)
            self.mm = _map(shm.fd, self.nbytes)
        except BaseException:
            shm.close_fd()
            _unlink(sname)
            raise
        shm.close_fd()
        self.kind, self.shm_name = "named", sname
        _named_live.add((self.pid, sname))
        self.array = np.frombuffer(self.mm, dtype=np.uint8, count=self.nbytes)

    def close(self) -> None:
        """Let the ring go: a memfd's fd is closed (the memory goes with the last mapping, the proxy's
        included), a named ring's name removed. Idempotent. A forked child that inherited this object
        closes its own copy of the fd and leaves a named ring's name alone: it is its parent's, in use."""
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
            return
        if os.getpid() != self.pid or getattr(self, "kind", "") != "named":
            return
        _named_live.discard((self.pid, self.shm_name))
        _unlink(self.shm_name)


@atexit.register
def _unlink_at_exit() -> None:
    """A process that exits without closing its shim (vLLM never calls the proposer's close) removes
    its named rings; a memfd needs nothing (shm_layout.md §9)."""
    me = os.getpid()
    for pid, sname in list(_named_live):
        if pid == me:
            _unlink(sname)
    _named_live.clear()


def _map(fd: int, nbytes: int) -> mmap.mmap:
    # mapped with its page tables filled: otherwise each of the first W rounds of a slot takes a
    # minor fault per 4 KiB it writes (measured: enqueue of 256 x 71,680 B rows 8.6 ms instead of
    # 0.9 ms until every slot had wrapped once)
    return mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))


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
    return raw if _NAME_RE.match(raw) or _PROC_RE.match(raw) else ""


def open_ring(shm_name: str, nbytes: int, engine_pid: int | None = None) -> np.ndarray:
    """Proxy: map the engine's ring read-only (the proxy never writes rows); RingError if it is gone,
    not the size the layout says, or (a memfd) not the engine's or not sealed against shrinking."""
    m = _PROC_RE.match(shm_name)
    if m:
        return _open_memfd(shm_name, int(m.group(1)), nbytes, engine_pid)
    try:
        shm = posix_ipc.SharedMemory(shm_name, 0, read_only=True)
    except posix_ipc.Error as e:
        raise RingError(f"the engine's ring {shm_name} cannot be opened: {e}") from e
    try:
        if shm.size != nbytes:
            raise RingError(f"the engine's ring {shm_name} holds {shm.size} bytes, the layout says {nbytes}")
        mm = mmap.mmap(shm.fd, nbytes, prot=mmap.PROT_READ)
    finally:
        shm.close_fd()
    return np.frombuffer(mm, dtype=np.uint8, count=nbytes)


def _open_memfd(path: str, pid: int, nbytes: int, engine_pid: int | None) -> np.ndarray:
    """The seals are the guarantee, not the check of a moment: a file sealed against shrinking keeps
    every page its size covers, so no later ftruncate can fault the proxy's reads."""
    if engine_pid is not None and pid != engine_pid:
        raise RingError(f"the engine's ring {path} is not the attached engine's (pid {engine_pid})")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)  # a FIFO or tty: no wait
    except OSError as e:
        raise RingError(f"the engine's ring {path} cannot be opened: {e.strerror}") from e
    try:
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError as e:
            raise RingError(f"the engine's ring {path} is not a sealed memfd: {e.strerror}") from e
        if not seals & fcntl.F_SEAL_SHRINK:  # (seals are never removed: this one holds for good)
            raise RingError(f"the engine's ring {path} is not sealed against shrinking (seals {seals:#x})")
        size = os.fstat(fd).st_size
        if size != nbytes:
            raise RingError(f"the engine's ring {path} holds {size} bytes, the layout says {nbytes}")
        mm = mmap.mmap(fd, nbytes, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=np.uint8, count=nbytes)
