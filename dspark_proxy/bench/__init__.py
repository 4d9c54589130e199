"""`dspark-proxy bench`: the performance case, side by side in one run (docs/performance.md).

One module per section; each `run_<section>(quick, say)` returns `(results, samples)`: a JSON-able
dict with every figure as p50 / p99 / p99.9 / max in µs (or MB/s, MB, % of a core) and the ratios
against that section's baselines, and the raw latency samples for the optional plot. Benchmarks
report; they assert nothing about speed (`targets` says, for each goal, what was measured).

    handoff  engine -> proxy -> engine (null worker) vs futex ping-pong, multiprocessing.Pipe, TCP
    gil      full round, process vs thread mode, with 0 / 2 / 4 busy Python threads in the engine
    scaling  proxy and engine cost per round against n, W, decode / prefill (in-process RoundCore)
    rows     large-row rounds through the proxy to a worker process vs a raw socket, MB/s
    memory   segment by region, proxy / worker / shim resident memory, idle CPU
    eval     only when named (needs the `model` extra): `dspark-proxy eval` in the reference engine
    serve    only when named (needs vLLM): `vllm bench serve` against vLLM's server per arm (serve.py)
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

from .measure import Samples

__all__ = ["SECTIONS", "OPT_IN", "run_bench"]

SECTIONS = ("handoff", "gil", "scaling", "rows", "memory")  # the default run: no extra, no model
OPT_IN = ("eval", "serve")  # run only when named in --sections


def _runner(section: str) -> Callable[..., tuple[dict, Samples]]:
    if section == "handoff":
        from .handoff import run_handoff as fn
    elif section == "gil":
        from .gil import run_gil as fn
    elif section == "scaling":
        from .scaling import run_scaling as fn
    elif section == "rows":
        from .rows import run_rows as fn
    elif section == "memory":
        from .memory import run_memory as fn
    elif section == "eval":
        fn = _run_eval
    elif section == "serve":
        from .serve import run_serve as fn
    else:
        raise ValueError(f"unknown bench section {section!r}: one of {', '.join(SECTIONS + OPT_IN)}")
    return fn


def _run_eval(*, quick: bool, say: Callable[[str], None], prefix: str) -> tuple[dict, Samples]:
    """The `eval` section: `dspark-proxy eval [--quick]` (imported here: the model extra is optional)."""
    from ..spec.evaluate import run_eval

    return run_eval(quick=quick, say=say), Samples()


def _meta(quick: bool) -> dict[str, Any]:
    import numpy as np

    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"quick": quick, "cpus": len(os.sched_getaffinity(0)), "cpu_model": model,
            "platform": platform.platform(), "python": platform.python_version(), "numpy": np.__version__,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_avg_start": list(os.getloadavg())}


def run_bench(sections: Sequence[str] | None = None, *, quick: bool = False,
              say: Callable[[str], None] = lambda s: None,
              prefix: str = "", busy: int = 0) -> tuple[dict[str, Any], Samples]:
    """Run the chosen sections (all by default) in order; returns the results and the raw samples.
    Shared-memory segments are named `<prefix>-<section>...` (default prefix: bench-<pid>). `busy`:
    that many spinning processes run beside every section (a machine shared with other work)."""
    from .procs import BusyProcesses
    from .targets import evaluate

    chosen = list(sections or SECTIONS)
    for s in chosen:
        _runner(s)  # unknown names fail before anything runs
    results: dict[str, Any] = {"meta": _meta(quick)}
    results["meta"]["busy_processes"] = busy
    samples = Samples()
    elapsed: dict[str, float] = {}
    with BusyProcesses(busy):
        for s in chosen:
            t0 = time.monotonic()
            res, smp = _runner(s)(quick=quick, say=say, prefix=prefix)
            elapsed[s] = round(time.monotonic() - t0, 2)
            results[s] = res
            samples.merge(smp, prefix=f"{s}/")
    results["meta"]["elapsed_s"] = elapsed
    results["meta"]["load_avg_end"] = list(os.getloadavg())
    results["targets"] = evaluate(results)
    return results, samples
