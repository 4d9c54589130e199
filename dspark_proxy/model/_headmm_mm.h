/* _headmm_mm.h: what _headmm_mm.c exports: the product kernel, the RMS norm and the product's epilogue */
#ifndef DSPARK_HEADMM_MM_H
#define DSPARK_HEADMM_MM_H

#include "_headmm_common.h"

/* rows x[0..R) times panels [b0, b1) of wp into out (R rows of M) */
HM_LOCAL void mm_block(const float *x, const float *wp, float *out, Py_ssize_t R, Py_ssize_t K, Py_ssize_t M,
                       Py_ssize_t b0, Py_ssize_t b1);
/* an RMS norm of each row */
HM_LOCAL void rms_rows(const float *x, float *y, Py_ssize_t R, Py_ssize_t K, float eps);
/* out = resid + (out + bias) */
HM_LOCAL void epilogue(float *out, const float *bias, const float *resid, Py_ssize_t R, Py_ssize_t M);

#endif
