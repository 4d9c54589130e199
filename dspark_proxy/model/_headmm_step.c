/*
 * _headmm_step.c: one draft position of the head (`step`) and the greedy loop over every position
 * (`greedy`), for the _headmm extension. The same arithmetic, in the same order, as
 * model/head_runner.py composed from `mm`, `rms` and `gelu` one numpy call at a time (what
 * `HeadRunner.step_carry_reference` still does; tests/test_head_runner.py requires identical bytes):
 *
 *   z = ctx_j + markov[prev] (+ carry);  h = gelu(rms(z) @ s1 + s1b);  z = z + (h @ s2 + s2b)
 *   r = rms(z);  logits = r @ out;  carry' = r @ carry_w (when more positions follow)
 *
 * Why native: a position was ~12 Python-level calls and a round at batch 4 five positions, each call
 * a µs or more on a loaded machine; here a round's positions are one call, and the products over the
 * draft vocabulary (most of a position) and the top-1 split across the helper threads (_headmm_par.c).
 */
#include "_headmm_fn.h"
#include "_headmm_mm.h"
#include "_headmm_par.h"
#include "_headmm_py.h"
#include "_headmm_step.h"

typedef struct {
    const float *markov, *s1, *s1b, *s2, *s2b, *out, *cw; /* s1, s2, out, cw: packed panels */
    Py_ssize_t vocab, d, m, vout;                          /* markov [vocab, d]; s1 [d, m]; out [d, vout] */
    float eps;
} head_w;

/* one position for B rows: ctx rows `stride` floats apart; buf: scratch of B (4d + m) floats */
static void step_core(const head_w *w, Py_ssize_t B, const float *ctx, Py_ssize_t stride, const long long *prev,
                      const float *carry, float *logits, float *carry_out, float *buf) {
    const Py_ssize_t d = w->d, m = w->m;
    float *z = buf, *t = z + B * d, *z2 = t + B * d, *r = z2 + B * d, *h = r + B * d;
    for (Py_ssize_t b = 0; b < B; b++) {
        const float *c = ctx + b * stride, *mk = w->markov + prev[b] * d;
        float *zb = z + b * d;
        for (Py_ssize_t k = 0; k < d; k++)
            zb[k] = c[k] + mk[k];
    }
    if (carry != NULL)
        for (Py_ssize_t i = 0; i < B * d; i++)
            z[i] = z[i] + carry[i];
    rms_rows(z, t, B, d, w->eps);
    mm_par(t, w->s1, h, B, d, m);
    epilogue(h, w->s1b, NULL, B, m);
    gelu_rows(h, h, B * m);
    mm_par(h, w->s2, z2, B, m, d);
    epilogue(z2, w->s2b, z, B, d);
    rms_rows(z2, r, B, d, w->eps);
    mm_par(r, w->out, logits, B, d, w->vout);
    if (carry_out != NULL)
        mm_par(r, w->cw, carry_out, B, d, d);
}

/* the weights (args[0..6]: markov, s1, s1b, s2, s2b, out, carry_w | None) into *w, their buffers into
 * bs[0..6]; vout: the draft vocabulary's size */
