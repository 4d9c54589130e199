"""The proxy: owns a segment incarnation, keeps its heartbeat, waits for an engine, runs the rounds.

    create incarnation (READY) -> wait for ATTACHED -> round t0, t0+1, ... -> (engine gone / abandoned)
    -> unlink, create the next incarnation -> ...            stop: fail_all far ahead, STOPPING, unlink

The round loop is one thread (`serve`); the heartbeat is another (`_Heartbeat`), so a long STEP or a
slow engine never makes the proxy look dead. `Proxy` runs the same in `dspark-proxy start` (its own
process) and in the shim's thread mode (a thread inside the engine process).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time

from .config import IN_PROCESS_WORKERS, ProxyConfig, config_to_dict, parse_hostport
from .engine_alive import EngineAlive
from .link.draft_client import DraftClient
from .ops.events import EventRing
from .ops.keep_awake import KeepAwake
from .ops.metrics import LATENCY_BOUNDS_US  # the bounds only: prometheus-client is imported at start
from .ops.stats import Stats
from .round.breaker import CircuitBreaker
from .round.core import RoundCore, RoundSettings
from .round.gate import PAUSED, GateSettings
from .shm import hostflag as hf
from .shm.hostflag import FAR_AHEAD, HostFlags
from .shm.layout import LayoutParams, State, Word
from .shm.ring_shm import reap_stale
from .shm.segment import Segment
from .shm.target import read_engine_target

__all__ = ["Proxy", "run_proxy", "layout_params"]

log = logging.getLogger(__name__)

# The idle cost is one wake per cadence (docs/performance.md, "Idle, state by state"). The heartbeat beats a tenth of the shim's
# default 1 s heartbeat timeout while an engine is attached; before, nobody judges it (the shim's
# watchdog reads it only once attached, and counts its age from the attach), so it beats once a
# second. The round loop's waits come back this often to see stop and abandoned.
HEARTBEAT_EVERY_S = 0.1
HEARTBEAT_UNATTACHED_EVERY_S = 1.0
WAIT_SLICE_S = 0.25
ENGINE_LOOK_S = 1.0  # how often a proxy waiting for `gathered` asks whether its engine's process is gone
RELOOK_MASK = 4095  # and, while rounds come, every 4096th round: whether its spin can pay (_relook)
STATS_EVERY_S = 0.25
STATS_IDLE_EVERY_S = 5.0


def layout_params(cfg: ProxyConfig) -> LayoutParams:
    c = cfg.resolved()
    return LayoutParams(max_reqs=c.max_reqs, num_spec=c.num_spec, window=c.window, row_bytes=c.row_bytes,
                        max_rows=int(c.max_rows), resync_per_round=int(c.resync_per_round), sampled=c.sampled,
                        segment_rows=c.segment_rows)


class _Heartbeat:
    """Beats the segment's HEARTBEAT_NS and publishes the stats snapshot, from its own thread."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self._stop = threading.Event()
        self._kick = threading.Event()  # stop, or an engine attached: beat now, then at the fast cadence
        self._thread = threading.Thread(target=self._run, name="dspark-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()

    def kick(self) -> None:
        self._kick.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        next_stats = 0.0
        last: tuple[object, int] = (None, -1)  # (segment, round) of the last snapshot published
        last_events = 0  # events recorded by then
        next_reap = 0.0
        while not self._stop.is_set():
            self._kick.clear()  # before the beat: a kick from here on ends the wait below
            if time.monotonic() >= next_reap:  # named rings of ended engines of our name, attached or
                next_reap = time.monotonic() + 0.9 * ENGINE_LOOK_S  # not (a memfd: nothing; §9); 0.9: every 1 s beat
                reap_stale(self.proxy.cfg.name)
            seg = self.proxy.segment
            if seg is not None:
                try:
                    seg.set_word(Word.HEARTBEAT_NS, hf.monotonic_ns())
                    now = time.monotonic()
                    seen = (seg, seg.word(Word.PROXY_ROUND))
                    # a later incarnation's engine usually re-attaches within a look (0.1 s): its
                    # first snapshot waits for that (the breaker re-based to the new engine's rounds)
                    # or 1 s, so that no snapshot of it shows the previous engine's rounds
                    p = self.proxy
                    # (an engine that is gone comes back under no pid: nothing to wait for)
                    fresh = (p.core is None and p.incarnations > 1 and not p.engine_gone
                             and now - p.ready_at < HEARTBEAT_UNATTACHED_EVERY_S)
                    # a snapshot costs ~1 ms of encoding: only when rounds ran (or now and then, idle),
                    # and at the next beat after a new event (a fault's: rare, and read soon after it)
                    evs = p.events.total
                    # (a new incarnation's block is empty: its first snapshot is due at once)
                    due = seg is not last[0] or (now >= next_stats and (seen != last
                                                                       or now >= next_stats + STATS_IDLE_EVERY_S))
                    if not fresh and (due or evs != last_events):
                        next_stats, last, last_events = now + STATS_EVERY_S, seen, evs
                        p.publish_stats(seg)
                except (ValueError, RuntimeError, TypeError):
                    pass  # segment swapped under us, or a stats dict changed while iterated: next beat
            attached = seg is not None and self.proxy.core is not None
            self._kick.wait(HEARTBEAT_EVERY_S if attached else HEARTBEAT_UNATTACHED_EVERY_S)


class Proxy:
    """One proxy: `serve()` until `stop()`. The client may be injected (tests, thread mode)."""

    def __init__(self, cfg: ProxyConfig, client: DraftClient | None = None, token: bytes | None = None,
                 sources: dict[str, str] | None = None) -> None:
        self.cfg = cfg.resolved()
        self.params = layout_params(self.cfg)
        self.stats = Stats()
        self.stats.set("config", config_to_dict(self.cfg))
        self.stats.set("config_sources", dict(sources or {}))
        self.events = EventRing(64)
        self.breaker = CircuitBreaker(self.cfg.breaker_threshold, self.cfg.breaker_cooldown)
        self.settings = RoundSettings(
            want_margin=self.cfg.want_margin, n_out_table=tuple(self.cfg.n_out_table),
            step_timeout_s=None if self.cfg.step_timeout_ms is None else self.cfg.step_timeout_ms / 1e3,
            gate=GateSettings(break_even=self.cfg.accept_break_even, patience=self.cfg.accept_patience,
                              pause=self.cfg.accept_pause, pause_max=self.cfg.accept_pause_max,
                              probe=self.cfg.accept_probe, tps_every=self.cfg.accept_tps_every,
                              tps_margin=self.cfg.accept_tps_margin))
        if client is None and self.cfg.worker in IN_PROCESS_WORKERS:
            from .worker.inproc import InProcessClient

            client = InProcessClient(max_reqs=self.cfg.max_reqs, num_spec=self.cfg.num_spec,
                                     window=self.cfg.window, row_bytes=self.cfg.row_bytes,
                                     null=self.cfg.worker == "null")
        if client is None:
            client = _remote_client(self.cfg, self.params, token)
        self.client: DraftClient = client
        self.segment: Segment | None = None
        self.core: RoundCore | None = None
        self._stop = threading.Event()
        self._heartbeat = _Heartbeat(self)
        self._awake = KeepAwake(0.0)  # serve() makes the configured one (spinners live while it runs)
        self._stats_lock = threading.Lock()  # the stats block's one writer at a time
        self.incarnations = 0
        self.ready = threading.Event()  # set once the first incarnation is READY (tests, demo)
        self.ready_at = 0.0  # when the current incarnation became READY (the heartbeat's first snapshot)
        self._last_log = 0
        self._last_round: int | None = None  # the previous engine's last round (rebasing the next one's)
        self.engine_gone = False  # the last incarnation ended with its engine's process gone
        self._hang_asked = False  # --fault-round-hang-ms: SIGUSR1 (or hang_round_loop()) sets it

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Ask serve() to return (signal-safe: sets an Event and nothing else)."""
        self._stop.set()

    def hang_round_loop(self) -> None:
        """Fault hook (--fault-round-hang-ms): the round loop blocks for that long before its next
        round while the heartbeat goes on (signal-safe: sets a flag and nothing else; a plain attribute,
        which the round loop reads without a call)."""
        self._hang_asked = True

    def _hang(self, t: int) -> None:
        self._hang_asked = False
        ms = self.cfg.fault_round_hang_ms
        log.warning("[proxy] fault: round loop blocked for %.0f ms before round %d", ms, t)
        self.stats.inc("fault_round_hangs")
        self._stop.wait(ms / 1e3)

    def serve(self) -> None:
        """Run incarnations until stop(). On the way out: fail everything ahead, STOPPING, unlink."""
        cfg = self.cfg
        log.info("[proxy] start name=%s worker=%s M=%d N=%d W=%d row_bytes=%d max_rows=%d resync_per_round=%d "
                 "sampled=%s deadline_ms=%.3f breaker=%d/%d", cfg.name, cfg.worker, cfg.max_reqs, cfg.num_spec,
                 cfg.window, cfg.row_bytes, cfg.max_rows, cfg.resync_per_round, cfg.sampled, cfg.deadline_ms,
                 cfg.breaker_threshold, cfg.breaker_cooldown)
        self.client.start()
        self._heartbeat.start()
        self._awake = KeepAwake(cfg.keep_awake_ms)
        try:
            while not self._stop.is_set():
                self._incarnation()
        finally:
            self._awake.close()
            self._heartbeat.stop()
            self._heartbeat.join(1.0)
            self._finish_segment(State.STOPPING)
            self.client.stop()
            self.write_stats_file()
            log.info("[proxy] stopped name=%s", cfg.name)

    # ------------------------------------------------------------------ one incarnation

    def _incarnation(self) -> None:
        seg = Segment.create(self.cfg.name, self.params, deadline_ms=self.cfg.deadline_ms)
        self.segment = seg
        self.incarnations += 1
        seg.set_word(Word.STATE, State.READY)
        self.ready.set()
        self.ready_at = time.monotonic()
        if self.incarnations == 1 or self.engine_gone:
            self._heartbeat.kick()  # the first snapshot at once (`status`, wait_connected)
        log.info("[proxy] ready name=%s incarnation=%d bytes=%d", self.cfg.name, seg.incarnation,
                 seg.layout.total_bytes)
        t0 = self._wait_attached(seg)
        if t0 is None:
            if not self._stop.is_set():
                self._finish_segment(State.DEAD)
            return
        seg.set_word(Word.HEARTBEAT_NS, hf.monotonic_ns())  # beating slowly until now: a fresh beat
        core = self.core = RoundCore(seg, self.client, self.stats, self.events, self.breaker, self.settings)
        self._rebase(t0)
        self._name_target(seg)
        self.client.new_session(f"engine attached at round {t0}")
        self._heartbeat.kick()  # the fast cadence from now on, and a snapshot of the re-based state
        self.stats.inc("attaches")
        self.engine_gone = False
        pid = seg.word(Word.ENGINE_PID)
        engine = EngineAlive(pid)  # a pidfd: a reused pid is not the engine
        self.stats.set("spin_max_ns", core.flags.spin.max_ns)  # decided at attach, from both sides' CPUs
        log.info("[proxy] engine attached incarnation=%d pid=%d round=%d", seg.incarnation, pid, t0)
        t = t0
        # PROXY_ROUND, as each round begins (the shim's watchdog reads it: no sleeper, so no wake), without
        # set_word's two Python calls: between `gathered` and the round, every call is on the engine's wait
        begin = functools.partial(hf.store_release, seg.mm, seg.layout.word_off(Word.PROXY_ROUND))
        gate = core.accept.gate
        try:
            while not self._stop.is_set():
                w0 = time.perf_counter()
                if not self._wait_gathered(seg, core.flags, t, engine):
                    break
                waited_us = (time.perf_counter() - w0) * 1e6  # the engine's step, as the proxy saw it
                begin(t)
                if self._hang_asked:
                    self._hang(t)
                core.handle(t, waited_us)
                self.stats.observe("gather_us", waited_us)  # after the publish: off the engine's wait
                if gate.b_state != PAUSED:
                    # the next round's CPU awake and warm (--keep-awake-ms; off: a no-op). Not while the gate
                    # pauses the batch: the engine answers those rounds itself (shm_layout.md §3), and a
                    # spinning CPU can slow the engine's own (docs/performance.md, "Keeping the proxy's
                    # CPUs awake")
                    self._awake.kick()
                self._maybe_log(t)
                if not t & RELOOK_MASK:
                    self._relook(core.flags)
                t += 1
        except Exception as e:  # noqa: BLE001 - the hand-off is broken: die for this incarnation
            self._die(seg, core.flags, t, repr(e))
        engine.close()
        core.release_ring()  # an ended engine's ring goes with our mapping of it (shm_layout.md §9)
        core.accept.flush()  # the engine's last rounds' accepted drafts into the counters
        self._last_round = t - 1
        self._finish_segment(State.DEAD)

    def _rebase(self, t0: int) -> None:
        """A new engine attached at its round t0 (numbering afresh, from 1 after a restart). What is
        counted in rounds restarts with it: the row cap, the link pacing and the resync bookkeeping are
        the new RoundCore's; the breaker, which outlives engines, keeps the cooldown it had left."""
        if self._last_round is not None:
            self.breaker.rebase(self._last_round, t0)
            if self.breaker.state != "closed":
                log.info("[proxy] the circuit breaker is %s: its cooldown continues in the new engine's rounds "
                         "(opened at round %s of them)", self.breaker.state, self.breaker.opened_round)
            self.stats.set("breaker", self.breaker.snapshot())
        self._last_log = t0

    def _name_target(self, seg: Segment) -> None:
        """The attached engine's target (shm/target.py), else --target-id, goes into the client's
        HELLO: a client whose last HELLO named another handshakes again (a worker whose head was made
        for another target then refuses it, naming the field)."""
        named = read_engine_target(seg.mm)
        if named and self.cfg.target_id and named != self.cfg.target_id:
            log.warning("[proxy] the engine names target_id=%s, --target-id is %s: the engine's is used", named,
                        self.cfg.target_id)
        tid = named or self.cfg.target_id
        self.stats.set("target_id", tid)
        retarget = getattr(self.client, "set_target_id", None)
        if retarget is not None:
            retarget(tid)

    def _wait_attached(self, seg: Segment) -> int | None:
        off = seg.layout.word_off(Word.ATTACHED)
        while not self._stop.is_set():
            if hf.wait_ge(seg.mm, off, 1, WAIT_SLICE_S, 0):
                return seg.word(Word.ATTACHED)  # engine_pid came first: it is the attach claim
            if seg.word(Word.ABANDONED):  # claimed by an engine that died before storing attached
                log.info("[proxy] incarnation %d abandoned before its first round: starting a new one",
                         seg.incarnation)
                self.stats.inc("abandoned")
                return None
        return None

    def _wait_gathered(self, seg: Segment, flags: HostFlags, t: int, engine: EngineAlive) -> bool:
        """True once round t is gathered; False when stopping, when the engine abandoned us, or when
        its process is gone (a killed engine abandons nothing: the new incarnation this starts removes
        its shared ring, M x W x row_bytes of /dev/shm, at once rather than when the next engine of
        the name comes). A prefill's forward can take seconds, so there is no give-up on a live engine."""
        t0 = time.monotonic()
        next_log, next_look = IDLE_LOG_FIRST_S, ENGINE_LOOK_S
        while not self._stop.is_set():
            if flags.wait_gathered(t, WAIT_SLICE_S):
                return True
            if seg.word(Word.ABANDONED):
                log.info("[proxy] incarnation %d abandoned by the engine at round %d: starting a new one",
                         seg.incarnation, t)
                self.stats.inc("abandoned")
                return False
            waited = time.monotonic() - t0
            if waited >= next_look:  # (once a second: the idle proxy's budget, docs/performance.md, "Idle, state by state")
                next_look = waited + ENGINE_LOOK_S
                self._relook(flags)
                if not engine.alive():
                    log.info("[proxy] the engine of incarnation %d (pid %d) is gone at round %d: starting a new "
                             "one", seg.incarnation, engine.pid, t)
                    self.stats.inc("engine_gone")
                    self.engine_gone = True
                    return False
            if waited >= next_log:  # an idle engine (no requests) is no fault: INFO, ever less often
                log.info("[proxy] round %d not gathered for %.0f s: the engine is idle or in a long step (logged "
                         "at %.0f s, then at doubling waits up to every %.0f s; words %s)", t, waited, IDLE_LOG_FIRST_S,
                         IDLE_LOG_MAX_S,
                         flags.values())
                next_log = min(next_log * 2, next_log + IDLE_LOG_MAX_S)
        return False

    def _relook(self, flags: HostFlags) -> None:
        """Whether the round's waits may spin is decided at attach from the CPUs the engine's thread and
        ours may use; a thread re-pinned since (an engine that binds its threads after it attached) would
        keep a stale decision: looked at again once a second while idle and every 4096th round, after
        the publish (shm_layout.md §6)."""
        if flags.spin.relook():
            self.stats.set("spin_max_ns", flags.spin.max_ns)
            log.info("[proxy] the CPUs the engine or the proxy may use changed: the round's waits now spin up "
                     "to %d us", flags.spin.max_ns // 1000)

    def _die(self, seg: Segment, flags: HostFlags, t: int, reason: str) -> None:
        """Fail every pending and later round first (one C call), then record it."""
        flags.fail_all(t + FAR_AHEAD)
        self.stats.inc("deaths")
        self.stats.set("dead_reason", reason)
        log.error("[proxy] round loop stopped at round %d (%s): every later round is target-only; "
                  "starting a new incarnation", t, reason)

    def _finish_segment(self, state: int) -> None:
        seg, self.segment, self.core = self.segment, None, None
        if seg is None:
            return
        try:
            HostFlags(seg).fail_all(max(seg.word(Word.GATHERED), seg.word(Word.CLAIMED)) + FAR_AHEAD)
            seg.set_word(Word.STATE, state)
            self.publish_stats(seg)
        except ValueError:
            pass
        seg.unlink()
        seg.close()

    # ------------------------------------------------------------------ statistics

    def snapshot(self) -> dict:
        snap = self.stats.snapshot()
        snap["breaker"] = self.breaker.snapshot()
        snap["watchdog_events"] = self.events.dump()
        snap["client"] = dict(getattr(self.client, "counters", {}))
        snap["workers"] = worker_links(self.client, self.breaker)
        snap["incarnations"] = self.incarnations
        snap["pid"] = os.getpid()
        snap["gauges"]["keep_awake"] = self._awake.snapshot()
        snap["histograms"] = self.stats.histograms(LATENCY_BOUNDS_US)  # Prometheus's latency buckets
        core = self.core
        if core is not None:
            snap["gauges"]["accept_gate"] = core.accept.gate.snapshot()
        return snap

    def publish_stats(self, seg: Segment) -> None:
        """Publish the snapshot into the segment. The block is a single-writer seqlock and both the
        heartbeat thread and the round thread (at the end of an incarnation) publish: the lock makes
        them one writer."""
        with self._stats_lock:
            st = self.stats
            st.set("breaker", self.breaker.snapshot())
            st.set("watchdog_events", self.events.dump())
            st.set("client", dict(getattr(self.client, "counters", {})))
            st.set("workers", worker_links(self.client, self.breaker))
            st.set("incarnations", self.incarnations)
            st.set("keep_awake", self._awake.snapshot())
            core = self.core
            if core is not None:
                st.set("accept_gate", core.accept.gate.snapshot())
            seg.write_block("proxy", st.snapshot_bytes(seg.layout.regions["proxy_stats"][1] - 8))

    def write_stats_file(self) -> None:
        if not self.cfg.stats_file:
            return
        try:
            self.stats.set("breaker", self.breaker.snapshot())
            self.stats.write_json(self.cfg.stats_file)
        except OSError as e:
            log.warning("[proxy] stats file %s: %s", self.cfg.stats_file, e)

    def _maybe_log(self, t: int) -> None:
        every = self.cfg.log_every
        if every <= 0 or t - self._last_log < every:
            return
        self._last_log = t
        log.info("%s", self.stats.format_line(f"[proxy] t={t}"))
        self.write_stats_file()


def _remote_client(cfg: ProxyConfig, params: LayoutParams, token: bytes | None) -> DraftClient:
    """One address: the plain client (today's path); several, or @FILE: a pool of them (pool/)."""
    from .link.client import TcpDraftClient
    from .pool.addresses import parse_worker_spec

    spec = parse_worker_spec(cfg.worker)

    def make(host: str, port: int) -> TcpDraftClient:
        return TcpDraftClient(host, port, max_reqs=cfg.max_reqs, num_spec=cfg.num_spec, window=cfg.window,
                              row_bytes=cfg.row_bytes, sampled=cfg.sampled, token=token,
                              target_id=cfg.target_id, spin_us=cfg.spin_us)

    if not spec.is_pool:
        host, port = parse_hostport(spec.addresses[0], field="worker")
        return make(host, port)
    from .pool.client import PoolClient

    pool = PoolClient(spec.addresses, max_reqs=cfg.max_reqs, num_spec=cfg.num_spec, window=cfg.window,
                      row_bytes=cfg.row_bytes, max_rows=params.max_rows, deadline_ms=cfg.deadline_ms,
                      sampled=cfg.sampled, make_client=make, file=spec.file,
                      breaker=(cfg.breaker_threshold, cfg.breaker_cooldown))
    if spec.dns is not None:  # members from DNS, re-resolved while it runs (pool/dns.py)
        from .pool.dns import DnsWatcher

        watcher = DnsWatcher(*spec.dns, pool.set_addresses)
        watcher.resolve_now()  # the first members before the first round, where the name resolves yet
        pool.watchers.append(watcher)
    return pool


IDLE_LOG_FIRST_S = 30.0  # an idle proxy's "not gathered" line: at 30, 60, 120, ... s, then every 10 min
IDLE_LOG_MAX_S = 600.0


def worker_links(client: object, breaker: CircuitBreaker) -> list[dict]:
    """Each worker's link for `status` (pool/member.py: link_of): a pool's own list; one remote worker's
    with the round's breaker; none for an in-process worker."""
    links = getattr(client, "links", None)
    if links is not None:
        return links(breaker)
    if hasattr(client, "link_error"):
        from .pool.member import link_of

        return [link_of(client, breaker)]
    return []


def run_proxy(cfg: ProxyConfig, token: bytes | None = None, sources: dict[str, str] | None = None) -> Proxy:
    """Run a proxy in the foreground until SIGTERM/SIGINT (the signal handlers only set stop)."""
    import signal

    proxy = Proxy(cfg, token=token, sources=sources)

    def _on_signal(signum: int, frame: object) -> None:
        proxy.stop()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    if hasattr(proxy.client, "reload"):  # a pool given as @FILE re-reads it (pool/addresses.py)
        signal.signal(signal.SIGHUP, lambda signum, frame: proxy.client.reload())
    if cfg.fault_round_hang_ms > 0:
        signal.signal(signal.SIGUSR1, lambda signum, frame: proxy.hang_round_loop())
    metrics = None
    if cfg.metrics_port is not None:
        from .ops.metrics import start_metrics_server

        metrics = start_metrics_server(cfg.metrics_port, proxy.snapshot, addr=cfg.metrics_host)
        log.info("[proxy] metrics url=%s", metrics.url)
    try:
        proxy.serve()
    finally:
        if metrics is not None:
            metrics.stop()
    return proxy
