/*
 * _headmm_bb.c: the head's backbone (model/head_runner.py HeadRunner.backbone) in one call, window to
 * ctx, for the _headmm extension. The order of every sum is the one HeadRunner.backbone_reference
 * writes out in numpy (tests/test_head_runner.py requires identical bytes):
 *
 *   e = tok[anchor];  q[j] = queries[j] + e @ q_tok
 *   key_i = win[i, d:2d] + pos[i, :d], value_i = win[i, 2d:] + pos[i, d:]   (present rows i >= W - len)
 *   per head: s_i = sum over k in order of (q * scale)[k] key_i[k];  p_i = exp(s_i - max s) (the
 *             kernel's exp), z = sum of p_i over i in order, p_i = p_i / z;  att = sum over i in order
 *             of p_i value_i
 *   ctx = att @ o + (win[W-1, :d] + e);  ctx = ctx + (gelu(rms(ctx) @ m1 + m1b) @ m2 + m2b)
 *   (2 hops: ctx = ctx + attend(rms(ctx) @ q2) @ o2, the same keys and values)
 *
 * Why native: in numpy the backbone was ~15 calls (the attention's reshapes, transposes, batched
 * matmuls, mask, exp, max, sum, division, the gathers and adds), each a few us hot and 5-10x that
 * on the cold caches a round meets between an engine's forwards, around ~80 us of arithmetic; and
 * BLAS's batched matmul had no defined summation order. Here the products go through mm_par (the
 * kernel's order, its threads where large enough) and the attention runs a request a chunk
 * (hm_par_big), each request computed whole by one thread: the bytes depend neither on the batch nor
 * on the thread count.
 */
#include "_headmm_bb.h"
#include "_headmm_fn.h"
#include "_headmm_mm.h"
#include "_headmm_par.h"
#include "_headmm_py.h"

typedef struct {
    const float *pos, *queries, *tok, *q_tok, *o, *m1, *m1b, *m2, *m2b, *q2, *o2; /* q_tok .. o2: panels */
    Py_ssize_t W, d, H, m, N, vocab;
    float scale, eps;
} bb_w;

typedef struct {
    const bb_w *w;
    const float *win, *q; /* win [B, W, 3d]; q [B, n, d], the queries unscaled */
    const long long *lens;
    float *att, *scr; /* att [B, n, d]; scr: each request's keys (transposed), values and scores */
    Py_ssize_t n, per;
    int build; /* 1: build the keys and values first (the first hop; the second reuses them) */
} att_job;

/* One request's attention: q [n, d] over its present rows i0 .. W-1 → att [n, d]. scr: kt [d][Wp]
 * (key c of row i at c Wp + i, Wp = W rounded up to 16, absent rows 0: a score runs over 16 rows in a
 * vector, each row's sum still in k order), vv [W][d] (values), s [4][Wp] (scores). */
static inline __attribute__((always_inline)) void softmax_row(float *s, Py_ssize_t i0, Py_ssize_t W, Py_ssize_t Wp) {
    float mx = -INFINITY;
    for (Py_ssize_t i = i0; i < W; i++)
        mx = s[i] > mx ? s[i] : mx;
    for (Py_ssize_t i = 0; i < Wp; i += 16) { /* absent rows' lanes too (unread): kept <= 0, exp16's domain */
        v16 e = LD(s + i) - mx;
        const v16 zero = {0};
        e = SEL(e > zero, zero, e);
        exp16(&e);
        ST(s + i, e);
    }
    float z = 0.0f;
    for (Py_ssize_t i = i0; i < W; i++)
        z = z + s[i];
    for (Py_ssize_t i = i0; i < W; i++)
        s[i] = s[i] / z;
}

