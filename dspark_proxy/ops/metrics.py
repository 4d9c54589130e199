"""Optional Prometheus endpoint: the proxy's statistics, scraped over HTTP.

``prometheus_client`` is imported only when the endpoint is started (it is an optional dependency, the
``metrics`` extra), and nothing is registered in its global registry: each server has its own registry
with one custom collector that turns a ``Stats.snapshot()`` into metric families at scrape time. So the
round thread does no work for Prometheus at all; the HTTP thread reads the snapshot (see ``stats.py`` for
why a snapshot may be taken from another thread).

Naming (namespace ``dspark_proxy`` by default; keys sanitised to ``[a-zA-Z0-9_]``), after Prometheus's
conventions (counters end in ``_total``, seconds, one ``_info`` metric for the configuration):

- counter ``k`` -> counter ``dspark_proxy_<k>_total``; the families of one kind carry a label instead:
  ``fallback_<cause>`` -> ``dspark_proxy_fallbacks_total{cause=...}``, ``req_status_<s>`` ->
  ``dspark_proxy_request_status_total{status=...}``, ``<k>_per_pos_<j>`` -> ``dspark_proxy_<k>_per_pos_total
  {position="j"}`` (the drafting's effect, named like vLLM's ``spec_decode`` counters:
  ``dspark_proxy_spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total``, ``..._num_accepted_tokens_per_pos_total{position}``)
- the ``client`` dict (the worker link's counters) -> counters ``dspark_proxy_client_<k>_total``
- the ``config`` dict -> one ``dspark_proxy_config_info{<setting>="<value>", ...} 1``
- other numeric or boolean gauge ``k`` -> gauge ``dspark_proxy_<k>``; a dict gauge (the breaker, the
  acceptance gate) is flattened one level, ``dspark_proxy_<k>_<field>``, with a string field as
  ``..._<field>{value="open"} 1``; a list gauge (``watchdog_events``) as its length
  ``dspark_proxy_<k>_len``; anything else is skipped
- latency ``k_us`` -> histogram ``dspark_proxy_<k>_seconds`` (buckets ``LATENCY_BOUNDS_S``, from the
  snapshot's ``histograms``: ``Proxy.snapshot()`` or a ``Stats`` getter has them), plus gauge
  ``dspark_proxy_<k>_max_seconds``; a snapshot without buckets (read from a segment) gives a summary
- ``dspark_proxy_stats_up``: 1, or 0 if the stats getter raised during this scrape
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import ThreadingHTTPServer
from typing import Any

from .deps import MissingDependency
from .metric_help import counter_help, gauge_help, latency_help

__all__ = ["MetricsServer", "MetricsBindError", "snapshot_to_families", "start_metrics_server",
           "LATENCY_BOUNDS_S", "LATENCY_BOUNDS_US"]

log = logging.getLogger(__name__)

_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_]")
_QUANTILES = (("0.5", "p50_us"), ("0.9", "p90_us"), ("0.99", "p99_us"), ("0.999", "p999_us"))


def _import_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise MissingDependency(
            "the Prometheus endpoint needs prometheus-client: pip install 'dspark-proxy[metrics]', or run "
            "without --metrics-port / DSPARK_PROXY_METRICS_PORT") from None
    return prometheus_client


def _name(*parts: str) -> str:
    n = _BAD_CHARS.sub("_", "_".join(p for p in parts if p))
    return n if not n[0].isdigit() else "_" + n


LATENCY_BOUNDS_S = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENCY_BOUNDS_US = tuple(b * 1e6 for b in LATENCY_BOUNDS_S)
# counter prefix -> (family, label): one labelled family for counters of one kind
_LABELLED = (("fallback_", "fallbacks", "cause"), ("req_status_", "request_status", "status"))
_PER_POS = re.compile(r"^(.+_per_pos)_(\d+)$")


def snapshot_to_families(snap: Mapping[str, Any], namespace: str = "dspark_proxy") -> Iterator[Any]:
    """Metric families for one ``Stats.snapshot()`` (see the module docstring for the naming)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    yield from _counter_families(snap.get("counters", {}), namespace, CounterMetricFamily)
    gauges = dict(snap.get("gauges", {}))
    client = gauges.pop("client", None)
    if isinstance(client, Mapping):
        for key, value in sorted(client.items()):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                c = CounterMetricFamily(_name(namespace, "client", key),
                                        f"The worker link's count of {key.replace('_', ' ')} (key client.{key}).")
                c.add_metric([], float(value))
                yield c
    config = gauges.pop("config", None)
    gauges.pop("config_sources", None)  # where each setting came from: status --json has it
    if isinstance(config, Mapping):
        yield _info_family(_name(namespace, "config"), config)
    for key, value in sorted(gauges.items()):
        yield from _gauge_families(_name(namespace, key), key, value, GaugeMetricFamily, depth=0)
    yield from worker_families(snap.get("workers", snap.get("gauges", {}).get("workers")), namespace)
    yield from _latency_families(snap, namespace, GaugeMetricFamily)


