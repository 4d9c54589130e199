/*
 * _headmm_fn8.c: _headmm_fn.c's GELU and top-1 in 8-float vectors, for a CPU with AVX2 but no AVX-512,
 * where a 16-float vector has no register and GCC kept each in memory (as the products: _headmm_mm8.c).
 *
 * The same bytes as _headmm_fn.c: the GELU and exp are elementwise, the same operations on each lane
 * (_headmm_common.h's exp8 is its exp16 line for line); top-1 keeps the 16 interleaved lanes of its max and of its
 * sum as two 8-float halves (lanes 0-7, 8-15), each lane's double sum in the same order, and adds them
 * up lane 0 to 15 as top1_rows16 does (model/headmm.py `top1_reference` defines it).
 */
#include "_headmm_fn8.h"

#ifdef HM_MM8

#pragma GCC target("avx2")

typedef float v4 __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));

/* _headmm_fn.c's gelu16 on 8 lanes */
static inline __attribute__((always_inline)) void gelu8(const float *xs, float *out) {
    v8 x = LD8(xs);
    v8 z = x * 0.70710678118654752f;
    const v8 lo = z * 0.0f - 6.0f, hi = -lo;
    z = SEL8(z < lo, lo, z);
    z = SEL8(z > hi, hi, z);
    v8i neg = z < 0.0f;
    v8 az = SEL8(neg, -z, z);
    v8 t = 1.0f / (1.0f + G_P * az);
    v8 e = -(az * az);
    exp8(&e);
    v8 poly = ((((G_A5 * t + G_A4) * t + G_A3) * t + G_A2) * t + G_A1) * t;
    v8 erfa = 1.0f - poly * e;
    v8 erf = SEL8(neg, -erfa, erfa);
    ST8(out, 0.5f * x * (1.0f + erf));
}

void gelu_rows8(const float *x, float *y, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        gelu8(x + i, y + i);
    if (i < n) {
        float xt[8] = {0}, yt[8];
        memcpy(xt, x + i, (size_t)(n - i) * sizeof(float));
        gelu8(xt, yt);
        memcpy(y + i, yt, (size_t)(n - i) * sizeof(float));
    }
}

/* _headmm_fn.c's vmax_skip: lanes 0-7 in m0, 8-15 in m1, then reduced lane 0 to 15 */
static inline __attribute__((always_inline)) float vmax_skip8(const float *l, Py_ssize_t V, Py_ssize_t skip,
                                                              int *nan) {
    v8 m0 = (v8){0} - INFINITY, m1 = m0;
    v8i bad = (v8i){0};
    Py_ssize_t j = 0;
    float t[16];
    for (; j + 16 <= V; j += 16) {
        const float *s = l + j;
        if (skip >= j && skip < j + 16) {
            memcpy(t, l + j, sizeof t);
            t[skip - j] = -INFINITY;
            s = t;
        }
        v8 v0 = LD8(s), v1 = LD8(s + 8);
        bad |= (v0 != v0) | (v1 != v1);
        m0 = SEL8(v0 > m0, v0, m0), m1 = SEL8(v1 > m1, v1, m1);
    }
    for (int k = 0; k < 16; k++)
        t[k] = j + k < V && j + k != skip ? l[j + k] : -INFINITY;
    v8 v0 = LD8(t), v1 = LD8(t + 8);
    bad |= (v0 != v0) | (v1 != v1);
    m0 = SEL8(v0 > m0, v0, m0), m1 = SEL8(v1 > m1, v1, m1);
    float r = m0[0];
    int any = 0;
    for (int k = 1; k < 16; k++) {
        float mk = k < 8 ? m0[k] : m1[k - 8];
        r = mk > r ? mk : r;
    }
    for (int k = 0; k < 8; k++)
        any |= bad[k];
    *nan = any != 0;
    return r;
}

#define CVT_LO(e) __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3), v4d)
#define CVT_HI(e) __builtin_convertvector(__builtin_shufflevector(e, e, 4, 5, 6, 7), v4d)

void top1_rows8(const float *l, Py_ssize_t B, Py_ssize_t V, long long *c_out, float *cm) {
    for (Py_ssize_t b = 0; b < B; b++, l += V) {
        int nan;
        float top = vmax_skip8(l, V, -1, &nan);
        Py_ssize_t c = 0;
        if (nan) { /* numpy's argmax: the first NaN */
            while (l[c] == l[c])
                c++;
            top = l[c];
        } else
            while (l[c] != top)
                c++;
        int nan2;
        float second = V > 1 ? vmax_skip8(l, V, c, &nan2) : 0.0f;
        v4d p[4] = {{0}}; /* the double sums of lanes 0-3, 4-7, 8-11, 12-15 */
        const v8 topv = (v8){0} + top;
        for (Py_ssize_t j = 0; j < V; j += 16) {
            v8 e0, e1;
            if (j + 16 <= V)
                e0 = LD8(l + j) - topv, e1 = LD8(l + j + 8) - topv;
            else {
                float t[16];
                for (int k = 0; k < 16; k++)
                    t[k] = j + k < V ? l[j + k] : top;
                e0 = LD8(t) - topv, e1 = LD8(t + 8) - topv;
            }
            exp8(&e0), exp8(&e1);
            if (j + 16 > V)
                for (int k = 0; k < 16; k++)
                    if (j + k >= V) {
                        if (k < 8)
                            e0[k] = 0.0f;
                        else
                            e1[k - 8] = 0.0f;
                    }
            p[0] = p[0] + CVT_LO(e0), p[1] = p[1] + CVT_HI(e0);
            p[2] = p[2] + CVT_LO(e1), p[3] = p[3] + CVT_HI(e1);
        }
        double tot = p[0][0];
        for (int k = 1; k < 16; k++)
            tot = tot + p[k / 4][k % 4];
        double e2 = -1.0;
        if (V > 1) {
            v8 dv = (v8){0} + (second - top);
            exp8(&dv);
            e2 = (double)dv[0];
        }
        c_out[b] = (long long)c;
        cm[2 * b] = (float)(1.0 / tot);
        cm[2 * b + 1] = (float)((1.0 - e2) / tot);
    }
}

#endif
