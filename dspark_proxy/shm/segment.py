"""One proxy's POSIX shared-memory segment: create (proxy), open and validate (engine), views, unlink.

A segment is never reinitialised in place. The proxy creates it exclusively (mode 0600); a segment
left by a dead owner is reported, unlinked and created anew; one whose owner is alive is refused.
Each creation is a new *incarnation*, which is how the engine side tells a restarted proxy from
the one it attached to.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import shutil
import time

import numpy as np
import posix_ipc

from . import _hostflag
from .layout import (
    HEADER_BYTES,
    HEADER_DTYPE,
    LAYOUT_VERSION,
    MAGIC,
    META_SLOTS,
    Layout,
    LayoutParams,
    State,
    Word,
    header_name,
)
from .refusals import record_refusal
from .ring_shm import reap_stale

__all__ = ["SegmentError", "SegmentBusy", "LayoutMismatch", "Segment", "shm_name", "DEFAULT_NAME",
           "process_start_ticks", "owner_alive"]

log = logging.getLogger(__name__)

DEFAULT_NAME = "dspark"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


CREATING_GRACE_S = 2.0  # a headerless segment younger than this is being created, not left over


def _age_size(sname: str) -> tuple[float | None, int]:
    """Seconds since the segment's file was created, and its size (POSIX shm is /dev/shm on Linux)."""
    try:
        st = os.stat("/dev/shm" + sname)
    except OSError:
        return None, 0
    return max(0.0, time.time() - st.st_ctime), st.st_size


class SegmentError(RuntimeError):
    """The segment cannot be used (missing, corrupt, wrong version)."""


class SegmentBusy(SegmentError):
    """Another live proxy owns a segment of this name."""


class LayoutMismatch(SegmentError):
    """The segment's parameters differ from what this side expects; `field` names the first one."""

    def __init__(self, field: str, segment_value: object, expected: object, name: str) -> None:
        self.field, self.segment_value, self.expected = field, segment_value, expected
        super().__init__(
            f"dspark-proxy segment {name!r}: {field} is {segment_value!r} in the segment but the engine "
            f"expects {expected!r}; start the proxy with the engine's {field.replace('_', '-')} "
            f"(dspark-proxy start --{field.replace('_', '-')} ...)")


def shm_name(name: str | None) -> str:
    """The POSIX object name for a user-facing --name (the one place names are derived)."""
    name = DEFAULT_NAME if name is None else name
    if not _NAME_RE.match(name):
        raise ValueError(f"segment name {name!r}: use 1-100 of A-Z a-z 0-9 _ . -")
    return f"/dspark-proxy.{name}"


def process_start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 if it does not exist): tells a reused pid
    from the process that created a segment."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    try:
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (ValueError, IndexError):
        return 0


def owner_alive(pid: int, start_ticks: int) -> bool:
    if not 0 < pid <= 0x7FFF_FFFF:  # outside pid_t (a damaged header): nobody's; os.kill would overflow
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    ticks = process_start_ticks(pid)
    if ticks == 0 or start_ticks == 0:
        return ticks != 0 or start_ticks == 0
    if ticks != start_ticks:
        return False
    try:  # a zombie still answers kill(0) but will never beat again
        with open(f"/proc/{pid}/stat", "rb") as f:
            st = f.read()
        return st[st.rindex(b")") + 2:st.rindex(b")") + 3] != b"Z"
    except OSError:
        return False


