/*
 * _headmm: the draft head's arithmetic (model/head_runner.py), batch-invariant by construction.
 *
 *   mm    out[r, j] = (((0 + x[r,0] w[0,j]) + x[r,1] w[1,j]) + ...) + x[r,K-1] w[K-1,j], then
 *         out = resid + (out + bias) where given, x first RMS-normed where asked (as `rms`)
 *   rms   y[r] = x[r] * (1 / sqrt(s / K + eps)), s = (((0 + x[r,0]^2) + x[r,1]^2) + ...)
 *   (mm_block, rms_rows in _headmm_mm.c); gelu, top1 (in _headmm_fn.c); a draft position and the greedy
 *   loop (_headmm_step.c); the backbone (_headmm_bb.c)
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
 * Speed: _headmm_mm.c (its tiles; on AVX2 without AVX-512, _headmm_mm8.c's) and docs/heads.md.
 *
 * Threads: a product over HM_PAR_MIN multiply-adds splits into chunks of rows x panels that the
 * calling thread and its helpers claim (_headmm_par.c); each element is computed whole by one thread
 * with the same code (_headmm_mm.c), so the bytes do not depend on the thread count or on who took which chunk.
 * The helpers touch no Python object, so they need no GIL; the caller keeps it for the head's small
 * products (tens of µs): given back, it could cost a switch interval (5 ms) to take again while
 * another Python thread runs, so only a product of HM_NOGIL_MIN or more releases it.
 *
 * The files, each using only those below it (a name another .c file defines counts as using it; each
 * .c file's exports are in the header of its name, the shared macros and types in _headmm_common.h,
 * which belongs to no file):
 *
 *   _headmm.c (the module's methods)  -> py, mm, fn, par, step, bb, proj
 *   _headmm_step.c, _headmm_bb.c      -> py, mm, fn, par
 *   _headmm_proj.c                    -> py, mm, par
 *   _headmm_par.c (helper threads)    -> mm, fn
 *   _headmm_mm.c (mm_block, rms_rows, epilogue) -> mm8;  _headmm_fn.c (gelu_rows, top1_rows) -> fn8
 *   _headmm_mm8.c, _headmm_fn8.c (AVX2 kernels), _headmm_py.c (buffers in, arrays out) -> none
 */
#include "_headmm_bb.h"
#include "_headmm_fn.h"
#include "_headmm_mm.h"
#include "_headmm_par.h"
#include "_headmm_proj.h"
#include "_headmm_py.h"
#include "_headmm_step.h"

#define HM_NOGIL_MIN 16777216 /* multiply-adds at or above which hm_mm lets other Python threads run meanwhile */

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
    if (hm_py_init() < 0)
        return NULL;
    return PyModule_Create(&moddef);
}
