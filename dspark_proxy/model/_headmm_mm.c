/*
 * _headmm_mm.c: the product kernel (mm_block: rows times a range of panels), the RMS norm (rms_rows) and
 * the product's epilogue (bias, residual), for the _headmm extension; _headmm.c has the arithmetic they
 * define and why, model/headmm.py their Python reference models (`mm_reference`, `rms_reference`).
 *
 * Speed: rows go in tiles of 4 (32 columns a step) or 1 (128 columns a step), so a tile reads w once
 * for 4 rows where the one-row-at-a-time BLAS products read it once a row; w is read from panels
 * packed once (_headmm_common.h PW). Measured: with bfloat16 panels widened on load (the shipped weights are
 * bfloat16) the products were 2x slower, not faster: at 4 rows the tile is bound by its multiplies
 * and adds, and at one row the widening cost more than the bytes it saved. 16-float vectors: one
 * AVX-512 register (measured on an AVX-512 AMD EPYC: 1.5-1.9x 8-float tiles at 4-20 rows). Without
 * AVX-512 GCC has no register for them and kept each in memory (1 GMAC/s, 40x numpy, on an AVX2-only
 * EPYC: docs/heads.md), so an AVX2 CPU without AVX-512 goes to _headmm_mm8.c's 8-float tiles, the same
 * sums in the same order (GELU, top-1, attention likewise); the SSE2 clone (no AVX2) still pays.
 */
#include "_headmm_mm.h"
#include "_headmm_mm8.h"

/* rows x[0..3], panel p → out rows o[0..3] from column 32b (only the first `ncol` written) */
static inline __attribute__((always_inline)) void tile4(const float *const *x, Py_ssize_t K, const float *p,
                                                        float *const *o, Py_ssize_t ncol) {
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    v16 a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
    for (Py_ssize_t k = 0; k < K; k++, p += PW) {
        v16 w0 = LD(p), w1 = LD(p + 16);
        float s0 = x0[k], s1 = x1[k], s2 = x2[k], s3 = x3[k];
        a0 = a0 + s0 * w0, b0 = b0 + s0 * w1;
        a1 = a1 + s1 * w0, b1 = b1 + s1 * w1;
        a2 = a2 + s2 * w0, b2 = b2 + s2 * w1;
        a3 = a3 + s3 * w0, b3 = b3 + s3 * w1;
    }
    if (ncol == PW) {
        ST(o[0], a0), ST(o[0] + 16, b0), ST(o[1], a1), ST(o[1] + 16, b1);
        ST(o[2], a2), ST(o[2] + 16, b2), ST(o[3], a3), ST(o[3] + 16, b3);
    } else {
        float t[4][PW];
        ST(t[0], a0), ST(t[0] + 16, b0), ST(t[1], a1), ST(t[1] + 16, b1);
        ST(t[2], a2), ST(t[2] + 16, b2), ST(t[3], a3), ST(t[3] + 16, b3);
        for (int r = 0; r < 4; r++)
            memcpy(o[r], t[r], (size_t)ncol * sizeof(float));
    }
}

/* one row, four panels at once (eight independent sums in flight; one panel's two would wait on the
 * adder's latency) */
static inline __attribute__((always_inline)) void row4p(const float *x0, Py_ssize_t K, const float *p, float *o0) {
    const Py_ssize_t S = K * PW;
    v16 a[8] = {{0}};
    for (Py_ssize_t k = 0; k < K; k++, p += PW) {
        float s = x0[k];
        a[0] = a[0] + s * LD(p), a[1] = a[1] + s * LD(p + 16);
        a[2] = a[2] + s * LD(p + S), a[3] = a[3] + s * LD(p + S + 16);
        a[4] = a[4] + s * LD(p + 2 * S), a[5] = a[5] + s * LD(p + 2 * S + 16);
        a[6] = a[6] + s * LD(p + 3 * S), a[7] = a[7] + s * LD(p + 3 * S + 16);
    }
    for (int q = 0; q < 8; q++)
        ST(o0 + 16 * q, a[q]);
}

