/*
 * _headmm: the draft head's arithmetic (model/head_runner.py), batch-invariant by construction.
 *
 *   mm    out[r, j] = (((0 + x[r,0] w[0,j]) + x[r,1] w[1,j]) + ...) + x[r,K-1] w[K-1,j], then
 *         out = resid + (out + bias) where given, x first RMS-normed where asked (as `rms`)
 *   rms   y[r] = x[r] * (1 / sqrt(s / K + eps)), s = (((0 + x[r,0]^2) + x[r,1]^2) + ...)
 *   gelu, top1 (in _headmm_fn.c); a draft position and the greedy loop (_headmm_step.c); the backbone
 *   (_headmm_bb.c)
 *
 * in float32, each product rounded, then each sum, in that order, for every element whatever the number
 * of rows: a row's result depends on nothing but the row and w, which BLAS does not promise (it picks
 * another kernel, another summation order, for another number of rows). The Python reference models of
 * the same order are in model/headmm.py (`mm_reference`, `rms_reference`, `gelu_reference`,
 * `top1_reference`); tests/test_headmm.py requires identical bytes.
 *
 * Why no FMA: a fused multiply-add rounds once, and numpy (the reference model) has none; the file is
 * built with -ffp-contract=off so the compiler fuses nothing either. Vectorising across output columns
 * j changes no element's order, so the SIMD width (AVX-512, AVX2, SSE2: chosen at load time by
 * target_clones) gives the same bits as the scalar tail.
 *
 * Speed: rows go in tiles of 4 (32 columns a step) or 1 (128 columns a step), so a tile reads w once
 * for 4 rows where the one-row-at-a-time BLAS products read it once a row; w is read from panels
 * packed once (below). Measured: with bfloat16 panels widened on load (the shipped weights are
 * bfloat16) the products were 2x slower, not faster: at 4 rows the tile is bound by its multiplies
 * and adds, and at one row the widening cost more than the bytes it saved. 16-float vectors: one
 * AVX-512 register (measured on an AVX-512 AMD EPYC: 1.5-1.9x 8-float tiles at 4-20 rows). Without
 * AVX-512 GCC has no register for them and kept each in memory (1 GMAC/s, 40x numpy, on an AVX2-only
 * EPYC: docs/heads.md), so an AVX2 CPU without AVX-512 goes to _headmm_mm8.c's 8-float tiles, the same
 * sums in the same order (GELU, top-1, attention likewise); the SSE2 clone (no AVX2) still pays.
 *
 * Threads: a product over HM_PAR_MIN multiply-adds splits into chunks of rows x panels that the
 * calling thread and its helpers claim (_headmm_par.c); each element is computed whole by one thread
 * with the code above, so the bytes do not depend on the thread count or on who took which chunk.
 * The helpers touch no Python object, so they need no GIL; the caller keeps it for the head's small
 * products (tens of µs): given back, it could cost a switch interval (5 ms) to take again while
 * another Python thread runs, so only a product of HM_NOGIL_MIN or more releases it.
 */
#include "_headmm.h"

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

/* on an AVX2 CPU without AVX-512, the 8-float kernel (_headmm.h HM_USE8: a flag read, set at load time) */
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

PyObject *np_empty, *np_float32, *np_int64; /* numpy.empty, numpy.float32 and int64, for the results */

/* a C-contiguous float32 buffer of at least `min_ndim` dimensions */
int get_f32(PyObject *o, Py_buffer *b, int min_ndim, int writable, const char *name) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (b->ndim < min_ndim || b->itemsize != 4 || b->format == NULL || strcmp(b->format, "f") != 0) {
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous float32 array of at least %d dimension(s)", name,
                     min_ndim);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

void release_all(Py_buffer *bs, int n) {
    for (int i = 0; i < n; i++)
        if (bs[i].obj != NULL)
            PyBuffer_Release(&bs[i]);
}

