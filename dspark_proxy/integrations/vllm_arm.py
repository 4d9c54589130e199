"""One vLLM run ("arm") in its own process, for the demo, the benchmark and the end-to-end tests.

    python -m dspark_proxy.integrations.vllm_arm SPEC.json     # stdout: a line "dspark-arm-result {JSON}"

Every arm of a comparison uses identical vLLM settings and differs only in the speculative method:
`nospec`, `ngram` (vLLM's prompt lookup), `dspark` (engine_shim.vllm_proposer.DSparkProposer through
a proxy named by the spec's env) or `local_null` (the same proposer, rows gathered alike, but the
drafts made in place, as `--worker null` makes them: no shim, no proxy), so `dspark` against
`local_null` with a null worker is what the shim and proxy cost a vLLM step. vLLM runs in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so the drafter's figures can be read here. A process per arm,
because vLLM's parallel state does not come apart for a second engine in one process.

SPEC keys: model, arm, cpus (the CPUs this arm runs on), num_spec, prompts, max_tokens, llm (extra LLM keyword arguments), env,
timing ({"prompt", "max_tokens", "repeats"}: ms per generated token at one request), kill
({"pid", "after_steps"}: generate the prompts a second time and SIGKILL that process after that many
drafter steps of it: the worker-loss test), ring_probe (the rows the drafter sent for the first
prompt, run alone first), sampled ({"temperatures", "max_tokens"}: the prompts again at each
temperature, drafts accepted per drafting step; vllm_sampled.py), draws ({"prompt", "n", "tokens",
"temperature", "greedy", "mutant_n"}: one prompt drawn n times, each with its own seed, the greedy
prompts (16 tokens each) in the same batches; then mutant_n times with
each drawn draft replaced by the top of its q, q still handed to vLLM: the lossy mutant of the
chi-square test, drafts not drawn from the q vLLM is given).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import statistics
import sys
import time
from typing import Any

import numpy as np

from engine_shim.vllm_proposer import DSparkProposer

__all__ = ["LocalNullProposer", "CostProposer", "run_arm", "ARMS", "PROPOSER", "RESULT_MARK"]

PROPOSER = "engine_shim.vllm_proposer.DSparkProposer"
RESULT_MARK = "dspark-arm-result "
ARMS = ("nospec", "ngram", "dspark", "local_null", "cost")


class LocalNullProposer(DSparkProposer):
    """The vLLM proposer with the round made in place: every request that needs drafts gets N drafts
    of token 1, as `--worker null` answers. Measures everything but the shim and the proxy."""

    via_shim = False  # CostProposer switches it

    def _attach(self) -> None:
        s = self.shapes
        assert s is not None
        self._ids = np.ones((s.max_reqs, s.num_spec), dtype=np.int32)
        self._nd = np.zeros(s.max_reqs, dtype=np.int32)

    def _enqueue(self, plan: Any, rows: Any, sampling: Any = None) -> None:
        self._shim_round = self.via_shim  # the round is read the way it was made, whatever via_shim is then
        if self.via_shim:
            super()._enqueue(plan, rows, sampling)
            return
        n = plan.slots.shape[0]
        self._in_place = nd = self._nd[:n]
        np.multiply(plan.need_draft, self._ids.shape[1], out=nd, casting="unsafe")
        self._t_enq = time.perf_counter()

    def _read(self) -> tuple[np.ndarray, np.ndarray]:
        if self._shim_round:
            return super()._read()
        nd = self._in_place
        return self._ids[:nd.shape[0]], nd


class CostProposer(LocalNullProposer):
    """Both rounds in one engine, switched between generations (`via_shim`): in place, or through the
    shim to a proxy with a null worker (the same drafts). Side by side in one run, so what the shim
    and the proxy add is not lost in the noise of a shared machine."""

    def _attach(self) -> None:
        LocalNullProposer._attach(self)
        DSparkProposer._attach(self)


def _spec_config(arm: str, num_spec: int) -> dict | None:
    if arm == "nospec":
        return None
    if arm == "ngram":
        return {"method": "ngram", "num_speculative_tokens": num_spec, "prompt_lookup_max": 3,
                "prompt_lookup_min": 1}
    model = {"dspark": PROPOSER, "local_null": f"{__name__}.LocalNullProposer",
             "cost": f"{__name__}.CostProposer"}[arm]
    return {"method": "custom_class", "model": model, "num_speculative_tokens": num_spec}


def _drafter(llm: Any) -> Any:
    """The running engine's drafter (in-process engine core only)."""
    eng = llm.llm_engine
    executor = getattr(eng, "model_executor", None)
    if executor is None:
        core = eng.engine_core
        executor = getattr(core, "engine_core", core).model_executor
    return getattr(executor.driver_worker.worker.model_runner, "drafter", None)


