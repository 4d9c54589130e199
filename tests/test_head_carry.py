"""The carry head and the 2-hop backbone (manifest format /2, `step="carry"`, `hops=2`): versioned so
old heads load unchanged and a mixed-up manifest is refused naming the field; a markov 1-hop head starts
a carry 2-hop head as the same function; the worker's sampled path threads the carry as greedy does."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from dspark_proxy.model.head import DraftHead  # noqa: E402
from dspark_proxy.model.head_runner import HeadRunner  # noqa: E402
from dspark_proxy.model.manifest import HeadManifest  # noqa: E402
from dspark_proxy.model.train_head import load_head, save_head  # noqa: E402

pytestmark = pytest.mark.timeout(60)

W, N, V, D, RB = 8, 4, 64, 32, 64


def _saved(tmp_path, step, name="h", hops=1):
    torch.manual_seed(3)
    head = DraftHead(n_taps=2, hidden=8, window=W, num_spec=N, vocab=V, d_model=D, n_heads=4, step=step, hops=hops)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape) * 0.5)
    man = HeadManifest(target_id="sha256:t", target_name="t", tap_layers=[0, 1], tap_point="p", hidden=8,
                       row_dtype="float32", window=W, num_spec=N, vocab_size=V, d_model=D, n_heads=4, step=step,
                       hops=hops)
    d = tmp_path / name
    d.mkdir()
    save_head(head, d, man)
    return d, head


def _batch(seed=0, B=9):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, W, 3 * D)).astype(np.float32), rng.integers(1, W + 1, B),
            rng.integers(0, V, B))


def test_a_markov_head_is_saved_as_format_1_and_a_carry_head_as_2(tmp_path):
    old, _ = _saved(tmp_path, "markov", "old")
    raw = json.loads((old / "manifest.json").read_text())
    assert raw["format"] == "dspark-head/1" and "step" not in raw and "hops" not in raw  # an older reader's
    new, head = _saved(tmp_path, "carry", "new", hops=2)
    raw = json.loads((new / "manifest.json").read_text())
    assert raw["format"] == "dspark-head/2" and (raw["step"], raw["hops"]) == ("carry", 2)
    back, man = load_head(new)
    assert man.step == back.step == "carry" and torch.equal(back.carry.weight, head.carry.weight.bfloat16().float())
    assert man.hops == back.hops == 2 and torch.equal(back.o2.weight, head.o2.weight.bfloat16().float())


@pytest.mark.parametrize("edit, match", [
    ({"format": "dspark-head/1", "step": "carry"}, "step='carry'"),
    ({"format": "dspark-head/3"}, "format 'dspark-head/3'"),
    ({"step": "lstm"}, "step='lstm'"),
    ({"format": "dspark-head/1", "step": "markov", "hops": 2}, "hops=2"),
    ({"hops": 3}, "hops=3"),
])
def test_a_manifest_that_does_not_add_up_is_refused(tmp_path, edit, match):
    d, _ = _saved(tmp_path, "carry")
    raw = json.loads((d / "manifest.json").read_text()) | edit
    (d / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=match):
        HeadManifest.load(d / "manifest.json")


@pytest.mark.parametrize("step, hops", [("carry", 1), ("markov", 2), ("carry", 2)])
def test_a_markov_head_starts_a_richer_head_as_the_same_function(tmp_path, step, hops):
    d, _ = _saved(tmp_path, "markov")
    markov, _ = load_head(d)
    richer, _ = load_head(d, step, hops)
    assert (richer.step, richer.hops) == (step, hops)
    win, lens, anchor = _batch()
    a, b = HeadRunner(markov).greedy(win, lens, anchor, N), HeadRunner(richer).greedy(win, lens, anchor, N)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_head_starts_one_of_a_longer_window_as_the_same_function_on_its_rows(tmp_path):
    """`train-drafter --init --window 2W`: on windows the old head could see (the rows beyond it
    absent), the longer head drafts exactly what the old one drafts; the new distances start with the
    farthest old one's offsets."""
    d, _ = _saved(tmp_path, "carry")
    old, _ = load_head(d)
    longer, _ = load_head(d, window=2 * W)
    assert longer.window == 2 * W
    assert torch.equal(longer.pos.weight[W:], old.pos.weight[-1:].expand(W, -1))
    win, lens, anchor = _batch(5)
    wide = np.concatenate([np.zeros_like(win), win], axis=1)  # right-aligned: the old W rows last
    a = HeadRunner(old).greedy(win, lens, anchor, N)
    b = HeadRunner(longer).greedy(wide, lens, anchor, N)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    with pytest.raises(ValueError, match=f"a head of window {W} cannot start one of window {W - 1}"):
        load_head(d, window=W - 1)


def test_a_richer_head_does_not_start_a_poorer_one(tmp_path):
    c, _ = _saved(tmp_path, "carry", "c", hops=2)
    with pytest.raises(ValueError, match="a carry 2-hop head cannot start a markov 2-hop head"):
        load_head(c, "markov")
    with pytest.raises(ValueError, match="a carry 2-hop head cannot start a carry 1-hop head"):
        load_head(c, None, 1)


def test_the_carry_changes_the_later_drafts_only():
    """Position 0 has no step before it; the others see the carry (else it is not wired in)."""
    torch.manual_seed(1)
    head = DraftHead(n_taps=2, hidden=8, window=W, num_spec=N, vocab=V, d_model=D, n_heads=4, step="carry")
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape) * 0.5)
    win, lens, anchor = _batch(2, 64)
    with_c = HeadRunner(head).greedy(win, lens, anchor, N)
    with torch.no_grad():
        head.carry.weight.zero_()
    without = HeadRunner(head).greedy(win, lens, anchor, N)
    assert np.array_equal(with_c[1][:, 0], without[1][:, 0])
    assert not np.array_equal(with_c[1][:, 1:], without[1][:, 1:])


def test_sampled_mode_threads_the_carry_as_greedy_does(tmp_path):
    """A greedy request batched with sampled ones drafts what `greedy` drafts, confidences too."""
    import dspark_proxy.wire as wire
    from dspark_proxy.worker import DraftItem, make_drafter

    d, _ = _saved(tmp_path, "carry")
    dr = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, weights=str(d))
    rng = np.random.default_rng(4)
    items = []
    for i in range(3):
        rows = rng.standard_normal((W, RB // 4)).astype(np.float32)
        items.append(DraftItem(i, int(rng.integers(0, V)), 50 + i, W, 0, [rows.view(np.uint8)], seed=i,
                               temperature=0.0 if i == 1 else 0.8))
    out = wire.ReplyWriter(3, N, wire.SF_SAMPLED | wire.SF_WANT_MARGIN)
    dr.draft(items, out)
    assert out.sampled_mask.tolist() == [1, 0, 1]
    proj = dr.runner.project(np.concatenate(items[1].segments).view(np.float32))
    ids, conf, marg = dr.runner.greedy(proj[None], np.array([W]), np.array([items[1].anchor_token]), N)
    assert np.array_equal(out.draft_ids[1], ids[0]) and np.array_equal(out.confidence[1], conf[0])
    assert np.array_equal(out.margin[1], marg[0])
