/*
 * _fastround_proxy.c: the proxy's half of _fastround (see _fastround.c): the stamped descriptor read and
 * its validation (shm/stamped.py SlotReader), the ring model's advance (ring_model.py), the usual round's
 * STEP entries (round/core.py).
 */
#include "_fastround_shared.h"

/* ------------------------------------------------------------------ proxy: read_round */

/* Copy a stamped slot under the stamp rule: stamp_end == t (acquire: pairs with the writer's release
 * store of stamp_end), copy, acquire fence, stamp_start == t (pairs with the writer's release fence
 * after stamp_start). 1 if the copy is round t's. */
static int stamped_copy(char *src, Py_ssize_t start_off, Py_ssize_t end_off, uint64_t t, char *dst, size_t len) {
    if (atomic_load_explicit(stamp_at(src, end_off), memory_order_acquire) != t)
        return 0;
    memcpy(dst, src, len);
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(stamp_at(src, start_off), memory_order_relaxed) == t;
}

/* read_round(seg, desc_off, meta_off, held, t, M, W, R, max_rows) -> (code, n, max_q, rows_staged, n_staged,
 *            n_misfit)
 * held: a Held (_fastround_held.c) of moffs, doffs (int64), desc_copy, meta_copy (uint8, whole slots),
 * mark, slots_out, valid_out (int64 [M]).
 * SlotReader.read: code 1 desc stamps, 2 meta stamps (not round t's), 3 something does not hold
 * together (the reference validation, run on the copies, says what), 0 fine: slots_out[:n] and
 * valid_out[:n] (int64) hold the round's slots and valid, mark[slots[i]] = i as check_slots leaves it. */
/* read_round's work on the segment's memory (`base`, `seg_len` bytes): res = (code, n, max_q, rows_staged,
 * n_staged, n_misfit). -1 with an error set (a bad Held, or slots outside the segment). */
int read_core(char *base, Py_ssize_t seg_len, Py_ssize_t desc_off, Py_ssize_t meta_off, PyObject *held, uint64_t t,
              Py_ssize_t M, Py_ssize_t W, Py_ssize_t R, Py_ssize_t max_rows, uint32_t res[6]) {
    const int64_t *mo = held_get(held, 0, 8, M_COUNT, "moffs"), *dof = held_get(held, 1, 8, D_COUNT, "doffs");
    if (!mo || !dof)
        return -1;
    /* the copies are whole slots (their padding too, as the reference copies them) */
    char *d = held_get(held, 2, 1, dof[D_END] + 8, "desc_copy"), *m = held_get(held, 3, 1, mo[M_END] + 8, "meta_copy");
    int64_t *mark = held_get(held, 4, 8, M, "mark"), *slots = held_get(held, 5, 8, M, "slots_out"),
            *valid = held_get(held, 6, 8, M, "valid_out");
    if (!d || !m || !mark || !slots || !valid)
        return -1;
    Py_ssize_t dlen = held_items(held, 2), mlen = held_items(held, 3);
    if (desc_off < 0 || meta_off < 0 || desc_off + dlen > seg_len || meta_off + mlen > seg_len ||
        (desc_off + dof[D_START]) % 8 || (desc_off + dof[D_END]) % 8 || (meta_off + mo[M_START]) % 8 ||
        (meta_off + mo[M_END]) % 8) {
        PyErr_SetString(PyExc_ValueError, "read_round: slot outside the segment or a stamp misaligned");
        return -1;
    }
    int code = 0;
    uint32_t n = 0, max_q = 0, rows = 0, n_staged = 0, n_misfit = 0;
    BEGIN_MAYBE_ALLOW_THREADS(dlen + mlen)
    if (!stamped_copy(base + desc_off, dof[D_START], dof[D_END], t, d, (size_t)dlen))
        code = 1;
    else if (!stamped_copy(base + meta_off, mo[M_START], mo[M_END], t, m, (size_t)mlen))
        code = 2;
    else {
        n = get_u32(d + dof[D_N]);
        max_q = get_u32(d + dof[D_MAXQ]);
        uint32_t rows_gathered = get_u32(d + dof[D_ROWS]);
        n_staged = get_u32(d + dof[D_NSTAGED]);
        rows = get_u32(m + mo[M_ROWS]);
        if ((Py_ssize_t)n > M || get_u32(m + mo[M_N]) != n)
            code = 3;
        for (uint32_t i = 0; !code && i < n; i++) {
            slots[i] = get_i32(d + dof[D_SLOT] + 4 * i);
            if ((uint64_t)slots[i] >= (uint64_t)M)
                code = 3;
        }
        if (!code) { /* check_slots' duplicate test, leaving mark as it does */
            for (uint32_t i = 0; i < n; i++)
                mark[slots[i]] = i;
            for (uint32_t i = 0; i < n; i++)
                if (mark[slots[i]] != (int64_t)i)
                    code = 3;
        }
        int64_t sum = 0;
        for (uint32_t i = 0; !code && i < n; i++) {
            int32_t v = get_i32(m + mo[M_VALID] + 4 * i), st = get_i32(m + mo[M_STAGED] + 4 * i);
            if ((uint32_t)v > (uint32_t)W || get_i64(m + mo[M_FIRST] + 8 * i) < 0 || (st != v && st != 0) ||
                get_i32(d + dof[D_QSL] + 4 * (i + 1)) < get_i32(d + dof[D_QSL] + 4 * i))
                code = 3;
            n_misfit += st != v;
            sum += st;
        }
        if (!code && (sum != (int64_t)rows || (Py_ssize_t)rows > max_rows || rows_gathered != rows ||
                      (Py_ssize_t)n_staged > R))
            code = 3;
        for (uint32_t i = 0; !code && i < n; i++)
            valid[i] = get_i32(m + mo[M_VALID] + 4 * i);
    }
    END_MAYBE_ALLOW_THREADS
    res[0] = (uint32_t)code, res[1] = n, res[2] = max_q, res[3] = rows, res[4] = n_staged, res[5] = n_misfit;
    return 0;
}

