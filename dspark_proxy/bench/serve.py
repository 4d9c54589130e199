"""The `serve` section (only when named): vLLM's OpenAI server under load from vLLM's own client,
`vllm bench serve`, for each arm: no speculation (`nospec`), vLLM's n-gram drafter (`ngram`), and the
proxy's proposer with each shipped head (named by the head's directory). docs/performance.md, "Serving under load".

Every arm's server is up for the whole section (one start-up each, 30-90 s on 2 CPUs); the runs are
interleaved: for each repetition, for each concurrency, every arm in turn, so a slow spell of a shared
machine lands on all arms rather than on one. A cell is the median of its runs. Requests are greedy, on
prompts cut from the held-out standard-library stream (text neither the target nor the head saw), each
ending at its output length (`ignore_eos`). Sampled requests (temperature 0.7 and 1.0) then measure the
mean accepted per drafting step of every speculating arm, from vLLM's own counters (`/metrics`).

CPU placement (docs/vllm.md, "CPU placement"): every vLLM server on all CPUs but the last, one OpenMP
thread; the proxy, its worker and the benchmark client on the last CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ..ops.status import read_status
from .measure import Samples
from .procs import pinned
from .serve_stats import cell_medians, mean_accepted, mismatches, run_figures, spec_counters

__all__ = ["run_serve", "CONCURRENCY", "shipped_heads"]

CONCURRENCY = (1, 4, 8)
TEMPERATURES = (0.7, 1.0)
_REPO = Path(__file__).resolve().parents[2]
MODEL = _REPO / "models" / "stdlib-llama"
MAX_NUM_SEQS = 8
PROMPT_TOKENS = 32
SAMPLED_PROMPTS = 8  # the sampled runs (c=1, two temperatures, every speculating arm): 8 prompts


def shipped_heads(models: Path = _REPO / "models") -> list[Path]:
    """Every head directory under models/, either kind (a manifest.json, or a DSpark checkpoint's
    config.json), sorted by name."""
    from ..model.head_shapes import is_dspark_dir

    return sorted({p.parent for p in models.glob("*/manifest.json")} | {p for p in models.iterdir() if is_dspark_dir(p)})


def _placement() -> tuple[list[int] | None, list[int] | None]:
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[:-1], cpus[-1:]) if len(cpus) > 1 else (None, None)


def _prompts_file(path: Path, n: int, out_tokens: int) -> int:
    """The held-out prompts as `vllm bench serve`'s custom dataset (JSON lines); returns how many."""
    from transformers import AutoTokenizer

    from ..spec.run import held_out_prompts

    tok = AutoTokenizer.from_pretrained(os.fspath(MODEL))
    with open(path, "w") as f:
        for ids in held_out_prompts(tok, n, PROMPT_TOKENS):
            f.write(json.dumps({"prompt": tok.decode(ids.tolist()), "output_tokens": out_tokens}) + "\n")
    return n


def _start_arm(arm: str, head: Path | None, stack: ExitStack, logs: Path, vllm_cpus, our_cpus, prefix: str,
               sampled: bool = False):
    """One arm's server (and for a head, its worker and proxy on our CPUs), stopped when `stack` closes.
    `sampled`: the worker and proxy with --sampled and the proposer with DSPARK_PROXY_SAMPLED=1, so a
    sampled request's drafts are drawn from the head's q and vLLM verifies against q (docs/vllm.md)."""
    from ..integrations.vllm_demo import shapes_args
    from ..integrations.vllm_serve import CPU_SETTINGS, Server, free_port, serve_args, serve_env, spawn_server
    from ..model.head_shapes import worker_head_args
    from ..ops.launch import spawn_proxy, spawn_worker

    if head is None:
        if arm == "nospec":
            srv = spawn_server(MODEL, log_path=logs / f"{arm}.log", cpus=vllm_cpus, max_num_seqs=MAX_NUM_SEQS,
                               ready_timeout_s=400.0)
            stack.callback(srv.stop)
            return srv
        # vLLM's n-gram drafter with the demo's settings (integrations/vllm_arm.py), 5 drafts like the head
        port = free_port()
        spec = json.dumps({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3,
                           "prompt_lookup_min": 1})
        args = serve_args(MODEL, port=port, max_num_seqs=MAX_NUM_SEQS,
                          extra=(*CPU_SETTINGS, "--speculative-config", spec))
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", *args]
        if vllm_cpus:
            cmd = ["taskset", "-c", ",".join(map(str, vllm_cpus)), *cmd]
        with open(logs / f"{arm}.log", "wb") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=serve_env(), start_new_session=True)
        srv = Server(proc, port, logs / f"{arm}.log", args)
        stack.callback(srv.stop)
        srv.wait_ready(400.0)
        return srv
    layout = shapes_args(head, MAX_NUM_SEQS)
    name = _segment_name(prefix, arm)
    extra = ["--sampled"] if sampled else []
    mine = os.sched_getaffinity(0)
    try:
        if our_cpus:
            os.sched_setaffinity(0, set(our_cpus))  # the worker and the proxy inherit it
        # generous start-up limits: torch's import alone took over 20 s beside two busy processes
        worker = spawn_worker(*layout, *worker_head_args(os.fspath(head), os.fspath(MODEL)), *extra,
                              timeout_s=180.0)
        stack.callback(worker.stop)
        proxy = spawn_proxy(name, worker.address, *layout, "--deadline-ms", "20", "--keep-awake-ms", "20",
                            "--log-every", "0", *extra, timeout_s=120.0)
        stack.callback(proxy.stop)
    finally:
        os.sched_setaffinity(0, mine)
    stack.callback(_unlink_rings, name)  # after the server's stop (the stack unwinds in reverse)
    env: dict[str, Any] = {"DSPARK_PROXY_REPLY_SPIN_US": 1000}
    if sampled:
        env["DSPARK_PROXY_SAMPLED"] = 1
    srv = spawn_server(MODEL, log_path=logs / f"{arm}.log", head=head, name=name, cpus=vllm_cpus,
                       max_num_seqs=MAX_NUM_SEQS, env=env, ready_timeout_s=400.0)
    stack.callback(srv.stop)
    return srv


