/*
 * _headmm_proj.c: a STEP's rows from their bfloat16 bytes to what a slot keeps beside each row, in one
 * call (`project_bf16`; worker/drafters/torch_head.py TorchDrafter._project_reference is the definition: its
 * `_to_float` then HeadRunner.project, and tests/test_head_project.py requires the same bytes).
 *
 * The reference is about a dozen numpy and kernel calls (the widening, the finite check, the clip, the
 * RMS norm and two products), each a few us on the cold caches a round meets; the arithmetic is the
 * same functions in the same order here (rms_rows, mm_par, epilogue), so the bytes cannot differ.
 */
#include "_headmm_mm.h" /* first: it brings Python.h, which must precede the system headers */
#include "_headmm_par.h"
#include "_headmm_proj.h"
#include "_headmm_py.h"

#include <stdint.h>

/* widen bf16 to float32 exactly (its bits are the float's top half); a non-finite value becomes 0 and
 * the rest is clipped to [-1e4, 1e4] (TorchDrafter._to_float: a corrupt or hostile row cannot blow up
 * the head) */
static void widen_rows(const uint16_t *src, float *dst, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)src[i] << 16;
        float v;
        memcpy(&v, &bits, 4);
        if (!isfinite(v))
            v = 0.0f;
        else if (v > 1e4f)
            v = 1e4f;
        else if (v < -1e4f)
            v = -1e4f;
        dst[i] = v;
    }
}

/* project_bf16(raw, n_taps, hidden, in_wp, in_M, in_b, c_wp, c_M, eps) -> out float32 [R, c_M]
 * raw: uint8 [R, n_taps * hidden * 2] (bfloat16 rows); in_wp / c_wp: the two matrices' panels (model/headmm.py
 * `Packed`), in_b [in_M]: x = widen(raw); each tap's hidden values RMS-normed (rms_rows); h = x @ in_w + in_b;
 * out = h @ c_w. */
PyObject *hm_project_bf16(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "project_bf16(raw, n_taps, hidden, in_wp, in_M, in_b, c_wp, c_M, eps)");
        return NULL;
    }
    Py_ssize_t taps = PyLong_AsSsize_t(args[1]), hidden = PyLong_AsSsize_t(args[2]);
    Py_ssize_t in_M = PyLong_AsSsize_t(args[4]), c_M = PyLong_AsSsize_t(args[7]);
    float eps = (float)PyFloat_AsDouble(args[8]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer bs[5] = {{0}}; /* raw, in_wp, in_b, c_wp, out */
    float *x = NULL, *h = NULL;
    PyObject *out = NULL;
    if (PyObject_GetBuffer(args[0], &bs[0], PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (get_f32(args[3], &bs[1], 3, 0, "project_bf16: in_wp") < 0 || get_f32(args[5], &bs[2], 1, 0, "project_bf16: in_b") < 0 ||
        get_f32(args[6], &bs[3], 3, 0, "project_bf16: c_wp") < 0)
        goto fail;
    Py_ssize_t F = taps * hidden;
    if (taps <= 0 || hidden <= 0 || in_M <= 0 || c_M <= 0 || bs[0].len % (2 * F) != 0 ||
        bs[1].shape[0] != (in_M + PW - 1) / PW || bs[1].shape[1] != F || bs[1].shape[2] != PW ||
        bs[2].ndim != 1 || bs[2].shape[0] != in_M || bs[3].shape[0] != (c_M + PW - 1) / PW ||
        bs[3].shape[1] != in_M || bs[3].shape[2] != PW) {
        PyErr_Format(PyExc_ValueError, "project_bf16: rows of %zd bytes as %zd taps x %zd bfloat16, then [%zd, %zd] and "
                     "[%zd, %zd]: the shapes do not chain", bs[0].len, taps, hidden, F, in_M, in_M, c_M);
        goto fail;
    }
    Py_ssize_t R = bs[0].len / (2 * F);
    out = new_array(Py_BuildValue("(nn)", R, c_M), np_float32, &bs[4]);
    if (out == NULL)
        goto fail;
    if (R > 0) {
        x = PyMem_Malloc((size_t)(R * F) * sizeof(float));
        h = PyMem_Malloc((size_t)(R * in_M) * sizeof(float));
        if (x == NULL || h == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        widen_rows((const uint16_t *)bs[0].buf, x, R * F);
        rms_rows(x, x, R * taps, hidden, eps); /* in place: each row's sum is taken before it is scaled */
        mm_par(x, (const float *)bs[1].buf, h, R, F, in_M);
        epilogue(h, (const float *)bs[2].buf, NULL, R, in_M);
        mm_par(h, (const float *)bs[3].buf, (float *)bs[4].buf, R, in_M, c_M);
        epilogue((float *)bs[4].buf, NULL, NULL, R, c_M);
    }
    PyMem_Free(x);
    PyMem_Free(h);
    release_all(bs, 5);
    return out;
fail:
    PyMem_Free(x);
    PyMem_Free(h);
    Py_XDECREF(out);
    release_all(bs, 5);
    return NULL;
}
