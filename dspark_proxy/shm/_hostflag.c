/*
 * _hostflag: the few things Python cannot express for the engine <-> proxy hand-off.
 *
 *  - acquire loads, release stores and compare-and-swap on 64-bit words in shared memory,
 *  - futex waits (bounded spin first) and wakes, with the GIL released,
 *  - claim + copy + release of the reply page as one call the other party cannot interleave with,
 *  - seqlock reads and writes of small blocks (statistics, resync requests),
 *  - the Watcher: the watchdog's deadline claims on a pthread that never takes the GIL.
 *
 * Everything else (names, sizes, deadlines, who calls what) is policy and lives in Python
 * (dspark_proxy/shm/: hostflag.py, layout.py, stamped.py, resync.py). Every function takes a
 * writable buffer (the mapped segment) and byte offsets into it; offsets are checked against the
 * buffer and for 8-byte (words: 64-byte) alignment before any access.
 *
 * Words (each on its own 128-byte line, index * WORD_STRIDE from the words region; shm_layout.md
 * is the reference and has the full table):
 *
 *   word        writer(s)                        reader(s)        rule
 *   gathered    engine (release)                 proxy, watchdog  round t's staging is complete
 *   claimed     proxy | watchdog | fail_all (CAS)  engine         exactly one winner per round; never backwards
 *   published   the claim's winner (release)     engine           page holds the winner's reply
 *   consumed    engine (release)                 proxy            page may be rewritten for t+1
 *
 * Memory order: every store another process reads is a release store paired with an acquire load
 * on the reader's side (named at each site). No x86-only fences: this must be right on aarch64.
 * The futex sleeps on a 32-bit wake sequence beside each word (+12), which every store bumps: a
 * futex on the word's own low half would miss a store that changes only its high half (fail_all
 * to t + 2**40). A sleeper registers in the word's `sleepers` count (+8) and reads the sequence
 * before its final check; a writer stores, bumps the sequence, and wakes only when that count is
 * non-zero. Both sides use seq_cst for that pair (a Dekker handshake), so no wake is lost and an
 * uncontended store costs no syscall.
 *
 * No lock in shared memory: a process that dies at any instruction leaves at worst a claimed-but-
 * unpublished round, which the other side detects by its deadline (shm_layout.md §9). The one mutex
 * (the Watcher's record ring) is private to the engine process and never held across a wait.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "_hostflag: the segment layout is little-endian (numpy dtypes with <); big-endian is not supported"
#endif

_Static_assert(sizeof(_Atomic uint64_t) == 8, "64-bit atomics must be 8 bytes");
_Static_assert(sizeof(_Atomic uint32_t) == 4, "32-bit atomics must be 4 bytes");

/* Word indices; layout.py reads these from the module so the two cannot disagree. */
enum {
    W_GATHERED = 0,
    W_CLAIMED = 1,
    W_PUBLISHED = 2,
    W_CONSUMED = 3,
    N_ROUND_WORDS = 4,
    W_PUBLISHED_NS = 15, /* publish's clock stamp (layout.py Word.PUBLISHED_NS; shm_layout.md section 2) */
};
#define WORD_STRIDE 128   /* one word per false-sharing range (two 64-byte lines on x86 and Neoverse) */
#define SLEEPERS_OFF 8    /* the sleepers count shares its word's line */
#define WAKESEQ_OFF 12    /* ... and so does the wake sequence the futex sleeps on */

#define ROUND_FAILED 2    /* reply page status written by fail_round / fail_all (round/core.py: STATUS_ROUND_FAILED) */

/* ------------------------------------------------------------------ helpers */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline _Atomic uint64_t *word_at(char *base, Py_ssize_t off) {
    return (_Atomic uint64_t *)(base + off);
}

/* Check that [off, off + len) lies in the buffer and off is `align`-aligned; sets ValueError. */
static int check_range(const Py_buffer *b, Py_ssize_t off, Py_ssize_t len, Py_ssize_t align) {
    if (off < 0 || len < 0 || off > b->len - len) {
        PyErr_Format(PyExc_ValueError, "offset %zd + %zd bytes outside the %zd-byte buffer", off, len, b->len);
        return -1;
    }
    if (align > 1 && (((uintptr_t)b->buf + (uintptr_t)off) % (uintptr_t)align) != 0) {
        PyErr_Format(PyExc_ValueError, "offset %zd is not %zd-byte aligned", off, align);
        return -1;
    }
    return 0;
}

static int check_words(const Py_buffer *b, Py_ssize_t words_off) {
    return check_range(b, words_off, (Py_ssize_t)N_ROUND_WORDS * WORD_STRIDE, 64);
}