TC16 static void attend_one(const bb_w *w, const float *win, Py_ssize_t len, const float *q, float *att, Py_ssize_t n,
                          float *scr, int build) {
    const Py_ssize_t W = w->W, d = w->d, H = w->H, dh = d / H, i0 = W - len, Wp = (W + 15) / 16 * 16;
    float *kt = scr, *vv = kt + d * Wp, *s = vv + W * d;
    const float scale = w->scale;
    if (build) {
        for (Py_ssize_t c = 0; c < d; c++) {
            for (Py_ssize_t i = 0; i < i0; i++)
                kt[c * Wp + i] = 0.0f;
            for (Py_ssize_t i = W; i < Wp; i++)
                kt[c * Wp + i] = 0.0f;
        }
        for (Py_ssize_t i = i0; i < W; i++) {
            const float *r = win + i * 3 * d + d, *p = w->pos + i * 2 * d;
            for (Py_ssize_t c = 0; c < d; c++)
                kt[c * Wp + i] = r[c] + p[c];
            for (Py_ssize_t c = 0; c < d; c++)
                vv[i * d + c] = r[d + c] + p[d + c];
        }
    }
    for (Py_ssize_t h = 0; h < H; h++)
        for (Py_ssize_t j0 = 0; j0 < n; j0 += 4) { /* up to 4 queries at once: 4 independent sums a lane */
            const Py_ssize_t nj = n - j0 < 4 ? n - j0 : 4;
            const float *q0 = q + j0 * d + h * dh;
            const float *qr[4] = {q0, q0 + (nj > 1) * d, q0 + (nj > 2) * 2 * d, q0 + (nj > 3) * 3 * d};
            for (Py_ssize_t blk = 0; blk < Wp; blk += 16) {
                v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
                const float *kr = kt + h * dh * Wp + blk;
                for (Py_ssize_t k = 0; k < dh; k++, kr += Wp) {
                    const v16 kv = LD(kr);
                    a0 = a0 + (qr[0][k] * scale) * kv, a1 = a1 + (qr[1][k] * scale) * kv;
                    a2 = a2 + (qr[2][k] * scale) * kv, a3 = a3 + (qr[3][k] * scale) * kv;
                }
                ST(s + blk, a0), ST(s + Wp + blk, a1), ST(s + 2 * Wp + blk, a2), ST(s + 3 * Wp + blk, a3);
            }
            for (Py_ssize_t u = 0; u < nj; u++) {
                float *su = s + u * Wp, *o = att + (j0 + u) * d + h * dh;
                softmax_row(su, i0, W, Wp);
                Py_ssize_t k = 0;
                for (; k + 16 <= dh; k += 16) { /* each output lane summed over the rows in order */
                    v16 acc = {0};
                    const float *vr = vv + i0 * d + h * dh + k;
                    for (Py_ssize_t i = i0; i < W; i++, vr += d)
                        acc = acc + su[i] * LD(vr);
                    ST(o + k, acc);
                }
                for (; k < dh; k++) {
                    float acc = 0.0f;
                    for (Py_ssize_t i = i0; i < W; i++)
                        acc = acc + su[i] * vv[i * d + h * dh + k];
                    o[k] = acc;
                }
            }
        }
}

#ifdef HM_MM8
#pragma GCC push_options
#pragma GCC target("avx2")
/* attend_one and softmax_row in 8-float vectors, for an AVX2 CPU without AVX-512 (_headmm_common.h HM_MM8):
 * every lane the same operations in the same order (a 16-row block of scores and a 16-column block of
 * values as two 8-lane halves), so the same bytes; the keys and values built as there */
static void softmax_row8(float *s, Py_ssize_t i0, Py_ssize_t W, Py_ssize_t Wp) {
    float mx = -INFINITY;
    for (Py_ssize_t i = i0; i < W; i++)
        mx = s[i] > mx ? s[i] : mx;
    for (Py_ssize_t i = 0; i < Wp; i += 8) {
        v8 e = LD8(s + i) - mx;
        const v8 zero = {0};
        e = SEL8(e > zero, zero, e);
        exp8(&e);
        ST8(s + i, e);
    }
    float z = 0.0f;
    for (Py_ssize_t i = i0; i < W; i++)
        z = z + s[i];
    for (Py_ssize_t i = i0; i < W; i++)
        s[i] = s[i] / z;
}

