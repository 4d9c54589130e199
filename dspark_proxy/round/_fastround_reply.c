/*
 * _fastround_reply.c: decode_reply's checks of a REPLY's per-request sections in one pass
 * (wire/codec.py reply_section_error_reference is the definition; DSPARK_NATIVE=0 runs it).
 */
#include <math.h>
#include <string.h>

#include "_fastround_shared.h"

/* check_reply(payload, o_status, o_window_rows, o_confidence, n, N, W, rs_max, usable) -> code
 * payload: the REPLY's payload (bytes); o_*: its sections' offsets (wire reply_layout); usable: 256
 * bytes, nonzero where a status is usable (wire USABLE_STATUS_TABLE). The first check that fails, in
 * the reference's order over the whole batch: 1 a status over rs_max, 2 window_rows over W, 3 a usable
 * status with an empty window, 4 a non-finite confidence; 0 when none does. Loads are memcpy'd: the
 * payload need not be aligned. */
PyObject *fr_check_reply(PyObject *mod, PyObject *args) {
    PyObject *op, *ou;
    Py_ssize_t o_st, o_wr, o_cf, n, N;
    long long W;
    int rs_max;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OnnnnnLiO", &op, &o_st, &o_wr, &o_cf, &n, &N, &W, &rs_max, &ou))
        return NULL;
    if (n < 0 || N < 0 || o_st < 0 || o_wr < 0 || o_cf < 0) {
        PyErr_SetString(PyExc_ValueError, "check_reply: negative count or offset");
        return NULL;
    }
    Py_buffer p = {0}, u = {0};
    Py_buffer *all[3] = {&p, &u, NULL};
    if (get_arr(op, &p, 1, 0, 0, "payload") < 0 || get_arr(ou, &u, 1, 256, 0, "usable") < 0) {
        release_all(all);
        return NULL;
    }
    if (o_st + n > p.len || o_wr + 4 * n > p.len || o_cf + 4 * n * N > p.len) {
        release_all(all);
        PyErr_SetString(PyExc_ValueError, "check_reply: sections past the payload");
        return NULL;
    }
    const uint8_t *b = p.buf, *use = u.buf;
    int bad_status = 0, over_w = 0, empty = 0, nonfinite = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t st = b[o_st + i];
        uint32_t w;
        memcpy(&w, b + o_wr + 4 * i, 4);
        bad_status |= st > rs_max;
        over_w |= (long long)w > W;
        empty |= use[st] && w == 0;
    }
    for (Py_ssize_t j = 0; j < n * N; j++) {
        float c;
        memcpy(&c, b + o_cf + 4 * j, 4);
        nonfinite |= !isfinite(c);
    }
    release_all(all);
    return PyLong_FromLong(bad_status ? 1 : over_w ? 2 : empty ? 3 : nonfinite ? 4 : 0);
}
