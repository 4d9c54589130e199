"""The vLLM step -> enqueue mapping (engine_shim/vllm/step.py), without vLLM: a hand-checked step, a
property test against a per-request reference, the slot table, and the drafts handed back to vLLM."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_shim.vllm.step import NO_LIMIT, SlotMap, clip_drafts, plan_step

W, N, MAXLEN = 4, 3, 64


def _tokens(n: int) -> np.ndarray:
    return (np.arange(n * MAXLEN, dtype=np.int32).reshape(n, MAXLEN) % 1000) + 7


def test_a_mixed_step_by_hand():
    # request 0: decode, anchor at 10, 3 drafts verified, 2 accepted (vLLM kept 3 tokens)
    # request 1: a middle prefill chunk of 6 (positions 4..9), nothing sampled
    # request 2: the prompt's last chunk of 2 (positions 8, 9), one token sampled
    # request 3: decode without drafts, at the length limit after this step
    q = np.array([4, 6, 2, 1])
    qsl = np.concatenate([[0], np.cumsum(q)])
    c0 = np.array([10, 4, 8, MAXLEN - 2])
    d = np.array([3, 0, 0, 0])
    ns = np.array([3, 0, 1, 1])
    n_tokens = np.array([10 + 3 + 1, 20, 11, MAXLEN])
    tok = _tokens(4)
    p = plan_step(slots=np.array([5, 1, 2, 0]), owners=np.array([50, 10, 20, 0]), qsl=qsl, c0=c0, d=d,
                  n_sampled=ns, n_tokens=n_tokens, token_ids=tok, window=W, num_spec=N, max_model_len=MAXLEN)
    assert p.valid.tolist() == [3, 4, 2, 1]  # finalised 3 (anchor + 2 accepted), 6 -> last 4, 2, 1
    assert p.first_pos.tolist() == [10, 6, 8, MAXLEN - 2]
    assert p.first_pos.tolist() == (c0 + [3, 6, 2, 1] - p.valid).tolist()
    anchor_pos = p.first_pos + p.valid
    assert p.anchor.tolist() == tok[np.arange(4), anchor_pos].tolist()
    assert p.need_draft.tolist() == [True, False, True, False]  # nothing sampled / no room
    assert p.max_drafts.tolist() == [N, N, N, 0]
    assert p.k_window.tolist() == [3, 0, 0, 0]
    # rows: request 0 tokens 0..2 of its span, request 1 the last 4 of 4..9, request 2 both, request 3 one
    assert p.row_index.tolist() == [0, 1, 2, 6, 7, 8, 9, 10, 11, 12]
    assert p.consistent.all()


def _reference(q, c0, d, ns, n_tokens, tok, slots, limit):
    """The mapping one request at a time, as docs/vllm.md states it."""
    out = []
    start = 0
    for i in range(len(q)):
        end = min(MAXLEN, limit[i])
        # kept tokens past the first are accepted drafts; unverified drafts are never final
        fin = q[i] - d[i] + (ns[i] - 1 if ns[i] > 0 else 0)
        fin = min(max(fin, 0), q[i])
        c1 = c0[i] + fin
        valid = min(fin, W)
        rows = list(range(start + fin - valid, start + fin))
        room = min(end - n_tokens[i] - 1, N)  # prompt + generated + drafts + the bonus token <= end
        need = ns[i] > 0 and c1 == n_tokens[i] - 1 and room > 0 and slots[i] >= 0
        out.append((valid, c1 - valid, int(tok[i, min(c1, MAXLEN - 1)]), need, rows, max(room, 0)))
        start += q[i]
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(0, 40), st.integers(0, N), st.integers(0, N + 1),
                          st.integers(-2, N + 2)), min_size=0, max_size=8), st.booleans())
def test_matches_the_per_request_reference(reqs, limited):
    n = len(reqs)
    q = np.array([r[0] for r in reqs], dtype=np.int64)
    c0 = np.array([r[1] for r in reqs], dtype=np.int64)
    d = np.minimum(np.array([r[2] for r in reqs], dtype=np.int64), np.maximum(q - 1, 0))
    ns = np.minimum(np.array([r[3] for r in reqs], dtype=np.int64), d + 1)
    fin = np.where(ns > 0, ns - 1 + q - d, q - d)
    n_tokens = np.where(ns > 0, c0 + fin + 1, c0 + q + 5)
    tok = _tokens(max(n, 1))
    # each request's own end (prompt + max_tokens) near its token count, or none (max_model_len alone)
    limit = n_tokens + np.array([r[4] for r in reqs], dtype=np.int64) if limited else np.full(n, NO_LIMIT)
    slots = np.arange(n, dtype=np.int64)
    qsl = np.concatenate([[0], np.cumsum(q)]).astype(np.int64)
    p = plan_step(slots=slots, owners=slots, qsl=qsl, c0=c0, d=d, n_sampled=ns, n_tokens=n_tokens,
                  token_ids=tok, window=W, num_spec=N, max_model_len=MAXLEN, limit=limit)
    ref = _reference(q, c0, d, ns, n_tokens, tok, slots, limit)
    assert p.valid.tolist() == [r[0] for r in ref]
    assert p.first_pos.tolist() == [r[1] for r in ref]
    assert p.anchor.tolist() == [r[2] for r in ref]
    assert p.need_draft.tolist() == [r[3] for r in ref]
    assert p.row_index.tolist() == [i for r in ref for i in r[4]]
    assert p.max_drafts.tolist() == [r[5] for r in ref]


def test_no_draft_at_the_requests_own_length_limit():
    """A request with max_tokens stops at prompt + max_tokens, well before max_model_len: no draft
    once it is there, and never more drafts than the tokens it may still produce (a step appends
    the accepted drafts and one more token)."""
    c0 = np.array([10, 10, 10, 10])  # four decodes of position 10, sampling the token at 11: 12 known
    p = plan_step(slots=np.arange(4), owners=np.arange(4), qsl=np.arange(5), c0=c0, d=np.zeros(4, np.int64),
                  n_sampled=np.ones(4, np.int64), n_tokens=c0 + 2, token_ids=_tokens(4), window=W, num_spec=N,
                  max_model_len=MAXLEN, limit=np.array([12, 13, 14, NO_LIMIT]))
    assert p.need_draft.tolist() == [False, False, True, True]
    assert p.max_drafts.tolist() == [0, 0, 1, N]
    # the drafts handed to vLLM are cut there: prompt + generated + drafts never passes the end
    ids = np.full((4, N), 5, dtype=np.int32)
    assert clip_drafts(ids, np.full(4, N), p.need_draft, p.max_drafts, 4096) == [[], [], [5], [5] * N]


def test_an_inconsistent_count_gets_no_draft():
    p = plan_step(slots=np.array([0]), owners=np.array([0]), qsl=np.array([0, 1]), c0=np.array([9]),
                  d=np.array([0]), n_sampled=np.array([1]), n_tokens=np.array([30]), token_ids=_tokens(1),
                  window=W, num_spec=N, max_model_len=MAXLEN)
    assert not p.consistent[0] and not p.need_draft[0]


def test_slots_are_stable_freed_and_reowned():
    m = SlotMap(3)
    a = m.slots_for(["a", "b"])
    assert sorted(a.tolist()) == [0, 1]
    assert m.slots_for(["b", "a"]).tolist() == a[::-1].tolist()  # vLLM reorders its batch: slots stay
    owner_a = int(m.owner[a[0]])
    m.release({"a"})
    c = m.slots_for(["b", "c", "a"])  # "a" comes back (a preempted request): a new owner id
    assert c[0] == a[1] and len(set(c.tolist())) == 3
    assert int(m.owner[c[2]]) != owner_a
    m.release(None)
    m.release(["nobody"])
    assert len(m) == 3


def test_limits_are_read_at_admission_and_on_a_resend():
    seen = []

    def limit_of(r):
        seen.append(r)
        return {"a": 20, "b": 30}.get(r, 40)

    m = SlotMap(3)
    s = m.slots_for(["a", "b"], limit_of)
    assert m.limit[s].tolist() == [20, 30] and seen == ["a", "b"]
    m.slots_for(["a", "b"], limit_of)
    assert seen == ["a", "b"]  # a held request is not read again at every step
    m.refresh(["b", "nobody"], lambda r: 35)  # vLLM re-sent "b" (a streaming request's new prompt)
    assert m.limit[s].tolist() == [20, 35]
    m.release(["a"])
    c = m.slots_for(["c"])  # no limit_of: max_model_len alone
    assert m.limit[c].tolist() == [NO_LIMIT]


def test_a_full_table_reclaims_requests_not_running_and_never_overflows():
    m = SlotMap(2)
    m.slots_for(["a", "b"])
    got = m.slots_for(["c"])  # vLLM never said a and b finished: they are not running, so reclaimed
    assert got.tolist()[0] in (0, 1)
    assert m.slots_for(["c", "d", "e"]).tolist().count(-1) == 1  # more running than slots: one gets none


def test_drafts_for_vllm_never_hold_placeholders_or_ids_outside_the_vocabulary():
    ids = np.array([[5, 6, 7], [1, -1, -1], [9, 4096, 3], [2, 3, 4], [8, 8, 8]], dtype=np.int32)
    nd = np.array([3, 1, 3, 3, 0], dtype=np.int32)
    need = np.array([True, True, True, False, True])
    room = np.array([3, 3, 3, 3, 3])
    out = clip_drafts(ids, nd, need, room, vocab_size=4096)
    assert out == [[5, 6, 7], [1], [9], [], []]
    assert clip_drafts(ids[:1], nd[:1], need[:1], np.array([2]), 4096) == [[5, 6]]  # the length limit
    assert clip_drafts(ids[:0], nd[:0], need[:0], room[:0], 4096) == []
