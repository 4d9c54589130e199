"""The vLLM proposer without a vLLM: its shapes from vLLM's config and the head manifest, every way it
declines (one log line, no drafts, the engine runs), and one step driven through a real proxy by a
stand-in model runner. tests/test_vllm_e2e.py runs it inside a real vLLM."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import numpy as np
import pytest

from dspark_proxy.model.manifest import HeadManifest, head_paths
from dspark_proxy.ops.launch import spawn_proxy
from dspark_proxy.shm.layout import State, Word
from dspark_proxy.shm.segment import LayoutParams, Segment
from engine_shim.attach import AttachState
from engine_shim.vllm import hook
from engine_shim.vllm_proposer import DSparkProposer, shapes_from_config

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(60)

HEAD = "models/stdlib-llama-head"
MAN = HeadManifest.load(head_paths(HEAD)[1])
M, MAXLEN = 4, 64
_REAL_INSTALL = hook.install


def _config(num_spec: int = MAN.num_spec, hidden: int = MAN.hidden, layers: int = 4) -> SimpleNamespace:
    hf = SimpleNamespace(hidden_size=hidden, num_hidden_layers=layers)
    return SimpleNamespace(
        model_config=SimpleNamespace(hf_config=hf, max_model_len=MAXLEN, get_vocab_size=lambda: MAN.vocab_size),
        speculative_config=SimpleNamespace(num_speculative_tokens=num_spec),
        scheduler_config=SimpleNamespace(max_num_seqs=M))


@pytest.fixture
def env(monkeypatch, seg_name):
    monkeypatch.setenv("DSPARK_PROXY", seg_name)
    monkeypatch.setenv("DSPARK_PROXY_HEAD", HEAD)
    monkeypatch.setattr(hook, "install", lambda: True)  # the hook itself: tests/test_vllm_e2e.py
    return seg_name


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_shapes_come_from_vllms_config_and_the_manifest():
    s = shapes_from_config(_config(), HEAD)
    assert (s.max_reqs, s.num_spec, s.window, s.row_bytes) == (M, MAN.num_spec, MAN.window, MAN.row_bytes)
    assert s.row_bytes == len(MAN.tap_layers) * MAN.hidden * 2 and s.tap_layers == MAN.tap_layers
    with pytest.raises(ValueError, match="num_spec=5 but vLLM's num_speculative_tokens is 3"):
        shapes_from_config(_config(num_spec=3), HEAD)
    with pytest.raises(ValueError, match="hidden_size is 256"):
        shapes_from_config(_config(hidden=256), HEAD)
    with pytest.raises(ValueError, match="the vLLM model has 2 layers"):
        shapes_from_config(_config(layers=2), HEAD)
    with pytest.raises(ValueError, match="DSPARK_PROXY_HEAD"):
        shapes_from_config(_config(), None)


@pytest.mark.parametrize("case", ["no_head", "num_spec", "untested_vllm", "proxy_shapes"])
def test_every_refusal_is_one_log_line_and_an_engine_without_drafts(case, env, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="engine_shim")
    cfg = _config()
    seg = None
    if case == "no_head":
        monkeypatch.delenv("DSPARK_PROXY_HEAD")
    elif case == "num_spec":
        cfg = _config(num_spec=3)
    elif case == "untested_vllm":
        monkeypatch.setattr(hook, "install", _untested_install)
    else:  # a running proxy with another window
        seg = Segment.create(env, LayoutParams(max_reqs=M, num_spec=MAN.num_spec, window=MAN.window * 2,
                                               row_bytes=MAN.row_bytes, max_rows=M * 32, resync_per_round=2),
                             deadline_ms=20.0)
        seg.set_word(Word.HEARTBEAT_NS, 1 << 62)
        seg.set_word(Word.STATE, State.READY)
    try:
        p = DSparkProposer(cfg)
        assert not p.active and p.shim is None
        assert p.propose([[1], [2, 3]], None, None) == [[], []]
        errs = _errors(caplog)
        assert len(errs) == 1, errs
        want = {"no_head": "DSPARK_PROXY_HEAD", "num_spec": "num_speculative_tokens is 3",
                "untested_vllm": "not one this hook was tested with", "proxy_shapes": "has other shapes"}[case]
        assert want in errs[0] and "without drafts" in errs[0]
    finally:
        if seg is not None:
            seg.unlink()
            seg.close()


def _untested_install() -> bool:
    """hook.install as it runs on a vLLM it was not tested with (the module's own state untouched)."""
    saved = dict(hook._state)
    hook._state["installed"] = None
    try:
        return _REAL_INSTALL(version="0.31.9")
    finally:
        why = hook._state.get("why")
        hook._state.clear()
        hook._state.update(saved)
        hook._state["why"] = why


def test_an_untested_vllm_version_is_not_hooked():
    saved = dict(hook._state)
    hook._state["installed"] = None
    try:
        assert _REAL_INSTALL(version="0.33.0") is False
        assert "0.33.0 is not one this hook was tested with" in hook.why_not()
    finally:
        hook._state.clear()
        hook._state.update(saved)


class _Runner:
    """The parts of vLLM's model runner the proposer reads (engine_shim/vllm/hook.py hands it the runner)."""

    def __init__(self) -> None:
        self.use_aux_hidden_state_outputs = False
        self.layers = None
        self.model = SimpleNamespace(set_aux_hidden_state_layers=self._set)
        self.input_batch = SimpleNamespace(req_ids=[], num_computed_tokens_cpu=np.zeros(M, np.int32),
                                           num_tokens_no_spec=np.zeros(M, np.int32),
                                           token_ids_cpu=np.zeros((M, MAXLEN), np.int32))
        self.requests: dict[str, SimpleNamespace] = {}  # vLLM's per-request state (prompt, sampling params)

    def _set(self, layers) -> None:
        self.layers = layers


def _step(p: DSparkProposer, runner: _Runner, reqs: list[tuple[str, int, int, list[int]]], finished=()):
    """One step: per request (id, positions computed before, tokens computed now, tokens kept)."""
    ib = runner.input_batch
    ib.req_ids = [r[0] for r in reqs]
    q = [r[2] for r in reqs]
    T = sum(q)
    aux = [torch.randn(T + 3, MAN.hidden) for _ in sorted(set(MAN.tap_layers))]  # padded like vLLM's
    for i, (_, c0, qi, kept) in enumerate(reqs):
        ib.num_computed_tokens_cpu[i] = c0
        ib.token_ids_cpu[i, c0 + qi - 1 + (1 if kept else 0)] = 7 + i
        ib.num_tokens_no_spec[i] = c0 + qi + (1 if kept else 0)
    so = SimpleNamespace(finished_req_ids=set(finished), preempted_req_ids=None)
    cam = SimpleNamespace(query_start_loc_cpu=torch.tensor(np.concatenate([[0], np.cumsum(q)]), dtype=torch.int32))
    out = p.step(runner, so, [r[3] for r in reqs], aux, None, cam)
    return out, aux


def _null_proxy(name: str):
    return spawn_proxy(name, "null", "--max-reqs", str(M), "--num-spec", str(MAN.num_spec), "--window",
                       str(MAN.window), "--row-bytes", str(MAN.row_bytes), "--deadline-ms", "200", "--log-every", "0")


def _bound(p: DSparkProposer) -> _Runner:
    """A runner bound to the proposer, once its shim has found the proxy."""
    assert p.active and p.shim is not None
    runner = _Runner()
    p.bind(runner)
    assert runner.use_aux_hidden_state_outputs and runner.layers == tuple(MAN.tap_layers) and p.bound
    end = time.monotonic() + 5
    while p.shim.state is AttachState.DETACHED and time.monotonic() < end:
        time.sleep(0.01)
    return runner


def test_a_step_through_a_real_proxy(env):
    proxy = _null_proxy(env)
    p = None
    try:
        p = DSparkProposer(_config())
        runner = _bound(p)
        # a prompt of 5 whose first token was sampled, and a request at the length limit
        out, aux = _step(p, runner, [("a", 0, 5, [11]), ("b", MAXLEN - 2, 1, [12])])
        assert out == [[1] * MAN.num_spec, []]  # the null worker's drafts; none where no draft fits
        assert p.shim.stats()["counters"].get("replies_ok") == 1
        # the rows are the aux states of the finalised positions, tapped layers in manifest order, bf16
        held = sorted(set(MAN.tap_layers))
        want = torch.cat([aux[held.index(i)][:5] for i in MAN.tap_layers], dim=1).to(torch.bfloat16)
        slot = int(p.slots.slots_for(["a"])[0])
        got = torch.from_numpy(p.shim.ring.window_rows(slot, 0, 5).copy()).view(torch.bfloat16)
        assert torch.equal(got, want)
        # "a" finished: its slot is free for the next request, under a new owner
        out, _ = _step(p, runner, [("c", 0, 3, [13])], finished={"a", "b"})
        assert int(p.slots.slots_for(["c"])[0]) in (0, 1) and len(p.slots) == 1
        assert out == [[1] * MAN.num_spec]
    finally:
        if p is not None:
            p.close()
        proxy.stop()


def test_no_draft_past_a_requests_max_tokens(env):
    """vLLM stops a request at prompt + max_tokens: no draft once it is there, and no more drafts than
    it may still produce (vLLM would verify them and throw the tokens away)."""
    proxy = _null_proxy(env)
    p = None
    try:
        p = DSparkProposer(_config())
        runner = _bound(p)

        def req(max_tokens):
            return SimpleNamespace(num_prompt_tokens=5, sampling_params=SimpleNamespace(max_tokens=max_tokens))

        # prompts of 5, first token sampled (6 known): max_tokens 1 is done, 3 has room for 1 draft + the
        # bonus token, 50 for all N; a request vLLM gives no sampling parameters is bounded by max_model_len
        runner.requests = {"a": req(1), "b": req(3), "c": req(50), "d": SimpleNamespace(sampling_params=None)}
        out, _ = _step(p, runner, [(r, 0, 5, [11]) for r in "abcd"])
        assert out == [[], [1], [1] * MAN.num_spec, [1] * MAN.num_spec]
        assert p.shim.stats()["counters"].get("replies_ok") == 1
    finally:
        if p is not None:
            p.close()
        proxy.stop()


@pytest.mark.parametrize(("threads", "mine", "machine", "warns"), [(2, 2, 2, True), (1, 2, 2, False),
                                                                    (1, 1, 2, False), (4, 4, 4, True)])
def test_a_forward_on_every_core_is_one_warning(threads, mine, machine, warns, monkeypatch, caplog):
    """vLLM's OpenMP team on every core of the machine leaves the proxy none (docs/vllm.md); vLLM pinned
    to part of the machine (its multi-process mode on 2 CPUs: the engine core on 1) leaves the rest."""
    from engine_shim.vllm import proposer

    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr(proposer.os, "sched_getaffinity", lambda _pid: set(range(mine)))
    monkeypatch.setattr(proposer.os, "cpu_count", lambda: machine)
    caplog.set_level(logging.WARNING, logger="engine_shim")
    proposer._check_cores()
    got = [r.getMessage() for r in caplog.records if "leaving none to the proxy" in r.getMessage()]
    assert len(got) == (1 if warns else 0), got


def _dspark_ckpt(tmp_path, **kw):
    """A speculators-format DSpark checkpoint for the shipped target (random weights, saved by the
    reference's own save_pretrained)."""
    pytest.importorskip("speculators")
    from transformers import AutoConfig

    from dspark_proxy.model.dspark_head import build_dspark

    cfg = AutoConfig.from_pretrained("models/stdlib-llama", local_files_only=True)
    args = dict(verifier_path="models/stdlib-llama", layers=[1, 2, 4], num_spec=MAN.num_spec, window=MAN.window)
    build_dspark(cfg, **{**args, **kw}).save_pretrained(str(tmp_path / "ck"))
    return str(tmp_path / "ck")


def test_a_dspark_checkpoint_sets_the_tap_and_shapes(tmp_path):
    """DSPARK_PROXY_HEAD may name a DSpark checkpoint: its aux_hidden_state_layer_ids are the layers vLLM
    is asked for (vLLM's auxiliary ids, one more than its DSpark model's target_layer_ids), its
    sliding_window the window and its block the drafts."""
    ck = _dspark_ckpt(tmp_path, layers=[0, 2, 4])
    s = shapes_from_config(_config(), ck)
    assert s.tap_layers == [0, 2, 4] and (s.window, s.num_spec, s.row_dtype) == (MAN.window, MAN.num_spec, "bfloat16")
    assert s.row_bytes == 3 * MAN.hidden * 2
    with pytest.raises(ValueError, match="the vLLM model has 3 layers"):
        shapes_from_config(_config(layers=3), ck)


def test_a_target_without_auxiliary_hidden_states_is_one_log_line(env, caplog):
    """GPT-2 in vLLM gives no auxiliary hidden states: the proposer declines in one line."""
    caplog.set_level(logging.INFO, logger="engine_shim")
    cfg = _config()
    cfg.model_config.architectures = ["GPT2LMHeadModel"]
    cfg.model_config.model_impl, cfg.model_config.convert_type = "auto", "none"
    cfg.model_config.runner_type = "generate"
    p = DSparkProposer(cfg)
    assert not p.active and p.shim is None
    errs = _errors(caplog)
    assert len(errs) == 1 and "GPT2LMHeadModel gives no auxiliary hidden states" in errs[0], errs
