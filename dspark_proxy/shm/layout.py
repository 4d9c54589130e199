"""The shared-memory segment's layout: every region's offset, size and dtype, computed in one place.

`shm_layout.md` is the prose reference (who writes which word, in which order); this module is the
arithmetic. Both sides derive every offset from the header's parameters through `Layout`, so the
engine and the proxy cannot disagree about where anything is.

Regions, in order (each start aligned; the reply page and the staging page-aligned so they can be
pinned for the GPU):

    header | words | reply page | gather staging | meta slots[64] | desc slots[64]
           | resync request block | resync windows[R] | proxy stats | shim stats
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..limits import SUPPORT_K
from . import _hostflag

__all__ = [
    "MAGIC", "LAYOUT_VERSION", "META_SLOTS", "PAGE", "CACHE_LINE", "WORD_STRIDE", "Word", "State",
    "HEADER_DTYPE", "HEADER_BYTES", "STATUS_OK", "STATUS_SOME_FAILED", "STATUS_ROUND_FAILED",
    "STATUS_NAMES", "SUPPORT_K", "LayoutParams", "Layout", "header_name", "ReplyPageLayout", "meta_dtype", "desc_dtype",
    "window_dtype", "derive_sizes", "RESYNC_ENQUEUE_BYTES", "resync_windows_per_enqueue",
]

MAGIC = int.from_bytes(b"DSPKPRXY", "little")
LAYOUT_VERSION = 4  # 4: the engine answers rounds the proxy promised paused (words 16, 17); 3: the engine names its shared ring (header bytes 2304..2431); 2: resync request round, n_drafts
META_SLOTS = 64  # round t's metadata and descriptor live in slot t % 64
PAGE = 4096
CACHE_LINE = 64
WORD_STRIDE = _hostflag.WORD_STRIDE  # each word on its own 128-byte false-sharing range
STATS_BLOCK_BYTES = 64 * 1024  # one JSON snapshot (length-prefixed) per side

STATUS_OK = 0  # every request that needed drafts got usable drafts
STATUS_SOME_FAILED = 1  # some did not (see n_drafts / ok_mask)
STATUS_ROUND_FAILED = _hostflag.ROUND_FAILED  # no drafts this round: the engine runs target-only
STATUS_NAMES = {STATUS_OK: "ok", STATUS_SOME_FAILED: "some_failed", STATUS_ROUND_FAILED: "round_failed"}


class Word:
    """Index of each 64-bit word in the words region (byte offset = index * WORD_STRIDE).

    The first four are the round words the C extension works on; their indices come from it.
    """

    GATHERED = _hostflag.GATHERED  # engine: round t's staging, meta and descriptor are complete
    CLAIMED = _hostflag.CLAIMED  # proxy | watchdog | fail_all (CAS): who owns round t's reply
    PUBLISHED = _hostflag.PUBLISHED  # claim winner: the page holds its reply for round t
    CONSUMED = _hostflag.CONSUMED  # engine: done copying round t's reply
    GATHERED_NS = 4  # engine: CLOCK_MONOTONIC when `gathered` was raised (the deadline's start)
    HEARTBEAT_NS = 5  # proxy heartbeat thread: CLOCK_MONOTONIC of its last beat
    STATE = 6  # proxy: State
    ATTACHED = 7  # engine: the round t0 it attached at (0 = no engine yet); set once, by CAS
    ENGINE_PID = 8  # engine: pid of the attached engine process
    ABANDONED = 9  # engine or proxy: 1 = this incarnation is finished, nobody reads its page again
    RESYNC_SEQ = 10  # proxy: seqlock sequence of the resync request block
    PROXY_STATS_SEQ = 11  # proxy: seqlock sequence of the proxy stats block
    SHIM_STATS_SEQ = 12  # engine: seqlock sequence of the shim stats block
    PROXY_ROUND = 13  # proxy: the round it is working on (status display only)
    ROUND_N = 14  # engine: requests in the round being gathered (before `gathered`; the watchdog's failed page)
    PUBLISHED_NS = _hostflag.PUBLISHED_NS  # proxy's publish: CLOCK_MONOTONIC after its copy (the engine's spin)
    PAUSED_THROUGH = 16  # proxy: every round up to it gets no drafts (the gate paused the batch); raise only
    ENQUEUING = 17  # engine: the round whose enqueue has begun (before any row of it is written)
    COUNT = 18

    NAMES = ("gathered", "claimed", "published", "consumed", "gathered_ns", "heartbeat_ns", "state",
             "attached", "engine_pid", "abandoned", "resync_seq", "proxy_stats_seq", "shim_stats_seq",
             "proxy_round", "round_n", "published_ns", "paused_through", "enqueuing")


assert len(Word.NAMES) == Word.COUNT
assert (Word.GATHERED, Word.CLAIMED, Word.PUBLISHED, Word.CONSUMED, Word.PUBLISHED_NS) == (0, 1, 2, 3, 15)


class State:
    """The proxy's lifecycle, in the STATE word. Only the proxy writes it."""

    STARTING = 0
    READY = 1
    STOPPING = 2
    DEAD = 3
    NAMES = {0: "starting", 1: "ready", 2: "stopping", 3: "dead"}


