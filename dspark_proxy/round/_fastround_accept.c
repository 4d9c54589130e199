/*
 * _fastround_accept.c: the acceptance measure's and gate's per-round sums (acceptance.py) in one pass.
 *
 * The reference is Acceptance.round's Python path: accepted_drafts, DraftEffect.observe's histogram and
 * AcceptGate.observe's scatter-adds. As numpy it was about ten calls a round (some 10 us at any n); here
 * it is one. Only the sums live here: every state change (new owners, wakes, judgements) stays in
 * acceptance.py, before and after this call, in the reference's order.
 */
#include "_fastround_shared.h"

/* accept_round(slots, valid, k_window, num_spec, held, gate, probing) -> (n_ver, tokens, n_ready)
 * held: a Held (_fastround_held.c) of hist (int64 [num_spec + 1]), gsum, gcnt, left (int64 [S]) and
 * ready (int64, at least [n]).
 * Per request i of the round (slots int64 [n], valid and k_window int32 [n] as the engine wrote them):
 * verified = k_window > 0; accepted = valid - 1 within [0, min(k_window, num_spec)] (int32, as numpy).
 * When some request verified: hist[accepted]++ for every request (0 also counts the unverified),
 * tokens = the sum of k_window; and with `gate` set, gsum[slot] += accepted, gcnt[slot] += verified,
 * and with `probing` set left[slot] -= verified, the slots whose left is then <= 0 written to ready in
 * request order. Slots must be unique (the descriptor read checked it) and in range of gsum/gcnt/left
 * (checked here). */
/* The sums on C arrays of n requests (fr_accept_round's contract; advance_accept in _fastround_fused.c
 * runs the same): out = (n_ver, tokens, n_ready). -1 with an error set. */
int accept_core(PyObject *held, const int64_t *slots, const int32_t *valid, const int32_t *kw, Py_ssize_t n,
                Py_ssize_t N, int gate, int probing, int64_t out[3]) {
    if (N < 0) {
        PyErr_SetString(PyExc_ValueError, "accept_round: num_spec < 0");
        return -1;
    }
    Py_ssize_t S = held_items(held, 1);
    int64_t *hist = held_get(held, 0, 8, N + 1, "hist"), *gsum = held_get(held, 1, 8, S, "gsum"),
            *gcnt = held_get(held, 2, 8, S, "gcnt"), *left = held_get(held, 3, 8, S, "left"),
            *ready = held_get(held, 4, 8, n, "ready");
    if (!hist || !gsum || !gcnt || !left || !ready)
        return -1;
    if (gate)
        for (Py_ssize_t i = 0; i < n; i++)
            if ((uint64_t)slots[i] >= (uint64_t)S) {
                PyErr_Format(PyExc_ValueError, "accept_round: slot %lld out of range", (long long)slots[i]);
                return -1;
            }
    int64_t n_ver = 0, tokens = 0, n_ready = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        n_ver += kw[i] > 0;
    if (n_ver) {
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t a = (int32_t)((uint32_t)valid[i] - 1u); /* int32 wraps, as numpy's valid - 1 */
            if (a > kw[i])
                a = kw[i];
            if ((int64_t)a > (int64_t)N)
                a = (int32_t)N;
            if (a < 0)
                a = 0;
            int64_t ver = kw[i] > 0;
            hist[a]++;
            tokens += kw[i];
            if (!gate)
                continue;
            int64_t s = slots[i];
            gsum[s] += a;
            gcnt[s] += ver;
            if (probing) {
                left[s] -= ver;
                if (left[s] <= 0)
                    ready[n_ready++] = s;
            }
        }
    }
    out[0] = n_ver, out[1] = tokens, out[2] = n_ready;
    return 0;
}

PyObject *fr_accept_round(PyObject *mod, PyObject *args) {
    PyObject *o[3], *held;
    Py_ssize_t N;
    int gate, probing;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OOOnOpp", &o[0], &o[1], &o[2], &N, &held, &gate, &probing))
        return NULL;
    Py_buffer bs[3];
    memset(bs, 0, sizeof bs);
    Py_buffer *all[4] = {&bs[0], &bs[1], &bs[2], NULL};
    if (get_arr(o[0], &bs[0], 8, 0, 0, "slots") < 0)
        return NULL;
    Py_ssize_t n = bs[0].len / 8;
    int64_t r[3];
    if (get_arr(o[1], &bs[1], 4, n, 0, "valid") < 0 || get_arr(o[2], &bs[2], 4, n, 0, "k_window") < 0 ||
        accept_core(held, bs[0].buf, bs[1].buf, bs[2].buf, n, N, gate, probing, r) < 0) {
        release_all(all);
        return NULL;
    }
    release_all(all);
    return Py_BuildValue("LLL", (long long)r[0], (long long)r[1], (long long)r[2]);
}
