/* _headmm_step.h: what _headmm_step.c exports: one draft position (`step`) and the greedy drafts of
 * every position (`greedy`), as the module's methods */
#ifndef DSPARK_HEADMM_STEP_H
#define DSPARK_HEADMM_STEP_H

#include "_headmm_common.h"

HM_LOCAL PyObject *hm_step(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);
HM_LOCAL PyObject *hm_greedy(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

#endif
