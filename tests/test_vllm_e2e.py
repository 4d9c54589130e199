"""A real vLLM drafting through the product: worker (torch, the shipped head) + proxy + vLLM with
`engine_shim.vllm_proposer.DSparkProposer`, against vLLM without speculation under identical settings.

vLLM's defaults stay on (prefix caching, chunked prefill); a small token budget makes prompts chunk,
two prompts share a prefix, and a KV cache of a few blocks forces preemptions. Two vLLM start-ups
for the module (each 20 s or more): no speculation, and ours (then the same prompts again with the
worker killed mid-generation). tests/test_vllm_proposer.py covers the proposer without a vLLM.
"""

from __future__ import annotations

import base64
import os

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs it)")

from dspark_proxy.integrations.vllm_demo import (
    DEFAULT_HEAD,
    DEFAULT_MODEL,
    PROMPTS,
    run_arm_process,
    shapes_args,
    vllm_threads_env,
)
from dspark_proxy.ops.launch import spawn_proxy, spawn_worker

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

MAX_TOKENS = 40
DEADLINE_MS, GRACE_MS, SLACK_MS = 30.0, 2.0, 20.0  # the slack: the engine thread taking its GIL back (docs/guarantees.md)
LLM = {"max_num_seqs": 8, "max_model_len": 256, "block_size": 32, "num_gpu_blocks_override": 10,
       "max_num_batched_tokens": 48, "enable_prefix_caching": True, "enable_chunked_prefill": True}
LAYOUT = shapes_args(DEFAULT_HEAD, LLM["max_num_seqs"])


def _spec(arm: str, name: str, **kw) -> dict:
    return {"model": os.fspath(DEFAULT_MODEL), "arm": arm, "num_spec": int(LAYOUT[3]), "prompts": PROMPTS,
            "max_tokens": MAX_TOKENS, "llm": LLM,
            "env": {"DSPARK_PROXY": name, "DSPARK_PROXY_HEAD": os.fspath(DEFAULT_HEAD), **vllm_threads_env()}, **kw}


@pytest.fixture(scope="module")
def runs():
    """(no speculation, ours): one vLLM each; ours also regenerates with its worker killed."""
    from tests.conftest import _unlink

    name = f"vllm-e2e-{os.getpid()}"
    try:
        nospec = run_arm_process(_spec("nospec", name))
        worker = spawn_worker(*LAYOUT, "--drafter", "torch", "--head", os.fspath(DEFAULT_HEAD))
        try:
            proxy = spawn_proxy(name, worker.address, *LAYOUT, "--deadline-ms", str(DEADLINE_MS),
                                "--log-every", "0")
            try:
                ours = run_arm_process(_spec("dspark", name, ring_probe=True,
                                             kill={"pid": worker.pid, "after_steps": 12}))
            finally:
                proxy.stop()
        finally:
            worker.stop()
    finally:
        # vLLM ends its engine-core process without the shim's close: its ring stays unless removed
        _unlink(name)
    return nospec, ours


def test_output_is_identical_to_no_speculation_with_drafts_used_and_requests_preempted(runs):
    nospec, ours = runs
    run = ours["drafter_run"]
    assert run["active"] and run["bound"] and run["errors"] == 0, run
    assert run["shim_state"] == "attached" and run["shim_counters"].get("replies_ok", 0) > 0, run
    assert run["preemptions"] >= 1, run  # the small KV cache preempted someone
    assert run["verified_rounds"] > 20 and run["mean_accepted"] > 1.0, run  # drafts were used, and good ones
    assert ours["outputs"] == nospec["outputs"]
    assert all(len(o) == MAX_TOKENS for o in ours["outputs"])