static void attend_one8(const bb_w *w, const float *win, Py_ssize_t len, const float *q, float *att, Py_ssize_t n,
                        float *scr, int build) {
    const Py_ssize_t W = w->W, d = w->d, H = w->H, dh = d / H, i0 = W - len, Wp = (W + 15) / 16 * 16;
    float *kt = scr, *vv = kt + d * Wp, *s = vv + W * d;
    const float scale = w->scale;
    if (build) {
        for (Py_ssize_t c = 0; c < d; c++) {
            for (Py_ssize_t i = 0; i < i0; i++)
                kt[c * Wp + i] = 0.0f;
            for (Py_ssize_t i = W; i < Wp; i++)
                kt[c * Wp + i] = 0.0f;
        }
        for (Py_ssize_t i = i0; i < W; i++) {
            const float *r = win + i * 3 * d + d, *p = w->pos + i * 2 * d;
            for (Py_ssize_t c = 0; c < d; c++)
                kt[c * Wp + i] = r[c] + p[c];
            for (Py_ssize_t c = 0; c < d; c++)
                vv[i * d + c] = r[d + c] + p[d + c];
        }
    }
    for (Py_ssize_t h = 0; h < H; h++)
        for (Py_ssize_t j0 = 0; j0 < n; j0 += 4) {
            const Py_ssize_t nj = n - j0 < 4 ? n - j0 : 4;
            const float *q0 = q + j0 * d + h * dh;
            const float *qr[4] = {q0, q0 + (nj > 1) * d, q0 + (nj > 2) * 2 * d, q0 + (nj > 3) * 3 * d};
            for (Py_ssize_t blk = 0; blk < Wp; blk += 8) {
                v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
                const float *kr = kt + h * dh * Wp + blk;
                for (Py_ssize_t k = 0; k < dh; k++, kr += Wp) {
                    const v8 kv = LD8(kr);
                    a0 = a0 + (qr[0][k] * scale) * kv, a1 = a1 + (qr[1][k] * scale) * kv;
                    a2 = a2 + (qr[2][k] * scale) * kv, a3 = a3 + (qr[3][k] * scale) * kv;
                }
                ST8(s + blk, a0), ST8(s + Wp + blk, a1), ST8(s + 2 * Wp + blk, a2), ST8(s + 3 * Wp + blk, a3);
            }
            for (Py_ssize_t u = 0; u < nj; u++) {
                float *su = s + u * Wp, *o = att + (j0 + u) * d + h * dh;
                softmax_row8(su, i0, W, Wp);
                Py_ssize_t k = 0;
                for (; k + 16 <= dh; k += 16) {
                    v8 acc0 = {0}, acc1 = {0};
                    const float *vr = vv + i0 * d + h * dh + k;
                    for (Py_ssize_t i = i0; i < W; i++, vr += d)
                        acc0 = acc0 + su[i] * LD8(vr), acc1 = acc1 + su[i] * LD8(vr + 8);
                    ST8(o + k, acc0), ST8(o + k + 8, acc1);
                }
                for (; k < dh; k++) {
                    float acc = 0.0f;
                    for (Py_ssize_t i = i0; i < W; i++)
                        acc = acc + su[i] * vv[i * d + h * dh + k];
                    o[k] = acc;
                }
            }
        }
}
#pragma GCC pop_options
#endif

static void attend_chunk(void *arg, Py_ssize_t b) {
    const att_job *j = arg;
    const bb_w *w = j->w;
#ifdef HM_MM8
    if (HM_USE8()) {
        attend_one8(w, j->win + b * w->W * 3 * w->d, (Py_ssize_t)j->lens[b], j->q + b * j->n * w->d,
                    j->att + b * j->n * w->d, j->n, j->scr + b * j->per, j->build);
        return;
    }
#endif
    attend_one(w, j->win + b * w->W * 3 * w->d, (Py_ssize_t)j->lens[b], j->q + b * j->n * w->d,
               j->att + b * j->n * w->d, j->n, j->scr + b * j->per, j->build);
}

/* every request's attention, a request a chunk across the helper threads once it is large enough */
static void attend_all(att_job *j, Py_ssize_t B) {
    const bb_w *w = j->w;
    hm_par_big(B, (long long)B * 2 * j->n * w->d * w->W, attend_chunk, j);
}

