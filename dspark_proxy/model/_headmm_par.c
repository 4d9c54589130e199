/*
 * _headmm_par.c: the product kernel's helper threads (mm_par: _headmm_mm.c's mm_block in chunks).
 * While the worker drafts, the engine and the proxy wait, so on a 2-core machine one core is idle for
 * the head's whole time; a product (or a top-1 over several rows) splits into chunks that the calling
 * thread and the helpers claim one at a time from a shared counter.
 *
 * Why claiming rather than a fixed split: the caller never waits for a helper to wake up. It starts on
 * the chunks itself, and a helper that the kernel schedules late finds none left; the caller waits
 * only for chunks a helper has claimed (one chunk's time, a few µs). Each chunk is computed whole by
 * one thread with the same code (each output element summed in its one fixed order), so the bytes are
 * those of one thread whoever took which chunk (tests/test_headmm_threads.py compares 1 and 2).
 *
 * On a machine where the other core is busy (measured on the dev VM: its second vCPU gave a process
 * 35-50% of a core; products on two threads 1.1-1.9x slower than on one), a helper costs more than it
 * brings: it spins on the caller's core, or the caller waits while a preempted helper holds a chunk.
 * So: a helper spins HM_SPIN_NS after its
 * last chunk (the next product of a round follows within µs), but not on the caller's core (it sleeps
 * at once there); the caller waits for a helper's chunk by spinning up to HM_WAIT_SPIN_NS, then
 * sleeping (the helper may need its core); and a wait longer than HM_SLOW_NS (a helper was
 * preempted) runs every product alone for a while (HM_SOLO_NS, doubling while it recurs, up to
 * HM_SOLO_MAX_NS), after which a product tries the helpers again. Whether two threads pay at all is
 * the worker's measured choice a round (model/head_threads.py).
 *
 * Helpers start on the first product that wants them and hold no Python state (no GIL). One product
 * at a time uses them: a second caller meanwhile (another Python thread with the GIL released) runs
 * its product alone. After fork the child has no helpers: they start again there.
 */
#include "_headmm_par.h"
#include "_headmm_fn.h"
#include "_headmm_mm.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#define HM_PAR_MIN 131072      /* multiply-adds below which a product stays on one thread (measured) */
#define HM_SPIN_NS 10000        /* a helper's spin after its last chunk */
#define HM_WAIT_SPIN_NS 50000   /* the caller's spin for a helper's last chunk before it sleeps (measured:
                                 * at 4 µs a 3.4 µs product took 14 µs, the sleep and wake-up costing more
                                 * than a helper's slow first chunk) */
#define HM_SLOW_NS 50000        /* a wait this long: a helper was preempted */
#define HM_SOLO_NS 20000000LL   /* ... then products run alone this long, doubling while it recurs */
#define HM_SOLO_MAX_NS 2000000000LL

/* a product goes parallel from `par_min` multiply-adds, in chunks of about `chunk` (hm_tune: tests
 * force tiny chunks to put every tile shape across a chunk boundary; benchmarks find the cutoff) */
static atomic_long par_min = HM_PAR_MIN, chunk_macs = 65536;
static atomic_int adapt = 1; /* 0: never a solo spell (tests: every product shared) */

void hm_tune(long *pmin, long *chunk, int *adapt_) {
    long a = *pmin, c = *chunk;
    int s = *adapt_;
    *pmin = atomic_load(&par_min), *chunk = atomic_load(&chunk_macs), *adapt_ = atomic_load(&adapt);
    if (a >= 0)
        atomic_store(&par_min, a);
    if (c >= 1)
        atomic_store(&chunk_macs, c);
    if (s >= 0)
        atomic_store(&adapt, s != 0);
}