def _counter_families(counters: Mapping[str, Any], namespace: str, family: Any) -> Iterator[Any]:
    grouped: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for key, value in sorted(counters.items()):
        m = _PER_POS.match(key)
        if m:
            grouped.setdefault((m.group(1), "position"), []).append((m.group(2), float(value)))
            continue
        for prefix, fam, label in _LABELLED:
            if key.startswith(prefix):
                grouped.setdefault((fam, label), []).append((key[len(prefix):], float(value)))
                break
        else:
            c = family(_name(namespace, key), counter_help(key))
            c.add_metric([], float(value))
            yield c
    for (fam, label), samples in sorted(grouped.items()):
        c = family(_name(namespace, fam), counter_help(fam), labels=[label])
        for lv, v in sorted(samples, key=lambda x: (len(x[0]), x[0])):
            c.add_metric([lv], v)
        yield c


def _info_family(name: str, fields: Mapping[str, Any]) -> Any:
    from prometheus_client.core import InfoMetricFamily

    labels = {_BAD_CHARS.sub("_", str(k)): "" if v is None else (",".join(map(str, v)) if isinstance(v, list)
                                                                  else str(v)) for k, v in fields.items()}
    info = InfoMetricFamily(name, "The proxy's effective settings, one label each (value 1).")
    info.add_metric([], labels)
    return info


def _latency_families(snap: Mapping[str, Any], namespace: str, gauge: Any) -> Iterator[Any]:
    from prometheus_client.core import HistogramMetricFamily, Metric

    hists = snap.get("histograms") or {}
    for key, s in sorted(snap.get("latency", {}).items()):
        if not s.get("count"):
            continue
        base = _no_unit(key)
        name = _name(namespace, base, "seconds")
        h = hists.get(key)
        if h is not None:
            buckets = [(f"{le / 1e6:g}", float(c)) for le, c in zip(h["le_us"], h["cumulative"], strict=True)]
            buckets.append(("+Inf", float(h["count"])))
            yield HistogramMetricFamily(name, latency_help(base, key), buckets=buckets,
                                        sum_value=h["sum_us"] / 1e6)
        else:
            m = Metric(name, latency_help(base, key), "summary")
            for q, field in _QUANTILES:
                m.add_sample(name, {"quantile": q}, s[field] / 1e6)
            m.add_sample(name + "_count", {}, float(s["count"]))
            m.add_sample(name + "_sum", {}, s["mean_us"] * s["count"] / 1e6)
            yield m
        g = gauge(_name(namespace, base, "max_seconds"), f"Largest {base.replace('_', ' ')} observed, in seconds.")
        g.add_metric([], s["max_us"] / 1e6)
        yield g


_LINK_STATES = ("connected", "connecting", "backing_off", "refused")
_BREAKER_STATES = ("closed", "open", "half_open")


