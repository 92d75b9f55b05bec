/* optcli.native._fastcall: calls the native kernels' C functions without ctypes' per-argument costs.
 *
 * The kernel library (kernels/host) has no Python API: library.py loads it with ctypes, and this
 * module (built by setup.py beside it, from here: it is Python's, not a kernel) calls into it.
 * ctypes converts each argument through its argtypes and takes an array's address only through a
 * helper object, so a call of ten arguments cost ~2.5-3 us before the C function started, and each
 * array's address ~0.5-1 us more: more than the work of a decoder's GRU gate (a [1, 96] x [96, 288]
 * product, ~1 us) or of most of a face detector's layers.  A `Caller` made once per function here
 * takes its arguments by Python's vectorcall, converts each by one letter of its signature and calls
 * the function through a cast of its address, the GIL released: 1.1 us for ten arguments (four
 * arrays) into a near-empty C function, where ctypes took 3.4-3.6 us (quiet machine).
 *
 * Signature letters, one per C parameter:
 *   p  a pointer: None (NULL), an int (an address the wrapper worked out), or any object with a
 *      C-contiguous buffer (a numpy array: its data pointer, the buffer held for the call; an array
 *      that is not C-contiguous is refused, where ctypes would have passed its first element's
 *      address and the kernel read the wrong elements)
 *   q  int64_t       i  int        f  float (from a Python float or int)
 * Every function returns int (the library's status code).  Only the signatures listed in INVOKERS
 * below can be called; library.py falls back to ctypes for any other, and when this module was not
 * built (a Python without its headers: the kernel library itself needs none).
 *
 * The GIL is released around the call, as ctypes does: the kernels never touch Python objects, and
 * another Python thread (a second predictor) runs meanwhile.
 *
 * Calling a function through a pointer type that differs from its definition only in pointer
 * parameters' pointee types (void * for const float *, int64_t *) is what ctypes/libffi do as well;
 * the argument classes (integer registers for pointers and integers, vector registers for floats)
 * are what the platform ABIs fix.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAX_ARGS 20

typedef union {
    void *p;
    int64_t q;
    double f;
} arg_t;

typedef int (*invoke_fn)(void *fn, const arg_t *a);

#define P(k) a[k].p
#define Q(k) a[k].q
#define I(k) ((int)a[k].q)
#define F(k) ((float)a[k].f)
#define INVOKER(sig, proto, ...)                                                                                      \
    static int invoke_##sig(void *fn, const arg_t *a) { return ((int(*) proto)fn)(__VA_ARGS__); }

typedef void *vp;
typedef int64_t i64;

INVOKER(i, (int), I(0)) /* optcli_set_num_threads: run() sizes the pool twice a call at threads=1 */
INVOKER(pppi, (vp, vp, vp, int), P(0), P(1), P(2), I(3))
INVOKER(pppipp, (vp, vp, vp, int, vp, vp), P(0), P(1), P(2), I(3), P(4), P(5))
INVOKER(ppppiff, (vp, vp, vp, vp, int, float, float), P(0), P(1), P(2), P(3), I(4), F(5), F(6))
INVOKER(pppppiff, (vp, vp, vp, vp, vp, int, float, float), P(0), P(1), P(2), P(3), P(4), I(5), F(6), F(7))
INVOKER(ppppppiff, (vp, vp, vp, vp, vp, vp, int, float, float), P(0), P(1), P(2), P(3), P(4), P(5), I(6), F(7),
        F(8))
INVOKER(ppppppp, (vp, vp, vp, vp, vp, vp, vp), P(0), P(1), P(2), P(3), P(4), P(5), P(6))
INVOKER(pppppppp, (vp, vp, vp, vp, vp, vp, vp, vp), P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7))
INVOKER(ppppppqqqf, (vp, vp, vp, vp, vp, vp, i64, i64, i64, float), P(0), P(1), P(2), P(3), P(4), P(5), Q(6), Q(7),
        Q(8), F(9))
INVOKER(pppppqiff, (vp, vp, vp, vp, vp, i64, int, float, float), P(0), P(1), P(2), P(3), P(4), Q(5), I(6), F(7),
        F(8))
INVOKER(pppppqqqqiff, (vp, vp, vp, vp, vp, i64, i64, i64, i64, int, float, float), P(0), P(1), P(2), P(3), P(4),
        Q(5), Q(6), Q(7), Q(8), I(9), F(10), F(11))
INVOKER(ppppqqqiff, (vp, vp, vp, vp, i64, i64, i64, int, float, float), P(0), P(1), P(2), P(3), Q(4), Q(5), Q(6),
        I(7), F(8), F(9))