static int get_weights(PyObject *const *a, Py_buffer *bs, head_w *w, Py_ssize_t vout, double eps) {
    if (get_f32(a[0], &bs[0], 2, 0, "markov") < 0 || get_f32(a[1], &bs[1], 3, 0, "s1") < 0 ||
        get_f32(a[2], &bs[2], 1, 0, "s1b") < 0 || get_f32(a[3], &bs[3], 3, 0, "s2") < 0 ||
        get_f32(a[4], &bs[4], 1, 0, "s2b") < 0 || get_f32(a[5], &bs[5], 3, 0, "out") < 0 ||
        (a[6] != Py_None && get_f32(a[6], &bs[6], 3, 0, "carry_w") < 0))
        return -1;
    Py_ssize_t d = bs[0].ndim == 2 ? bs[0].shape[1] : 0, m = bs[2].shape[0];
#define PANELS(i, K, M) (bs[i].ndim == 3 && bs[i].shape[0] == ((M) + PW - 1) / PW && bs[i].shape[1] == (K) && \
                         bs[i].shape[2] == PW)
    if (d < 1 || bs[0].shape[0] < 1 || m < 1 || vout < 1 || bs[2].ndim != 1 || bs[4].ndim != 1 ||
        bs[4].shape[0] != d || !PANELS(1, d, m) || !PANELS(3, m, d) || !PANELS(5, d, vout) ||
        (a[6] != Py_None && !PANELS(6, d, d))) {
        PyErr_Format(PyExc_ValueError, "head weights: markov [V, d], s1 [d, m] with s1b [m], s2 [m, d] with s2b "
                     "[d], out [d, %zd], carry_w [d, d], as panels (d = %zd, m = %zd): the shapes do not chain",
                     vout, d, m);
        return -1;
    }
#undef PANELS
    *w = (head_w){bs[0].buf, bs[1].buf, bs[2].buf, bs[3].buf, bs[4].buf, bs[5].buf,
                  a[6] != Py_None ? bs[6].buf : NULL, bs[0].shape[0], d, m, vout, (float)eps};
    return 0;
}

/* step(ctx_j [B, d], prev int64 [B], carry [B, d] | None, more, markov, s1, s1b, s2, s2b, out, carry_w | None, V,
 * eps) -> (logits [B, V], carry' [B, d] or None: computed when `more` and carry_w is given) */
PyObject *hm_step(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError,
                        "step(ctx_j, prev, carry, more, markov, s1, s1b, s2, s2b, out, carry_w, V, eps)");
        return NULL;
    }
    Py_ssize_t vout = PyLong_AsSsize_t(args[11]);
    double eps = PyFloat_AsDouble(args[12]);
    int more = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred() || more < 0)
        return NULL;
    Py_buffer bs[12] = {{0}}; /* weights 0..6, ctx, prev, carry, logits, carry' */
    head_w w;
    PyObject *logits = NULL, *cout = NULL, *res = NULL;
    float *buf = NULL;
    if (get_weights(args + 4, bs, &w, vout, eps) < 0 || get_f32(args[0], &bs[7], 2, 0, "ctx_j") < 0)
        goto done;
    Py_ssize_t B = bs[7].shape[0];
    if (bs[7].ndim != 2 || bs[7].shape[1] != w.d) {
        PyErr_Format(PyExc_ValueError, "step: ctx_j must be [B, %zd]", w.d);
        goto done;
    }
    if (get_ids(args[1], &bs[8], B, w.vocab, "prev") < 0 ||
        (args[2] != Py_None && get_f32(args[2], &bs[9], 2, 0, "carry") < 0))
        goto done;
    if (args[2] != Py_None && (bs[9].ndim != 2 || bs[9].shape[0] != B || bs[9].shape[1] != w.d)) {
        PyErr_Format(PyExc_ValueError, "step: carry must be [%zd, %zd]", B, w.d);
        goto done;
    }
    int want_carry = more && w.cw != NULL;
    logits = new_array(Py_BuildValue("(nn)", B, vout), np_float32, &bs[10]);
    if (logits == NULL ||
        (want_carry && (cout = new_array(Py_BuildValue("(nn)", B, w.d), np_float32, &bs[11])) == NULL))
        goto done;
    buf = PyMem_Malloc((size_t)(B * (4 * w.d + w.m) + 1) * sizeof(float));
    if (buf == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    step_core(&w, B, bs[7].buf, w.d, bs[8].buf, args[2] != Py_None ? bs[9].buf : NULL, bs[10].buf,
              want_carry ? bs[11].buf : NULL, buf);
    res = PyTuple_Pack(2, logits, want_carry ? cout : Py_None);
done:
    PyMem_Free(buf);
    release_all(bs, 12);
    Py_XDECREF(logits);
    Py_XDECREF(cout);
    return res;
}

