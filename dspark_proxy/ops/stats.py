"""Statistics: counters, gauges and latency histograms, cheap enough to update on every round.

``observe()`` runs several times per round on the proxy's hot path, so a histogram is a preallocated list
of log-linear buckets (HDR-style: 64 linear sub-buckets per power of two, from 0.0625 µs to 2**27 µs ≈ 134
s): the bucket index is one ``math.frexp`` and two integer operations, and recording is one list
increment. Percentiles are reported as the midpoint of the bucket holding the nearest-rank sample, clamped
to the observed min/max: a bucket is 1/128 of its octave wide, so the midpoint is within 0.8 % of any
value in it, the true nearest-rank sample included. Memory per histogram is fixed (1,984 buckets) whatever the number of samples.
Keys observed together every round form a `HistGroup` (one int64 array of rows), recorded in one call
(`_fastround.hist_observe` on the C path, the same arithmetic as ``observe``).

Threads: one thread owns a ``Stats`` and is the only one that calls ``inc``/``set``/``observe``.
``snapshot()`` (and everything built on it) may also be called from another thread, such as the
Prometheus endpoint's: it takes each dict and bucket list with one C-level copy, which is atomic under
the GIL, so it never fails on a concurrent insert. Such a snapshot is exact per counter and per
histogram's buckets, but not a cut across keys (and a histogram's mean may be an observation apart from
its count). A group's row is copied by numpy, which may let the GIL go during the copy: each bucket is
still read once, whole, so its count may be an observation or a few apart from the rest of the row.
"""

from __future__ import annotations

import functools
import math
import os
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
import numpy as np

__all__ = ["LATENCY_FIELDS", "PERCENTILES", "HistGroup", "Stats"]

_SUB_BITS = 6
_SUB = 1 << _SUB_BITS  # linear sub-buckets per power of two
_E_MIN = -3  # frexp exponent of the lowest octave: [2**-4, 2**-3) µs
_E_MAX = 27  # frexp exponent of the highest octave: [2**26, 2**27) µs
_N_BUCKETS = (_E_MAX - _E_MIN + 1) * _SUB
_LO_US = 2.0 ** (_E_MIN - 1)  # at or below: bucket 0 (underflow)
_HI_US = 2.0 ** _E_MAX  # at or above: the last bucket (overflow), value clamped here
# bucket = e * _SUB + int(m * 2 * _SUB) + _OFFSET for frexp(v) = (m, e), m in [0.5, 1)
_OFFSET = -_E_MIN * _SUB - _SUB


def _bucket_mids(at: float = 0.5) -> np.ndarray:
    """Each bucket's midpoint (at = 0.5), or its upper edge (at = 1)."""
    i = np.arange(_N_BUCKETS, dtype=np.int64)
    e = (i - _OFFSET - _SUB) // _SUB
    s = (i - _OFFSET - e * _SUB).astype(np.float64)  # in [_SUB, 2 * _SUB)
    return (s + at) / (2 * _SUB) * np.exp2(e.astype(np.float64))


_MIDS_US = _bucket_mids()
_HI_EDGES_US = _bucket_mids(1.0)  # each bucket's upper edge (the last, the overflow, is open)
_HI_EDGES_US[-1] = math.inf

PERCENTILES: tuple[tuple[str, float], ...] = (("p50_us", 0.50), ("p90_us", 0.90), ("p99_us", 0.99),
                                               ("p999_us", 0.999))
LATENCY_FIELDS = ("count", "p50_us", "p90_us", "p99_us", "p999_us", "max_us", "mean_us")


