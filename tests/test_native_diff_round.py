"""The C hot paths against their reference models on the usual round, side by side (test_native_diff.py's
rigs and comparisons, its rounds biased the other way): a null worker that answers every request in full
(so the reply page is packed by `_fastround.pack_whole` on the C path), requests that mostly all ask for
drafts, a batch that grows and shrinks (rows an earlier round wrote are cleared), now and then a worker
that answers a request with fewer drafts or an -1 first, an n_out table that cuts the drafts, an
acceptance gate quick enough to pause requests within the rounds drawn, and arrays handed in as enqueue
needs them (`_fastround.check_fast` takes them as they are) or not (converted on both paths). After every round both rigs must
hold the same bytes on the reply page, in the STEP and in every counter."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_proxy.round.core import RoundSettings
from dspark_proxy.round.gate import GateSettings

from .rig import Rig
from .test_native_diff import B, Driver, M, N, RecordingClient, W, _native, _one, _state


class ShortClient(RecordingClient):
    """The null worker (every request RS_OK, all N drafts), whose reply can be cut: `short` is a list of
    (request, first draft set to -1) applied to the next reply."""

    def __init__(self, **kw) -> None:
        super().__init__(null=True, **kw)
        self.short: list[tuple[int, int]] = []

    def step(self, prefix, entries, n_rows, **kw):
        out = super().step(prefix, entries, n_rows, **kw)
        if out.ok:
            ids = out.reply.draft_ids
            for i, j in self.short:
                if i < ids.shape[0]:
                    ids[i, j:] = -1
        return out


def _rig(on: bool, gate: GateSettings, n_out: tuple[int, ...]) -> Rig:
    with _native(on):
        client = ShortClient(max_reqs=M, num_spec=N, window=W, row_bytes=B)
        rig = Rig(f"t_native_r{'c' if on else 'py'}_{uuid.uuid4().hex[:8]}", M=M, N=N, W=W, B=B, R=2, client=client,
                  settings=RoundSettings(gate=gate, n_out_table=n_out))
    assert rig.core.packer.native is on and rig.core.accept.native is on
    return rig


_round = st.fixed_dictionaries({
    "n": st.integers(1, M),
    "perm_seed": st.sampled_from([1, 1, 1, 2, 3]),  # mostly the same slots: windows grow, whole rounds
    "new": st.lists(st.sampled_from([False] * 15 + [True]), min_size=M, max_size=M),
    "valid": st.lists(st.integers(1, W), min_size=M, max_size=M),
    "move": st.lists(st.sampled_from(["go"] * 15 + ["jump"]), min_size=M, max_size=M),
    "fault": st.sampled_from(["none"] * 12 + ["watchdog", "dirty"]),
    "need": st.lists(st.sampled_from([True] * 15 + [False]), min_size=M, max_size=M),
    "k_window": st.lists(st.integers(0, N), min_size=M, max_size=M),
    "short": st.lists(st.tuples(st.integers(0, M - 1), st.integers(0, N - 1)), max_size=2),
    "cut": st.sampled_from([False] * 4 + [True]),
    # how the engine hands its arrays in: as enqueue needs them (the C path takes them as they are), or
    # not (another dtype, a list, a strided view: both paths convert them)
    "form": st.sampled_from(["numpy"] * 5 + ["int32", "list", "strided"]),
})


def _form(b: dict, form: str) -> dict:
    if form == "numpy":
        return b
    b = dict(b)
    for k in ("slots", "valid", "first_pos", "anchor", "k_window", "qsl"):
        a = b[k]
        if form == "int32":
            b[k] = a.astype(np.int32)
        elif form == "list":
            b[k] = a.tolist() if k != "slots" else a.astype(np.int16)  # the rig's faults read slots.shape
        else:
            b[k] = np.repeat(a, 2)[::2]  # the same values, not contiguous
    if form == "list":
        b["req_ids"] = b["req_ids"].tolist()  # ints, not an array: the shim's id table maps them
    if form == "strided":
        b["rows"] = np.repeat(b["rows"], 2, axis=0)[::2]
    return b


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=st.lists(_round, min_size=1, max_size=60), n_out=st.sampled_from([(), (), (0, 2, 0, N, 1)]),
       gate=st.sampled_from([GateSettings(), GateSettings(break_even=1.5, patience=2, pause=3, pause_max=8,
                                                          probe=1), GateSettings(break_even=0.0)]))
def test_usual_rounds_write_the_same_bytes(rounds, n_out, gate):
    _run_both(rounds, n_out, gate)


# calmer still: rounds whose requests rarely change owner or jump, so that most of them are usual all
# through and take the C path's fused calls to the end (round/fused.py: the front's entries, finish_whole)
_calm_round = _round.map(lambda r: dict(r, new=[x and i % 3 == 0 for i, x in enumerate(r["new"])],
                                        move=["go" if i % 3 else m for i, m in enumerate(r["move"])],
                                        need=[x or i % 3 != 0 for i, x in enumerate(r["need"])],
                                        perm_seed=1 if r["perm_seed"] != 3 else 2,
                                        fault=r["fault"] if r["perm_seed"] == 3 else "none"))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=st.lists(_calm_round, min_size=1, max_size=40), n_out=st.sampled_from([(), (), (0, 2, 0, N, 1)]),
       gate=st.sampled_from([GateSettings(), GateSettings(break_even=0.0)]))
def test_calm_rounds_write_the_same_bytes(rounds, n_out, gate):
    _run_both(rounds, n_out, gate)


def _run_both(rounds: list, n_out: tuple, gate: GateSettings) -> None:
    ref, nat = _rig(False, gate, n_out), _rig(True, gate, n_out)
    try:
        drv = Driver(False)
        for t, r in enumerate(rounds, start=1):
            b, _slots = drv.batch(r)
            b = _form(b, r["form"])
            for rig in (ref, nat):
                rig.client.short = r["short"] if r["cut"] else []
            got_ref = _one(ref, t, b, r["fault"])
            got_nat = _one(nat, t, b, r["fault"])
            assert got_nat == got_ref, f"round {t} ({r['fault']}): replies differ"
            s_ref, s_nat = _state(ref, t), _state(nat, t)
            for k in s_ref:
                assert s_nat[k] == s_ref[k], f"round {t} ({r['fault']}): {k} differs"
    finally:
        ref.close()
        nat.close()


def test_the_usual_round_is_packed_by_the_c_path():
    """The test above means something only if its rounds take the C path's usual round: a plain round of
    every request asking, answered in full, is read, advanced, summed and given its entries in one call
    and finished (ring model, page) in another (round/fused.py: pack_whole's code inside finish_whole),
    and writes what the reference writes."""
    ref, nat = _rig(False, GateSettings(), ()), _rig(True, GateSettings(), ())
    try:
        drv = Driver(False)
        r = {"n": M, "perm_seed": 1, "new": [False] * M, "valid": [1] * M, "move": ["go"] * M,
             "need": [True] * M, "k_window": [N] * M}
        for t in range(1, 5):
            b, _ = drv.batch(dict(r, n=M - t))  # a shrinking batch: rows beyond n are cleared
            core = nat.core  # (the round binds its ring's c_gather once it has opened the ring: round 1)
            full = core._gather_arg
            if t == 4:  # a gather the front refuses (too small a buffer): the round's own ring_gather sends
                core._gather_arg = (full[0], full[1][:1], full[2])
            assert _one(ref, t, b, "none") == _one(nat, t, b, "none")
            if t == 4:
                core._gather_arg = full
            # from round 2 the front also gathers the rows from the engine's shared ring (the rows
            # sent, in _state's "client", are the reference's own gather)
            assert nat.core._shared and nat.core.fused.n_gathered == (-1 if t in (1, 4) else M - t), t
            assert np.array_equal(ref.core.page, nat.core.page)
            s_ref, s_nat = _state(ref, t), _state(nat, t)
            for k in s_ref:
                assert s_nat[k] == s_ref[k], f"round {t}: {k} differs"
        assert ref.core.fused is None
        # round 1 brings the first connection epoch: its front stops after the read (every slot is marked
        # dirty before the advance); every later round's front goes on to the entries; every round is
        # finished in C
        assert nat.core.fused.fronts == [1, 0, 0, 3] and nat.core.fused.finished == 4
    finally:
        ref.close()
        nat.close()


def test_check_fast_takes_only_what_needs_no_conversion():
    """check_fast answers -1 (the reference converts) for anything but C-contiguous 1-D numpy arrays of
    the right dtypes and lengths, check_round's codes otherwise; and takes req_ids and rows (bits 1, 2)
    only when they too need nothing (a negative id: code 3)."""
    from dspark_proxy import native

    fr = native.fastround
    mark = np.zeros(M, np.int64)
    n = 3
    good = dict(slots=np.array([2, 0, 5]), valid=np.array([1, 2, 0]), first_pos=np.array([0, 4, 9]),
                anchor=np.array([7, 8, 9]), k_window=np.array([0, 1, 2]), need_draft=np.ones(n, bool),
                qsl=np.array([0, 1, 3, 4]), req_ids=np.array([10, 11, 12]), rows=np.zeros((3, B), np.uint8))
    order = ("slots", "valid", "first_pos", "anchor", "k_window", "need_draft", "qsl", "req_ids", "rows")

    def call(**kw):
        d = dict(good, **kw)
        return fr.check_fast(np.ndarray, M, W, B, mark, *(d[k] for k in order))

    assert call() == (0, n, 3, 3)
    assert mark[[2, 0, 5]].tolist() == [0, 1, 2]
    assert call(valid=np.array([1, W + 1, 0]))[0] == 1
    assert call(qsl=np.array([0, 2, 1, 4]))[0] == 1
    assert call(slots=np.array([2, 0, 2]))[0] == 2
    assert call(req_ids=np.array([10, -1, 12]))[0] == 3
    assert call(req_ids=["a", "b", "c"]) == (0, n, 3, 2)
    assert call(req_ids=np.array([10, 11, 12], np.int32)) == (0, n, 3, 2)
    for rows in (np.zeros((3, B), np.int8), np.zeros((4, B), np.uint8), np.zeros((3, 2 * B), np.uint8)[:, ::2],
                 np.zeros((3, B // 2), np.uint16), [[0] * B] * 3):
        assert call(rows=rows) == (0, n, 3, 1)
    for bad in (dict(slots=[2, 0, 5]), dict(valid=np.array([1, 2, 0], np.int32)), dict(need_draft=np.ones(n, np.uint8)),
                dict(anchor=np.arange(6)[::2]), dict(qsl=np.arange(3)), dict(k_window=np.zeros((n, 1), np.int64)),
                dict(first_pos=np.ma.masked_array([0, 4, 9])), dict(slots=np.arange(M + 1)),
                dict(valid=np.array([1, 2, 0], np.uint64))):
        assert call(**bad)[0] == -1, bad


def test_the_readers_fast_reply_is_the_dataclass():
    """ReplyReader builds a non-sampled Reply without the dataclass's __init__ (reply.py _reply): the
    same type, every field as Reply(...) sets it, and still frozen."""
    import dataclasses

    from engine_shim.reply import Reply, _reply

    ok, ids, conf, nd = np.ones(2, bool), np.zeros((2, N), np.int32), np.ones((2, N), np.float32), np.full(2, N)
    fast, slow = _reply(7, 0, 2, ok, ids, conf, nd), Reply(7, 0, 2, ok, ids, conf, n_drafts=nd)
    assert type(fast) is Reply
    for f in dataclasses.fields(Reply):
        assert getattr(fast, f.name) is getattr(slow, f.name), f.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.t = 8