PyObject *fr_read_round(PyObject *mod, PyObject *args) {
    PyObject *seg, *held;
    Py_ssize_t desc_off, meta_off, M, W, R, max_rows;
    unsigned long long t;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OnnOKnnnn", &seg, &desc_off, &meta_off, &held, &t, &M, &W, &R, &max_rows))
        return NULL;
    Py_buffer bseg = {0};
    if (PyObject_GetBuffer(seg, &bseg, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t r[6];
    int rc = read_core(bseg.buf, bseg.len, desc_off, meta_off, held, t, M, W, R, max_rows, r);
    PyBuffer_Release(&bseg);
    if (rc < 0)
        return NULL;
    return Py_BuildValue("iIIIII", (int)r[0], r[1], r[2], r[3], r[4], r[5]);
}


/* ------------------------------------------------------------------ proxy: advance */

/* advance(held, slots, req_ids, first_pos, valid, W) -> (n_new_owner, n_resync, n_unknown)
 * held: a Held (_fastround_held.c) of the table's owner, generation, lo, hi (int64 [S]), dirty, announced,
 * unknown (bool [S]), counts (int64 [2]), and the plan's scratch anchor (int64), new_owner, new_gen,
 * resync (bool), held_first, held_rows (int64), each at least [n]: the first n items are written.
 * SlotTable.advance (ring_model.py) on its arrays, request by request: begin_requests (with _activate's
 * unknown bookkeeping when counts[1], the table's _any_unknown, is set), apply, and the plan's flags at
 * the round's own anchors. counts[0] is the table's n_unknown (read and written). Requires what the
 * proxy checked while reading the descriptor: slots in range and unique, 0 <= valid <= W. */
/* The advance itself on C arrays of n requests (fr_advance's contract; advance_accept in
 * _fastround_fused.c runs the same): out = (n_new_owner, n_resync, n_unknown). -1 with an error set. */
int advance_core(PyObject *held, const int64_t *slots, const int64_t *req, const int64_t *first,
                 const int64_t *valid, Py_ssize_t n, Py_ssize_t W, int64_t out[3]) {
    static const char *hnames[14] = {"owner", "generation", "lo", "hi", "dirty", "announced", "unknown", "counts",
                                     "anchor", "new_owner", "new_gen", "resync", "held_first", "held_rows"};
    static const Py_ssize_t hsz[14] = {8, 8, 8, 8, 1, 1, 1, 8, 8, 1, 1, 1, 8, 8};
    void *h[14];
    Py_ssize_t S = held_items(held, 0);
    for (int i = 0; i < 14; i++)
        if (!(h[i] = held_get(held, i, hsz[i], i < 7 ? S : (i == 7 ? 2 : n), hnames[i])))
            return -1;
    int64_t *owner = h[0], *gen = h[1], *lo = h[2], *hi = h[3], *counts = h[7];
    uint8_t *dirty = h[4], *ann = h[5], *unk = h[6];
    int64_t *anchor = h[8], *hfirst = h[12], *hrows = h[13];
    uint8_t *new_owner = h[9], *new_gen = h[10], *resync = h[11];
    for (Py_ssize_t i = 0; i < n; i++)
        if ((uint64_t)slots[i] >= (uint64_t)S) {
            PyErr_Format(PyExc_ValueError, "slot %lld out of range", (long long)slots[i]);
            return -1;
        }
    int64_t n_new = 0, n_resync = 0, n_unknown_left = 0;
    /* begin_requests: new owners (a slot once per round, so the order of requests does not matter) */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s = slots[i];
        new_owner[i] = owner[s] != req[i];
        if (!new_owner[i])
            continue;
        n_new++;
        if (counts[1] && unk[s]) { /* _activate: a dormant unknown slot comes into use still unknown; one */
            if (owner[s] == -1)    /* whose owner really changes is known again */
                counts[0] += 1;
            else {
                unk[s] = 0;
                counts[0] -= 1;
            }
        }
        owner[s] = req[i];
        gen[s] += 1;
        lo[s] = 0;
        hi[s] = -1;
        dirty[s] = 1;
        ann[s] = 0;
    }
    /* apply, then the plan's flags; n_unknown of the round only while the table has any (as _apply) */
    int any_unknown = counts[0] != 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s = slots[i], f = first[i], v = valid[i];
        int64_t a = wrap_add(f, v);
        int cleared = v <= 0;
        if (advance_range(&lo[s], &hi[s], f, v, W))
            dirty[s] = 1;
        int64_t new_lo = lo[s], new_hi = hi[s];
        if (any_unknown && unk[s]) {
            if (new_lo == 0 || wrap_add(new_hi, -new_lo) >= W - 1) { /* exact again: W rows, or from 0 */
                unk[s] = 0;
                counts[0] -= 1;
            } else
                n_unknown_left++;
        }
        anchor[i] = a;
        hfirst[i] = cleared ? a : new_lo;
        hrows[i] = cleared ? 0 : wrap_add(a, -new_lo);
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* dirty or not announced, after apply marked restarts */
        int64_t s = slots[i];
        new_gen[i] = dirty[s] || !ann[s];
        resync[i] = hrows[i] > valid[i] && new_gen[i];
        n_resync += resync[i];
    }
    out[0] = n_new, out[1] = n_resync, out[2] = n_unknown_left;
    return 0;
}

