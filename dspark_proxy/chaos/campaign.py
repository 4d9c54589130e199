"""The fault campaign: the simulated engine steps through the real shim, against a real worker and a real
proxy (child processes, the real CLI), while a controller injects every fault kind on a schedule.

Two threads in this process: the engine thread (SimEngine.run over an EngineProbe: every usable draft
is checked against the integrity oracle, every wait is timed) and the controller (this thread: the
schedule, the injections, the bookkeeping). The controller never makes the engine wait for anything;
it only reads the engine's per-round record by index.

One injection is: wait until drafts flow, mark the start, inject and hold the fault, mark where it
was cleared, then wait for the first usable draft and a short settle, and mark the end. `report.py`
turns the marks and the per-round record into the table.
"""

from __future__ import annotations

import gc
import logging
import os
import random
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .controller import Controller, Injection
from .corrupt import DescriptorCorruptor
from .kinds import INJECTORS
from .probe import EngineProbe
from .report import build_report
from .schedule import KIND_NAMES, pass_order
from .system import ChaosSystem
from .tally import ProxyTally, ShimEventLog

__all__ = ["ChaosConfig", "run_campaign"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChaosConfig:
    duration_s: float = 60.0  # total budget: at least one full pass; more passes while they fit
    seed: int = 0
    deadline_ms: float = 30.0
    margin_ms: float = 20.0  # no engine wait may exceed deadline + margin
    max_reqs: int = 32
    num_spec: int = 5
    window: int = 16
    row_bytes: int = 256
    engine_work_us: float = 1000.0  # the simulated target forward between enqueue and read_reply (sleep)
    hold_s: float = 0.6  # how long a fault that can be held is held
    gap_s: float = 0.25  # healthy stepping after drafts resume, before the next fault
    heartbeat_timeout_s: float = 0.5  # the shim's: a proxy silent this long is hung
    resume_timeout_s: float = 15.0  # an injection whose drafts do not come back by then fails the run
    self_recover_s: float = 3.0  # worker_layout: how long to watch for recovery without a proxy restart
    kinds: tuple[str, ...] = KIND_NAMES
    max_passes: int | None = None
    strict: bool = False  # also fail rounds over the limit while the kernel kept the engine off the CPU
    name: str | None = None
    log_dir: str | None = None  # keep the children's logs here (default: a temp dir, removed if all passed)

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in INJECTORS]
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(KIND_NAMES)}")
        if not self.kinds:
            raise ValueError("no fault kinds to inject")
        if self.deadline_ms <= 0 or self.margin_ms < 0:
            raise ValueError("deadline_ms must be > 0 and margin_ms >= 0")


def _engine_main(sim: Any, probe: EngineProbe, ctl: Controller) -> None:
    try:
        while True:
            sim.run(probe, duration_s=1e9, on_round=probe.on_round)
            if probe.stop_requested or not probe.restart_requested:
                return
            sim = ctl.next_engine()
    except BaseException as e:  # noqa: BLE001 - reported by the controller
        ctl.engine_error = e
        log.exception("[chaos] engine thread failed")


