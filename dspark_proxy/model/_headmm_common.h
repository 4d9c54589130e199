/*
 * _headmm_common.h: what the files of the _headmm extension share (see _headmm.c for what it is and
 * why): the vector types, the load-time SIMD dispatch (target_clones) and the kernel's exp. Macros,
 * types and inline functions only: it belongs to no .c file, so including it ties no file to another.
 * Each .c file's exports are declared in the header of its name (_headmm_fn.h for _headmm_fn.c, ...).
 */
#ifndef DSPARK_HEADMM_COMMON_H
#define DSPARK_HEADMM_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#define HM_LOCAL __attribute__((visibility("hidden"))) /* the module exports PyInit__headmm only */

typedef float v16 __attribute__((vector_size(64)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TC __attribute__((target_clones("avx512f", "avx2", "default")))
/* Without AVX-512 GCC has no register for a v16 and keeps each in memory (docs/heads.md: 1 GMAC/s), so on
 * an AVX2 CPU without AVX-512 the products, GELU, top-1 and attention go to 8-float kernels (_headmm_mm8.c,
 * _headmm_fn8.c, _headmm_bb.c; the same arithmetic, the same bytes); the 16-float ones clone for the others. */
#define HM_MM8
#define TC16 __attribute__((target_clones("avx512f", "default")))
#define HM_USE8() (__builtin_cpu_supports("avx2") && !__builtin_cpu_supports("avx512f"))
#else
#define TC
#define TC16
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

/* the kernel's exp (GELU's erf, top-1's softmax, the backbone's attention; model/headmm.py
 * `exp_reference`) */
#define G_LN2_HI 0.693145751953125f /* ln 2 split: n * hi is exact for |n| < 2^11 */
#define G_LN2_LO 1.428606765330187e-06f
#define G_INV_LN2 1.44269504088896341f
#define G_RND 12582912.0f /* 1.5 * 2^23: v + RND - RND rounds v to an integer (ties to even) */
#define G_RND_BITS 0x4B400000 /* RND's bits */
/* GELU's erf, Abramowitz & Stegun 7.1.26 (_headmm_fn.c, _headmm_fn8.c) */
#define G_P 0.3275911f
#define G_A1 0.254829592f
#define G_A2 -0.284496736f
#define G_A3 1.421413741f
#define G_A4 -1.453152027f
#define G_A5 1.061405429f


/* exp(y) for y <= 0 (y clamped to >= -87, where 2^n is still a normal float): n = round(y / ln 2) by
 * the 1.5 * 2^23 trick, a degree-7 Taylor polynomial of r = y - n ln 2 (|r| <= ln2 / 2: error 5e-9),
 * times 2^n built from n's bits */
static inline __attribute__((always_inline)) void exp16(v16 *py) {
    v16 y = *py;
    const v16 floor_ = y * 0.0f - 87.0f;
    y = SEL(y < floor_, floor_, y);
    v16 nr = y * G_INV_LN2 + G_RND; /* n + 1.5 * 2^23: n is in the low bits of its mantissa */
    v16 n = nr - G_RND;
    v16 r = (y - n * G_LN2_HI) - n * G_LN2_LO;
    v16 e = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
    e = e * r + 1.0f / 120.0f;
    e = e * r + 1.0f / 24.0f;
    e = e * r + 1.0f / 6.0f;
    e = e * r + 0.5f;
    e = e * r + 1.0f;
    e = e * r + 1.0f;
    v16i bits = ((v16i)nr - G_RND_BITS + 127) << 23; /* 2^n, built from those bits */
    *py = e * (v16)bits;
}

/* 8-float vectors, for the AVX2 kernels (_headmm_mm8.c, _headmm_fn8.c, attend_one8 in _headmm_bb.c: each
 * compiled for AVX2 by #pragma GCC target; HM_USE8 picks them) */
typedef float v8 __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4))); /* unaligned */
#define LD8(p) (*(const v8u *)(p))
#define ST8(p, v) (*(v8u *)(p) = (v))
#define SEL8(m, a, b) ((v8)(((m) & (v8i)(a)) | (~(m) & (v8i)(b))))

/* exp16 (above) on 8 lanes, line for line: the same bits a lane; for the AVX2 functions only */
static inline __attribute__((always_inline)) void exp8(v8 *py) {
    v8 y = *py;
    const v8 floor_ = y * 0.0f - 87.0f;
    y = SEL8(y < floor_, floor_, y);
    v8 nr = y * G_INV_LN2 + G_RND;
    v8 n = nr - G_RND;
    v8 r = (y - n * G_LN2_HI) - n * G_LN2_LO;
    v8 e = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
    e = e * r + 1.0f / 120.0f;
    e = e * r + 1.0f / 24.0f;
    e = e * r + 1.0f / 6.0f;
    e = e * r + 0.5f;
    e = e * r + 1.0f;
    e = e * r + 1.0f;
    v8i bits = ((v8i)nr - G_RND_BITS + 127) << 23;
    *py = e * (v8)bits;
}

#endif
