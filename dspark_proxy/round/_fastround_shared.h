/*
 * _fastround_shared.h: what the two halves of _fastround share (buffers, int64 arithmetic as numpy does it,
 * the slot and entry field indices, little-endian field access). _fastround.c has the overview.
 * It is named for no .c file on purpose: every file may include it, and the files use each other only
 * downwards (tests/test_layering.py): _fastround.c (the module's method table) uses the others,
 * fused uses accept, page and proxy; accept, proxy and stats use held; none uses _fastround.c.
 */
#ifndef DSPARK_FASTROUND_SHARED_H
#define DSPARK_FASTROUND_SHARED_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

/* The GIL is let go around a copy only when the copy is long enough for another thread to use the
 * time: a release and re-take cost some 0.2 us, and any thread waiting for the GIL takes it, the round
 * then waiting for it back. A round's small copies (n = 1: a few hundred bytes) keep it. */
#define GIL_FREE_ABOVE ((Py_ssize_t)1 << 16)
#define BEGIN_MAYBE_ALLOW_THREADS(nbytes) \
    {                                     \
        PyThreadState *_maybe_save = (nbytes) > GIL_FREE_ABOVE ? PyEval_SaveThread() : NULL;
#define END_MAYBE_ALLOW_THREADS        \
        if (_maybe_save)                \
            PyEval_RestoreThread(_maybe_save); \
    }

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "_fastround: the segment layout is little-endian"
#endif

/* Field offsets inside a slot, in the order native.py's _META_FIELDS / _DESC_FIELDS list them. */
enum { M_START, M_T, M_N, M_ROWS, M_VALID, M_FIRST, M_ANCHOR, M_STAGED, M_SAMPLED, M_SEED, M_TEMP, M_END, M_COUNT };
enum { D_START, D_T, D_N, D_MAXQ, D_ROWS, D_NSTAGED, D_STAGED, D_REQ, D_SLOT, D_QSL, D_NEED, D_K, D_END, D_COUNT };
/* ENTRY_DTYPE's field offsets, in the order native.py's _ENTRY_FIELDS lists them */
enum { E_SLOT, E_NROWS, E_GEN, E_FIRST, E_ANCHOR, E_TOKEN, E_FLAGS, E_K, E_NOUT, E_COUNT };

/* ------------------------------------------------------------------ buffers */

/* Get a C-contiguous buffer of at least `count` items of `itemsize` bytes; ValueError otherwise. */
static inline int get_arr(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, Py_ssize_t count, int writable,
                   const char *name) {
    if (PyObject_GetBuffer(o, b, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (b->itemsize != itemsize || b->len < count * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd items of %zd bytes, got %zd bytes of items of %zd",
                     name, count, itemsize, b->len, b->itemsize);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* Release every buffer of a NULL-terminated list that was acquired (obj != NULL). */
static inline void release_all(Py_buffer **bs) {
    for (; *bs; bs++)
        if ((*bs)->obj)
            PyBuffer_Release(*bs);
}

/* int64 arithmetic as numpy does it: wrapping (a position near 2**63 from a bad caller must not be
 * undefined behaviour), and a modulo that is never negative (numpy's %, so a wrapped position still
 * lands inside its slot's block) */
static inline int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t pmod(int64_t a, int64_t m) {
    int64_t r = a % m;
    return r < 0 ? r + m : r;
}

/* check_round's test of a round's metadata (inputs.py check_round is the reference): 1 when a slot
 * is outside [0, M), a valid count outside [0, W], a first position or k_window negative, or qsl
 * decreasing; else 2 when a slot appears twice (mark [M] is scratch); else 0. *total: the rows. As
 * uint64 a negative value is huge, so one comparison checks both ends. */
static inline int check_round_core(const int64_t *slots, const int64_t *valid, const int64_t *first, const int64_t *k,
                                   const int64_t *qsl, int64_t *mark, Py_ssize_t n, Py_ssize_t M, Py_ssize_t W,
                                   int64_t *total) {
    int code = 0;
    int64_t sum = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((uint64_t)slots[i] >= (uint64_t)M || (uint64_t)valid[i] > (uint64_t)W || (first[i] | k[i]) < 0 ||
            qsl[i + 1] < qsl[i])
            code = 1;
        sum += valid[i];
    }
    if (!code && n) {
        for (Py_ssize_t i = 0; i < n; i++)
            mark[slots[i]] = i;
        for (Py_ssize_t i = 0; i < n; i++)
            if (mark[slots[i]] != i)
                code = 2;
    }
    *total = sum;
    return code;
}

/* One request's ring range after a round, the rule the engine's ring (row_ring.py) and the proxy's model
 * of it (ring_model.py) share: the rows first .. first + valid - 1 extend [lo, hi] when they follow it,
 * else replace it; at most the last W are held; valid <= 0 clears the range (lo 0, hi -1). Returns
 * whether the range restarted (the slot's window is then dirty). */
static inline int advance_range(int64_t *lo, int64_t *hi, int64_t first, int64_t valid, int64_t W) {
    int64_t new_hi = wrap_add(wrap_add(first, valid), -1);
    int keep = wrap_add(*hi, 1) == first;
    int restarted = !keep && *hi >= *lo;
    int64_t new_lo = keep ? *lo : first;
    if (new_lo < wrap_add(new_hi, -(W - 1)))
        new_lo = wrap_add(new_hi, -(W - 1));
    if (valid <= 0) {
        new_lo = 0;
        new_hi = -1;
        restarted = 1;
    }
    *lo = new_lo;
    *hi = new_hi;
    return restarted;
}

static inline _Atomic uint64_t *stamp_at(char *base, Py_ssize_t off) {
    return (_Atomic uint64_t *)(base + off);
}

static inline void put_u32(char *p, uint64_t v) { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); }
static inline void put_u64(char *p, uint64_t v) { memcpy(p, &v, 8); }
/* int64 -> int32 wraps like numpy's assignment into an int32 field */
static inline void put_i32s(char *p, const int64_t *a, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t x = (int32_t)(uint32_t)(uint64_t)a[i];
        memcpy(p + 4 * i, &x, 4);
    }
}