static struct {
    pthread_mutex_t mu; /* guards the sleep and the start of helpers */
    pthread_cond_t cv;
    pthread_mutex_t run; /* held by the one caller whose product the helpers serve */
    atomic_int want;     /* threads a product may use */
    int started;         /* helpers running */
    atomic_ulong gen;    /* a new job's number: helpers wait for it to change */
    atomic_ulong closed; /* the last job whose chunks were all claimed */
    atomic_int active;   /* helpers inside a job */
    atomic_int sleepers;
    atomic_long helped;      /* chunks the helpers ran in the current job */
    atomic_int waiting;      /* the caller sleeps until active is 0 */
    atomic_int caller_cpu;   /* the caller's core at the last job */
    atomic_llong solo_until; /* products run alone until then (now_ns) */
    long long solo_ns;       /* the next such spell (under `run`) */
    pthread_cond_t done;
    /* the job, written before gen moves on, read only by helpers inside it (active) */
    hm_chunk_fn fn;
    void *ctx;
    Py_ssize_t n;
    atomic_long next; /* the next chunk to claim */
} P = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, 1, 0, 0, 0, 0, 0,
       0, 0, -1, 0, HM_SOLO_NS, PTHREAD_COND_INITIALIZER, NULL, NULL, 0, 0};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* claim and run chunks of the current job until none is left; how many it ran */
static Py_ssize_t drain(hm_chunk_fn fn, void *ctx, Py_ssize_t n) {
    for (Py_ssize_t done = 0;; done++) {
        Py_ssize_t i = atomic_fetch_add(&P.next, 1);
        if (i >= n)
            return done;
        fn(ctx, i);
    }
}

/* what the helpers did (hm_stats): jobs shared, jobs run alone in a solo spell, chunks the helpers ran,
 * solo spells begun */
static atomic_long st_shared, st_solo, st_helped, st_spells;

void hm_stats(long out[4]) {
    out[0] = atomic_load(&st_shared), out[1] = atomic_load(&st_solo);
    out[2] = atomic_load(&st_helped), out[3] = atomic_load(&st_spells);
}

/* products run alone until `until` (later spells only extend it) */
static void go_solo(long long until) {
    if (!atomic_load(&adapt))
        return;
    long long cur = atomic_load(&P.solo_until);
    while (cur < until && !atomic_compare_exchange_weak(&P.solo_until, &cur, until))
        ;
    atomic_fetch_add(&st_spells, 1);
}

static void *helper(void *arg) {
    const int id = (int)(Py_ssize_t)arg; /* 1 .. HM_MAX_THREADS - 1 */
    unsigned long seen = atomic_load(&P.gen);
    for (;;) {
        long long t0 = now_ns(), last = t0, t;
        unsigned spins = 0;
        unsigned long g;
        while ((g = atomic_load(&P.gen)) == seen) { /* spin a while (not on the caller's core), then sleep */
            cpu_relax();
            if ((++spins & 63) != 0)
                continue;
            t = now_ns();
            long long gap = t - last;
            last = t;
            if (gap > HM_SLOW_NS) /* preempted while spinning: the cores are taken */
                go_solo(t + HM_SOLO_NS);
            if (t - t0 > HM_SPIN_NS || gap > HM_SLOW_NS || sched_getcpu() == atomic_load(&P.caller_cpu)) {
                pthread_mutex_lock(&P.mu);
                atomic_fetch_add(&P.sleepers, 1);
                while ((g = atomic_load(&P.gen)) == seen)
                    pthread_cond_wait(&P.cv, &P.mu);
                atomic_fetch_sub(&P.sleepers, 1);
                pthread_mutex_unlock(&P.mu);
                break;
            }
        }
        seen = g;
        if (id >= atomic_load(&P.want))
            continue; /* the count was lowered: this helper sits out */
        atomic_fetch_add(&P.active, 1);
        /* joined before the caller closed job g (it then waits for us) or after (we back out): the
         * caller's store of `closed` and its load of `active` are ordered against our add and load */
        if (atomic_load(&P.gen) == g && atomic_load(&P.closed) != g)
            atomic_fetch_add(&P.helped, drain(P.fn, P.ctx, P.n));
        if (atomic_fetch_sub(&P.active, 1) == 1 && atomic_load(&P.waiting)) { /* the caller sleeps: wake it */
            pthread_mutex_lock(&P.mu);
            pthread_cond_broadcast(&P.done);
            pthread_mutex_unlock(&P.mu);
        }
    }
    return NULL;
}