/* the backbone for B requests into out [B, n, d]; buf: scratch (see hm_backbone) */
static void backbone_core(const bb_w *w, Py_ssize_t B, Py_ssize_t n, const float *win, const long long *lens,
                          const long long *anchor, float *out, float *buf) {
    const Py_ssize_t d = w->d, W = w->W, R = B * n;
    float *e = buf, *qt = e + B * d, *q = qt + B * d, *att = q + R * d, *t = att + R * d, *c2 = t + R * d;
    float *hb = c2 + R * d, *scr = hb + R * w->m;
    for (Py_ssize_t b = 0; b < B; b++)
        memcpy(e + b * d, w->tok + anchor[b] * d, (size_t)d * sizeof(float));
    mm_par(e, w->q_tok, qt, B, d, d);
    for (Py_ssize_t b = 0; b < B; b++)
        for (Py_ssize_t j = 0; j < n; j++)
            for (Py_ssize_t c = 0; c < d; c++)
                q[(b * n + j) * d + c] = w->queries[j * d + c] + qt[b * d + c];
    att_job job = {w, win, q, lens, att, scr, n, 2 * d * ((W + 15) / 16 * 16) + 4 * ((W + 15) / 16 * 16), 1};
    attend_all(&job, B);
    float *ctx = out;
    mm_par(att, w->o, ctx, R, d, d);
    for (Py_ssize_t b = 0; b < B; b++) { /* + (the last row's d term + e) */
        const float *last = win + (b * W + W - 1) * 3 * d;
        for (Py_ssize_t c = 0; c < d; c++)
            qt[b * d + c] = last[c] + e[b * d + c];
        for (Py_ssize_t j = 0; j < n; j++)
            for (Py_ssize_t c = 0; c < d; c++)
                ctx[(b * n + j) * d + c] = ctx[(b * n + j) * d + c] + qt[b * d + c];
    }
    rms_rows(ctx, t, R, d, w->eps);
    mm_par(t, w->m1, hb, R, d, w->m);
    epilogue(hb, w->m1b, NULL, R, w->m);
    gelu_rows(hb, hb, R * w->m);
    mm_par(hb, w->m2, c2, R, w->m, d);
    epilogue(c2, w->m2b, ctx, R, d); /* c2 = ctx + (h @ m2 + m2b) */
    if (w->q2 == NULL) {
        memcpy(out, c2, (size_t)(R * d) * sizeof(float));
        return;
    }
    rms_rows(c2, t, R, d, w->eps);
    mm_par(t, w->q2, q, R, d, d);
    job.build = 0;
    attend_all(&job, B);
    mm_par(att, w->o2, out, R, d, d);
    epilogue(out, NULL, c2, R, d); /* out = c2 + att @ o2 */
}

/* lens: a C-contiguous int64 array of B values in 1 .. W */
static int get_lens(PyObject *o, Py_buffer *b, Py_ssize_t B, Py_ssize_t W) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = b->format;
    if (b->ndim != 1 || b->itemsize != 8 || f == NULL || (strcmp(f, "q") && strcmp(f, "l")) || b->shape[0] != B) {
        PyErr_Format(PyExc_ValueError, "backbone: lens must be a C-contiguous int64 array of %zd values", B);
        PyBuffer_Release(b);
        return -1;
    }
    const long long *v = b->buf;
    for (Py_ssize_t i = 0; i < B; i++)
        if (v[i] < 1 || v[i] > W) {
            PyErr_Format(PyExc_ValueError, "backbone: lens[%zd] = %lld: the rows present are 1 .. %zd", i, v[i], W);
            PyBuffer_Release(b);
            return -1;
        }
    return 0;
}

#define PANELS(i, K, M) (bs[i].ndim == 3 && bs[i].shape[0] == ((M) + PW - 1) / PW && bs[i].shape[1] == (K) && \
                         bs[i].shape[2] == PW)

/* backbone(win [B, W, 3d], lens int64 [B], anchor int64 [B], n, pos [W, 2d], queries [N, d], tok [V, d], q_tok,
 * o, m1, m1b [m], m2, m2b [d], q2 | None, o2 | None, H, scale, eps) -> ctx [B, n, d]; q_tok .. o2 as panels */
