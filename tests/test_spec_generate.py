"""The reference engine (`dspark-proxy generate`): greedy speculative decoding through a real proxy and
worker gives target-only greedy output token for token, with requests joining and leaving."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import engine_shim  # noqa: E402
from dspark_proxy.model.hf import greedy_generate  # noqa: E402
from dspark_proxy.spec.drafts import NgramDrafts, NoDrafts, ShimDrafts  # noqa: E402
from dspark_proxy.spec.engine import Request, SpecEngine  # noqa: E402
from dspark_proxy.spec.run import DEFAULT_HEAD, DEFAULT_MODEL, held_out_prompts, open_engine  # noqa: E402
from dspark_proxy.spec.system import SpecSystem  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return open_engine(DEFAULT_MODEL, DEFAULT_HEAD, max_batch=3, max_len=120)


def _requests(tok) -> list[Request]:
    """Seven requests of different prompt lengths and lengths wanted, three slots: they join as others
    leave, at different steps."""
    prompts = held_out_prompts(tok, 7, 40)
    plen = [40, 17, 33, 8, 25, 40, 12]
    want = [30, 12, 45, 20, 5, 38, 1]
    return [Request(i, prompts[i][:plen[i]], want[i]) for i in range(7)]


def test_engine_target_only_is_hf_greedy(target) -> None:
    """The engine's cache and batched forward decode exactly as HF's own generate loop."""
    prompts = held_out_prompts(target.tokenizer, 3, 24)
    ref = greedy_generate(target.model, torch.from_numpy(np.stack(prompts)), 20)[:, 24:].numpy()
    st = SpecEngine(target, NoDrafts(5), max_batch=3, window=16).run([Request(i, p, 20) for i, p in enumerate(prompts)])
    for i in range(3):
        assert st.outputs[i].tolist() == ref[i].tolist()
    assert st.request_forwards == st.tokens  # one forward per token without drafts


def test_greedy_through_proxy_and_worker_is_target_only(target) -> None:
    reqs = _requests(target.tokenizer)
    ref = SpecEngine(target, NoDrafts(5), max_batch=3, window=16).run(reqs)
    ng = SpecEngine(target, NgramDrafts(5), max_batch=3, window=16).run(reqs)
    with SpecSystem(f"spec-test-{os.getpid()}", DEFAULT_HEAD, max_reqs=3, deadline_ms=200) as sysm:
        shim = engine_shim.attach(sysm.name, max_reqs=3, num_spec=5, window=16, row_bytes=1152, timeout_s=10.0)
        try:
            src = ShimDrafts(shim)
            st = SpecEngine(target, src, max_batch=3, window=16).run(reqs)
        finally:
            shim.close()
    for r in reqs:
        assert st.outputs[r.rid].tolist() == ref.outputs[r.rid].tolist(), f"request {r.rid} differs"
        assert ng.outputs[r.rid].tolist() == ref.outputs[r.rid].tolist(), f"request {r.rid} (n-gram) differs"
        assert len(st.outputs[r.rid]) == r.max_new
    assert src.statuses.get("ok", 0) > 0, src.statuses
    # the drafts were used, not just survived: the shipped head accepts about half of them
    assert st.drafted_rounds > 0 and st.mean_accepted > 1.0, (st.drafted_rounds, st.mean_accepted)
    assert st.request_forwards < 0.6 * ref.request_forwards