def _segment_name(prefix: str | None, arm: str) -> str:
    """The segment of a head arm's proxy (its `status` gives `_proxy_figures`)."""
    return f"{prefix or f'bench-{os.getpid()}'}-serve-{arm.replace('+', '-')}"


def _proxy_figures(name: str) -> dict[str, Any]:
    """What the arm's proxy did over the whole grid (its `status`): rounds, those that fell back to
    target-only and why, and the acceptance gate's counters (pauses, probes, rounds published before
    their STEP), so a slow arm's table row says whether the gate stopped drafting."""
    try:
        st = read_status(name)
    except Exception as e:  # noqa: BLE001 - a figure missing, never the benchmark
        return {"error": str(e)}
    d, c = st["drafting"], st["proxy"].get("counters", {})
    return {"rounds": d["rounds"], "rounds_failed": d["rounds_failed"], "fallbacks": d["fallbacks"],
            "gate": d["gate"].get("counters", {}), "gate_batch": d["gate"].get("batch"),
            **{k: int(c.get(k, 0)) for k in ("rounds_published_first", "rounds_answered_by_engine",
                                             "paused_rows_overtaken")}}


def _unlink_rings(name: str) -> None:
    """The engine's ring of segment `name` where its owner is gone: a server killed when SIGTERM did
    not stop it in time leaves it (shm_layout.md names it dspark-ring.<name>.<pid>.<n>)."""
    for p in Path("/dev/shm").glob(f"dspark-ring.{name}.*"):
        try:
            os.kill(int(p.name[len(f"dspark-ring.{name}."):].split(".")[0]), 0)
        except (ValueError, ProcessLookupError):
            p.unlink(missing_ok=True)
        except PermissionError:
            pass


def _counters(srv) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=10) as r:
        return spec_counters(r.read().decode())


def _client_args(argv: list[str]) -> Any:
    """`vllm bench serve ARGV` parsed by vLLM's own parser (what `vllm bench serve` runs)."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(argv)


def _bench_once(srv, dataset: Path, n: int, out_tokens: int, concurrency: int, temperature: float = 0.0
                ) -> dict[str, Any]:
    """One run of vLLM's client, `vllm bench serve` with these flags, in this process (vLLM's import
    took most of a minute per run on a loaded 2-CPU machine: once here) -> its figures, with the mean
    accepted per drafting step over the run from the server's counters. vLLM's printed table goes to
    stderr, so the bench's stdout stays one JSON object."""
    from vllm.benchmarks.serve import main as bench_serve

    argv = ["--backend", "openai", "--base-url", f"http://127.0.0.1:{srv.port}", "--model", os.fspath(MODEL),
            "--tokenizer", os.fspath(MODEL), "--dataset-name", "custom", "--dataset-path", os.fspath(dataset),
            "--custom-output-len", str(out_tokens), "--skip-chat-template", "--disable-shuffle",
            "--num-prompts", str(n), "--max-concurrency", str(concurrency), "--request-rate", "inf",
            "--ignore-eos", "--temperature", str(temperature), "--percentile-metrics", "ttft,itl",
            "--metric-percentiles", "50,99", "--disable-tqdm", "--seed", "0", "--save-detailed"]
    before = _counters(srv)
    with contextlib.redirect_stdout(sys.stderr):
        result = bench_serve(_client_args(argv))
    fig = run_figures(result)
    fig["accepted_mean"] = mean_accepted(before, _counters(srv))
    return fig


