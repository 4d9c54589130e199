/*
 * _headmm.h: what the files of the _headmm extension share (see _headmm.c for what it is and why):
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
/* GELU's erf, Abramowitz & Stegun 7.1.26 (_headmm_fn.c) */
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

/* _headmm_fn.c: elementwise GELU, and each row's top-1 (arg max, [confidence, margin]) */
#define HM_LOCAL __attribute__((visibility("hidden"))) /* the module exports PyInit__headmm only */
HM_LOCAL void gelu_rows(const float *x, float *y, Py_ssize_t n); /* each calls its version for the CPU */
HM_LOCAL void top1_rows(const float *l, Py_ssize_t B, Py_ssize_t V, long long *c_out, float *cm);

/* _headmm.c: rows x[0..R) times panels [b0, b1) of wp into out (R rows of M); an RMS norm of each row;
 * out = resid + (out + bias) */
HM_LOCAL void mm_block(const float *x, const float *wp, float *out, Py_ssize_t R, Py_ssize_t K, Py_ssize_t M,
                       Py_ssize_t b0, Py_ssize_t b1);
/* _headmm_mm8.c, _headmm_fn8.c: mm_block, gelu_rows and top1_rows in 8-float vectors (HM_USE8) */
HM_LOCAL void mm_block8(const float *x, const float *wp, float *out, Py_ssize_t R, Py_ssize_t K, Py_ssize_t M,
                        Py_ssize_t b0, Py_ssize_t b1);
HM_LOCAL void gelu_rows8(const float *x, float *y, Py_ssize_t n);
HM_LOCAL void top1_rows8(const float *l, Py_ssize_t B, Py_ssize_t V, long long *c_out, float *cm);
HM_LOCAL void rms_rows(const float *x, float *y, Py_ssize_t R, Py_ssize_t K, float eps);
HM_LOCAL void epilogue(float *out, const float *bias, const float *resid, Py_ssize_t R, Py_ssize_t M);
HM_LOCAL int get_f32(PyObject *o, Py_buffer *b, int min_ndim, int writable, const char *name);
HM_LOCAL void release_all(Py_buffer *bs, int n);
HM_LOCAL extern PyObject *np_empty, *np_float32, *np_int64;
/* numpy.empty(shape, dtype), its writable buffer in *b; steals `shape` (NULL: returns NULL) */
HM_LOCAL PyObject *new_array(PyObject *shape, PyObject *dtype, Py_buffer *b);
/* _headmm_step.c: a C-contiguous int64 array of `len` values in [0, hi), else a ValueError naming it */
HM_LOCAL int get_ids(PyObject *o, Py_buffer *b, Py_ssize_t len, Py_ssize_t hi, const char *name);

/* _headmm_par.c: the helper threads. hm_par runs fn(ctx, i) for i in [0, n), each i exactly once, on
 * the calling thread and whichever helpers join in time; the products split into such chunks. */
#define HM_MAX_THREADS 8
#define HM_PAR_MIN 131072      /* multiply-adds below which a product stays on one thread (measured) */
#define HM_NOGIL_MIN 16777216  /* ... at or above which hm_mm lets other Python threads run meanwhile */
typedef void (*hm_chunk_fn)(void *ctx, Py_ssize_t i);
HM_LOCAL void hm_par(Py_ssize_t n, hm_chunk_fn fn, void *ctx);
/* hm_par for work of `macs` multiply-adds in n chunks: on the calling thread alone below the cutoff */
HM_LOCAL void hm_par_big(Py_ssize_t n, long long macs, hm_chunk_fn fn, void *ctx);
HM_LOCAL int hm_threads(void);
HM_LOCAL void hm_set_threads(int n);
HM_LOCAL void hm_stats(long out[4]);
HM_LOCAL void hm_tune(long *par_min, long *chunk, int *adapt); /* each set where >= 0 / >= 1 / >= 0; old back */
HM_LOCAL void mm_par(const float *x, const float *wp, float *out, Py_ssize_t R, Py_ssize_t K, Py_ssize_t M);
HM_LOCAL void top1_par(const float *l, Py_ssize_t B, Py_ssize_t V, long long *c_out, float *cm);

/* _headmm_step.c: one draft position (`step`) and the greedy drafts of every position (`greedy`) */
HM_LOCAL PyObject *hm_step(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);
HM_LOCAL PyObject *hm_greedy(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

/* _headmm_proj.c: a STEP's bfloat16 rows to their projections (`project_bf16`) */
HM_LOCAL PyObject *hm_project_bf16(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

/* _headmm_bb.c: the backbone, window to ctx (`backbone`) */
HM_LOCAL PyObject *hm_backbone(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

#endif
