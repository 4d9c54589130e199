/*
 * _fastround_fused.c: the proxy's usual round in fewer calls. Each function here is two or three of the
 * single-job functions run back to back on one set of buffers (the same code: advance_core,
 * accept_core, pack_whole_core), so what the round pays is one call's argument parsing and buffers instead
 * of several, plus the Python between them. Each keeps the reference's order and, where the round is not
 * the usual one, stops before the part that needs Python (saying so) or writes nothing; round/fused.py
 * is the caller and says when each applies.
 */
#include "_fastround_shared.h"

/* advance_accept(held_tab, held_acc, slots, req_ids, first_pos, valid, valid_raw, k_window, W, N, gate, probing,
 *                sums) -> (n_new_owner, n_resync, n_unknown, summed, n_ver, tokens, n_ready)
 * advance (held_tab: its Held) then, when `sums` is set and no request has a new owner while the gate is on
 * (AcceptGate.begin would then have work to do first), accept_round (held_acc: its Held) on the same
 * slots with the engine's int32 valid and k_window: summed 1. Otherwise summed 0 and the sums are left
 * to the caller (the last three are 0). */
PyObject *fr_advance_accept(PyObject *mod, PyObject *args) {
    PyObject *held_tab, *held_acc, *o[6];
    Py_ssize_t W, N;
    int gate, probing, sums;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnnppp", &held_tab, &held_acc, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &W,
                          &N, &gate, &probing, &sums))
        return NULL;
    Py_buffer bs[6];
    memset(bs, 0, sizeof bs);
    Py_buffer *all[7] = {&bs[0], &bs[1], &bs[2], &bs[3], &bs[4], &bs[5], NULL};
    static const char *names[6] = {"slots", "req_ids", "first_pos", "valid", "valid_raw", "k_window"};
    static const Py_ssize_t isz[6] = {8, 8, 8, 8, 4, 4};
    if (get_arr(o[0], &bs[0], 8, 0, 0, names[0]) < 0)
        return NULL;
    Py_ssize_t n = bs[0].len / 8;
    for (int i = 1; i < 6; i++)
        if (get_arr(o[i], &bs[i], isz[i], n, 0, names[i]) < 0)
            goto fail;
    int64_t r[3], a[3] = {0, 0, 0};
    if (advance_core(held_tab, bs[0].buf, bs[1].buf, bs[2].buf, bs[3].buf, n, W, r) < 0)
        goto fail;
    int summed = sums && !(gate && r[0]);
    if (summed && accept_core(held_acc, bs[0].buf, bs[4].buf, bs[5].buf, n, N, gate, probing, a) < 0)
        goto fail;
    release_all(all);
    return Py_BuildValue("LLLiLLL", (long long)r[0], (long long)r[1], (long long)r[2], summed, (long long)a[0],
                         (long long)a[1], (long long)a[2]);
fail:
    release_all(all);
    return NULL;
}

/* finish_whole(held, slots, status, need, draft_ids, confidence, o_ok, o_ids, o_conf, M, N, cap, ok_rows, ids_rows,
 *              status_ok) -> bool
 * held: a Held of the ring model's announced, dirty (bool [S]) and the round's private page (int32).
 * Step 8 of the usual round (round/core.py _accept, every request with an entry, in order): when every
 * status byte is RS_OK (0), every request asked for drafts (need: bool [n]) and pack_whole's round holds
 * (cap >= N, no negative draft id), the slots are announced and clean (SlotTable.announce), the page is
 * packed as pack_whole packs it, word 1 is n and word 0 status_ok: True. Otherwise False and nothing is
 * written (the reference path runs). n is the length of slots; status and need must hold n items. */