PyObject *new_array(PyObject *shape, PyObject *dtype, Py_buffer *b) {
    if (shape == NULL)
        return NULL;
    PyObject *argv[2] = {shape, dtype};
    PyObject *o = PyObject_Vectorcall(np_empty, argv, 2, NULL);
    Py_DECREF(shape);
    if (o != NULL && PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        Py_CLEAR(o);
    return o;
}

/* a new float32 array shaped like x with its last axis `last`, its buffer in *b */
static PyObject *new_like(const Py_buffer *x, Py_ssize_t last, Py_buffer *b) {
    PyObject *shape = PyTuple_New(x->ndim);
    if (shape == NULL)
        return NULL;
    for (int i = 0; i < x->ndim; i++) {
        PyObject *d = PyLong_FromSsize_t(i == x->ndim - 1 ? last : x->shape[i]);
        if (d == NULL) {
            Py_DECREF(shape);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, i, d);
    }
    return new_array(shape, np_float32, b);
}

/* mm(x [..., K], wp [ceil(M/32), K, 32], M, bias [M] | None, resid [..., M] | None, rms, eps) -> out [..., M]:
 * out = resid + ((rms ? rms_rows(x) : x) @ w + bias); float32, C-contiguous */
static PyObject *hm_mm(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "mm(x, wp, M, bias, resid, rms, eps)");
        return NULL;
    }
    PyObject *ob = args[3], *orr = args[4];
    Py_ssize_t M = PyLong_AsSsize_t(args[2]);
    int rms = PyObject_IsTrue(args[5]);
    float eps = (float)PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred() || rms < 0)
        return NULL;
    Py_buffer bs[5] = {{0}}; /* x, wp, bias, resid, out */
    if (get_f32(args[0], &bs[0], 1, 0, "mm: x") < 0 || get_f32(args[1], &bs[1], 3, 0, "mm: wp") < 0 ||
        (ob != Py_None && get_f32(ob, &bs[2], 1, 0, "mm: bias") < 0) ||
        (orr != Py_None && get_f32(orr, &bs[3], 1, 0, "mm: resid") < 0)) {
        release_all(bs, 5);
        return NULL;
    }
    Py_ssize_t K = bs[0].shape[bs[0].ndim - 1], R = K > 0 ? bs[0].len / 4 / K : 0;
    if (K <= 0 || M <= 0 || bs[1].ndim != 3 || bs[1].shape[1] != K || bs[1].shape[2] != PW ||
        bs[1].shape[0] != (M + PW - 1) / PW || (ob != Py_None && (bs[2].ndim != 1 || bs[2].shape[0] != M)) ||
        (orr != Py_None && (bs[3].len != R * M * 4 || bs[3].shape[bs[3].ndim - 1] != M))) {
        PyErr_Format(PyExc_ValueError, "mm: x [..., %zd] @ w [%zd, %zd] (panels [%zd, %zd, %zd]) with its bias and "
                     "residual: the shapes do not chain", K, bs[1].ndim > 1 ? bs[1].shape[1] : 0, M, bs[1].shape[0],
                     bs[1].ndim > 1 ? bs[1].shape[1] : 0, bs[1].ndim > 2 ? bs[1].shape[2] : 0);
        release_all(bs, 5);
        return NULL;
    }
    PyObject *out = new_like(&bs[0], M, &bs[4]);
    if (out == NULL) {
        release_all(bs, 5);
        return NULL;
    }
    const float *x = (const float *)bs[0].buf;
    float *tmp = NULL;
    if (rms && R > 0) {
        tmp = PyMem_Malloc((size_t)(R * K) * sizeof(float));
        if (tmp == NULL) {
            release_all(bs, 5);
            Py_DECREF(out);
            return PyErr_NoMemory();
        }
        rms_rows(x, tmp, R, K, eps);
        x = tmp;
    }
    if (R * K * M >= HM_NOGIL_MIN) { /* long enough that waiting for the GIL back costs little */
        Py_BEGIN_ALLOW_THREADS
        mm_par(x, (const float *)bs[1].buf, (float *)bs[4].buf, R, K, M);
        Py_END_ALLOW_THREADS
    } else
        mm_par(x, (const float *)bs[1].buf, (float *)bs[4].buf, R, K, M);
    epilogue((float *)bs[4].buf, ob != Py_None ? (const float *)bs[2].buf : NULL,
             orr != Py_None ? (const float *)bs[3].buf : NULL, R, M);
    PyMem_Free(tmp);
    release_all(bs, 5);
    return out;
}