PyObject *fr_advance(PyObject *mod, PyObject *args) {
    PyObject *held, *o[4];
    Py_ssize_t W;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OOOOOn", &held, &o[0], &o[1], &o[2], &o[3], &W))
        return NULL;
    Py_buffer bs[4];
    memset(bs, 0, sizeof bs);
    Py_buffer *all[5] = {&bs[0], &bs[1], &bs[2], &bs[3], NULL};
    static const char *names[4] = {"slots", "req_ids", "first_pos", "valid"};
    if (get_arr(o[0], &bs[0], 8, 0, 0, names[0]) < 0)
        return NULL;
    Py_ssize_t n = bs[0].len / 8;
    for (int i = 1; i < 4; i++)
        if (get_arr(o[i], &bs[i], 8, n, 0, names[i]) < 0)
            goto fail;
    int64_t r[3];
    if (advance_core(held, bs[0].buf, bs[1].buf, bs[2].buf, bs[3].buf, n, W, r) < 0)
        goto fail;
    release_all(all);
    return Py_BuildValue("LLL", (long long)r[0], (long long)r[1], (long long)r[2]);
fail:
    release_all(all);
    return NULL;
}

/* ------------------------------------------------------------------ proxy: fill_entries */


/* fill_entries(prefix, entries_off, entry_size, eoffs, idx, slots, n_rows, generation, first_pos, anchor_pos,
 *              anchor_token, need, new_gen, k_window, n_out)
 * The round's k entries (round/core.py step 4, the usual round: this round's rows, no window): entry e is
 * request j = idx[e] (idx None: j = e, k = len(slots)); slot, n_rows, first_pos, anchor_pos, anchor_token,
 * flags (RF_NEED_DRAFT if need[j], RF_NEW_GEN if new_gen[j]: bool bytes), k_window (at most 255) of
 * request j, generation of its slot, n_out. Integer fields take the low bytes, as numpy's assignment
 * into the entry's narrower fields does. Returns k. */