INVOKER(pppqiff, (vp, vp, vp, i64, int, float, float), P(0), P(1), P(2), Q(3), I(4), F(5), F(6))
INVOKER(pppqqiff, (vp, vp, vp, i64, i64, int, float, float), P(0), P(1), P(2), Q(3), Q(4), I(5), F(6), F(7))
INVOKER(pppqpp, (vp, vp, vp, i64, vp, vp), P(0), P(1), P(2), Q(3), P(4), P(5))
INVOKER(pppqqqq, (vp, vp, vp, i64, i64, i64, i64), P(0), P(1), P(2), Q(3), Q(4), Q(5), Q(6))
INVOKER(ppq, (vp, vp, i64), P(0), P(1), Q(2))
INVOKER(ppppqqqiffpq, (vp, vp, vp, vp, i64, i64, i64, int, float, float, vp, i64), P(0), P(1), P(2), P(3), Q(4), Q(5),
        Q(6), I(7), F(8), F(9), P(10), Q(11))
INVOKER(pqpp, (vp, i64, vp, vp), P(0), Q(1), P(2), P(3))
INVOKER(ppqffff, (vp, vp, i64, float, float, float, float), P(0), P(1), Q(2), F(3), F(4), F(5), F(6))
INVOKER(ppqfii, (vp, vp, i64, float, int, int), P(0), P(1), Q(2), F(3), I(4), I(5))
INVOKER(ppqiff, (vp, vp, i64, int, float, float), P(0), P(1), Q(2), I(3), F(4), F(5))
INVOKER(ppqppppqqqqiff, (vp, vp, i64, vp, vp, vp, vp, i64, i64, i64, i64, int, float, float), P(0), P(1), Q(2), P(3),
        P(4), P(5), P(6), Q(7), Q(8), Q(9), Q(10), I(11), F(12), F(13))
INVOKER(ppqp, (vp, vp, i64, vp), P(0), P(1), Q(2), P(3))
INVOKER(pppqqpp, (vp, vp, vp, i64, i64, vp, vp), P(0), P(1), P(2), Q(3), Q(4), P(5), P(6))
INVOKER(ppqq, (vp, vp, i64, i64), P(0), P(1), Q(2), Q(3))
INVOKER(ppqqq, (vp, vp, i64, i64, i64), P(0), P(1), Q(2), Q(3), Q(4))
INVOKER(ppqqpp, (vp, vp, i64, i64, vp, vp), P(0), P(1), Q(2), Q(3), P(4), P(5))
INVOKER(ppqqqq, (vp, vp, i64, i64, i64, i64), P(0), P(1), Q(2), Q(3), Q(4), Q(5))
INVOKER(ipppppppppppppppppfi, (int, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, float, int),
        I(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), P(10), P(11), P(12), P(13), P(14), P(15), P(16),
        P(17), F(18), I(19))

static const struct {
    const char *sig;
    invoke_fn fn;
} INVOKERS[] = {
#define ROW(sig) {#sig, invoke_##sig}
    ROW(i),          ROW(pppi),       ROW(pppipp),     ROW(ppppiff),       ROW(pppppiff),  ROW(ppppppiff), ROW(ppppppp),
    ROW(ppppppqqqf), ROW(pppppqiff),     ROW(pppppqqqqiff), ROW(ppppqqqiff), ROW(pppqiff),
    ROW(pppqpp),     ROW(pppqqqq),   ROW(ppq),           ROW(ppqffff),   ROW(ppqfii),    ROW(ppqiff),
    ROW(ppqppppqqqqiff), ROW(ppqp),      ROW(pppqqpp),   ROW(ppqq),      ROW(ppqqpp),    ROW(ppqqqq),
    ROW(ipppppppppppppppppfi), ROW(pqpp), ROW(pppppppp), ROW(ppppqqqiffpq), ROW(pppqqiff), ROW(ppqqq),
#undef ROW
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    void *fn;
    invoke_fn invoke;
    int nargs;
    char sig[MAX_ARGS + 1];
    char name[64];
} Caller;

/* One argument by its letter into *out; a buffer taken goes into *view (which the caller releases
 * when *held is set).  0, or -1 with a Python exception set. */
