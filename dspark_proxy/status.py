"""A running proxy seen through its segment: its state as one JSON-able dict and its text rendering
(`dspark-proxy status`), and a clean stop (`dspark-proxy stop`).

Library code (the bench, the chaos campaign, the demo) and the commands all go through these public
functions; the segment details stay behind them.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from .shm.hostflag import monotonic_ns
from .shm.layout import HEADER_DTYPE, State, Word
from .shm.segment import Segment, owner_alive

__all__ = ["read_status", "format_status", "stop_proxy", "StopOutcome", "worker_lines"]


def read_status(name: str | None) -> dict[str, Any]:
    """Everything `status` shows, as one JSON-able dict: header, words, proxy, shim."""
    seg = Segment.open(name)
    try:
        h = seg.header
        header = {k: h[k].item() for k in HEADER_DTYPE.names}
        header["magic"] = hex(header["magic"])
        words = seg.words()
        now = monotonic_ns()
        header["state"] = State.NAMES.get(words["state"], words["state"])
        header["heartbeat_age_ms"] = round((now - words["heartbeat_ns"]) / 1e6, 3)
        header["owner_alive"] = owner_alive(int(h["owner_pid"]), int(h["owner_start_ticks"]))
        header["bytes"] = seg.layout.total_bytes
        header["regions"] = {n: {"offset": o, "bytes": b} for n, o, b in seg.layout.region_table()}
        out = {"name": seg.name, "header": header, "words": words, "proxy": _block(seg, "proxy"),
               "shim": _block(seg, "shim")}
    finally:
        seg.close()
    return out


def _block(seg: Segment, which: str) -> dict[str, Any]:
    raw = seg.read_block(which)
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": "unreadable snapshot"}


def format_status(st: dict[str, Any]) -> str:
    h, w, p, s = st["header"], st["words"], st["proxy"], st["shim"]
    lines = [
        f"dspark-proxy {st['name']}: {h['state']}, pid {h['owner_pid']} "
        f"({'alive' if h['owner_alive'] else 'DEAD'}), incarnation {h['incarnation']}, "
        f"heartbeat {h['heartbeat_age_ms']:.1f} ms ago",
        f"  layout   M={h['max_slots']} N={h['num_spec']} W={h['window']} row_bytes={h['row_bytes']} "
        f"max_rows={h['max_rows']} resync/round={h['resync_per_round']} sampled={bool(h['sampled'])} "
        f"deadline={h['deadline_ms']} ms, {h['bytes'] / 2**20:.1f} MiB",
        "  words    " + " ".join(f"{k}={w[k]}" for k in ("gathered", "claimed", "published", "consumed",
                                                          "attached", "engine_pid", "abandoned")),
    ]
    for title, snap in (("proxy", p), ("shim", s)):
        if not snap:
            lines.append(f"  {title:<8} (no snapshot yet)")
            continue
        c = snap.get("counters", {})
        if c:
            lines.append(f"  {title:<8} " + " ".join(f"{k}={v}" for k, v in sorted(c.items())))
        g = snap.get("gauges", {})
        if isinstance(g.get("breaker"), dict):
            b = g["breaker"]
            lines.append(f"  breaker  {b.get('state')} trips={b.get('trips')}")
        if g.get("thread_death"):
            lines.append(f"  thread   proxy thread restarted {c.get('thread_restarts', 0)} times; last death: "
                         f"{g['thread_death']}")
        lines += worker_lines(g.get("workers"))
        if g.get("row_cap"):
            lines.append(f"  row cap  {g['row_cap']} rows a STEP (a STEP that size timed out)")
        for key, lat in sorted(snap.get("latency", {}).items()):
            lines.append(f"    {key:<28} n={lat.get('count')} p50={lat.get('p50_us')} p99={lat.get('p99_us')} "
                         f"p99.9={lat.get('p999_us')} max={lat.get('max_us')} us")
        events = g.get("watchdog_events") or []
        for ev in events[-8:]:
            lines.append(f"    event {ev}")
    return "\n".join(lines)


def worker_lines(links: Any) -> list[str]:
    """One line per worker link (proxy.worker_links): connected, refused (why: the field and both values
    of a mismatch), backing off (why, next try in ...), its breaker; for a pool, its share and misses."""
    out: list[str] = []
    for w in links if isinstance(links, list) else []:
        if not isinstance(w, dict):
            continue
        state = w.get("state", "?")
        text = {"connected": f"connected (epoch {w.get('epoch')}, {w.get('drafter', '?')})",
                "refused": f"REFUSED: {w.get('reason')}",
                "backing_off": f"backing off, next try in {w.get('next_try_s', 0):.2f} s ({w.get('reason')})",
                }.get(state, state)
        if state == "refused" and w.get("next_try_s") is not None:
            text += f" (next try in {w['next_try_s']:.2f} s)"
        line = f"  worker   {w.get('address')}: {text}; breaker {w.get('breaker', '?')}"
        if "pool_state" in w:
            line += (f"; pool {w['pool_state']}, {w.get('slots', 0)} slots, entries {w.get('entries', 0)} "
                     f"usable {w.get('usable', 0)} missed {w.get('missed', 0)}")
            if w.get("row_cap"):
                line += f", row cap {w['row_cap']}"
        out.append(line)
    return out


@dataclass(frozen=True)
class StopOutcome:
    """What `stop_proxy` did: `ok` (stopped, or was not running) and one line saying so."""

    ok: bool
    message: str


def stop_proxy(name: str | None, timeout_s: float) -> StopOutcome:
    """SIGTERM the proxy owning segment `name` (it fails every round ahead, then unlinks its segment)
    and wait up to timeout_s for it to exit. Raises SegmentError when there is no such segment."""
    seg = Segment.open(name)
    pid, ticks, inc = int(seg.header["owner_pid"]), int(seg.header["owner_start_ticks"]), seg.incarnation
    state = seg.word(Word.STATE)
    seg.close()
    if not owner_alive(pid, ticks):
        return StopOutcome(True, f"proxy pid {pid} is not running (state {State.NAMES.get(state, state)}); "
                                 "the next start reclaims its segment")
    os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if not owner_alive(pid, ticks):
            return StopOutcome(True, f"stopped proxy pid {pid} (incarnation {inc})")
        time.sleep(0.05)
    return StopOutcome(False, f"pid {pid} still running after {timeout_s} s")
