"""One configuration schema for every command: frozen dataclasses, and the click glue derived from them.

Each setting is declared once, as a dataclass field with a default and a one-line help
(``field(metadata={"help": ...})``); the click options, their ``Choice``s, their env var names and the
validation all come from that declaration, so a new setting is one edit, not one per layer.

Precedence (highest first): command-line flag > environment variable ``DSPARK_PROXY_<FIELD>`` (for
example ``DSPARK_PROXY_MAX_REQS``) > TOML file given by ``--config`` (or ``DSPARK_PROXY_CONFIG``) >
the dataclass default. Click does the layering: the file is loaded into ``ctx.default_map`` by the eager
``--config`` option before any other option is read, and ``ctx.get_parameter_source`` tells afterwards
where each value came from.

TOML layout: top-level keys are shared by every command (the natural place for the layout fields that
the proxy and the worker must agree on); a table per command overrides them for that command only::

    num_spec = 5          # proxy and worker
    window = 128
    row_bytes = 71680

    [proxy]               # dspark-proxy start
    worker = "10.0.0.2:7470"
    deadline_ms = 4.0
    n_out_table = [5, 5, 4, 3]

    [worker]              # dspark-proxy worker
    listen = "0.0.0.0:7470"
    token_file = "/etc/dspark/token"

A top-level key is used by the commands whose schema has it and ignored by the others; a key that no
command knows is an error (a typo must not be silently dropped). Because ``[worker]`` is a table, the
proxy's ``worker`` address belongs in ``[proxy]`` when the file also has a ``[worker]`` table.

This is the only module that looks at the environment (through click's ``envvar``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from .pool.addresses import ConfigError, parse_hostport  # defined there, the lowest module raising them
from .shm.layout import derive_sizes
from .worker.drafters import DRAFTER_NAMES, DRAFTERS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

__all__ = [
    "ENV_PREFIX",
    "IN_PROCESS_WORKERS",
    "MAX_NUM_SPEC",
    "MAX_REQS_LIMIT",
    "ConfigError",
    "LayoutConfig",
    "ProxyConfig",
    "WorkerConfig",
    "config_to_dict",
    "derive_sizes",
    "env_var",
    "format_settings",
    "load_toml",
    "parse_hostport",
]

ENV_PREFIX = "DSPARK_PROXY"
MAX_NUM_SPEC = 255  # N travels in a uint8 on the wire, like k_window
MAX_REQS_LIMIT = 65536  # requests per round (M); the descriptor and reply page are sized by it
_MAX_WINDOW = 65536
_MAX_ROW_BYTES = 1 << 30
_MIB = 1 << 20

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
RowDtype = Literal["bfloat16", "float16", "float32"]
Drafter = Literal[DRAFTER_NAMES]  # the drafters table (worker/drafters/registry.py)

Source = Literal["cli", "env", "file", "head", "default"]  # head: a head's manifest (--head, --shapes-from)


IN_PROCESS_WORKERS = ("inproc", "null")  # ProxyConfig.worker values that need no network


def env_var(name: str) -> str:
    """The environment variable that sets field ``name``: ``DSPARK_PROXY_<NAME>``."""
    return f"{ENV_PREFIX}_{name.upper()}"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _where(name: str) -> str:
    return f"({_flag(name)} / {env_var(name)})"


# ---------------------------------------------------------------------------------------------- ranges


@dataclass(frozen=True)
class _Range:
    """Accepted numeric range, inclusive unless ``lo_open``; rendered in error messages."""

    lo: float
    hi: float = math.inf
    lo_open: bool = False

    def __contains__(self, v: float) -> bool:
        above = v > self.lo if self.lo_open else v >= self.lo
        return above and v <= self.hi

    def __str__(self) -> str:
        hi = "inf)" if self.hi == math.inf else f"{self.hi:g}]"
        return f"{'(' if self.lo_open else '['}{self.lo:g}, {hi}"


def _opt(default: Any, help: str, rng: _Range | None = None, **meta: Any) -> Any:
    return field(default=default, metadata={"help": help, "range": rng, **meta})


# ---------------------------------------------------------------------------------------------- helpers


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------- schema


@dataclass(frozen=True, kw_only=True)
class _Base:
    """Type checks, coercion and range checks shared by every config class, run at construction, so
    a config built in a test or by ``dataclasses.replace`` is as valid as one built from the CLI."""

    SECTION: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            v = _coerce(f.name, getattr(self, f.name), hints[f.name])
            object.__setattr__(self, f.name, v)
            rng = f.metadata.get("range")
            if rng is not None and v is not None and v not in rng:
                raise ConfigError(f"{f.name}={v!r} is out of range: must be in {rng} {_where(f.name)}", f.name)
        self._validate()

    def _validate(self) -> None:
        """Cross-field checks; subclasses extend."""


def _coerce(name: str, v: Any, tp: Any) -> Any:
    """Check ``v`` against the field type ``tp`` (int, float, str, bool, Literal, tuple[int, ...], X | None),
    widening int to float and list to tuple, as a TOML file or a test may pass them."""
    args = typing.get_args(tp)
    if type(None) in args:
        if v is None:
            return None
        (tp,) = (a for a in args if a is not type(None))
        args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    bad = f"{name}={v!r}: expected "
    if origin is Literal:
        if v not in args:
            raise ConfigError(f"{bad}one of {', '.join(map(str, args))} {_where(name)}", name)
        return v
    if origin is tuple:
        if not isinstance(v, (tuple, list)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise ConfigError(f"{bad}a list of integers {_where(name)}", name)
        return tuple(v)
    if tp is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"{bad}true or false {_where(name)}", name)
        return v
    if tp is int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"{bad}an integer {_where(name)}", name)
        return v
    if tp is float:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise ConfigError(f"{bad}a finite number {_where(name)}", name)
        return float(v)
    if tp is str:
        if not isinstance(v, str):
            raise ConfigError(f"{bad}a string {_where(name)}", name)
        return v
    raise TypeError(f"config field {name}: unsupported type {tp!r}")  # a schema bug, not user input


@dataclass(frozen=True, kw_only=True)
class LayoutConfig(_Base):
    """The shapes that fix the shared-memory layout and that proxy, shim and worker must agree on."""

    max_reqs: int = _opt(64, "M: most requests in one round (also the number of request slots).",
                         _Range(1, MAX_REQS_LIMIT))
    num_spec: int = _opt(5, "N: draft tokens per request per round.", _Range(1, MAX_NUM_SPEC))
    window: int = _opt(16, "W: hidden-state rows kept per request (the drafter's window).",
                       _Range(1, _MAX_WINDOW))
    row_bytes: int = _opt(256, "Bytes in one hidden-state row (tapped layers x hidden x dtype size).",
                          _Range(1, _MAX_ROW_BYTES))
    sampled: bool = _opt(False, "Sampled mode: per-request seed and temperature, top-32 support and q.")

    def layout(self) -> LayoutConfig:
        """Just the layout fields, for comparing a proxy's, a worker's and an engine's shapes."""
        return LayoutConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LayoutConfig)})


