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

from ..shm.hostflag import monotonic_ns
from ..shm.layout import HEADER_DTYPE, State, Word
from ..shm.refusals import read_refusals
from ..shm.ring_shm import reap_stale
from ..shm.segment import DEFAULT_NAME, Segment, owner_alive
from .exitcodes import EXIT_OK, EXIT_PROXY_DEAD, EXIT_PROXY_HUNG, EXIT_PROXY_REFUSED

__all__ = ["read_status", "format_status", "stop_proxy", "StopOutcome", "worker_lines", "drafting_summary",
           "format_drafting", "health", "HEALTH_EXIT", "HUNG_AFTER_S", "refused_lines"]

# A live proxy beats at least once a second (proxy.py, HEARTBEAT_UNATTACHED_EVERY_S): five missed
# beats is a hung process, not a busy machine (docs/exit-codes.md)
HUNG_AFTER_S = 5.0
HEALTH_EXIT = {"ok": EXIT_OK, "dead": EXIT_PROXY_DEAD, "hung": EXIT_PROXY_HUNG, "refused": EXIT_PROXY_REFUSED}


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
        out["drafting"] = drafting_summary(out["proxy"], int(h["num_spec"]))
        out["refused_engines"] = read_refusals(seg.mm)
        out["health"] = health(out)
    finally:
        seg.close()
    return out


def health(st: dict[str, Any]) -> dict[str, str]:
    """What a health check needs from `read_status`'s dict: {"state": ok | dead | hung | refused, "why"}.

    dead: the owner process is gone (killed: its segment stays until `stop` or the next `start`);
    hung: alive, but its heartbeat is older than HUNG_AFTER_S (a proxy still starting is not judged);
    refused: alive, and every worker link it has is refused (it drafts nothing until that changes).
    `status` exits with HEALTH_EXIT of it (docs/exit-codes.md)."""
    h = st["header"]
    if not h["owner_alive"]:
        return {"state": "dead", "why": f"proxy pid {h['owner_pid']} is not running"}
    age_s = h["heartbeat_age_ms"] / 1e3
    if h["state"] != "STARTING" and age_s > HUNG_AFTER_S:
        return {"state": "hung", "why": f"heartbeat {age_s:.1f} s old (> {HUNG_AFTER_S:g} s)"}
    links = [w for w in ((st.get("proxy") or {}).get("gauges", {}).get("workers") or []) if isinstance(w, dict)]
    if links and all(w.get("state") == "refused" for w in links):
        return {"state": "refused", "why": "every worker refused it: " + "; ".join(
            f"{w.get('address')}: {w.get('reason')}" for w in links)}
    return {"state": "ok", "why": ""}


def _block(seg: Segment, which: str) -> dict[str, Any]:
    raw = seg.read_block(which)
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": "unreadable snapshot"}


WIDTH = 80  # `status` fits a terminal of 80 columns: sections, wrapped key=value lists, tables
_IDLE_GAP_US = 1e6  # a wait between rounds this long is an idle engine (no requests), not a stall
# shown in the Drafting section instead (drafting_summary), not again among the counters
_DRAFTING_KEYS = ("spec_decode_", "fallback_", "accept_")


