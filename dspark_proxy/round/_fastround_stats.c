/*
 * _fastround_stats.c: a round's latency observations into a group of histograms in one call.
 *
 * The proxy's round observes the same few latencies every round (stats.py, `HistGroup`); at n = 1 each
 * Python `Stats.observe` cost about 0.5 us, six of them a round. `hist_observe` records them all in one
 * call, with the very arithmetic of the reference (`HistGroup.observe_ref`, which is `Stats.observe`'s):
 * the bucket from frexp and two integer operations, the value clamped at both ends, NaN and negatives
 * counted as 0, the exact sum, min and max. tests/test_stats_group.py holds both to the same counts.
 */
#include "_fastround_shared.h"

#include <math.h>

/* stats.py's bucket constants: 64 sub-buckets per octave, octaves 2**-4 .. 2**27 us */
#define SUB 64
#define E_MIN (-3)
#define E_MAX 27
#define N_BUCKETS ((E_MAX - E_MIN + 1) * SUB)
#define OFFSET (-E_MIN * SUB - SUB)

/* hist_observe(held, keys, v0, v1, ...): for each i, value v_i into histogram keys[i] (a tuple of row
 * indices); held: a Held of counts (int64, K x N_BUCKETS), sums, mins, maxs (float64, K). */
PyObject *fr_hist_observe(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs < 2 || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != nargs - 2) {
        PyErr_SetString(PyExc_TypeError, "hist_observe(held, keys, *values): one value per key");
        return NULL;
    }
    PyObject *keys = args[1];
    Py_ssize_t n = nargs - 2;
    Py_ssize_t K = held_items(args[0], 1);
    int64_t *counts = held_get(args[0], 0, 8, K * N_BUCKETS, "hist_observe counts");
    double *sums = counts ? held_get(args[0], 1, 8, K, "hist_observe sums") : NULL;
    double *mins = sums ? held_get(args[0], 2, 8, K, "hist_observe mins") : NULL;
    double *maxs = mins ? held_get(args[0], 3, 8, K, "hist_observe maxs") : NULL;
    if (!maxs)
        return NULL;
    /* every argument checked before anything is written: a bad call records nothing */
    Py_ssize_t at[8];
    double val[8];
    if (n > 8) {
        PyErr_SetString(PyExc_ValueError, "hist_observe: at most 8 values a call");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        at[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(keys, i));
        if (at[i] == -1 && PyErr_Occurred())
            return NULL;
        if (at[i] < 0 || at[i] >= K) {
            PyErr_Format(PyExc_IndexError, "hist_observe: key %zd outside the group's %zd", at[i], K);
            return NULL;
        }
        val[i] = PyFloat_AsDouble(args[i + 2]);
        if (val[i] == -1.0 && PyErr_Occurred())
            return NULL;
    }
    const double lo = ldexp(1.0, E_MIN - 1), hi = ldexp(1.0, E_MAX);
    for (Py_ssize_t i = 0; i < n; i++) {
        double v = val[i];
        int64_t *c = counts + at[i] * N_BUCKETS;
        if (lo < v && v < hi) {
            int e;
            double m = frexp(v, &e);
            c[e * SUB + (int)(m * (2 * SUB)) + OFFSET] += 1;
        } else if (v >= hi) {
            v = hi;
            c[N_BUCKETS - 1] += 1;
        } else {
            if (!(v > 0.0))
                v = 0.0;
            c[0] += 1;
        }
        sums[at[i]] += v;
        if (v > maxs[at[i]])
            maxs[at[i]] = v;
        if (v < mins[at[i]])
            mins[at[i]] = v;
    }
    Py_RETURN_NONE;
}