@dataclass(frozen=True, kw_only=True)
class ProxyConfig(LayoutConfig):
    """``dspark-proxy start``: the proxy process that runs the round beside the engine."""

    SECTION: ClassVar[str] = "proxy"

    name: str = _opt("dspark", "Shared-memory segment name (one proxy per name; the shim attaches by it).")
    worker: str = _opt("127.0.0.1:7470", "Draft worker address, HOST:PORT; several, HOST:PORT,HOST:PORT,... (a "
                       "pool); @FILE, a file listing them, re-read on SIGHUP; 'inproc' (an integrity worker "
                       "inside the proxy, no network) or 'null' (fixed drafts, no windows) for benchmarks.")
    target_id: str = _opt("", "The target model the worker's head must be made for (its HELLO names it; "
                          "e.g. 'sha256:...' of dspark_proxy.model.hf.target_id); an engine that names one "
                          "at attach is used instead. Empty: not checked.")
    want_margin: bool = _opt(False, "Ask the worker for the top-1/top-2 logit margin per draft.")
    deadline_ms: float = _opt(5.0, "Round deadline in ms: the shim fails a round not published by then.",
                              _Range(0, 60_000, lo_open=True))
    n_out_table: tuple[int, ...] = _opt(
        (), "Draft positions to produce by batch size: entry min(n, len-1) for n requests; 0 or empty = all N. "
        "Comma list on the command line.")
    staging_budget_mb: int = _opt(256, "MiB of gather staging and resync windows; sets max_rows and "
                                  "resync_per_round unless they are given.", _Range(1, 1 << 20))
    max_rows: int | None = _opt(None, "Most rows staged per round (default: derived from the staging budget).",
                                _Range(1, math.inf))
    resync_per_round: int | None = _opt(None, "Most resync windows staged per round (default: derived from "
                                        "the staging budget).", _Range(1, math.inf))
    segment_rows: bool = _opt(False, "Keep a staging and resync windows' rows in the segment, for engines whose "
                              "ring is private (DSPARK_SHARED_RING=0, or a /dev/shm too small for it); by "
                              "default rows are sent from the engine's shared ring.")
    breaker_threshold: int = _opt(3, "Consecutive failed rounds that open the circuit breaker.",
                                  _Range(1, math.inf))
    breaker_cooldown: int = _opt(50, "Rounds the open breaker keeps the network off before one probe round.",
                                 _Range(0, math.inf))
    stats_file: str | None = _opt(None, "Write the statistics as JSON to this file (atomically) every "
                                  "--log-every rounds and at exit.")
    log_every: int = _opt(1000, "Rounds between one-line summaries in the log (0: never).", _Range(0, math.inf))
    keep_awake_ms: float = _opt(0.0, "After each round, keep the proxy's CPUs (its affinity, at most 8; pin it "
                                "with taskset) out of idle for this long, spinning at SCHED_IDLE priority: the "
                                "next round's wake-up and caches stay warm, no other task loses CPU time, and "
                                "spinning stops this long after the last round (0: off).", _Range(0, 60_000))
    spin_us: float = _opt(0.0, "Wait for each worker reply by polling the socket for up to this many "
                          "microseconds before sleeping: a reply that comes meanwhile wakes no sleeping "
                          "thread (about 0.1 ms less a round trip here), but the proxy keeps a CPU busy at "
                          "normal priority meanwhile, never past the round's deadline (0: off).",
                          _Range(0, 1_000_000))
    token_file: str | None = _opt(None, "File holding the shared secret for the worker handshake.")
    metrics_port: int | None = _opt(None, "Serve Prometheus metrics on --metrics-host:PORT (0: any free port).",
                                    _Range(0, 65535))
    metrics_host: str = _opt("127.0.0.1", "Address the Prometheus endpoint binds (0.0.0.0: every interface).")
    step_timeout_ms: float | None = _opt(None, "Timeout of one worker round trip in ms (default: what is "
                                         "left of the deadline when the STEP goes out).",
                                         _Range(0, 60_000, lo_open=True))
    accept_break_even: float = _opt(0.3, "Accepted drafts per verified round below which a request (or the "
                                    "whole batch) stops asking drafts for a while (0: always ask).", _Range(0, 255))
    accept_patience: int = _opt(16, "Verified rounds of a request (or the batch) before it may be paused.",
                                _Range(1, 1 << 20))
    accept_pause: int = _opt(64, "Rounds a paused request (or batch) goes without drafts before a probe.",
                             _Range(1, 1 << 30))
    accept_pause_max: int = _opt(1024, "Longest pause: each failed probe doubles the pause up to this.",
                                 _Range(1, 1 << 30))
    accept_probe: int = _opt(2, "Verified rounds a probe lasts before it resumes drafting or pauses again.",
                             _Range(1, 1 << 20))
    accept_tps_every: int = _opt(2048, "The gate's throughput rule: the whole batch stops drafting while its "
                                 "tokens per second of engine time with drafts fall below those without, "
                                 "sampled for --accept-patience rounds every this many rounds, the first "
                                 "after a quarter of them (0: acceptance only).", _Range(0, 1 << 30))
    accept_tps_margin: float = _opt(0.1, "What a paused batch's probe must beat the rate without drafts by "
                                    "to resume drafting (0.1: 10%).", _Range(0, 10))
    log_level: LogLevel = _opt("INFO", "Logging level.")
    fault_round_hang_ms: float = _opt(0.0, "Fault injection (flag only): on SIGUSR1 the round loop blocks for "
                                      "this many ms before its next round, the heartbeat going on (0: off).",
                                      _Range(0, 3.6e6), flag_only=True)

    def _validate(self) -> None:
        if self.worker not in IN_PROCESS_WORKERS:
            from .pool.addresses import parse_worker_spec  # several addresses or @FILE (a pool)

            parse_worker_spec(self.worker, field="worker")
        if self.target_id and (len(self.target_id) > 254 or not all(" " < c <= "~" for c in self.target_id)):
            raise ConfigError(f"target_id={self.target_id[:40]!r}: at most 254 printable ASCII characters, no "
                              f"spaces {_where('target_id')}", "target_id")
        _check_metrics_host(self.metrics_host)
        if not self.name or "/" in self.name:
            raise ConfigError(f"name={self.name!r}: a segment name must be non-empty and have no '/' "
                              f"{_where('name')}", "name")
        bad = [v for v in self.n_out_table if not 0 <= v <= self.num_spec]
        if bad:
            raise ConfigError(f"n_out_table={list(self.n_out_table)}: entries must be in [0, num_spec="
                              f"{self.num_spec}] {_where('n_out_table')}", "n_out_table")
        if self.max_rows is not None and self.max_rows > self.max_reqs * self.window:
            raise ConfigError(f"max_rows={self.max_rows} is out of range: must be in [1, max_reqs*window="
                              f"{self.max_reqs * self.window}] {_where('max_rows')}", "max_rows")
        if self.accept_pause_max < self.accept_pause:
            raise ConfigError(f"accept_pause_max={self.accept_pause_max} is below accept_pause={self.accept_pause} "
                              f"{_where('accept_pause_max')}", "accept_pause_max")
        if self.resync_per_round is not None and self.resync_per_round > self.max_reqs:
            raise ConfigError(f"resync_per_round={self.resync_per_round} is out of range: must be in "
                              f"[1, max_reqs={self.max_reqs}] {_where('resync_per_round')}", "resync_per_round")

    def resolved(self) -> ProxyConfig:
        """A copy with ``max_rows`` and ``resync_per_round`` filled from the staging budget where unset."""
        max_rows, resync = derive_sizes(self.max_reqs, self.num_spec, self.window, self.row_bytes,
                                        self.staging_budget_mb)
        return dataclasses.replace(
            self,
            max_rows=max_rows if self.max_rows is None else self.max_rows,
            resync_per_round=resync if self.resync_per_round is None else self.resync_per_round,
        )