def test_vllm_sends_the_reference_engines_rows(runs):
    """The rows vLLM's drafter sent (the engine ring of the first request) are the reference tap's on the
    same tokens (transformers, manifest layers), within bf16 rounding of two float32 forwards."""
    import torch

    from dspark_proxy.model.hf import Tap, load_causal_lm
    from dspark_proxy.model.manifest import HeadManifest, head_paths

    probe = runs[1]["ring_probe"]
    man = HeadManifest.load(head_paths(DEFAULT_HEAD)[1])
    lo, hi, tokens = probe["lo"], probe["hi"], probe["tokens"]
    # the last W finalised positions, ending at the last token's anchor: no draft was asked past the
    # request's max_tokens, so none was accepted there and no row lies past the output's end
    L = len(tokens)
    assert hi - lo + 1 == man.window and hi == L - 2, (lo, hi, L)
    top = min(hi, L - 1)  # positions whose tokens we know
    got = np.frombuffer(base64.b64decode(probe["rows_b64"]), dtype=np.uint8).reshape(man.window, man.row_bytes)
    got_f = torch.from_numpy(got[:top - lo + 1].copy()).view(torch.bfloat16).float()
    model, _ = load_causal_lm(DEFAULT_MODEL)
    with torch.no_grad(), Tap(model, list(man.tap_layers)) as tap:
        model(torch.tensor([tokens]))
    want = tap.rows(torch.bfloat16)[0, lo:top + 1].float()
    assert want.shape[0] >= man.window - man.num_spec - 1
    assert got_f.shape == want.shape
    err = (got_f - want).abs()
    assert float(err.max()) <= 0.02 * float(want.abs().max()), float(err.max())
    assert float((err > 0).float().mean()) < 0.05  # nearly all rows bit-identical after rounding


def test_a_dspark_checkpoints_layer_ids_are_vllms_auxiliary_hidden_states(runs):
    """The one-off convention, on the same tokens: the shipped DSpark checkpoint names
    aux_hidden_state_layer_ids [1, 2, 4]; vLLM's own DSpark config maps them to target_layer_ids
    [0, 1, 3] (its model's internal index) but asks the target for auxiliary hidden states [1, 2, 4],
    which are what its proposer sent here; the trainer's tap (output_hidden_states, the last id before
    the final norm) gives the same rows."""
    import torch
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    from dspark_proxy.model.head_shapes import load_head_shapes
    from dspark_proxy.model.hf import load_causal_lm
    from dspark_proxy.model.manifest import HeadManifest, head_paths
    from dspark_proxy.model.taps import HiddenTaps

    ck = "models/stdlib-llama-dspark"
    ids = load_head_shapes(ck).tap_layers
    v = SpeculatorsConfig.from_pretrained(ck)
    assert v.eagle_aux_hidden_state_layer_ids == ids and v.target_layer_ids == [i - 1 for i in ids]
    man = HeadManifest.load(head_paths(DEFAULT_HEAD)[1])
    assert list(man.tap_layers) == ids  # the run's proposer asked vLLM for exactly these
    probe = runs[1]["ring_probe"]
    lo, hi, tokens = probe["lo"], probe["hi"], probe["tokens"]
    top = min(hi, len(tokens) - 1)
    got = np.frombuffer(base64.b64decode(probe["rows_b64"]), dtype=np.uint8).reshape(man.window, man.row_bytes)
    got_f = torch.from_numpy(got[:top - lo + 1].copy()).view(torch.bfloat16).float()
    model, _ = load_causal_lm(DEFAULT_MODEL)
    rows, _, _ = HiddenTaps(model, ids)(torch.tensor([tokens]))
    want = rows.to(torch.bfloat16)[0, lo:top + 1].float()
    err = (got_f - want).abs()
    assert float(err.max()) <= 0.02 * float(want.abs().max()), float(err.max())
    assert float((err > 0).float().mean()) < 0.05


def test_a_worker_killed_mid_generation_leaves_output_identical_and_no_step_waits_past_the_deadline(runs):
    nospec, ours = runs
    k = ours["drafter_killed"]
    assert ours["outputs_killed"] == nospec["outputs"]
    assert k["errors"] == 0
    c = k["shim_counters"]
    assert c.get("replies_ok", 0) >= 1  # drafts before the kill ...
    assert c.get("replies_round_failed", 0) >= 1  # ... and target-only rounds after it
    assert k["read_reply_us"]["max"] <= (DEADLINE_MS + GRACE_MS + SLACK_MS) * 1000, k["read_reply_us"]
