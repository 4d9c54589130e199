/*
 * _headmm_mm8.c: the product kernel (_headmm_mm.c's mm_block) in 8-float vectors, for a CPU with AVX2 but
 * no AVX-512.
 *
 * Why a second kernel: _headmm_mm.c's tiles are written in 16-float vectors (v16), one AVX-512 register.
 * GCC has no machine mode for a 64-byte vector without AVX-512, so in the avx2 clone each v16 lived in
 * memory: every multiply and add went through a stack slot, every broadcast of x[r, k] was 16 scalar
 * stores (objdump of mm_block.avx2). Measured on an AVX2-only AMD EPYC: 1.0 GMAC/s, 40x numpy's BLAS
 * (docs/heads.md). Here the same sums in v8, one ymm register each, tiles sized for AVX2's 16 of them.
 *
 * The bytes are the same: each output element is still (((0 + x[r,0] w[0,j]) + x[r,1] w[1,j]) + ...),
 * each product rounded, then each sum, in that order (no FMA: setup.py builds with -ffp-contract=off and
 * the target below enables AVX2 only); the vectors run across output columns j, which changes no
 * element's order. The panels (PW = 32 columns, _headmm_common.h) are the same; a tile takes half of one.
 */
#include "_headmm_mm8.h"

#ifdef HM_MM8

#pragma GCC target("avx2")

/* rows x[0..3], 16 columns of a panel from p (a row of the panel every PW floats) → o[0..3] (the first
 * `ncol` written): 8 accumulators, 2 loads of w and 4 broadcasts a k, 11 of the 16 registers */
static inline __attribute__((always_inline)) void tile4h(const float *const *x, Py_ssize_t K, const float *p,
                                                         float *const *o, Py_ssize_t ncol) {
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    v8 a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
    for (Py_ssize_t k = 0; k < K; k++, p += PW) {
        v8 w0 = LD8(p), w1 = LD8(p + 8);
        float s0 = x0[k], s1 = x1[k], s2 = x2[k], s3 = x3[k];
        a0 = a0 + s0 * w0, b0 = b0 + s0 * w1;
        a1 = a1 + s1 * w0, b1 = b1 + s1 * w1;
        a2 = a2 + s2 * w0, b2 = b2 + s2 * w1;
        a3 = a3 + s3 * w0, b3 = b3 + s3 * w1;
    }
    if (ncol == 16) {
        ST8(o[0], a0), ST8(o[0] + 8, b0), ST8(o[1], a1), ST8(o[1] + 8, b1);
        ST8(o[2], a2), ST8(o[2] + 8, b2), ST8(o[3], a3), ST8(o[3] + 8, b3);
    } else {
        float t[4][16];
        ST8(t[0], a0), ST8(t[0] + 8, b0), ST8(t[1], a1), ST8(t[1] + 8, b1);
        ST8(t[2], a2), ST8(t[2] + 8, b2), ST8(t[3], a3), ST8(t[3] + 8, b3);
        for (int r = 0; r < 4; r++)
            memcpy(o[r], t[r], (size_t)ncol * sizeof(float));
    }
}

/* one row, two panels at once: eight independent sums in flight, as _headmm_mm.c's row4p */
static inline __attribute__((always_inline)) void row2p(const float *x0, Py_ssize_t K, const float *p, float *o0) {
    const Py_ssize_t S = K * PW;
    v8 a[8] = {{0}};
    for (Py_ssize_t k = 0; k < K; k++, p += PW) {
        float s = x0[k];
        for (int q = 0; q < 8; q++) /* unrolled: a[q] is panel q / 4, columns 8 (q % 4) */
            a[q] = a[q] + s * LD8(p + (q / 4) * S + 8 * (q % 4));
    }
    for (int q = 0; q < 8; q++)
        ST8(o0 + (q / 4) * PW + 8 * (q % 4), a[q]);
}

static inline __attribute__((always_inline)) void row1p8(const float *x0, Py_ssize_t K, const float *p, float *o0,
                                                         Py_ssize_t ncol) {
    v8 a[4] = {{0}};
    for (Py_ssize_t k = 0; k < K; k++, p += PW) {
        float s = x0[k];
        for (int q = 0; q < 4; q++)
            a[q] = a[q] + s * LD8(p + 8 * q);
    }
    float t[PW];
    for (int q = 0; q < 4; q++)
        ST8(t + 8 * q, a[q]);
    memcpy(o0, t, (size_t)ncol * sizeof(float));
}

/* as _headmm_mm.c's mm_block (the same rows, tails and panels [b0, b1)), a 4-row tile taking each panel in
 * two halves of 16 columns (a half wholly past M skipped) */
void mm_block8(const float *x, const float *wp, float *out, Py_ssize_t R, Py_ssize_t K, Py_ssize_t M,
               Py_ssize_t b0, Py_ssize_t b1) {
    Py_ssize_t r = 0;
    for (; R - r >= 2; r += 4) {
        const float *xs[4];
        float *os[4];
        for (int i = 0; i < 4; i++) {
            Py_ssize_t ri = r + i < R ? r + i : R - 1;
            xs[i] = x + ri * K, os[i] = out + ri * M;
        }
        for (Py_ssize_t b = b0; b < b1; b++)
            for (Py_ssize_t c = b * PW; c < (b + 1) * PW && c < M; c += 16) {
                float *ob[4] = {os[0] + c, os[1] + c, os[2] + c, os[3] + c};
                tile4h(xs, K, wp + b * K * PW + (c - b * PW), ob, M - c < 16 ? M - c : 16);
            }
    }
    for (; r < R; r++) {
        Py_ssize_t b = b0;
        for (; b + 2 <= b1 && (b + 2) * PW <= M; b += 2)
            row2p(x + r * K, K, wp + b * K * PW, out + r * M + b * PW);
        for (; b < b1; b++)
            row1p8(x + r * K, K, wp + b * K * PW, out + r * M + b * PW, M - b * PW < PW ? M - b * PW : PW);
    }
}

#endif