@dataclass(frozen=True, kw_only=True)
class WorkerConfig(LayoutConfig):
    """``dspark-proxy worker``: the remote draft worker."""

    SECTION: ClassVar[str] = "worker"

    listen: str = _opt("127.0.0.1:7470", "Address to listen on, HOST:PORT (port 0: any free port).")
    drafter: Drafter = _opt("integrity", "Drafter: " + " or ".join(f"{n} ({e.what})" for n, e in DRAFTERS.items()) + ".")
    token_file: str | None = _opt(None, "File holding the shared secret; peers must prove they know it.")
    insecure: bool = _opt(False, "Allow listening on a non-loopback address without --token-file.")
    fault_delay_ms: float = _opt(0.0, "Fault injection: delay every reply by this many ms.", _Range(0, 3.6e6))
    fault_draft_delay_ms: float = _opt(0.0, "Fault injection: delay every reply to a STEP that asks for drafts "
                                       "by this many ms more (drafting made expensive).", _Range(0, 3.6e6))
    fault_stall_after: int = _opt(0, "Fault injection: stop answering after this many steps (0: off).",
                                  _Range(0, math.inf))
    fault_drop_every: int = _opt(0, "Fault injection: drop the connection every k-th step (0: off).",
                                 _Range(0, math.inf))
    fault_garbage_every: int = _opt(0, "Fault injection: answer every k-th step with garbage (0: off).",
                                    _Range(0, math.inf))
    fault_wrong_step_every: int = _opt(0, "Fault injection: answer every k-th step with a wrong step id "
                                       "(0: off).", _Range(0, math.inf))
    fault_wrong_session_every: int = _opt(0, "Fault injection: answer every k-th step, drafts and all, "
                                          "under another session id (0: off).", _Range(0, math.inf))
    fault_crash_after: int = _opt(0, "Fault injection: exit the process after this many steps (0: off).",
                                  _Range(0, math.inf))
    fault_duplicate_reply_every: int = _opt(0, "Fault injection: send every k-th reply twice (0: off).",
                                            _Range(0, math.inf))
    adopt_shapes: bool = _opt(True, "Serve each proxy under the max_reqs, window, N and row_bytes of its HELLO "
                              "where the drafter allows (a trained head fixes its own); off: only this "
                              "worker's, others refused naming the field.")
    memory_budget_mb: int = _opt(0, "MiB of slots (rows, CRC chains, the drafter's per-slot state) for all sessions together; past it a new session is "
                                 "refused with a clear error (0: room for 8 sessions of --max-reqs, at least 1 GiB with --adopt-shapes).",
                                 _Range(0, 1 << 30))
    max_window: int = _opt(_MAX_WINDOW, "Largest window a proxy's HELLO may ask (with --adopt-shapes); past it the "
                           "handshake is refused naming window.", _Range(1, 1 << 20))
    device: str = _opt("auto", "Torch device: cpu, cuda or cuda:K; auto: the dspark drafter on CUDA when present, "
                       "else the CPU (the torch drafter's head runs in numpy on the CPU; others are refused).")
    head: str | None = _opt(None, "The head: for --drafter torch a train-drafter directory (head.safetensors + "
                            "manifest.json) or its .safetensors file; for --drafter dspark a speculators DSpark "
                            "checkpoint directory (config.json + safetensors), whose N, window (sliding_window) "
                            "and row layout are the worker's.", alias="weights")
    target: str | None = _opt(None, "Dspark drafter: the target model directory its embedding (and lm_head) "
                              "come from (default: the checkpoint's speculators_config.verifier.name_or_path, "
                              "relative to the current directory or the repository root).")
    row_dtype: RowDtype = _opt("bfloat16", "Dspark drafter: the dtype of the rows the engine sends.")
    gpu_memory_budget_mb: int = _opt(0, "Dspark drafter on CUDA: MiB of device memory for the weights and a "
                                     "round's largest batch; past it the worker refuses to start (0: unchecked).",
                                     _Range(0, 1 << 30))
    random_weights: bool = _opt(False, "Let --drafter torch serve seeded random weights without --head (a smoke "
                                "test: nearly every draft is rejected).")
    seed: int = _opt(0, "Seed of the torch drafter's random weights (--random-weights).", _Range(0, 2**63 - 1))
    keep_awake_ms: float = _opt(0.0, "After each reply, keep the worker's CPUs (its affinity, at most 8; pin it "
                                "with taskset) out of idle for this long, spinning at SCHED_IDLE priority: the next "
                                "STEP wakes a warm CPU, no other task loses CPU time, and spinning stops this long "
                                "after the last STEP (0: off).", _Range(0, 60_000))
    spin_us: float = _opt(0.0, "After each reply, wait for the connection's next STEP by polling its socket for "
                          "up to this many microseconds before sleeping: a STEP that comes meanwhile wakes no "
                          "sleeping thread (about 0.1 ms less a round trip here), but the connection's thread "
                          "keeps a CPU busy at normal priority meanwhile (0: off).", _Range(0, 1_000_000))
    metrics_port: int | None = _opt(None, "Serve the worker's Prometheus metrics on --metrics-host:PORT (0: any "
                                    "free port).", _Range(0, 65535))
    metrics_host: str = _opt("127.0.0.1", "Address the worker's Prometheus endpoint binds (0.0.0.0: every "
                             "interface).")
    log_level: LogLevel = _opt("INFO", "Logging level.")

    def _validate(self) -> None:
        host, _ = parse_hostport(self.listen, field="listen", allow_port_zero=True)
        if not _is_loopback(host) and self.token_file is None and not self.insecure:
            raise ConfigError(
                f"listen={self.listen!r} is not a loopback address and no token_file is set: anyone who "
                f"can reach it could feed the engine drafts. Set --token-file (or {env_var('token_file')}), "
                f"or pass --insecure to accept that.", "listen")
        if not self.device:
            raise ConfigError(f"device: must not be empty {_where('device')}", "device")
        _check_metrics_host(self.metrics_host)
        if self.drafter == "torch" and not self.head and not self.random_weights:
            raise ConfigError(f"--drafter torch needs a trained head: --head DIR (or {env_var('head')}; "
                              f"train one with train-drafter), or --random-weights to serve seeded random "
                              f"weights whose drafts are nearly all rejected", "head")
        if self.head and self.random_weights:
            raise ConfigError("--head and --random-weights: give one of them", "random_weights")