static long futex_wait32(_Atomic uint32_t *addr, uint32_t expected, int64_t timeout_ns) {
    struct timespec ts;
    ts.tv_sec = (time_t)(timeout_ns / 1000000000LL);
    ts.tv_nsec = (long)(timeout_ns % 1000000000LL);
    /* shared (not FUTEX_PRIVATE): the word lives in a segment mapped by two processes */
    return syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* After a store to w: bump its wake sequence, then wake sleepers if any. seq_cst: the bump pairs with
 * the sleeper's sequence load, the sleepers load with its seq_cst increment (wait_ge_nogil). */
static inline void wake_if_sleepers(_Atomic uint64_t *w) {
    _Atomic uint32_t *sleepers = (_Atomic uint32_t *)((char *)w + SLEEPERS_OFF);
    _Atomic uint32_t *seq = (_Atomic uint32_t *)((char *)w + WAKESEQ_OFF);
    atomic_fetch_add_explicit(seq, 1, memory_order_seq_cst);
    if (atomic_load_explicit(sleepers, memory_order_seq_cst) != 0)
        futex_wake_all(seq);
}

/* Store v with release semantics, then wake. The seq_cst fence orders the store before the sleepers
 * load (the other half of the Dekker handshake). */
static inline void store_release_wake(_Atomic uint64_t *w, uint64_t v) {
    atomic_store_explicit(w, v, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    wake_if_sleepers(w);
}

/* Raise a word to at least v (monotonic); returns the value before. */
static inline uint64_t raise_to(_Atomic uint64_t *w, uint64_t v) {
    uint64_t cur = atomic_load_explicit(w, memory_order_relaxed);
    while (cur < v) {
        /* release: pairs with the acquire loads of whoever waits on this word */
        if (atomic_compare_exchange_weak_explicit(w, &cur, v, memory_order_acq_rel, memory_order_relaxed))
            break;
    }
    return cur;
}

/* Outcome of a wait, without the GIL. */
enum { WAIT_OK = 1, WAIT_TIMEOUT = 0, WAIT_EINTR = -1 };

/*
 * Wait until *w >= target or until deadline (CLOCK_MONOTONIC ns). Spins for up to spin_ns first
 * (cheap when the answer comes quickly and each side has a core), then sleeps in the futex.
 * Called without the GIL. Returns WAIT_EINTR when a signal interrupted the sleep so that the
 * caller can run Python's signal handlers and decide whether to go on.
 */
static int wait_ge_stoppable(_Atomic uint64_t *w, uint64_t target, int64_t deadline, int64_t spin_ns,
                             _Atomic int *stop) {
    /* acquire: pairs with the writer's release store (gathered / published / consumed) */
    uint64_t v = atomic_load_explicit(w, memory_order_acquire);
    if (v >= target)
        return WAIT_OK;
    int64_t start = now_ns();
    if (spin_ns > 0) {
        int64_t spin_end = start + spin_ns;
        if (spin_end > deadline)
            spin_end = deadline;
        for (unsigned i = 1;; i++) {
            cpu_relax();
            v = atomic_load_explicit(w, memory_order_acquire);
            if (v >= target)
                return WAIT_OK;
            if ((i & 63) == 0 && now_ns() >= spin_end)
                break;
        }
    }
    _Atomic uint32_t *seq = (_Atomic uint32_t *)((char *)w + WAKESEQ_OFF);
    _Atomic uint32_t *sleepers = (_Atomic uint32_t *)((char *)w + SLEEPERS_OFF);
    for (;;) {
        int64_t left = deadline - now_ns();
        if (left <= 0)
            return atomic_load_explicit(w, memory_order_acquire) >= target ? WAIT_OK : WAIT_TIMEOUT;
        /* seq_cst: pairs with the seq_cst load of sleepers in wake_if_sleepers */
        atomic_fetch_add_explicit(sleepers, 1, memory_order_seq_cst);
        /* the sequence first, then the value: a store we do not see here bumps the sequence after
         * this load, so the futex below refuses to sleep (EAGAIN) or is woken */
        uint32_t s0 = atomic_load_explicit(seq, memory_order_seq_cst);
        v = atomic_load_explicit(w, memory_order_seq_cst);
        if (v >= target) {
            atomic_fetch_sub_explicit(sleepers, 1, memory_order_seq_cst);
            return WAIT_OK;
        }
        /* the stop flag after the sequence (both seq_cst): a stop we miss here was stored before
         * the stopper's wake bumped the sequence, so the futex below refuses to sleep or is woken */
        if (stop != NULL && atomic_load_explicit(stop, memory_order_seq_cst)) {
            atomic_fetch_sub_explicit(sleepers, 1, memory_order_seq_cst);
            return WAIT_TIMEOUT;
        }
        long r = futex_wait32(seq, s0, left);
        int err = errno;
        atomic_fetch_sub_explicit(sleepers, 1, memory_order_seq_cst);
        if (atomic_load_explicit(w, memory_order_acquire) >= target)
            return WAIT_OK;
        if (r == -1 && err == EINTR)
            return WAIT_EINTR;
        /* woken, EAGAIN (value moved but not far enough), ETIMEDOUT or spurious: loop re-checks */
    }
}

static int wait_ge_nogil(_Atomic uint64_t *w, uint64_t target, int64_t deadline, int64_t spin_ns) {
    return wait_ge_stoppable(w, target, deadline, spin_ns, NULL);
}

/* Run a GIL-free wait, honouring signals: EINTR runs Python's handlers (Ctrl-C raises) and resumes. */
static int wait_ge_signals(_Atomic uint64_t *w, uint64_t target, int64_t deadline, int64_t spin_ns) {
    for (;;) {
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = wait_ge_nogil(w, target, deadline, spin_ns);
        Py_END_ALLOW_THREADS
        if (r != WAIT_EINTR)
            return r;
        if (PyErr_CheckSignals() < 0)
            return -2; /* exception set */
        spin_ns = 0;
    }
}

/*
 * The spin a wait learns (hostflag.py AdaptiveSpin: its `update` is the rule's reference, its `state`
 * the int64 [spin_ns, max_ns, min_ns] a wait passes here, so the engine's and the proxy's waits learn
 * inside their one C call rather than in three more Python calls after it). A wait's length counts to
 * when the answer came: its writer's stamp (gathered_ns, published_ns) when t0 <= stamp <= now, else
 * the wait itself (an older stamp is an earlier round's).
 */
static int check_spin_state(const Py_buffer *st) {
    if (st->len != 3 * (Py_ssize_t)sizeof(int64_t) || ((uintptr_t)st->buf % sizeof(int64_t)) != 0) {
        PyErr_SetString(PyExc_ValueError, "spin state: an aligned int64 [spin_ns, max_ns, min_ns]");
        return -1;
    }
    return 0;
}

static int64_t came_ns(char *base, Py_ssize_t stamp_off, int64_t t0, int ok) {
    int64_t now = now_ns();
    if (ok && stamp_off >= 0) {
        /* relaxed: a timing hint, nothing is read through it */
        int64_t stamp = (int64_t)atomic_load_explicit(word_at(base, stamp_off), memory_order_relaxed);
        if (t0 <= stamp && stamp <= now)
            return stamp - t0;
    }
    return now - t0;
}

/* AdaptiveSpin.update: grow towards twice a quick answer (at least 2 us), halve after one that was not */
static void spin_learn(int64_t *st, int64_t waited_ns, int ok) {
    if (ok && waited_ns < st[1]) {
        int64_t v = 2 * waited_ns > st[0] ? 2 * waited_ns : st[0];
        v = v > 2000 ? v : 2000;
        st[0] = v < st[1] ? v : st[1];
    } else {
        st[0] = st[0] / 2 > st[2] ? st[0] / 2 : st[2];
    }
}

/* spin_learn(state, waited_ns, ok): the C rule alone, for the differential test against AdaptiveSpin.update */
static PyObject *hf_spin_learn(PyObject *mod, PyObject *args) {
    Py_buffer st;
    long long waited;
    int ok;
    (void)mod;
    if (!PyArg_ParseTuple(args, "w*Lp", &st, &waited, &ok))
        return NULL;
    PyObject *res = NULL;
    if (check_spin_state(&st) == 0) {
        spin_learn((int64_t *)st.buf, (int64_t)waited, ok);
        res = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&st);
    return res;
}

/* timeout_s must not be NaN (callers check: see check_timeout) */
static int64_t deadline_from_timeout(double timeout_s) {
    int64_t now = now_ns();
    if (timeout_s < 0)
        return INT64_MAX;              /* negative: wait forever */
    if (timeout_s > 9.0e9)
        return INT64_MAX;
    return now + (int64_t)(timeout_s * 1e9);
}

static int check_timeout(double timeout_s) {
    if (timeout_s != timeout_s) {
        PyErr_SetString(PyExc_ValueError, "timeout_s is NaN");
        return -1;
    }
    return 0;
}

/* A failed page's zeroed bytes after [status, n]: never negative (memset would take it as huge). */
static int check_zero_bytes(Py_ssize_t zero_bytes) {
    if (zero_bytes < 0) {
        PyErr_Format(PyExc_ValueError, "zero_bytes=%zd is negative", zero_bytes);
        return -1;
    }
    return 0;
}

/* "O&" converter for a 64-bit word value: unlike "K", out of range (negative, >= 2**64) raises OverflowError */
static int conv_u64(PyObject *o, void *out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    *(unsigned long long *)out = v;
    return 1;
}

/* ------------------------------------------------------------------ the reply page */

/*
 * claim t (CAS claimed: t-1 -> t), run `fill`, then release published = t. Returns 1 when this
 * caller won, 0 when someone claimed t (or beyond) first, -1 when claimed is behind t-1 (the caller
 * is out of order: it must not claim ahead of an unclaimed round).
 */
static int claim(_Atomic uint64_t *claimed, uint64_t t) {
    uint64_t expected = t - 1;
    /* acq_rel: the claim is ordered after everything we did before it */
    if (atomic_compare_exchange_strong_explicit(claimed, &expected, t, memory_order_acq_rel,
                                                memory_order_acquire)) {
        /* release fence: the page writes that follow must not become visible before the claim (a
         * reader that sees them also sees claimed move, and rejects its copy). An acq_rel CAS alone
         * does not order later stores after its own store on aarch64; this is the seqlock writer's
         * fence after `seq = odd` (Linux write_seqcount_begin's smp_wmb). Pairs with read_page's
         * acquire fence before its second look at claimed. */
        atomic_thread_fence(memory_order_release);
        return 1;
    }
    return expected >= t ? 0 : -1;
}

static void write_failed_page(char *page, Py_ssize_t zero_bytes, int32_t n) {
    int32_t *p = (int32_t *)page;
    memset(page + 8, 0, (size_t)zero_bytes);
    p[0] = ROUND_FAILED;
    p[1] = n;
}

/*
 * A page's rows (ReplyPageLayout.rows_spec): int64 [M, off_1, per_1, ..., off_k, per_k] in int32 words.
 * The page is [status, n], then k blocks of M requests, request i's words at off + i * per. A round of
 * n requests is its header and the first n requests of each block: all that its reader reads (reply.py
 * parses [:n] only), so publish and read_page copy that much and not the whole page: 11 KB at the
 * docs/deploy.md's M=256, each 64-byte line of it a cache miss on the other side's core.
 */
typedef struct {
    int64_t M;
    Py_ssize_t k;
    const int64_t *sec; /* off_1, per_1, ... */
} rows_spec;

static int parse_rows(const Py_buffer *spec, Py_ssize_t page_bytes, rows_spec *out) {
    Py_ssize_t words = spec->len / 8;
    if (spec->len % 8 != 0 || words < 1 || words % 2 != 1 || words > 1 + 2 * 16) {
        PyErr_SetString(PyExc_ValueError, "rows spec: int64 [M, off, per, ...], at most 16 blocks");
        return -1;
    }
    const int64_t *w = (const int64_t *)spec->buf;
    out->M = w[0];
    out->k = (words - 1) / 2;
    out->sec = w + 1;
    if (out->M < 0 || out->M > (1 << 24)) {
        PyErr_Format(PyExc_ValueError, "rows spec: M %lld out of range", (long long)out->M);
        return -1;
    }
    for (Py_ssize_t j = 0; j < out->k; j++) {
        int64_t off = out->sec[2 * j], per = out->sec[2 * j + 1];
        if (off < 2 || per < 0 || per > (1 << 16) || (off + out->M * per) * 4 > (int64_t)page_bytes) {
            PyErr_Format(PyExc_ValueError, "rows spec: block %zd (%lld + %lld x %lld words) outside the "
                         "%zd-byte page", j, (long long)off, (long long)out->M, (long long)per, page_bytes);
            return -1;
        }
    }
    return 0;
}

/* The header and requests [0, n) of every block (n clamped to 0..M: a page's own n is not trusted). */
static void copy_rows(char *dst, const char *src, const rows_spec *s, int64_t n) {
    n = n < 0 ? 0 : n > s->M ? s->M : n;
    memcpy(dst, src, 8);
    for (Py_ssize_t j = 0; j < s->k; j++) {
        size_t at = (size_t)s->sec[2 * j] * 4;
        memcpy(dst + at, src + at, (size_t)(n * s->sec[2 * j + 1]) * 4);
    }
}

/* publish(buf, words_off, page_off, t, src[, rows]) -> 1 won / 0 lost / -1 out of order
 * With `rows` (a rows spec) only src's header and its first src[1] requests are copied. 
 * The winner also stamps PUBLISHED_NS (CLOCK_MONOTONIC after its copy), so the engine's spin learns
 * when the reply came rather than when its own wait returned (hostflag.py AdaptiveSpin). */
static PyObject *hf_publish(PyObject *mod, PyObject *args) {
    Py_buffer b, src;
    Py_ssize_t words_off, page_off;
    unsigned long long t;
    (void)mod;
    Py_buffer spec = {0};
    if (!PyArg_ParseTuple(args, "w*nnO&y*|y*", &b, &words_off, &page_off, conv_u64, &t, &src, &spec))
        return NULL;
    PyObject *res = NULL;
    rows_spec rows;
    if (t == 0) {
        PyErr_SetString(PyExc_ValueError, "rounds start at 1");
        goto done;
    }
    if (check_range(&b, words_off, (Py_ssize_t)(W_PUBLISHED_NS + 1) * WORD_STRIDE, 64) < 0 ||
        check_range(&b, page_off, src.len, 64) < 0)
        goto done;
    if (spec.buf != NULL && (src.len < 8 || parse_rows(&spec, src.len, &rows) < 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a page with rows holds at least its header (8 bytes)");
        goto done;
    }
    char *base = (char *)b.buf;
    _Atomic uint64_t *claimed = word_at(base, words_off + W_CLAIMED * WORD_STRIDE);
    _Atomic uint64_t *published = word_at(base, words_off + W_PUBLISHED * WORD_STRIDE);
    _Atomic uint64_t *stamp = word_at(base, words_off + W_PUBLISHED_NS * WORD_STRIDE);
    int won;
    Py_BEGIN_ALLOW_THREADS
    won = claim(claimed, (uint64_t)t);
    if (won == 1) {
        if (spec.buf != NULL) /* src is private to the caller: its own n is what it packed */
            copy_rows(base + page_off, (const char *)src.buf, &rows, ((const int32_t *)src.buf)[1]);
        else
            memcpy(base + page_off, src.buf, (size_t)src.len);
        /* relaxed: the release of published below orders it; the engine loads it after its acquire */
        atomic_store_explicit(stamp, (uint64_t)now_ns(), memory_order_relaxed);
        /* release: pairs with the acquire load of published in read_page / wait_ge */
        raise_to(published, (uint64_t)t);
        atomic_thread_fence(memory_order_seq_cst);
        wake_if_sleepers(published);
    }
    Py_END_ALLOW_THREADS
    res = PyLong_FromLong(won);
done:
    PyBuffer_Release(&b);
    PyBuffer_Release(&src);
    if (spec.buf != NULL)
        PyBuffer_Release(&spec);
    return res;
}

static int do_fail_round(char *base, Py_ssize_t words_off, Py_ssize_t page_off, Py_ssize_t zero_bytes,
                         uint64_t t, int32_t n) {
    _Atomic uint64_t *claimed = word_at(base, words_off + W_CLAIMED * WORD_STRIDE);
    _Atomic uint64_t *published = word_at(base, words_off + W_PUBLISHED * WORD_STRIDE);
    int won = claim(claimed, t);
    if (won == 1) {
        write_failed_page(base + page_off, zero_bytes, n);
        raise_to(published, t); /* release: pairs with read_page's acquire */
        atomic_thread_fence(memory_order_seq_cst);
        wake_if_sleepers(published);
    }
    return won;
}

/* fail_round(buf, words_off, page_off, zero_bytes, t, n) -> 1 won / 0 lost / -1 out of order */
static PyObject *hf_fail_round(PyObject *mod, PyObject *args) {
    Py_buffer b;
    Py_ssize_t words_off, page_off, zero_bytes;
    unsigned long long t;
    int n;
    (void)mod;
    if (!PyArg_ParseTuple(args, "w*nnnO&i", &b, &words_off, &page_off, &zero_bytes, conv_u64, &t, &n))
        return NULL;
    PyObject *res = NULL;
    if (t == 0) {
        PyErr_SetString(PyExc_ValueError, "rounds start at 1");
        goto done;
    }
    if (check_words(&b, words_off) < 0 || check_zero_bytes(zero_bytes) < 0 || check_range(&b, page_off, zero_bytes + 8, 64) < 0)
        goto done;
    int won;
    Py_BEGIN_ALLOW_THREADS
    won = do_fail_round((char *)b.buf, words_off, page_off, zero_bytes, (uint64_t)t, (int32_t)n);
    Py_END_ALLOW_THREADS
    res = PyLong_FromLong(won);
done:
    PyBuffer_Release(&b);
    return res;
}

/*
 * fail_all(buf, words_off, page_off, zero_bytes, T) -> True when this call moved claimed forward.
 * Claims every round up to T at once (CAS claimed: c -> T for whatever c < T is there), writes a
 * failed page and raises published to T. A reader of any round t < T sees claimed != t and treats
 * t as target-only without trusting the page (read_page's rule), so a claimant still copying into
 * the page meanwhile cannot hand anyone a torn reply.
 */
static PyObject *hf_fail_all(PyObject *mod, PyObject *args) {
    Py_buffer b;
    Py_ssize_t words_off, page_off, zero_bytes;
    unsigned long long T;
    (void)mod;
    if (!PyArg_ParseTuple(args, "w*nnnO&", &b, &words_off, &page_off, &zero_bytes, conv_u64, &T))
        return NULL;
    PyObject *res = NULL;
    if (check_words(&b, words_off) < 0 || check_zero_bytes(zero_bytes) < 0 || check_range(&b, page_off, zero_bytes + 8, 64) < 0)
        goto done;
    char *base = (char *)b.buf;
    _Atomic uint64_t *claimed = word_at(base, words_off + W_CLAIMED * WORD_STRIDE);
    _Atomic uint64_t *published = word_at(base, words_off + W_PUBLISHED * WORD_STRIDE);
    uint64_t before;
    Py_BEGIN_ALLOW_THREADS
    before = raise_to(claimed, (uint64_t)T);
    if (before < (uint64_t)T) {
        atomic_thread_fence(memory_order_release); /* the claim before the page writes (see claim()) */
        write_failed_page(base + page_off, zero_bytes, 0);
        raise_to(published, (uint64_t)T); /* release: pairs with read_page's acquire */
        atomic_thread_fence(memory_order_seq_cst);
        wake_if_sleepers(published);
    }
    /* else someone already holds the claim of T (or beyond) and publishes it after its own copy:
     * raising published here could expose the page before that copy */
    Py_END_ALLOW_THREADS
    res = PyBool_FromLong(before < (uint64_t)T);
done:
    PyBuffer_Release(&b);
    return res;
}

/* Copies above this size release the GIL (a copy that long is worth letting other threads run). */
#define GIL_FREE_COPY_BYTES (256 * 1024)

/* the GIL reacquire of this thread's last wait_or_fail: ns from the end of its wait to holding the GIL
 * again (0: it never released the GIL). gil_wait_ns() reads it, for the chaos campaign's attribution. */
static _Thread_local int64_t last_gil_wait_ns;

static int read_page_nogil(char *base, _Atomic uint64_t *claimed, _Atomic uint64_t *published, Py_ssize_t page_off,
                           unsigned long long t, Py_buffer *dst, const rows_spec *rows, Py_ssize_t n) {
    /* acquire: pairs with the release raise of published after the winner's copy */
    if (atomic_load_explicit(published, memory_order_acquire) < (uint64_t)t)
        return -1;
    if (atomic_load_explicit(claimed, memory_order_acquire) != (uint64_t)t)
        return 0;
    if (rows != NULL)
        copy_rows((char *)dst->buf, base + page_off, rows, (int64_t)n);
    else
        memcpy(dst->buf, base + page_off, (size_t)dst->len);
    /* acquire fence: the copy's loads complete before the second look at claimed */
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(claimed, memory_order_relaxed) == (uint64_t)t ? 1 : 0;
}

/*
 * read_page(buf, words_off, page_off, t, dst[, rows, n]) -> 1 accepted / 0 not this round's page
 * (someone failed ahead, or the claim moved while copying: target-only) / -1 not published yet.
 * The seqlock rule: the copy is trusted only if claimed == t before and after it. With `rows` (a rows
 * spec) only the header and the first n requests of each block are copied (n: the round's own, which
 * the caller then checks against the page's).
 */
static PyObject *hf_read_page(PyObject *mod, PyObject *args) {
    Py_buffer b, dst;
    Py_ssize_t words_off, page_off;
    unsigned long long t;
    (void)mod;
    Py_buffer spec = {0};
    Py_ssize_t n = 0;
    if (!PyArg_ParseTuple(args, "w*nnO&w*|y*n", &b, &words_off, &page_off, conv_u64, &t, &dst, &spec, &n))
        return NULL;
    PyObject *res = NULL;
    rows_spec rows;
    if (check_words(&b, words_off) < 0 || check_range(&b, page_off, dst.len, 64) < 0)
        goto done;
    if (spec.buf != NULL && (dst.len < 8 || parse_rows(&spec, dst.len, &rows) < 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a page with rows holds at least its header (8 bytes)");
        goto done;
    }
    char *base = (char *)b.buf;
    _Atomic uint64_t *claimed = word_at(base, words_off + W_CLAIMED * WORD_STRIDE);
    _Atomic uint64_t *published = word_at(base, words_off + W_PUBLISHED * WORD_STRIDE);
    int r;
    /* a reply page is a few KiB: copied with the GIL kept. Releasing it would let another thread of the
     * engine process take the GIL, and the engine thread would wait to get it back (a switch interval,
     * or as long as the kernel keeps that thread off the CPU): the engine's own wait, after the reply
     * was there (the chaos campaign's worst_over_limit, docs/chaos.md) */
    if (dst.len >= GIL_FREE_COPY_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        r = read_page_nogil(base, claimed, published, page_off, t, &dst, spec.buf != NULL ? &rows : NULL, n);
        Py_END_ALLOW_THREADS
    } else {
        r = read_page_nogil(base, claimed, published, page_off, t, &dst, spec.buf != NULL ? &rows : NULL, n);
    }
    res = PyLong_FromLong(r);
done:
    PyBuffer_Release(&b);
    PyBuffer_Release(&dst);
    if (spec.buf != NULL)
        PyBuffer_Release(&spec);
    return res;
}

/*
 * wait_or_fail(buf, words_off, page_off, zero_bytes, t, n, deadline_ns, spin_ns[, state])
 *   -> 1: published >= t by the deadline
 *      2: this call claimed t at the deadline and published a failed page (the watchdog's claim)
 *      3: someone else holds the claim of t but had not published by the deadline
 *      4: claimed is behind t-1 (round t-1 still unclaimed: caller out of order), nothing done
 * The whole wait and the deadline claim run without the GIL, so a busy engine cannot make the
 * claim late. deadline_ns is CLOCK_MONOTONIC (time.monotonic_ns() in Python). With a spin state
 * (AdaptiveSpin.state) the spin is its state[0], learned after the wait, under the GIL.
 */
static PyObject *hf_wait_or_fail(PyObject *mod, PyObject *args) {
    Py_buffer b;
    Py_ssize_t words_off, page_off, zero_bytes;
    unsigned long long t;
    int n;
    long long deadline, spin_ns;
    Py_buffer st = {0};
    (void)mod;
    if (!PyArg_ParseTuple(args, "w*nnnO&iLL|w*", &b, &words_off, &page_off, &zero_bytes, conv_u64, &t, &n,
                          &deadline, &spin_ns, &st))
        return NULL;
    PyObject *res = NULL;
    if (t == 0) {
        PyErr_SetString(PyExc_ValueError, "rounds start at 1");
        goto done;
    }
    if (check_words(&b, words_off) < 0 || check_zero_bytes(zero_bytes) < 0 || check_range(&b, page_off, zero_bytes + 8, 64) < 0)
        goto done;
    if (st.buf != NULL && (check_spin_state(&st) < 0 ||
                           check_range(&b, words_off, (Py_ssize_t)(W_PUBLISHED_NS + 1) * WORD_STRIDE, 64) < 0))
        goto done;
    int64_t t0 = now_ns();
    if (st.buf != NULL)
        spin_ns = ((int64_t *)st.buf)[0];
    char *base = (char *)b.buf;
    _Atomic uint64_t *published = word_at(base, words_off + W_PUBLISHED * WORD_STRIDE);
    int out = 0;
    last_gil_wait_ns = 0;
    /* the reply is there already: answered with the GIL kept. Released for nothing, the GIL could go to
     * another thread of the engine, and the engine would wait to get it back (see read_page) */
    if (atomic_load_explicit(published, memory_order_acquire) >= (uint64_t)t)
        out = 1;
    for (; out == 0;) {
        /* the wait AND the deadline claim in one GIL-free stretch: a thread holding the GIL cannot
         * delay the claim (only this call's return) */
        int r;
        int64_t woke;
        Py_BEGIN_ALLOW_THREADS
        r = wait_ge_nogil(published, (uint64_t)t, (int64_t)deadline, (int64_t)spin_ns);
        if (r == WAIT_OK) {
            out = 1;
        } else if (r == WAIT_TIMEOUT) {
            int won = do_fail_round(base, words_off, page_off, zero_bytes, (uint64_t)t, (int32_t)n);
            if (won == 1)
                out = 2;
            else if (won == -1)
                out = 4;
            else /* lost the claim: published meanwhile, or a claimant is still copying (or hung) */
                out = atomic_load_explicit(published, memory_order_acquire) >= (uint64_t)t ? 1 : 3;
        }
        woke = now_ns();
        Py_END_ALLOW_THREADS
        last_gil_wait_ns = now_ns() - woke;
        if (r != WAIT_EINTR)
            break;
        if (PyErr_CheckSignals() < 0)
            goto done;
        spin_ns = 0;
    }
    if (st.buf != NULL) /* learned from publish's stamp: when the reply came, not when this wait woke */
        spin_learn((int64_t *)st.buf, came_ns(base, words_off + W_PUBLISHED_NS * WORD_STRIDE, t0, out == 1), out == 1);
    res = PyLong_FromLong(out);
done:
    PyBuffer_Release(&b);
    if (st.buf != NULL)
        PyBuffer_Release(&st);
    return res;
}

/*
 * raise_gathered(buf, words_off, gathered_ns_off, n_off, t, n): the engine's end of round t's gather,
 * in one call so no GIL hand-off can separate the stamp from the release: the round's start time
 * and request count, then gathered = t (release: pairs with the acquire in wait_gathered /
 * the watcher thread; the stamp and count are ordered before it), then wake.
 */
static PyObject *hf_raise_gathered(PyObject *mod, PyObject *args) {
    Py_buffer b;
    Py_ssize_t words_off, gns_off, n_off;
    unsigned long long t;
    int n;
    (void)mod;
    if (!PyArg_ParseTuple(args, "w*nnnO&i", &b, &words_off, &gns_off, &n_off, conv_u64, &t, &n))
        return NULL;
    PyObject *res = NULL;
    if (check_words(&b, words_off) < 0 || check_range(&b, gns_off, 16, 64) < 0 ||
        check_range(&b, n_off, 16, 64) < 0)
        goto done;
    char *base = (char *)b.buf;
    int64_t ns = now_ns();
    atomic_store_explicit(word_at(base, gns_off), (uint64_t)ns, memory_order_relaxed);
    atomic_store_explicit(word_at(base, n_off), (uint64_t)(uint32_t)n, memory_order_relaxed);
    store_release_wake(word_at(base, words_off + W_GATHERED * WORD_STRIDE), (uint64_t)t);
    res = PyLong_FromLongLong(ns);
done:
    PyBuffer_Release(&b);
    return res;
}

/* ------------------------------------------------------------------ plain words */

/* Parse (buf, off[, v1[, v2]]) with the word at off checked for range and 8-byte alignment. */
static int parse_word(PyObject *args, Py_buffer *b, Py_ssize_t *off, int nvals, unsigned long long *v1,
                      unsigned long long *v2, Py_ssize_t span) {
    int ok;
    if (nvals == 0)
        ok = PyArg_ParseTuple(args, "w*n", b, off);
    else if (nvals == 1)
        ok = PyArg_ParseTuple(args, "w*nO&", b, off, conv_u64, v1);
    else
        ok = PyArg_ParseTuple(args, "w*nO&O&", b, off, conv_u64, v1, conv_u64, v2);
    if (!ok)
        return -1;
    if (check_range(b, *off, span, 8) < 0) {
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* Bytes a word operation touches: the word alone, or the word with its sleepers count and wake
 * sequence (every store that may have sleepers: the hostflag words, each on its own line). */
#define SPAN_WORD 8
#define SPAN_WAKE 16

/* load(buf, off) -> int: acquire load (pairs with the writer's release store) */
static PyObject *hf_load(PyObject *mod, PyObject *args) {
    Py_buffer b;
    Py_ssize_t off;
    (void)mod;
    if (parse_word(args, &b, &off, 0, NULL, NULL, SPAN_WORD) < 0)
        return NULL;
    uint64_t v = atomic_load_explicit(word_at(b.buf, off), memory_order_acquire);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLongLong(v);
}

/* load_after(buf, off) -> int: acquire fence, then load: the seqlock reader's second look, after it
 * copied the data the word guards (pairs with begin_write's release fence) */
static PyObject *hf_load_after(PyObject *mod, PyObject *args) {
    Py_buffer b;
    Py_ssize_t off;
    (void)mod;
    if (parse_word(args, &b, &off, 0, NULL, NULL, SPAN_WORD) < 0)
        return NULL;
    atomic_thread_fence(memory_order_acquire);
    uint64_t v = atomic_load_explicit(word_at(b.buf, off), memory_order_relaxed);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLongLong(v);
}

/* store(buf, off, v): release store (pairs with the reader's acquire load), then wake sleepers */
static PyObject *hf_store(PyObject *mod, PyObject *args) {
    Py_buffer b;
    Py_ssize_t off;
    unsigned long long v;
    (void)mod;
    if (parse_word(args, &b, &off, 1, &v, NULL, SPAN_WAKE) < 0)
        return NULL;
    store_release_wake(word_at(b.buf, off), (uint64_t)v);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

/* store_release(buf, off, v): a release store and nothing else (the stamps of metadata and descriptor
 * slots: nobody sleeps on them, and the bytes after them are data) */
static PyObject *hf_store_release(PyObject *mod, PyObject *args) {
    Py_buffer b;
    Py_ssize_t off;
    unsigned long long v;
    (void)mod;
    if (parse_word(args, &b, &off, 1, &v, NULL, SPAN_WORD) < 0)
        return NULL;
    /* release: pairs with the reader's acquire load of the stamp (round/core.py _copy_stamped) */
    atomic_store_explicit(word_at(b.buf, off), (uint64_t)v, memory_order_release);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

/* begin_write(buf, off, v): the seqlock writer's first stamp: store, then a release fence so the
 * stamp is visible before any data written after this call (pairs with load_after) */
static PyObject *hf_begin_write(PyObject *mod, PyObject *args) {
    Py_buffer b;
    Py_ssize_t off;
    unsigned long long v;
    (void)mod;
    if (parse_word(args, &b, &off, 1, &v, NULL, SPAN_WORD) < 0)
        return NULL;
    atomic_store_explicit(word_at(b.buf, off), (uint64_t)v, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

/* cas(buf, off, expected, desired) -> bool (acq_rel on success) */
static PyObject *hf_cas(PyObject *mod, PyObject *args) {
    Py_buffer b;
    Py_ssize_t off;
    unsigned long long expected, desired;
    (void)mod;
    if (parse_word(args, &b, &off, 2, &expected, &desired, SPAN_WAKE) < 0)
        return NULL;
    uint64_t e = (uint64_t)expected;
    _Atomic uint64_t *w = word_at(b.buf, off);
    int ok = atomic_compare_exchange_strong_explicit(w, &e, (uint64_t)desired, memory_order_acq_rel,
                                                     memory_order_acquire);
    if (ok) {
        atomic_thread_fence(memory_order_seq_cst);
        wake_if_sleepers(w);
    }
    PyBuffer_Release(&b);
    return PyBool_FromLong(ok);
}

/* raise_to(buf, off, v) -> previous value: monotonic max (a word that must never move backwards) */
static PyObject *hf_raise_to(PyObject *mod, PyObject *args) {
    Py_buffer b;
    Py_ssize_t off;
    unsigned long long v;
    (void)mod;
    if (parse_word(args, &b, &off, 1, &v, NULL, SPAN_WAKE) < 0)
        return NULL;
    _Atomic uint64_t *w = word_at(b.buf, off);
    uint64_t before = raise_to(w, (uint64_t)v);
    if (before < (uint64_t)v) {
        atomic_thread_fence(memory_order_seq_cst);
        wake_if_sleepers(w);
    }
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLongLong(before);
}

/* wait_ge(buf, off, target, timeout_s, spin_ns) -> bool; timeout_s < 0 waits forever */
static PyObject *hf_wait_ge(PyObject *mod, PyObject *args) {
    Py_buffer b, st = {0};
    Py_ssize_t off, stamp_off = -1;
    unsigned long long target;
    double timeout_s;
    long long spin_ns;
    (void)mod;
    if (!PyArg_ParseTuple(args, "w*nO&dL|w*n", &b, &off, conv_u64, &target, &timeout_s, &spin_ns, &st, &stamp_off))
        return NULL;
    PyObject *res = NULL;
    if (check_timeout(timeout_s) < 0 || check_range(&b, off, 16, 64) < 0)
        goto done;
    if (st.buf != NULL && (check_spin_state(&st) < 0 || (stamp_off >= 0 && check_range(&b, stamp_off, 8, 8) < 0)))
        goto done;
    int64_t t0 = now_ns();
    if (st.buf != NULL)
        spin_ns = ((int64_t *)st.buf)[0];
    int r = wait_ge_signals(word_at(b.buf, off), (uint64_t)target, deadline_from_timeout(timeout_s),
                            (int64_t)spin_ns);
    if (r == -2)
        goto done;
    if (st.buf != NULL)
        spin_learn((int64_t *)st.buf, came_ns((char *)b.buf, stamp_off, t0, r == WAIT_OK), r == WAIT_OK);
    res = PyBool_FromLong(r == WAIT_OK);
done:
    PyBuffer_Release(&b);
    if (st.buf != NULL)
        PyBuffer_Release(&st);
    return res;
}

/* wake(buf, off): wake every sleeper on a word (after a store made by other means) */
static PyObject *hf_wake(PyObject *mod, PyObject *args) {
    Py_buffer b;
    Py_ssize_t off;
    (void)mod;
    if (parse_word(args, &b, &off, 0, NULL, NULL, SPAN_WAKE) < 0)
        return NULL;
    wake_if_sleepers(word_at(b.buf, off));
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ seqlock blocks */

/*
 * seq_write(buf, seq_off, data_off, src): one writer. seq odd while writing (rigtorp's Seqlock):
 * store seq+1, release fence, copy, release store seq+2. Readers never block the writer.
 */
static PyObject *hf_seq_write(PyObject *mod, PyObject *args) {
    Py_buffer b, src;
    Py_ssize_t seq_off, data_off;
    (void)mod;
    if (!PyArg_ParseTuple(args, "w*nny*", &b, &seq_off, &data_off, &src))
        return NULL;
    PyObject *res = NULL;
    if (check_range(&b, seq_off, 8, 8) < 0 || check_range(&b, data_off, src.len, 8) < 0)
        goto done;
    _Atomic uint64_t *seq = word_at(b.buf, seq_off);
    uint64_t s = atomic_load_explicit(seq, memory_order_relaxed);
    if (s & 1)
        s += 1; /* a writer died mid-write: start from the next even value */
    atomic_store_explicit(seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release); /* pairs with the reader's acquire fence */
    Py_BEGIN_ALLOW_THREADS
    memcpy((char *)b.buf + data_off, src.buf, (size_t)src.len);
    Py_END_ALLOW_THREADS
    atomic_store_explicit(seq, s + 2, memory_order_release); /* pairs with the reader's first acquire load */
    res = PyLong_FromUnsignedLongLong(s + 2);
done:
    PyBuffer_Release(&b);
    PyBuffer_Release(&src);
    return res;
}

/* seq_read(buf, seq_off, data_off, dst, tries) -> seq (even, > 0) of a consistent copy, or 0 when
 * no consistent copy was had in `tries` attempts (or nothing was ever written). */
static PyObject *hf_seq_read(PyObject *mod, PyObject *args) {
    Py_buffer b, dst;
    Py_ssize_t seq_off, data_off;
    int tries;
    (void)mod;
    if (!PyArg_ParseTuple(args, "w*nnw*i", &b, &seq_off, &data_off, &dst, &tries))
        return NULL;
    PyObject *res = NULL;
    if (check_range(&b, seq_off, 8, 8) < 0 || check_range(&b, data_off, dst.len, 8) < 0)
        goto done;
    _Atomic uint64_t *seq = word_at(b.buf, seq_off);
    uint64_t got = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < tries && got == 0; i++) {
        uint64_t s0 = atomic_load_explicit(seq, memory_order_acquire); /* pairs with seq_write's final store */
        if (s0 == 0)
            break;
        if (s0 & 1) {
            cpu_relax();
            continue;
        }
        memcpy(dst.buf, (char *)b.buf + data_off, (size_t)dst.len);
        atomic_thread_fence(memory_order_acquire); /* pairs with seq_write's release fence */
        if (atomic_load_explicit(seq, memory_order_relaxed) == s0)
            got = s0;
    }
    Py_END_ALLOW_THREADS
    res = PyLong_FromUnsignedLongLong(got);
done:
    PyBuffer_Release(&b);
    PyBuffer_Release(&dst);
    return res;
}

static PyObject *hf_monotonic_ns(PyObject *mod, PyObject *noargs) {
    (void)mod;
    (void)noargs;
    return PyLong_FromLongLong(now_ns());
}

/* ------------------------------------------------------------------ the watcher thread */

/*
 * Watcher: the watchdog's deadline claims on a thread of its own that never takes the GIL.
 *
 * A Python thread, however short its Python part, needs the GIL between two rounds; while engine
 * threads keep the GIL busy that costs a switch interval (5 ms) or more each time, and a deadline
 * that falls then is claimed late. This pthread loops entirely in C: find the next `gathered`, wait
 * for `published` until GATHERED_NS + delta, else claim and publish a failed page. What it did
 * goes into a small ring (under a mutex held for a few instructions, never across a wait) that the
 * Python watchdog drains for its events. It holds a buffer export of the segment, so the mapping
 * stays valid until stop() has joined it.
 *
 * While rounds come it never sleeps on the round words: a sleeper there makes every raise_gathered
 * (the engine's enqueue) and every publish (the proxy's round) pay a FUTEX_WAKE, 7-10 us each on this
 * project's VM, on the hand-off's critical path, twice a round. It naps on a word of its own instead:
 * every `poll` (half the deadline) while no round is in flight, so a round is seen at the latest half
 * its deadline after `gathered`, and until the round's deadline while one is. After WATCH_IDLE_NS
 * without a new round it sleeps on `gathered` again, in slices, so an idle engine costs nothing and
 * the first round after a pause pays the one wake. stop() wakes it from either sleep at once.
 */
#define WATCH_RING 64
#define WATCH_SLICE_NS 250000000LL /* idle: waits on `gathered` in slices (a bound on a missed wake; each slice is a wake of an idle engine) */
#define WATCH_IDLE_NS 100000000LL  /* no new round for this long: idle (above) */
#define WATCH_MIN_POLL_NS 200000LL /* the nap between looks for a new round: half the deadline, at least this */

typedef struct {
    uint64_t t;
    int32_t outcome;
    int32_t n;
    int64_t claim_ns;
    int64_t deadline_ns;
} watch_rec;

typedef struct {
    PyObject_HEAD
    Py_buffer buf;
    int has_buf;
    pthread_t thread;
    int started;
    int joined;
    _Atomic int stop;
    Py_ssize_t words_off, page_off, zero_bytes, gns_off, n_off;
    int64_t delta_ns;
    _Atomic uint64_t after; /* the last round seen through (published or claimed) */
    _Atomic uint32_t nap_seq; /* the futex word of its naps: bumped and woken only by stop() */
    pthread_mutex_t lock;   /* guards ring and head */
    uint64_t head;          /* records written so far */
    watch_rec ring[WATCH_RING];
} Watcher;

/* Sleep until `until` (CLOCK_MONOTONIC ns) or stop(), on nap_seq, which no round word's store wakes. The
 * sequence is read before stop (both seq_cst): a stop we miss here bumped the sequence after our load
 * (watcher_join), so the futex refuses to sleep (EAGAIN) or is woken. */
static void watcher_nap(Watcher *w, int64_t until) {
    for (;;) {
        uint32_t s0 = atomic_load_explicit(&w->nap_seq, memory_order_seq_cst);
        if (atomic_load_explicit(&w->stop, memory_order_seq_cst))
            return;
        int64_t left = until - now_ns();
        if (left <= 0)
            return;
        futex_wait32(&w->nap_seq, s0, left); /* woken, timed out, EAGAIN or spurious: look again */
    }
}

static void *watcher_main(void *arg) {
    Watcher *w = (Watcher *)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals belong to the interpreter's threads */
    char *base = (char *)w->buf.buf;
    _Atomic uint64_t *gathered = word_at(base, w->words_off + W_GATHERED * WORD_STRIDE);
    _Atomic uint64_t *published = word_at(base, w->words_off + W_PUBLISHED * WORD_STRIDE);
    int64_t poll = w->delta_ns / 2 > WATCH_MIN_POLL_NS ? w->delta_ns / 2 : WATCH_MIN_POLL_NS;
    int64_t last_round = now_ns(); /* when a new round was last seen: attached, rounds are about to come */
    while (!atomic_load_explicit(&w->stop, memory_order_acquire)) {
        uint64_t after = atomic_load_explicit(&w->after, memory_order_relaxed);
        /* acquire: pairs with raise_gathered's release; GATHERED_NS and ROUND_N precede it */
        uint64_t t = atomic_load_explicit(gathered, memory_order_acquire);
        if (t <= after) { /* no new round: a nap while rounds come, the futex on `gathered` once idle */
            int64_t now = now_ns();
            if (now - last_round >= WATCH_IDLE_NS)
                wait_ge_stoppable(gathered, after + 1, now + WATCH_SLICE_NS, 0, &w->stop);
            else
                watcher_nap(w, now + poll);
            continue;
        }
        last_round = now_ns();
        int64_t gns = (int64_t)atomic_load_explicit(word_at(base, w->gns_off), memory_order_relaxed);
        int32_t n = (int32_t)atomic_load_explicit(word_at(base, w->n_off), memory_order_relaxed);
        int64_t deadline = gns + w->delta_ns;
        int r = WAIT_TIMEOUT;
        for (;;) { /* published by its deadline? a look, then a nap to the deadline (not on `published`) */
            /* acquire: pairs with the publisher's release of published (its page copy precedes it) */
            if (atomic_load_explicit(published, memory_order_acquire) >= t) {
                r = WAIT_OK;
                break;
            }
            if (now_ns() >= deadline || atomic_load_explicit(&w->stop, memory_order_acquire))
                break;
            watcher_nap(w, deadline);
        }
        if (r != WAIT_OK && atomic_load_explicit(&w->stop, memory_order_acquire) && now_ns() < deadline)
            break; /* stopping: not this thread's round to fail any more */
        watch_rec rec = {t, 1, n, 0, deadline};
        if (r != WAIT_OK) {
            int won = do_fail_round(base, w->words_off, w->page_off, w->zero_bytes, t, n);
            if (won == 1) {
                rec.outcome = 2;
                rec.claim_ns = now_ns();
            } else {
                rec.outcome = won == -1 ? 4 : (atomic_load_explicit(published, memory_order_acquire) >= t ? 1 : 3);
            }
        }
        atomic_store_explicit(&w->after, t, memory_order_relaxed);
        if (rec.outcome != 1) {
            pthread_mutex_lock(&w->lock);
            w->ring[w->head % WATCH_RING] = rec;
            w->head++;
            pthread_mutex_unlock(&w->lock);
        }
    }
    return NULL;
}

static void watcher_join(Watcher *w) {
    if (!w->started || w->joined)
        return;
    /* seq_cst: pairs with the waiter's seq_cst load of stop after its sequence (wait_ge_stoppable,
     * watcher_nap) */
    atomic_store_explicit(&w->stop, 1, memory_order_seq_cst);
    /* seq_cst: after stop, pairs with watcher_nap's load of the sequence before its look at stop */
    atomic_fetch_add_explicit(&w->nap_seq, 1, memory_order_seq_cst);
    futex_wake_all(&w->nap_seq);
    char *base = (char *)w->buf.buf;
    /* wake it from either wait: the store of a word it may sleep on is not ours to make, a wake is */
    wake_if_sleepers(word_at(base, w->words_off + W_GATHERED * WORD_STRIDE));
    wake_if_sleepers(word_at(base, w->words_off + W_PUBLISHED * WORD_STRIDE));
    Py_BEGIN_ALLOW_THREADS
    pthread_join(w->thread, NULL);
    Py_END_ALLOW_THREADS
    w->joined = 1;
}

static int Watcher_init(Watcher *w, PyObject *args, PyObject *kwds) {
    unsigned long long after_t;
    long long delta_ns;
    (void)kwds;
    if (w->has_buf) {
        PyErr_SetString(PyExc_RuntimeError, "Watcher already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "w*nnnnnO&L", &w->buf, &w->words_off, &w->page_off, &w->zero_bytes,
                          &w->gns_off, &w->n_off, conv_u64, &after_t, &delta_ns))
        return -1;
    w->has_buf = 1;
    if (check_words(&w->buf, w->words_off) < 0 || check_zero_bytes(w->zero_bytes) < 0 ||
        check_range(&w->buf, w->page_off, w->zero_bytes + 8, 64) < 0 ||
        check_range(&w->buf, w->gns_off, 8, 8) < 0 || check_range(&w->buf, w->n_off, 8, 8) < 0)
        return -1;
    if (delta_ns < 0) {
        PyErr_SetString(PyExc_ValueError, "delta_ns must be >= 0");
        return -1;
    }
    w->delta_ns = delta_ns;
    atomic_store(&w->after, (uint64_t)after_t);
    return 0;
}

/*
 * start([cpus]): the thread begins on `cpus` (an iterable of CPU numbers; None: the creator's), set
 * as a pthread attribute so the creating thread itself never moves: a peer that reads the engine
 * thread's CPUs meanwhile (the proxy's spin decision, hostflag.py spin_useful) sees them as they are.
 * CPUs the process may not use (pthread_create's EINVAL): the creator's, as with none named.
 */
static PyObject *Watcher_start(Watcher *w, PyObject *args) {
    PyObject *cpus = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &cpus))
        return NULL;
    if (!w->has_buf) {
        PyErr_SetString(PyExc_RuntimeError, "Watcher not initialised");
        return NULL;
    }
    if (w->started) {
        PyErr_SetString(PyExc_RuntimeError, "Watcher already started");
        return NULL;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    int named = 0;
    if (cpus != Py_None) {
        PyObject *it = PyObject_GetIter(cpus);
        if (it == NULL)
            return NULL;
        PyObject *item;
        while ((item = PyIter_Next(it)) != NULL) {
            long c = PyLong_AsLong(item);
            Py_DECREF(item);
            if (c == -1 && PyErr_Occurred())
                break;
            if (c >= 0 && c < CPU_SETSIZE) { /* a CPU this machine cannot have: left out */
                CPU_SET((int)c, &set);
                named = 1;
            }
        }
        Py_DECREF(it);
        if (PyErr_Occurred())
            return NULL;
    }
    int err = EINVAL;
    if (named) {
        pthread_attr_t attr;
        if (pthread_attr_init(&attr) == 0) {
            if (pthread_attr_setaffinity_np(&attr, sizeof set, &set) == 0)
                err = pthread_create(&w->thread, &attr, watcher_main, w);
            pthread_attr_destroy(&attr);
        }
    }
    if (err == EINVAL) /* none named, or none the process may use */
        err = pthread_create(&w->thread, NULL, watcher_main, w);
    if (err != 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    w->started = 1;
    Py_RETURN_NONE;
}

static PyObject *Watcher_stop(Watcher *w, PyObject *noargs) {
    (void)noargs;
    watcher_join(w);
    Py_RETURN_NONE;
}

/* drain() -> [(t, outcome, n, claim_ns, deadline_ns), ...]: records since the last drain, oldest
 * first (at most the ring's 64; older ones are counted in `dropped`) */
static Py_ssize_t drain_locked(Watcher *w, watch_rec *got) {
    uint64_t head = w->head;
    uint64_t from = head > WATCH_RING ? head - WATCH_RING : 0;
    Py_ssize_t k = 0;
    for (uint64_t i = from; i < head; i++)
        got[k++] = w->ring[i % WATCH_RING];
    w->head = 0; /* the ring restarts; nothing is kept twice */
    return k;
}

static PyObject *Watcher_drain(Watcher *w, PyObject *noargs) {
    (void)noargs;
    watch_rec got[WATCH_RING];
    Py_ssize_t k;
    if (pthread_mutex_trylock(&w->lock) == 0) { /* the usual case: the GIL kept (see read_page) */
        k = drain_locked(w, got);
        pthread_mutex_unlock(&w->lock);
    } else {
        /* the watcher holds it: if the kernel preempted it there, a wait with the GIL held would keep
         * every Python thread of the engine, the engine's own included, waiting for a C thread */
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&w->lock);
        k = drain_locked(w, got);
        pthread_mutex_unlock(&w->lock);
        Py_END_ALLOW_THREADS
    }
    PyObject *list = PyList_New(k);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *item = Py_BuildValue("KiiLL", (unsigned long long)got[i].t, got[i].outcome, got[i].n,
                                       (long long)got[i].claim_ns, (long long)got[i].deadline_ns);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static PyObject *Watcher_get_after(Watcher *w, void *closure) {
    (void)closure;
    return PyLong_FromUnsignedLongLong(atomic_load(&w->after));
}

static PyObject *Watcher_get_running(Watcher *w, void *closure) {
    (void)closure;
    return PyBool_FromLong(w->started && !w->joined);
}

static PyObject *Watcher_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    (void)args;
    (void)kwds;
    Watcher *w = (Watcher *)type->tp_alloc(type, 0);
    if (w == NULL)
        return NULL;
    pthread_mutex_init(&w->lock, NULL);
    atomic_store(&w->stop, 0);
    return (PyObject *)w;
}

static void Watcher_dealloc(Watcher *w) {
    PyTypeObject *tp = Py_TYPE(w);
    watcher_join(w);
    if (w->has_buf)
        PyBuffer_Release(&w->buf);
    pthread_mutex_destroy(&w->lock);
    tp->tp_free((PyObject *)w);
    Py_DECREF(tp);
}

static PyMethodDef Watcher_methods[] = {
    {"start", (PyCFunction)Watcher_start, METH_VARARGS,
     "start([cpus]): start the watcher thread, on `cpus` (None: the creator's) without moving the creator."},
    {"stop", (PyCFunction)Watcher_stop, METH_NOARGS, "Stop and join it (idempotent; wakes its wait at once)."},
    {"drain", (PyCFunction)Watcher_drain, METH_NOARGS,
     "drain() -> [(t, outcome, n, claim_ns, deadline_ns)]: what it did since the last drain."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Watcher_getset[] = {
    {"after", (getter)Watcher_get_after, NULL, "The last round seen through.", NULL},
    {"running", (getter)Watcher_get_running, NULL, "Started and not stopped.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Watcher_slots[] = {
    {Py_tp_new, Watcher_new},
    {Py_tp_init, Watcher_init},
    {Py_tp_dealloc, Watcher_dealloc},
    {Py_tp_methods, Watcher_methods},
    {Py_tp_getset, Watcher_getset},
    {Py_tp_doc, "Watcher(buf, words_off, page_off, zero_bytes, gathered_ns_off, n_off, after_t, delta_ns): "
                "claims each round not published by its deadline, from a thread that never takes the GIL."},
    {0, NULL},
};

static PyType_Spec Watcher_spec = {
    .name = "dspark_proxy.shm._hostflag.Watcher",
    .basicsize = sizeof(Watcher),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Watcher_slots,
};

/* ------------------------------------------------------------------ module */

/* gil_wait_ns() -> int: this thread's last wait_or_fail, ns from the end of its wait to holding the GIL
 * again (0: it answered without releasing the GIL) */
static PyObject *hf_gil_wait_ns(PyObject *mod, PyObject *noargs) {
    (void)mod;
    (void)noargs;
    return PyLong_FromLongLong((long long)last_gil_wait_ns);
}

static PyMethodDef hf_methods[] = {
    {"gil_wait_ns", hf_gil_wait_ns, METH_NOARGS,
     "gil_wait_ns() -> int: this thread's last wait_or_fail's GIL reacquire, ns (0: the GIL was kept)."},
    {"load", hf_load, METH_VARARGS, "load(buf, off) -> int: acquire load of a 64-bit word."},
    {"load_after", hf_load_after, METH_VARARGS, "load_after(buf, off) -> int: acquire fence, then load."},
    {"store", hf_store, METH_VARARGS,
     "store(buf, off, v): release store, then wake sleepers (a hostflag word: 16 bytes at off are its)."},
    {"store_release", hf_store_release, METH_VARARGS, "store_release(buf, off, v): release store, no wake."},
    {"begin_write", hf_begin_write, METH_VARARGS, "begin_write(buf, off, v): store, then release fence."},
    {"cas", hf_cas, METH_VARARGS, "cas(buf, off, expected, desired) -> bool."},
    {"raise_to", hf_raise_to, METH_VARARGS, "raise_to(buf, off, v) -> previous: monotonic max."},
    {"wait_ge", hf_wait_ge, METH_VARARGS,
     "wait_ge(buf, off, target, timeout_s, spin_ns[, state, stamp_off]) -> bool: spin, then futex sleep, GIL "
     "released. With a spin state the spin is state[0], learned after the wait (from the stamp at stamp_off)."},
    {"spin_learn", hf_spin_learn, METH_VARARGS,
     "spin_learn(state, waited_ns, ok): the waits' spin rule alone (AdaptiveSpin.update is its reference)."},
    {"wake", hf_wake, METH_VARARGS, "wake(buf, off): wake every sleeper on the word."},
    {"publish", hf_publish, METH_VARARGS,
     "publish(buf, words_off, page_off, t, src[, rows]) -> 1 won / 0 lost / -1 out of order."},
    {"fail_round", hf_fail_round, METH_VARARGS,
     "fail_round(buf, words_off, page_off, zero_bytes, t, n) -> 1 won / 0 lost / -1 out of order."},
    {"fail_all", hf_fail_all, METH_VARARGS,
     "fail_all(buf, words_off, page_off, zero_bytes, T) -> bool: claim and release every round up to T."},
    {"read_page", hf_read_page, METH_VARARGS,
     "read_page(buf, words_off, page_off, t, dst[, rows, n]) -> 1 ok / 0 not this round's / -1 not published."},
    {"wait_or_fail", hf_wait_or_fail, METH_VARARGS,
     "wait_or_fail(buf, words_off, page_off, zero_bytes, t, n, deadline_ns, spin_ns[, state]) -> 1..4. With a "
     "spin state the spin is state[0], learned after the wait from PUBLISHED_NS."},
    {"raise_gathered", hf_raise_gathered, METH_VARARGS,
     "raise_gathered(buf, words_off, gathered_ns_off, n_off, t, n) -> gathered_ns: stamp, count, release."},
    {"seq_write", hf_seq_write, METH_VARARGS, "seq_write(buf, seq_off, data_off, src) -> new seq."},
    {"seq_read", hf_seq_read, METH_VARARGS, "seq_read(buf, seq_off, data_off, dst, tries) -> seq or 0."},
    {"monotonic_ns", hf_monotonic_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns (the clock deadlines use)."},
    {NULL, NULL, 0, NULL},
};

static int hf_exec(PyObject *m) {
    PyObject *watcher = PyType_FromModuleAndSpec(m, &Watcher_spec, NULL);
    if (watcher == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(m, "Watcher", watcher);
    Py_DECREF(watcher);
    if (rc < 0)
        return -1;
    if (PyModule_AddIntConstant(m, "WORD_STRIDE", WORD_STRIDE) < 0 ||
        PyModule_AddIntConstant(m, "GATHERED", W_GATHERED) < 0 ||
        PyModule_AddIntConstant(m, "CLAIMED", W_CLAIMED) < 0 ||
        PyModule_AddIntConstant(m, "PUBLISHED", W_PUBLISHED) < 0 ||
        PyModule_AddIntConstant(m, "CONSUMED", W_CONSUMED) < 0 ||
        PyModule_AddIntConstant(m, "PUBLISHED_NS", W_PUBLISHED_NS) < 0 ||
        PyModule_AddIntConstant(m, "N_ROUND_WORDS", N_ROUND_WORDS) < 0 ||
        PyModule_AddIntConstant(m, "ROUND_FAILED", ROUND_FAILED) < 0 ||
        PyModule_AddIntConstant(m, "SLEEPERS_OFF", SLEEPERS_OFF) < 0 ||
        PyModule_AddIntConstant(m, "WAKESEQ_OFF", WAKESEQ_OFF) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot hf_slots[] = {
    {Py_mod_exec, hf_exec},
    {0, NULL},
};

static struct PyModuleDef hf_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dspark_proxy.shm._hostflag",
    .m_doc = "Hostflag atomics, futex waits and the claim-copy-release publish (see shm_layout.md).",
    .m_size = 0,
    .m_methods = hf_methods,
    .m_slots = hf_slots,
};

PyMODINIT_FUNC PyInit__hostflag(void) {
    return PyModuleDef_Init(&hf_module);
}
