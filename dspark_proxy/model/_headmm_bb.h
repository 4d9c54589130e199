/* _headmm_bb.h: what _headmm_bb.c exports: the backbone, window to ctx (`backbone`), as the module's
 * method */
#ifndef DSPARK_HEADMM_BB_H
#define DSPARK_HEADMM_BB_H

#include "_headmm_common.h"

HM_LOCAL PyObject *hm_backbone(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

#endif