def _pcts(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    a = np.asarray(xs)
    return {"p50": round(float(np.percentile(a, 50)), 1), "p99": round(float(np.percentile(a, 99)), 1),
            "max": round(float(a.max()), 1), "n": int(a.size)}


def run_arm(spec: dict[str, Any]) -> dict[str, Any]:
    arm = spec["arm"]
    if arm not in ARMS:
        raise ValueError(f"arm {arm!r}: one of {', '.join(ARMS)}")
    # in-process engine core by default, so the drafter can be read here; "mp": vLLM's usual processes
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if spec.get("mp") else "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["DSPARK_PROXY_VLLM_TIMINGS"] = "1"
    if spec.get("cpus"):
        os.sched_setaffinity(0, set(spec["cpus"]))  # before vLLM starts a thread: they all inherit it
    os.environ.update({k: str(v) for k, v in spec.get("env", {}).items()})
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams

    kw = {"dtype": "float32", "enforce_eager": True, "max_model_len": 512, "max_num_seqs": 8, "seed": 0}
    if spec.get("sampled"):
        kw["disable_log_stats"] = False  # vLLM's own speculative-decoding counters (LLM.get_metrics)
    kw.update(spec.get("llm", {}))
    sc = _spec_config(arm, int(spec.get("num_spec", 5)))
    if sc is not None:
        kw["speculative_config"] = sc
    llm = LLM(model=spec["model"], **kw)
    out: dict[str, Any] = {"arm": arm, "startup_s": round(time.perf_counter() - t0, 2)}
    drafter = None if spec.get("mp") else _drafter(llm)
    ours = isinstance(drafter, DSparkProposer)

    def greedy(n: int) -> Any:
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)

    prompts = list(spec.get("prompts", []))
    max_tokens = int(spec.get("max_tokens", 64))
    outputs: list[list[int]] = []
    t1 = time.perf_counter()
    if spec.get("ring_probe") and prompts:
        first = llm.generate(prompts[:1], greedy(max_tokens), use_tqdm=False)
        outputs += [list(first[0].outputs[0].token_ids)]
        if ours:
            out["ring_probe"] = _ring_probe(drafter, list(first[0].prompt_token_ids) + outputs[0])
        prompts = prompts[1:]
    if prompts:
        res = llm.generate(prompts, greedy(max_tokens), use_tqdm=False)
        outputs += [list(r.outputs[0].token_ids) for r in res]
    out["outputs"] = outputs
    out["gen_s"] = round(time.perf_counter() - t1, 3)
    if ours:
        out["drafter_run"] = _drafter_stats(drafter)
    if ours and spec.get("kill") and spec.get("prompts"):
        # the same prompts again, and the worker killed after `after_steps` of their steps
        drafter.timings.clear()
        _kill_after(drafter, int(spec["kill"]["pid"]), int(spec["kill"]["after_steps"]))
        res = llm.generate(list(spec["prompts"]), greedy(max_tokens), use_tqdm=False)
        out["outputs_killed"] = [list(r.outputs[0].token_ids) for r in res]
        out["drafter_killed"] = _drafter_stats(drafter)
    _sampled(spec, llm, drafter, out)
    timing = spec.get("timing")
    if timing and arm == "cost":
        out.update(_cost_timing(llm, drafter, timing, greedy))
    elif timing:
        if ours:
            drafter.timings.clear()
        n = int(timing.get("max_tokens", 128))
        ms = []
        steps: list[float] = []
        _time_steps(llm, lambda us: steps.append(us))
        for _ in range(int(timing.get("repeats", 3))):
            ts = time.perf_counter()
            llm.generate([timing["prompt"]], greedy(n), use_tqdm=False)
            ms.append((time.perf_counter() - ts) * 1e3 / n)
        out["step_ms"] = round(statistics.median(ms), 4)
        out["step_ms_all"] = [round(x, 4) for x in ms]
        out["engine_step_us"] = _pcts(steps)
        if ours:
            out["drafter_timing"] = _drafter_stats(drafter)
    return out