class _Hist:
    """Bucket counts plus the exact sum, min and max of one latency key."""

    __slots__ = ("counts", "sum_us", "min_us", "max_us")

    def __init__(self) -> None:
        self.counts = [0] * _N_BUCKETS
        self.sum_us = 0.0
        self.min_us = math.inf
        self.max_us = 0.0

    def summary(self) -> dict[str, Any]:
        counts = np.array(self.counts.copy(), dtype=np.int64)  # copy: atomic under the GIL
        n = int(counts.sum())
        if n == 0:
            return {"count": 0, "p50_us": None, "p90_us": None, "p99_us": None, "p999_us": None,
                    "max_us": None, "mean_us": None}
        cum = np.cumsum(counts)
        hi = self.max_us
        lo = self.min_us if self.min_us <= hi else 0.0  # inf only in a race with the very first observe
        out: dict[str, Any] = {"count": n}
        for name, q in PERCENTILES:
            rank = max(1, math.ceil(q * n))
            idx = int(np.searchsorted(cum, rank, side="left"))
            out[name] = round(min(max(float(_MIDS_US[idx]), lo), hi), 3)
        out["max_us"] = round(hi, 3)
        out["mean_us"] = round(self.sum_us / n, 3)
        return out


class _GroupColumn:
    """One row's figure in a HistGroup column (sums, mins or maxs), read and written as a float."""

    def __init__(self, column: str) -> None:
        self.column = column

    def __get__(self, row, owner=None):
        if row is None:
            return self
        return float(getattr(row._g, self.column)[row._i])

    def __set__(self, row, v: float) -> None:
        getattr(row._g, self.column)[row._i] = v


class _HistRow:
    """One histogram of a `HistGroup`, read and written like a `_Hist` (its counts a row of the group's
    array, its sum, min and max items of the group's)."""

    __slots__ = ("counts", "_g", "_i")

    def __init__(self, group: HistGroup, i: int) -> None:
        self.counts, self._g, self._i = group.counts[i], group, i

    sum_us = _GroupColumn("sums")
    min_us = _GroupColumn("mins")
    max_us = _GroupColumn("maxs")

    summary = _Hist.summary  # the same summary over this row's counts and figures


class HistGroup:
    """Latency keys observed together every round (the proxy's round: round/stats.py), held in one
    array so that a round records them in one call (`observe`: `_fastround.hist_observe`) instead of
    one `Stats.observe` each. A key joins its Stats' latencies at its first observation, as with
    `observe`; its readers cannot tell a group's key from another."""

    def __init__(self, stats: Stats, keys: tuple[str, ...], native_path: bool) -> None:
        K = len(keys)
        self.keys, self._stats = keys, stats
        self.counts = np.zeros((K, _N_BUCKETS), dtype=np.int64)
        self.sums = np.zeros(K, dtype=np.float64)
        self.mins = np.full(K, math.inf, dtype=np.float64)
        self.maxs = np.zeros(K, dtype=np.float64)
        self.rows = [_HistRow(self, i) for i in range(K)]
        self.joined: set[tuple[int, ...]] = set()  # key tuples whose keys are all in the Stats already
        for i, k in enumerate(keys):  # observed before the group existed: carried over
            h = stats._lat.get(k)
            if h is not None:
                self.counts[i] = h.counts
                self.sums[i], self.mins[i], self.maxs[i] = h.sum_us, h.min_us, h.max_us
                stats._lat[k] = self.rows[i]
        self.native = native_path
        self._held = None
        # record(at, *values): what observe runs once `at` has joined (a caller that checks `joined` itself
        # may call it directly)
        self.record: Callable[..., None] = self.observe_ref
        if native_path:
            from ..native import fastround  # the C extension: imported only where a group uses it

            self._held = fastround.Held((self.counts, self.sums, self.mins, self.maxs))
            self.record = functools.partial(fastround.hist_observe, self._held)

    def observe(self, at: tuple[int, ...], *values_us: float) -> None:
        """values_us[j] into key `at[j]` (indices into `keys`; at most 8): `Stats.observe` for each."""
        if at not in self.joined:
            self.join(at)
        self.record(at, *values_us)

    def observe_ref(self, at: tuple[int, ...], *values_us: float) -> None:
        """The reference of _fastround.hist_observe: `Stats.observe`'s arithmetic on the group's rows."""
        if len(at) != len(values_us):
            raise TypeError("HistGroup.observe: one value per key")
        for i, v in zip(at, values_us, strict=True):
            _observe_into(self.rows[i], float(v))

    def join(self, at: tuple[int, ...]) -> None:
        """The keys `at` join the Stats' latencies (their first observation is coming)."""
        lat = self._stats._lat
        for i in at:
            if lat.get(self.keys[i]) is not self.rows[i]:
                lat[self.keys[i]] = self.rows[i]
        self.joined.add(at)