/* greedy(ctx [B, n, d], anchor int64 [B], markov, s1, s1b, s2, s2b, out, carry_w | None, draft_ids int64 [V], eps)
 * -> (ids int64 [B, n] target ids, conf float32 [B, n], marg float32 [B, n]): position j's draft is
 * draft_ids[top-1 of step j], fed to position j + 1 (the anchor to position 0), the carry too */
PyObject *hm_greedy(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "greedy(ctx, anchor, markov, s1, s1b, s2, s2b, out, carry_w, draft_ids, eps)");
        return NULL;
    }
    double eps = PyFloat_AsDouble(args[10]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer bs[13] = {{0}}; /* weights 0..6, ctx, anchor, draft_ids, ids, conf, marg */
    PyObject *ids = NULL, *conf = NULL, *marg = NULL, *res = NULL;
    float *buf = NULL;
    head_w w;
    if (PyObject_GetBuffer(args[9], &bs[9], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto done;
    Py_ssize_t vout = bs[9].ndim == 1 ? bs[9].shape[0] : 0;
    PyBuffer_Release(&bs[9]);
    if (get_weights(args + 2, bs, &w, vout, eps) < 0 || get_ids(args[9], &bs[9], vout, w.vocab, "draft_ids") < 0 ||
        get_f32(args[0], &bs[7], 3, 0, "ctx") < 0)
        goto done;
    Py_ssize_t B = bs[7].shape[0], n = bs[7].shape[1];
    if (bs[7].ndim != 3 || bs[7].shape[2] != w.d || n < 1) {
        PyErr_Format(PyExc_ValueError, "greedy: ctx must be [B, n >= 1, %zd]", w.d);
        goto done;
    }
    if (get_ids(args[1], &bs[8], B, w.vocab, "anchor") < 0)
        goto done;
    PyObject *i64 = np_int64, *f32 = np_float32;
    if ((ids = new_array(Py_BuildValue("(nn)", B, n), i64, &bs[10])) == NULL ||
        (conf = new_array(Py_BuildValue("(nn)", B, n), f32, &bs[11])) == NULL ||
        (marg = new_array(Py_BuildValue("(nn)", B, n), f32, &bs[12])) == NULL)
        goto done;
    /* scratch: step_core's, logits [B, V], two carries [B, d], cm [B, 2], prev and c [B] (8-byte words) */
    Py_ssize_t nf = B * (4 * w.d + w.m) + B * vout + 2 * B * w.d + 2 * B;
    buf = PyMem_Malloc((size_t)(nf + 2 * 2 * B + 2) * sizeof(float));
    if (buf == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    float *scr = buf, *lg = scr + B * (4 * w.d + w.m), *ca = lg + B * vout, *cb = ca + B * w.d, *cm = cb + B * w.d;
    long long *prev = (long long *)(((uintptr_t)(cm + 2 * B) + 7) & ~(uintptr_t)7), *c = prev + B;
    const long long *dv = bs[9].buf;
    long long *oi = bs[10].buf;
    float *oc = bs[11].buf, *om = bs[12].buf;
    memcpy(prev, bs[8].buf, (size_t)B * sizeof(long long));
    const float *carry = NULL;
    for (Py_ssize_t j = 0; j < n; j++) {
        float *next = j + 1 < n && w.cw != NULL ? (carry == ca ? cb : ca) : NULL;
        step_core(&w, B, (const float *)bs[7].buf + j * w.d, n * w.d, prev, carry, lg, next, scr);
        top1_par(lg, B, vout, c, cm);
        for (Py_ssize_t b = 0; b < B; b++) {
            prev[b] = dv[c[b]];
            oi[b * n + j] = prev[b], oc[b * n + j] = cm[2 * b], om[b * n + j] = cm[2 * b + 1];
        }
        carry = next;
    }
    res = PyTuple_Pack(3, ids, conf, marg);
done:
    PyMem_Free(buf);
    release_all(bs, 13);
    Py_XDECREF(ids);
    Py_XDECREF(conf);
    Py_XDECREF(marg);
    return res;
}
