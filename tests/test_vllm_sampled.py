"""Sampled requests through vLLM (docs/vllm.md, "Sampled requests").

Fast, no vLLM engine: the draft probabilities the proposer hands vLLM's rejection sampler (q scattered
into vocabulary rows, point masses for drafts not drawn), and the replacement of vLLM 0.32's CPU
expand kernel, which left the per-draft temperatures unwritten.

Slow (one vLLM, worker and proxy in sampled mode): lossless in distribution, by the chi-square test
of tests/test_spec_sampling.py (Pearson's statistic, p >= 0.01): the first three tokens of one
prompt (of five, so the second and third come through drafts) drawn 2,000 times at temperature 1, each
with its own seed, against the target's exact distribution (transformers, the same weights); cells
expecting at least 5, the rest one cell. Draws whose drafts were not drawn from the q vLLM is
given (each replaced by the top of its q, as tests/test_spec_sampling.py's greedy mutant) must fail it.
Greedy requests in the same batches must give the target's greedy output.
(Withholding q would not do: vLLM then takes each draft as a point mass, accepts it with p(x) and
resamples from p without x, which is lossless for drafts drawn from anything.)
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from engine_shim.vllm.probs import DraftProbs  # noqa: E402
from tests.test_vllm_proposer import env  # noqa: E402, F401 - a fixture

K = 32


def _reply(n: int, N: int, V: int, seed: int = 0):
    """A sampled reply's support (distinct ids) and q (rows summing to 1) for n requests."""
    g = np.random.default_rng(seed)
    sup = np.stack([np.stack([g.choice(V, K, replace=False) for _ in range(N)]) for _ in range(n)]).astype(np.int32)
    q = g.random((n, N, K)).astype(np.float32)
    return sup, q / q.sum(-1, keepdims=True)


def test_drawn_drafts_get_their_q_and_the_rest_point_masses_or_zero():
    M, N, V = 4, 3, 100
    dp = DraftProbs(M, N, V)
    sup, q = _reply(3, N, V)
    drafts = [[int(sup[0, 0, 5]), int(sup[0, 1, 0])], [7, 8, 9], []]  # drawn (2 of 3), greedy, none
    out = dp.fill(drafts, np.array([True, False, True]), sup, q)
    assert out.shape == (3, N, V) and out.dtype == torch.float32 and out.is_contiguous()
    for j in range(2):
        want = np.zeros(V, np.float32)
        want[sup[0, j]] = q[0, j]
        assert np.array_equal(out[0, j].numpy(), want)
        assert abs(float(out[0, j].sum()) - 1) < 1e-5 and float(out[0, j, drafts[0][j]]) > 0
    assert float(out[0, 2].abs().sum()) == 0  # past the request's drafts
    for j, x in enumerate(drafts[1]):  # not drawn: a point mass, what vLLM assumes without probabilities
        assert float(out[1, j, x]) == 1 and float(out[1, j].sum()) == 1
    assert float(out[2].abs().sum()) == 0  # a request with no drafts (its sample_mask is not trusted)


def test_each_step_starts_from_zero_and_bad_support_is_skipped():
    M, N, V = 2, 2, 50
    dp = DraftProbs(M, N, V)
    sup, q = _reply(2, N, V, seed=1)
    dp.fill([[int(sup[0, 0, 0]), int(sup[0, 1, 0])], [1, 2]], np.array([True, True]), sup, q)
    sup2, q2 = _reply(1, N, V, seed=2)
    sup2[0, 0, :4] = [-1, V, V + 7, -5]  # outside the vocabulary: never written (nor out of bounds)
    out = dp.fill([[int(sup2[0, 0, 4])]], np.array([True]), sup2, q2)
    assert out.shape == (1, N, V)
    row = np.zeros(V, np.float32)
    row[sup2[0, 0, 4:]] = q2[0, 0, 4:]
    assert np.array_equal(out[0, 0].numpy(), row)
    assert float(dp.buf.abs().sum()) == pytest.approx(float(q2[0, 0, 4:].sum()))  # the last step's gone


def test_more_requests_than_max_num_seqs_is_refused():
    dp = DraftProbs(1, 2, 40)
    sup, q = _reply(2, 2, 40)
    with pytest.raises(ValueError, match="max_num_seqs=1"):
        dp.fill([[1], [2]], np.array([True, True]), sup, q)