/* fill_entries' writes (its bounds checked by the caller) */
void fill_core(char *ent, Py_ssize_t ent_size, const int64_t *eo, const int64_t *idx, Py_ssize_t k,
               const int64_t *slots, const int64_t *rows, const int64_t *gen, const int64_t *first,
               const int64_t *anchor, const int64_t *tok, const uint8_t *need, const uint8_t *new_gen,
               const int32_t *kw, Py_ssize_t n_out) {
    for (Py_ssize_t e = 0; e < k; e++, ent += ent_size) {
        Py_ssize_t j = idx ? idx[e] : e;
        int64_t s = slots[j];
        put_u32(ent + eo[E_SLOT], (uint64_t)s);
        put_u32(ent + eo[E_NROWS], (uint64_t)rows[j]);
        put_u64(ent + eo[E_GEN], (uint64_t)gen[s]);
        put_u64(ent + eo[E_FIRST], (uint64_t)first[j]);
        put_u64(ent + eo[E_ANCHOR], (uint64_t)anchor[j]);
        put_u32(ent + eo[E_TOKEN], (uint64_t)tok[j]);
        ent[eo[E_FLAGS]] = (char)((need[j] ? 1 : 0) | (new_gen[j] ? 2 : 0)); /* RF_NEED_DRAFT | RF_NEW_GEN */
        ent[eo[E_K]] = (char)(uint8_t)(kw[j] < 255 ? kw[j] : 255);
        ent[eo[E_NOUT]] = (char)(uint8_t)n_out;
    }
}

PyObject *fr_fill_entries(PyObject *mod, PyObject *args) {
    PyObject *prefix, *o[11];
    Py_ssize_t ent_off, ent_size, n_out;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OnnOOOOOOOOOOOn", &prefix, &ent_off, &ent_size, &o[0], &o[1], &o[2], &o[3], &o[4],
                          &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &n_out))
        return NULL;
    Py_buffer bp = {0}, bs[11];
    memset(bs, 0, sizeof bs);
    Py_buffer *all[13] = {&bp};
    for (int i = 0; i < 11; i++)
        all[1 + i] = &bs[i];
    all[12] = NULL;
    if (PyObject_GetBuffer(prefix, &bp, PyBUF_WRITABLE) < 0)
        return NULL;
    /* eoffs int64; idx int64 or None; slots int64 [n]; n_rows, generation (the table), first_pos,
     * anchor_pos int64; anchor_token int64 [n]; need, new_gen u1 [n]; k_window int32 [n] */
    if (get_arr(o[0], &bs[0], 8, E_COUNT, 0, "eoffs") < 0 || get_arr(o[2], &bs[2], 8, 0, 0, "slots") < 0)
        goto fail;
    Py_ssize_t n = bs[2].len / 8, k = n;
    if (o[1] != Py_None) {
        if (get_arr(o[1], &bs[1], 8, 0, 0, "idx") < 0)
            goto fail;
        k = bs[1].len / 8;
    }
    static const char *names[11] = {"eoffs", "idx", "slots", "n_rows", "generation", "first_pos", "anchor_pos",
                                    "anchor_token", "need", "new_gen", "k_window"};
    static const Py_ssize_t isz[11] = {8, 8, 8, 8, 8, 8, 8, 8, 1, 1, 4};
    for (int i = 3; i < 11; i++)
        if (get_arr(o[i], &bs[i], isz[i], i == 4 ? 0 : n, 0, names[i]) < 0)
            goto fail;
    Py_ssize_t S = bs[4].len / 8;
    const int64_t *eo = bs[0].buf, *idx = bs[1].buf, *slots = bs[2].buf, *rows = bs[3].buf, *gen = bs[4].buf,
                  *first = bs[5].buf, *anchor = bs[6].buf, *tok = bs[7].buf;
    const uint8_t *need = bs[8].buf, *new_gen = bs[9].buf;
    const int32_t *kw = bs[10].buf;
    if (ent_off < 0 || ent_size < 40 || ent_off + k * ent_size > bp.len) {
        PyErr_SetString(PyExc_ValueError, "fill_entries: entries outside the prefix");
        goto fail;
    }
    for (Py_ssize_t e = 0; e < k; e++) {
        Py_ssize_t j = idx ? idx[e] : e;
        if (j < 0 || j >= n || (uint64_t)slots[j] >= (uint64_t)S) {
            PyErr_SetString(PyExc_ValueError, "fill_entries: a request or slot out of range");
            goto fail;
        }
    }
    fill_core((char *)bp.buf + ent_off, ent_size, eo, idx, k, slots, rows, gen, first, anchor, tok, need, new_gen, kw, n_out);
    release_all(all);
    return PyLong_FromSsize_t(k);
