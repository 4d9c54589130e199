"""Per-session, per-slot windows of rows: the worker's half of the ring bookkeeping (docs/design.md,
"The worker").

Each slot holds its generation, the positions [lo, hi) it has rows for (at most the last W), and a
[W, row_bytes] array indexed by position % W, allocated when the slot is first seen. A drafter that
works on a per-row transform of the rows (the torch drafter's projection) hands it in with the rows,
all of a STEP's rows transformed at once (worker/serve.py), and the slot keeps it beside them in the
same ring (`aux`), so a round costs its new rows and never a lookup of which rows are new. It also keeps a
chain of prefix CRCs over the rows received since the window last restarted, A(p) = crc32(rows
chain_start .. p), the last W + 1 of them: each row is hashed once, when it arrives, and the
`integrity` drafter assembles any window's CRC from two chain entries (dspark_proxy.crc) instead of
re-hashing W rows every round; with any other drafter (`chains=False`) no row is hashed. Entries are
applied one by one in batch order: this is the reference the proxy's vectorised model is checked
against, so it is written for clarity, not speed.

Everything a slot keeps is in compact arrays (the chain: 4 bytes an entry, `array('I')`, as fast to
index as a list), and all of it is what the memory budget charges (`slot_bytes`): what the drafter
declares a slot holds for it (its `slot_bytes(window, row_bytes)`: the window of rows and what it keeps
beside them, the torch drafter's transforms, a head's keys and values; the rows alone when it does not
say), the chain, and a fixed overhead for the Python objects.
"""

from __future__ import annotations

import threading
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from ..wire import (
    RF_NEW_GEN,
    RS_BAD_ENTRY,
    RS_GAP,
    RS_OK,
    RS_PARTIAL_WINDOW,
    RS_STALE_GENERATION,
    RS_UNKNOWN_SLOT,
)

__all__ = ["SlotWindow", "Session", "SessionTable", "SessionRefused", "slot_bytes", "SLOT_OVERHEAD"]

SLOT_OVERHEAD = 1024  # a slot's Python objects: SlotWindow, its arrays' headers, its dict entry (measured ~700)
_CHAIN = "I"  # the chain's array type: 4-byte unsigned (a CRC-32)
assert array(_CHAIN).itemsize == 4


def slot_bytes(window: int, row_bytes: int, chains: bool, drafter_bytes: int | None = None) -> int:
    """What one slot may hold at these shapes: its rows and the drafter's state beside them
    (`drafter_bytes`, the drafter's `slot_bytes`; the rows alone when None), its CRC chain when kept,
    and the objects' overhead."""
    held = window * row_bytes if drafter_bytes is None else drafter_bytes
    return held + (4 * (window + 1) if chains else 0) + SLOT_OVERHEAD