static inline __attribute__((always_inline)) void row1p(const float *x0, Py_ssize_t K, const float *p, float *o0,
                                                        Py_ssize_t ncol) {
    v16 a0 = {0}, b0 = {0};
    for (Py_ssize_t k = 0; k < K; k++, p += PW) {
        float s = x0[k];
        a0 = a0 + s * LD(p), b0 = b0 + s * LD(p + 16);
    }
    float t[PW];
    ST(t, a0), ST(t + 16, b0);
    memcpy(o0, t, (size_t)ncol * sizeof(float));
}

/* Rows in tiles of 4; a tail of 2 or 3 rows goes through the 4-row tile with its last row repeated
 * (each element's sum is the same whatever tile it is in, so a repeated row writes its own values
 * again: one pass over w instead of one a row); a single row goes 4 panels at a time. Only panels
 * [b0, b1) (columns 32 b0 .. 32 b1): a chunk of the product for one thread (_headmm_par.c), each
 * element by the same code whatever the chunk. */
TC16 static void mm_block16(const float *x, const float *wp, float *out, Py_ssize_t R, Py_ssize_t K, Py_ssize_t M,
                       Py_ssize_t b0, Py_ssize_t b1) {
    Py_ssize_t r = 0;
    for (; R - r >= 2; r += 4) {
        const float *xs[4];
        float *os[4];
        for (int i = 0; i < 4; i++) {
            Py_ssize_t ri = r + i < R ? r + i : R - 1;
            xs[i] = x + ri * K, os[i] = out + ri * M;
        }
        for (Py_ssize_t b = b0; b < b1; b++) {
            float *ob[4] = {os[0] + b * PW, os[1] + b * PW, os[2] + b * PW, os[3] + b * PW};
            tile4(xs, K, wp + b * K * PW, ob, M - b * PW < PW ? M - b * PW : PW);
        }
    }
    for (; r < R; r++) {
        Py_ssize_t b = b0;
        for (; b + 4 <= b1 && (b + 4) * PW <= M; b += 4)
            row4p(x + r * K, K, wp + b * K * PW, out + r * M + b * PW);
        for (; b < b1; b++)
            row1p(x + r * K, K, wp + b * K * PW, out + r * M + b * PW, M - b * PW < PW ? M - b * PW : PW);
    }
}

/* on an AVX2 CPU without AVX-512, the 8-float kernel (_headmm_common.h HM_USE8: a flag read, set at load time) */
void mm_block(const float *x, const float *wp, float *out, Py_ssize_t R, Py_ssize_t K, Py_ssize_t M,
              Py_ssize_t b0, Py_ssize_t b1) {
#ifdef HM_MM8
    if (HM_USE8()) {
        mm_block8(x, wp, out, R, K, M, b0, b1);
        return;
    }
#endif
    mm_block16(x, wp, out, R, K, M, b0, b1);
}

/* RMS norm of each row: s = sum over k in order of x*x (float32), y = x * (1 / sqrt(s / K + eps)) */
TC void rms_rows(const float *x, float *y, Py_ssize_t R, Py_ssize_t K, float eps) {
    for (Py_ssize_t r = 0; r < R; r++, x += K, y += K) {
        float s = 0.0f;
        for (Py_ssize_t k = 0; k < K; k++)
            s = s + x[k] * x[k];
        float inv = 1.0f / sqrtf(s / (float)K + eps);
        for (Py_ssize_t k = 0; k < K; k++)
            y[k] = x[k] * inv;
    }
}

/* out = resid + (out + bias), each optional, elementwise */
TC void epilogue(float *out, const float *bias, const float *resid, Py_ssize_t R, Py_ssize_t M) {
    for (Py_ssize_t r = 0; r < R; r++, out += M) {
        if (bias != NULL)
            for (Py_ssize_t j = 0; j < M; j++)
                out[j] = out[j] + bias[j];
        if (resid != NULL) {
            const float *rr = resid + r * M;
            for (Py_ssize_t j = 0; j < M; j++)
                out[j] = rr[j] + out[j];
        }
    }
}