def worker_families(links: Any, namespace: str = "dspark_proxy") -> Iterator[Any]:
    """Each worker's link (proxy.worker_links), labelled ``worker="HOST:PORT"``: ``worker_link_state`` and
    ``worker_breaker_state`` (one sample per state, 1 for the current one), ``worker_next_try_seconds``
    while not connected, ``worker_refused_info{reason}`` while refused, and for a pool's workers
    ``worker_slots`` and the counters ``worker_entries_total``, ``worker_usable_total``,
    ``worker_missed_total``."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    links = [w for w in links if isinstance(w, Mapping)] if isinstance(links, (list, tuple)) else []
    if not links:
        return
    state = GaugeMetricFamily(_name(namespace, "worker_link_state"), "the link to each worker",
                              labels=["worker", "state"])
    brk = GaugeMetricFamily(_name(namespace, "worker_breaker_state"), "each worker's circuit breaker",
                            labels=["worker", "state"])
    nxt = GaugeMetricFamily(_name(namespace, "worker_next_try_seconds"), "seconds to the next connect attempt",
                            labels=["worker"])
    why = GaugeMetricFamily(_name(namespace, "worker_refused_info"), "why the worker refused the handshake",
                            labels=["worker", "reason"])
    slots = GaugeMetricFamily(_name(namespace, "worker_slots"), "slots a pool's worker serves", labels=["worker"])
    counters = {k: CounterMetricFamily(_name(namespace, f"worker_{k}"), f"a pool worker's {k}", labels=["worker"])
                for k in ("entries", "usable", "missed")}
    for w in links:
        a = str(w.get("address", "?"))
        for s in _LINK_STATES:
            state.add_metric([a, s], float(w.get("state") == s))
        for s in _BREAKER_STATES:
            brk.add_metric([a, s], float(w.get("breaker") == s))
        if w.get("next_try_s") is not None:
            nxt.add_metric([a], float(w["next_try_s"]))
        if w.get("state") == "refused":
            why.add_metric([a, str(w.get("reason"))], 1.0)
        if "pool_state" in w:
            slots.add_metric([a], float(w.get("slots", 0)))
            for k, c in counters.items():
                c.add_metric([a], float(w.get(k, 0)))
    yield from (state, brk, nxt, why, slots, *counters.values())


# a gauge key's unit suffix -> the factor to base units (seconds); promtool refuses abbreviated units
_UNIT_SUFFIXES = (("_ns", 1e-9), ("_us", 1e-6), ("_ms", 1e-3))
_US_INSIDE = re.compile(r"_us(?=_|$)")


def _no_unit(key: str) -> str:
    """A latency key without its microseconds: ``rtt_us_decode`` -> ``rtt_decode`` (then ``_seconds``)."""
    return _US_INSIDE.sub("", key)


def _gauge_families(name: str, key: str, value: Any, family: Any, depth: int) -> Iterator[Any]:
    short = key.replace(".", "_")
    if isinstance(value, (bool, int, float)):
        for suffix, factor in _UNIT_SUFFIXES:
            if name.endswith(suffix):  # spin_max_ns -> spin_max_seconds, in seconds
                name, short, value = name[:-len(suffix)] + "_seconds", short[:-len(suffix)], value * factor
                break
        g = family(name, gauge_help(short, key))
        g.add_metric([], float(value))
        yield g
    elif isinstance(value, str) and depth > 0:
        g = family(name, gauge_help(short, key), labels=["value"])
        g.add_metric([value], 1.0)
        yield g
    elif isinstance(value, Mapping) and depth == 0:
        for sub, v in sorted(value.items()):
            yield from _gauge_families(_name(name, str(sub)), f"{key}.{sub}", v, family, depth + 1)
    elif isinstance(value, (list, tuple)) and depth == 0:
        g = family(_name(name, "len"), gauge_help(short + "_len", key))
        g.add_metric([], float(len(value)))
        yield g


class _Collector:
    """Calls the stats getter at each scrape; a failing getter yields ``stats_up 0`` instead of a 500."""

    def __init__(self, stats_getter: Callable[[], Any], namespace: str) -> None:
        self._get = stats_getter
        self._ns = namespace

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily(_name(self._ns, "stats_up"), "1 if this scrape could read the statistics, else 0.")
        try:
            got = self._get()
            snap = got.snapshot() if hasattr(got, "snapshot") else got
            if hasattr(got, "histograms"):
                snap = {**snap, "histograms": got.histograms(LATENCY_BOUNDS_US)}
            families = list(snapshot_to_families(snap, self._ns))
        except Exception as e:  # noqa: BLE001 - a scrape must not take the proxy down
            log.warning("[metrics] reading the statistics failed: %r", e)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from families


class MetricsBindError(OSError):
    """The endpoint's address cannot be bound (in use, not this host's): one line naming it."""

    def __str__(self) -> str:
        return str(self.args[0])


class MetricsServer:
    """A running endpoint: ``port`` (the real one when 0 was asked), ``url``, ``stop()`` (idempotent)."""

    def __init__(self, httpd: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        self.host, self.port = httpd.server_address[:2]
        self._stopped = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._httpd.shutdown()  # wakes serve_forever; returns once it has exited
        self._httpd.server_close()
        self._thread.join(timeout_s)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_metrics_server(port: int, stats_getter: Callable[[], Any] | None, *, addr: str = "127.0.0.1",
                         namespace: str = "dspark_proxy",
                         collector: Any = None) -> MetricsServer:
    """Serve ``/metrics`` on ``addr:port`` (port 0: any free port) from a daemon thread.

    ``stats_getter()`` is called on the HTTP thread at every scrape and returns a ``Stats.snapshot()``
    dict (or a ``Stats``, whose ``snapshot()`` is then taken there); or ``collector`` (an object with
    ``collect()``, the worker's) serves instead. MissingDependency if prometheus-client is not installed;
    MetricsBindError, naming the address, if it cannot be bound.
    """
    prom = _import_prometheus()
    registry = prom.CollectorRegistry(auto_describe=False)
    registry.register(collector if collector is not None else _Collector(stats_getter, namespace))
    handler = prom.exposition.MetricsHandler.factory(registry)
    try:
        httpd = ThreadingHTTPServer((addr, port), handler)  # daemon_threads: a stuck scraper never blocks exit
    except (OSError, OverflowError) as e:
        shown = f"[{addr}]" if ":" in addr else addr
        raise MetricsBindError(f"--metrics-host/--metrics-port: cannot serve metrics on {shown}:{port} "
                               f"({getattr(e, 'strerror', None) or e})") from None
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.5},
                              name="dspark-metrics", daemon=True)
    thread.start()
    server = MetricsServer(httpd, thread)
    log.info("[metrics] serving %s", server.url)
    return server