class SlotWindow:
    """One slot's window: rows of positions [lo, hi) (hi - lo <= W) at index position % W."""

    __slots__ = ("generation", "lo", "hi", "rows", "aux", "aux_lo", "chain", "chain_start", "chains", "window")

    def __init__(self, window: int, row_bytes: int, chains: bool = True) -> None:
        self.window = window  # rows.shape[0], kept as an int: read on every entry
        self.generation = 0
        self.lo = 0
        self.hi = 0
        self.rows = np.empty((window, row_bytes), dtype=np.uint8)
        # each row's transform by the drafter ([W, width] float32 at position % W, made at the first
        # write that brings one), valid from position aux_lo on: a write without it ends the validity
        # of everything before its end, a restart begins it anew
        self.aux: np.ndarray | None = None
        self.aux_lo = 0
        # A(p) at p % (W + 1), 4 bytes each (a list of ints took 40); none without chains
        self.chain = array(_CHAIN, bytes(4 * (window + 1))) if chains else array(_CHAIN)
        self.chain_start = 0
        self.chains = chains  # only the integrity drafter reads them: a torch drafter pays no CRC

    def write(self, first_pos: int, rows: np.ndarray, restart: bool, aux: np.ndarray | None = None) -> None:
        """rows [k, row_bytes] at positions first_pos .. first_pos + k - 1; aux: their transforms [k, width]
        (the drafter's, computed for the whole STEP at once), kept in the same ring."""
        w = self.window
        k = rows.shape[0]
        if k == 0:
            return
        if aux is None:
            self.aux_lo = first_pos + k if restart else max(self.aux_lo, first_pos + k)
        else:
            if self.aux is None or self.aux.shape[1] != aux.shape[1]:
                self.aux = np.zeros((w, aux.shape[1]), dtype=np.float32)
                self.aux_lo = first_pos
            elif restart:
                self.aux_lo = first_pos
            _ring_put(self.aux, first_pos % w, aux)
        if self.chains:
            R = w + 1
            chain = self.chain
            if restart:
                self.chain_start = first_pos
            prev = 0 if restart else chain[(first_pos - 1) % R]
            for j in range(k):  # each row hashed once, as it arrives
                prev = zlib.crc32(rows[j], prev)
                chain[(first_pos + j) % R] = prev
        _ring_put(self.rows, first_pos % w, rows)

    def chain_ends(self, w: int) -> tuple[int, int]:
        """(A(a - 1), A(hi - 1)) for the window of the last w rows, a = hi - w; A(a - 1) is 0 when the
        window starts where the chain does. crc(window) = A(hi-1) ^ shift(w L)(A(a-1))."""
        R = self.window + 1
        a = self.hi - w
        before = self.chain[(a - 1) % R] if a > self.chain_start else 0
        return before, self.chain[(self.hi - 1) % R]

    def fill_aux(self, w: int, aux: np.ndarray) -> None:
        """Transforms [w, width] of the last w rows (positions hi - w .. hi - 1), made after those rows
        were written without them (worker/serve.py `_repair`): kept, valid from hi - w on."""
        if self.aux is None or self.aux.shape[1] != aux.shape[1]:
            self.aux = np.zeros((self.window, aux.shape[1]), dtype=np.float32)
        _ring_put(self.aux, (self.hi - w) % self.window, aux)
        self.aux_lo = self.hi - w

    def aux_window(self, w: int) -> np.ndarray | None:
        """The aux ring when each of the last w rows has its transform there, else None."""
        return self.aux if self.aux is not None and self.hi - w >= self.aux_lo else None

    def segments(self, w: int) -> list[np.ndarray]:
        """The last w rows (positions hi-w .. hi-1) in order, as at most two contiguous views."""
        size = self.window
        start = (self.hi - w) % size
        if start + w <= size:
            return [self.rows[start:start + w]]
        return [self.rows[start:], self.rows[:w - (size - start)]]


def _ring_put(ring: np.ndarray, start: int, x: np.ndarray) -> None:
    """x's rows into ring from index start on, wrapping (len(x) <= len(ring))."""
    k, w = x.shape[0], ring.shape[0]
    if start + k <= w:
        ring[start:start + k] = x
    else:
        cut = w - start
        ring[start:] = x[:cut]
        ring[:k - cut] = x[cut:]


class Session:
    """A client session's slots. The lock serialises steps of one session across connections."""

    def __init__(self, session_id: int, window: int, row_bytes: int, max_slots: int, chains: bool = True) -> None:
        self.session_id = session_id
        self.window = window
        self.row_bytes = row_bytes
        self.max_slots = max_slots
        self.chains = chains
        self.slots: dict[int, SlotWindow] = {}
        self.lock = threading.Lock()
        self.owner: int | None = None
        self.reserved = 0  # bytes of windows reserved for it in its SessionTable's budget

    def apply(self, slot: int, generation: int, first_pos: int, n_rows: int, flags: int,
              rows: np.ndarray, aux: np.ndarray | None = None) -> tuple[int, int]:
        """Apply one well-formed entry (aux: its rows' transforms, SlotWindow.write); returns (status,
        rows held for the anchor)."""
        if slot >= self.max_slots:
            return RS_BAD_ENTRY, 0
        W = self.window
        sw = self.slots.get(slot)
        if flags & RF_NEW_GEN:
            if sw is not None and generation < sw.generation:
                return RS_STALE_GENERATION, 0
            if sw is None:
                sw = self.slots[slot] = SlotWindow(W, self.row_bytes, self.chains)
            sw.generation = generation
            sw.lo, sw.hi = first_pos, first_pos + n_rows
        else:
            if sw is None:
                return RS_UNKNOWN_SLOT, 0
            if generation < sw.generation:
                return RS_STALE_GENERATION, 0
            if generation > sw.generation or first_pos != sw.hi or sw.hi == sw.lo:
                return RS_GAP, 0
            sw.hi = first_pos + n_rows
            sw.lo = max(sw.lo, sw.hi - W)
        sw.write(first_pos, rows, restart=bool(flags & RF_NEW_GEN), aux=aux)
        w = min(W, sw.hi - sw.lo)
        return (RS_OK if w == W else RS_PARTIAL_WINDOW), w


