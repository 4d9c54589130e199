"""The C hot paths against their reference models on the usual round, side by side (test_native_diff.py's
rigs and comparisons, its rounds biased the other way): a null worker that answers every request in full
(so the reply page is packed by `_fastround.pack_whole` on the C path), requests that mostly all ask for
drafts, a batch that grows and shrinks (rows an earlier round wrote are cleared), now and then a worker
that answers a request with fewer drafts or an -1 first, an n_out table that cuts the drafts, and an
acceptance gate quick enough to pause requests within the rounds drawn. After every round both rigs must
hold the same bytes on the reply page, in the STEP and in every counter."""

from __future__ import annotations

import uuid

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_proxy.acceptance import GateSettings
from dspark_proxy.round import RoundSettings

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
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=st.lists(_round, min_size=1, max_size=60), n_out=st.sampled_from([(), (), (0, 2, 0, N, 1)]),
       gate=st.sampled_from([GateSettings(), GateSettings(break_even=1.5, patience=2, pause=3, pause_max=8,
                                                          probe=1)]))
def test_usual_rounds_write_the_same_bytes(rounds, n_out, gate):
    ref, nat = _rig(False, gate, n_out), _rig(True, gate, n_out)
    try:
        drv = Driver(False)
        for t, r in enumerate(rounds, start=1):
            b, _slots = drv.batch(r)
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


def test_the_usual_round_is_packed_by_the_c_path(monkeypatch):
    """The test above means something only if its rounds take pack_whole: a plain round of every
    request asking, answered in full, does (and writes what the reference writes)."""
    from dspark_proxy import native

    calls = []
    real = native.fastround.pack_whole
    monkeypatch.setattr(native.fastround, "pack_whole", lambda *a: calls.append(real(*a)) or calls[-1])
    ref, nat = _rig(False, GateSettings(), ()), _rig(True, GateSettings(), ())
    try:
        drv = Driver(False)
        r = {"n": M, "perm_seed": 1, "new": [False] * M, "valid": [1] * M, "move": ["go"] * M,
             "need": [True] * M, "k_window": [N] * M}
        for t in range(1, 4):
            b, _ = drv.batch(dict(r, n=M - t))  # a shrinking batch: rows beyond n are cleared
            assert _one(ref, t, b, "none") == _one(nat, t, b, "none")
            assert np.array_equal(ref.core.page, nat.core.page)
    finally:
        ref.close()
        nat.close()
    assert calls and all(calls)
