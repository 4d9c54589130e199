"""`dspark-proxy eval`: a flipped near-tie is shown with both forwards' logits and margins, and the
JSON report has every key the issue names (a small run of the real thing: proxy, worker, faults)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from dspark_proxy.spec.engine import RunStats  # noqa: E402
from dspark_proxy.spec.evaluate import closest_tie, mismatches  # noqa: E402
from dspark_proxy.spec.report import format_eval  # noqa: E402


def _stats(tokens: list[int], margins: list[tuple[float, int, float]]) -> RunStats:
    return RunStats(outputs={0: np.array(tokens)}, margins={0: np.array(margins, np.float32)})


def test_a_flip_is_shown_with_both_logits_and_margins() -> None:
    ref = _stats([5, 7, 9], [(3.0, 1, 1.0), (2.000001, 8, 2.0), (4.0, 2, 1.0)])
    got = _stats([5, 8, 3], [(3.0, 1, 1.0), (2.0000015, 7, 2.000001), (4.0, 2, 1.0)])
    same = _stats([5, 7, 9], [(3.0, 1, 1.0), (2.000001, 8, 2.0), (4.0, 2, 1.0)])
    assert mismatches(ref, same, "proxy") == []
    [m] = mismatches(ref, got, "proxy")
    assert (m["position"], m["token"], m["target_only_token"]) == (1, 8, 7)
    assert m["this_forward"]["runner_up"] == 7 and m["one_token_forward"]["runner_up"] == 8
    assert m["this_forward"]["top1_logit"] == pytest.approx(2.0000015)
    assert m["one_token_forward"]["margin"] == pytest.approx(1e-6, abs=5e-7)
    tie = closest_tie(ref, same)
    assert tie is not None and tie["position"] == 1 and "this_forward_margin" in tie


EVAL_KEYS = {"mean_accepted", "mean_accepted_ngram", "num_spec", "target_forwards_per_token", "speedup",
             "speedup_ngram", "head_ms", "target_step_ms", "lossless_mismatches", "prompts", "accept_by_position",
             "greedy_distinct_4gram_rate", "speedup_thread", "faults", "round_parts_ms", "drafter",
             "mean_accepted_carry"}


@pytest.mark.timeout(300)
def test_eval_json_shape(tmp_path) -> None:
    """A small eval through the CLI: one JSON object on the last line, the keys, 0 mismatches; its
    figures (`--plot DIR`) valid PNGs."""
    from tests.test_plots import assert_png

    # the deadline is long: on a busy machine the worker's round can take tens of ms, and a round past
    # the deadline has no drafts; what is checked here is the plumbing and losslessness, not speed
    out = subprocess.run([sys.executable, "-m", "dspark_proxy.cli", "eval", "--quick", "--prompts", "4",
                          "--max-new", "16", "--max-batch", "2", "--reps", "1", "--json", "--deadline-ms", "400",
                          "--plot", str(tmp_path / "plots")],
                         capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert EVAL_KEYS <= set(r), EVAL_KEYS - set(r)
    assert r["prompts"] == 4 and r["num_spec"] == 5
    assert r["lossless_mismatches"] == 0, r["mismatches"]
    assert set(r["faults"]) == {"worker_stall", "worker_kill", "proxy_kill"}
    for kind, f in r["faults"].items():
        assert f["mismatches"] == 0 and f["prompts_checked"] > 0, (kind, f)
        assert f["failed_rounds"] > 0, (kind, f)  # the fault reached the engine as target-only rounds
    assert r["mean_accepted"] > 0.5 and r["target_forwards_per_token"] < 1.0
    # the default head is the carry head: served by the torch drafter, and its own yardstick
    assert r["drafter"] == "torch" and r["mean_accepted_carry"] == r["mean_accepted"], r
    p = r["round_parts_ms"]  # each round's worker time is inside its STEP's round trip (rounds without a
    assert 0 < p["worker"] <= p["proxy_worker_rtt"] and p["proxy_round"] > 0, p  # reply have neither)
    assert "the round (p50, ms)" in format_eval(r)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["eval_acceptance.png", "eval_tokens_per_s.png"]
    for p in (tmp_path / "plots").iterdir():
        assert_png(p)


def test_bench_runs_eval_only_when_named() -> None:
    """`bench` never needs the model extra: its default sections leave eval out; naming it is allowed."""
    from click.testing import CliRunner

    from dspark_proxy.bench import OPT_IN, SECTIONS, _runner
    from dspark_proxy.commands.bench import _sections

    assert "eval" not in SECTIONS and "eval" in OPT_IN
    assert _sections("eval,handoff") == ["eval", "handoff"]
    assert callable(_runner("eval"))
    from dspark_proxy.cli import cli

    res = CliRunner().invoke(cli, ["bench", "--sections", "nosuch"])
    assert res.exit_code != 0 and "eval" in res.output


def test_eval_waits_for_the_snapshot_that_covers_its_rounds(monkeypatch) -> None:
    """The proxy publishes its statistics every STATS_EVERY_S: an eval that ends sooner must not report
    the round's parts as 0 from the snapshot before its rounds (as it did under a loaded full suite)."""
    from dspark_proxy.spec.evaluate import _latency

    snaps = iter([{}, {"worker_us": {"p50_us": 0.0}}, {"worker_us": {"p50_us": 812.0}}])
    got = _latency("x", lambda name: {"proxy": {"latency": next(snaps)}})
    assert got["worker_us"]["p50_us"] == 812.0
    # a proxy that never reports one: given up on within a second, not waited on for ever
    t0 = time.monotonic()
    assert _latency("x", lambda name: {"proxy": {}}) == {}
    assert time.monotonic() - t0 < 2.0


@pytest.mark.timeout(300)
def test_eval_serves_a_dspark_checkpoint() -> None:
    """`eval --head CKPT` with a speculators DSpark checkpoint: the worker (and thread mode) run the
    dspark drafter, its drafts are verified losslessly, and the carry head is measured beside it on
    the same prompts. The shipped checkpoint is small (1 M parameters): cheaper than building one."""
    out = subprocess.run([sys.executable, "-m", "dspark_proxy.cli", "eval", "--quick", "--prompts", "4",
                          "--max-new", "16", "--max-batch", "2", "--reps", "1", "--no-faults", "--json",
                          "--deadline-ms", "400", "--head", "models/stdlib-llama-dspark"],
                         capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert EVAL_KEYS - {"faults"} <= set(r), EVAL_KEYS - set(r)
    assert r["drafter"] == "dspark" and r["head"] == "stdlib-llama-dspark" and r["num_spec"] == 5
    assert r["lossless_mismatches"] == 0, r["mismatches"]
    assert r["head_ms"] > 0 and r["round_parts_ms"]["worker"] == r["head_ms"]
    assert r["mean_accepted"] > 0  # a weak head (docs/dspark.md), but its drafts are used
    # the carry head, run beside it on the same prompts: measured, and its drafts used too
    assert r["mean_accepted_carry"] is not None and r["mean_accepted_carry"] > 0.5, r
