/*
 * _fastround: the per-round hot paths of both sides in a few C calls each, beside their Python
 * reference models (which stay the readable definition; dspark_proxy/native.py selects one):
 *
 *   check_round    engine_shim/inputs.py   EnqueueInputs.check's range, order and duplicate checks
 *   check_fast     engine_shim/inputs.py   the same, on arguments that need no conversion (else: -1)
 *   ring_write     engine_shim/row_ring.py EngineRing.write (SlotTable begin_requests + apply, and the
 *                                          rows scattered into rows[slot, pos % W])
 *   write_round    shm/stamped.py          the staging copy, SlotWriter.write_meta and .write_desc
 *   read_round     shm/stamped.py          SlotReader.read: the stamped copies and their validation
 *   check_page     engine_shim/reply.py    ReplyReader.parse's n_drafts check and ok mask
 *   advance        ring_model.py           SlotTable.advance (begin_requests + apply + the plan's flags)
 *   fill_entries   round/core.py           the usual round's STEP entries (wire/step.py's prefix)
 *   ring_runs      ring_rows.py            RingRows.runs: the STEP's rows as runs of the shared ring
 *   ring_gather    ring_rows.py            RingRows.gather: small rows gathered from the shared ring
 *   pack_whole     reply_page.py           PagePacker.pack's usual round: every request drafted in full
 *   accept_round   acceptance.py           Acceptance.round's sums: accepted drafts, their histogram, the
 *                                          gate's per-slot scatter-adds and probes that are due
 *   advance_accept round/fused.py          advance then accept_round, one call (_fastround_fused.c)
 *   finish_whole   round/fused.py          the usual round's announce + pack_whole + status, one call
 *   round_front    round/fused.py          read_round + advance + accept_round + fill_entries, one call
 *   bad_entries    wire/codec.py           the worker's check of a STEP's entries (bad_entry_mask)
 *
 * Why C: at the batch sizes that matter a round's cost was numpy's per-call overhead (0.3-1 us a call,
 * some 40 calls a side), not the data; one call per job removes it. Nothing here decides policy: on
 * anything unusual a function returns a code and the Python reference produces the error (the same
 * message either way), so the two paths cannot drift on what they reject.
 *
 * Arrays arrive through the buffer protocol: int64 ("q") arrays are C-contiguous numpy arrays, checked
 * for item size and length here before any access. Positions and counts are int64 as in the models.
 *
 * Files: this one (the engine's half and the module), _fastround_proxy.c (the proxy's half),
 * _fastround_held.c (Held: long-lived arrays' buffers taken once), _fastround_inputs.c (enqueue's arguments
 * taken as they are), _fastround_accept.c (the proxy's acceptance
 * sums), _fastround_page.c (the usual round's reply page), _fastround_fused.c (the usual round's fused calls),
 * _fastround_entries.c (the worker's entry check), _fastround_shared.h (what they share).
 *
 * Atomics (shm_layout.md §5 "Meta and desc slots", §10): the stamps are the only shared words touched
 * here, each paired as in _hostflag.c:
 *   write_round: stamp_start relaxed store + release fence   pairs with read_round's acquire fence +
 *                                                              stamp_start load (the second look)
 *                stamp_end release store                      pairs with read_round's acquire load of
 *                                                              stamp_end (the first look)
 * `gathered` is raised afterwards by _hostflag.raise_gathered (a release store the proxy acquires).
 * Little-endian only, like the segment's dtypes.
 */
#include "_fastround_shared.h"

/* ------------------------------------------------------------------ engine: check_round */

/* check_round(slots, valid, first_pos, k_window, qsl, mark, M, W) -> (code, total_valid)
 * code 0: fine; 1: a value out of range or qsl decreasing (inputs.py _explain names it);
 * 2: a slot twice. `mark` (int64 [M]) is left as inputs.py leaves it: mark[slots[i]] = i. */
