/*
 * Split-KV decode attention for the stub engine: the stand-in for FlashMLA PR #25 built as the side
 * extension _flashmla_splitkv_C. It is installed beside the stub's untouched attention module
 * (stubengine/attention.py, the stand-in for _flashmla_C) and returns the step-time factor of a
 * decode step instead of doing the attention.
 *
 * The module name is not in the source: like TORCH_EXTENSION_NAME for vLLM's torch extensions, it
 * comes from the build, which compiles this file with
 *
 *   gcc -O2 -shared -fPIC -I/usr/include/python3.11 -DLANECTL_MODULE_NAME=_stub_splitkv_C \
 *       stub_splitkv.c -o _stub_splitkv_C$(EXT_SUFFIX)
 *
 * so one source can be built under the name the image expects without editing it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef LANECTL_MODULE_NAME
#error "build with -DLANECTL_MODULE_NAME=<module name>, e.g. -DLANECTL_MODULE_NAME=_stub_splitkv_C"
#endif

/* Two levels, so the macro argument is expanded before it is stringized or pasted. */
#define STUB_STR_(x) #x
#define STUB_STR(x) STUB_STR_(x)
#define STUB_CAT_(a, b) a##b
#define STUB_CAT(a, b) STUB_CAT_(a, b)

/* Hard limit of the kernel's combine pass; larger split counts are refused, not clamped. */
#define MAX_SPLITS 64

/*
 * Splitting the KV sequence across more SMs shortens the attention kernel (gain, bounded by the part
 * of a step that attention takes), but every extra split adds a partial result the combine pass has
 * to merge (cost, linear in the splits). Fitted to the release note: 4 splits -> 0.96 (the shipped
 * ~4% per-step win), 8 splits -> 0.975 ("eight splits lost": the combine spends the kernel's win).
 */
#define SPLIT_GAIN (164.0 / 2100.0)
#define COMBINE_COST (13.0 / 2100.0)

static double step_factor(long num_requests, long splits)
{
    if (splits <= 1 || num_requests != 1)
        return 1.0;
    return 1.0 - SPLIT_GAIN * (1.0 - 1.0 / (double)splits) + COMBINE_COST * (double)(splits - 1);
}

PyDoc_STRVAR(decode_doc,
"decode($module, num_tokens, num_requests, mega_num_splits)\n--\n\n"
"Step-time factor of one decode step with split-KV attention.\n\n"
"num_tokens: query tokens per request in the step; num_requests: running requests;\n"
"mega_num_splits: KV splits (0 or 1: no split). Returns 1.0 unless exactly one request\n"
"runs and mega_num_splits > 1.");

static PyObject *decode(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"num_tokens", "num_requests", "mega_num_splits", NULL};
    long num_tokens, num_requests, splits;
    (void)module;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "lll:decode", kwlist, &num_tokens, &num_requests,
                                     &splits))
        return NULL;
    if (num_tokens < 1 || num_requests < 0 || splits < 0) {
        PyErr_Format(PyExc_ValueError,
                     "bad decode shape: num_tokens=%ld, num_requests=%ld, mega_num_splits=%ld",
                     num_tokens, num_requests, splits);
        return NULL;
    }
    if (splits > MAX_SPLITS) {
        PyErr_Format(PyExc_ValueError, "mega_num_splits=%ld exceeds the kernel limit of %d", splits,
                     MAX_SPLITS);
        return NULL;
    }
    return PyFloat_FromDouble(step_factor(num_requests, splits));
}

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))decode, METH_VARARGS | METH_KEYWORDS, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    STUB_STR(LANECTL_MODULE_NAME),
    "Split-KV decode attention (stub of FlashMLA PR #25, side extension).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC STUB_CAT(PyInit_, LANECTL_MODULE_NAME)(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "MAX_SPLITS", MAX_SPLITS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