def format_status(st: dict[str, Any]) -> str:
    """`status` for people: a title, then one section per part (Layout, Words, Proxy, Latency, Drafting,
    Shim, Events), each line at most WIDTH columns; times in ms; the wait between rounds apart from the
    latencies, an idle gap called one."""
    h, w, p, s = st["header"], st["words"], st["proxy"], st["shim"]
    lines = [f"dspark-proxy {st['name']}: {h['state']}, pid {h['owner_pid']} "
             f"({'alive' if h['owner_alive'] else 'DEAD'})",
             f"  incarnation {h['incarnation']}, heartbeat {h['heartbeat_age_ms']:.1f} ms ago"]
    hl = st.get("health") or {"state": "ok"}
    if hl["state"] != "ok":
        lines += ["  " + ln for ln in _wrap(f"health   {hl['state'].upper()}: {hl['why']}")]
    lines += _section("Layout", [
        f"M={h['max_slots']} N={h['num_spec']} W={h['window']} row_bytes={h['row_bytes']} "
        f"sampled={'yes' if h['sampled'] else 'no'} deadline={h['deadline_ms']:g} ms",
        f"max_rows={h['max_rows']} resync/round={h['resync_per_round']} segment {h['bytes'] / 2**20:.1f} MiB"])
    lines += _section("Words", _pairs((k, w[k]) for k in ("gathered", "claimed", "published", "consumed",
                                                           "attached", "engine_pid", "abandoned")))
    lines += _section("Refused engines", [x for ln in refused_lines(st.get("refused_engines")) for x in _wrap(ln)])
    for title, snap in (("Proxy", p), ("Shim", s)):
        if not snap:
            lines += _section(title, ["(no snapshot yet)"])
            continue
        c = snap.get("counters", {})
        g = snap.get("gauges", {})
        body = _pairs((k, v) for k, v in sorted(c.items()) if title == "Shim" or not k.startswith(_DRAFTING_KEYS))
        if isinstance(g.get("breaker"), dict):
            b = g["breaker"]
            body.append(f"breaker {b.get('state')}, {b.get('trips')} trips")
        if g.get("thread_death"):
            body += _wrap(f"proxy thread restarted {c.get('thread_restarts', 0)} times; last death: "
                          f"{g['thread_death']}")
        for line in worker_lines(g.get("workers")):
            body += _wrap(line.strip())
        if g.get("row_cap"):
            body.append(f"row cap {g['row_cap']} rows a STEP (a STEP that size timed out)")
        lines += _section(title, body)
        lines += _section(f"{title} latency", _latency_table(snap.get("latency", {})))
        if title == "Proxy" and st.get("drafting"):
            lines += _section("Drafting", [x for ln in format_drafting(st["drafting"]) for x in _wrap(ln.strip())])
        events = g.get("watchdog_events") or []
        lines += _section(f"{title} events" + (f" (last 8 of {len(events)})" if len(events) > 8 else ""),
                          _events_table(events))
    return "\n".join(ln.rstrip() for ln in lines)


def _section(title: str, body: list[str]) -> list[str]:
    return ["", title, *("  " + b for b in body)] if body else []


def _wrap(text: str, indent: int = 4) -> list[str]:
    """One logical line as lines of at most WIDTH - 2 columns (the section indents by 2)."""
    import textwrap

    return textwrap.wrap(text, WIDTH - 2, subsequent_indent=" " * indent, break_on_hyphens=False) or [""]


def _pairs(items: Any) -> list[str]:
    """key=value pairs, as many a line as fit."""
    out: list[str] = []
    line = ""
    for k, v in items:
        item = f"{k}={v}"
        if line and len(line) + 1 + len(item) > WIDTH - 2:
            out.append(line)
            line = item
        else:
            line = f"{line} {item}" if line else item
    if line:
        out.append(line)
    return out


def _ms(us: Any) -> str:
    return "-" if us is None else f"{float(us) / 1e3:.3f}"


def _latency_table(lat: dict[str, Any]) -> list[str]:
    """n, p50, p99, p99.9, max in ms a row; `gather_us` (the engine's step or idle time between rounds,
    as the proxy waits for it) on a line of its own, an idle gap named so rather than read as a stall."""
    rows = [(k[:-3] if k.endswith("_us") else k.replace("_us_", "_"), v) for k, v in sorted(lat.items())
            if k != "gather_us" and isinstance(v, dict)]
    out = []
    if rows:
        out.append(f"{'(ms)':<24}{'n':>8}{'p50':>10}{'p99':>10}{'p99.9':>10}{'max':>10}")
        out += [f"{name[:23]:<24}{v.get('count', 0):>8}{_ms(v.get('p50_us')):>10}{_ms(v.get('p99_us')):>10}"
                f"{_ms(v.get('p999_us')):>10}{_ms(v.get('max_us')):>10}" for name, v in rows]
    gap = lat.get("gather_us")
    if isinstance(gap, dict) and gap.get("count"):
        longest = float(gap.get("max_us") or 0)
        tail = (f"longest {longest / 1e6:.1f} s (the engine idle: not a stall)" if longest >= _IDLE_GAP_US
                else f"longest {_ms(longest)} ms")
        out += _wrap(f"between rounds (the engine's step, or idle): p50 {_ms(gap.get('p50_us'))} ms, "
                     f"p99 {_ms(gap.get('p99_us'))} ms, {tail}")
    return out