class SessionRefused(Exception):
    """A STEP's session cannot be served; `code` and the message go into the ERROR reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class SessionTable:
    """All sessions, keyed by the session id of the frame header, with the bounds that keep one peer
    from taking the worker's memory (FORMAT.md, "Sessions and memory"):

    - a session belongs to the connection that created it and is dropped when that connection
      closes (the client's next connection raises the epoch and resends every window); another
      connection may neither step it nor drop it while its owner is open;
    - a connection holds at most `per_conn` sessions;
    - every session reserves, when created, all that every slot it may use can hold (its connection's
      agreed max_reqs x `slot_bytes`: the window of rows, the CRC chain, the objects and the drafter's
      per-slot state); past `budget_bytes` a new session is refused, so the slots never outgrow it;
    - past `max_sessions`, only sessions whose connection is gone are evicted (least recently used
      first); a session of an open connection never is;
    - several proxies share the budget (`charge_conn`): a connection is charged one session's windows at
      its HELLO (refused past the budget), which its live session uses; a session beyond that one is
      charged too, and refused past the connection's fair share, the budget divided by the connections
      charged; a connection that closes frees its charge with its sessions.
    """

    def __init__(self, window: int, row_bytes: int, max_slots: int, max_sessions: int,
                 chains: bool = True, *, per_conn: int = 4, budget_bytes: int | None = None,
                 drafter_slot_bytes: Callable[[int, int], int | None] | None = None) -> None:
        """drafter_slot_bytes(window, row_bytes): what a slot holds for the drafter, rows included (its
        `slot_bytes`; None: the rows alone)."""
        self._window = window
        self._chains = chains
        self._drafter_slot_bytes = drafter_slot_bytes
        self._row_bytes = row_bytes
        self._max_slots = max_slots
        self._max_sessions = max_sessions
        self._per_conn = per_conn
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._sessions: OrderedDict[int, Session] = OrderedDict()
        self._owned: dict[int, int] = {}  # connection -> sessions it owns
        self._open: set[int] = set()  # connections open now
        self.reserved_bytes = 0
        self.evicted = 0
        self._charge: dict[int, int] = {}  # connection -> bytes charged at its HELLO
        self._covered: dict[int, int | None] = {}  # connection -> the session its HELLO charge holds
        self._extra: dict[int, int] = {}  # connection -> bytes of its sessions beyond the charged one

    def session_bytes(self, max_slots: int, window: int | None = None, row_bytes: int | None = None) -> int:
        """What a session with max_slots slots reserves: all that every slot can hold (`slot_bytes`), at
        the table's shapes unless its connection agreed others."""
        window, row_bytes = window or self._window, row_bytes or self._row_bytes
        held = self._drafter_slot_bytes(window, row_bytes) if self._drafter_slot_bytes is not None else None
        return min(max_slots, self._max_slots) * slot_bytes(window, row_bytes, self._chains, held)

    def open_conn(self, owner: int) -> None:
        with self._lock:
            self._open.add(owner)

    def close_conn(self, owner: int) -> int:
        """The connection closed: its sessions are dropped (their reservation freed) and its HELLO
        charge with them; returns how many sessions."""
        with self._lock:
            self._open.discard(owner)
            ids = [k for k, s in self._sessions.items() if s.owner == owner]
            for k in ids:
                self._remove(k)
            self.reserved_bytes -= self._charge.pop(owner, 0)
            self._covered.pop(owner, None)
            self._extra.pop(owner, None)
            return len(ids)

    def charge_conn(self, owner: int, need: int) -> str | None:
        """At HELLO: charge the connection one session's windows of the shapes it adopted (`need` bytes).
        None when charged; past the budget (after evicting sessions of closed connections), the
        refusal's message, naming the bytes asked, held and budgeted."""
        with self._lock:
            while self._over(need):
                victim = next((k for k, v in self._sessions.items() if v.owner not in self._open), None)
                if victim is None:
                    break
                self._remove(victim)
                self.evicted += 1
            if self._over(need):
                return (f"this proxy's shapes need {need} bytes of slots; {self.reserved_bytes} of the "
                        f"worker's {self.budget_bytes} bytes (--memory-budget-mb) are held by "
                        f"{len(self._charge)} other proxies")
            self._charge[owner] = need
            self.reserved_bytes += need
            return None

    def fair_share(self) -> int | None:
        """The budget divided by the connections charged at HELLO (None: no budget)."""
        if self.budget_bytes is None:
            return None
        return self.budget_bytes // max(1, len(self._charge))

    def get(self, session_id: int, owner: int, max_slots: int | None = None, *, window: int | None = None,
            row_bytes: int | None = None) -> Session:
        """The session to step, created if new (with max_slots slots: the connection's agreed
        max_reqs; window and row_bytes: its agreed shapes, default the table's). Raises SessionRefused
        past a bound, naming which."""
        window, row_bytes = window or self._window, row_bytes or self._row_bytes
        with self._lock:
            s = self._sessions.get(session_id)
            if s is not None and (s.window, s.row_bytes) != (window, row_bytes) and s.owner not in self._open:
                self._remove(session_id)  # a closed connection's session of other shapes: not this one's
                s = None
            if s is not None:
                if s.owner != owner:
                    if s.owner in self._open:
                        raise SessionRefused("session_owned", f"session {session_id} belongs to another open "
                                             "connection")
                    self._adopt(s, owner)
                self._sessions.move_to_end(session_id)
                return s
            if self._owned.get(owner, 0) >= self._per_conn:
                raise SessionRefused("session_limit", f"this connection already holds {self._per_conn} sessions "
                                     "(the most one connection may); send NEW_SESSION to drop one")
            slots = min(self._max_slots, max_slots if max_slots is not None else self._max_slots)
            need = self.session_bytes(slots, window, row_bytes)
            if owner in self._charge:
                if self._covered.get(owner) is None:  # its HELLO charge holds this one
                    return self._new(session_id, owner, slots, 0, window, row_bytes, covered=True)
                share = self.fair_share()
                held = self._charge[owner] + self._extra.get(owner, 0)
                if share is not None and held + need > share:
                    raise SessionRefused("memory_fair_share", f"another session needs {need} bytes; this "
                                         f"connection holds {held} of its fair share of {share} bytes (the "
                                         f"budget over {len(self._charge)} proxies); send NEW_SESSION to "
                                         "drop one")
            while self._sessions and (len(self._sessions) >= self._max_sessions or self._over(need)):
                victim = next((k for k, v in self._sessions.items() if v.owner not in self._open), None)
                if victim is None:
                    break
                self._remove(victim)
                self.evicted += 1
            if len(self._sessions) >= self._max_sessions:
                raise SessionRefused("session_limit", f"the worker holds {self._max_sessions} sessions, all of "
                                     "open connections")
            if self._over(need):
                raise SessionRefused("memory_budget", f"a new session needs {need} bytes of slots; "
                                     f"{self.reserved_bytes} of the worker's {self.budget_bytes} bytes "
                                     "(--memory-budget-mb) are held by other sessions")
            if owner in self._charge:
                self._extra[owner] = self._extra.get(owner, 0) + need
            return self._new(session_id, owner, slots, need, window, row_bytes)

    def _new(self, session_id: int, owner: int, slots: int, need: int, window: int, row_bytes: int,
             covered: bool = False) -> Session:
        s = self._sessions[session_id] = Session(session_id, window, row_bytes, slots, self._chains)
        s.reserved = need
        self.reserved_bytes += need
        s.owner = owner
        self._owned[owner] = self._owned.get(owner, 0) + 1
        if covered:
            self._covered[owner] = session_id
        return s

    def drop(self, session_id: int, owner: int | None = None) -> bool:
        """NEW_SESSION's `previous`: dropped only by its own connection (or by anyone once that
        connection is gone); owner None (tools, tests) drops it whoever owns it."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None or (owner is not None and s.owner != owner and s.owner in self._open):
                return False
            self._remove(session_id)
            return True

    def drop_owned_by(self, owner: int) -> int:
        return self.close_conn(owner)

    def _over(self, need: int) -> bool:
        return self.budget_bytes is not None and self.reserved_bytes + need > self.budget_bytes

    def _adopt(self, s: Session, owner: int) -> None:
        if self._owned.get(owner, 0) >= self._per_conn:
            raise SessionRefused("session_limit", f"this connection already holds {self._per_conn} sessions")
        self._owned[s.owner] = self._owned.get(s.owner, 1) - 1
        s.owner = owner
        self._owned[owner] = self._owned.get(owner, 0) + 1

    def _remove(self, session_id: int) -> None:
        s = self._sessions.pop(session_id)
        self.reserved_bytes -= s.reserved
        if s.owner is not None and self._covered.get(s.owner) == session_id:
            self._covered[s.owner] = None  # the charge is free for its next session
        elif s.owner in self._extra:
            self._extra[s.owner] -= s.reserved
        n = self._owned.get(s.owner, 0) - 1
        if n > 0:
            self._owned[s.owner] = n
        else:
            self._owned.pop(s.owner, None)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: int) -> bool:
        return session_id in self._sessions
