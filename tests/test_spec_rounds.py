"""What the reference engine's rounds carry, and when it works: each request's rows reach the drafter
contiguously from its prompt's last W positions on, and requests that join while a round is in flight
are prefilled between that round's `begin` and `finish` (the engine's work while the drafter works)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dspark_proxy.spec.drafts import Drafts, Finalised, NoDrafts  # noqa: E402
from dspark_proxy.spec.engine import Request, SpecEngine, _merge  # noqa: E402
from dspark_proxy.spec.run import DEFAULT_HEAD, DEFAULT_MODEL, held_out_prompts, open_engine  # noqa: E402

pytestmark = pytest.mark.timeout(240)
N, W = 5, 16


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return open_engine(DEFAULT_MODEL, DEFAULT_HEAD, max_batch=3, max_len=120)


class Recorder(NoDrafts):
    """Target-only drafts; logs every round it is given and when `begin` and `finish` come."""

    def __init__(self, log: list) -> None:
        super().__init__(N)
        self.log = log
        self.rounds: list[Finalised] = []

    def begin(self, f: Finalised):
        self.rounds.append(f)
        self.log.append("begin")
        return super().begin(f)

    def finish(self, pending) -> Drafts:
        self.log.append("finish")
        return super().finish(pending)


def _requests(tok) -> list[Request]:
    prompts = held_out_prompts(tok, 7, 40)
    plen = [40, 17, 33, 8, 25, 40, 12]
    want = [30, 12, 45, 20, 5, 38, 1]
    return [Request(i, prompts[i][:plen[i]], want[i]) for i in range(7)]


def test_rows_reach_the_drafter_contiguously_and_joiners_prefill_during_the_round(target, monkeypatch) -> None:
    log: list = []
    forward = target.forward

    def logged(slots, tokens, start, need=None):
        log.append("prefill" if int(np.max(start)) == 0 else "verify")
        return forward(slots, tokens, start, need)

    monkeypatch.setattr(target, "forward", logged)
    reqs = _requests(target.tokenizer)
    src = Recorder(log)
    st = SpecEngine(target, src, max_batch=3, window=W).run(reqs)
    monkeypatch.undo()
    ref = SpecEngine(target, NoDrafts(N), max_batch=3, window=W).run(reqs)
    for r in reqs:
        assert st.outputs[r.rid].tolist() == ref.outputs[r.rid].tolist()

    # every prefill after the first comes while a round is in flight, between its begin and finish
    first = log.index("prefill")
    assert "begin" not in log[:first]
    later = [i for i, e in enumerate(log) if e == "prefill" and i > first + 1]
    assert later, log
    for i in later:
        assert log[:i].count("begin") == log[:i].count("finish") + 1, (i, log)

    # each request's rows: its first round carries the prompt's last positions and the first verified
    # one (first_pos + valid = P + 1); every later round starts where the one before ended
    seen: dict[int, int] = {}
    uid_req: dict[int, Request] = {}
    order = iter(reqs)
    for f in src.rounds:
        assert f.rows is not None and f.rows.shape == (int(f.valid.sum()), target.row_bytes)
        assert f.rows.dtype == np.uint8  # bytes: the shim takes them without a torch call
        assert int(f.valid.max()) <= W
        for i, uid in enumerate(f.req_ids.tolist()):
            fp, v = int(f.first_pos[i]), int(f.valid[i])
            if uid not in seen:
                r = uid_req[uid] = next(order)
                P = len(r.prompt)
                assert (fp + v, v) == (P + 1, min(P + 1, W)), (r.rid, fp, v)
            else:
                assert fp == seen[uid], (uid, fp, seen[uid])
            seen[uid] = fp + v
    # request 6 wanted one token: done at its prefill, never in a round
    assert reqs[6] not in uid_req.values() and len(st.outputs[6]) == 1


def test_merge_puts_a_joiners_prompt_rows_before_its_first_verified_row() -> None:
    """Rows are labelled by position: the merged part is each request's last W positions, in order."""
    def rows(first: list[int], valid: list[int], slot_tag: list[int]) -> np.ndarray:
        return np.array([[s * 1000 + p] for f, v, s in zip(first, valid, slot_tag, strict=True)
                         for p in range(f, f + v)], dtype=np.int64)

    held = (np.array([2, 0]), np.array([20, 5]), np.array([16, 5]), np.array([4, 0]), np.array([0, 0]),
            rows([4, 0], [16, 5], [2, 0]))
    part = (np.array([1, 0, 2]), np.array([6, 6, 6]), np.array([3, 1, 1]), np.array([40, 5, 20]),
            np.array([2, 0, 0]), rows([40, 5, 20], [3, 1, 1], [1, 0, 2]))
    slots, qlen, valid, first, k, merged = _merge(held, part, W)
    assert slots.tolist() == [1, 0, 2] and k.tolist() == [2, 0, 0] and qlen.tolist() == [6, 6, 6]
    assert valid.tolist() == [3, 6, 16] and first.tolist() == [40, 0, 5]
    want = [1000 + p for p in range(40, 43)] + list(range(0, 6)) + [2000 + p for p in range(5, 21)]
    assert merged[:, 0].tolist() == want