def _events_table(events: list[Any]) -> list[str]:
    """The last 8 watchdog events, one row each (events.py names the fields)."""
    evs = [e for e in events if isinstance(e, dict)][-8:]
    if not evs:
        return []
    out = [f"{'time':<9}{'round':>9}  {'how':<14}{'phase':<9}{'reqs':>6}{'rows':>7}{'wait ms':>10}"]
    for e in evs:
        t = e.get("time")
        when = time.strftime("%H:%M:%S", time.localtime(float(t))) if isinstance(t, (int, float)) else "?"
        wait = e.get("proxy_wait_ms")
        out.append(f"{when:<9}{e.get('round', '?')!s:>9}  {str(e.get('how', '?'))[:13]:<14}"
                   f"{str(e.get('phase', '?'))[:8]:<9}{e.get('n', '')!s:>6}{e.get('rows', '')!s:>7}"
                   f"{'' if wait is None else f'{float(wait):.1f}':>10}")
    return out


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


def refused_lines(refused: Any) -> list[str]:
    """One line per engine the segment refused (shm/refusals.py): its pid, the field and both values."""
    out: list[str] = []
    for r in refused if isinstance(refused, list) else []:
        when = time.strftime("%H:%M:%S", time.localtime(r.get("at_unix") or 0))
        out.append(f"REFUSED engine pid {r.get('pid')} at {when}: {r.get('field')} is {r.get('segment')!r} "
                   f"in the segment, the engine has {r.get('engine')!r}")
    return out


def drafting_summary(proxy: dict[str, Any], num_spec: int) -> dict[str, Any]:
    """What the drafting earns, from the proxy's counters (acceptance.py): mean accepted drafts per
    round that verified drafts and by position, the rounds that fell back to target-only by cause,
    and the acceptance gate. Named like vLLM's spec_decode metrics where they mean the same."""
    c = proxy.get("counters", {}) if isinstance(proxy, dict) else {}
    g = proxy.get("gauges", {}) if isinstance(proxy, dict) else {}
    drafts = int(c.get("spec_decode_num_drafts", 0))
    tokens = int(c.get("spec_decode_num_draft_tokens", 0))
    accepted = int(c.get("spec_decode_num_accepted_tokens", 0))
    per_pos = [int(c.get(f"spec_decode_num_accepted_tokens_per_pos_{j}", 0)) for j in range(num_spec)]
    fallbacks = {k[len("fallback_"):]: int(v) for k, v in sorted(c.items()) if k.startswith("fallback_")}
    gate = {k[len("accept_"):]: int(v) for k, v in sorted(c.items()) if k.startswith("accept_")}
    return {
        "num_spec": num_spec,
        "num_drafts": drafts,
        "num_draft_tokens": tokens,
        "num_accepted_tokens": accepted,
        "num_accepted_tokens_per_pos": per_pos,
        "mean_accepted": round(accepted / drafts, 4) if drafts else None,
        "accepted_by_position": [round(p / drafts, 4) for p in per_pos] if drafts else None,
        "acceptance_rate": round(accepted / tokens, 4) if tokens else None,
        # (a paused round the engine answered and overtook sent no STEP: neither ok nor failed)
        "rounds": int(c.get("rounds_ok", 0)) + int(c.get("rounds_failed", 0)) + int(c.get("paused_rows_overtaken", 0)),
        "rounds_failed": int(c.get("rounds_failed", 0)),
        "fallbacks": fallbacks,
        "gate": {**(g.get("accept_gate") or {}), "counters": gate},
    }