def _observe_into(h: _Hist | _HistRow, v: float) -> None:
    """One latency into `h` (`Stats.observe`'s arithmetic, for a group's reference path)."""
    if _LO_US < v < _HI_US:
        m, e = math.frexp(v)
        h.counts[e * _SUB + int(m * (2 * _SUB)) + _OFFSET] += 1
    elif v >= _HI_US:
        v = _HI_US
        h.counts[_N_BUCKETS - 1] += 1
    else:
        if not v > 0.0:
            v = 0.0
        h.counts[0] += 1
    h.sum_us += v
    if v > h.max_us:
        h.max_us = v
    if v < h.min_us:
        h.min_us = v


def _enc_hook(obj: Any) -> Any:
    """JSON for what gauges may hold besides plain types: numpy scalars and arrays, enums, anything else
    by its str()."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    value = getattr(obj, "value", None)
    return value if isinstance(value, (str, int, float)) else str(obj)


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)


class Stats:
    """Counters (``inc``), gauges (``set``: any JSON-able value) and latency histograms (``observe``).

    Owned by one thread (see the module docstring for what other threads may call)."""

    def __init__(self) -> None:
        self._counters: dict[str, int] = {}
        self._gauges: dict[str, Any] = {}
        self._lat: dict[str, _Hist | _HistRow] = {}
        self._groups: dict[tuple[str, ...], HistGroup] = {}

    # ------------------------------------------------------------------ hot path

    def inc(self, key: str, n: int = 1) -> None:
        c = self._counters
        c[key] = c.get(key, 0) + n

    def inc_each(self, keys: tuple[str, ...], ns: tuple[int, ...]) -> None:
        """inc(key, n) for each pair, in one call: the usual round's counters (round/core.py)."""
        c = self._counters
        for key, n in zip(keys, ns, strict=True):
            c[key] = c.get(key, 0) + n

    def set(self, key: str, value: Any) -> None:
        """Store a gauge. The value is kept by reference: pass a fresh or immutable one (``list(events)``)."""
        self._gauges[key] = value

    def observe(self, key: str, value_us: float) -> None:
        """Record one latency in µs. Negative and NaN count as 0; above ~134 s as ~134 s."""
        h = self._lat.get(key)
        if h is None:
            h = self._lat[key] = _Hist()
        _observe_into(h, value_us)

    def group(self, keys: tuple[str, ...], native_path: bool) -> HistGroup:
        """The group of these latency keys (made at the first ask; later asks, such as a new engine's
        RoundCore, share it). A key may be in one group only."""
        g = self._groups.get(keys)
        if g is None:
            taken = {k for other in self._groups.values() for k in other.keys}
            if taken.intersection(keys):
                raise ValueError(f"stats: keys {sorted(taken.intersection(keys))} are in another group")
            g = self._groups[keys] = HistGroup(self, keys, native_path)
        return g

    # ------------------------------------------------------------------ reading

    def counter(self, key: str) -> int:
        return self._counters.get(key, 0)

    def gauge(self, key: str, default: Any = None) -> Any:
        return self._gauges.get(key, default)

    def latency(self, key: str) -> dict[str, Any] | None:
        """One histogram's summary (``LATENCY_FIELDS``), or None if the key was never observed."""
        h = self._lat.get(key)
        return h.summary() if h is not None else None

    def histograms(self, bounds_us: Iterable[float]) -> dict[str, dict[str, Any]]:
        """Every latency as a Prometheus-style histogram over `bounds_us` (ascending upper bounds, µs):
        ``{key: {"le_us": [...], "cumulative": [...], "count": n, "sum_us": s}}``. A sample is counted
        under the first bound at or above its bucket's upper edge, so a count is exact to within one
        log-linear bucket (0.8 %) of its bound."""
        bounds = np.asarray(list(bounds_us), dtype=np.float64)
        cut = np.searchsorted(_HI_EDGES_US, bounds, side="right")  # buckets wholly at or below each bound
        out: dict[str, dict[str, Any]] = {}
        for k, h in sorted(self._lat.copy().items()):
            counts = np.array(h.counts.copy(), dtype=np.int64)
            cum = np.concatenate(([0], np.cumsum(counts)))
            out[k] = {"le_us": bounds.tolist(), "cumulative": cum[cut].tolist(), "count": int(cum[-1]),
                      "sum_us": h.sum_us}
        return out

    def snapshot(self) -> dict[str, Any]:
        """``{"counters": {...}, "gauges": {...}, "latency": {key: {count, p50_us, ..., mean_us}}}``."""
        lat = self._lat.copy()
        return {
            "counters": self._counters.copy(),
            "gauges": self._gauges.copy(),
            "latency": {k: lat[k].summary() for k in sorted(lat)},
        }

    def write_json(self, path: str | os.PathLike[str]) -> None:
        """Write the snapshot to ``path`` atomically: a reader sees the old file or the new one, never a
        part (temp file in the same directory, then ``os.replace``). Not fsynced: this is monitoring data,
        and an fsync would put disk latency on the round thread."""
        data = msgspec.json.format(_ENCODER.encode(self.snapshot()), indent=2)
        path = os.fspath(path)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=f".{os.path.basename(path)}.",
                                   suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o644)  # for dashboards and scrapers running as other users
                f.write(data)
                f.write(b"\n")
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def snapshot_bytes(self, limit: int) -> bytes:
        """The snapshot as compact JSON of at most ``limit`` bytes, for a fixed-size shared-memory block.

        When it does not fit, whole entries are dropped, largest gauges first (an event list is worth
        less than the counters), then the latency keys with the fewest samples, then the smallest
        counters; the result then carries ``"dropped": {"gauges": g, "latency": l, "counters": c}``.
        ValueError if not even the empty skeleton fits.
        """
        snap = self.snapshot()
        data = _ENCODER.encode(snap)
        if len(data) <= limit:
            return data
        dropped = {"gauges": 0, "latency": 0, "counters": 0}
        snap["dropped"] = dropped
        size = len(_ENCODER.encode(snap))
        g, lat, c = snap["gauges"], snap["latency"], snap["counters"]
        victims: list[tuple[str, dict[str, Any], Iterable[str]]] = [
            ("gauges", g, sorted(g, key=lambda k: -len(_ENCODER.encode(g[k])))),
            ("latency", lat, sorted(lat, key=lambda k: (lat[k]["count"], k))),
            ("counters", c, sorted(c, key=lambda k: (c[k], k))),
        ]
        for section, table, order in victims:
            for k in order:
                # estimated saving: "key":value plus a comma; re-encode only when the estimate fits
                size -= len(_ENCODER.encode(k)) + len(_ENCODER.encode(table[k])) + 2
                del table[k]
                dropped[section] += 1
                if size <= limit:
                    data = _ENCODER.encode(snap)
                    if len(data) <= limit:
                        return data
                    size = len(data)
        data = _ENCODER.encode(snap)
        if len(data) <= limit:
            return data
        raise ValueError(f"stats snapshot: limit {limit} bytes cannot hold even an empty snapshot "
                         f"({len(data)} bytes)")

    def format_line(self, prefix: str, counters: Iterable[str] | None = None,
                    latency: Iterable[str] | None = None) -> str:
        """One log line: ``prefix k=v ... | key p50/p99/max=a/b/c us n=count ...``, every counter and
        latency key unless ``counters`` / ``latency`` name the ones to show (missing ones as 0 / -)."""
        c = self._counters.copy()
        lat = self._lat.copy()
        ckeys = sorted(c) if counters is None else list(counters)
        lkeys = sorted(lat) if latency is None else list(latency)
        parts = [prefix] if prefix else []
        parts += [f"{k}={c.get(k, 0)}" for k in ckeys]
        lparts = []
        for k in lkeys:
            s = lat[k].summary() if k in lat else None
            if s is None or s["count"] == 0:
                lparts.append(f"{k} -")
            else:
                lparts.append(f"{k} p50/p99/max={s['p50_us']:.1f}/{s['p99_us']:.1f}/{s['max_us']:.1f}us "
                              f"n={s['count']}")
        if lparts:
            parts.append("|")
            parts.extend(lparts)
        return " ".join(parts)
