"""What a fault kind works with: the campaign's `Controller` (the injectors' `c`) and the `Injection` it
records, below the table of kinds (kinds.py) and the campaign that runs it (campaign.py).

The controller does not import the table: run_campaign hands it `INJECTORS`, and it reads the
campaign's settings through `Settings` (which `ChaosConfig` is), so the fault kinds can name it
without an import circle (the layering is in this package's `__init__.py`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .tally import counter_delta

if TYPE_CHECKING:
    from .corrupt import DescriptorCorruptor
    from .probe import EngineProbe
    from .system import ChaosSystem
    from .tally import ProxyTally, ShimEventLog

__all__ = ["Settings", "Injection", "Controller"]

log = logging.getLogger("dspark_proxy.chaos.campaign")  # one logger for the campaign, as campaign.py


class Settings(Protocol):
    """The campaign's settings a controller reads (campaign.ChaosConfig has them all)."""

    @property
    def deadline_ms(self) -> float: ...
    @property
    def hold_s(self) -> float: ...
    @property
    def gap_s(self) -> float: ...
    @property
    def heartbeat_timeout_s(self) -> float: ...
    @property
    def resume_timeout_s(self) -> float: ...
    @property
    def self_recover_s(self) -> float: ...


@dataclass
class Injection:
    """One fault injected: indices into the engine's per-round record, and what was seen."""

    kind: str
    n: int  # the k-th injection of this kind (1-based)
    idx_start: int
    t_start: int  # the engine's round number at the start
    clock_start_s: float  # since the campaign started
    idx_clear: int = -1
    clear_ns: int = 0
    idx_resume: int | None = None
    idx_end: int = -1
    t_end: int = 0
    wall_start: float = 0.0  # time.time() at the start and the end: the span its proxy events fall in
    wall_end: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)
    shim_counters: dict[str, int] = field(default_factory=dict)  # deltas over the injection
    proxy_counters: dict[str, int] = field(default_factory=dict)  # deltas, summed over proxy incarnations
    shim_events: list[dict[str, Any]] = field(default_factory=list)
    shim_events_lost: int = 0
    proxy_events: list[dict[str, Any]] = field(default_factory=list)
    windows_per_round: int | None = None  # the proxy's resync windows a round (the fewest seen), for the bound
    error: str | None = None