def _reserve(fd: int, size: int, sname: str) -> None:
    """Give the segment all its pages now. tmpfs allocates a page when it is first touched, and a
    /dev/shm smaller than the segment (Docker's default is 64 MB) would then kill whichever process
    touches a missing page first with SIGBUS: the engine, writing its staging, as likely as the
    proxy. posix_fallocate fails here instead, at start, with a message that says what to do."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            return  # a shared memory filesystem without fallocate: pages come on first touch
        if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            try:
                free = f"{shutil.disk_usage('/dev/shm').free / 2**20:.0f} MiB free"
            except OSError:
                free = "less free"
            raise SegmentError(
                f"segment {sname} needs {size / 2**20:.1f} MiB of shared memory and /dev/shm has {free}: "
                f"give it more (docker run --shm-size=...) or lower --staging-budget-mb") from e
        raise


class Segment:
    """A mapped segment and numpy views onto its regions.

    Views (all zero-copy): `header` (record), `staging` [max_rows, row_bytes] uint8, `meta` [64] and
    `desc` [64] structured, `windows` [R] structured, `resync_req` (record), `page` int32 [size].
    Words are read and written only through the hostflag functions (`word()`, `set_word()`, ...).
    """

    def __init__(self, name: str | None, mm: mmap.mmap, layout: Layout, owner: bool) -> None:
        self.name = DEFAULT_NAME if name is None else name
        self.shm_name = shm_name(name)
        self.mm = mm
        self.layout = layout
        self.owner = owner
        self._closed = False
        lay = layout
        p = lay.params
        self.header = np.ndarray((), HEADER_DTYPE, buffer=mm, offset=0)
        self.staging = np.ndarray((p.max_rows if p.segment_rows else 0, p.row_bytes), np.uint8, buffer=mm,
                                  offset=lay.staging)
        self.meta = np.ndarray((META_SLOTS,), lay.meta_dtype, buffer=mm, offset=lay.meta)
        self.desc = np.ndarray((META_SLOTS,), lay.desc_dtype, buffer=mm, offset=lay.desc)
        self.windows = np.ndarray((p.resync_per_round,), lay.window_dtype, buffer=mm, offset=lay.windows)
        self.resync_req = np.ndarray((), lay.resync_req_dtype, buffer=mm, offset=lay.resync_req)
        self.page = np.ndarray((lay.reply.size,), np.int32, buffer=mm, offset=lay.page)
        self.incarnation = int(self.header["incarnation"])
        self.inode = 0  # of the shm object: the name now naming another inode means a new incarnation

    # ------------------------------------------------------------------ create / open

    @classmethod
    def create(cls, name: str | None, params: LayoutParams, *, deadline_ms: float) -> Segment:
        """Create a new incarnation (the proxy side). Reclaims a stale segment; refuses a live owner's."""
        lay = Layout(params)
        sname = shm_name(name)
        try:
            shm = posix_ipc.SharedMemory(sname, posix_ipc.O_CREX, mode=0o600, size=lay.total_bytes)
        except posix_ipc.ExistentialError:
            cls._reclaim_stale(name)
            shm = posix_ipc.SharedMemory(sname, posix_ipc.O_CREX, mode=0o600, size=lay.total_bytes)
        try:
            _reserve(shm.fd, lay.total_bytes, sname)
            mm = mmap.mmap(shm.fd, lay.total_bytes)
            inode = os.fstat(shm.fd).st_ino
        except BaseException:
            shm.close_fd()
            posix_ipc.unlink_shared_memory(sname)
            raise
        shm.close_fd()
        seg = cls(name, mm, lay, owner=True)
        seg.inode = inode
        h = seg.header
        # the owner first and the magic last: a reader that sees the magic sees a whole header, and a
        # competing start that finds no magic yet can tell "being created" from "left over" by age
        h["owner_pid"] = os.getpid()
        h["owner_start_ticks"] = process_start_ticks(os.getpid())
        for k, v in lay.header_values().items():
            if k != "magic":
                h[k] = v
        h["deadline_ms"] = float(deadline_ms)
        h["start_time_ns"] = time.time_ns()
        h["incarnation"] = seg.incarnation = time.time_ns()
        seg.set_word(Word.HEARTBEAT_NS, _hostflag.monotonic_ns())
        seg.set_word(Word.STATE, State.STARTING)
        _hostflag.store_release(mm, 0, MAGIC)  # release: pairs with the acquire in open()'s magic check
        reap_stale(name or DEFAULT_NAME)  # rings of engines that died without closing (shm/ring_shm.py)
        return seg

    @classmethod
    def _reclaim_stale(cls, name: str | None) -> None:
        sname = shm_name(name)
        try:
            old = cls.open(name)
        except SegmentError as e:
            age_s, size = _age_size(sname)
            # create() sizes the object at once and writes the header magic-last: a young object of
            # size 0 (not yet sized) or of a whole header without magic is another start's, mid-create
            if age_s is not None and age_s < CREATING_GRACE_S and (size == 0 or size >= HEADER_BYTES):
                raise SegmentBusy(f"segment {sname} is being created by another proxy ({age_s:.2f} s old, "
                                  f"no header yet): one proxy per --name") from e
            log.warning("[segment] %s: unreadable leftover (%s): unlinking it", sname, e)
        else:
            h = old.header
            pid, ticks = int(h["owner_pid"]), int(h["owner_start_ticks"])
            alive = owner_alive(pid, ticks)
            state = old.word(Word.STATE)
            old.close()
            if alive and pid != os.getpid():
                raise SegmentBusy(
                    f"segment {sname} is owned by a live proxy (pid {pid}, state "
                    f"{State.NAMES.get(state, state)}): stop it (dspark-proxy stop --name "
                    f"{name or DEFAULT_NAME}) or choose another --name")
            log.warning("[segment] %s: stale segment of pid %d (alive=%s, state=%s): unlinking it",
                        sname, pid, alive, State.NAMES.get(state, state))
        try:
            posix_ipc.unlink_shared_memory(sname)
        except posix_ipc.ExistentialError:
            pass

    @classmethod
    def open(cls, name: str | None) -> Segment:
        """Map an existing segment (the engine side, `status`, `stop`). Checks magic, version and size."""
        sname = shm_name(name)
        try:
            shm = posix_ipc.SharedMemory(sname)
        except posix_ipc.ExistentialError as e:
            raise SegmentError(f"no dspark-proxy segment {sname}: is `dspark-proxy start --name "
                               f"{name or DEFAULT_NAME}` running?") from e
        try:
            size = shm.size
            if size < HEADER_BYTES:
                raise SegmentError(f"segment {sname} is {size} bytes: smaller than its header (being created?)")
            mm = mmap.mmap(shm.fd, size)
            inode = os.fstat(shm.fd).st_ino
        finally:
            shm.close_fd()
        try:
            magic = _hostflag.load(mm, 0)  # acquire: pairs with create()'s release store of the magic
            hdr = np.ndarray((), HEADER_DTYPE, buffer=mm, offset=0).copy()
            if magic != MAGIC:
                raise SegmentError(f"segment {sname}: bad magic {magic:#x} (not a dspark-proxy "
                                   f"segment, or still being created)")
            if int(hdr["layout_version"]) != LAYOUT_VERSION:
                raise SegmentError(f"segment {sname}: layout version {int(hdr['layout_version'])}, this "
                                   f"side speaks {LAYOUT_VERSION}: run the same dspark-proxy version on both sides")
            params = LayoutParams.from_header(hdr)
            lay = Layout(params)
            if lay.total_bytes != int(hdr["total_bytes"]) or lay.total_bytes != size:
                raise SegmentError(f"segment {sname}: size {size} / header {int(hdr['total_bytes'])} does not "
                                   f"match its parameters ({lay.total_bytes} bytes)")
        except (SegmentError, ValueError) as e:
            mm.close()
            if isinstance(e, SegmentError):
                raise
            raise SegmentError(f"segment {sname}: corrupt header: {e}") from e
        seg = cls(name, mm, lay, owner=False)
        seg.inode = inode
        return seg

    def name_moved(self) -> bool:
        """The name now names another object (a new incarnation, or none): one stat, no mapping."""
        try:
            return os.stat("/dev/shm" + self.shm_name).st_ino != self.inode
        except OSError:
            return True

    def check_params(self, **expected: object) -> None:
        """Engine side: raise LayoutMismatch naming the first parameter that differs (None = not
        checked), after recording the refusal in the segment, where `status` lists it (refusals.py)."""
        for k, v in expected.items():
            if v is None:
                continue
            got = self.header[header_name(k)].item()
            if isinstance(v, bool):
                got = bool(got)
            if got != v:
                try:
                    record_refusal(self.mm, k, got, v)
                except (ValueError, OSError, TypeError) as e:  # never hides the mismatch itself
                    log.warning("[shim] could not record the refusal in %s: %s", self.shm_name, e)
                raise LayoutMismatch(k, got, v, self.name)

    # ------------------------------------------------------------------ words

    def word(self, index: int) -> int:
        return _hostflag.load(self.mm, self.layout.word_off(index))

    def set_word(self, index: int, value: int) -> None:
        _hostflag.store(self.mm, self.layout.word_off(index), int(value))

    def words(self) -> dict[str, int]:
        return {n: self.word(i) for i, n in enumerate(Word.NAMES)}

    @property
    def deadline_ms(self) -> float:
        return float(self.header["deadline_ms"])

    @property
    def params(self) -> LayoutParams:
        return self.layout.params

    # ------------------------------------------------------------------ stats blocks

    def write_block(self, which: str, data: bytes) -> None:
        """Publish a stats snapshot ("proxy" or "shim") through its seqlock; one writer per block."""
        off = self.layout.proxy_stats if which == "proxy" else self.layout.shim_stats
        seq = Word.PROXY_STATS_SEQ if which == "proxy" else Word.SHIM_STATS_SEQ
        limit = self.layout.regions[f"{which}_stats"][1] - 8
        if len(data) > limit:
            raise ValueError(f"{which} stats snapshot of {len(data)} bytes > {limit}")
        _hostflag.seq_write(self.mm, self.layout.word_off(seq), off, len(data).to_bytes(8, "little") + data)

    def read_block(self, which: str) -> bytes | None:
        """The latest consistent snapshot, or None if none was ever written (or it kept changing)."""
        off = self.layout.proxy_stats if which == "proxy" else self.layout.shim_stats
        seq = Word.PROXY_STATS_SEQ if which == "proxy" else Word.SHIM_STATS_SEQ
        size = self.layout.regions[f"{which}_stats"][1]
        dst = bytearray(size)
        if not _hostflag.seq_read(self.mm, self.layout.word_off(seq), off, dst, 100):
            return None
        n = int.from_bytes(dst[:8], "little")
        return bytes(dst[8:8 + n]) if n <= size - 8 else None

    # ------------------------------------------------------------------ close

    def close(self) -> None:
        """Drop this object's views and mapping reference. Idempotent. The owner's unlink is separate:
        see unlink().

        The mapping itself is never closed here: numpy views made with `buffer=` keep the mmap object
        alive but hold no buffer export, so an explicit mm.close() would unmap memory that a view
        still handed out (a Reply's source, a round's rows) would then touch. The mapping goes when
        the last reference to it does."""
        if self._closed:
            return
        self._closed = True
        for attr in ("header", "staging", "meta", "desc", "windows", "resync_req", "page"):
            self.__dict__.pop(attr, None)

    @staticmethod
    def unlink_name(name: str) -> None:
        """Remove the segment of this name if there is one (whoever made it: a clean-up after its
        proxy was killed)."""
        try:
            seg = Segment.open(name)
        except SegmentError:
            return
        try:
            seg.unlink()
        finally:
            seg.close()

    def unlink(self) -> None:
        """Remove the name (only if it is still this incarnation: never someone else's segment)."""
        try:
            cur = Segment.open(self.name)
        except SegmentError:
            return
        try:
            same = cur.incarnation == self.incarnation
        finally:
            cur.close()
        if same:
            try:
                posix_ipc.unlink_shared_memory(self.shm_name)
            except posix_ipc.ExistentialError:
                pass

    def __enter__(self) -> Segment:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.owner:
            self.unlink()
        self.close()