HEADER_DTYPE = np.dtype(
    [
        ("magic", "<u8"),
        ("layout_version", "<u4"),
        ("header_bytes", "<u4"),
        ("total_bytes", "<u8"),
        ("max_slots", "<u4"),
        ("num_spec", "<u4"),
        ("window", "<u4"),
        ("row_bytes", "<u4"),
        ("max_rows", "<u4"),
        ("resync_per_round", "<u4"),
        ("sampled", "<u4"),
        ("meta_rows", "<u4"),
        ("deadline_ms", "<f8"),
        ("owner_pid", "<i8"),
        ("owner_start_ticks", "<u8"),  # /proc/<pid>/stat starttime: tells a reused pid from the owner
        ("start_time_ns", "<i8"),  # wall clock at creation (status display)
        ("incarnation", "<u8"),
        ("segment_rows", "<u4"),  # 1: the staging and the windows' rows are here (a private engine ring)
    ]
)
HEADER_BYTES = PAGE
assert HEADER_DTYPE.itemsize <= HEADER_BYTES

_LAYOUT_FIELDS = ("max_reqs", "num_spec", "window", "row_bytes", "max_rows", "resync_per_round", "sampled",
                  "segment_rows")
_HEADER_NAMES = {"max_reqs": "max_slots"}  # a parameter whose header field keeps its on-disk name


def header_name(param: str) -> str:
    """The header field of a LayoutParams field (the header's names are on disk and in `status --json`)."""
    return _HEADER_NAMES.get(param, param)


