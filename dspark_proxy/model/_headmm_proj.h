/* _headmm_proj.h: what _headmm_proj.c exports: a STEP's bfloat16 rows to their projections
 * (`project_bf16`), as the module's method */
#ifndef DSPARK_HEADMM_PROJ_H
#define DSPARK_HEADMM_PROJ_H

#include "_headmm_common.h"

HM_LOCAL PyObject *hm_project_bf16(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

#endif
