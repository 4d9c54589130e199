/*
 * _fastround_accept.c: the acceptance measure's and gate's per-round sums (acceptance.py) in one pass.
 *
 * The reference is Acceptance.round's Python path: accepted_drafts, DraftEffect.observe's histogram and
 * AcceptGate.observe's scatter-adds. As numpy it was about ten calls a round (some 10 us at any n); here
 * it is one. Only the sums live here: every state change (new owners, wakes, judgements) stays in
 * acceptance.py, before and after this call, in the reference's order.
 */
#include "_fastround.h"

/* accept_round(slots, valid, k_window, num_spec, hist, gsum, gcnt, left, ready, gate, probing)
 *   -> (n_ver, tokens, n_ready)
 * Per request i of the round (slots int64 [n], valid and k_window int32 [n] as the engine wrote them):
 * verified = k_window > 0; accepted = valid - 1 within [0, min(k_window, num_spec)] (int32, as numpy).
 * When some request verified: hist[accepted]++ for every request (int64 [num_spec + 1]; 0 also counts
 * the unverified), tokens = the sum of k_window; and with `gate` set, gsum[slot] += accepted,
 * gcnt[slot] += verified, and with `probing` set left[slot] -= verified, the slots whose left is then
 * <= 0 written to ready (int64 [n]) in request order. Slots must be unique (the descriptor read checked
 * it) and in range of gsum/gcnt/left (checked here). */
PyObject *fr_accept_round(PyObject *mod, PyObject *args) {
    PyObject *o[8];
    Py_ssize_t N;
    int gate, probing;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OOOnOOOOOpp", &o[0], &o[1], &o[2], &N, &o[3], &o[4], &o[5], &o[6], &o[7], &gate,
                          &probing))
        return NULL;
    Py_buffer bs[8];
    memset(bs, 0, sizeof bs);
    Py_buffer *all[9];
    for (int i = 0; i < 8; i++)
        all[i] = &bs[i];
    all[8] = NULL;
    static const char *names[8] = {"slots", "valid", "k_window", "hist", "gsum", "gcnt", "left", "ready"};
    if (N < 0) {
        PyErr_SetString(PyExc_ValueError, "accept_round: num_spec < 0");
        return NULL;
    }
    if (get_arr(o[0], &bs[0], 8, 0, 0, names[0]) < 0)
        return NULL;
    Py_ssize_t n = bs[0].len / 8;
    if (get_arr(o[1], &bs[1], 4, n, 0, names[1]) < 0 || get_arr(o[2], &bs[2], 4, n, 0, names[2]) < 0 ||
        get_arr(o[3], &bs[3], 8, N + 1, 1, names[3]) < 0 || get_arr(o[4], &bs[4], 8, 0, 1, names[4]) < 0)
        goto fail;
    Py_ssize_t S = bs[4].len / 8;
    if (get_arr(o[5], &bs[5], 8, S, 1, names[5]) < 0 || get_arr(o[6], &bs[6], 8, S, 1, names[6]) < 0 ||
        get_arr(o[7], &bs[7], 8, n, 1, names[7]) < 0)
        goto fail;
    const int64_t *slots = bs[0].buf;
    const int32_t *valid = bs[1].buf, *kw = bs[2].buf;
    int64_t *hist = bs[3].buf, *gsum = bs[4].buf, *gcnt = bs[5].buf, *left = bs[6].buf, *ready = bs[7].buf;
    if (gate)
        for (Py_ssize_t i = 0; i < n; i++)
            if ((uint64_t)slots[i] >= (uint64_t)S) {
                PyErr_Format(PyExc_ValueError, "accept_round: slot %lld out of range", (long long)slots[i]);
                goto fail;
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
    release_all(all);
    return Py_BuildValue("LLL", (long long)n_ver, (long long)tokens, (long long)n_ready);
fail:
    release_all(all);
    return NULL;
}
