/* _headmm_mm8.h: what _headmm_mm8.c exports: mm_block in 8-float vectors (HM_MM8 builds only;
 * _headmm_mm.c calls it where HM_USE8) */
#ifndef DSPARK_HEADMM_MM8_H
#define DSPARK_HEADMM_MM8_H

#include "_headmm_common.h"

HM_LOCAL void mm_block8(const float *x, const float *wp, float *out, Py_ssize_t R, Py_ssize_t K, Py_ssize_t M,
                        Py_ssize_t b0, Py_ssize_t b1);

#endif
