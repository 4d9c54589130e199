/*
 * _fastround_inputs.c: enqueue's arguments taken as they are when they already are what the shim needs
 * (engine_shim/inputs.py EnqueueInputs.check's fast path).
 *
 * The reference converts each argument (_as_numpy: torch to numpy, a copy where not contiguous, a cast
 * where the dtype differs) and checks its shape, one numpy call or three per argument. An engine that
 * hands in C-contiguous 1-D numpy arrays of the right dtypes and lengths needs none of it; this function
 * says whether that is the case and then runs check_round's checks on them, all in one call. Anything
 * else returns code -1 and the reference runs unchanged, so every error message stays the reference's.
 */
#include "_fastround_shared.h"

/* A 1-D C-contiguous array of exactly `type`, `count` items of `itemsize` bytes whose format is one of
 * `fmts` (a leading byte-order mark of the native order allowed). 1: it is (b acquired); 0: it is not
 * (b released, no error set); -1: error. */
static int exact(PyObject *o, PyTypeObject *type, Py_buffer *b, Py_ssize_t itemsize, Py_ssize_t count,
                 const char *fmts) {
    if (Py_TYPE(o) != type)
        return 0;
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        b->obj = NULL;
        return 0;
    }
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    if (b->ndim == 1 && b->itemsize == itemsize && b->len == count * itemsize && f[0] && !f[1] && strchr(fmts, f[0]))
        return 1;
    PyBuffer_Release(b);
    b->obj = NULL;
    return 0;
}

/* check_fast(ndarray, M, W, B, mark, slots, valid, first_pos, anchor, k_window, need_draft, qsl, req_ids, rows)
 *   -> (code, n, total_valid, taken)
 * code -1: some argument among slots .. qsl is not a C-contiguous 1-D `ndarray` of its dtype (int64;
 * need_draft bool) and length (n = len(slots) <= M; qsl n + 1): the caller takes the reference path.
 * Otherwise check_round's codes on them (0 fine, 1 a value out of range or qsl decreasing, 2 a slot
 * twice; mark left as it leaves it), with the sum of valid; then, when code is 0, req_ids and rows
 * are looked at: taken bit 1, req_ids is an int64 `ndarray` [n] (code 3 if one id is negative: the
 * reference's "ids must be >= 0"); bit 2, rows is a uint8 `ndarray` [total_valid, B]. What is not taken
 * the caller converts as the reference does. */
PyObject *fr_check_fast(PyObject *mod, PyObject *args) {
    PyObject *type, *o_mark, *o[9];
    Py_ssize_t M, W, B;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OnnnOOOOOOOOOO", &type, &M, &W, &B, &o_mark, &o[0], &o[1], &o[2], &o[3], &o[4],
                          &o[5], &o[6], &o[7], &o[8]))
        return NULL;
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "check_fast: ndarray must be a type");
        return NULL;
    }
    PyTypeObject *nd = (PyTypeObject *)type;
    Py_buffer bmark = {0}, bs[9];
    memset(bs, 0, sizeof bs);
    Py_buffer *all[11] = {&bmark, &bs[0], &bs[1], &bs[2], &bs[3], &bs[4], &bs[5], &bs[6], &bs[7], &bs[8], NULL};
    int code = -1, taken = 0;
    int64_t total = 0;
    Py_ssize_t n = 0;
    if (get_arr(o_mark, &bmark, 8, M, 1, "mark") < 0)
        return NULL;
    /* slots first: its length is n */
    if (Py_TYPE(o[0]) != nd)
        goto done;
    if (PyObject_GetBuffer(o[0], &bs[0], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        bs[0].obj = NULL;
        goto done;
    }
    n = bs[0].len / (bs[0].itemsize ? bs[0].itemsize : 1);
    PyBuffer_Release(&bs[0]);
    bs[0].obj = NULL;
    if (n > M)
        goto done;
    /* slots, valid, first_pos, anchor, k_window int64 [n]; need_draft bool [n]; qsl int64 [n + 1] */
    static const Py_ssize_t isz[7] = {8, 8, 8, 8, 8, 1, 8};
    for (int i = 0; i < 7; i++)
        if (exact(o[i], nd, &bs[i], isz[i], i == 6 ? n + 1 : n, i == 5 ? "?" : "lq") <= 0)
            goto done;
    const int64_t *slots = bs[0].buf, *valid = bs[1].buf, *first = bs[2].buf, *k = bs[4].buf, *qsl = bs[6].buf;
    int64_t *mark = bmark.buf;
    code = check_round_core(slots, valid, first, k, qsl, mark, n, M, W, &total);
    if (code)
        goto done;
    if (exact(o[7], nd, &bs[7], 8, n, "lq") > 0) {
        const int64_t *req = bs[7].buf;
        taken |= 1;
        for (Py_ssize_t i = 0; i < n; i++)
            if (req[i] < 0)
                code = 3;
    }
    /* rows: 2-D, so `exact` does not apply; the same tests on [total, B] */
    if (!code && Py_TYPE(o[8]) == nd && B > 0) {
        if (PyObject_GetBuffer(o[8], &bs[8], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            PyErr_Clear();
            bs[8].obj = NULL;
        } else if (bs[8].ndim == 2 && bs[8].itemsize == 1 && bs[8].shape[0] == total && bs[8].shape[1] == B &&
                   bs[8].format && !strcmp(bs[8].format, "B"))
            taken |= 2;
    }
done:
    release_all(all);
    return Py_BuildValue("inLi", code, n, (long long)total, taken);
}
