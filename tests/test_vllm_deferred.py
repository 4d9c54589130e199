"""The proposer's step in two halves (docs/vllm.md, "A vLLM step as a round"): `begin` enqueues and
returns at once, `finish` reads the reply where vLLM reads the drafts, so the proxy's round runs while
vLLM does its own bookkeeping. Driven by the stand-in runner of test_vllm_proposer.py through a real
proxy, and through engine_shim/vllm/hook.py's wrappers on a stand-in runner class (no vLLM needed)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from unittest import mock

import pytest

from dspark_proxy.ops.launch import spawn_proxy
from engine_shim.attach import AttachState
from engine_shim.vllm import hook
from engine_shim.vllm_proposer import DSparkProposer
from tests.test_vllm_proposer import MAN, MAXLEN, M, _config, _Runner, _step, env  # noqa: F401 - env is a fixture

pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def proposer(env):  # noqa: F811 - the fixture imported above
    proxy = spawn_proxy(env, "null", "--max-reqs", str(M), "--num-spec", str(MAN.num_spec), "--window",
                        str(MAN.window), "--row-bytes", str(MAN.row_bytes), "--deadline-ms", "200", "--log-every", "0")
    p = None
    try:
        p = DSparkProposer(_config())
        runner = _Runner()
        p.bind(runner)
        end = time.monotonic() + 5
        while p.shim.state is AttachState.DETACHED and time.monotonic() < end:
            time.sleep(0.01)
        yield p, runner
    finally:
        if p is not None:
            p.close()
        proxy.stop()


def _begin(p: DSparkProposer, runner: _Runner, reqs) -> list:
    """_step's inputs, through `begin` instead of `step`."""
    step = p.step
    p.step = p.begin  # type: ignore[method-assign]
    try:
        return _step(p, runner, reqs)[0]
    finally:
        p.step = step  # type: ignore[method-assign]


def test_begin_returns_at_once_and_finish_gives_the_drafts(proposer):
    p, runner = proposer
    assert not p.pending and p.finish() == []
    assert _begin(p, runner, [("a", 0, 5, [11]), ("b", MAXLEN - 2, 1, [12])]) == [[], []]
    assert p.pending
    assert p.finish() == [[1] * MAN.num_spec, []]  # the null worker's drafts; none where no draft fits
    assert not p.pending and p.finish() == []
    assert p.shim.stats()["counters"].get("replies_ok") == 1


def test_a_round_never_read_is_dropped_at_the_next_step(proposer):
    """vLLM did not read a step's drafts: the next step reads and drops that round first (the shim takes
    no enqueue before the last read_reply), and its own drafts come as usual."""
    p, runner = proposer
    _begin(p, runner, [("a", 0, 5, [11])])
    _begin(p, runner, [("a", 5, 1, [13])])
    assert p.finish() == [[1] * MAN.num_spec]
    c = p.shim.stats()["counters"]
    assert c.get("replies_ok") == 2 and p._errors == 0 and not c.get("rounds_rejected")


def test_close_reads_a_pending_round(proposer):
    p, runner = proposer
    _begin(p, runner, [("a", 0, 5, [11])])
    p.close()
    assert not p.pending and p.shim.stats()["counters"].get("replies_ok") == 1


class _FakeRunner:
    """The five methods hook.py wraps, as vLLM's runner has them (their bodies record the calls)."""

    speculative_config = "spec"
    model_config = SimpleNamespace(is_hybrid=False)

    def __init__(self, drafter) -> None:
        self.drafter, self.calls, self._draft_token_ids = drafter, [], None

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        self.calls.append(("prepare", self.speculative_config))  # vLLM's spec path iff it sees a config
        return "logits_indices", None, 1

    def _setup_eagle3_aux_hidden_state_outputs(self) -> None:
        self.calls.append("setup")

    def propose_draft_token_ids(self, *args) -> list:
        self.calls.append("propose")
        return [[5]]

    def _input_fits_in_drafter(self, cam) -> bool:
        return False

    def _get_draft_token_ids_cpu(self):
        return self._draft_token_ids, ["r"]


@pytest.mark.parametrize("deferred", [True, False])
def test_the_hook_reads_the_reply_where_vllm_reads_the_drafts(deferred):
    """hook.py's wrappers: propose begins the round (the drafter's placeholder goes to vLLM), and vLLM's
    read of the drafts finishes it; with DSPARK_PROXY_VLLM_DEFER=0 propose does the whole step."""
    done: list[str] = []
    d = DSparkProposer.__new__(DSparkProposer)
    d.active = d.bound = True
    d.deferred = deferred
    d._pending = None
    d.begin = lambda *a: (done.append("begin"), setattr(d, "_pending", 1), [[]])[-1]
    d.finish = lambda: (done.append("finish"), setattr(d, "_pending", None), [[7, 8]])[-1]
    d.step = lambda *a: (done.append("step"), [[7, 8]])[-1]
    cls = type("Runner", (_FakeRunner,), {})
    hook._wrap(cls)
    r = cls(d)
    r._draft_token_ids = r.propose_draft_token_ids(*([None] * 9))
    assert r._draft_token_ids == ([[]] if deferred else [[7, 8]])
    assert r._get_draft_token_ids_cpu() == ([[7, 8]], ["r"])
    assert r._get_draft_token_ids_cpu() == ([[7, 8]], ["r"])  # finished once
    assert done == (["begin", "finish"] if deferred else ["step"])
    assert r._input_fits_in_drafter(SimpleNamespace()) and "propose" not in r.calls


def _ours_runner(hybrid: bool = False):
    d = DSparkProposer.__new__(DSparkProposer)
    d.active = d.bound = True
    cls = type("Runner", (_FakeRunner,), {"model_config": SimpleNamespace(is_hybrid=hybrid)})
    hook._wrap(cls)
    return cls(d)


def test_a_step_without_drafts_takes_vllms_path_without_speculation():
    """No request of the step has drafts: `_prepare_inputs` sees no speculative config (vLLM's plain
    sampler, no spec-decode metadata), and the runner has its config back afterwards."""
    r = _ours_runner()
    assert r._prepare_inputs(SimpleNamespace(scheduled_spec_decode_tokens={}), None) == ("logits_indices", None, 1)
    assert r.calls == [("prepare", None)] and r.speculative_config == "spec"


def test_a_step_with_drafts_a_hybrid_model_and_a_foreign_drafter_keep_the_speculative_path():
    with_drafts = SimpleNamespace(scheduled_spec_decode_tokens={"r": [5, 6]})
    none = SimpleNamespace(scheduled_spec_decode_tokens={})
    r = _ours_runner()
    r._prepare_inputs(with_drafts, None)
    hybrid = _ours_runner(hybrid=True)  # its recurrent state is shifted by the speculative path, drafts or not
    hybrid._prepare_inputs(none, None)
    cls = type("Runner", (_FakeRunner,), {})
    hook._wrap(cls)
    foreign = cls(mock.MagicMock())  # not ours: vLLM's own methods, untouched
    foreign._prepare_inputs(none, None)
    assert r.calls == hybrid.calls == foreign.calls == [("prepare", "spec")]


def test_the_config_comes_back_when_vllms_prepare_raises():
    def boom(self, so, n):
        raise RuntimeError("vLLM failed")

    d = _ours_runner().drafter
    cls = type("Runner", (_FakeRunner,), {"_prepare_inputs": boom})
    hook._wrap(cls)
    r = cls(d)
    with pytest.raises(RuntimeError):
        r._prepare_inputs(SimpleNamespace(scheduled_spec_decode_tokens={}), None)
    assert r.speculative_config == "spec"