static inline uint32_t get_u32(const char *p) { uint32_t x; memcpy(&x, p, 4); return x; }
static inline int32_t get_i32(const char *p) { int32_t x; memcpy(&x, p, 4); return x; }
static inline int64_t get_i64(const char *p) { int64_t x; memcpy(&x, p, 8); return x; }

/* Held (_fastround_held.c): arrays whose buffers are taken once */
extern PyTypeObject HeldType;
void *held_get(PyObject *o, Py_ssize_t i, Py_ssize_t itemsize, Py_ssize_t count, const char *name);
Py_ssize_t held_items(PyObject *o, Py_ssize_t i);
Py_ssize_t ring_gather_core(const char *ring, Py_ssize_t ring_len, Py_ssize_t W, Py_ssize_t B, const int64_t *slots,
                            const int64_t *first, const int64_t *nrows, Py_ssize_t k, char *dst, Py_ssize_t dst_len);

/* the single-job cores the fused calls (_fastround_fused.c) share with their own functions */
int advance_core(PyObject *held, const int64_t *slots, const int64_t *req, const int64_t *first,
                 const int64_t *valid, Py_ssize_t n, Py_ssize_t W, int64_t out[3]);
int accept_core(PyObject *held, const int64_t *slots, const int32_t *valid, const int32_t *kw, Py_ssize_t n,
                Py_ssize_t N, int gate, int probing, int64_t out[3]);
int pack_whole_core(int32_t *page, Py_ssize_t words, Py_ssize_t o_ok, Py_ssize_t o_id, Py_ssize_t o_cf, Py_ssize_t M,
                    Py_ssize_t N, Py_ssize_t n, Py_ssize_t cap, Py_ssize_t ok_rows, Py_ssize_t ids_rows,
                    PyObject *o_ids, PyObject *o_conf);

int read_core(char *base, Py_ssize_t seg_len, Py_ssize_t desc_off, Py_ssize_t meta_off, PyObject *held, uint64_t t,
              Py_ssize_t M, Py_ssize_t W, Py_ssize_t R, Py_ssize_t max_rows, uint32_t res[6]);
void fill_core(char *ent, Py_ssize_t ent_size, const int64_t *eo, const int64_t *idx, Py_ssize_t k,
               const int64_t *slots, const int64_t *rows, const int64_t *gen, const int64_t *first,
               const int64_t *anchor, const int64_t *tok, const uint8_t *need, const uint8_t *new_gen,
               const int32_t *kw, Py_ssize_t n_out);

/* the functions of each half (the method table is _fastround.c's) */
PyObject *fr_check_round(PyObject *mod, PyObject *args);
PyObject *fr_ring_write(PyObject *mod, PyObject *args);
PyObject *fr_write_round(PyObject *mod, PyObject *args);
PyObject *fr_check_page(PyObject *mod, PyObject *args);
PyObject *fr_check_reply(PyObject *mod, PyObject *args);
PyObject *fr_read_round(PyObject *mod, PyObject *args);
PyObject *fr_advance(PyObject *mod, PyObject *args);
PyObject *fr_fill_entries(PyObject *mod, PyObject *args);
/* _fastround_entries.c: the worker's check of a STEP's entries */
PyObject *fr_bad_entries(PyObject *mod, PyObject *args);
PyObject *fr_ring_runs(PyObject *mod, PyObject *args);
PyObject *fr_ring_gather(PyObject *mod, PyObject *args);
PyObject *fr_accept_round(PyObject *mod, PyObject *args);
PyObject *fr_pack_whole(PyObject *mod, PyObject *args);
PyObject *fr_check_fast(PyObject *mod, PyObject *args);
PyObject *fr_advance_accept(PyObject *mod, PyObject *args);
PyObject *fr_finish_whole(PyObject *mod, PyObject *args);
PyObject *fr_round_front(PyObject *mod, PyObject *args);
PyObject *fr_hist_observe(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

#endif