fail:
    release_all(all);
    return NULL;
}

/* ------------------------------------------------------------------ proxy: ring_runs */

/* ring_runs(base, slots, first_pos, n_rows, W, row_bytes) -> list of memoryviews
 * The STEP's rows straight from the engine's shared ring (ring_rows.py RingRows.runs is the reference):
 * entry i's rows are positions first_pos[i] .. + n_rows[i] - 1 of slot slots[i], held at
 * ring[slot * W + pos % W]; each entry is at most two runs (the block wraps once), and a run that
 * continues the previous one in memory is merged into it. `base` is a 1-D byte memoryview of the ring:
 * each run is a slice of it, so the mapping stays alive while a run does. Bad slots or counts raise. */
PyObject *fr_ring_runs(PyObject *mod, PyObject *args) {
    PyObject *base, *o[3];
    Py_ssize_t W, B;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OOOOnn", &base, &o[0], &o[1], &o[2], &W, &B))
        return NULL;
    if (W <= 0 || B <= 0) {
        PyErr_SetString(PyExc_ValueError, "ring_runs: W and row_bytes must be > 0");
        return NULL;
    }
    Py_ssize_t total = PyObject_Length(base);
    if (total < 0)
        return NULL;
    Py_buffer b[3];
    memset(b, 0, sizeof b);
    Py_buffer *all[4] = {&b[0], &b[1], &b[2], NULL};
    PyObject *out = NULL;
    if (get_arr(o[0], &b[0], 8, 0, 0, "slots") < 0)
        goto done;
    Py_ssize_t k = b[0].len / 8;
    if (get_arr(o[1], &b[1], 8, k, 0, "first_pos") < 0 || get_arr(o[2], &b[2], 8, k, 0, "n_rows") < 0)
        goto done;
    const int64_t *slots = b[0].buf, *first = b[1].buf, *nrows = b[2].buf;
    Py_ssize_t M = total / (W * B);
    out = PyList_New(0);
    if (!out)
        goto done;
    Py_ssize_t run_lo = -1, run_hi = -1; /* byte range of the run being built */
    for (Py_ssize_t i = 0; i <= k; i++) {
        Py_ssize_t parts = 0, lo[2] = {0, 0}, hi[2] = {0, 0};
        if (i < k) {
            int64_t s = slots[i], c = nrows[i];
            if (s < 0 || s >= M || c < 0 || c > W) {
                PyErr_Format(PyExc_ValueError, "ring_runs: entry %zd: slot %lld or rows %lld outside the ring", i,
                             (long long)s, (long long)c);
                Py_CLEAR(out);
                goto done;
            }
            if (c == 0)
                continue;
            int64_t a = pmod(first[i], W);
            Py_ssize_t blk = (Py_ssize_t)s * W;
            if (a + c <= W) {
                lo[0] = (blk + a) * B, hi[0] = (blk + a + c) * B, parts = 1;
            } else {
                lo[0] = (blk + a) * B, hi[0] = (blk + W) * B;
                lo[1] = blk * B, hi[1] = (blk + a + c - W) * B, parts = 2;
            }
        }
        for (Py_ssize_t p = 0; p < (i < k ? parts : 1); p++) {
            if (i < k && run_hi == lo[p]) { /* continues the run in memory */
                run_hi = hi[p];
                continue;
            }
            if (run_lo >= 0) {
                PyObject *v = PySequence_GetSlice(base, run_lo, run_hi);
                if (!v || PyList_Append(out, v) < 0) {
                    Py_XDECREF(v);
                    Py_CLEAR(out);
                    goto done;
                }
                Py_DECREF(v);
            }
            run_lo = i < k ? lo[p] : -1, run_hi = i < k ? hi[p] : -1;
        }
    }
done:
    release_all(all);
    return out;
}

