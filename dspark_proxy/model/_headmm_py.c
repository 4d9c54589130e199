/*
 * _headmm_py.c: the Python glue the _headmm extension's entry points share (_headmm.c, _headmm_step.c,
 * _headmm_bb.c, _headmm_proj.c): their arguments' buffers checked by name, their results as numpy arrays.
 */
#include "_headmm_py.h"

PyObject *np_empty, *np_float32, *np_int64; /* numpy.empty, numpy.float32 and int64, for the results */

/* numpy.empty, float32 and int64, kept for the module's life */
int hm_py_init(void) {
    PyObject *np = PyImport_ImportModule("numpy");
    if (np == NULL)
        return -1;
    np_empty = PyObject_GetAttrString(np, "empty");
    np_float32 = PyObject_GetAttrString(np, "float32");
    np_int64 = PyObject_GetAttrString(np, "int64");
    Py_DECREF(np);
    if (np_empty == NULL || np_float32 == NULL || np_int64 == NULL)
        return -1;
    return 0;
}

int get_f32(PyObject *o, Py_buffer *b, int min_ndim, int writable, const char *name) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (b->ndim < min_ndim || b->itemsize != 4 || b->format == NULL || strcmp(b->format, "f") != 0) {
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous float32 array of at least %d dimension(s)", name,
                     min_ndim);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

int get_ids(PyObject *o, Py_buffer *b, Py_ssize_t len, Py_ssize_t hi, const char *name) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = b->format;
    if (b->ndim != 1 || b->itemsize != 8 || f == NULL || (strcmp(f, "q") && strcmp(f, "l")) || b->shape[0] != len) {
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous int64 array of %zd values", name, len);
        PyBuffer_Release(b);
        return -1;
    }
    const long long *v = b->buf;
    for (Py_ssize_t i = 0; i < len; i++)
        if (v[i] < 0 || v[i] >= hi) {
            PyErr_Format(PyExc_ValueError, "%s[%zd] = %lld: ids are 0 .. %zd", name, i, v[i], hi - 1);
            PyBuffer_Release(b);
            return -1;
        }
    return 0;
}

void release_all(Py_buffer *bs, int n) {
    for (int i = 0; i < n; i++)
        if (bs[i].obj != NULL)
            PyBuffer_Release(&bs[i]);
}

PyObject *new_array(PyObject *shape, PyObject *dtype, Py_buffer *b) {
    if (shape == NULL)
        return NULL;
    PyObject *argv[2] = {shape, dtype};
    PyObject *o = PyObject_Vectorcall(np_empty, argv, 2, NULL);
    Py_DECREF(shape);
    if (o != NULL && PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        Py_CLEAR(o);
    return o;
}