class _GcWatch:
    """Collections in this process that took 1 ms or more (they hold the GIL: the engine thread waits)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, int, str]] = []
        self._t0 = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
            return
        t1 = time.perf_counter_ns()
        if t1 - self._t0 >= 1_000_000:
            self.pauses.append((self._t0, t1, f"gc gen{info.get('generation')}"))

    def __enter__(self) -> _GcWatch:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def _save_rounds(path: Path, probe: EngineProbe) -> None:
    """The per-round record, for looking at one slow round afterwards (numpy .npz)."""
    import numpy as np

    n = probe.count
    np.savez_compressed(path, t=np.asarray(probe.t[:n]), wait_ns=np.asarray(probe.wait_ns[:n]),
                        enqueue_ns=np.asarray(probe.enqueue_ns[:n]), late_ns=np.asarray(probe.late_ns[:n]),
                        reply_end_ns=np.asarray(probe.reply_end_ns[:n]), status=np.asarray(probe.status[:n]),
                        wait_run_delay_ns=np.asarray(probe.wait_run_delay_ns[:n]),
                        enqueue_run_delay_ns=np.asarray(probe.enqueue_run_delay_ns[:n]),
                        needed=np.asarray(probe.needed[:n]), usable=np.asarray(probe.usable[:n]),
                        wrong=np.asarray(probe.wrong[:n]), full=np.asarray(probe.full[:n]),
                        n_reqs=np.asarray(probe.n_reqs[:n]), staged=np.asarray(probe.staged[:n]),
                        wait_outcome=np.asarray(probe.wait_outcome[:n]), gil_wait_ns=np.asarray(probe.gil_wait_ns[:n]),
                        product_threads_ns=np.asarray(probe.product_threads_ns[:n]),
                        after_wait_ns=np.asarray(probe.after_wait_ns[:n]))


def run_campaign(cfg: ChaosConfig, progress: Any = None, plot_dir: Path | None = None) -> dict[str, Any]:
    """Run the whole campaign; returns the report (report.build_report), `ok` False on any failure.

    `progress(msg)` is called with a line per injection (the command prints it to stderr); with
    `plot_dir` (an existing directory) the engine's waits are drawn there (plot.py) and the report's
    `plots` lists the files."""
    from ..sim import SimConfig, SimEngine

    say = progress or (lambda msg: None)
    rng = random.Random(cfg.seed)
    name = cfg.name or f"chaos-{os.getpid()}"
    log_dir = Path(cfg.log_dir) if cfg.log_dir else Path(tempfile.mkdtemp(prefix="dspark-chaos-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    lay = (cfg.max_reqs, cfg.num_spec, cfg.window, cfg.row_bytes)
    system = ChaosSystem(name, lay, deadline_ms=cfg.deadline_ms, heartbeat_timeout_s=cfg.heartbeat_timeout_s,
                         log_dir=log_dir, pool=any(k.startswith("pool_") for k in cfg.kinds))
    injections: list[Injection] = []
    failures: list[str] = []
    probe: EngineProbe | None = None
    corruptor = DescriptorCorruptor(cfg.seed)
    engine: threading.Thread | None = None
    ctl: Controller | None = None
    clock0 = time.monotonic()
    passes = 0
    leftovers: list[str] = []
    gcw = _GcWatch().__enter__()
    tally = ProxyTally(name)
    try:
        system.start()
        corruptor.install(system.shim)
        probe = EngineProbe(system.shim, cfg.deadline_ms)
        def make_sim(k: int) -> SimEngine:  # the k-th engine of the run (engine_restart starts more)
            return SimEngine(SimConfig(seed=cfg.seed + k, max_reqs=cfg.max_reqs, num_spec=cfg.num_spec,
                                       window=cfg.window, row_bytes=cfg.row_bytes, engine_work_us=cfg.engine_work_us))

        sim = make_sim(0)
        ctl = Controller(cfg, system, probe, corruptor, tally, ShimEventLog(system.shim), INJECTORS)
        ctl.make_sim = make_sim
        engine = threading.Thread(target=_engine_main, args=(sim, probe, ctl), name="dspark-chaos-engine",
                                  daemon=True)
        engine.start()
        say(f"[chaos] worker {system.address} proxy pid {system.proxy.pid if system.proxy else '?'} "
            f"segment {name}; deadline {cfg.deadline_ms} ms; logs in {log_dir}")
        counts: dict[str, int] = {}
        while True:
            t_pass = time.monotonic()
            for kind in pass_order(cfg.kinds, rng):
                if ctl.engine_error is not None:
                    break
                if not ctl.wait_healthy():
                    failures.append(f"no usable drafts within {cfg.resume_timeout_s} s before {kind}")
                counts[kind] = counts.get(kind, 0) + 1
                inj = ctl.inject(kind, counts[kind], clock0)
                injections.append(inj)
                say(_progress_line(inj, probe, cfg))
            passes += 1
            if ctl.engine_error is not None:
                failures.append(f"the engine thread failed: {ctl.engine_error!r}")
                break
            pass_s = time.monotonic() - t_pass
            if cfg.max_passes is not None and passes >= cfg.max_passes:
                break
            if time.monotonic() - clock0 + pass_s > cfg.duration_s:
                break
        ctl.sleep(cfg.gap_s)
    except Exception as e:  # noqa: BLE001 - the report says what broke; children are stopped below
        failures.append(f"campaign aborted: {e!r}")
        log.exception("[chaos] aborted")
    finally:
        if probe is not None:
            probe.stop_requested = True
        if engine is not None:
            engine.join(cfg.deadline_ms / 1e3 + 10.0)
            if engine.is_alive():
                failures.append("the engine thread did not stop")
        leftovers = system.close()
        gcw.__exit__()
        if probe is not None:
            probe.close()
    report = build_report(cfg=asdict(cfg), probe=probe, injections=injections, passes=passes,
                          elapsed_s=time.monotonic() - clock0, leftovers=leftovers, failures=failures,
                          corruptions=dict(corruptor.counts),
                          timeline=system.actions + tally.actions + gcw.pauses)
    if probe is not None and (cfg.log_dir or not report["ok"]):
        _save_rounds(log_dir / "rounds.npz", probe)
    report["log_dir"] = str(log_dir)
    if plot_dir is not None and probe is not None:
        report["plots"] = _plot(probe, injections, cfg, plot_dir, say)
    if report["ok"] and not cfg.log_dir:
        shutil.rmtree(log_dir, ignore_errors=True)
        report["log_dir"] = None
    return report


def _plot(probe: EngineProbe, injections: list[Injection], cfg: ChaosConfig, plot_dir: Path,
          say: Any) -> list[str]:
    """The waits drawn (plot.py); a plot that fails is logged, never the campaign's failure."""
    from .plot import plot_chaos

    n = probe.count
    try:
        paths = plot_chaos(probe.reply_end_ns[:n], probe.wait_ns[:n], injections, cfg.deadline_ms, cfg.margin_ms,
                           plot_dir)
    except Exception:  # noqa: BLE001 - the campaign's report matters more than its picture
        log.exception("[chaos] the plot failed")
        return []
    for p in paths:
        say(f"[chaos] plot written to {p}")
    return paths


def _progress_line(inj: Injection, probe: EngineProbe, cfg: ChaosConfig) -> str:
    waits = probe.wait_ns[inj.idx_start:inj.idx_end]
    mx = max(waits, default=0) / 1e6
    resume = "never" if inj.idx_resume is None else str(inj.idx_resume - inj.idx_clear)
    wrong = sum(probe.wrong[inj.idx_start:inj.idx_end])
    return (f"[chaos] {inj.kind:<19} #{inj.n:<3} rounds {inj.idx_end - inj.idx_start:>5}  wrong {wrong}  "
            f"max wait {mx:6.2f} ms (deadline {cfg.deadline_ms:g})  resumed after {resume} rounds"
            + (f"  ERROR {inj.error}" if inj.error else ""))