/* rms(x [..., K], eps) -> each row's RMS norm over the last axis, as rms_rows */
static PyObject *hm_rms(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "rms(x, eps)");
        return NULL;
    }
    float eps = (float)PyFloat_AsDouble(args[1]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer bs[2] = {{0}};
    if (get_f32(args[0], &bs[0], 1, 0, "rms: x") < 0)
        return NULL;
    Py_ssize_t K = bs[0].shape[bs[0].ndim - 1];
    PyObject *out = new_like(&bs[0], K, &bs[1]);
    if (out == NULL) {
        release_all(bs, 2);
        return NULL;
    }
    if (K > 0)
        rms_rows((const float *)bs[0].buf, (float *)bs[1].buf, bs[0].len / 4 / K, K, eps);
    release_all(bs, 2);
    return out;
}

/* gelu(x) -> GELU of every element (float32 in, float32 out, any shape), as gelu_rows */
static PyObject *hm_gelu(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "gelu(x)");
        return NULL;
    }
    Py_buffer bs[2] = {{0}};
    if (get_f32(args[0], &bs[0], 1, 0, "gelu: x") < 0)
        return NULL;
    PyObject *out = new_like(&bs[0], bs[0].shape[bs[0].ndim - 1], &bs[1]);
    if (out == NULL) {
        release_all(bs, 2);
        return NULL;
    }
    gelu_rows((const float *)bs[0].buf, (float *)bs[1].buf, bs[0].len / 4);
    release_all(bs, 2);
    return out;
}

/* top1(logits [B, V]) -> (c int64 [B], conf_marg float32 [B, 2]), as top1_rows */
static PyObject *hm_top1(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "top1(logits)");
        return NULL;
    }
    Py_buffer bl = {0}, bc = {0}, bm = {0};
    if (get_f32(args[0], &bl, 2, 0, "top1: logits") < 0)
        return NULL;
    Py_ssize_t B = bl.shape[0], V = bl.shape[1];
    if (bl.ndim != 2 || V < 1) {
        PyErr_SetString(PyExc_ValueError, "top1: logits must be [B, V] with V >= 1");
        PyBuffer_Release(&bl);
        return NULL;
    }
    PyObject *shape_c = Py_BuildValue("(n)", B), *shape_m = Py_BuildValue("(ni)", B, 2);
    PyObject *c = NULL, *cm = NULL, *res = NULL;
    if (shape_c != NULL && shape_m != NULL) {
        PyObject *a1[2] = {shape_c, np_int64}, *a2[2] = {shape_m, np_float32};
        c = PyObject_Vectorcall(np_empty, a1, 2, NULL);
        cm = c != NULL ? PyObject_Vectorcall(np_empty, a2, 2, NULL) : NULL;
    }
    if (cm != NULL && PyObject_GetBuffer(c, &bc, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) == 0) {
        if (PyObject_GetBuffer(cm, &bm, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) == 0) {
            top1_rows((const float *)bl.buf, B, V, (long long *)bc.buf, (float *)bm.buf);
            res = PyTuple_Pack(2, c, cm);
            PyBuffer_Release(&bm);
        }
        PyBuffer_Release(&bc);
    }
    Py_XDECREF(shape_c);
    Py_XDECREF(shape_m);
    Py_XDECREF(c);
    Py_XDECREF(cm);
    PyBuffer_Release(&bl);
    return res;
}

/* set_threads(n): the threads a product may use (1: the calling thread only); threads() -> n */
static PyObject *hm_set_threads_py(PyObject *mod, PyObject *arg) {
    (void)mod;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1 || n > HM_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "set_threads: %ld threads; 1 to %d", n, HM_MAX_THREADS);
        return NULL;
    }
    hm_set_threads((int)n);
    Py_RETURN_NONE;
}

static PyObject *hm_threads_py(PyObject *mod, PyObject *unused) {
    (void)mod, (void)unused;
    return PyLong_FromLong(hm_threads());
}

/* tune(par_min, chunk, adapt) -> the old (par_min, chunk, adapt): the multiply-adds from which a product
 * splits across threads, the size of its chunks, whether a busy core starts a solo spell (-1, 0, -1:
 * unchanged) */
static PyObject *hm_tune_py(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "tune(par_min, chunk, adapt)");
        return NULL;
    }
    long a = PyLong_AsLong(args[0]), c = PyLong_AsLong(args[1]);
    int s = (int)PyLong_AsLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    hm_tune(&a, &c, &s);
    return Py_BuildValue("(lli)", a, c, s);
}