PyObject *fr_check_round(PyObject *mod, PyObject *args) {
    PyObject *o[6];
    Py_ssize_t M, W;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OOOOOOnn", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &M, &W))
        return NULL;
    Py_buffer bs[6] = {{0}};
    Py_buffer *all[7] = {&bs[0], &bs[1], &bs[2], &bs[3], &bs[4], &bs[5], NULL};
    if (get_arr(o[0], &bs[0], 8, 0, 0, "slots") < 0)
        return NULL;
    Py_ssize_t n = bs[0].len / 8;
    const char *names[6] = {"slots", "valid", "first_pos", "k_window", "qsl", "mark"};
    Py_ssize_t counts[6] = {n, n, n, n, n + 1, M};
    for (int i = 1; i < 6; i++)
        if (get_arr(o[i], &bs[i], 8, counts[i], i == 5, names[i]) < 0) {
            release_all(all);
            return NULL;
        }
    const int64_t *slots = bs[0].buf, *valid = bs[1].buf, *first = bs[2].buf, *k = bs[3].buf, *qsl = bs[4].buf;
    int64_t *mark = bs[5].buf;
    int64_t total = 0;
    int code = check_round_core(slots, valid, first, k, qsl, mark, n, M, W, &total);
    release_all(all);
    return Py_BuildValue("iL", code, (long long)total);
}

/* ------------------------------------------------------------------ engine: ring_write */

/* ring_write(held, ring, slots, req_ids, first_pos, valid, rows, W, row_bytes)
 * held: a Held (_fastround_held.c) of the table's owner, generation, lo, hi, dirty, announced.
 * EngineRing.write for a table whose ranges are all known (the engine's: SlotTable(known=True)), on
 * inputs EnqueueInputs checked (slots in range and unique, 0 <= valid <= W): per request, a new owner
 * starts a new generation with an empty range; the rows extend the range when they start right after it
 * (an empty range (0, -1) extends at 0), else restart it (dirty); the range keeps its last W positions;
 * valid 0 clears it (dirty). Then the rows land in ring[slot, pos % W] (the last W of a request's rows). */
PyObject *fr_ring_write(PyObject *mod, PyObject *args) {
    PyObject *held, *o[6];
    Py_ssize_t W, B;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OOOOOOOnn", &held, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &W, &B))
        return NULL;
    Py_buffer bs[6] = {{0}};
    Py_buffer *all[7];
    for (int i = 0; i < 6; i++)
        all[i] = &bs[i];
    all[6] = NULL;
    if (W <= 0 || B <= 0) {
        PyErr_SetString(PyExc_ValueError, "W and row_bytes must be > 0");
        return NULL;
    }
    /* the table (held, _fastround_held.c): owner, generation, lo, hi int64 [S]; dirty, announced bool [S] */
    Py_ssize_t S = held_items(held, 0);
    static const char *hnames[6] = {"owner", "generation", "lo", "hi", "dirty", "announced"};
    void *h[6];
    for (int i = 0; i < 6; i++)
        if (!(h[i] = held_get(held, i, i < 4 ? 8 : 1, S, hnames[i])))
            return NULL;
    const char *names[6] = {"ring", "slots", "req_ids", "first_pos", "valid", "rows"};
    if (get_arr(o[0], &bs[0], 1, S * W * B, 1, names[0]) < 0 || get_arr(o[1], &bs[1], 8, 0, 0, names[1]) < 0)
        goto fail;
    Py_ssize_t n = bs[1].len / 8;
    for (int i = 2; i < 5; i++)
        if (get_arr(o[i], &bs[i], 8, n, 0, names[i]) < 0)
            goto fail;
    if (get_arr(o[5], &bs[5], 1, 0, 0, names[5]) < 0)
        goto fail;
    int64_t *owner = h[0], *gen = h[1], *lo = h[2], *hi = h[3];
    uint8_t *dirty = h[4], *announced = h[5], *ring = bs[0].buf;
    const int64_t *slots = bs[1].buf, *req = bs[2].buf, *first = bs[3].buf, *valid = bs[4].buf;
    const uint8_t *rows = bs[5].buf;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((uint64_t)slots[i] >= (uint64_t)S) {
            PyErr_Format(PyExc_ValueError, "slot %lld out of range", (long long)slots[i]);
            goto fail;
        }
        total += valid[i] > 0 ? valid[i] : 0;
    }
    if (bs[5].len != total * B) {
        PyErr_Format(PyExc_ValueError, "rows must be uint8 [%lld, %zd], got %zd bytes", (long long)total, B,
                     bs[5].len);
        goto fail;
    }
    BEGIN_MAYBE_ALLOW_THREADS(total * B)
    int64_t src = 0; /* the request's first input row */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s = slots[i], f = first[i], v = valid[i];
        if (owner[s] != req[i]) { /* begin_requests */
            owner[s] = req[i];
            gen[s] += 1;
            lo[s] = 0;
            hi[s] = -1;
            dirty[s] = 1;
            announced[s] = 0;
        }
        int64_t anchor = wrap_add(f, v);
        if (advance_range(&lo[s], &hi[s], f, v, W))
            dirty[s] = 1;
        int64_t sent = v > 0 ? v : 0, kept = sent < W ? sent : W;
        /* the last `kept` of the request's rows: positions anchor - kept .. anchor - 1 */
        for (int64_t j = 0; j < kept; j++) {
            int64_t pos = wrap_add(anchor, j - kept);
            memcpy(ring + (s * W + pmod(pos, W)) * B, rows + (src + sent - kept + j) * B, (size_t)B);
        }
        src += sent;
    }
    END_MAYBE_ALLOW_THREADS
    release_all(all);
    Py_RETURN_NONE;
