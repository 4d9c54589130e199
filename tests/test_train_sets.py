"""`train_head.TrainSets`: several training sets indexed as their concatenation, without making it. A
batch is the concatenation's rows for every field, in the batch's order, whichever sets it spans."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dspark_proxy.model.train_head import TrainSets

pytestmark = pytest.mark.timeout(60)


def _set(g: torch.Generator, n: int) -> dict[str, torch.Tensor]:
    return {"toks": torch.randint(0, 100, (n, 7), generator=g), "rows": torch.randn(n, 7, 6, generator=g).to(torch.bfloat16),
            "top_ids": torch.randint(0, 100, (n, 7, 3), generator=g, dtype=torch.int32),
            "top_p": torch.rand(n, 7, 3, generator=g).to(torch.float16)}


def test_a_batch_is_the_concatenations_rows():
    g = torch.Generator().manual_seed(0)
    sets = [_set(g, n) for n in (5, 1, 9, 3)]
    whole = {k: torch.cat([d[k] for d in sets]) for k in sets[0]}
    ts = TrainSets(sets)
    assert len(ts) == 18 and torch.equal(ts.toks, whole["toks"])
    rng = np.random.default_rng(1)
    for size in (1, 4, 8, 18):
        b = torch.from_numpy(rng.permutation(18)[:size])
        got = ts.batch(b)
        for k, v in whole.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v[b]), k


def test_no_sets_is_refused():
    with pytest.raises(ValueError, match="no training sets"):
        TrainSets([])