/* par_stats() -> (jobs shared with the helpers, jobs run alone in a solo spell, chunks the helpers ran,
 * solo spells begun), since the module loaded */
static PyObject *hm_stats_py(PyObject *mod, PyObject *unused) {
    (void)mod, (void)unused;
    long v[4];
    hm_stats(v);
    return Py_BuildValue("(llll)", v[0], v[1], v[2], v[3]);
}

static PyMethodDef methods[] = {
    {"mm", (PyCFunction)(void (*)(void))hm_mm, METH_FASTCALL,
     "mm(x, wp, M, bias, resid, rms, eps) -> resid + ((rms ? rms(x) : x) @ w + bias) (wp: w [K, M] packed in "
     "32-column panels), each element summed over k in order"},
    {"rms", (PyCFunction)(void (*)(void))hm_rms, METH_FASTCALL,
     "rms(x, eps) -> each row's RMS norm over the last axis, its sum of squares in order"},
    {"gelu", (PyCFunction)(void (*)(void))hm_gelu, METH_FASTCALL,
     "gelu(x) -> 0.5 x (1 + erf(x / sqrt 2)) elementwise in float32, within 5e-7 (erf by A&S 7.1.26), bit-reproducible"},
    {"top1", (PyCFunction)(void (*)(void))hm_top1, METH_FASTCALL,
     "top1(logits) -> (arg max, [confidence, margin]) per row, a fixed-order softmax sum (top1_reference)"},
    {"step", (PyCFunction)(void (*)(void))hm_step, METH_FASTCALL,
     "step(ctx_j, prev, carry, more, markov, s1, s1b, s2, s2b, out, carry_w, V, eps) -> (logits, carry | None): "
     "one draft position (model/head_runner.py HeadRunner.step_carry)"},
    {"greedy", (PyCFunction)(void (*)(void))hm_greedy, METH_FASTCALL,
     "greedy(ctx, anchor, markov, s1, s1b, s2, s2b, out, carry_w, draft_ids, eps) -> (ids, conf, marg): every "
     "position's greedy draft, each fed to the next (HeadRunner.greedy's loop)"},
    {"backbone", (PyCFunction)(void (*)(void))hm_backbone, METH_FASTCALL,
     "backbone(win, lens, anchor, n, pos, queries, tok, q_tok, o, m1, m1b, m2, m2b, q2, o2, H, scale, eps) -> ctx: "
     "the window's attention and MLP (model/head_runner.py HeadRunner.backbone_reference's order)"},
    {"project_bf16", (PyCFunction)(void (*)(void))hm_project_bf16, METH_FASTCALL,
     "project_bf16(raw, n_taps, hidden, in_wp, in_M, in_b, c_wp, c_M, eps) -> bfloat16 rows widened (non-finite 0, "
     "clipped to 1e4), each tap RMS-normed, @ in_w + in_b, @ c_w (TorchDrafter._project_reference)"},
    {"set_threads", hm_set_threads_py, METH_O, "set_threads(n): threads a product may use, 1 to 8"},
    {"threads", hm_threads_py, METH_NOARGS, "threads() -> the threads a product may use"},
    {"par_stats", hm_stats_py, METH_NOARGS,
     "par_stats() -> (jobs shared, jobs alone in a solo spell, chunks the helpers ran, solo spells)"},
    {"tune", (PyCFunction)(void (*)(void))hm_tune_py, METH_FASTCALL,
     "tune(par_min, chunk, adapt) -> the old triple: multiply-adds from which a product splits, chunk size, "
     "whether a busy core starts a solo spell"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_headmm",
                                    "The draft head's products, batch-invariant by construction.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__headmm(void) {
    PyObject *np = PyImport_ImportModule("numpy");
    if (np == NULL)
        return NULL;
    np_empty = PyObject_GetAttrString(np, "empty");
    np_float32 = PyObject_GetAttrString(np, "float32");
    np_int64 = PyObject_GetAttrString(np, "int64");
    Py_DECREF(np);
    if (np_empty == NULL || np_float32 == NULL || np_int64 == NULL)
        return NULL;
    return PyModule_Create(&moddef);
}