static void after_fork_child(void) {
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.cv, NULL);
    pthread_cond_init(&P.done, NULL);
    pthread_mutex_init(&P.run, NULL);
    P.started = 0;
    atomic_store(&P.active, 0);
    atomic_store(&P.sleepers, 0);
    atomic_store(&P.waiting, 0);
}

/* start helpers up to want - 1; 0 when at least one runs */
static int ensure_helpers(int want) {
    static int atfork = 0;
    if (P.started >= want - 1)
        return 0;
    pthread_mutex_lock(&P.mu);
    if (!atfork)
        atfork = pthread_atfork(NULL, NULL, after_fork_child) == 0;
    while (P.started < want - 1) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&a, 256 * 1024);
        int rc = pthread_create(&t, &a, helper, (void *)(Py_ssize_t)(P.started + 1));
        pthread_attr_destroy(&a);
        if (rc != 0)
            break;
        P.started++;
    }
    int ok = P.started > 0 ? 0 : -1;
    pthread_mutex_unlock(&P.mu);
    return ok;
}

int hm_threads(void) { return atomic_load(&P.want); }

void hm_set_threads(int n) { atomic_store(&P.want, n < 1 ? 1 : n > HM_MAX_THREADS ? HM_MAX_THREADS : n); }

void hm_par(Py_ssize_t n, hm_chunk_fn fn, void *ctx) {
    int want = atomic_load(&P.want), solo = 0;
    if (want <= 1 || n <= 1 || (solo = atomic_load(&adapt) && now_ns() < atomic_load(&P.solo_until)) ||
        pthread_mutex_trylock(&P.run) != 0) {
        if (solo)
            atomic_fetch_add(&st_solo, 1);
        for (Py_ssize_t i = 0; i < n; i++)
            fn(ctx, i);
        return;
    }
    if (ensure_helpers(want) < 0) {
        pthread_mutex_unlock(&P.run);
        for (Py_ssize_t i = 0; i < n; i++)
            fn(ctx, i);
        return;
    }
    P.fn = fn, P.ctx = ctx, P.n = n;
    atomic_store(&P.next, 0);
    atomic_store(&P.helped, 0);
    atomic_store(&P.caller_cpu, sched_getcpu());
    unsigned long g = atomic_fetch_add(&P.gen, 1) + 1;
    int asleep = atomic_load(&P.sleepers), awake = asleep < P.started; /* one spinning joins at once */
    if (asleep > 0) {
        pthread_mutex_lock(&P.mu);
        pthread_cond_broadcast(&P.cv);
        pthread_mutex_unlock(&P.mu);
    }
    drain(fn, ctx, n);
    atomic_store(&P.closed, g);
    long long t0 = now_ns(), t = t0;
    for (unsigned spins = 0; atomic_load(&P.active) != 0; spins++) { /* a helper's last chunk */
        cpu_relax();
        if ((spins & 63) == 63 && (t = now_ns()) - t0 > HM_WAIT_SPIN_NS) {
            pthread_mutex_lock(&P.mu); /* sleep: the helper may need this core */
            atomic_store(&P.waiting, 1);
            while (atomic_load(&P.active) != 0)
                pthread_cond_wait(&P.done, &P.mu);
            atomic_store(&P.waiting, 0);
            pthread_mutex_unlock(&P.mu);
            t = now_ns();
            break;
        }
    }
    /* a helper preempted mid-chunk, or awake and yet no chunk taken of many: its core is busy */
    atomic_fetch_add(&st_shared, 1);
    atomic_fetch_add(&st_helped, atomic_load(&P.helped));
    if (t - t0 > HM_SLOW_NS || (awake && n >= 8 && atomic_load(&P.helped) == 0)) {
        go_solo(t + P.solo_ns);
        P.solo_ns = 2 * P.solo_ns < HM_SOLO_MAX_NS ? 2 * P.solo_ns : HM_SOLO_MAX_NS;
    } else
        P.solo_ns = HM_SOLO_NS;
    pthread_mutex_unlock(&P.run);
}