PyObject *fr_finish_whole(PyObject *mod, PyObject *args) {
    PyObject *held, *o_slots, *o_status, *o_need, *o_ids, *o_conf;
    Py_ssize_t o_ok, o_id, o_cf, M, N, cap, ok_rows, ids_rows, status_ok;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OOOOOOnnnnnnnnn", &held, &o_slots, &o_status, &o_need, &o_ids, &o_conf, &o_ok, &o_id,
                          &o_cf, &M, &N, &cap, &ok_rows, &ids_rows, &status_ok))
        return NULL;
    Py_buffer bs = {0}, bst = {0}, bn = {0};
    Py_buffer *all[4] = {&bs, &bst, &bn, NULL};
    int done = 0;
    if (get_arr(o_slots, &bs, 8, 0, 0, "slots") < 0)
        return NULL;
    Py_ssize_t n = bs.len / 8, S = held_items(held, 0);
    if (get_arr(o_status, &bst, 1, n, 0, "status") < 0 || get_arr(o_need, &bn, 1, n, 0, "need") < 0)
        goto fail;
    uint8_t *ann = held_get(held, 0, 1, S, "announced"), *dirty = held_get(held, 1, 1, S, "dirty");
    int32_t *page = held_get(held, 2, 4, 2, "page");
    if (!ann || !dirty || !page)
        goto fail;
    const int64_t *slots = bs.buf;
    const uint8_t *status = bst.buf, *need = bn.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((uint64_t)slots[i] >= (uint64_t)S) {
            PyErr_Format(PyExc_ValueError, "finish_whole: slot %lld out of range", (long long)slots[i]);
            goto fail;
        }
        if (status[i] || !need[i])
            goto out;
    }
    int r = pack_whole_core(page, held_items(held, 2), o_ok, o_id, o_cf, M, N, n, cap, ok_rows, ids_rows, o_ids,
                            o_conf);
    if (r < 0)
        goto fail;
    if (!r)
        goto out;
    for (Py_ssize_t i = 0; i < n; i++) {
        ann[slots[i]] = 1;
        dirty[slots[i]] = 0;
    }
    page[1] = (int32_t)n;
    page[0] = (int32_t)status_ok;
    done = 1;
out:
    release_all(all);
    return PyBool_FromLong(done);
fail:
    release_all(all);
    return NULL;
}

/* round_front(seg, desc_off, meta_off, held_rd, t, M, W, R, max_rows, held_tab, held_acc, N, gate, probing, sums, go,
 *             fill, prefix, ent_off, ent_size, ring, gather, row_bytes)
 *   -> (code, n, max_q, rows_staged, n_staged, n_misfit, stage, k_staged, n_new_owner, n_resync, n_unknown, n_ver,
 *       tokens, n_ready, n_gathered)
 * The usual round's front, from the descriptor to the STEP's entries, stopping where the round stops
 * being the usual one; `stage` says how far it went:
 *   0  read_round only (its code; or `go` clear: the caller has a connection epoch or moved slots to
 *      apply before the ring model advances)
 *   1  + need (bool, held_rd's [7]: need_draft != 0) and k_staged (requests with staged rows), then
 *      advance (held_tab) on the copies' slots, req_id, first_pos and valid
 *   2  + accept_round (held_acc), as advance_accept decides it (`sums`, no new owner while the gate is on)
 *   3  + every request's entry, fill_entries' bytes with n_out 0, when `fill` is set (the caller knows
 *      the breaker, the link's row cap, the gate's mask and n_out leave the usual round as it is) and
 *      the round needs no window: no resync, no staged window, no unknown range, and all n > 0
 *      requests have staged rows. Then, when `ring` is not None (the engine's shared ring, rows of
 *      `row_bytes` small enough to gather), the entries' rows copied into `gather` (ring_gather's copy):
 *      n_gathered rows; -1 when not gathered (no ring, or the copy refused: the caller's ring_gather
 *      then says why).
 * held_rd: read_round's Held (moffs, doffs, desc_copy, meta_copy, mark, slots_out, valid_out), then need
 * (bool [M]) and eoffs (int64, ENTRY_DTYPE's offsets). */