PyObject *hm_backbone(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 18) {
        PyErr_SetString(PyExc_TypeError, "backbone(win, lens, anchor, n, pos, queries, tok, q_tok, o, m1, m1b, m2, "
                                         "m2b, q2, o2, H, scale, eps)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[3]), H = PyLong_AsSsize_t(args[15]);
    double scale = PyFloat_AsDouble(args[16]), eps = PyFloat_AsDouble(args[17]);
    if (PyErr_Occurred())
        return NULL;
    int two = args[13] != Py_None;
    if (two != (args[14] != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "backbone: q2 and o2 come together (a 2-hop head) or not at all");
        return NULL;
    }
    /* pos, queries, tok, q_tok, o, m1, m1b, m2, m2b, q2, o2 (0..10), win, lens, anchor, out (11..14) */
    Py_buffer bs[15] = {{0}};
    PyObject *out = NULL;
    float *buf = NULL;
    static const char *names[] = {"pos", "queries", "tok", "q_tok", "o", "m1", "m1b", "m2", "m2b", "q2", "o2"};
    static const int nd[] = {2, 2, 2, 3, 3, 3, 1, 3, 1, 3, 3};
    for (int i = 0; i < (two ? 11 : 9); i++)
        if (get_f32(args[4 + i], &bs[i], nd[i], 0, names[i]) < 0)
            goto done;
    if (get_f32(args[0], &bs[11], 3, 0, "backbone: win") < 0)
        goto done;
    Py_ssize_t B = bs[11].shape[0], W = bs[11].shape[1], d = bs[0].shape[1] / 2, m = bs[6].shape[0];
    if (bs[11].ndim != 3 || W < 1 || H < 1 || d < 1 || d % H != 0 || bs[11].shape[2] != 3 * d ||
        bs[0].ndim != 2 || bs[0].shape[0] != W || bs[0].shape[1] != 2 * d || bs[1].ndim != 2 ||
        bs[1].shape[1] != d || bs[2].ndim != 2 || bs[2].shape[1] != d || bs[2].shape[0] < 1 || m < 1 ||
        bs[6].ndim != 1 || bs[8].ndim != 1 || bs[8].shape[0] != d || !PANELS(3, d, d) || !PANELS(4, d, d) ||
        !PANELS(5, d, m) || !PANELS(7, m, d) || (two && (!PANELS(9, d, d) || !PANELS(10, d, d)))) {
        PyErr_Format(PyExc_ValueError, "backbone: win [B, W, 3d] with pos [W, 2d], queries [N, d], tok [V, d], q_tok "
                     "and o [d, d], m1 [d, m] with m1b [m], m2 [m, d] with m2b [d], q2 and o2 [d, d] as panels, d a "
                     "multiple of H = %zd: the shapes do not chain", H);
        goto done;
    }
    Py_ssize_t N = bs[1].shape[0];
    if (n < 1 || n > N) {
        PyErr_Format(PyExc_ValueError, "backbone: n = %zd positions; 1 .. %zd", n, N);
        goto done;
    }
    if (get_lens(args[1], &bs[12], B, W) < 0 || get_ids(args[2], &bs[13], B, bs[2].shape[0], "anchor") < 0)
        goto done;
    if ((out = new_array(Py_BuildValue("(nnn)", B, n, d), np_float32, &bs[14])) == NULL || B == 0)
        goto done;
    /* e, qt [B, d]; q, att, t, c2 [B n, d]; h [B n, m]; each request's kt, vv [d Wp], scores [4 Wp] */
    Py_ssize_t Wp = (W + 15) / 16 * 16, per = 2 * d * Wp + 4 * Wp;
    buf = PyMem_Malloc((size_t)(2 * B * d + 4 * B * n * d + B * n * m + B * per) * sizeof(float));
    if (buf == NULL) {
        PyErr_NoMemory();
        Py_CLEAR(out);
        goto done;
    }
    bb_w w = {bs[0].buf, bs[1].buf, bs[2].buf, bs[3].buf, bs[4].buf, bs[5].buf, bs[6].buf, bs[7].buf, bs[8].buf,
              two ? bs[9].buf : NULL, two ? bs[10].buf : NULL, W, d, H, m, N, bs[2].shape[0], (float)scale,
              (float)eps};
    backbone_core(&w, B, n, bs[11].buf, bs[12].buf, bs[13].buf, bs[14].buf, buf);
done:
    PyMem_Free(buf);
    release_all(bs, 15);
    return out;
}