def test_expand_kernel_writes_each_requests_value_to_its_tokens():
    from engine_shim.vllm.hook import expand_kernel

    for x, fill in ((torch.tensor([0.7, -1.0, 0.5]), 1.0), (torch.tensor([5, -1, 9], dtype=torch.int32), 1)):
        out = torch.full((6,), 123, dtype=x.dtype)
        expand_kernel(out, x, torch.tensor([2, 5, 6], dtype=torch.int32), -1, fill)
        assert out.tolist() == [x[0].item()] * 2 + [fill] * 3 + [x[2].item()]


def test_vllms_cpu_expand_is_replaced_and_then_expands():
    """vLLM's own CPU stand-in (registered by its platform) leaves the float output unwritten; after
    fix_cpu_expand the rejection sampler's expand_batch_to_tokens gives each draft its temperature."""
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("vLLM's CPU platform only")
    from vllm.v1.sample import rejection_sampler as rs

    from engine_shim.vllm import hook

    current_platform.register_triton_kernel_overrides()
    if not hook._state.get("expand_fixed"):
        bad = rs.expand_batch_to_tokens(torch.tensor([0.7, 1.0]), torch.tensor([2, 3], dtype=torch.int32), 3)
        assert not torch.equal(bad, torch.tensor([0.7, 0.7, 1.0]))  # the bug this works around
    assert hook.fix_cpu_expand()
    got = rs.expand_batch_to_tokens(torch.tensor([0.7, -1.0, 0.5]), torch.tensor([2, 5, 6], dtype=torch.int32), 6,
                                    replace_from=-1, replace_to=1)
    assert got.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 0.5])


def test_the_proposer_asks_a_sampled_proxy_for_drawn_drafts_and_hands_their_q(env, monkeypatch):  # noqa: F811
    """Through a null proxy in sampled mode (its worker marks a request with temperature > 0 drawn, q
    one-hot on the draft): each request's temperature and seed reach the round, the drawn request's q
    comes back for vLLM, and a step of greedy requests alone hands vLLM no probabilities."""
    from types import SimpleNamespace

    from dspark_proxy.ops.launch import spawn_proxy
    from engine_shim.vllm_proposer import DSparkProposer
    from tests.test_vllm_proposer import MAN, M, _bound, _config, _step

    monkeypatch.setenv("DSPARK_PROXY_SAMPLED", "1")
    proxy = spawn_proxy(env, "null", "--max-reqs", str(M), "--num-spec", str(MAN.num_spec), "--window",
                        str(MAN.window), "--row-bytes", str(MAN.row_bytes), "--deadline-ms", "200", "--log-every",
                        "0", "--sampled")
    p = None
    try:
        p = DSparkProposer(_config())
        runner = _bound(p)
        sp = {"a": (0.8, 3), "b": (0.0, None), "c": (1e-6, None)}  # c: below vLLM's epsilon, greedy
        runner.requests = {r: SimpleNamespace(num_prompt_tokens=4, sampling_params=SimpleNamespace(
            temperature=t, seed=sd, max_tokens=40)) for r, (t, sd) in sp.items()}
        out, _ = _step(p, runner, [("a", 0, 5, [11]), ("b", 0, 5, [12])])
        assert all(len(d) == MAN.num_spec for d in out), out
        assert p._sp["a"] == (0.8, 3) and p._sp["b"][0] == 0.0
        assert p._reply.sample_mask.tolist() == [True, False]
        probs, ids = p.draft_probs()
        assert ids == ["a", "b"] and tuple(probs.shape) == (2, MAN.num_spec, MAN.vocab_size)
        for i in range(2):  # a's q (the null worker's: one-hot on its draft), b's point mass
            assert probs[i].sum().item() == MAN.num_spec
            assert all(probs[i, j, x].item() == 1 for j, x in enumerate(out[i]))
        assert p.draft_probs() is None  # handed once
        out, _ = _step(p, runner, [("b", 5, 1, [13]), ("c", 0, 5, [14])], finished={"a"})
        assert any(out) and p._reply.sample_mask.tolist() == [False, False]
        assert p.draft_probs() is None and "a" not in p._sp and p._sp["c"][0] == 0.0
    finally:
        if p is not None:
            p.close()
        proxy.stop()


# ---------------------------------------------------------------------------------------- through vLLM

DRAWS, MUTANT_DRAWS, TOKENS, MIN_EXPECTED, SEQS, GREEDY_TOKENS = 2000, 400, 3, 5.0, 32, 16
PROMPT = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"


