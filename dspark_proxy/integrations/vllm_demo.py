"""`dspark-proxy demo --engine vllm`: a real vLLM generating with the shipped target and head through a
proxy and a torch worker, beside vLLM without speculation and with its own n-gram drafter.

Arms (vllm_arm.py, one process each, identical vLLM settings): `nospec`, `ngram`, `dspark`. Every arm
generates the same prompts greedily (the lossless check: outputs must be token-identical) and times one
request alone (ms per generated token); dspark's timed run has a proxy of its own, so the proxy's
statistics (the worker's and the network's time) are those of that run alone. The head's acceptance inside vLLM is set beside the reference
engine's on the very same token sequences (the target's tap in transformers, the same head, the same
anchors), so a wrong row or a misplaced anchor shows as a gap. With `cost=True` two more arms measure
what the shim and proxy add to a step: the proposer with drafts made in place (`local_null`) and the
same through a proxy with a null worker (`dspark` against `--worker null`).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine_shim.attachment import ENV_REPLY_SPIN_US, REPLY_SPIN_US

__all__ = ["run_vllm_demo", "PROMPTS", "reference_acceptance", "run_arm_process", "shapes_args", "placement",
           "started_on"]

_REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = _REPO / "models" / "stdlib-llama"
DEFAULT_HEAD = _REPO / "models" / "stdlib-llama-head"

# Python source openings (the target was trained on the standard library); two share a long prefix
# (vLLM's prefix cache), two are longer than a small token budget (chunked prefill)
PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv):\n    ",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "def read_config(path):\n    \"\"\"Read a configuration file and return a dict.\"\"\"\n    with open(path) as f:\n",
    "def read_config(path):\n    \"\"\"Read a configuration file and return a dict.\"\"\"\n    result = {}\n",
    "for i in range(len(items)):\n    if items[i] is None:\n",
    "    def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__,",
    "try:\n    import threading\nexcept ImportError:\n    threading = None\n\n__all__ = [",
    "def _check_arg(name, value, kind):\n    if not isinstance(value, kind):\n        raise TypeError(",
]
TIMING_PROMPT = "class Queue:\n    \"\"\"A FIFO queue.\"\"\"\n\n    def __init__(self, maxsize=0):\n"


REPLY_SPIN_AWAKE_US = 1000  # DSPARK_PROXY_REPLY_SPIN_US of the vLLM arms when the proxies are kept awake


def shapes_args(head: str | os.PathLike, max_reqs: int) -> list[str]:
    """The layout flags of a worker and proxy for this head (its manifest, or a DSpark checkpoint's
    config.json) and vLLM's max_num_seqs."""
    from ..model.head_shapes import load_head_shapes

    m = load_head_shapes(os.fspath(head))
    return ["--max-reqs", str(max_reqs), "--num-spec", str(m.num_spec), "--window", str(m.window),
            "--row-bytes", str(m.row_bytes)]


