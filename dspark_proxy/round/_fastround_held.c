/*
 * _fastround_held.c: `Held`, arrays whose buffers are taken once rather than at every call.
 *
 * Acquiring a numpy array's buffer costs about 0.1 us (its cached format and shape looked up, then
 * released); the proxy's round passed some 55 a round, most of them the same long-lived arrays every time
 * (a ring model's tables, a reader's private copies and scratch). A `Held` takes them when its owner
 * first needs them and keeps them until it goes: each export holds a reference to its array, so the
 * memory a pointer here names lives as long as the Held. The arrays must be neither resized nor
 * replaced by their owners meanwhile (none is: each is made once, in its owner's __init__, and written
 * in place). Each function that takes a Held still checks every item size and length it relies on, per
 * call (integer compares). Only numpy-owned arrays are held: never the segment's mmap or the engine's
 * shared ring, whose close must not be refused by an export left behind.
 */
#include "_fastround_shared.h"

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    Py_buffer *b;
} HeldObject;

static void held_dealloc(HeldObject *self) {
    for (Py_ssize_t i = 0; i < self->n; i++)
        if (self->b[i].obj)
            PyBuffer_Release(&self->b[i]);
    PyMem_Free(self->b);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Held(arrays): each a writable C-contiguous buffer (a numpy array), taken now. */
static PyObject *held_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *seq;
    if (kwds && PyDict_Size(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Held takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O", &seq))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "Held: a sequence of arrays");
    if (!fast)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    HeldObject *self = (HeldObject *)type->tp_alloc(type, 0);
    if (!self) {
        Py_DECREF(fast);
        return NULL;
    }
    self->b = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_buffer));
    if (!self->b) {
        Py_DECREF(fast);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), &self->b[i],
                               PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            self->n = i;
            Py_DECREF(fast);
            Py_DECREF(self);
            return NULL;
        }
        self->n = i + 1;
    }
    Py_DECREF(fast);
    return (PyObject *)self;
}

static Py_ssize_t held_len(HeldObject *self) { return self->n; }

static PySequenceMethods held_seq = {.sq_length = (lenfunc)held_len};

PyTypeObject HeldType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dspark_proxy.round._fastround.Held",
    .tp_basicsize = sizeof(HeldObject),
    .tp_dealloc = (destructor)held_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Held(arrays): the arrays' buffers, taken once and kept until this object goes.",
    .tp_new = held_new,
    .tp_as_sequence = &held_seq,
};

/* The held buffer i of `o` (a Held of at least i + 1), with at least `count` items of `itemsize`
 * bytes: its memory, or NULL with ValueError / TypeError set. */
void *held_get(PyObject *o, Py_ssize_t i, Py_ssize_t itemsize, Py_ssize_t count, const char *name) {
    if (Py_TYPE(o) != &HeldType) {
        PyErr_SetString(PyExc_TypeError, "expected a _fastround.Held");
        return NULL;
    }
    HeldObject *h = (HeldObject *)o;
    if (i >= h->n) {
        PyErr_Format(PyExc_ValueError, "%s: the Held has %zd arrays, not %zd", name, h->n, i + 1);
        return NULL;
    }
    Py_buffer *b = &h->b[i];
    if (b->itemsize != itemsize || b->len < count * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd items of %zd bytes, got %zd bytes of items of %zd", name,
                     count, itemsize, b->len, b->itemsize);
        return NULL;
    }
    return b->buf;
}

/* Its length in items (for arrays whose length is the table's size). */
Py_ssize_t held_items(PyObject *o, Py_ssize_t i) {
    HeldObject *h = (HeldObject *)o;
    return (Py_TYPE(o) == &HeldType && i < h->n && h->b[i].itemsize) ? h->b[i].len / h->b[i].itemsize : 0;
}
