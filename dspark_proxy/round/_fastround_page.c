/*
 * _fastround_page.c: the reply page of the usual round (reply_page.py PagePacker.pack) in one pass.
 *
 * The reference is PagePacker.pack's "whole" branch: every request has an entry, asked for drafts and
 * got all N of them (leading_drafts is None: no negative id, no n_out cut). Anything else is left to
 * the reference's general path, which this function does not touch: it returns False having written
 * nothing.
 */
#include "_fastround_shared.h"

/* Acquire a C-contiguous read buffer of exactly `len` bytes of `itemsize`-byte items; 0 (error cleared)
 * when the object cannot give one, so the caller falls back to the reference. */
static int try_arr(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, Py_ssize_t len) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        b->obj = NULL;
        return 0;
    }
    return b->itemsize == itemsize && b->len == len;
}

/* pack_whole(page, o_ok, o_ids, o_conf, M, N, n, cap, ok_rows, ids_rows, draft_ids, confidence) -> bool
 * page: the int32 reply page (PagePacker.page); o_*: its blocks' offsets in int32 words (ReplyPageLayout);
 * draft_ids int32 [n, N], confidence float32 [n, N]: the reply; ok_rows / ids_rows: the rows an earlier
 * round may have written (PagePacker._ok_rows / _ids_rows). When cap >= N and no draft id is negative:
 * ok[:n] = N, ids[:n] and conf[:n] copied (bytes, as numpy's same-dtype assignment), ok[n:ok_rows] = 0,
 * ids[n:ids_rows] = -1, conf[n:ids_rows] = 0, and True. Otherwise False and the page untouched.
 * status and n (words 0 and 1) stay the caller's. */
/* pack_whole on the page's memory (`words` int32 words): 1 packed, 0 not that round (nothing written),
 * -1 with an error set. finish_whole (_fastround_fused.c) runs the same. */
int pack_whole_core(int32_t *page, Py_ssize_t words, Py_ssize_t o_ok, Py_ssize_t o_id, Py_ssize_t o_cf, Py_ssize_t M,
                    Py_ssize_t N, Py_ssize_t n, Py_ssize_t cap, Py_ssize_t ok_rows, Py_ssize_t ids_rows,
                    PyObject *o_ids, PyObject *o_conf) {
    if (N <= 0 || n < 0 || n > M || ok_rows < 0 || ok_rows > M || ids_rows < 0 || ids_rows > M || o_ok < 0 ||
        o_ok + M > words || o_id < 0 || o_id + M * N > words || o_cf < 0 || o_cf + M * N > words) {
        PyErr_SetString(PyExc_ValueError, "pack_whole: a block or a row count outside the page");
        return -1;
    }
    Py_buffer bi = {0}, bc = {0};
    Py_buffer *all[3] = {&bi, &bc, NULL};
    int done = 0;
    if (cap < N || !try_arr(o_ids, &bi, 4, n * N * 4) || !try_arr(o_conf, &bc, 4, n * N * 4))
        goto out;
    const int32_t *ids = bi.buf;
    for (Py_ssize_t i = 0; i < n * N; i++)
        if (ids[i] < 0)
            goto out;
    for (Py_ssize_t i = 0; i < n; i++)
        page[o_ok + i] = (int32_t)N;
    for (Py_ssize_t i = n; i < ok_rows; i++)
        page[o_ok + i] = 0;
    memcpy(page + o_id, ids, (size_t)(n * N) * 4);
    memcpy(page + o_cf, bc.buf, (size_t)(n * N) * 4);
    for (Py_ssize_t i = n * N; i < ids_rows * N; i++) {
        page[o_id + i] = -1;
        page[o_cf + i] = 0; /* 0.0f */
    }
    done = 1;
out:
    release_all(all);
    return done;
}

PyObject *fr_pack_whole(PyObject *mod, PyObject *args) {
    PyObject *o_page, *o_ids, *o_conf;
    Py_ssize_t o_ok, o_id, o_cf, M, N, n, cap, ok_rows, ids_rows;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OnnnnnnnnnOO", &o_page, &o_ok, &o_id, &o_cf, &M, &N, &n, &cap, &ok_rows, &ids_rows,
                          &o_ids, &o_conf))
        return NULL;
    Py_buffer bp = {0};
    if (get_arr(o_page, &bp, 4, 0, 1, "page") < 0)
        return NULL;
    int r = pack_whole_core(bp.buf, bp.len / 4, o_ok, o_id, o_cf, M, N, n, cap, ok_rows, ids_rows, o_ids, o_conf);
    PyBuffer_Release(&bp);
    return r < 0 ? NULL : PyBool_FromLong(r);
}