fail:
    release_all(all);
    return NULL;
}

/* ------------------------------------------------------------------ engine: write_round */


/* write_round(seg, meta_off, desc_off, moffs, doffs, t, n, rows_staged, k_fit, max_q, staged, staging_off,
 *             rows, valid, first_pos, anchor, sampled, seed, temperature, req_ids, slots, qsl, need_draft,
 *             k_window, M, R) -> max_q
 * The staging rows [0, rows_staged), then meta slot and desc slot of round t, each stamped at both ends
 * (stamped.py SlotWriter; shm_layout.md §5). `seed`/`temperature` None: not a sampled segment (their
 * fields are left alone). max_q < 0: the longest query is computed here from qsl (writer.py's
 * max(qsl[1:] - qsl[:-1]), 0 for n = 0); returned either way. The resync windows are staged before this
 * call (writer.py). */
PyObject *fr_write_round(PyObject *mod, PyObject *args) {
    PyObject *seg, *o_moffs, *o_doffs, *o_staged, *o_rows, *a[11];
    Py_ssize_t meta_off, desc_off, staging_off, n, rows_staged, k_fit, max_q;
    unsigned long long t;
    (void)mod;
    Py_ssize_t M, R;
    if (!PyArg_ParseTuple(args, "OnnOOKnnnnOnOOOOOOOOOOOOnn", &seg, &meta_off, &desc_off, &o_moffs, &o_doffs, &t, &n,
                          &rows_staged, &k_fit, &max_q, &o_staged, &staging_off, &o_rows, &a[0], &a[1], &a[2],
                          &a[3], &a[4], &a[5], &a[6], &a[7], &a[8], &a[9], &a[10], &M, &R))
        return NULL;
    Py_buffer bseg = {0}, bm = {0}, bd = {0}, bst = {0}, brows = {0}, ba[11];
    memset(ba, 0, sizeof ba);
    Py_buffer *all[17] = {&bseg, &bm, &bd, &bst, &brows};
    for (int i = 0; i < 11; i++)
        all[5 + i] = &ba[i];
    all[16] = NULL;
    /* valid, first_pos, anchor int64; sampled bool; seed int64, temperature float32 (or None);
     * req_ids, slots int64; qsl int64 [n+1]; need_draft bool; k_window int64 */
    static const Py_ssize_t isz[11] = {8, 8, 8, 1, 8, 4, 8, 8, 8, 1, 8};
    static const char *names[11] = {"valid", "first_pos", "anchor", "sampled", "seed", "temperature", "req_ids",
                                    "slots", "qsl", "need_draft", "k_window"};
    if (n < 0 || n > M || k_fit < 0 || k_fit > n || rows_staged < 0) {
        PyErr_SetString(PyExc_ValueError, "write_round: bad counts");
        return NULL;
    }
    if (PyObject_GetBuffer(seg, &bseg, PyBUF_WRITABLE) < 0)
        return NULL;
    if (get_arr(o_moffs, &bm, 8, M_COUNT, 0, "moffs") < 0 || get_arr(o_doffs, &bd, 8, D_COUNT, 0, "doffs") < 0 ||
        get_arr(o_staged, &bst, 8, 0, 0, "staged") < 0 || get_arr(o_rows, &brows, 1, 0, 0, "rows") < 0)
        goto fail;
    int sampled_seg = a[4] != Py_None;
    for (int i = 0; i < 11; i++) {
        if ((i == 4 || i == 5) && !sampled_seg)
            continue;
        if (get_arr(a[i], &ba[i], isz[i], i == 8 ? n + 1 : n, 0, names[i]) < 0)
            goto fail;
    }
    const int64_t *mo = bm.buf, *dof = bd.buf;
    Py_ssize_t n_staged = bst.len / 8;
    /* the per-request fields hold M items (qsl M + 1), staged_slots R: nothing past them is written */
    if (n_staged > R || mo[M_VALID] + 4 * M > mo[M_FIRST] || dof[D_STAGED] + 4 * R > dof[D_REQ]) {
        PyErr_SetString(PyExc_ValueError, "write_round: more requests or windows than the slots hold");
        goto fail;
    }
    /* every field write below stays inside its slot: the slot sizes are the offsets of stamp_end + 8 */
    if (meta_off < 0 || desc_off < 0 || meta_off + mo[M_END] + 8 > bseg.len || desc_off + dof[D_END] + 8 > bseg.len ||
        (meta_off + mo[M_END]) % 8 || (desc_off + dof[D_END]) % 8 || (meta_off + mo[M_START]) % 8 ||
        (desc_off + dof[D_START]) % 8) {
        PyErr_SetString(PyExc_ValueError, "write_round: slot outside the segment or a stamp misaligned");
        goto fail;
    }
    /* rows of no bytes with rows_staged > 0: the rows are in the engine's shared ring, no staging copy */
    if (brows.len && (staging_off < 0 || staging_off + brows.len > bseg.len)) {
        PyErr_SetString(PyExc_ValueError, "write_round: staging outside the segment");
        goto fail;
    }
    char *base = bseg.buf;
    const int64_t *valid = ba[0].buf, *first = ba[1].buf, *anchor = ba[2].buf, *req = ba[6].buf, *slots = ba[7].buf,
                  *qsl = ba[8].buf, *k = ba[10].buf, *staged = bst.buf;
    const uint8_t *smp = ba[3].buf, *need = ba[9].buf;
    if (max_q < 0) {
        max_q = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t q = wrap_add(qsl[i + 1], -qsl[i]);
            if (i == 0 || q > max_q)
                max_q = (Py_ssize_t)q;
        }
    }
    BEGIN_MAYBE_ALLOW_THREADS(brows.len)
    /* the staging: rows_staged is a prefix of the round's rows (writer.py), brows.len their bytes */
    if (brows.len)
        memcpy(base + staging_off, brows.buf, (size_t)brows.len);
    /* meta slot */
    char *m = base + meta_off;
    atomic_store_explicit(stamp_at(m, mo[M_START]), (uint64_t)t, memory_order_relaxed);
    atomic_thread_fence(memory_order_release); /* the stamp before the data: pairs with read's acquire fence */
    put_u64(m + mo[M_T], t);
    put_u32(m + mo[M_N], (uint64_t)n);
    put_u32(m + mo[M_ROWS], (uint64_t)rows_staged);
    put_i32s(m + mo[M_VALID], valid, n);
    memcpy(m + mo[M_FIRST], first, (size_t)n * 8);
    memcpy(m + mo[M_ANCHOR], anchor, (size_t)n * 8);
    put_i32s(m + mo[M_STAGED], valid, k_fit);
    memset(m + mo[M_STAGED] + 4 * k_fit, 0, (size_t)(n - k_fit) * 4);
    for (Py_ssize_t i = 0; i < n; i++)
        m[mo[M_SAMPLED] + i] = smp[i] != 0;
    if (sampled_seg) {
        memcpy(m + mo[M_SEED], ba[4].buf, (size_t)n * 8);
        memcpy(m + mo[M_TEMP], ba[5].buf, (size_t)n * 4);
    }
    atomic_store_explicit(stamp_at(m, mo[M_END]), (uint64_t)t, memory_order_release); /* pairs: read's acquire */
    /* desc slot */
    char *d = base + desc_off;
    atomic_store_explicit(stamp_at(d, dof[D_START]), (uint64_t)t, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    put_u64(d + dof[D_T], t);
    put_u32(d + dof[D_N], (uint64_t)n);
    put_u32(d + dof[D_MAXQ], (uint64_t)max_q);
    put_u32(d + dof[D_ROWS], (uint64_t)rows_staged);
    put_u32(d + dof[D_NSTAGED], (uint64_t)n_staged);
    put_i32s(d + dof[D_STAGED], staged, n_staged);
    memcpy(d + dof[D_REQ], req, (size_t)n * 8);
    put_i32s(d + dof[D_SLOT], slots, n);
    put_i32s(d + dof[D_QSL], qsl, n + 1);
    for (Py_ssize_t i = 0; i < n; i++)
        d[dof[D_NEED] + i] = need[i] != 0;
    put_i32s(d + dof[D_K], k, n);
    atomic_store_explicit(stamp_at(d, dof[D_END]), (uint64_t)t, memory_order_release);
    END_MAYBE_ALLOW_THREADS
    release_all(all);
    return PyLong_FromSsize_t(max_q);
fail:
    release_all(all);
    return NULL;
}

