/*
 * _headmm.h: what the two files of the _headmm extension share (see _headmm.c for what it is and why):
 * the vector types, the load-time SIMD dispatch (target_clones) and the kernels _headmm_fn.c defines.
 */
#ifndef DSPARK_HEADMM_H
#define DSPARK_HEADMM_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TC __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TC
#endif

/* an unaligned 16-float load or store (a vector type aliases its element type) */
typedef float v16u __attribute__((vector_size(64), aligned(4)));
#define LD(p) (*(const v16u *)(p))
#define ST(p, v) (*(v16u *)(p) = (v))

/* The product kernel reads w packed in panels of 32 columns, wp[b, k, 0:32] = w[k, 32b:32b+32] (the
 * last panel zero-padded; model/headmm.py `Packed`), so a tile streams contiguous memory: w itself read
 * column block by column block would step M floats a k, and at M = 2048 every step lands in one L1 set. */
#define PW 32

typedef int v16i __attribute__((vector_size(64)));
typedef float v16fu __attribute__((vector_size(64), aligned(4)));

/* lane-wise m ? a : b for a comparison's mask m (all ones or zeros a lane) */
#define SEL(m, a, b) ((v16)(((m) & (v16i)(a)) | (~(m) & (v16i)(b))))

/* _headmm_fn.c: elementwise GELU, and each row's top-1 (arg max, [confidence, margin]) */
#define HM_LOCAL __attribute__((visibility("hidden"))) /* the module exports PyInit__headmm only */
HM_LOCAL void gelu_rows(const float *x, float *y, Py_ssize_t n); /* each defined with TC there */
HM_LOCAL void top1_rows(const float *l, Py_ssize_t B, Py_ssize_t V, long long *c_out, float *cm);

#endif