PyObject *fr_round_front(PyObject *mod, PyObject *args) {
    PyObject *seg, *held_rd, *held_tab, *held_acc, *prefix, *ring, *gather;
    Py_ssize_t desc_off, meta_off, M, W, R, max_rows, N, ent_off, ent_size, B;
    unsigned long long t;
    int gate, probing, sums, go, fill;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OnnOKnnnnOOnpppppOnnOOn", &seg, &desc_off, &meta_off, &held_rd, &t, &M, &W, &R,
                          &max_rows, &held_tab, &held_acc, &N, &gate, &probing, &sums, &go, &fill, &prefix, &ent_off,
                          &ent_size, &ring, &gather, &B))
        return NULL;
    Py_buffer bseg = {0};
    if (PyObject_GetBuffer(seg, &bseg, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t rd[6];
    int rc = read_core(bseg.buf, bseg.len, desc_off, meta_off, held_rd, t, M, W, R, max_rows, rd);
    PyBuffer_Release(&bseg);
    if (rc < 0)
        return NULL;
    int stage = 0;
    Py_ssize_t n_gathered = -1;
    int64_t k_staged = 0, r[3] = {0, 0, 0}, a[3] = {0, 0, 0};
    Py_ssize_t n = rd[1];
    const int64_t *mo = held_get(held_rd, 0, 8, M_COUNT, "moffs"), *dof = held_get(held_rd, 1, 8, D_COUNT, "doffs");
    char *d = held_get(held_rd, 2, 1, 0, "desc_copy"), *m = held_get(held_rd, 3, 1, 0, "meta_copy");
    int64_t *slots = held_get(held_rd, 5, 8, M, "slots_out"), *valid = held_get(held_rd, 6, 8, M, "valid_out");
    uint8_t *need = held_get(held_rd, 7, 1, M, "need");
    const int64_t *eo = held_get(held_rd, 8, 8, E_COUNT, "eoffs");
    if (!mo || !dof || !d || !m || !slots || !valid || !need || !eo)
        return NULL;
    /* the copies' int64 fields are read in place: each must be 8-aligned in memory (the layout aligns
     * them; anything else takes the caller's path) */
    if (rd[0] != 0 || !go || ((uintptr_t)(d + dof[D_REQ]) | (uintptr_t)(m + mo[M_FIRST]) |
                              (uintptr_t)(m + mo[M_ANCHOR])) % 8 ||
        ((uintptr_t)(m + mo[M_VALID]) | (uintptr_t)(d + dof[D_K])) % 4)
        goto out;
    const int64_t *req = (const int64_t *)(d + dof[D_REQ]), *first = (const int64_t *)(m + mo[M_FIRST]),
                  *tok = (const int64_t *)(m + mo[M_ANCHOR]);
    const int32_t *valid_raw = (const int32_t *)(m + mo[M_VALID]), *kw = (const int32_t *)(d + dof[D_K]);
    const uint8_t *need_raw = (const uint8_t *)(d + dof[D_NEED]);
    for (Py_ssize_t i = 0; i < n; i++) {
        need[i] = need_raw[i] != 0;
        k_staged += get_i32(m + mo[M_STAGED] + 4 * i) != 0;
    }
    if (advance_core(held_tab, slots, req, first, valid, n, W, r) < 0)
        return NULL;
    stage = 1;
    if (!sums || (gate && r[0]))
        goto out;
    if (accept_core(held_acc, slots, valid_raw, kw, n, N, gate, probing, a) < 0)
        return NULL;
    stage = 2;
    if (!fill || r[1] || rd[4] || r[2] || k_staged != n || n == 0)
        goto out;
    Py_ssize_t S = held_items(held_tab, 0);
    const int64_t *gen = held_get(held_tab, 1, 8, S, "generation"), *anchor = held_get(held_tab, 8, 8, n, "anchor");
    const uint8_t *new_gen = held_get(held_tab, 10, 1, n, "new_gen");
    if (!gen || !anchor || !new_gen)
        return NULL;
    Py_buffer bp = {0};
    if (PyObject_GetBuffer(prefix, &bp, PyBUF_WRITABLE) < 0)
        return NULL;
    if (ent_off < 0 || ent_size < 40 || ent_off + n * ent_size > bp.len) {
        PyBuffer_Release(&bp);
        PyErr_SetString(PyExc_ValueError, "round_front: entries outside the prefix");
        return NULL;
    }
    fill_core((char *)bp.buf + ent_off, ent_size, eo, NULL, n, slots, valid, gen, first, anchor, tok, need, new_gen, kw,
              0);
    PyBuffer_Release(&bp);
    stage = 3;
    if (ring != Py_None) {
        Py_buffer br = {0}, bo = {0};
        if (PyObject_GetBuffer(ring, &br, PyBUF_SIMPLE) == 0) {
            if (PyObject_GetBuffer(gather, &bo, PyBUF_WRITABLE) == 0) {
                n_gathered = ring_gather_core(br.buf, br.len, W, B, slots, first, valid, n, bo.buf, bo.len);
                PyBuffer_Release(&bo);
            }
            PyBuffer_Release(&br);
        }
        if (n_gathered < 0) { /* not gathered: the caller's own ring_gather raises what this one found */
            PyErr_Clear();
            n_gathered = -1;
        }
    }
out:
    return Py_BuildValue("iIIIIIiLLLLLLLn", (int)rd[0], rd[1], rd[2], rd[3], rd[4], rd[5], stage, (long long)k_staged,
                         (long long)r[0], (long long)r[1], (long long)r[2], (long long)a[0], (long long)a[1],
                         (long long)a[2], n_gathered);
}
