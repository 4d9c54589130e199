/*
 * _keepawake.c: keep the proxy's CPUs out of their idle state while rounds flow (proxy
 * `--keep-awake-ms`, docs/performance.md, "Keeping the proxy's CPUs awake").
 *
 * Between two of an engine's rounds the proxy's CPU has nothing to do and idles. Waking an idle CPU
 * costs: on a VM with guest halt polling off, a futex wake to a halted vCPU took ~130 us here against
 * ~15 us to a busy one, and the round then runs on cold caches. One thread per CPU the proxy may use
 * spins there at SCHED_IDLE priority (it runs only when nothing else wants that CPU, and any other task
 * that wakes preempts it at once) until `until_ns`, then sleeps on a futex until the next kick. So the
 * spin costs no other task any CPU time, only power, and only while rounds keep coming: a proxy with
 * no rounds for keep_awake_ms spins no more (the idle cost is unchanged).
 *
 * Concurrency (all in this process; nothing here is in shared memory):
 *   until_ns  kick() raises it (relaxed store; a late read only shortens one spin); spinners read it.
 *   gen       kick() increments it (release) after raising until_ns, then FUTEX_WAKE if any spinner
 *             sleeps; a spinner reads gen (acquire) before checking until_ns and sleeps with
 *             FUTEX_WAIT(gen, seen): a kick between its check and its sleep changes gen and the
 *             wait returns at once (the futex's own check).
 *   sleepers  spinners count themselves in (seq_cst) before FUTEX_WAIT and out after; kick() reads
 *             it (seq_cst) after its gen increment, so either it sees the sleeper or the sleeper sees
 *             the new gen.
 *   stop      stop() sets it (release), bumps gen and wakes everyone; spinners check it (acquire)
 *             at every turn and exit; stop() joins them.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_SPINNERS 8

static _Atomic int64_t until_ns;
static _Atomic uint32_t gen;
static _Atomic int sleepers;
static _Atomic int stop_flag;
static pthread_t threads[MAX_SPINNERS];
static int cpus_of[MAX_SPINNERS];
static int n_threads;
static _Atomic int64_t spins_total; /* spin turns begun: tests and `status` see that it ran */
static _Atomic int refused;         /* spinners that could not take SCHED_IDLE, and so never spun */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *spinner(void *arg) {
    int cpu = (int)(intptr_t)arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set); /* best effort: else where it runs */
    struct sched_param sp = {0};
    /* this thread only (Linux: 0 is the calling thread); refused (a seccomp'd container), it would spin
     * at normal priority, taking time from the proxy and the worker: it does nothing instead */
    if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0) {
        atomic_fetch_add(&refused, 1);
        return NULL;
    }
    while (!atomic_load_explicit(&stop_flag, memory_order_acquire)) {
        uint32_t seen = atomic_load_explicit(&gen, memory_order_acquire); /* pairs with kick's release */
        int64_t end = atomic_load_explicit(&until_ns, memory_order_relaxed);
        if (now_ns() < end) {
            atomic_fetch_add_explicit(&spins_total, 1, memory_order_relaxed);
            int i = 0;
            while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
                cpu_relax();
                if ((++i & 255) == 0 && now_ns() >= atomic_load_explicit(&until_ns, memory_order_relaxed))
                    break;
            }
            continue;
        }
        atomic_fetch_add(&sleepers, 1); /* seq_cst: pairs with kick's read of sleepers */
        if (atomic_load_explicit(&gen, memory_order_acquire) == seen &&
            !atomic_load_explicit(&stop_flag, memory_order_acquire))
            syscall(SYS_futex, (uint32_t *)&gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
        atomic_fetch_sub(&sleepers, 1);
    }
    return NULL;
}

/* start(cpus) -> int: one spinner per CPU listed (at most MAX_SPINNERS); the number started. Starting
 * again while running is a no-op returning the number running. */
static PyObject *ka_start(PyObject *mod, PyObject *args) {
    PyObject *seq;
    (void)mod;
    if (!PyArg_ParseTuple(args, "O", &seq))
        return NULL;
    if (n_threads)
        return PyLong_FromLong(n_threads);
    PyObject *fast = PySequence_Fast(seq, "start: a sequence of CPU numbers");
    if (!fast)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > MAX_SPINNERS)
        n = MAX_SPINNERS;
    for (Py_ssize_t i = 0; i < n; i++) {
        long c = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (c < 0 || c >= CPU_SETSIZE) {
            Py_DECREF(fast);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "start: CPU %ld out of range", c);
            return NULL;
        }
        cpus_of[i] = (int)c;
    }
    Py_DECREF(fast);
    atomic_store(&stop_flag, 0);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pthread_create(&threads[n_threads], NULL, spinner, (void *)(intptr_t)cpus_of[i]) != 0)
            break;
        n_threads++;
    }
    return PyLong_FromLong(n_threads);
}

/* kick(ns): spin (where a spinner runs) until ns from now, or longer if already asked. */
static PyObject *ka_kick(PyObject *mod, PyObject *args) {
    long long ns;
    (void)mod;
    if (!PyArg_ParseTuple(args, "L", &ns))
        return NULL;
    int64_t end = now_ns() + ns;
    if (end > atomic_load_explicit(&until_ns, memory_order_relaxed))
        atomic_store_explicit(&until_ns, end, memory_order_relaxed);
    atomic_fetch_add_explicit(&gen, 1, memory_order_release); /* pairs with the spinner's acquire of gen */
    if (atomic_load(&sleepers) > 0)                            /* seq_cst: pairs with the spinner's count */
        syscall(SYS_futex, (uint32_t *)&gen, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
    Py_RETURN_NONE;
}

/* stop(): every spinner told to exit (release, paired with their acquire of stop_flag) and joined. */
static PyObject *ka_stop(PyObject *mod, PyObject *noargs) {
    (void)mod;
    (void)noargs;
    if (!n_threads)
        Py_RETURN_NONE;
    atomic_store_explicit(&stop_flag, 1, memory_order_release);
    atomic_fetch_add_explicit(&gen, 1, memory_order_release);
    syscall(SYS_futex, (uint32_t *)&gen, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < n_threads; i++)
        pthread_join(threads[i], NULL);
    Py_END_ALLOW_THREADS
    n_threads = 0;
    atomic_store(&refused, 0);
    atomic_store(&until_ns, 0);
    Py_RETURN_NONE;
}

/* state() -> (spinners running, spin turns begun so far, sleepers now, spinners refused SCHED_IDLE) */
static PyObject *ka_state(PyObject *mod, PyObject *noargs) {
    (void)mod;
    (void)noargs;
    int r = atomic_load(&refused);
    return Py_BuildValue("iLii", n_threads - r, (long long)atomic_load(&spins_total), atomic_load(&sleepers), r);
}

static PyMethodDef methods[] = {
    {"start", ka_start, METH_VARARGS, "start(cpus) -> int: a SCHED_IDLE spinner on each CPU (at most 8)."},
    {"kick", ka_kick, METH_VARARGS, "kick(ns): keep the spinners spinning until ns from now."},
    {"stop", ka_stop, METH_NOARGS, "stop(): the spinners exit and are joined."},
    {"state", ka_state, METH_NOARGS, "state() -> (spinners, spin turns begun, sleeping now, refused SCHED_IDLE)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_keepawake",
                                    "SCHED_IDLE spinners that keep the proxy's CPUs awake while rounds flow.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__keepawake(void) { return PyModule_Create(&moddef); }