def _merge_by_request(held, part, W: int):
    """`_merge`'s definition, one request at a time."""
    hs, _, hv, hf, _, hr = held
    slots, qlen, valid, first, k, rows = part
    at = {s: i for i, s in enumerate(hs.tolist())}
    valid, first = valid.copy(), first.copy()
    held_rows = np.split(hr, np.cumsum(hv)[:-1])
    own = np.split(rows, np.cumsum(part[2])[:-1])
    out = []
    for i, s in enumerate(slots.tolist()):
        h = at.get(s)
        if h is None:
            out.append(own[i])
            continue
        v = min(int(hv[h]) + int(valid[i]), W)
        take = v - int(valid[i])
        first[i] -= take
        out.append(np.concatenate([held_rows[h][held_rows[h].shape[0] - take:], own[i]]))
        valid[i] = v
    return slots, qlen, valid, first, k, np.concatenate(out)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_merge_is_its_request_by_request_definition(data) -> None:
    """Random parts with random joiners among them: the one gather gives the loop's rows, bytes and order."""
    n = data.draw(st.integers(1, 8))
    slots = np.array(data.draw(st.permutations(range(12)))[:n])
    valid = np.array(data.draw(st.lists(st.integers(1, N + 1), min_size=n, max_size=n)))
    joiners = [i for i in range(n) if data.draw(st.booleans())]
    hv = np.array([data.draw(st.integers(1, 40)) for _ in joiners], dtype=np.int64)
    hf = np.array([data.draw(st.integers(0, 50)) for _ in joiners], dtype=np.int64)
    first = np.array([data.draw(st.integers(0, 90)) for _ in range(n)], dtype=np.int64)
    for h, i in enumerate(joiners):
        first[i] = hf[h] + hv[h]  # a joiner's first verified row follows its prompt's
    order = data.draw(st.permutations(range(len(joiners))))  # held lists the joiners in its own order
    hs = slots[joiners][order] if joiners else np.zeros(0, dtype=np.int64)
    hv, hf = hv[order] if joiners else hv, hf[order] if joiners else hf
    hr = np.arange(int(hv.sum()), dtype=np.int64)[:, None] * np.array([[1, -1]])
    rows = 10_000 + np.arange(int(valid.sum()), dtype=np.int64)[:, None] * np.array([[1, -1]])
    held = (hs, hv + 1, hv, hf, np.zeros_like(hv), hr)
    part = (slots, valid + 1, valid, first, np.zeros(n, dtype=np.int64), rows)
    got, want = _merge(held, part, W), _merge_by_request(held, part, W)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