/* ------------------------------------------------------------------ engine: check_page */

/* check_page(buf, o_ok, n, N, ok_out) -> bool
 * engine_shim/reply.py ReplyReader.parse's check of a copied page: every n_drafts[i] (int32 at
 * o_ok + i) in 0..N; ok_out[i] (bool) = n_drafts[i] != 0. False (ok_out untouched) if any is not. */
PyObject *fr_check_page(PyObject *mod, PyObject *args) {
    PyObject *ob, *ook;
    Py_ssize_t o_ok, n, N;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OnnnO", &ob, &o_ok, &n, &N, &ook))
        return NULL;
    Py_buffer b = {0}, ok = {0};
    Py_buffer *all[3] = {&b, &ok, NULL};
    if (o_ok < 0 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "check_page: bad offsets");
        return NULL;
    }
    if (get_arr(ob, &b, 4, o_ok + n, 0, "buf") < 0 || get_arr(ook, &ok, 1, n, 1, "ok_out") < 0) {
        release_all(all);
        return NULL;
    }
    const int32_t *nd = (const int32_t *)b.buf + o_ok;
    uint8_t *out = ok.buf;
    int good = 1;
    for (Py_ssize_t i = 0; i < n; i++) /* as uint32 a negative count is huge: one comparison */
        good &= (uint32_t)nd[i] <= (uint32_t)N;
    if (good)
        for (Py_ssize_t i = 0; i < n; i++)
            out[i] = nd[i] != 0;
    release_all(all);
    return PyBool_FromLong(good);
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"check_round", fr_check_round, METH_VARARGS,
     "check_round(slots, valid, first_pos, k_window, qsl, mark, M, W) -> (code, total_valid)"},
    {"ring_write", fr_ring_write, METH_VARARGS,
     "ring_write(held, ring, slots, req_ids, first_pos, valid, rows, W, row_bytes); held: a Held of owner, "
     "generation, lo, hi, dirty, announced"},
    {"write_round", fr_write_round, METH_VARARGS, "write_round(seg, meta_off, desc_off, moffs, doffs, t, n, ...) -> max_q"},
    {"check_fast", fr_check_fast, METH_VARARGS,
     "check_fast(ndarray, M, W, B, mark, slots, valid, first_pos, anchor, k_window, need_draft, qsl, req_ids, rows) -> "
     "(code, n, total, taken)"},
    {"read_round", fr_read_round, METH_VARARGS,
     "read_round(seg, desc_off, meta_off, held, t, M, W, R, max_rows) -> (code, n, max_q, rows_staged, n_staged, "
     "n_misfit); held: a Held of moffs, doffs, desc_copy, meta_copy, mark, slots_out, valid_out"},
    {"advance", fr_advance, METH_VARARGS,
     "advance(held, slots, req_ids, first_pos, valid, W) -> (n_new_owner, n_resync, n_unknown); held: a Held of "
     "owner, generation, lo, hi, dirty, announced, unknown, counts, anchor, new_owner, new_gen, resync, held_first, "
     "held_rows"},
    {"fill_entries", fr_fill_entries, METH_VARARGS,
     "fill_entries(prefix, entries_off, entry_size, eoffs, idx, slots, n_rows, generation, first_pos, anchor_pos, "
     "anchor_token, need, new_gen, k_window, n_out) -> k"},
    {"pack_whole", fr_pack_whole, METH_VARARGS,
     "pack_whole(page, o_ok, o_ids, o_conf, M, N, n, cap, ok_rows, ids_rows, draft_ids, confidence) -> bool"},
    {"ring_runs", fr_ring_runs, METH_VARARGS,
     "ring_runs(base, slots, first_pos, n_rows, W, row_bytes) -> [memoryview] (the STEP's rows from the shared ring)"},
    {"ring_gather", fr_ring_gather, METH_VARARGS,
     "ring_gather(ring, slots, first_pos, n_rows, W, row_bytes, out) -> rows (small rows gathered from the ring)"},
    {"check_page", fr_check_page, METH_VARARGS, "check_page(buf, o_ok, n, N, ok_out) -> bool"},
    {"check_reply", fr_check_reply, METH_VARARGS,
     "check_reply(payload, o_status, o_window_rows, o_confidence, n, N, W, rs_max, usable) -> code: 0, or the "
     "first failed check (wire/codec.py reply_section_error_reference)"},
    {"accept_round", fr_accept_round, METH_VARARGS,
     "accept_round(slots, valid, k_window, num_spec, held, gate, probing) -> (n_ver, tokens, n_ready); held: a Held "
     "of hist, gsum, gcnt, left, ready"},
    {"advance_accept", fr_advance_accept, METH_VARARGS,
     "advance_accept(held_tab, held_acc, slots, req_ids, first_pos, valid, valid_raw, k_window, W, N, gate, probing, "
     "sums) -> (n_new_owner, n_resync, n_unknown, summed, n_ver, tokens, n_ready): advance, then accept_round"},
    {"finish_whole", fr_finish_whole, METH_VARARGS,
     "finish_whole(held, slots, status, need, draft_ids, confidence, o_ok, o_ids, o_conf, M, N, cap, ok_rows, ids_rows, "
     "status_ok) -> bool: the usual round's announce, page and status (held: announced, dirty, page)"},
    {"round_front", fr_round_front, METH_VARARGS,
     "round_front(seg, desc_off, meta_off, held_rd, t, M, W, R, max_rows, held_tab, held_acc, N, gate, probing, sums, "
     "go, fill, prefix, ent_off, ent_size, ring, gather, row_bytes) -> (code, n, max_q, rows_staged, n_staged, n_misfit, "
     "stage, k_staged, n_new_owner, n_resync, n_unknown, n_ver, tokens, n_ready, n_gathered): read_round, advance, "
     "accept_round, fill_entries, ring_gather"},
    {"bad_entries", fr_bad_entries, METH_VARARGS,
     "bad_entries(entries, eoffs, flags_bad, flags_new_gen, W, N, M, out) -> count: out[i] = entry i malformed on "
     "its own (wire/codec.py bad_entry_mask_reference)"},
    {"hist_observe", (PyCFunction)(void (*)(void))fr_hist_observe, METH_FASTCALL,
     "hist_observe(held, keys, *values): each value into its histogram of a group (stats.py HistGroup); held: a "
     "Held of counts, sums, mins, maxs"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_fastround",
                                    "The per-round hot paths in C beside their Python reference models.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastround(void) {
    PyObject *m = PyModule_Create(&moddef);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "META_FIELDS", M_COUNT) < 0 || PyModule_AddIntConstant(m, "DESC_FIELDS", D_COUNT) < 0 ||
        PyModule_AddIntConstant(m, "ENTRY_FIELDS", E_COUNT) < 0 || PyType_Ready(&HeldType) < 0 ||
        PyModule_AddObjectRef(m, "Held", (PyObject *)&HeldType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