def _check_metrics_host(host: str) -> None:
    """An empty host would bind every interface: that must be asked for by name (0.0.0.0 or ::)."""
    if not host.strip() or any(c.isspace() for c in host):
        raise ConfigError(f"metrics_host={host!r}: give an address to bind, e.g. 127.0.0.1 or 0.0.0.0 "
                          f"{_where('metrics_host')}", "metrics_host")


_CONFIG_CLASSES: tuple[type[_Base], ...] = (ProxyConfig, WorkerConfig)
_C = typing.TypeVar("_C", bound=_Base)


# ---------------------------------------------------------------------------------------------- TOML


def load_toml(path: str, cls: type[_Base]) -> dict[str, Any]:
    """The values a TOML file sets for ``cls``: shared top-level keys, overridden by its ``[SECTION]``.

    Unknown keys are an error; keys that belong to another command are skipped.
    """
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"config file {path}: cannot read it ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: not valid TOML ({e})") from None
    sections = {c.SECTION for c in _CONFIG_CLASSES}
    known = {f.name for c in _CONFIG_CLASSES for f in dataclasses.fields(c)}
    mine = {f.name for f in dataclasses.fields(cls)}
    doc = _renamed_keys(path, doc)
    out: dict[str, Any] = {}
    section: dict[str, Any] = {}
    for key, value in doc.items():
        if key in sections and isinstance(value, dict):
            if key == cls.SECTION:
                section = value
            continue
        if key not in known:
            raise ConfigError(f"config file {path}: unknown key {key!r} (known: {', '.join(sorted(known))}; "
                              f"tables: {', '.join(sorted(sections))})", key)
        if key in mine:
            out[key] = value
    for key, value in section.items():
        if key not in mine:
            raise ConfigError(f"config file {path}: unknown key {key!r} in [{cls.SECTION}] (known: "
                              f"{', '.join(sorted(mine))})", key)
        out[key] = value
    flag_only = sorted(k for k in out if _flag_only(cls, k))
    if flag_only:
        raise ConfigError(f"config file {path}: {flag_only[0]!r} is a fault-injection setting: give it as "
                          f"{_flag(flag_only[0])} on the command line only", flag_only[0])
    return out