def _up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def derive_sizes(max_reqs: int, num_spec: int, window: int, row_bytes: int, staging_budget_mb: float
                 ) -> tuple[int, int]:
    """Default ``(max_rows, resync_per_round)`` from the staging budget in MiB (shm_layout.md §1, "Sizes").

    ``max_rows`` never goes below one full decode round (M x (N+1) rows) and never above what a round can
    send at all (M x W, each request sending at most W rows); in between, the budget decides. Resync
    windows cost W rows each, so the budget decides how many a round stages, at least 4 (so recovery
    after a mass invalidation makes progress), at most M.
    """
    budget = int(staging_budget_mb * 1024 * 1024)
    max_rows = min(max_reqs * window, max(max_reqs * (num_spec + 1), budget // row_bytes))
    resync = min(max_reqs, max(4, budget // (window * row_bytes)))
    return int(max_rows), int(resync)


@dataclass(frozen=True)
class LayoutParams:
    """Every parameter the layout depends on; both sides must agree on all of them."""

    max_reqs: int  # M: requests per round, and slot ids are < M (header field max_slots)
    num_spec: int  # N: draft positions per request
    window: int  # W: rows the drafter keeps per request
    row_bytes: int
    max_rows: int  # rows the gather staging holds per round
    resync_per_round: int  # R: ring windows the engine stages per round on request
    sampled: bool = False
    # the staging and the resync windows' rows are in the segment, for an engine whose ring is private;
    # without them (the proxy's default) rows are read from the engine's shared ring only (§1)
    segment_rows: bool = True

    def __post_init__(self) -> None:
        for name, lo, hi in (("max_reqs", 1, 1 << 20), ("num_spec", 1, 255), ("window", 1, 1 << 16),
                             ("row_bytes", 1, 1 << 26), ("max_rows", 1, 1 << 26),
                             ("resync_per_round", 1, 1 << 20)):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
                raise ValueError(f"layout parameter {name}={v!r} outside [{lo}, {hi}]")
        if self.resync_per_round > self.max_reqs:
            raise ValueError(f"resync_per_round={self.resync_per_round} > max_reqs={self.max_reqs}")

    @property
    def meta_rows(self) -> int:
        """Metadata rows per request: valid, first_pos, anchor, sampled (+ seed, temperature)."""
        return 6 if self.sampled else 4

    @classmethod
    def from_header(cls, h: np.void) -> LayoutParams:
        flags = ("sampled", "segment_rows")
        return cls(**{f.name: (bool(h[f.name]) if f.name in flags else int(h[header_name(f.name)]))
                      for f in fields(cls)})


class ReplyPageLayout:
    """Offsets (in int32 units) of the reply page in the segment (the wire's REPLY is wire.ReplyLayout).

    [status, n, n_drafts[M], drafts[M*N], conf_bits[M*N]] and in sampled mode
    [sample_mask[M], support_ids[M*N*32], q_bits[M*N*32]]; floats are stored as their bits.
    n_drafts[i] (0..N, the word once called ok_mask) is how many of request i's drafts are usable;
    past it every draft is -1, every confidence 0, every support id -1 and q 0; a request with none
    has every field cleared. `o_ok` keeps its name.
    """

    def __init__(self, max_reqs: int, num_spec: int, sampled: bool = False) -> None:
        M, N = max_reqs, num_spec
        self.M, self.N, self.sampled = M, N, sampled
        self.o_ok = 2
        self.o_ids = self.o_ok + M
        self.o_conf = self.o_ids + M * N
        self.o_sample_mask = self.o_conf + M * N
        self.o_qids = self.o_sample_mask + M
        self.o_q = self.o_qids + M * N * SUPPORT_K
        self.size = self.o_q + M * N * SUPPORT_K if sampled else self.o_sample_mask
        self.nbytes = self.size * 4
        # a failed page: status and n, then n_drafts zeroed (nobody reads past it when status says failed)
        self.fail_zero_bytes = M * 4
        # the blocks of M requests after [status, n], as (offset, words per request): what a round of n
        # publishes and reads is the header and each block's first n (HostFlags.publish with rows, read_page with n)
        blocks = [(self.o_ok, 1), (self.o_ids, N), (self.o_conf, N)]
        if sampled:
            blocks += [(self.o_sample_mask, 1), (self.o_qids, N * SUPPORT_K), (self.o_q, N * SUPPORT_K)]
        self.rows_spec = np.array([M, *(w for b in blocks for w in b)], dtype=np.int64).tobytes()


def meta_dtype(M: int) -> np.dtype:
    """Round t's gather metadata (slot t % 64). Stamped at both ends (seqlock-style, see shm_layout.md)."""
    return _aligned([
        ("stamp_start", "<u8"),
        ("t", "<u8"),
        ("n", "<u4"),
        ("rows_staged", "<u4"),  # rows in the gather staging this round
        ("valid", "<i4", (M,)),
        ("first_pos", "<i8", (M,)),
        ("anchor", "<i8", (M,)),
        ("staged_rows", "<i4", (M,)),  # rows actually staged per request (valid, or 0 if they did not fit)
        ("sampled", "u1", (M,)),
        ("seed", "<i8", (M,)),
        ("temperature", "<f4", (M,)),
        ("stamp_end", "<u8"),
    ])


def desc_dtype(M: int, R: int) -> np.dtype:
    """Round t's BatchView (slot t % 64): what the engine scheduled, and which resync windows it staged."""
    return _aligned([
        ("stamp_start", "<u8"),
        ("t", "<u8"),
        ("n", "<u4"),
        ("max_q", "<u4"),  # longest query span
        ("rows_gathered", "<u4"),
        ("n_staged", "<u4"),  # resync windows staged with this round
        ("staged_slots", "<i4", (R,)),
        ("req_id", "<i8", (M,)),
        ("slot", "<i4", (M,)),
        ("qsl", "<i4", (M + 1,)),
        ("need_draft", "u1", (M,)),
        ("k_window", "<i4", (M,)),
        ("stamp_end", "<u8"),
    ])


def window_dtype(W: int, row_bytes: int) -> np.dtype:
    """One staged resync window: which slot, its generation and held range, then W rows by position % W."""
    rows_off = CACHE_LINE
    return np.dtype({
        "names": ["stamp", "slot", "generation", "lo", "hi", "rows"],
        "formats": ["<u8", "<i8", "<i8", "<i8", "<i8", ("u1", (W, row_bytes))],
        "offsets": [0, 8, 16, 24, 32, rows_off],
        "itemsize": _up(rows_off + W * row_bytes, CACHE_LINE),
    })


def resync_req_dtype(M: int) -> np.dtype:
    """The proxy's request: which slots' windows the engine should stage, once, with round `round`
    (shm_layout.md §5, "Resync requests")."""
    return _aligned([("count", "<u4"), ("round", "<u8"), ("slots", "<i4", (M,))])


RESYNC_ENQUEUE_BYTES = 16 << 20
"""The most ring-window bytes one `enqueue` copies for resync requests, whatever the proxy asks (at
least one window): about 2 ms of memcpy on the engine's thread. At the realistic shapes (9.2 MB windows)
that is one window a round; at small shapes every one of the R windows fits."""


def resync_windows_per_enqueue(p: LayoutParams) -> int:
    """Windows one `enqueue` stages at most: R, cut to RESYNC_ENQUEUE_BYTES (never below one)."""
    return max(1, min(p.resync_per_round, RESYNC_ENQUEUE_BYTES // (p.window * p.row_bytes)))


def _aligned(spec: list) -> np.dtype:
    d = np.dtype(spec, align=True)
    return np.dtype({"names": d.names, "formats": [d.fields[n][0] for n in d.names],
                     "offsets": [d.fields[n][1] for n in d.names], "itemsize": _up(d.itemsize, CACHE_LINE)})


class Layout:
    """Byte offsets and sizes of every region for one set of parameters."""

    def __init__(self, p: LayoutParams) -> None:
        self.params = p
        M, W, R = p.max_reqs, p.window, p.resync_per_round
        self.reply = ReplyPageLayout(M, p.num_spec, p.sampled)
        self.meta_dtype = meta_dtype(M)
        self.desc_dtype = desc_dtype(M, R)
        self.window_dtype = window_dtype(W if p.segment_rows else 0, p.row_bytes)  # 0: the record alone
        self.resync_req_dtype = resync_req_dtype(M)

        off = HEADER_BYTES
        regions: dict[str, tuple[int, int]] = {}

        def put(name: str, size: int, align: int) -> int:
            nonlocal off
            start = _up(off, align)
            regions[name] = (start, size)
            off = start + size
            return start

        self.words = put("words", Word.COUNT * WORD_STRIDE, PAGE)
        self.page = put("reply_page", self.reply.nbytes, PAGE)
        self.staging = put("staging", p.max_rows * p.row_bytes if p.segment_rows else 0, PAGE)
        self.meta = put("meta", META_SLOTS * self.meta_dtype.itemsize, PAGE)
        self.desc = put("desc", META_SLOTS * self.desc_dtype.itemsize, CACHE_LINE)
        self.resync_req = put("resync_req", self.resync_req_dtype.itemsize, CACHE_LINE)
        self.windows = put("resync_windows", R * self.window_dtype.itemsize, PAGE)
        self.proxy_stats = put("proxy_stats", STATS_BLOCK_BYTES, CACHE_LINE)
        self.shim_stats = put("shim_stats", STATS_BLOCK_BYTES, CACHE_LINE)
        self.total_bytes = _up(off, PAGE)
        self.regions = regions

    def word_off(self, index: int) -> int:
        return self.words + index * WORD_STRIDE

    def meta_off(self, t: int) -> int:
        return self.meta + (t % META_SLOTS) * self.meta_dtype.itemsize

    def desc_off(self, t: int) -> int:
        return self.desc + (t % META_SLOTS) * self.desc_dtype.itemsize

    def header_values(self) -> dict:
        """The layout part of the header (the owner fields are the segment's business)."""
        p = self.params
        return {"magic": MAGIC, "layout_version": LAYOUT_VERSION, "header_bytes": HEADER_BYTES,
                "total_bytes": self.total_bytes, "meta_rows": p.meta_rows,
                **{header_name(k): int(getattr(p, k)) for k in _LAYOUT_FIELDS}}

    def region_table(self) -> list[tuple[str, int, int]]:
        """(name, offset, bytes) for status displays and the memory benchmark."""
        return [("header", 0, HEADER_BYTES)] + [(k, o, s) for k, (o, s) in self.regions.items()]