def _sampled(spec: dict[str, Any], llm: Any, drafter: Any, out: dict[str, Any]) -> None:
    """The spec's `sampled` and `draws` runs (vllm_sampled.py) into `out`."""
    from . import vllm_sampled

    s = spec.get("sampled")
    if s:
        out["sampled"] = vllm_sampled.accepted_at(llm, drafter, list(spec.get("prompts", [])),
                                                  int(s.get("max_tokens", 64)), list(s["temperatures"]))
    d = spec.get("draws")
    if d:
        out["draws"], out["draws_greedy"] = vllm_sampled.draws(llm, d["prompt"], int(d["n"]), int(d["tokens"]),
                                                               float(d["temperature"]), greedy=d.get("greedy"))
        if d.get("mutant_n") and drafter is not None:
            _top_of_q(drafter)
            out["draws_mutant"] = vllm_sampled.draws(llm, d["prompt"], int(d["mutant_n"]), int(d["tokens"]),
                                                     float(d["temperature"]), seed=1 + int(d["n"]))[0]
    if drafter is not None and hasattr(drafter, "verified_rounds") and (s or d):
        out["drafter_sampled"] = _drafter_stats(drafter)


def _top_of_q(d: DSparkProposer) -> None:
    """The chi-square test's mutant: every drawn draft replaced by its q's top token (the worker sorts
    the support by q), q still handed to vLLM, as a drafter that drafts greedily but reports q would."""
    read = d._read

    def greedy_read() -> tuple[np.ndarray, np.ndarray]:
        ids, nd = read()
        r = d._reply
        if r is not None and r.sample_mask is not None and r.sample_mask.any():
            ids = ids.copy()
            ids[r.sample_mask] = r.support_ids[r.sample_mask][:, :, 0]
        return ids, nd

    d._read = greedy_read  # type: ignore[method-assign]


def _cost_timing(llm: Any, d: Any, timing: dict[str, Any], greedy: Any) -> dict[str, Any]:
    """ms per generated token at one request, alternating: rounds in place, through the shim with the
    reply read where vLLM reads the drafts (`via_shim`, the default), and read at once inside vLLM's
    propose call (`via_shim_sync`, the proposer's DSPARK_PROXY_VLLM_DEFER=0)."""
    n = int(timing.get("max_tokens", 128))
    modes = ("in_place", "via_shim", "via_shim_sync")
    ms: dict[str, list[float]] = {m: [] for m in modes}
    us: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    deferred = d.deferred
    steps: dict[str, list[float]] = {m: [] for m in modes}
    by_repeat: dict[str, list[float]] = {m: [] for m in modes}  # each generation's p50 step
    now = [modes[0]]  # the mode of the generation running
    _time_steps(llm, lambda us: steps[now[0]].append(us))
    for _ in range(int(timing.get("repeats", 5))):
        for mode in modes:
            now[0] = mode
            d.via_shim = mode != "in_place"
            d.deferred = deferred and mode != "via_shim_sync"
            d.timings.clear()
            first = len(steps[mode])
            ts = time.perf_counter()
            llm.generate([timing["prompt"]], greedy(n), use_tqdm=False)
            ms[mode].append((time.perf_counter() - ts) * 1e3 / n)
            us[mode] += d.timings
            by_repeat[mode].append(round(float(np.median(steps[mode][first:])), 1))
    d.deferred = deferred
    med = {m: statistics.median(v) for m, v in ms.items()}
    round_us = {m: _pcts([sum(x) for x in v]) for m, v in us.items()}
    # what the shim and proxy add, paired: each via-shim generation against the in-place one just
    # before it, so a slow spell of the machine lands on both sides of a difference, not on one mode
    pairs = [round(b - a, 1) for a, b in zip(by_repeat["in_place"], by_repeat["via_shim"], strict=True)]
    return {"step_ms_in_place": round(med["in_place"], 4), "step_ms_via_shim": round(med["via_shim"], 4),
            "step_ms_via_shim_sync": round(med["via_shim_sync"], 4),
            "step_ms_all": {m: [round(x, 4) for x in v] for m, v in ms.items()},
            "engine_step_us_by_repeat": by_repeat, "added_us_pairs": pairs,
            "ours_us": round_us, "engine_step_us": {m: _pcts(v) for m, v in steps.items()},
            "enqueue_us": _pcts([x[0] for x in us["via_shim"]]),
            "read_reply_us": _pcts([x[1] for x in us["via_shim"]]),
            "read_reply_us_sync": _pcts([x[1] for x in us["via_shim_sync"]])}