static int convert(const Caller *c, int k, PyObject *o, arg_t *out, Py_buffer *view, int *held) {
    *held = 0;
    switch (c->sig[k]) {
    case 'p':
        if (o == Py_None) {
            out->p = NULL;
            return 0;
        }
        if (PyLong_Check(o)) {
            out->p = PyLong_AsVoidPtr(o);
            return out->p == NULL && PyErr_Occurred() ? -1 : 0;
        }
        if (PyObject_GetBuffer(o, view, PyBUF_SIMPLE) != 0) {
            PyErr_Format(PyExc_TypeError, "%s: argument %d must be None, an address or a C-contiguous array",
                         c->name, k);
            return -1;
        }
        *held = 1;
        out->p = view->buf;
        return 0;
    case 'q':
    case 'i': {
        long long v = PyLong_AsLongLong(o);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (c->sig[k] == 'i' && (v < INT32_MIN || v > INT32_MAX)) {
            PyErr_Format(PyExc_OverflowError, "%s: argument %d (%lld) does not fit a C int", c->name, k, v);
            return -1;
        }
        out->q = (int64_t)v;
        return 0;
    }
    case 'f': {
        double v = PyFloat_AsDouble(o);
        if (v == -1.0 && PyErr_Occurred()) return -1;
        out->f = v;
        return 0;
    }
    default:
        PyErr_Format(PyExc_SystemError, "%s: bad signature letter", c->name);
        return -1;
    }
}

static PyObject *caller_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Caller *c = (Caller *)self;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyErr_Format(PyExc_TypeError, "%s takes no keyword arguments", c->name);
        return NULL;
    }
    if (n != c->nargs) {
        PyErr_Format(PyExc_TypeError, "%s takes %d arguments (%zd given)", c->name, c->nargs, n);
        return NULL;
    }
    arg_t a[MAX_ARGS];
    Py_buffer views[MAX_ARGS];
    int held[MAX_ARGS];
    int k, failed = 0;
    for (k = 0; k < c->nargs; k++) {
        if (convert(c, k, args[k], &a[k], &views[k], &held[k]) != 0) {
            failed = 1;
            break;
        }
    }
    int rc = 0;
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        rc = c->invoke(c->fn, a);
        Py_END_ALLOW_THREADS
    }
    for (int j = 0; j < k; j++)
        if (held[j]) PyBuffer_Release(&views[j]);
    return failed ? NULL : PyLong_FromLong(rc);
}

static PyObject *caller_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *addr;
    const char *sig, *name = "a native function";
    static char *kwlist[] = {"address", "signature", "name", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Os|s", kwlist, &addr, &sig, &name)) return NULL;
    void *fn = PyLong_AsVoidPtr(addr);
    if (fn == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "the function's address is NULL");
        return NULL;
    }
    invoke_fn invoke = NULL;
    for (size_t i = 0; i < sizeof INVOKERS / sizeof INVOKERS[0]; i++)
        if (strcmp(INVOKERS[i].sig, sig) == 0) invoke = INVOKERS[i].fn;
    if (invoke == NULL) {
        PyErr_Format(PyExc_ValueError, "no invoker for the signature '%s'", sig);
        return NULL;
    }
    Caller *c = (Caller *)type->tp_alloc(type, 0);
    if (c == NULL) return NULL;
    c->vectorcall = caller_call;
    c->fn = fn;
    c->invoke = invoke;
    c->nargs = (int)strlen(sig);
    strncpy(c->sig, sig, MAX_ARGS);
    c->sig[MAX_ARGS] = 0;
    strncpy(c->name, name, sizeof c->name - 1);
    c->name[sizeof c->name - 1] = 0;
    return (PyObject *)c;
}

static PyObject *caller_repr(PyObject *self) {
    Caller *c = (Caller *)self;
    return PyUnicode_FromFormat("<fast caller %s(%s)>", c->name, c->sig);
}

static PyTypeObject CallerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "optcli.native._fastcall.Caller",
    .tp_basicsize = sizeof(Caller),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Caller, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = caller_new,
    .tp_repr = caller_repr,
    .tp_doc = "Caller(address, signature, name=''): call a native function by its address; see the module's source",
};

static PyObject *signatures(PyObject *self, PyObject *unused) {
    size_t n = sizeof INVOKERS / sizeof INVOKERS[0];
    PyObject *out = PyFrozenSet_New(NULL);
    if (out == NULL) return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *s = PyUnicode_FromString(INVOKERS[i].sig);
        if (s == NULL || PySet_Add(out, s) != 0) {
            Py_XDECREF(s);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(s);
    }
    return out;
}

static PyMethodDef METHODS[] = {
    {"signatures", signatures, METH_NOARGS, "The signatures a Caller can be made for."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_fastcall",
                                    "Calls the native kernels without ctypes' argument conversion.", -1, METHODS};

PyMODINIT_FUNC PyInit__fastcall(void) {
    if (PyType_Ready(&CallerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&MODULE);
    if (m == NULL) return NULL;
    Py_INCREF(&CallerType);
    if (PyModule_AddObject(m, "Caller", (PyObject *)&CallerType) < 0) {
        Py_DECREF(&CallerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
