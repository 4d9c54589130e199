/* _headmm_fn.h: what _headmm_fn.c exports: elementwise GELU, and each row's top-1 (arg max,
 * [confidence, margin]); each calls its version for the CPU (_headmm_fn8.c's on AVX2 without AVX-512) */
#ifndef DSPARK_HEADMM_FN_H
#define DSPARK_HEADMM_FN_H

#include "_headmm_common.h"

HM_LOCAL void gelu_rows(const float *x, float *y, Py_ssize_t n);
HM_LOCAL void top1_rows(const float *l, Py_ssize_t B, Py_ssize_t V, long long *c_out, float *cm);

#endif