def field_aliases() -> dict[str, str]:
    """Deprecated setting names -> their names now (a field's ``alias``; aliases.py, docs/operating.md)."""
    return {f.metadata["alias"]: f.name for c in _CONFIG_CLASSES for f in dataclasses.fields(c)
            if f.metadata.get("alias")}


def _renamed_keys(path: str, doc: dict[str, Any]) -> dict[str, Any]:
    """A file written for an older release still loads: a renamed key is read as its new name, with one
    line on stderr saying so (the same words as a deprecated flag)."""
    aliases = field_aliases()

    def rename(table: dict[str, Any], where: str) -> dict[str, Any]:
        out = {}
        for key, value in table.items():
            if key in aliases and not isinstance(value, dict):
                print(f"dspark-proxy: config file {path}: key {where}{key!r} is deprecated: use "
                      f"{aliases[key]!r} (same meaning)", file=sys.stderr)
                key = aliases[key]
            out[key] = value
        return out

    return {k: rename(v, f"[{k}] ") if isinstance(v, dict) else v for k, v in rename(doc, "").items()}


def _flag_only(cls: type[_Base], name: str) -> bool:
    """Fault hooks are set by an explicit flag only: never by an env var or a config file."""
    return any(f.name == name and f.metadata.get("flag_only") for f in dataclasses.fields(cls))


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The fields as JSON-able values (tuples as lists), for ``status --json`` and the startup log."""
    return {f.name: (list(v) if isinstance(v := getattr(cfg, f.name), tuple) else v)
            for f in dataclasses.fields(cfg)}


def format_settings(cfg: Any, sources: Mapping[str, str] | None = None) -> str:
    """Every effective setting on one line, ``key=value``, with ``(source)`` after any not at its default —
    the startup log line."""
    parts = []
    for k, v in config_to_dict(cfg).items():
        src = (sources or {}).get(k, "default")
        parts.append(f"{k}={v}" if src == "default" else f"{k}={v}({src})")
    return " ".join(parts)