class Controller:
    """What an injector works with (injectors.py), and the schedule around it."""

    def __init__(self, cfg: Settings, system: ChaosSystem, probe: EngineProbe, corruptor: DescriptorCorruptor,
                 tally: ProxyTally, events: ShimEventLog,
                 injectors: Mapping[str, Callable[[Controller], None]]) -> None:
        self.cfg = cfg
        self.injectors = injectors  # the table's (kinds.INJECTORS), handed in by run_campaign
        self.system, self.probe, self.corruptor = system, probe, corruptor
        self.tally, self.events = tally, events
        self.deadline_s = cfg.deadline_ms / 1e3
        self.hold_s = cfg.hold_s
        self.heartbeat_timeout_s = cfg.heartbeat_timeout_s
        self.self_recover_s = cfg.self_recover_s
        self.current: Injection | None = None
        self.engine_error: BaseException | None = None
        self.make_sim: Any = None  # k -> the k-th engine's SimEngine (set by run_campaign)
        self.engines = 1
        self._restarted = threading.Event()

    # ------------------------------------------------------------------ for injectors

    def sleep(self, seconds: float) -> None:
        """Sleep, polling the shim's event ring so none is lost to its wrap."""
        end = time.monotonic() + seconds
        while True:
            self.events.poll()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.05))

    def cleared(self) -> None:
        inj = self.current
        assert inj is not None
        inj.idx_clear = self.probe.count
        inj.clear_ns = time.perf_counter_ns()

    def note(self, **kw: Any) -> None:
        assert self.current is not None
        self.current.notes.update(kw)

    def wait_resumed(self, from_idx: int, timeout_s: float) -> int | None:
        """The first usable round at or after from_idx, or None if none came within timeout_s."""
        if self.engine_error is not None:
            return None
        return self.probe.first_usable(from_idx, timeout_s, idle=self.events.poll)

    def restart_engine(self, timeout_s: float) -> bool:
        """engine_restart: ask the engine thread to end its engine after the round in flight and start
        a new one (a new shim, a new SimEngine numbering its rounds from 1, a fresh oracle); True once
        the new engine runs."""
        self._restarted.clear()
        self.probe.restart_requested = True
        end = time.monotonic() + timeout_s
        while not self._restarted.is_set() and time.monotonic() < end and self.engine_error is None:
            self.events.poll()
            self._restarted.wait(0.02)
        return self._restarted.is_set()

    def next_engine(self) -> Any:
        """Engine thread, between two engines' runs: swap the shim everywhere it is held."""
        shim = self.system.replace_engine()
        self.events.follow(shim)
        self.corruptor.install(shim)
        self.probe.shim = shim
        sim = self.make_sim(self.engines)
        self.engines += 1
        self.probe.restart_requested = False
        self._restarted.set()
        return sim

    # ------------------------------------------------------------------ one injection

    def repair(self) -> None:
        """Back to a known-good system: a fresh right worker and a fresh proxy."""
        log.error("[chaos] drafts did not resume: restarting the worker and the proxy")
        try:
            self.system.restart_worker()
            self.system.kill_proxy()
            self.system.spawn_proxy()
        except Exception:  # noqa: BLE001 - the report already says this injection failed
            log.exception("[chaos] repair failed")

    def wait_healthy(self) -> bool:
        ok = self.wait_resumed(self.probe.count, self.cfg.resume_timeout_s) is not None
        self.sleep(self.cfg.gap_s)
        return ok

    def inject(self, kind: str, n: int, clock0: float) -> Injection:
        p = self.probe
        self.tally.sample()
        wpr_before = self.tally.windows_per_round
        proxy_before = self.tally.counters()
        shim_before = self.system.shim_counters()
        ev_lo = self.events.poll()
        idx = p.count
        inj = self.current = Injection(kind=kind, n=n, idx_start=idx, t_start=p.t[idx - 1] + 1 if idx else 1,
                                       clock_start_s=round(time.monotonic() - clock0, 3))
        inj.wall_start = round(time.time(), 3)  # events carry time rounded to the ms
        log.info("[chaos] inject %s #%d at round %d", kind, n, inj.t_start)
        try:
            self.injectors[kind](self)
        except Exception as e:  # noqa: BLE001 - the campaign records it and goes on to the next fault
            inj.error = f"injector failed: {e!r}"
            log.exception("[chaos] %s failed", kind)
        if inj.idx_clear < 0:
            self.cleared()
        inj.idx_resume = self.wait_resumed(inj.idx_clear, self.cfg.resume_timeout_s)
        self.tally.sample()  # the proxy's resync pacing while the windows come back (completeness.py's bound)
        wpr_resume = self.tally.windows_per_round
        if inj.idx_resume is None and self.engine_error is None:
            self.repair()  # a failure already; repaired so the next faults are measured on a healthy system
            inj.notes["repaired"] = True
        self.sleep(self.cfg.gap_s)
        inj.idx_end = p.count
        inj.t_end = p.t[-1] if p.t else 0
        self.tally.sample()
        seen = [r for r in (wpr_before, wpr_resume, self.tally.windows_per_round) if r]
        inj.windows_per_round = min(seen) if seen else None
        inj.proxy_counters = counter_delta(proxy_before, self.tally.counters())
        shim_after = self.system.shim_counters()
        inj.shim_counters = {k: v - shim_before.get(k, 0) for k, v in sorted(shim_after.items())
                             if isinstance(v, int) and v != shim_before.get(k, 0)}
        ev_hi = self.events.poll()
        inj.shim_events = self.events.between(ev_lo, ev_hi)
        inj.shim_events_lost = self.events.lost(ev_lo, ev_hi)
        inj.wall_end = round(time.time(), 3)
        inj.proxy_events = self.tally.events_between(inj.t_start, inj.t_end, inj.wall_start, inj.wall_end)
        self.current = None
        return inj
