"""`python -m dspark_proxy.bench.head`: the head's round beside a target step, for either kind of head
(a figure, not a timed assertion: this only checks that each head is served and measured)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from dspark_proxy.bench.head import bench_head  # noqa: E402

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("head", ["stdlib-llama-head", "stdlib-llama-dspark"])
def test_each_shipped_head_is_measured_beside_the_target(head, monkeypatch):
    monkeypatch.chdir(ROOT)  # the DSpark checkpoint names its verifier relative to the repository
    r = bench_head(ROOT / "models" / "stdlib-llama", ROOT / "models" / head, ns=(1, 3), rounds=6)
    assert r["num_spec"] == 5 and r["window"] == 16
    for n in ("1", "3"):
        got = r["by_requests"][n]
        assert got["head_ms"] > 0 and got["target_step_ms"] > 0
        assert got["ratio"] == pytest.approx(got["head_ms"] / got["target_step_ms"], rel=0.01, abs=0.002)