def _exact_cells(model: str, prompt: str, n: int) -> dict[tuple[int, ...], float]:
    """The target's probability of every first-TOKENS sequence expecting >= MIN_EXPECTED of n draws at
    temperature 1 (a prefix expecting fewer has no such extension)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(model)(prompt)["input_ids"]
    frontier: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(TOKENS):
        nxt: dict[tuple[int, ...], float] = {}
        for pre, pp in frontier.items():
            with torch.no_grad():
                p = torch.softmax(m(torch.tensor([ids + list(pre)])).logits[0, -1].double(), -1)
            for t in torch.nonzero(p * pp * n >= MIN_EXPECTED).flatten().tolist():
                nxt[pre + (t,)] = float(p[t]) * pp
        frontier = nxt
    return frontier


def _greedy(model: str, prompts: list[str]) -> list[list[int]]:
    """The target's own greedy continuations (transformers, float32), GREEDY_TOKENS each."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model)
    out = []
    for p in prompts:
        ids = tok(p)["input_ids"]
        for _ in range(GREEDY_TOKENS):
            with torch.no_grad():
                ids.append(int(m(torch.tensor([ids])).logits[0, -1].argmax()))
        out.append(ids[-GREEDY_TOKENS:])
    return out


def _chi2_p(draws: list[list[int]], cells: dict[tuple[int, ...], float]) -> float:
    n = len(draws)
    keys = list(cells)
    counts = np.zeros(len(keys) + 1)
    at = {k: i for i, k in enumerate(keys)}
    for d in draws:
        counts[at.get(tuple(d[:TOKENS]), len(keys))] += 1
    expected = np.array([cells[k] for k in keys] + [max(1.0 - sum(cells.values()), 0.0)]) * n
    keep = expected > 0
    stat = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sampled_requests_through_vllm_keep_the_target_distribution_and_greedy_ones_their_output():
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
    from tests.conftest import _unlink

    layout = shapes_args(DEFAULT_HEAD, SEQS)
    name = f"vllm-sampled-{os.getpid()}"
    spec = {"model": os.fspath(DEFAULT_MODEL), "arm": "dspark", "num_spec": int(layout[3]), "prompts": [],
            "llm": {"max_num_seqs": SEQS, "max_model_len": 256},
            "draws": {"prompt": PROMPT, "n": DRAWS, "tokens": TOKENS + 2, "temperature": 1.0,
                      "greedy": PROMPTS[:4], "mutant_n": MUTANT_DRAWS},
            "env": {"DSPARK_PROXY": name, "DSPARK_PROXY_HEAD": os.fspath(DEFAULT_HEAD), "DSPARK_PROXY_SAMPLED": "1",
                    **vllm_threads_env()}}
    try:
        worker = spawn_worker(*layout, "--drafter", "torch", "--head", os.fspath(DEFAULT_HEAD), "--sampled")
        try:
            # the gate off and a long deadline: every step drafts, so every draw is tested
            proxy = spawn_proxy(name, worker.address, *layout, "--sampled", "--deadline-ms", "500",
                                "--accept-break-even", "0", "--log-every", "0")
            try:
                res = run_arm_process(spec, timeout_s=360)
            finally:
                proxy.stop()
        finally:
            worker.stop()
    finally:
        _unlink(name)
    run = res["drafter_sampled"]
    assert run["active"] and run["bound"] and run["errors"] == 0, run
    assert run["verified_rounds"] >= DRAWS and run["accepted"] > 0, run  # drafts were verified, some accepted
    # greedy requests batched with the sampled ones: the target's greedy output (their q is not needed)
    assert res["draws_greedy"] == _greedy(os.fspath(DEFAULT_MODEL), PROMPTS[:4])
    cells = _exact_cells(os.fspath(DEFAULT_MODEL), PROMPT, DRAWS)
    assert len(cells) >= 10, cells  # enough cells for the test to have power
    p = _chi2_p(res["draws"], cells)
    print(f"chi-square p = {p:.3f} over {len(cells) + 1} cells; vLLM started in {res['startup_s']} s")
    assert p >= 0.01, f"sampled drafts through vLLM changed the output distribution: chi-square p = {p:.2e}"
    p_bad = _chi2_p(res["draws_mutant"], _exact_cells(os.fspath(DEFAULT_MODEL), PROMPT, MUTANT_DRAWS))
    print(f"mutant: chi-square p = {p_bad:.2e}")
    assert p_bad < 0.01 and not np.isnan(p_bad), f"the greedy-drafting mutant passed: chi-square p = {p_bad:.3f}"