def _grid(servers: dict[str, Any], dataset: Path, n: int, toks: int, reps: int, concurrency: tuple[int, ...],
          say: Callable[[str], None], q_servers: dict[str, Any], sampled_dataset: Path, sampled_n: int
          ) -> tuple[dict, dict, dict]:
    """The interleaved greedy runs (for each repetition, each concurrency, every arm in turn), then the
    sampled ones at c=1, on `sampled_n` held-out prompts, of every speculating arm and of the
    drafts-from-q servers (`q_servers`, named `<head>+q`): (runs[arm][c], texts[arm], sampled[arm][tT])."""
    runs: dict[str, dict[int, list]] = {a: {c: [] for c in concurrency} for a in servers}
    texts: dict[str, list[list[str]]] = {a: [] for a in servers}
    for rep in range(reps):
        for c in concurrency:
            for arm, srv in servers.items():
                say(f"serve: rep {rep + 1}/{reps}, c={c}, {arm}")
                fig = _bench_once(srv, dataset, n, toks, c)
                texts[arm].append(fig.pop("texts"))
                runs[arm][c].append(fig)
    sampled: dict[str, dict[str, Any]] = {}
    for arm, srv in {**servers, **q_servers}.items():
        if arm == "nospec":
            continue
        sampled[arm] = {}
        for t in TEMPERATURES:
            say(f"serve: sampled, temperature {t}, {arm}")
            fig = _bench_once(srv, sampled_dataset, sampled_n, toks, 1, temperature=t)
            sampled[arm][f"t{t}"] = {"accepted_mean": fig["accepted_mean"], "tokens_per_s": round(fig["tokens_per_s"], 2)}
    return runs, texts, sampled


def run_serve(*, quick: bool, say: Callable[[str], None], prefix: str, reps: int = 3,
              n_prompts: int | None = None, out_tokens: int | None = None,
              concurrency: tuple[int, ...] = CONCURRENCY, arms: tuple[str, ...] | None = None,
              sampled_heads: bool = True) -> tuple[dict, Samples]:
    """Start every arm's server, run the interleaved grid, then the sampled requests; stop everything.
    `sampled_heads`: also serve each head with drafts drawn from its q (`<head>+q`, sampled runs only)."""
    n = n_prompts or (8 if quick else 16)
    sampled_n = min(n, SAMPLED_PROMPTS)
    toks = out_tokens or (64 if quick else 128)
    heads = {h.name: h for h in shipped_heads()}
    chosen = arms or ("nospec", "ngram", *heads)
    vllm_cpus, our_cpus = _placement()
    res: dict[str, Any] = {"placement": {"vllm_cpus": vllm_cpus, "proxy_worker_client_cpus": our_cpus,
                                         "vllm_omp_threads": 1},
                           "prompts": n, "output_tokens": toks, "reps": reps, "concurrency": list(concurrency),
                           "client": "vllm bench serve (openai backend, custom dataset, ignore_eos)"}
    with tempfile.TemporaryDirectory(prefix="dspark-bench-serve-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        dataset = work / "prompts.jsonl"
        _prompts_file(dataset, n, toks)
        sampled_dataset = work / "prompts-sampled.jsonl"
        _prompts_file(sampled_dataset, sampled_n, toks)
        servers, q_servers = {}, {}
        for arm in chosen:
            say(f"serve: starting {arm}")
            servers[arm] = _start_arm(arm, heads.get(arm), stack, work, vllm_cpus, our_cpus, prefix)
            if sampled_heads and arm in heads:
                say(f"serve: starting {arm}+q")
                q_servers[f"{arm}+q"] = _start_arm(f"{arm}+q", heads[arm], stack, work, vllm_cpus, our_cpus,
                                                   prefix, sampled=True)
        res["sampled_prompts"] = sampled_n
        with pinned(our_cpus) if our_cpus else contextlib.nullcontext():  # the client beside the proxy
            runs, texts, sampled = _grid(servers, dataset, n, toks, reps, concurrency, say, q_servers,
                                         sampled_dataset, sampled_n)
        for arm in chosen:
            res[arm] = {f"c{c}": cell_medians(runs[arm][c]) for c in concurrency}
        res["proxies"] = {arm: _proxy_figures(_segment_name(prefix, arm)) for arm in (*servers, *q_servers)
                          if arm.removesuffix("+q") in heads}
        for arm, by_t in sampled.items():
            if arm in res:  # a +q server runs sampled requests only
                by_t["t0"] = {"accepted_mean": res[arm][f"c{concurrency[0]}"].get("accepted_mean")}
        res["sampled"] = sampled
        mm = mismatches(texts)
        res["lossless_mismatches"] = sum(v for a, v in mm.items() if a != "nospec")
        res["mismatches_by_arm"] = mm
        base = res.get("nospec", {})
        res["speedup_vs_nospec"] = {a: {c: round(res[a][c]["tokens_per_s"] / base[c]["tokens_per_s"], 2)
                                        for c in res[a]} for a in chosen if a != "nospec" and base}
    return res, Samples()
