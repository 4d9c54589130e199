/* _headmm_fn8.h: what _headmm_fn8.c exports: gelu_rows and top1_rows in 8-float vectors (HM_MM8 builds
 * only; _headmm_fn.c calls them where HM_USE8) */
#ifndef DSPARK_HEADMM_FN8_H
#define DSPARK_HEADMM_FN8_H

#include "_headmm_common.h"

HM_LOCAL void gelu_rows8(const float *x, float *y, Py_ssize_t n);
HM_LOCAL void top1_rows8(const float *l, Py_ssize_t B, Py_ssize_t V, long long *c_out, float *cm);

#endif