void hm_par_big(Py_ssize_t n, long long macs, hm_chunk_fn fn, void *ctx) {
    if (n < 2 || atomic_load(&P.want) <= 1 || macs < atomic_load(&par_min)) {
        for (Py_ssize_t i = 0; i < n; i++)
            fn(ctx, i);
        return;
    }
    hm_par(n, fn, ctx);
}

/* -- the products in chunks ------------------------------------------------------------------------- */

typedef struct {
    const float *x, *wp;
    float *out;
    Py_ssize_t R, K, M, nb, rows, panels, groups;
} mm_job;

static void mm_chunk(void *arg, Py_ssize_t i) {
    const mm_job *j = arg;
    Py_ssize_t r0 = (i / j->groups) * j->rows, b0 = (i % j->groups) * j->panels;
    Py_ssize_t nr = j->R - r0 < j->rows ? j->R - r0 : j->rows, b1 = b0 + j->panels < j->nb ? b0 + j->panels : j->nb;
    mm_block(j->x + r0 * j->K, j->wp, j->out + r0 * j->M, nr, j->K, j->M, b0, b1);
}

/* out = x @ w for x [R, K], w in panels: alone under HM_PAR_MIN multiply-adds, else in chunks of up to
 * 8 rows x enough panels for `chunk_macs` (64K multiply-adds, about a µs: many chunks a thread, so the
 * last one claimed ends soon after the others) */
void mm_par(const float *x, const float *wp, float *out, Py_ssize_t R, Py_ssize_t K, Py_ssize_t M) {
    const Py_ssize_t nb = (M + PW - 1) / PW;
    if (R <= 0)
        return;
    if (atomic_load(&P.want) <= 1 || R * K * M < atomic_load(&par_min)) {
        mm_block(x, wp, out, R, K, M, 0, nb);
        return;
    }
    mm_job j = {x, wp, out, R, K, M, nb, R < 8 ? R : 8, 1, 1};
    Py_ssize_t per_panel = j.rows * K * PW;
    const long cm = atomic_load(&chunk_macs);
    j.panels = cm / per_panel > 1 ? cm / per_panel : 1;
    if (j.rows == 1 && j.panels >= 4)
        j.panels -= j.panels % 4; /* one row goes 4 panels at a time */
    if (j.panels > nb)
        j.panels = nb;
    j.groups = (nb + j.panels - 1) / j.panels;
    hm_par(j.groups * ((R + j.rows - 1) / j.rows), mm_chunk, &j);
}

typedef struct {
    const float *l;
    Py_ssize_t V;
    long long *c;
    float *cm;
} top1_job;

static void top1_chunk(void *arg, Py_ssize_t i) {
    const top1_job *j = arg;
    top1_rows(j->l + i * j->V, 1, j->V, j->c + i, j->cm + 2 * i);
}

/* top1_rows, a row a chunk once the rows hold par_min / 16 logits (its exp costs ~16 multiply-adds) */
void top1_par(const float *l, Py_ssize_t B, Py_ssize_t V, long long *c_out, float *cm) {
    if (B < 2 || atomic_load(&P.want) <= 1 || B * V * 16 < atomic_load(&par_min)) {
        top1_rows(l, B, V, c_out, cm);
        return;
    }
    top1_job j = {l, V, c_out, cm};
    hm_par(B, top1_chunk, &j);
}
