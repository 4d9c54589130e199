/* _headmm_py.h: what _headmm_py.c exports: the Python glue of the entry points (buffers in, numpy
 * arrays out) */
#ifndef DSPARK_HEADMM_PY_H
#define DSPARK_HEADMM_PY_H

#include "_headmm_common.h"

HM_LOCAL extern PyObject *np_empty, *np_float32, *np_int64;
/* numpy.empty, float32 and int64 into the three above (module init); -1 with an exception set */
HM_LOCAL int hm_py_init(void);
/* a C-contiguous float32 buffer of at least `min_ndim` dimensions, else a ValueError naming it */
HM_LOCAL int get_f32(PyObject *o, Py_buffer *b, int min_ndim, int writable, const char *name);
/* a C-contiguous int64 array of `len` values in [0, hi), else a ValueError naming it */
HM_LOCAL int get_ids(PyObject *o, Py_buffer *b, Py_ssize_t len, Py_ssize_t hi, const char *name);
HM_LOCAL void release_all(Py_buffer *bs, int n);
/* numpy.empty(shape, dtype), its writable buffer in *b; steals `shape` (NULL: returns NULL) */
HM_LOCAL PyObject *new_array(PyObject *shape, PyObject *dtype, Py_buffer *b);

#endif
