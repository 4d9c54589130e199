/* _headmm_par.h: what _headmm_par.c exports: the helper threads. hm_par runs fn(ctx, i) for i in [0, n),
 * each i exactly once, on the calling thread and whichever helpers join in time; the products split
 * into such chunks. */
#ifndef DSPARK_HEADMM_PAR_H
#define DSPARK_HEADMM_PAR_H

#include "_headmm_common.h"

#define HM_MAX_THREADS 8 /* model/headmm.py MAX_THREADS */
typedef void (*hm_chunk_fn)(void *ctx, Py_ssize_t i);
HM_LOCAL void hm_par(Py_ssize_t n, hm_chunk_fn fn, void *ctx);
/* hm_par for work of `macs` multiply-adds in n chunks: on the calling thread alone below the cutoff */
HM_LOCAL void hm_par_big(Py_ssize_t n, long long macs, hm_chunk_fn fn, void *ctx);
HM_LOCAL int hm_threads(void);
HM_LOCAL void hm_set_threads(int n);
HM_LOCAL void hm_stats(long out[4]);
HM_LOCAL void hm_tune(long *par_min, long *chunk, int *adapt); /* each set where >= 0 / >= 1 / >= 0; old back */
/* out = x @ w (mm_block's order), in chunks across the threads where large enough */
HM_LOCAL void mm_par(const float *x, const float *wp, float *out, Py_ssize_t R, Py_ssize_t K, Py_ssize_t M);
/* top1_rows, a row a chunk where large enough */
HM_LOCAL void top1_par(const float *l, Py_ssize_t B, Py_ssize_t V, long long *c_out, float *cm);

#endif