def vllm_threads_env() -> dict[str, str]:
    """Every arm's vLLM forward on all CPUs but one, which the proxy and worker use (docs/vllm.md:
    vLLM's OpenMP team on every core stalls whenever another process runs); the user's own
    OMP_NUM_THREADS wins."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(len(os.sched_getaffinity(0)) - 1, 1))}


def placement() -> tuple[list[int] | None, list[int] | None]:
    """(vLLM's CPUs, the proxy's and the worker's CPU): the last CPU this process may use for ours, the
    rest for every vLLM arm alike; (None, None) on one CPU. Unpinned, waking the proxy at `gathered`
    let the scheduler run it on vLLM's CPU, in the middle of vLLM's step (docs/vllm.md)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return cpus[:-1], cpus[-1:]


@contextlib.contextmanager
def started_on(cpus: list[int] | None) -> Iterator[None]:
    """Children started inside the block run on `cpus` (they inherit the affinity, as under taskset)."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def run_arm_process(spec: dict[str, Any], timeout_s: float = 600.0, capture_log: bool = False) -> dict[str, Any]:
    """vllm_arm in a child process; its JSON result (RuntimeError with its stderr's tail on failure),
    with its stderr as "log" when asked."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        path = f.name
    try:
        r = subprocess.run([sys.executable, "-m", "dspark_proxy.integrations.vllm_arm", path], capture_output=True,
                           text=True, timeout=timeout_s)
    finally:
        os.unlink(path)
    from .vllm_arm import RESULT_MARK

    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if r.returncode or not lines:
        raise RuntimeError(f"vLLM arm {spec.get('arm')} exited {r.returncode}: {r.stderr[-4000:]}")
    res = json.loads(lines[-1][len(RESULT_MARK):])
    if capture_log:
        res["log"] = r.stderr
    return res


def reference_acceptance(model_dir: str | os.PathLike, head_dir: str | os.PathLike, prompts_ids: list[list[int]],
                         outputs: list[list[int]]) -> dict[str, Any]:
    """The head's acceptance along these greedy sequences in the reference engine (transformers, the
    manifest's tap; for a DSpark checkpoint the reference's own model, its rows from the trainer's
    tap), walked as accept.py walks: the figure vLLM's must match."""
    import torch

    from ..model.accept import AcceptStats, walk_rounds
    from ..model.head_shapes import DSparkShapes, load_head_shapes
    from ..model.hf import Tap, load_causal_lm
    from ..model.train_head import head_drafts, load_head

    model, _ = load_causal_lm(model_dir)
    shapes = load_head_shapes(os.fspath(head_dir))
    if isinstance(shapes, DSparkShapes):
        return _dspark_reference_acceptance(model, model_dir, shapes, prompts_ids, outputs)
    head, man = load_head(head_dir)
    dtype = getattr(torch, man.row_dtype)
    stats = AcceptStats(man.num_spec)
    with torch.no_grad():
        for p, o in zip(prompts_ids, outputs, strict=True):
            seq = torch.tensor([list(p) + list(o)], dtype=torch.int64)
            with Tap(model, list(man.tap_layers)) as tap:
                model(seq)
            rows = tap.rows(dtype)
            drafts = head_drafts(head, seq, rows, len(p))
            walk_rounds(seq.numpy(), len(p), man.num_spec, lambda s, a, d=drafts: d[s, a], stats)
    return stats.as_dict()


def _dspark_reference_acceptance(model: Any, model_dir: str | os.PathLike, shapes: Any,
                                 prompts_ids: list[list[int]], outputs: list[list[int]]) -> dict[str, Any]:
    """reference_acceptance for a DSpark checkpoint: speculators' own model (its verifier weights from
    the demo's target, as the worker's --target), drafts by dspark_head.greedy_drafts at every anchor of
    the generated part, rows from the trainer's tap (HiddenTaps) rounded to the row dtype as sent."""
    import torch

    from ..model.accept import AcceptStats, walk_rounds
    from ..model.dspark_head import greedy_drafts, load_dspark
    from ..model.taps import HiddenTaps

    draft = load_dspark(shapes.path, verifier=os.fspath(model_dir))
    taps = HiddenTaps(model, list(shapes.tap_layers))
    dtype = getattr(torch, shapes.row_dtype)
    N = shapes.num_spec
    stats = AcceptStats(N)
    with torch.no_grad():
        for p, o in zip(prompts_ids, outputs, strict=True):
            toks = torch.tensor(list(p) + list(o), dtype=torch.int64)
            start = len(p)
            if start + N >= len(toks):
                continue
            rows, _, _ = taps(toks[None])
            rows = rows.to(dtype).float()[0]
            anchors = torch.arange(start, len(toks) - N)
            drafts = greedy_drafts(draft, rows, toks, anchors).numpy()
            walk_rounds(toks.numpy()[None], start, N, lambda s, a, d=drafts, st=start: d[a - st], stats)
    return stats.as_dict()


def _tokenize(model_dir: str | os.PathLike, prompts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    return [tok(p)["input_ids"] for p in prompts]


def run_vllm_demo(*, model: str | os.PathLike = DEFAULT_MODEL, head: str | os.PathLike = DEFAULT_HEAD,
                  prompts: list[str] | None = None, max_tokens: int = 64, timing_tokens: int = 128,
                  deadline_ms: float = 50.0, max_num_seqs: int = 8, cost: bool = False, name: str | None = None,
                  quiet: bool = False, keep_awake_ms: float = 20.0) -> dict[str, Any]:
    from ..model.head_shapes import head_drafter, load_head_shapes, worker_head_args
    from ..ops.launch import spawn_proxy, spawn_worker
    from ..ops.status import read_status

    say = (lambda msg: None) if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    prompts = list(PROMPTS if prompts is None else prompts)
    name = name or f"demo-vllm-{os.getpid()}"
    layout = shapes_args(head, max_num_seqs)
    vllm_cpus, ours_cpus = placement()
    base = {"model": os.fspath(model), "cpus": vllm_cpus, "num_spec": int(layout[3]), "prompts": prompts, "max_tokens": max_tokens,
            "llm": {"max_num_seqs": max_num_seqs},
            "env": {"DSPARK_PROXY": name, "DSPARK_PROXY_HEAD": os.fspath(head), **vllm_threads_env(),
                    # with the proxies kept awake, vLLM's thread (a CPU of its own) spins for its reply too
                    **({ENV_REPLY_SPIN_US: str(REPLY_SPIN_AWAKE_US)} if keep_awake_ms > 0 else {})},
            "timing": {"prompt": TIMING_PROMPT, "max_tokens": timing_tokens, "repeats": 3}}
    out: dict[str, Any] = {"engine": "vllm", "model": os.fspath(model), "head": os.fspath(head),
                           "drafter": head_drafter(load_head_shapes(os.fspath(head))),
                           "prompts": len(prompts), "max_tokens": max_tokens, "deadline_ms": deadline_ms,
                           "keep_awake_ms": keep_awake_ms,
                           "reply_spin_us": REPLY_SPIN_AWAKE_US if keep_awake_ms > 0 else REPLY_SPIN_US}
    awake = ["--keep-awake-ms", str(keep_awake_ms)]  # the proxies and the worker have a CPU of their own (placement)
    t0 = time.monotonic()
    arms: dict[str, dict[str, Any]] = {}
    worker = proxy = None
    try:
        for arm in ("nospec", "ngram"):
            say(f"[demo] vLLM arm {arm}")
            arms[arm] = run_arm_process({**base, "arm": arm})
        with started_on(ours_cpus):  # the drafter of the head's kind: torch (manifest) or dspark (checkpoint)
            worker = spawn_worker(*layout, *worker_head_args(os.fspath(head), os.fspath(model)), *awake)
        # two proxies on one worker: the timed run's proxy statistics (the draft time) are its own
        for arm, seg, spec in (("dspark", name, {**base, "timing": None}),
                               ("dspark_timing", name + "-t", {**base, "prompts": [], "env": {**base["env"],
                                                                                             "DSPARK_PROXY": name + "-t"}})):
            with started_on(ours_cpus):
                proxy = spawn_proxy(seg, worker.address, *layout, "--deadline-ms", str(deadline_ms), "--log-every",
                                    "0", *awake)
            say(f"[demo] worker pid {worker.pid} on {worker.address}, proxy pid {proxy.pid}; vLLM arm {arm}")
            arms[arm] = run_arm_process({**spec, "arm": "dspark"})
            time.sleep(0.3)  # the proxy's last statistics snapshot
            lat = read_status(seg)["proxy"].get("latency", {})
            proxy.stop()
            proxy = None
    finally:
        for child in (proxy, worker):
            if child is not None:
                child.stop()
        _reap_rings(name, name + "-t")
    ref_out = arms["nospec"]["outputs"]
    out["lossless_mismatches"] = sum(a != b for a, b in zip(arms["dspark"]["outputs"], ref_out, strict=True))
    out["ngram_mismatches"] = sum(a != b for a, b in zip(arms["ngram"]["outputs"], ref_out, strict=True))
    run, timing = arms["dspark"]["drafter_run"], arms["dspark_timing"]["drafter_timing"]
    out["mean_accepted"] = run["mean_accepted"]
    out["verified_rounds"] = run["verified_rounds"]
    say("[demo] the reference engine's acceptance on the same sequences")
    ref = reference_acceptance(model, head, _tokenize(model, prompts), arms["dspark"]["outputs"])
    out["mean_accepted_reference"] = ref["mean_accepted"]
    out["accepted_vs_reference"] = round(run["mean_accepted"] / max(ref["mean_accepted"], 1e-9), 4)
    for arm in ("nospec", "ngram", "dspark_timing"):
        out[f"step_ms_{'spec' if arm == 'dspark_timing' else arm}"] = arms[arm]["step_ms"]
    out["step_us_p50_nospec"] = arms["nospec"].get("engine_step_us", {}).get("p50")  # one vLLM step, p50
    draft_us = float(lat.get("rtt_us", {}).get("p50_us", 0.0))
    ours = timing.get("ours_us", {}).get("p50", 0.0)
    enq_read = timing.get("enqueue_us", {}).get("p50", 0.0) + timing.get("read_reply_us", {}).get("p50", 0.0)
    out["engine_us_per_step"] = round(max(enq_read - draft_us, 0.0), 1)
    out["draft_us_per_step"] = round(draft_us, 1)
    out["proposer_us_per_step"] = round(ours, 1)  # all of the proposer's step, the rounds included
    out["proxy_cost_us_p50"] = lat.get("proxy_cost_us", {}).get("p50_us")
    out["enqueue_us_p50"] = timing.get("enqueue_us", {}).get("p50")
    out["read_reply_us_p50"] = timing.get("read_reply_us", {}).get("p50")
    out["drafter_errors"] = run["errors"]
    if cost:
        out.update(measure_cost(base, layout, name + "-null", say, ours_cpus, awake))
        out["shim_proxy_vs_nospec_step"] = round(out["shim_proxy_ms_per_step"] / max(out["step_ms_nospec"], 1e-9), 4)
        out["shim_proxy_vs_nospec_step_sync"] = round(out["shim_proxy_ms_per_step_sync"] / max(out["step_ms_nospec"], 1e-9), 4)
        out["shim_proxy_vs_nospec_step_p50"] = round(out["shim_proxy_us_per_step_p50"]
                                                     / max(out["step_us_p50_nospec"] or 0.0, 1e-9), 4)
        out["shim_proxy_vs_nospec_step_paired"] = round(out["shim_proxy_us_per_step_paired"]
                                                        / max(out["step_us_p50_nospec"] or 0.0, 1e-9), 4)
    out["startup_s"] = {a: r["startup_s"] for a, r in arms.items()}
    out["vllm_threads"] = base["env"].get("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS"))
    out["cpus"] = {"vllm": vllm_cpus, "proxy": ours_cpus}
    out["elapsed_s"] = round(time.monotonic() - t0, 1)
    out["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    return out


def _reap_rings(*names: str) -> None:
    """vLLM ends its engine-core process without the shim's close: a memfd ring goes with the process,
    and a named one (where memfd is refused) goes at exit (atexit), but a killed engine core's stays in
    /dev/shm: remove the named rings of these names whose engines are gone (ring_shm.reap_stale)."""
    from ..shm.ring_shm import reap_stale

    for n in names:
        reap_stale(n)


def measure_cost(base: dict[str, Any], layout: list[str], name: str, say,
                 proxy_cpus: list[int] | None = None, proxy_args: list[str] | None = None) -> dict[str, Any]:
    """What the shim and the proxy add to a vLLM step at one request, side by side in one engine: the
    proposer's rounds made in place and through the shim to a proxy with a null worker (the same drafts,
    so the same verification), alternating generation by generation (vllm_arm.CostProposer)."""
    from ..ops.launch import spawn_proxy
    from ..ops.status import read_status

    spec = {**base, "prompts": [], "env": {**base["env"], "DSPARK_PROXY": name},
            "timing": {**base["timing"], "repeats": 12}}
    with started_on(proxy_cpus):
        proxy = spawn_proxy(name, "null", *layout, "--deadline-ms", "50", "--log-every", "0", *(proxy_args or []))
    try:
        say("[demo] cost arm: rounds in place and through shim + proxy (null worker), alternating")
        r = run_arm_process({**spec, "arm": "cost"})
        time.sleep(0.3)
        lat = read_status(name)["proxy"].get("latency", {})
    finally:
        proxy.stop()
        _reap_rings(name)
    added = r["step_ms_via_shim"] - r["step_ms_in_place"]
    return {"cost_step_ms_in_place": r["step_ms_in_place"], "cost_step_ms_via_shim": r["step_ms_via_shim"],
            "cost_step_ms_via_shim_sync": r["step_ms_via_shim_sync"],
            "shim_proxy_ms_per_step_sync": round(r["step_ms_via_shim_sync"] - r["step_ms_in_place"], 4),
            "cost_enqueue_us_p50": r["enqueue_us"].get("p50"), "cost_read_reply_us_p50": r["read_reply_us"].get("p50"),
            "cost_read_reply_us_p50_sync": r["read_reply_us_sync"].get("p50"),
            "cost_step_ms_all": r["step_ms_all"], "shim_proxy_ms_per_step": round(added, 4),
            "cost_ours_us_p50": {m: v.get("p50") for m, v in r["ours_us"].items()},
            "cost_proxy_round_us_p50": lat.get("rank0_round_us", {}).get("p50_us"),
            # p50 of vLLM's whole engine step per mode: robust to the time slices a shared machine takes
            "cost_step_us_p50": {m: v.get("p50") for m, v in r["engine_step_us"].items()},
            "shim_proxy_us_per_step_p50": round(r["engine_step_us"]["via_shim"].get("p50", 0.0)
                                                - r["engine_step_us"]["in_place"].get("p50", 0.0), 1),
            # the median of the paired differences (vllm_arm._cost_timing): the figure to read on a
            # shared machine, with every pair beside it to show the spread
            "shim_proxy_us_per_step_paired": round(float(statistics.median(r["added_us_pairs"])), 1),
            "shim_proxy_us_pairs": r["added_us_pairs"], "cost_step_us_by_repeat": r["engine_step_us_by_repeat"]}
