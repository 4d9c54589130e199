/*
 * _fastround_entries.c: the worker's check of a STEP's entries (wire/codec.py bad_entry_mask_reference is
 * the reference, tests/test_native_entries.py holds the two to the same bytes) in one pass.
 *
 * The reference is some twenty numpy calls on a handful of entries, each costing its call rather than
 * its data: ~90 us of a batch-4 round after an idle gap, for what is a few comparisons an entry here.
 * The flag rules stay the reference's: its two 256-entry tables come in as arguments.
 */
#include "_fastround_shared.h"

/* bad_entries(entries, eoffs, flags_bad, flags_new_gen, W, N, M, out) -> number of bad entries
 * entries: ENTRY_DTYPE records (40 bytes each); eoffs: int64 [E_COUNT] field offsets (native.py
 * entry_offsets); flags_bad, flags_new_gen: uint8 [256] tables; out: uint8 [n], 1 where the entry is
 * malformed on its own: a bad flags byte, n_rows > W, an empty NEW_GEN, first_pos < 0, anchor_pos !=
 * first_pos + n_rows (or before it), n_out > N, slot >= M, or a slot seen earlier in the batch. */
PyObject *fr_bad_entries(PyObject *mod, PyObject *args) {
    PyObject *o[5];
    Py_ssize_t W, N, M;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OOOOnnnO", &o[0], &o[1], &o[2], &o[3], &W, &N, &M, &o[4]))
        return NULL;
    Py_buffer bs[5] = {{0}};
    Py_buffer *all[6] = {&bs[0], &bs[1], &bs[2], &bs[3], &bs[4], NULL};
    uint8_t *seen = NULL;
    if (get_arr(o[0], &bs[0], 40, 0, 0, "entries") < 0 || get_arr(o[1], &bs[1], 8, E_COUNT, 0, "eoffs") < 0 ||
        get_arr(o[2], &bs[2], 1, 256, 0, "flags_bad") < 0 || get_arr(o[3], &bs[3], 1, 256, 0, "flags_new_gen") < 0)
        goto fail;
    Py_ssize_t n = bs[0].len / 40;
    if (get_arr(o[4], &bs[4], 1, n, 1, "out") < 0)
        goto fail;
    const int64_t *eo = bs[1].buf;
    static const int64_t size[E_COUNT] = {4, 4, 8, 8, 8, 4, 1, 1, 1}; /* ENTRY_DTYPE's fields, E_* order */
    for (int f = 0; f < E_COUNT; f++)
        if (eo[f] < 0 || eo[f] + size[f] > 40) {
            PyErr_SetString(PyExc_ValueError, "bad_entries: a field offset outside the entry");
            goto fail;
        }
    if (W < 0 || N < 0 || M < 0) {
        PyErr_SetString(PyExc_ValueError, "bad_entries: W, N and M are counts");
        goto fail;
    }
    seen = PyMem_Calloc((size_t)M / 8 + 1, 1); /* slots < M met so far, a bit each */
    if (seen == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    const uint8_t *fbad = bs[2].buf, *fnew = bs[3].buf;
    uint8_t *out = bs[4].buf;
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *e = (const char *)bs[0].buf + i * 40;
        uint32_t slot, n_rows;
        int64_t first, anchor;
        uint8_t flags, n_out;
        memcpy(&slot, e + eo[E_SLOT], 4);
        memcpy(&n_rows, e + eo[E_NROWS], 4);
        memcpy(&first, e + eo[E_FIRST], 8);
        memcpy(&anchor, e + eo[E_ANCHOR], 8);
        memcpy(&flags, e + eo[E_FLAGS], 1);
        memcpy(&n_out, e + eo[E_NOUT], 1);
        /* anchor - first wraps as numpy's int64 does; where it could, the entry is bad already */
        int bad = fbad[flags] || n_rows > (uint64_t)W || (fnew[flags] && n_rows == 0) || first < 0 ||
                  anchor < first || (int64_t)((uint64_t)anchor - (uint64_t)first) != (int64_t)n_rows || n_out > N ||
                  slot >= (uint64_t)M;
        if (slot < (uint64_t)M) { /* a later occurrence of a slot is bad, whatever else it is */
            if (seen[slot >> 3] & (1u << (slot & 7)))
                bad = 1;
            seen[slot >> 3] |= (uint8_t)(1u << (slot & 7));
        }
        out[i] = (uint8_t)bad;
        count += bad;
    }
    PyMem_Free(seen);
    release_all(all);
    return PyLong_FromSsize_t(count);
fail:
    PyMem_Free(seen);
    release_all(all);
    return NULL;
}