def format_drafting(d: dict[str, Any]) -> list[str]:
    """The drafting's lines of `status`."""
    lines = []
    if d["num_drafts"]:
        lines.append(f"  drafting mean accepted {d['mean_accepted']:.2f} of {d['num_spec']} a round "
                     f"({d['num_drafts']} request-rounds verified drafts; {100 * d['acceptance_rate']:.0f}% of "
                     f"{d['num_draft_tokens']} drafts accepted)")
        lines.append("           by position " + " ".join(f"{p:.2f}" for p in d["accepted_by_position"]))
    else:
        lines.append("  drafting no drafts verified yet")
    if d["fallbacks"]:
        lines.append(f"  fallback {d['rounds_failed']} of {d['rounds']} rounds target-only: "
                     + " ".join(f"{k}={v}" for k, v in d["fallbacks"].items()))
    gate = d["gate"]
    if gate.get("enabled") is False:
        lines.append("  gate     off (--accept-break-even 0)")
    elif gate.get("counters") or gate.get("slots_paused") or gate.get("batch") not in (None, "active"):
        lines.append(f"  gate     paused now {gate.get('slots_paused', 0)} requests, probing "
                     f"{gate.get('slots_probing', 0)}; batch {gate.get('batch', 'active')}; "
                     + " ".join(f"{k}={v}" for k, v in gate.get("counters", {}).items()))
    if gate.get("tps_plain") is not None or gate.get("tps_drafting") is not None:
        rates = [f"{gate[k]:.1f} {w}" for k, w in (("tps_drafting", "with drafts"), ("tps_plain", "without"))
                 if gate.get(k) is not None]
        lines.append("  gate     tokens/s a request: " + ", ".join(rates))
    if gate.get("tps_by_size"):
        lines.append("  gate     by batch size: " + ", ".join(
            f"{size} {'drafts' if v == 'pays' else f'paused ({v} rounds)'}" for size, v in gate["tps_by_size"].items()))
    return lines


@dataclass(frozen=True)
class StopOutcome:
    """What `stop_proxy` did: `ok` (stopped, or was not running), one line saying so, and the exit
    code `stop` ends with (docs/exit-codes.md)."""

    ok: bool
    message: str
    code: int = EXIT_OK


def stop_proxy(name: str | None, timeout_s: float) -> StopOutcome:
    """SIGTERM the proxy owning segment `name` (it fails every round ahead, then unlinks its segment)
    and wait up to timeout_s for it to exit. A dead proxy's segment (and its engines' leftover rings)
    is removed here: nobody else would until the next `start`. Raises SegmentError when there is no
    such segment."""
    seg = Segment.open(name)
    try:
        pid, ticks, inc = int(seg.header["owner_pid"]), int(seg.header["owner_start_ticks"]), seg.incarnation
        state = seg.word(Word.STATE)
        if not owner_alive(pid, ticks):
            seg.unlink()  # only this incarnation: a proxy that took the name meanwhile keeps it
            reap_stale(name or DEFAULT_NAME)
            return StopOutcome(False, f"proxy pid {pid} was not running (state {State.NAMES.get(state, state)}, "
                                      f"killed?): removed its segment /dev/shm{seg.shm_name}", EXIT_PROXY_DEAD)
    finally:
        seg.close()
    try:
        os.kill(pid, signal.SIGTERM)
    except PermissionError:
        return StopOutcome(False, f"proxy pid {pid} is another user's: not allowed to signal it",
                           EXIT_PROXY_REFUSED)
    except ProcessLookupError:
        return StopOutcome(True, f"proxy pid {pid} exited meanwhile (incarnation {inc})")
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if not owner_alive(pid, ticks):
            return StopOutcome(True, f"stopped proxy pid {pid} (incarnation {inc})")
        time.sleep(0.05)
    return StopOutcome(False, f"pid {pid} still running after {timeout_s} s (hung?)", EXIT_PROXY_HUNG)