/* ------------------------------------------------------------------ proxy: ring_gather */

/* The copy of ring_gather (and of round_front's, _fastround_fused.c): k entries' rows from `ring`
 * (ring_len bytes, slots of W rows of B bytes) into `dst` (dst_len bytes), in order. Returns the rows
 * copied, or -1 with ValueError set (a slot or a count outside the ring, `dst` too small) having
 * copied nothing. */
Py_ssize_t ring_gather_core(const char *ring, Py_ssize_t ring_len, Py_ssize_t W, Py_ssize_t B, const int64_t *slots,
                            const int64_t *first, const int64_t *nrows, Py_ssize_t k, char *dst, Py_ssize_t dst_len) {
    if (W <= 0 || B <= 0) {
        PyErr_SetString(PyExc_ValueError, "ring_gather: W and row_bytes must be > 0");
        return -1;
    }
    Py_ssize_t M = ring_len / (W * B), total = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (slots[i] < 0 || slots[i] >= M || nrows[i] < 0 || nrows[i] > W) {
            PyErr_Format(PyExc_ValueError, "ring_gather: entry %zd: slot %lld or rows %lld outside the ring", i,
                         (long long)slots[i], (long long)nrows[i]);
            return -1;
        }
        total += nrows[i];
    }
    if (total * B > dst_len) {
        PyErr_SetString(PyExc_ValueError, "ring_gather: out holds fewer rows than the entries");
        return -1;
    }
    BEGIN_MAYBE_ALLOW_THREADS(total * B)
    for (Py_ssize_t i = 0; i < k; i++) {
        int64_t c = nrows[i], a = pmod(first[i], W);
        const char *blk = ring + (size_t)slots[i] * W * B;
        int64_t c1 = a + c <= W ? c : W - a;
        memcpy(dst, blk + a * B, (size_t)(c1 * B));
        dst += c1 * B;
        if (c > c1) {
            memcpy(dst, blk, (size_t)((c - c1) * B));
            dst += (c - c1) * B;
        }
    }
    END_MAYBE_ALLOW_THREADS
    return total;
}

/* ring_gather(ring, slots, first_pos, n_rows, W, row_bytes, out) -> rows written
 * Small rows: every entry's rows, in order, copied from the shared ring into `out` (ring_rows.py
 * RingRows.gather is the reference: the same bytes). Bad slots or counts, or an `out` too small, raise. */
PyObject *fr_ring_gather(PyObject *mod, PyObject *args) {
    PyObject *o_ring, *o_out, *o[3];
    Py_ssize_t W, B;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OOOOnnO", &o_ring, &o[0], &o[1], &o[2], &W, &B, &o_out))
        return NULL;
    Py_buffer br = {0}, bo = {0}, b[3];
    memset(b, 0, sizeof b);
    Py_buffer *all[6] = {&br, &bo, &b[0], &b[1], &b[2], NULL};
    Py_ssize_t done = -1;
    if (get_arr(o_ring, &br, 1, 0, 0, "ring") < 0 || get_arr(o_out, &bo, 1, 0, 1, "out") < 0 ||
        get_arr(o[0], &b[0], 8, 0, 0, "slots") < 0)
        goto fail;
    Py_ssize_t k = b[0].len / 8;
    if (get_arr(o[1], &b[1], 8, k, 0, "first_pos") < 0 || get_arr(o[2], &b[2], 8, k, 0, "n_rows") < 0)
        goto fail;
    done = ring_gather_core(br.buf, br.len, W, B, b[0].buf, b[1].buf, b[2].buf, k, bo.buf, bo.len);
fail:
    release_all(all);
    return done < 0 ? NULL : PyLong_FromSsize_t(done);
}
