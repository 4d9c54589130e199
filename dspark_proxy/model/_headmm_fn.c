/*
 * _headmm_fn.c: the draft head's elementwise GELU and its top-1, for the _headmm extension (_headmm.c),
 * each reproduced byte for byte by its Python reference model in model/headmm.py (`gelu_reference`,
 * `top1_reference`, `exp_reference`): only +, -, *, / and exact bit moves, no libm, and no FMA (the
 * extension is built with -ffp-contract=off).
 */
#include "_headmm_fn.h"
#include "_headmm_fn8.h"

/* GELU, 0.5 x (1 + erf(x / sqrt 2)), in float32 from +, -, *, / and exact bit moves only, so numpy
 * reproduces it to the bit (model/headmm.py `gelu_reference`): erf by Abramowitz & Stegun 7.1.26 (error
 * under 1.5e-7), its exp(-z^2) by n = round(-z^2 / ln 2), a degree-7 Taylor polynomial of the rest
 * (|r| <= ln2 / 2: error 5e-9) and 2^n from n's bits; z clipped to [-6, 6], where erf is +-1 in float.
 * Within 5e-7 of the exact GELU (torch's float32 one: 1.1e-6). 16 lanes at a time: libm's erf, one element
 * at a time, cost 5x torch's call, and torch's call itself is ~7 us, most of a small step. */

/* its constants G_P, G_A1..G_A5: _headmm_common.h */

/* out[0..15] = GELU(x[0..15]) */
static inline __attribute__((always_inline)) void gelu16(const float *xs, float *out) {
    v16 x = *(const v16fu *)xs;
    v16 z = x * 0.70710678118654752f;
    const v16 lo = z * 0.0f - 6.0f, hi = -lo;
    z = SEL(z < lo, lo, z);
    z = SEL(z > hi, hi, z);
    v16i neg = z < 0.0f;
    v16 az = SEL(neg, -z, z);
    v16 t = 1.0f / (1.0f + G_P * az);
    v16 e = -(az * az); /* y in [-36, 0] */
    exp16(&e);
    v16 poly = ((((G_A5 * t + G_A4) * t + G_A3) * t + G_A2) * t + G_A1) * t;
    v16 erfa = 1.0f - poly * e;
    v16 erf = SEL(neg, -erfa, erfa);
    *(v16fu *)out = 0.5f * x * (1.0f + erf);
}

TC16 static void gelu_rows16(const float *x, float *y, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)
        gelu16(x + i, y + i);
    if (i < n) {
        float xt[16] = {0}, yt[16];
        memcpy(xt, x + i, (size_t)(n - i) * sizeof(float));
        gelu16(xt, yt);
        memcpy(y + i, yt, (size_t)(n - i) * sizeof(float));
    }
}

/* One row's top-1 over its V logits: c = the first index of the max (of the first NaN, as numpy's
 * argmax), conf = 1 / sum_j exp(l_j - l_c), marg = (1 - exp(l_2nd - l_c)) / sum (the runner-up: the max
 * over j != c; with V = 1 none, and exp(...) taken as -1, as numpy's top1 had it), exp by exp16, the sum in double over 16
 * interleaved partial sums (lane k: j = k, k + 16, ...; the last block zero-padded) added lane 0 to
 * 15: a fixed order (model/headmm.py `top1_reference`). */
typedef double v8db __attribute__((vector_size(64)));

/* the max of l[0..V) with l[skip] left out (skip < 0: none), 16 lanes at a time; *nan set when a NaN
 * was seen (max is exact, so any order gives the same value) */
static inline __attribute__((always_inline)) float vmax_skip(const float *l, Py_ssize_t V, Py_ssize_t skip,
                                                             int *nan) {
    v16 m = (v16){0} - INFINITY;
    v16i bad = (v16i){0};
    Py_ssize_t j = 0;
    float t[16];
    for (; j + 16 <= V; j += 16) {
        v16 v;
        if (skip >= j && skip < j + 16) {
            memcpy(t, l + j, sizeof t);
            t[skip - j] = -INFINITY;
            v = *(const v16fu *)t;
        } else
            v = *(const v16fu *)(l + j);
        bad |= v != v;
        m = SEL(v > m, v, m);
    }
    for (int k = 0; k < 16; k++)
        t[k] = j + k < V && j + k != skip ? l[j + k] : -INFINITY;
    v16 v = *(const v16fu *)t;
    bad |= v != v;
    m = SEL(v > m, v, m);
    float r = m[0];
    int any = bad[0];
    for (int k = 1; k < 16; k++)
        r = m[k] > r ? m[k] : r, any |= bad[k];
    *nan = any != 0;
    return r;
}

TC16 static void top1_rows16(const float *l, Py_ssize_t B, Py_ssize_t V, long long *c_out, float *cm) {
    for (Py_ssize_t b = 0; b < B; b++, l += V) {
        int nan;
        float top = vmax_skip(l, V, -1, &nan);
        Py_ssize_t c = 0;
        if (nan) { /* numpy's argmax: the first NaN */
            while (l[c] == l[c])
                c++;
            top = l[c];
        } else
            while (l[c] != top)
                c++;
        int nan2;
        float second = V > 1 ? vmax_skip(l, V, c, &nan2) : 0.0f;
        v8db p0 = {0}, p1 = {0};
        const v16 topv = (v16){0} + top;
        Py_ssize_t j = 0;
        for (; j < V; j += 16) {
            v16 e;
            if (j + 16 <= V)
                e = *(const v16fu *)(l + j) - topv;
            else {
                float t[16];
                for (int k = 0; k < 16; k++)
                    t[k] = j + k < V ? l[j + k] : top;
                e = *(const v16fu *)t - topv;
            }
            exp16(&e);
            if (j + 16 > V)
                for (int k = 0; k < 16; k++)
                    if (j + k >= V)
                        e[k] = 0.0f;
            p0 = p0 + __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3, 4, 5, 6, 7), v8db);
            p1 = p1 + __builtin_convertvector(__builtin_shufflevector(e, e, 8, 9, 10, 11, 12, 13, 14, 15), v8db);
        }
        double tot = p0[0];
        for (int k = 1; k < 8; k++)
            tot = tot + p0[k];
        for (int k = 0; k < 8; k++)
            tot = tot + p1[k];
        double e2 = -1.0;
        if (V > 1) {
            v16 d = (v16){0} + (second - top);
            exp16(&d);
            e2 = (double)d[0];
        }
        c_out[b] = (long long)c;
        cm[2 * b] = (float)(1.0 / tot);
        cm[2 * b + 1] = (float)((1.0 - e2) / tot);
    }
}

/* on an AVX2 CPU without AVX-512, the 8-float versions (_headmm_fn8.c: the same bytes) */
void gelu_rows(const float *x, float *y, Py_ssize_t n) {
#ifdef HM_MM8
    if (HM_USE8()) {
        gelu_rows8(x, y, n);
        return;
    }
#endif
    gelu_rows16(x, y, n);
}

void top1_rows(const float *l, Py_ssize_t B, Py_ssize_t V, long long *c_out, float *cm) {
#ifdef HM_MM8
    if (HM_USE8()) {
        top1_rows8(l, B, V, c_out, cm);
        return;
    }
#endif
    top1_rows16(l, B, V, c_out, cm);
}