def _time_steps(llm: Any, sink: Any) -> None:
    """Time every engine step (`LLMEngine.step`: schedule, forward, drafts, outputs) into sink(us). Its
    p50 over a generation sets a step against a step without the outliers (a time slice lost to the
    machine's other work) that make ms per generated token noisy on a shared machine."""
    eng = llm.llm_engine
    step = eng.step

    def timed(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return step(*a, **k)
        finally:
            sink((time.perf_counter() - t0) * 1e6)

    eng.step = timed


def _drafter_stats(d: DSparkProposer) -> dict[str, Any]:
    tm = np.asarray(d.timings, dtype=np.float64).reshape(-1, 3)
    st: dict[str, Any] = {"active": d.active, "bound": d.bound, "rounds": d._t, "errors": d._errors,
                          "verified_rounds": d.verified_rounds, "accepted": d.accepted,
                          "mean_accepted": round(d.mean_accepted, 4), "drafted_rounds": d.drafted_rounds,
                          "preemptions": d.preemptions_seen,
                          "enqueue_us": _pcts(tm[:, 0].tolist()), "read_reply_us": _pcts(tm[:, 1].tolist()),
                          "rest_us": _pcts(tm[:, 2].tolist()), "ours_us": _pcts(tm.sum(axis=1).tolist())}
    if d.shim is not None:
        snap = d.shim.stats()
        st["shim_state"] = snap.get("state")
        st["shim_counters"] = {k: v for k, v in snap.get("counters", {}).items() if isinstance(v, int | float)}
    return st


def _ring_probe(d: DSparkProposer, tokens: list[int]) -> dict[str, Any]:
    """What the engine ring holds for slot 0 (the first request of a fresh engine): its positions and
    rows, for comparison with the reference engine's tap on the same tokens."""
    ring = d.shim.ring if d.shim is not None else None
    if ring is None:
        return {}
    lo, hi = int(ring.table.lo[0]), int(ring.table.hi[0])
    rows = ring.window_rows(0, lo, hi - lo + 1) if hi >= lo else np.zeros((0, ring.row_bytes), np.uint8)
    return {"lo": lo, "hi": hi, "tokens": tokens, "rows_b64": base64.b64encode(rows.tobytes()).decode()}


def _kill_after(d: DSparkProposer, pid: int, after: int) -> None:
    """SIGKILL `pid` once the drafter has run `after` steps (a worker lost mid-generation)."""
    step = d.begin  # what engine_shim/vllm/hook.py calls at each step
    seen = [0]

    def wrapped(*a: Any, **k: Any) -> Any:
        seen[0] += 1
        if seen[0] == after:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return step(*a, **k)

    d.begin = wrapped  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(open(args[0]).read() if args and args[0] != "-" else sys.stdin.read())
    res = run_arm(spec)
    sys.stdout.flush()
    # vLLM logs to stdout, from its engine-core process too, even after this line: hence the marker
    print(RESULT_MARK + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
