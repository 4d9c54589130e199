"""`bench --sections serve` (dspark_proxy/bench/serve.py, serve_stats.py): the figures it takes from a
recorded `vllm bench serve --save-result --save-detailed` file and from vLLM's `/metrics`, the medians of
interleaved runs, the outputs that differ from the `nospec` arm's, and the JSON keys the section produces
(arm x concurrency x figure), with the servers and the client replaced by the recorded result: the real
run needs several vLLM servers (minutes; docs/performance.md, "Serving under load"), too long for CI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_proxy.bench import serve
from dspark_proxy.bench.serve_stats import (
    CELL_KEYS,
    cell_medians,
    format_serve,
    mean_accepted,
    mismatches,
    run_figures,
    serve_targets,
    spec_counters,
)

pytestmark = pytest.mark.timeout(60)

DATA = Path(__file__).parent / "data"
RECORDED = json.loads((DATA / "vllm_bench_serve_result.json").read_text())
METRICS = (DATA / "vllm_spec_metrics.txt").read_text()


def test_run_figures_from_recorded_vllm_result() -> None:
    fig = run_figures(RECORDED)
    assert fig["tokens_per_s"] == pytest.approx(RECORDED["output_throughput"])
    assert fig["ttft_ms_p50"] == pytest.approx(RECORDED["median_ttft_ms"])
    assert fig["itl_ms_p50"] == pytest.approx(RECORDED["median_itl_ms"])
    assert fig["itl_ms_p99"] == pytest.approx(RECORDED["p99_itl_ms"])
    assert fig["texts"] == RECORDED["generated_texts"] and len(fig["texts"]) == RECORDED["completed"]
    assert fig["output_tokens"] == RECORDED["total_output_tokens"] > 0


def test_run_figures_names_what_is_missing_or_failed() -> None:
    bad = {k: v for k, v in RECORDED.items() if k != "p99_itl_ms"}
    with pytest.raises(ValueError, match="p99_itl_ms"):
        run_figures(bad)
    with pytest.raises(ValueError, match="2 request"):
        run_figures({**RECORDED, "failed": 2, "errors": ["boom", "boom"]})


def test_cell_medians_and_mismatches() -> None:
    runs = [{**dict.fromkeys(CELL_KEYS, v), "accepted_mean": a} for v, a in ((3.0, 3.1), (1.0, None), (2.0, 3.3))]
    cell = cell_medians(runs)
    assert {k: cell[k] for k in CELL_KEYS} == dict.fromkeys(CELL_KEYS, 2.0)
    assert cell["accepted_mean"] == pytest.approx(3.2) and cell["runs"] == 3
    texts = {"nospec": [["a", "b"], ["a", "b"]], "ngram": [["a", "b"]], "head": [["a", "x"], ["a"]]}
    assert mismatches(texts) == {"nospec": 0, "ngram": 0, "head": 2}


def test_spec_counters_from_recorded_metrics() -> None:
    got = spec_counters(METRICS)
    assert got["drafts"] > 0 and 0 < got["accepted"] <= got["draft_tokens"]
    assert mean_accepted(dict.fromkeys(got, 0.0), got) == pytest.approx(got["accepted"] / got["drafts"], abs=1e-3)
    assert spec_counters("# nothing speculative\nvllm:num_requests_running 0\n") == dict.fromkeys(got, 0.0)
    assert mean_accepted(got, got) is None


def test_section_json_keys_with_recorded_runs(monkeypatch, tmp_path) -> None:
    """run_serve's JSON for every arm and concurrency, its mismatch count and sampled acceptance, with
    each `vllm bench serve` run replaced by the recorded one (a head arm's last output changed)."""
    started: list[str] = []

    def fake_start(arm, head, stack, logs, vllm_cpus, our_cpus, prefix, sampled=False):
        assert sampled == arm.endswith("+q")
        started.append(arm)
        return arm

    def fake_status(name):
        assert name.startswith("t-serve-stdlib-") and name.replace("-q", "+q").removeprefix("t-serve-") in started
        return {"drafting": {"rounds": 900, "rounds_failed": 40, "fallbacks": {"timeout": 40},
                             "gate": {"batch": "paused", "counters": {"batch_tps_paused": 2, "batch_tps_resumed": 1}}},
                "proxy": {"counters": {"rounds_published_first": 300}}}

    def fake_bench(srv, dataset, n, toks, c, temperature=0.0):
        fig = run_figures(RECORDED)
        if srv == "stdlib-llama-head" and temperature == 0.0:
            fig["texts"][-1] += "!"
        fig["accepted_mean"] = None if srv == "nospec" else 3.0 - temperature + srv.endswith("+q")
        assert n == 8  # --quick: 8 prompts; the sampled runs: at most 8
        return fig

    monkeypatch.setattr(serve, "_start_arm", fake_start)
    monkeypatch.setattr(serve, "_bench_once", fake_bench)
    monkeypatch.setattr(serve, "_prompts_file", lambda path, n, toks: n)
    monkeypatch.setattr(serve, "read_status", fake_status)
    res, _ = serve.run_serve(quick=True, say=lambda m: None, prefix="t", reps=3)
    heads = [h.name for h in serve.shipped_heads()]
    arms = ["nospec", "ngram", *heads]
    assert started == ["nospec", "ngram", *(a for h in heads for a in (h, f"{h}+q"))]
    assert "stdlib-llama-head" in arms and "stdlib-llama-dspark" in arms  # both kinds of head
    for arm in arms:
        for c in ("c1", "c4", "c8"):
            assert set(CELL_KEYS) <= set(res[arm][c]) and res[arm][c]["runs"] == 3
    assert res["lossless_mismatches"] == 9  # 3 concurrencies x 3 runs, one output each
    assert res["mismatches_by_arm"]["ngram"] == 0
    assert res["sampled"]["stdlib-llama-head"]["t0.7"]["accepted_mean"] == pytest.approx(2.3)
    assert res["sampled"]["stdlib-llama-head+q"]["t0.7"]["accepted_mean"] == pytest.approx(3.3)
    assert "t0" not in res["sampled"]["stdlib-llama-head+q"] and "stdlib-llama-head+q" not in res
    assert "stdlib-llama-head+q" not in res["speedup_vs_nospec"] and res["sampled_prompts"] == 8
    assert res["speedup_vs_nospec"]["ngram"]["c1"] == 1.0
    json.dumps(res)
    goals = {t["goal"]: t["met"] for t in serve_targets(res)}
    assert goals["serve: outputs identical to no speculation"] is False
    assert goals["serve: stdlib-llama-head >= 2.5x no speculation at c=1"] is False
    table = "\n".join(format_serve(res))
    assert "stdlib-llama-head" in table and "T=0.7 2.3" in table
    # what each proxy did over the grid: the gate's pauses and the rounds published before their STEP
    assert set(res["proxies"]) == {a for a in started if a not in ("nospec", "ngram")}
    px = res["proxies"]["stdlib-llama-dspark"]
    assert px["rounds_published_first"] == 300 and px["gate"]["batch_tps_paused"] == 2 and px["gate_batch"] == "paused"
    assert "proxy, stdlib-llama-dspark: 900 rounds, 40 target-only" in table and "paused 2x by tokens/s" in table


def test_bench_cli_runs_serve_only_when_named() -> None:
    from dspark_proxy.bench import OPT_IN, SECTIONS

    assert "serve" in OPT_IN and "serve" not in SECTIONS
